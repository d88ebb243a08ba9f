// llm.c shards, both flavours: header checks in the order that gives the most useful message first.
#include "data/llmc_shard.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <vector>

#include "kernels/check.h"

namespace tessera {

bool has_llmc_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), sizeof(magic)) && (magic == kLlmcMagic || magic == kLlmcLlama3Magic);
}

LlmcShard::LlmcShard(const std::string& path) : file_(path) {
  const int64_t size = file_.size();
  std::array<std::byte, kLlmcHeaderBytes> header{};
  file_.read(0, std::min(size, kLlmcHeaderBytes), header.data());
  const std::byte* p = header.data();
  const int32_t magic = size >= 4 ? load_le<int32_t>(p) : 0;
  TESSERA_CHECK(magic == kLlmcMagic || magic == kLlmcLlama3Magic, path,
                " is not an llm.c token shard: wrong magic (expected int32 ", kLlmcMagic, " or ", kLlmcLlama3Magic,
                " in the first 4 bytes)");
  TESSERA_CHECK(size >= kLlmcHeaderBytes, path, " is truncated: ", size, " bytes, but the llm.c header alone is ",
                kLlmcHeaderBytes);
  flavour_ = magic == kLlmcMagic ? LlmcFlavour::kGpt2 : LlmcFlavour::kLlama3;
  const int32_t expected = flavour_ == LlmcFlavour::kGpt2 ? kLlmcVersion : kLlmcLlama3Version;
  const auto version = load_le<int32_t>(p + 4);
  TESSERA_CHECK(version == expected, path, ": unsupported llm.c shard version ", version, " with magic ", magic,
                " (tessera reads version ", kLlmcVersion, " with magic ", kLlmcMagic, ", uint16 tokens, and version ",
                kLlmcLlama3Version, " with magic ", kLlmcLlama3Magic, ", uint32 tokens)");
  const auto n = load_le<int32_t>(p + 8);
  TESSERA_CHECK(n >= 0, path, ": negative token count ", n, " in the header");
  num_tokens_ = n;
  const int64_t need = kLlmcHeaderBytes + token_dtype_size(dtype()) * num_tokens_;
  TESSERA_CHECK(size >= need, path, " is truncated: its header announces ", n, " ", token_dtype_name(dtype()),
                " tokens (", need, " bytes in all) but the file has ", size, " bytes");
  TESSERA_CHECK(size == need, path, " has ", size - need, " bytes after the ", n, " tokens its header announces");
}

namespace {
template <typename T>
std::vector<T> narrow_ids(const std::string& path, std::span<const int32_t> ids, int64_t limit) {
  std::vector<T> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < limit, "llm.c shard ", path, ": token id ", ids[i], " at position ", i,
                  " does not fit ", sizeof(T) == 2 ? "uint16" : "uint32");
    out[i] = static_cast<T>(ids[i]);
  }
  return out;
}
}  // namespace

void write_llmc_shard(const std::string& path, std::span<const int32_t> ids, LlmcFlavour flavour) {
  TESSERA_CHECK(ids.size() <= size_t(std::numeric_limits<int32_t>::max()), "llm.c shard ", path, ": ", ids.size(),
                " tokens exceed the header's int32 count");
  const bool gpt2 = flavour == LlmcFlavour::kGpt2;
  std::array<int32_t, 256> header{};
  header[0] = gpt2 ? kLlmcMagic : kLlmcLlama3Magic;
  header[1] = gpt2 ? kLlmcVersion : kLlmcLlama3Version;
  header[2] = static_cast<int32_t>(ids.size());
  AtomicFileWriter out(path);
  out.write(header.data(), sizeof(header));
  if (gpt2) {
    const std::vector<uint16_t> tokens = narrow_ids<uint16_t>(path, ids, 65536);
    out.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  } else {
    const std::vector<uint32_t> tokens = narrow_ids<uint32_t>(path, ids, std::numeric_limits<int64_t>::max());
    out.write(tokens.data(), tokens.size() * sizeof(uint32_t));
  }
  out.commit();
}

}  // namespace tessera
