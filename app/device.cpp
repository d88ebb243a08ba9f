// train.device: the local rank from the launcher's environment, the device it picks, and the
// agreement of all ranks before anything is allocated.
#include "app/device.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "app/config.h"
#include "kernels/check.h"
#include "kernels/exec.h"
#include "parallel/mpi.h"

namespace tessera {
namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

int local_rank(const EnvLookup& env) {
  for (const char* name : {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* v = env(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    TESSERA_CHECK(*end == '\0' && errno == 0 && n >= 0 && n < (1 << 20), "the launcher's ", name, " = \"", v,
                  "\" is not a local rank (a non-negative integer)");
    return static_cast<int>(n);
  }
  return 0;
}

Device select_device(const std::string& device, int local, int visible, bool built, const std::string& host) {
  if (device == "cpu") return Device::cpu();
  TESSERA_CHECK(device == "cuda", "train.device = \"", device, "\" is not a device: use \"cpu\" or \"cuda\"");
  TESSERA_CHECK(built, "train.device = \"cuda\", but this tessera was built without the CUDA backend "
                "(TESSERA_CUDA=OFF: nvcc was not found when it was configured); rebuild with the CUDA toolkit "
                "(docs/cuda.md) or set train.device = \"cpu\"");
  TESSERA_CHECK(visible > 0, "train.device = \"cuda\", but no CUDA device is visible on ", host, " (local rank ",
                local, "; no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them); set train.device = \"cpu\" "
                "or run on a GPU node");
  return Device::cuda(local % visible);
}

Device resolve_train_device(const std::string& device, MPI_Comm comm) {
  std::string error;
  Device d = Device::cpu();
  try {
    const int visible = device == "cuda" ? cuda_device_count() : 0;
    d = select_device(device, local_rank([](const char* n) { return std::getenv(n); }), visible,
                      cuda_backend_built(), host_name());
  } catch (const Error& e) {
    error = e.what();
  }
  if (comm == MPI_COMM_NULL || comm_size(comm) == 1) {
    TESSERA_CHECK(error.empty(), error);
    return d;
  }
  // The lowest failing rank, or the world size when none failed.
  int first_failed = error.empty() ? comm_size(comm) : comm_rank(comm);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &first_failed, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (train.device)");
  TESSERA_CHECK(error.empty(), error);
  TESSERA_CHECK(first_failed == comm_size(comm), "train.device = \"", device, "\" cannot be used on rank ",
                first_failed, " (its message says why); every rank stops");
  return d;
}

std::string unsupported_on_cuda(const Config& cfg) {
  const std::string on = "train.device = \"cuda\": ";
  if (cfg.model.kind == "vlm")
    return on + "model.kind = \"vlm\" has no CUDA path yet (the vision tower's bidirectional attention has no CUDA "
                "kernel); train it with train.device = \"cpu\"";
  if (cfg.data.document_mask)
    return on + "data.document_mask = true has no CUDA kernel (attention's document masking runs on the CPU); set "
                "data.document_mask = false or train.device = \"cpu\"";
  if (!cfg.upscale.method.empty())
    return on + "[upscale] method = \"" + cfg.upscale.method +
           "\" (a growth in the run) gathers the model on the host and is not wired for a device; grow through a "
           "checkpoint (tessera upscale) and resume, or train on the CPU";
  return "";
}

}  // namespace tessera
