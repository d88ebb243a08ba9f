// Tests data/llmc_shard.h: round trip, the header at its byte offsets, and each validation error.
#include "data/llmc_shard.h"

#include <numeric>

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
  patch_file<int32_t>(path, 0, 20240801);
  EXPECT_TRUE(open_fails({path, "uint32 tokens"}));
  write_bytes(path, "ab");
  EXPECT_TRUE(open_fails({path, "wrong magic"}));
}

TEST_F(LlmcShardErrors, UnsupportedVersion) {
  patch_file<int32_t>(path, 4, 7);
  EXPECT_TRUE(open_fails({path, "unsupported llm.c shard version 7"}));
}

TEST_F(LlmcShardErrors, Truncated) {
  const std::string full = read_bytes(path);
  write_bytes(path, full.substr(0, 1000));
  EXPECT_TRUE(open_fails({path, "truncated", "1000 bytes", "header"}));
  write_bytes(path, full.substr(0, full.size() - 1));
  EXPECT_TRUE(open_fails({path, "truncated", "100 tokens"}));
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
