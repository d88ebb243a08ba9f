// Fuzzes the safetensors reader (app/checkpoint/safetensors.h), what `ckpt import` opens: the
// input is the whole .safetensors file. A file that opens is read the way the import reads it:
// every F32, F16 and BF16 tensor converted (the header promised their bytes are in the file), and
// every other dtype refused by name.
#include "app/checkpoint/safetensors.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;
using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("safetensors");
  static const std::string path = dir / "model.safetensors";
  tf::write_file(path, tf::as_text(data, size));
  std::unique_ptr<SafetensorsFile> file;
  tf::expect_clean("SafetensorsFile", [&] { file = std::make_unique<SafetensorsFile>(path); });
  if (!file) return 0;
  int64_t end = 0;
  for (const SafetensorsTensor& t : file->tensors()) {
    if (t.offset < end || t.offset + t.bytes > static_cast<int64_t>(size)) tf::finding("a tensor outside the file, or overlapping");
    end = t.offset + t.bytes;
    if (!safetensors_float_dtype(t.dtype)) {
      bool refused = false;
      try {
        (void)file->read_f32(t);
      } catch (const Error&) {
        refused = true;
      }
      if (!refused) tf::finding("a " + t.dtype + " tensor was read as floats");
      continue;
    }
    tf::expect_clean("read_f32", [&] {
      if (static_cast<int64_t>(file->read_f32(t).size()) != t.numel()) tf::finding("read_f32 gave another element count");
    });
  }
  if (end != static_cast<int64_t>(size) && !file->tensors().empty()) tf::finding("the tensors do not end at the file's end");
  return 0;
}
