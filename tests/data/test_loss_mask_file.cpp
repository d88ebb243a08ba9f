// Tests data/loss_mask_file.h: round trip, header checks, and the mask read through
// TokenWindowDataset windows (a dataset without a .mask keeps all ones).
#include "data/loss_mask_file.h"

#include <gtest/gtest.h>

#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "temp_files.h"

namespace tessera {
namespace {

using testing::TempDir;
using testing::throws_with;

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }
std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Documents {1 2 3 4} and {5 6 7} with masks 0011 and 011.
void write_dataset(const std::string& prefix, bool with_mask) {
  IndexedDatasetBuilder b(prefix, TokenDType::kUInt16);
  LossMaskBuilder m(prefix);
  b.add_document(std::vector<int32_t>{1, 2, 3, 4});
  m.add(std::vector<uint8_t>{0, 0, 1, 1});
  b.add_document(std::vector<int32_t>{5, 6, 7});
  m.add(std::vector<uint8_t>{0, 1, 1});
  if (with_mask) m.finalize();
  b.finalize();
}

TEST(LossMaskFile, RoundTripAndLayout) {
  TempDir dir("mask_roundtrip");
  write_dataset(dir / "d", true);
  const std::string bytes = read_bytes(dir / "d.mask");
  ASSERT_EQ(bytes.size(), 24u + 7u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("TSRMASK\0", 8));
  EXPECT_EQ(bytes[8], 1);   // version
  EXPECT_EQ(bytes[16], 7);  // tokens
  EXPECT_EQ(bytes.substr(24), std::string("\0\0\1\1\0\1\1", 7));
  const LossMaskFile f(dir / "d.mask");
  EXPECT_EQ(f.num_tokens(), 7);
  uint8_t out[3];
  f.read(3, 3, out);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 3), (std::vector<uint8_t>{1, 0, 1}));
}

TEST(LossMaskFile, BadFilesAreRefusedNamingThem) {
  TempDir dir("mask_bad");
  write_dataset(dir / "d", true);
  const std::string good = read_bytes(dir / "d.mask");
  std::string bad = good;
  bad[0] = 'X';
  write_bytes(dir / "d.mask", bad);
  EXPECT_TRUE(throws_with([&] { LossMaskFile f(dir / "d.mask"); }, {dir / "d.mask", "wrong magic"}));
  bad = good;
  bad[8] = 2;
  write_bytes(dir / "d.mask", bad);
  EXPECT_TRUE(throws_with([&] { LossMaskFile f(dir / "d.mask"); }, {"unsupported loss mask version 2"}));
  write_bytes(dir / "d.mask", good.substr(0, good.size() - 1));
  EXPECT_TRUE(throws_with([&] { LossMaskFile f(dir / "d.mask"); }, {"announces 7 tokens", "holds 6 flags"}));
  write_bytes(dir / "d.mask", good);
  EXPECT_TRUE(throws_with([&] { open_loss_mask(dir / "d", 8); }, {"masks 7 tokens", "holds 8"}));
  bad = good;
  bad[24 + 2] = 5;
  write_bytes(dir / "d.mask", bad);
  const LossMaskFile f(dir / "d.mask");
  uint8_t out[7];
  EXPECT_TRUE(throws_with([&] { f.read(0, 7, out); }, {"flag 5 at token position 2"}));
}

TEST(LossMaskFile, WindowsCarryTheMask) {
  TempDir dir("mask_windows");
  write_dataset(dir / "m", true);
  write_dataset(dir / "n", false);
  EXPECT_EQ(open_loss_mask(dir / "n", 7), nullptr);
  // Both datasets back to back, windows of T + 1 = 4 tokens with stride 3.
  TokenWindowDataset ds(open_token_segments({dir / "m", dir / "n"}), 3, 16);
  ASSERT_EQ(ds.num_samples(), 4);
  int32_t ids[4];
  uint8_t mask[4];
  ds.get(1, ids, mask);  // tokens 3..6 of m
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(std::vector<uint8_t>(mask, mask + 4), (std::vector<uint8_t>{1, 0, 1, 1}));
  ds.get(2, ids, mask);  // m's token 6, then n (no mask: ones)
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{7, 1, 2, 3}));
  EXPECT_EQ(std::vector<uint8_t>(mask, mask + 4), (std::vector<uint8_t>{1, 1, 1, 1}));
  // A validation split keeps each side's part of the mask.
  const TrainValSegments split = split_documents(std::make_shared<const IndexedDataset>(dir / "m"), 0.5);
  TokenWindowDataset val({split.val}, 2, 16);
  val.get(0, ids, mask);
  EXPECT_EQ(std::vector<uint8_t>(mask, mask + 3), (std::vector<uint8_t>{0, 1, 1}));
}

}  // namespace
}  // namespace tessera
