// Tests data/indexed_dataset.h: round trips for every integer dtype, the .idx layout byte by byte
// against the documented offsets, files shaped as Megatron writes them but tessera does not
// (several sequences per document, multimodal modes), and every validation error at open.
#include "data/indexed_dataset.h"

#include <filesystem>
#include <random>

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

std::vector<std::vector<int32_t>> random_documents(int n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> len(0, 40);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<std::vector<int32_t>> docs(n);
  for (auto& d : docs) {
    d.resize(len(rng));
    for (auto& x : d) x = id(rng);
  }
  docs[1].clear();           // an empty document
  docs[2].push_back(vocab - 1);  // the largest id
  return docs;
}

void write_dataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs, TokenDType dtype) {
  IndexedDatasetBuilder b(prefix, dtype);
  for (const auto& d : docs) b.add_document(d);
  b.finalize();
}

std::vector<int32_t> to_vector(const TokenSpan& t) {
  std::vector<int32_t> v(t.size());
  t.copy_to(0, t.size(), v.data());
  return v;
}

void expect_reads_back(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs, TokenDType dtype) {
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), dtype);
  ASSERT_EQ(ds.num_documents(), int64_t(docs.size()));
  EXPECT_EQ(ds.num_sequences(), int64_t(docs.size()));
  std::vector<int32_t> all;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(to_vector(ds.document(d)), docs[d]) << "document " << d;
    EXPECT_EQ(ds.document_token_offset(d), int64_t(all.size()));
    all.insert(all.end(), docs[d].begin(), docs[d].end());
  }
  EXPECT_EQ(ds.num_tokens(), int64_t(all.size()));
  EXPECT_EQ(to_vector(ds.tokens()), all);
}

TEST(IndexedDataset, RoundTripsUint16) {
  TempDir dir("idx_u16");
  const auto docs = random_documents(50, 50257, 1);
  const TokenDType dtype = IndexedDatasetBuilder::dtype_for_vocab(50257);
  EXPECT_EQ(dtype, TokenDType::kUInt16);
  write_dataset(dir / "d", docs, dtype);
  expect_reads_back(dir / "d", docs, TokenDType::kUInt16);
}

TEST(IndexedDataset, RoundTripsInt32ForLargeVocabularies) {
  TempDir dir("idx_i32");
  const auto docs = random_documents(50, 128256, 2);  // Llama 3's vocabulary
  const TokenDType dtype = IndexedDatasetBuilder::dtype_for_vocab(128256);
  EXPECT_EQ(dtype, TokenDType::kInt32);
  EXPECT_EQ(IndexedDatasetBuilder::dtype_for_vocab(65536), TokenDType::kUInt16);
  EXPECT_EQ(IndexedDatasetBuilder::dtype_for_vocab(65537), TokenDType::kInt32);
  write_dataset(dir / "d", docs, dtype);
  expect_reads_back(dir / "d", docs, TokenDType::kInt32);
}

TEST(IndexedDataset, RoundTripsEveryIntegerDtype) {
  TempDir dir("idx_all");
  const auto docs = random_documents(10, 100, 3);
  for (TokenDType t : {TokenDType::kUInt8, TokenDType::kInt8, TokenDType::kInt16, TokenDType::kInt64}) {
    write_dataset(dir / "d", docs, t);
    expect_reads_back(dir / "d", docs, t);
  }
}

TEST(IndexedDataset, OpensFromPrefixBinOrIdxPath) {
  TempDir dir("idx_paths");
  write_dataset(dir / "d", {{1, 2, 3}}, TokenDType::kUInt16);
  for (const std::string& p : {dir / "d", dir / "d.bin", dir / "d.idx"}) {
    IndexedDataset ds(p);
    EXPECT_EQ(ds.prefix(), dir / "d");
    EXPECT_EQ(ds.num_tokens(), 3);
  }
}

// The layout documented in indexed_dataset.h and docs/data.md, checked at its byte offsets.
TEST(IndexedDataset, IndexLayoutMatchesMegatronFieldByField) {
  TempDir dir("idx_layout");
  write_dataset(dir / "d", {{7, 8, 9}, {}, {1, 2, 3, 4, 65535}}, TokenDType::kUInt16);
  const std::string idx = read_bytes(dir / "d.idx");
  ASSERT_EQ(idx.size(), 34u + 4 * 3 + 8 * 3 + 8 * 4);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(value_at<uint64_t>(idx, 9), 1u);   // version
  EXPECT_EQ(value_at<uint8_t>(idx, 17), 8u);   // dtype code: uint16
  EXPECT_EQ(value_at<uint64_t>(idx, 18), 3u);  // sequences
  EXPECT_EQ(value_at<uint64_t>(idx, 26), 4u);  // document indices = documents + 1
  const int32_t lengths[] = {3, 0, 5};
  const int64_t pointers[] = {0, 6, 6};  // bytes
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(value_at<int32_t>(idx, 34 + 4 * s), lengths[s]) << s;
    EXPECT_EQ(value_at<int64_t>(idx, 46 + 8 * s), pointers[s]) << s;
  }
  for (int d = 0; d < 4; ++d) EXPECT_EQ(value_at<int64_t>(idx, 70 + 8 * d), d) << d;
  const std::string bin = read_bytes(dir / "d.bin");
  ASSERT_EQ(bin.size(), 16u);
  const uint16_t want[] = {7, 8, 9, 1, 2, 3, 4, 65535};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(value_at<uint16_t>(bin, 2 * i), want[i]) << i;
}

// An index built by hand as Megatron's sentence-splitting tools write it: 4 sequences in 2
// documents ([0, 3) and [3, 4)), int32 tokens; optionally with the multimodal int8 modes appended.
std::string megatron_index(bool with_modes) {
  std::string idx("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(uint8_t{4});
  put(uint64_t{4});
  put(uint64_t{3});
  for (int32_t len : {2, 1, 3, 2}) put(len);
  for (int64_t ptr : {0, 8, 12, 24}) put(ptr);
  for (int64_t d : {0, 3, 4}) put(d);
  if (with_modes)
    for (int k = 0; k < 4; ++k) put(int8_t{0});
  return idx;
}

TEST(IndexedDataset, ReadsSeveralSequencesPerDocumentAndMultimodalModes) {
  TempDir dir("idx_megatron");
  std::string bin;
  for (int32_t t = 10; t < 18; ++t) bin.append(reinterpret_cast<const char*>(&t), 4);
  write_bytes(dir / "m.bin", bin);
  for (bool modes : {false, true}) {
    write_bytes(dir / "m.idx", megatron_index(modes));
    IndexedDataset ds(dir / "m");
    EXPECT_EQ(ds.dtype(), TokenDType::kInt32);
    EXPECT_EQ(ds.num_sequences(), 4);
    EXPECT_EQ(ds.num_documents(), 2);
    EXPECT_EQ(to_vector(ds.sequence(2)), (std::vector<int32_t>{13, 14, 15}));
    EXPECT_EQ(to_vector(ds.document(0)), (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
    EXPECT_EQ(to_vector(ds.document(1)), (std::vector<int32_t>{16, 17}));
  }
}

TEST(IndexedDatasetBuilder, RejectsIdsOutsideTheDtype) {
  TempDir dir("idx_range");
  IndexedDatasetBuilder b(dir / "d", TokenDType::kUInt16);
  const std::vector<int32_t> big = {1, 65536}, negative = {-1};
  EXPECT_TRUE(throws_with([&] { b.add_document(big); }, {dir / "d", "65536", "uint16"}));
  EXPECT_TRUE(throws_with([&] { b.add_document(negative); }, {"-1", "uint16"}));
}

TEST(IndexedDatasetBuilder, WritesNothingUnlessFinalized) {
  TempDir dir("idx_atomic");
  {
    IndexedDatasetBuilder b(dir / "d", TokenDType::kUInt16);
    b.add_document(std::vector<int32_t>{1, 2, 3});
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));  // no d.bin, d.idx, nor temporaries
  write_dataset(dir / "d", {{1}}, TokenDType::kUInt16);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"d.bin", "d.idx"}));
}

// ---- validation errors: each names the file and the problem ----

class IndexedDatasetErrors : public ::testing::Test {
 protected:
  void SetUp() override { write_dataset(prefix, {{1, 2, 3}, {4, 5}, {6}}, TokenDType::kUInt16); }
  ::testing::AssertionResult open_fails(std::initializer_list<std::string> parts) {
    return throws_with([&] { IndexedDataset ds(prefix); }, parts);
  }
  TempDir dir{"idx_errors"};
  const std::string prefix = dir / "d", idx = prefix + ".idx", bin = prefix + ".bin";
};

TEST_F(IndexedDatasetErrors, MissingFiles) {
  std::filesystem::remove(idx);
  EXPECT_TRUE(open_fails({"missing file", idx}));
  std::filesystem::remove(bin);
  write_dataset(dir / "e", {{1}}, TokenDType::kUInt16);
  std::filesystem::remove(dir / "e.bin");
  EXPECT_TRUE(throws_with([&] { IndexedDataset ds(dir / "e"); }, {"missing file", dir / "e.bin"}));
}

TEST_F(IndexedDatasetErrors, WrongMagic) {
  patch_file<char>(idx, 3, 'X');
  EXPECT_TRUE(open_fails({idx, "wrong magic"}));
  write_bytes(idx, "MMID");  // shorter than the magic
  EXPECT_TRUE(open_fails({idx, "wrong magic"}));
}

TEST_F(IndexedDatasetErrors, UnknownVersion) {
  patch_file<uint64_t>(idx, 9, 2);
  EXPECT_TRUE(open_fails({idx, "unsupported index version 2"}));
}

TEST_F(IndexedDatasetErrors, UnknownOrNonIntegerDtype) {
  patch_file<uint8_t>(idx, 17, 9);
  EXPECT_TRUE(open_fails({idx, "unknown dtype code 9"}));
  patch_file<uint8_t>(idx, 17, 0);
  EXPECT_TRUE(open_fails({idx, "unknown dtype code 0"}));
  patch_file<uint8_t>(idx, 17, 7);
  EXPECT_TRUE(open_fails({idx, "float32", "cannot hold token ids"}));
}

TEST_F(IndexedDatasetErrors, TruncatedIndex) {
  const std::string full = read_bytes(idx);
  write_bytes(idx, full.substr(0, full.size() - 5));
  EXPECT_TRUE(open_fails({idx, "truncated", "3 sequences"}));
  write_bytes(idx, full.substr(0, 20));
  EXPECT_TRUE(open_fails({idx, "truncated", "header"}));
  write_bytes(idx, full + "xx");
  EXPECT_TRUE(open_fails({idx, "unexpected bytes"}));
}

TEST_F(IndexedDatasetErrors, BinSizeDisagreesWithIndex) {
  const std::string full = read_bytes(bin);
  write_bytes(bin, full.substr(0, full.size() - 2));
  EXPECT_TRUE(open_fails({bin, "too small", "10 bytes", idx}));
  write_bytes(bin, full + "ab");
  EXPECT_TRUE(open_fails({bin, "more than the 12", idx}));
}

TEST_F(IndexedDatasetErrors, PointersBeyondBinOrNotMonotonic) {
  // Sequence 2 moved back into sequence 1: not monotonic.
  patch_file<int64_t>(idx, 34 + 4 * 3 + 8 * 2, 4);
  EXPECT_TRUE(open_fails({idx, "not monotonic", "sequence 2"}));
  // A length that runs past the end of the .bin.
  SetUp();
  patch_file<int32_t>(idx, 34 + 4 * 2, 100);
  EXPECT_TRUE(open_fails({bin, "too small", idx}));
  // A gap between sequences.
  SetUp();
  patch_file<int64_t>(idx, 34 + 4 * 3 + 8 * 1, 8);
  EXPECT_TRUE(open_fails({idx, "gap", "sequence 1"}));
}

TEST_F(IndexedDatasetErrors, DocumentIndicesMustRiseToTheSequenceCount) {
  const size_t doc_at = 34 + 12 * 3;
  patch_file<int64_t>(idx, doc_at + 8 * 3, 2);
  EXPECT_TRUE(open_fails({idx, "last document index is 2", "3 sequences"}));
  SetUp();
  patch_file<int64_t>(idx, doc_at, 1);
  EXPECT_TRUE(open_fails({idx, "document index 0 is 1"}));
  SetUp();
  patch_file<int64_t>(idx, doc_at + 8 * 2, 0);
  EXPECT_TRUE(open_fails({idx, "document index 2 is 0"}));
}

// Tiny Shakespeare's real GPT-2 ids (no tokenizer needed): written as one document, read back equal.
TEST(IndexedDataset, TinyShakespeareGpt2IdsRoundTrip) {
  const std::string src = std::string(TESSERA_SHARED_DATA_DIR) + "/gpt2/tinyshakespeare_gpt2_u16le.bin";
  if (!std::filesystem::exists(src)) GTEST_SKIP() << src << " not present";
  const std::string raw = read_bytes(src);
  std::vector<int32_t> ids(raw.size() / 2);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = value_at<uint16_t>(raw, 2 * i);
  ASSERT_EQ(ids.size(), 338025u);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 4), (std::vector<int32_t>{5962, 22307, 25, 198}));
  TempDir dir("idx_shakespeare");
  write_dataset(dir / "s", {ids}, IndexedDatasetBuilder::dtype_for_vocab(50257));
  IndexedDataset ds(dir / "s");
  EXPECT_EQ(ds.num_tokens(), 338025);
  EXPECT_EQ(to_vector(ds.document(0)), ids);
  EXPECT_EQ(read_bytes(dir / "s.bin"), raw);  // uint16 LE: the .bin is the raw file itself
}

// A .bin cut short after the dataset was opened (a file rewritten while training runs): reading
// beyond the new end is an error naming the file, the offset and the length; what is still there
// reads back. (A memory-mapped .bin killed the process with SIGBUS here.)
TEST(IndexedDataset, BinTruncatedAfterOpenIsAnErrorNamingTheFile) {
  TempDir dir("idx_truncated");
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11, 12}};
  write_dataset(dir / "d", docs, TokenDType::kUInt16);
  IndexedDataset ds(dir / "d");
  std::filesystem::resize_file(dir / "d.bin", 10);  // 5 tokens left
  EXPECT_EQ(to_vector(ds.document(0)), docs[0]);
  EXPECT_TRUE(throws_with([&] { to_vector(ds.document(1)); },
                          {dir / "d.bin", "cannot read 14 bytes at byte offset 10", "has 10 bytes now",
                           "24 when it was opened"}));
  std::filesystem::resize_file(dir / "d.bin", 0);
  EXPECT_TRUE(throws_with([&] { ds.tokens()[0]; }, {dir / "d.bin", "byte offset 0", "has 0 bytes now"}));
}

}  // namespace
}  // namespace tessera
