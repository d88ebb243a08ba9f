// Tests scripts/data/prepare_digits.py (the handwritten digits set, docs/multimodal.md) on its first
// 20 images: it writes PNGs and captions, and `tessera prepare --images` turns them into a
// training and a held-out image-text file whose samples are "the digit d" after 16 placeholders,
// with grey images (R = G = B). Skipped, saying so, when /usr/bin/python3 has no scikit-learn.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "cli_testing.h"
#include "data/image_text.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

TEST(PrepareDigits, WritesTrainingAndHeldOutFiles) {
  if (std::system("/usr/bin/python3 -c 'import sklearn' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no scikit-learn (apt-get install python3-sklearn): the digits script "
                    "did not run";
  const fs::path root = fs::path(TESSERA_TEST_DATA_DIR).parent_path().parent_path();
  const fs::path dir = testing::temp_dir("digits");
  const auto r = testing::run_program(
      "/usr/bin/python3",
      {(root / "scripts" / "data" / "prepare_digits.py").string(), "--limit", "20", "--val-fraction", "0.25", "--out",
       (dir / "digits").string(), "--tessera", TESSERA_BINARY, "--config", (root / "configs" / "digits-vl.toml").string()},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote 20 PNGs"), std::string::npos) << r.output;
  std::set<std::string> captions;
  for (const auto& [split, n] : {std::pair{"train", 15}, std::pair{"val", 5}}) {
    const ImageTextData d = read_image_text((dir / "digits" / (std::string(split) + ".h5")).string());
    ASSERT_EQ(d.num_samples(), n) << split;
    EXPECT_EQ(d.num_images(), n) << split;
    EXPECT_EQ(d.image_shape.height, 16);  // configs/digits-vl.toml upscales the 8x8 digits
    EXPECT_EQ(d.tokenizer, "byte");
    for (int64_t s = 0; s < n; ++s) {
      const std::vector<int32_t> ids(d.tokens.begin() + d.offsets[s], d.tokens.begin() + d.offsets[s + 1]);
      ASSERT_EQ(ids.size(), 16u + 11u + 1u) << split << " " << s;
      for (int i = 0; i < 16; ++i) EXPECT_EQ(ids[i], 257);
      const std::string text(ids.begin() + 16, ids.end() - 1);
      EXPECT_EQ(text.substr(0, 10), "the digit ") << text;
      EXPECT_TRUE(text[10] >= '0' && text[10] <= '9') << text;
      EXPECT_EQ(ids.back(), 256);
      captions.insert(text);
    }
    for (size_t p = 0; p < d.images.size(); p += 3) {
      EXPECT_EQ(d.images[p], d.images[p + 1]);
      EXPECT_EQ(d.images[p], d.images[p + 2]);
    }
  }
  // load_digits begins 0, 1, 2, ..., 9, 0, 1, ...: the first 20 hold every digit.
  EXPECT_EQ(captions.size(), 10u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
