// Tests data/token_dataset.h: window contents and count, concatenation across shards, globs and
// format detection, id and length errors, and the held-out validation split.
#include "data/token_dataset.h"

#include <numeric>

#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::TempDir;
using testing::throws_with;

std::vector<int32_t> iota_ids(int32_t first, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> window(const Dataset& ds, int64_t i) {
  std::vector<int32_t> out(ds.seq_len() + 1, -7);
  std::vector<uint8_t> mask(ds.seq_len() + 1, 0);
  ds.get(i, out.data(), mask.data());
  for (uint8_t m : mask) EXPECT_EQ(m, 1);
  return out;
}

void write_indexed(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs) {
  IndexedDatasetBuilder b(prefix, TokenDType::kUInt16);
  for (const auto& d : docs) b.add_document(d);
  b.finalize();
}

TEST(TokenWindowDataset, WindowsOfTPlusOneWithStrideT) {
  TempDir dir("tw_windows");
  write_indexed(dir / "d", {iota_ids(0, 10), iota_ids(10, 11)});  // 21 tokens 0..20
  auto ds = open_token_dataset({dir / "d"}, 5, 1000);
  EXPECT_EQ(ds->num_tokens(), 21);
  EXPECT_EQ(ds->num_samples(), 4);  // (21 - 1) / 5: the last window ends exactly at token 20
  EXPECT_EQ(ds->seq_len(), 5);
  EXPECT_EQ(ds->vocab_size(), 1000);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(window(*ds, i), iota_ids(int32_t(5 * i), 6)) << i;
  EXPECT_THROW(window(*ds, 4), Error);
  // One token fewer: the last window is partial and dropped.
  write_indexed(dir / "e", {iota_ids(0, 20)});
  EXPECT_EQ(open_token_dataset({dir / "e"}, 5, 1000)->num_samples(), 3);
  EXPECT_NE(ds->describe().find(dir / "d.bin"), std::string::npos) << ds->describe();
}

TEST(TokenWindowDataset, ShardsConcatenateInOrderAcrossBoundaries) {
  TempDir dir("tw_shards");
  write_llmc_shard(dir / "shard_000.bin", iota_ids(0, 7));
  write_llmc_shard(dir / "shard_001.bin", iota_ids(7, 1));
  write_llmc_shard(dir / "shard_002.bin", {});  // an empty shard is skipped over
  write_llmc_shard(dir / "shard_003.bin", iota_ids(8, 9));
  auto ds = open_token_dataset({dir / "shard_*.bin"}, 4, 100);
  EXPECT_EQ(ds->segments().size(), 4u);
  EXPECT_EQ(ds->num_tokens(), 17);
  ASSERT_EQ(ds->num_samples(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(window(*ds, i), iota_ids(int32_t(4 * i), 5)) << i;
  // A window wider than several shards.
  auto wide = open_token_dataset({dir / "shard_*.bin"}, 16, 100);
  EXPECT_EQ(window(*wide, 0), iota_ids(0, 17));
}

TEST(TokenWindowDataset, MixesIndexedDatasetsAndShards) {
  TempDir dir("tw_mix");
  write_indexed(dir / "a", {iota_ids(0, 3), iota_ids(3, 2)});
  write_llmc_shard(dir / "b.bin", iota_ids(5, 4));
  auto ds = open_token_dataset({dir / "a.idx", dir / "b.bin"}, 8, 100);
  EXPECT_EQ(window(*ds, 0), iota_ids(0, 9));
}

TEST(ExpandGlob, SortsMatchesAndNamesAnEmptyPattern) {
  TempDir dir("glob");
  for (const char* n : {"shard_2.bin", "shard_0.bin", "shard_1.bin", "other.bin"}) write_llmc_shard(dir / n, iota_ids(1, 1));
  EXPECT_EQ(expand_glob(dir / "shard_*.bin"),
            (std::vector<std::string>{dir / "shard_0.bin", dir / "shard_1.bin", dir / "shard_2.bin"}));
  EXPECT_TRUE(throws_with([&] { expand_glob(dir / "nothing_*.bin"); }, {"no files match", dir / "nothing_*.bin"}));
}

TEST(DetectTokenFormat, IndexedByIdxBesideItLlmcByMagic) {
  TempDir dir("detect");
  write_indexed(dir / "d", {iota_ids(0, 3)});
  write_llmc_shard(dir / "s.bin", iota_ids(0, 3));
  testing::write_bytes(dir / "junk.bin", "not tokens");
  for (const std::string& p : {dir / "d", dir / "d.bin", dir / "d.idx"})
    EXPECT_EQ(detect_token_format(p), TokenFileFormat::kIndexed) << p;
  EXPECT_EQ(detect_token_format(dir / "s.bin"), TokenFileFormat::kLlmcShard);
  EXPECT_TRUE(throws_with([&] { detect_token_format(dir / "junk.bin"); },
                          {dir / "junk.bin", "neither an llm.c token shard", dir / "junk.idx"}));
  EXPECT_TRUE(throws_with([&] { detect_token_format(dir / "absent.bin"); }, {"missing data file", dir / "absent.bin"}));
  // A glob catching both halves of one indexed dataset opens it once.
  EXPECT_EQ(open_token_segments({dir / "d.*"}).size(), 1u);
}

TEST(TokenWindowDataset, TokenIdBeyondVocabularyNamesFileAndPosition) {
  TempDir dir("tw_vocab");
  write_llmc_shard(dir / "a.bin", iota_ids(0, 10));
  std::vector<int32_t> ids = iota_ids(0, 10);
  ids[6] = 300;
  write_llmc_shard(dir / "b.bin", ids);
  // At open: the whole stream is checked.
  EXPECT_TRUE(throws_with([&] { open_token_dataset({dir / "a.bin", dir / "b.bin"}, 4, 257); },
                          {"token id 300", "position 6", dir / "b.bin", "[0, 257)"}));
  // Lazily (eager check disabled): found when a window containing it is read.
  TokenWindowDataset lazy(open_token_segments({dir / "a.bin", dir / "b.bin"}), 4, 257, /*eager_check_bytes=*/0);
  EXPECT_EQ(window(lazy, 0), iota_ids(0, 5));
  std::vector<int32_t> out(5);
  EXPECT_TRUE(throws_with([&] { lazy.get(3, out.data(), nullptr); }, {"token id 300", "position 6", dir / "b.bin"}));
}

TEST(TokenWindowDataset, SequenceLongerThanDataAndEmptyData) {
  TempDir dir("tw_short");
  write_llmc_shard(dir / "s.bin", iota_ids(0, 10));
  EXPECT_TRUE(throws_with([&] { open_token_dataset({dir / "s.bin"}, 10, 100); },
                          {"sequence length 10 needs at least 11 tokens", dir / "s.bin", "has 10"}));
  EXPECT_EQ(open_token_dataset({dir / "s.bin"}, 9, 100)->num_samples(), 1);
  write_llmc_shard(dir / "empty.bin", {});
  EXPECT_TRUE(throws_with([&] { open_token_dataset({dir / "empty.bin"}, 4, 100); }, {dir / "empty.bin", "no tokens"}));
  write_indexed(dir / "e", {});
  EXPECT_TRUE(throws_with([&] { open_token_dataset({dir / "e"}, 4, 100); }, {dir / "e.bin", "no tokens"}));
}

TEST(ValidationSplit, FirstHeldOutDocument) {
  EXPECT_EQ(validation_first_document(10, 0.0, "d"), 10);
  EXPECT_EQ(validation_first_document(10, 0.1, "d"), 9);
  EXPECT_EQ(validation_first_document(10, 0.9, "d"), 1);   // (1 - 0.9) * 10 = 0.999... in floating point
  EXPECT_EQ(validation_first_document(10, 0.25, "d"), 7);  // floor(7.5)
  EXPECT_EQ(validation_first_document(3, 0.01, "d"), 2);   // at least one held-out document
  EXPECT_EQ(validation_first_document(2, 0.99, "d"), 1);   // at least one training document
  EXPECT_TRUE(throws_with([] { validation_first_document(1, 0.1, "d"); }, {"d:", "at least 2 documents"}));
  EXPECT_TRUE(throws_with([] { validation_first_document(10, 1.0, "d"); }, {"[0, 1)"}));
  EXPECT_TRUE(throws_with([] { validation_first_document(10, -0.1, "d"); }, {"[0, 1)"}));
}

TEST(ValidationSplit, HoldsOutTheLastDocuments) {
  TempDir dir("split");
  std::vector<std::vector<int32_t>> docs;
  for (int32_t d = 0; d < 10; ++d) docs.push_back(iota_ids(10 * d, 3 + d % 3));
  write_indexed(dir / "d", docs);
  auto ds = std::make_shared<const IndexedDataset>(dir / "d");
  const TrainValSegments split = split_documents(ds, 0.2);
  std::vector<int32_t> train, val;
  for (int d = 0; d < 10; ++d) (d < 8 ? train : val).insert((d < 8 ? train : val).end(), docs[d].begin(), docs[d].end());
  TokenWindowDataset t({split.train}, int64_t(train.size()) - 1, 1000), v({split.val}, int64_t(val.size()) - 1, 1000);
  EXPECT_EQ(window(t, 0), train);
  EXPECT_EQ(window(v, 0), val);
  EXPECT_EQ(split.val.first_position, int64_t(train.size()));  // positions in messages are file positions
}

// Windows read after the file was truncated fail with its name; windows still inside it read.
TEST(TokenWindowDataset, FileTruncatedAfterOpenFailsTheWindowsBeyondIt) {
  TempDir dir("tw_truncated");
  write_indexed(dir / "d", {iota_ids(0, 40)});
  auto ds = open_token_dataset({dir / "d"}, 4, 100);
  std::filesystem::resize_file(dir / "d.bin", 2 * 20);
  EXPECT_EQ(window(*ds, 0), iota_ids(0, 5));
  std::vector<int32_t> out(5);
  EXPECT_TRUE(throws_with([&] { ds->get(8, out.data(), nullptr); }, {dir / "d.bin", "byte offset 64"}));
}

// The check at open reads the stream in chunks: an id past the first chunk is found at its
// position, and one in the last, partial chunk too.
TEST(TokenWindowDataset, BadIdsAreFoundInEveryScanChunk) {
  TempDir dir("tw_chunks");
  const int64_t per_chunk = TokenSpan::kScanChunkBytes / 2;  // uint16 ids
  for (const int64_t at : {per_chunk + 17, 2 * per_chunk + 3}) {
    std::vector<int32_t> ids(2 * per_chunk + 100, 7);
    ids[at] = 999;
    write_llmc_shard(dir / "s.bin", ids);
    EXPECT_TRUE(throws_with([&] { open_token_dataset({dir / "s.bin"}, 4, 257); },
                            {"token id 999", "position " + std::to_string(at) + " "}));
  }
}

}  // namespace
}  // namespace tessera
