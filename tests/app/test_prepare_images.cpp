// Tests `tessera prepare --images` (app/prepare_images.h) by running the binary on PNG and JPEG
// files written here: the file it writes holds the images (resized) and the byte tokenizer's ids
// after the placeholders, reads back through the image-text reader and trains; bad entries
// (missing, truncated, not an image, malformed line) refuse the run naming line and file, or are
// skipped and counted.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "app/trainer.h"
#include "cli_testing.h"
#include "data/image_decode.h"
#include "data/image_files.h"
#include "data/image_text.h"
#include "error_testing.h"
#include "vlm_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The tests' tiny VLM (8x8 images in 4x4 patches: 4 placeholders per image) on an image-text file
// with byte captions: up to 4 + 5 + 1 tokens per sample.
const std::vector<std::string> kImageText = {"data.task=\"image_text\"", "data.tokenizer=\"byte\"",
                                             "train.seq_len=16", "train.global_batch=4", "optim.lr=1e-2"};
const std::string kTinyVlm = testing::tiny_vlm_toml(/*steps=*/25, /*warmup_steps=*/2);

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The settings as `tessera train` arguments.
std::vector<std::string> as_sets(const std::vector<std::string>& settings) {
  std::vector<std::string> args;
  for (const auto& s : settings) args.insert(args.end(), {"--set", s});
  return args;
}

std::vector<uint8_t> pattern(size_t n, int mul) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * mul + 3) & 255);
  return v;
}

// DIR/images with a.png (8x8 RGB), b.png (16x16 grey), c.jpg (12x8 RGB, flat), and captions.jsonl.
struct ImageSet {
  fs::path dir;
  std::vector<uint8_t> a_rgb, b_grey;
  explicit ImageSet(const std::string& name) : dir(testing::temp_dir(name)) {
    fs::create_directories(dir / "images");
    a_rgb = pattern(8 * 8 * 3, 7);
    b_grey = pattern(16 * 16, 5);
    testing::write_png((dir / "images" / "a.png").string(), 8, 8, PNG_COLOR_TYPE_RGB, 8, a_rgb);
    testing::write_png((dir / "images" / "b.png").string(), 16, 16, PNG_COLOR_TYPE_GRAY, 8, b_grey);
    std::vector<uint8_t> flat(12 * 8 * 3);
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = i % 3 == 0 ? 200 : i % 3 == 1 ? 40 : 90;
    testing::write_jpeg((dir / "images" / "c.jpg").string(), 12, 8, 3, flat, 95);
  }
  ~ImageSet() { fs::remove_all(dir); }
  void captions(const std::string& text) const { std::ofstream(dir / "captions.jsonl") << text; }
  testing::RunResult prepare(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"prepare", "--images", (dir / "images").string(), "--captions",
                                     (dir / "captions.jsonl").string(), "--out", (dir / "out.h5").string(),
                                     "--tokenizer", "byte", "--image-size", "8", "--patch-size", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_tessera(args, dir);
  }
};

const char* kGoodCaptions =
    "{\"image\": \"a.png\", \"text\": \"red\"}\n"
    "\n"
    "{\"image\": \"b.png\", \"text\": \"grey\"}\n"
    "{\"image\": \"c.jpg\", \"text\": \"flat\"}\n"
    "{\"text\": \"again\", \"image\": \"a.png\"}\n";

TEST(PrepareImages, WritesTheImagesAndCaptionsAndTrains) {
  const ImageSet set("prep_img");
  set.captions(kGoodCaptions);
  const auto r = set.prepare();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("prepared 4 samples"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3 images of 8x8x3, 4 placeholders (id 257)"), std::string::npos) << r.output;
  const ImageTextData d = read_image_text((set.dir / "out.h5").string());
  EXPECT_EQ(d.tokenizer, "byte");
  EXPECT_EQ(d.vocab_size, 258);
  EXPECT_EQ(d.placeholder_id, 257);
  EXPECT_EQ(d.pad_id, 256);
  ASSERT_EQ(d.num_images(), 3);  // a.png once, though two lines name it
  EXPECT_EQ(d.image_index, (std::vector<int64_t>{0, 1, 2, 0}));
  // The samples: 4 placeholders, the caption's bytes, end-of-text.
  const std::vector<std::string> texts = {"red", "grey", "flat", "again"};
  for (int64_t s = 0; s < 4; ++s) {
    std::vector<int32_t> want(4, 257);
    for (char ch : texts[s]) want.push_back(static_cast<unsigned char>(ch));
    want.push_back(256);
    EXPECT_EQ(std::vector<int32_t>(d.tokens.begin() + d.offsets[s], d.tokens.begin() + d.offsets[s + 1]), want) << s;
  }
  const int64_t n = 8 * 8 * 3;
  // a.png is 8x8 already: its pixels exactly.
  EXPECT_EQ(std::vector<uint8_t>(d.images.begin(), d.images.begin() + n), set.a_rgb);
  // b.png, 16x16 grey: each pixel the rounded mean of a 2x2 block, in all three channels.
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x) {
      const auto g = [&](int yy, int xx) { return static_cast<int>(set.b_grey[yy * 16 + xx]); };
      const double mean = (g(2 * y, 2 * x) + g(2 * y, 2 * x + 1) + g(2 * y + 1, 2 * x) + g(2 * y + 1, 2 * x + 1)) / 4.0;
      for (int c = 0; c < 3; ++c) EXPECT_NEAR(d.images[n + (y * 8 + x) * 3 + c], mean, 0.5) << y << "," << x;
    }
  // c.jpg, flat (200, 40, 90) at 12x8: still flat after resizing, within the JPEG error.
  for (int64_t p = 0; p < 64; ++p)
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(d.images[2 * n + p * 3 + c], c == 0 ? 200 : c == 1 ? 40 : 90, 3) << p;

  // The file trains: the image-text task reads it back, the loss falls.
  const std::string train = "data.train=[{path=\"" + (set.dir / "out.h5").string() + "\"}]";
  const Config cfg = parse_config_string(kTinyVlm, "tiny.toml", with(kImageText, {train}));
  Trainer t(cfg, "", MPI_COMM_NULL);
  std::vector<double> losses;
  for (int64_t s = 0; s < cfg.train.steps; ++s) losses.push_back(t.step(s).loss);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  // As a validation file it is scored by greedy caption accuracy (4 of the 4 image samples); the
  // examples print as text (25 steps: 0/4 measured, "aaai (red)"; the scoring is what is tested).
  std::ofstream(set.dir / "vl.toml") << kTinyVlm;
  const auto run = testing::run_tessera(
      with({"train", (set.dir / "vl.toml").string(), "--run-dir", (set.dir / "run").string()},
           as_sets(with(kImageText, {train, "data.valid=\"" + (set.dir / "out.h5").string() + "\"",
                                     "train.eval_every=25"}))),
      set.dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("caption accuracy"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("/4) | "), std::string::npos) << run.output;
  // The config's data.tokenizer must be the file's.
  EXPECT_TRUE(testing::throws_with(
      [&] {
        Trainer bad(parse_config_string(kTinyVlm, "tiny.toml", with(kImageText, {train, "data.tokenizer=\"gpt2\""})),
                    "", MPI_COMM_NULL);
      },
      {"out.h5 was tokenized with the byte tokenizer but data.tokenizer = \"gpt2\""}));
}

TEST(PrepareImages, TakesTheSizeFromAConfig) {
  const ImageSet set("prep_img_cfg");
  set.captions(kGoodCaptions);
  std::ofstream(set.dir / "vl.toml") << kTinyVlm << "\n";
  auto r = testing::run_tessera({"prepare", "--images", (set.dir / "images").string(), "--captions",
                                 (set.dir / "captions.jsonl").string(), "--out", (set.dir / "out.h5").string(),
                                 "--tokenizer", "byte", "--config", (set.dir / "vl.toml").string()},
                                set.dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_image_text((set.dir / "out.h5").string()).image_shape.height, 8);
  // Without a size anywhere: refused, saying how to give one.
  r = testing::run_tessera({"prepare", "--images", (set.dir / "images").string(), "--captions",
                            (set.dir / "captions.jsonl").string(), "--out", (set.dir / "o2.h5").string(),
                            "--tokenizer", "byte"},
                           set.dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("give the image size with --image-size N or a --config"), std::string::npos) << r.output;
  r = testing::run_tessera({"prepare", "--images", (set.dir / "images").string(), "--captions",
                            (set.dir / "captions.jsonl").string(), "--out", (set.dir / "o2.h5").string(),
                            "--tokenizer", "byte", "--image-size", "8", "--patch-size", "3"},
                           set.dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("the patch size 3 does not divide the image size 8"), std::string::npos) << r.output;
}

// Each kind of bad entry, alone in an otherwise good file: refused by default naming the line and
// file, nothing written; with --on-error skip, left out and counted.
TEST(PrepareImages, BadEntriesAreRefusedOrSkipped) {
  const ImageSet set("prep_img_bad");
  const fs::path img = set.dir / "images";
  const std::vector<uint8_t> png = testing::read_image_bytes((img / "a.png").string());
  testing::write_image_bytes((img / "cut.png").string(), std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  std::ofstream(img / "notes.png") << "not an image\n";
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {"{\"image\": \"gone.png\", \"text\": \"x\"}", (img / "gone.png").string() + ": cannot open the image"},
      {"{\"image\": \"cut.png\", \"text\": \"x\"}", (img / "cut.png").string() + ": bad PNG"},
      {"{\"image\": \"notes.png\", \"text\": \"x\"}", (img / "notes.png").string() + ": not a PNG or JPEG file"},
      {"{\"image\": \"a.png\", \"text\": ", "malformed JSON"},
      {"{\"image\": \"a.png\"}", "no \"text\" field"},
      {"[1, 2]", "a line must be one JSON object"},
  };
  for (const auto& c : cases) {
    set.captions(std::string(kGoodCaptions) + c.line + "\n{\"image\": \"b.png\", \"text\": \"last\"}\n");
    auto r = set.prepare();
    EXPECT_NE(r.exit_code, 0) << c.line;
    const std::string where = (set.dir / "captions.jsonl").string() + ":6: ";
    EXPECT_NE(r.output.find(where), std::string::npos) << c.line << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.line << "\n" << r.output;
    EXPECT_FALSE(fs::exists(set.dir / "out.h5")) << c.line;
    r = set.prepare({"--on-error", "skip"});
    ASSERT_EQ(r.exit_code, 0) << c.line << "\n" << r.output;
    EXPECT_NE(r.output.find("skipped 1 entry (--on-error skip); the first: " + where), std::string::npos) << r.output;
    EXPECT_EQ(read_image_text((set.dir / "out.h5").string()).num_samples(), 5) << c.line;
    fs::remove(set.dir / "out.h5");
  }
  // Every entry bad: nothing to write.
  set.captions("{\"image\": \"gone.png\", \"text\": \"x\"}\n");
  const auto r = set.prepare({"--on-error", "skip"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no samples to write (1 entry was skipped)"), std::string::npos) << r.output;
  EXPECT_NE(set.prepare({"--on-error", "maybe"}).exit_code, 0);
  const auto split = set.prepare({"--val-fraction", "0.1"});
  EXPECT_EQ(split.exit_code, 1);
  EXPECT_NE(split.output.find("prepare --images: --val-fraction and --separator are for text"), std::string::npos)
      << split.output;
}

}  // namespace
}  // namespace tessera
