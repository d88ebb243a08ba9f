// Fuzzes the checkpoint reader (app/checkpoint/checkpoint_io.h CheckpointReader, and `tessera ckpt inspect`
// on top of it): the input is the bytes of an HDF5 file, seeded with small real checkpoints, so the
// mutations are files that the real reader opens. MPI is initialized once (a singleton: the reader
// runs on MPI_COMM_SELF, as ckpt inspect and generate do).
#include <mpi.h>

#include <cstdlib>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/ckpt_commands.h"
#include "app/config.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;
using namespace tessera;

namespace {

// ckpt inspect runs on files whose tensors hold at most this many elements in all.
constexpr int64_t kInspectElements = int64_t{1} << 22;

// The elements of all tensors, or kInspectElements + 1 when that is more.
int64_t total_elements(const CheckpointReader& r) {
  int64_t total = 0;
  for (const TensorInfo& t : r.tensors()) {
    const int64_t n = t.shape.numel();
    if (n > kInspectElements || (total += n) > kInspectElements) return kInspectElements + 1;
  }
  return total;
}

// The tensors a reader would load: every float32 one, when small enough to read whole.
void read_tensors(const CheckpointReader& r) {
  for (const TensorInfo& t : r.tensors()) {
    if (t.dtype != "float32" || t.shape.numel() > (int64_t{1} << 20)) continue;
    (void)r.read_all(t.path);
  }
  (void)compare_shapes(r, {{"/model/wte.weight", Shape{4, 4}}});
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  MPI_Init(nullptr, nullptr);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("checkpoint");
  static const std::string path = dir / "step_00000001.h5";
  tf::write_file(path, tf::as_text(data, size));
  bool small = false;
  tf::expect_clean("CheckpointReader", [&] {
    const CheckpointReader r(path, MPI_COMM_SELF);
    small = total_elements(r) <= kInspectElements;
    read_tensors(r);
    // What generate does with the stored config.
    tf::expect_clean("the stored config", [&] { (void)parse_config_string(r.meta().config_toml, "stored config"); });
  });
  // inspect reads every element: of a declared (3, 2^30) tensor with no data, that is only slow.
  if (small) {
    tf::expect_clean("ckpt inspect", [&] {
      std::ostringstream out;
      run_ckpt_inspect(CkptInspectArgs{path, true}, out);
    });
  }
  return 0;
}
