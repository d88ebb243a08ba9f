// Tests data/image_text.h (the image-text HDF5 format: round trip, every refusal naming its
// field), data/scenes.h (the synthetic scenes) and the image side of make_batch.
#include "data/image_text.h"

#include <hdf5.h>

#include <set>

#include "data/scenes.h"
#include "error_testing.h"
#include "h5_reader.h"
#include "temp_files.h"

namespace tessera {
namespace {

// Two 2x2 RGB images; samples: image 0, text only, image 1 (placeholder id 9, 2 per image).
ImageTextData small_data() {
  ImageTextData d;
  d.image_shape = {2, 2, 3};
  for (int i = 0; i < 24; ++i) d.images.push_back(static_cast<uint8_t>(10 * i));
  d.tokens = {9, 9, 1, 2, 0, /*text*/ 3, 4, 5, 0, /*image 1*/ 1, 9, 9, 2, 0};
  d.offsets = {0, 5, 9, 14};
  d.image_index = {0, -1, 1};
  d.tokenizer = "test-words";
  d.vocab_size = 10;
  d.placeholder_id = 9;
  d.pad_id = 0;
  return d;
}

// Replaces dataset /name of an existing file by `values` of `type`, or deletes it (values empty
// and type < 0): the malformed files the writer would refuse to write.
template <typename T>
void replace_dataset(const std::string& path, const char* name, hid_t type, const std::vector<T>& values) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Ldelete(f, name, H5P_DEFAULT);
  if (type >= 0) {
    hsize_t n = values.size();
    hid_t s = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(d);
    H5Sclose(s);
  }
  H5Fclose(f);
}

void delete_attribute(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Adelete(f, name);
  H5Fclose(f);
}

}  // namespace

TEST(ImageText, RoundTrip) {
  testing::TempDir dir("image_text_roundtrip");
  const ImageTextData d = small_data();
  write_image_text(dir / "a.h5", d);
  const ImageTextData r = read_image_text(dir / "a.h5");
  EXPECT_EQ(r.image_shape, d.image_shape);
  EXPECT_EQ(r.images, d.images);
  EXPECT_EQ(r.tokens, d.tokens);
  EXPECT_EQ(r.offsets, d.offsets);
  EXPECT_EQ(r.image_index, d.image_index);
  EXPECT_EQ(r.tokenizer, "test-words");
  EXPECT_EQ(r.vocab_size, 10);
  EXPECT_EQ(r.placeholder_id, 9);
  EXPECT_EQ(r.pad_id, 0);
}

// A dataset over it, windows of 6 + 1: padding and placeholders carry no loss; make_batch finds
// each image's run, leaves the text-only sample without one, and never targets a placeholder.
TEST(ImageText, DatasetAndBatch) {
  const ImageTextDataset ds(small_data(), 6, "small");
  std::vector<int32_t> w(7);
  std::vector<uint8_t> m(7);
  ds.get(0, w.data(), m.data());
  EXPECT_EQ(w, (std::vector<int32_t>{9, 9, 1, 2, 0, 0, 0}));
  EXPECT_EQ(m, (std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 0}));
  const Batch b = make_batch(ds, {0, 1, 2});
  EXPECT_EQ(b.image_sample, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(b.image_start, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(b.image_tokens, 2);
  ASSERT_EQ(b.images.size(), 24u);
  EXPECT_EQ(b.images[12], 120);  // image 1's first byte
  for (int32_t t : b.targets) EXPECT_NE(t, 9);
  EXPECT_EQ(b.targets[2 * 6 + 0], kIgnoreTarget);  // sample 2: position 0 would predict a placeholder
}

TEST(ImageText, RefusesMalformedFiles) {
  testing::TempDir dir("image_text_malformed");
  const std::string p = dir / "m.h5";
  auto fresh = [&] { write_image_text(p, small_data()); };
  fresh();
  replace_dataset<int64_t>(p, "offsets", -1, {});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {p, "no dataset /offsets"}));
  fresh();
  replace_dataset<int32_t>(p, "image_index", H5T_NATIVE_INT32, {0, -1, 1});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"/image_index has the wrong element type"}));
  fresh();
  replace_dataset<int64_t>(p, "image_index", H5T_NATIVE_INT64, {0, -1, 2});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"/image_index[2] = 2 is neither -1 nor an image"}));
  fresh();
  replace_dataset<int64_t>(p, "offsets", H5T_NATIVE_INT64, {0, 5, 9, 13});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"/offsets must run from 0 to the 14 entries"}));
  fresh();
  replace_dataset<int64_t>(p, "offsets", H5T_NATIVE_INT64, {0, 9, 5, 14});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"/offsets decreases at sample 1"}));
  fresh();
  replace_dataset<int32_t>(p, "tokens", H5T_NATIVE_INT32, {9, 9, 1, 2, 0, 3, 4, 5, 0, 1, 9, 2, 9, 0});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"sample 2's placeholder tokens (id 9) are not one run"}));
  fresh();
  replace_dataset<int32_t>(p, "tokens", H5T_NATIVE_INT32, {9, 9, 1, 2, 0, 3, 9, 5, 0, 1, 9, 9, 2, 0});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"sample 1 is text only", "holds 1 placeholder"}));
  fresh();
  replace_dataset<int32_t>(p, "tokens", H5T_NATIVE_INT32, {9, 9, 1, 2, 0, 3, 4, 5, 0, 1, 9, 9, 9, 0});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"sample 2 has 3 placeholder tokens, earlier image samples 2"}));
  fresh();
  replace_dataset<int32_t>(p, "tokens", H5T_NATIVE_INT32, {9, 9, 1, 2, 0, 3, 4, 12, 0, 1, 9, 9, 2, 0});
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"/tokens[7] = 12 is outside the vocabulary [0, 10)"}));
  fresh();
  replace_dataset<uint8_t>(p, "images", H5T_NATIVE_UINT8, std::vector<uint8_t>(24));
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"/images has 1 dimensions; expected 4"}));
  fresh();
  delete_attribute(p, "placeholder_id");
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"no attribute placeholder_id"}));
  fresh();
  delete_attribute(p, "tokenizer");
  EXPECT_TRUE(testing::throws_with([&] { read_image_text(p); }, {"no attribute tokenizer"}));
  {
    std::ofstream(dir / "text.h5") << "not hdf5";
    EXPECT_TRUE(testing::throws_with([&] { read_image_text(dir / "text.h5"); }, {"not an HDF5 file"}));
  }
  // The writer refuses what the reader would.
  ImageTextData bad = small_data();
  bad.placeholder_id = 10;
  EXPECT_TRUE(testing::throws_with([&] { write_image_text(p, bad); }, {"attribute placeholder_id = 10"}));
  // A window too short for an image's run.
  EXPECT_TRUE(testing::throws_with([&] { ImageTextDataset(small_data(), 2, "short"); },
                                   {"short: sample 2's image placeholders end at position 2"}));
}

// patchify against PyTorch's reshape/permute of the golden fixture's images (make_golden.py).
TEST(ImageText, PatchifyMatchesTheFixture) {
  testing::H5Reader f(TESSERA_TEST_DATA_DIR "/golden.h5");
  const auto images = f.read<double>("vlm_gpt2/images");
  const auto want = f.read<double>("vlm_gpt2/patches");
  const int64_t patch = f.attr_int("vlm_gpt2", "vision_patch_size");
  std::vector<uint8_t> pixels(images.values.begin(), images.values.end());
  const ImageShape s{images.shape[1], images.shape[2], images.shape[3]};
  std::vector<double> got(want.values.size());
  patchify(pixels.data(), images.shape[0], s, patch, got.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want.values[i], 1e-15) << i;
}

TEST(Scenes, CaptionsImagesAndSplits) {
  const SceneTask task(16, 7);
  const SceneTokenizer& tok = task.tokenizer();
  std::set<std::string> train, val;
  for (uint64_t i = 0; i < 200; ++i) {
    const Scene a = task.scene(i, false);
    EXPECT_EQ(a.image, task.scene(i, false).image);  // a pure function of the index
    EXPECT_EQ(tok.decode(tok.encode(a.caption)), a.caption);
    EXPECT_LE(static_cast<int64_t>(tok.encode(a.caption).size()) + 1, SceneTask::kMaxCaptionTokens);
    train.insert(a.caption);
    val.insert(task.scene(i, true).caption);
    // Both shapes' colours are drawn: the first colour word's RGB value appears in the image.
    const std::string colour = a.caption.substr(2, a.caption.find(' ', 2) - 2);
    const uint8_t red = colour == "red" ? 220 : colour == "green" ? 40 : colour == "blue" ? 50 : 230;
    bool found = false;
    for (size_t p = 0; p < a.image.size(); p += 3) found = found || a.image[p] == red;
    EXPECT_TRUE(found) << a.caption;
  }
  EXPECT_GT(train.size(), 100u);  // varied captions
  EXPECT_NE(task.scene(3, false).image, task.scene(3, true).image);
  const SceneDataset ds(task, false, 25, 100, 16);
  const Batch b = make_batch(ds, {0, 1});
  EXPECT_EQ(b.image_start, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(b.image_tokens, 16);
  EXPECT_EQ(b.images.size(), 2u * 16 * 16 * 3);
  EXPECT_EQ(b.targets[14], kIgnoreTarget);  // predicting the last placeholder
  EXPECT_EQ(b.targets[15], tok.encode("a")[0]);  // the last placeholder predicts the caption's first word
  EXPECT_TRUE(testing::throws_with([&] { SceneDataset(task, false, 20, 10, 16); }, {"train.seq_len = 20"}));
}

}  // namespace tessera
