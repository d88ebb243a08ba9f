// Tests data/llmc_shard.h: round trip, the header at its byte offsets, and each validation error,
// for both of llm.c's flavours (GPT-2: uint16 tokens; Llama 3: uint32 tokens).
#include "data/llmc_shard.h"

#include <cstring>
#include <numeric>

#include "data/token_dataset.h"

#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::patch_file;
using testing::read_bytes;
using testing::TempDir;
using testing::throws_with;
using testing::value_at;
using testing::write_bytes;

std::vector<int32_t> to_vector(const TokenSpan& t) {
  std::vector<int32_t> v(t.size());
  t.copy_to(0, t.size(), v.data());
  return v;
}

TEST(LlmcShard, RoundTripsAndHeaderFieldsSitAtTheirOffsets) {
  TempDir dir("llmc_rt");
  const std::vector<int32_t> ids = {50256, 0, 1, 65535, 198, 50256};
  write_llmc_shard(dir / "s.bin", ids);
  const std::string raw = read_bytes(dir / "s.bin");
  ASSERT_EQ(raw.size(), 1024u + 2 * ids.size());
  EXPECT_EQ(value_at<int32_t>(raw, 0), 20240520);
  EXPECT_EQ(value_at<int32_t>(raw, 4), 1);
  EXPECT_EQ(value_at<int32_t>(raw, 8), 6);
  for (size_t at = 12; at < 1024; at += 4) ASSERT_EQ(value_at<int32_t>(raw, at), 0) << at;
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(value_at<uint16_t>(raw, 1024 + 2 * i), ids[i]);
  EXPECT_TRUE(has_llmc_magic(dir / "s.bin"));
  LlmcShard shard(dir / "s.bin");
  EXPECT_EQ(shard.num_tokens(), 6);
  EXPECT_EQ(shard.tokens().dtype(), TokenDType::kUInt16);
  EXPECT_EQ(to_vector(shard.tokens()), ids);
}

// A Llama 3 shard as llm.c's write_datafile(model_desc="llama-3") lays it out, built byte by byte
// here (not by write_llmc_shard): header int32 magic 20240801, version 7, N, then N uint32 ids.
std::string llama3_shard_bytes(const std::vector<uint32_t>& ids) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240801;
  header[1] = 7;
  header[2] = static_cast<int32_t>(ids.size());
  std::string raw(1024 + 4 * ids.size(), '\0');
  std::memcpy(raw.data(), header.data(), 1024);
  std::memcpy(raw.data() + 1024, ids.data(), 4 * ids.size());
  return raw;
}

// Llama 3's vocabulary (128,256) does not fit uint16: ids above 65535 read back whole, and the
// file is taken for a shard when a dataset is opened (it used to be "neither an llm.c token shard
// nor an indexed dataset").
TEST(LlmcShard, ReadsLlama3ShardsWithUint32Tokens) {
  TempDir dir("llmc_llama3");
  const std::vector<uint32_t> ids = {128000, 9906, 1917, 0, 65535, 65536, 128001, 128255, 11};
  write_bytes(dir / "l3.bin", llama3_shard_bytes(ids));
  EXPECT_TRUE(has_llmc_magic(dir / "l3.bin"));
  EXPECT_EQ(detect_token_format(dir / "l3.bin"), TokenFileFormat::kLlmcShard);
  const LlmcShard shard(dir / "l3.bin");
  EXPECT_EQ(shard.flavour(), LlmcFlavour::kLlama3);
  EXPECT_EQ(shard.num_tokens(), 9);
  EXPECT_EQ(shard.tokens().dtype(), TokenDType::kUInt32);
  EXPECT_EQ(to_vector(shard.tokens()), std::vector<int32_t>(ids.begin(), ids.end()));
  EXPECT_EQ(shard.tokens()[5], 65536);
  // Through the training path: windows of T + 1 ids, checked against the model's vocabulary.
  const auto ds = open_token_dataset({dir / "l3.bin"}, 4, 128256);
  EXPECT_EQ(ds->num_samples(), 2);
  EXPECT_TRUE(throws_with([&] { open_token_dataset({dir / "l3.bin"}, 4, 128000); },
                          {dir / "l3.bin", "token id 128000", "outside the model vocabulary [0, 128000)"}));
  // The writer makes the same bytes.
  write_llmc_shard(dir / "w.bin", std::vector<int32_t>(ids.begin(), ids.end()), LlmcFlavour::kLlama3);
  EXPECT_EQ(read_bytes(dir / "w.bin"), llama3_shard_bytes(ids));
}

TEST(LlmcShard, Llama3ShardErrorsNameTheFlavour) {
  TempDir dir("llmc_llama3_errors");
  const std::string path = dir / "l3.bin";
  const std::string full = llama3_shard_bytes({1, 2, 3});
  write_bytes(path, full.substr(0, full.size() - 2));
  EXPECT_TRUE(throws_with([&] { LlmcShard s(path); }, {path, "truncated", "3 uint32 tokens", "1036 bytes in all"}));
  write_bytes(path, full);
  patch_file<int32_t>(path, 4, 1);  // the GPT-2 flavour's version with the Llama 3 magic
  EXPECT_TRUE(throws_with([&] { LlmcShard s(path); },
                          {path, "unsupported llm.c shard version 1 with magic 20240801", "version 7 with magic 20240801"}));
}

TEST(LlmcShard, EmptyShardIsValid) {
  TempDir dir("llmc_empty");
  write_llmc_shard(dir / "s.bin", {});
  EXPECT_EQ(LlmcShard(dir / "s.bin").num_tokens(), 0);
}

TEST(LlmcShard, WriterRejectsIdsBeyondUint16) {
  TempDir dir("llmc_range");
  const std::vector<int32_t> ids = {1, 65536};
  EXPECT_TRUE(throws_with([&] { write_llmc_shard(dir / "s.bin", ids); }, {dir / "s.bin", "65536", "position 1"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "s.bin"));
}

class LlmcShardErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<int32_t> ids(100);
    std::iota(ids.begin(), ids.end(), 0);
    write_llmc_shard(path, ids);
  }
  ::testing::AssertionResult open_fails(std::initializer_list<std::string> parts) {
    return throws_with([&] { LlmcShard s(path); }, parts);
  }
  TempDir dir{"llmc_errors"};
  const std::string path = dir / "s.bin";
};

TEST_F(LlmcShardErrors, MissingFile) {
  std::filesystem::remove(path);
  EXPECT_TRUE(open_fails({path, "cannot open"}));
}

TEST_F(LlmcShardErrors, WrongMagic) {
  patch_file<int32_t>(path, 0, 20240521);
  EXPECT_TRUE(open_fails({path, "wrong magic", "20240520"}));
  EXPECT_FALSE(has_llmc_magic(path));
  patch_file<int32_t>(path, 0, 20240801);  // the Llama 3 magic on a GPT-2 shard: version 1 is not its version
  EXPECT_TRUE(open_fails({path, "unsupported llm.c shard version 1 with magic 20240801"}));
  write_bytes(path, "ab");
  EXPECT_TRUE(open_fails({path, "wrong magic"}));
}

TEST_F(LlmcShardErrors, UnsupportedVersion) {
  patch_file<int32_t>(path, 4, 7);
  EXPECT_TRUE(open_fails({path, "unsupported llm.c shard version 7 with magic 20240520"}));
}

TEST_F(LlmcShardErrors, Truncated) {
  const std::string full = read_bytes(path);
  write_bytes(path, full.substr(0, 1000));
  EXPECT_TRUE(open_fails({path, "truncated", "1000 bytes", "header"}));
  write_bytes(path, full.substr(0, full.size() - 1));
  EXPECT_TRUE(open_fails({path, "truncated", "100 uint16 tokens"}));
  write_bytes(path, full + "zz");
  EXPECT_TRUE(open_fails({path, "2 bytes after the 100 tokens"}));
  write_bytes(path, full);
  patch_file<int32_t>(path, 8, -5);
  EXPECT_TRUE(open_fails({path, "negative token count"}));
}

// A shard cut short after it was opened: an error naming it, not a SIGBUS.
TEST(LlmcShard, TruncatedAfterOpenIsAnErrorNamingTheFile) {
  TempDir dir("llmc_truncated");
  write_llmc_shard(dir / "s.bin", std::vector<int32_t>{5, 6, 7, 8});
  LlmcShard shard(dir / "s.bin");
  std::filesystem::resize_file(dir / "s.bin", 1024 + 2);
  std::vector<int32_t> out(4);
  shard.tokens().copy_to(0, 1, out.data());
  EXPECT_EQ(out[0], 5);
  EXPECT_TRUE(throws_with([&] { shard.tokens().copy_to(0, 4, out.data()); },
                          {dir / "s.bin", "cannot read 8 bytes at byte offset 1024", "has 1026 bytes now"}));
}

}  // namespace
}  // namespace tessera
