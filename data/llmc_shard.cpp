// llm.c shards: header checks in the order that gives the most useful message first.
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
  return in.read(reinterpret_cast<char*>(&magic), sizeof(magic)) && magic == kLlmcMagic;
}

LlmcShard::LlmcShard(const std::string& path) : file_(path) {
  const int64_t size = file_.size();
  std::array<std::byte, kLlmcHeaderBytes> header{};
  file_.read(0, std::min(size, kLlmcHeaderBytes), header.data());
  const std::byte* p = header.data();
  const int32_t magic = size >= 4 ? load_le<int32_t>(p) : 0;
  TESSERA_CHECK(magic != kLlmcLlama3Magic, path, ": llm.c shard with uint32 tokens (magic ", kLlmcLlama3Magic,
                ", the Llama 3 flavour); tessera reads the GPT-2 flavour (magic ", kLlmcMagic, ", uint16 tokens)");
  TESSERA_CHECK(magic == kLlmcMagic, path, " is not an llm.c token shard: wrong magic (expected int32 ", kLlmcMagic,
                " in the first 4 bytes)");
  TESSERA_CHECK(size >= kLlmcHeaderBytes, path, " is truncated: ", size, " bytes, but the llm.c header alone is ",
                kLlmcHeaderBytes);
  const auto version = load_le<int32_t>(p + 4);
  TESSERA_CHECK(version == kLlmcVersion, path, ": unsupported llm.c shard version ", version,
                " (tessera reads version ", kLlmcVersion, ", uint16 tokens)");
  const auto n = load_le<int32_t>(p + 8);
  TESSERA_CHECK(n >= 0, path, ": negative token count ", n, " in the header");
  num_tokens_ = n;
  const int64_t need = kLlmcHeaderBytes + 2 * num_tokens_;
  TESSERA_CHECK(size >= need, path, " is truncated: its header announces ", n, " tokens (", need,
                " bytes in all) but the file has ", size, " bytes");
  TESSERA_CHECK(size == need, path, " has ", size - need, " bytes after the ", n, " tokens its header announces");
}

void write_llmc_shard(const std::string& path, std::span<const int32_t> ids) {
  TESSERA_CHECK(ids.size() <= size_t(std::numeric_limits<int32_t>::max()), "llm.c shard ", path, ": ", ids.size(),
                " tokens exceed the header's int32 count");
  std::array<int32_t, 256> header{};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(ids.size());
  std::vector<uint16_t> tokens(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < 65536, "llm.c shard ", path, ": token id ", ids[i], " at position ", i,
                  " does not fit uint16");
    tokens[i] = static_cast<uint16_t>(ids[i]);
  }
  AtomicFileWriter out(path);
  out.write(header.data(), sizeof(header));
  out.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  out.commit();
}

}  // namespace tessera
