// LossMaskFile (validated at open, read with pread) and LossMaskBuilder.
#include "data/loss_mask_file.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "kernels/check.h"

namespace tessera {

std::string loss_mask_path(const std::string& prefix) { return prefix + ".mask"; }

LossMaskFile::LossMaskFile(const std::string& path) : file_(path) {
  const int64_t size = file_.size();
  TESSERA_CHECK(size >= kLossMaskHeaderBytes, path, " is not a tessera loss mask: ", size,
                " bytes, shorter than the ", kLossMaskHeaderBytes, "-byte header");
  std::byte header[kLossMaskHeaderBytes];
  file_.read(0, kLossMaskHeaderBytes, header);
  TESSERA_CHECK(std::memcmp(header, kLossMaskMagic, 8) == 0, path,
                " is not a tessera loss mask: wrong magic (expected the 8 bytes \"TSRMASK\\0\")");
  const auto version = load_le<uint64_t>(header + 8);
  TESSERA_CHECK(version == kLossMaskVersion, path, ": unsupported loss mask version ", version,
                " (tessera reads version ", kLossMaskVersion, ")");
  const auto n = load_le<uint64_t>(header + 16);
  TESSERA_CHECK(n == uint64_t(size - kLossMaskHeaderBytes), path, ": the header announces ", n, " tokens but the file",
                " holds ", size - kLossMaskHeaderBytes, " flags (truncated, or not written by tessera)");
  num_tokens_ = static_cast<int64_t>(n);
}

void LossMaskFile::read(int64_t first, int64_t count, uint8_t* out) const {
  TESSERA_CHECK(first >= 0 && count >= 0 && first + count <= num_tokens_, path(), ": flags [", first, ", ",
                first + count, ") outside its ", num_tokens_, " tokens");
  file_.read(kLossMaskHeaderBytes + first, count, out);
  for (int64_t i = 0; i < count; ++i)
    TESSERA_CHECK(out[i] <= 1, path(), ": flag ", int(out[i]), " at token position ", first + i,
                  " (flags are 0 or 1)");
}

std::shared_ptr<const LossMaskFile> open_loss_mask(const std::string& prefix, int64_t num_tokens) {
  const std::string path = loss_mask_path(prefix);
  if (!std::filesystem::exists(path)) return nullptr;
  auto mask = std::make_shared<const LossMaskFile>(path);
  TESSERA_CHECK(mask->num_tokens() == num_tokens, path, " masks ", mask->num_tokens(), " tokens but ", prefix,
                ".bin holds ", num_tokens, " (a mask from another dataset? prepare them together)");
  return mask;
}

LossMaskBuilder::LossMaskBuilder(const std::string& prefix) : prefix_(prefix) {}

void LossMaskBuilder::add(std::span<const uint8_t> flags) {
  TESSERA_CHECK(!finalized_, "loss mask ", prefix_, ": add after finalize");
  for (uint8_t f : flags) {
    TESSERA_CHECK(f <= 1, "loss mask ", prefix_, ": flag ", int(f), " (flags are 0 or 1)");
    trained_ += f;
  }
  flags_.insert(flags_.end(), flags.begin(), flags.end());
}

void LossMaskBuilder::finalize() {
  TESSERA_CHECK(!finalized_, "loss mask ", prefix_, ": finalize called twice");
  AtomicFileWriter out(loss_mask_path(prefix_));
  out.write(kLossMaskMagic, sizeof(kLossMaskMagic));
  out.write_value<uint64_t>(kLossMaskVersion);
  out.write_value<uint64_t>(flags_.size());
  out.write(flags_.data(), flags_.size());
  out.commit();
  finalized_ = true;
}

}  // namespace tessera
