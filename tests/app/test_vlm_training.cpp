// Vision-language training (model.kind = "vlm", data.task = "scenes"): the Trainer learns on one
// rank and scores held-out captions; unsupported layouts are refused; `mpiexec -n 2` data
// parallelism, tp 2 and dp 2 x tp 2 equal the 1-rank run (losses and every tensor of the
// checkpoint, vision.* and projector.* included), and the dp checkpoint resumes on 1 rank.
#include <gtest/gtest.h>

#include <fstream>

#include "app/trainer.h"
#include "data/image_text.h"
#include "data/scenes.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "vlm_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

// The VLM of tests/app/vlm_testing.h, 30 steps.
const std::string kTinyVlm = testing::tiny_vlm_toml(30, 5);

// 6 steps of the tiny VLM on one rank, then under each layout: the losses and every tensor of the
// final checkpoint (vision.* and projector.* included) equal the 1-rank run's within 1e-5.
// 2x2 patches (16 placeholders, then up to 9 caption tokens) in train.seq_len = 26: under
// sequence parallelism over tp = 2 each rank holds 13 positions, so an image's rows straddle the
// two ranks (13 on rank 0, 3 on rank 1).
void expect_layouts_equal_one_rank(const std::string& name, int ranks,
                                   const std::vector<std::pair<std::string, std::vector<std::string>>>& layouts) {
  const fs::path dir = testing::temp_dir(name);
  std::ofstream(dir / "tiny-vlm.toml") << kTinyVlm;
  const std::vector<std::string> settings = {"--set", "train.steps=6", "--set", "train.micro_batch=2", "--set",
                                             "vision.patch_size=2", "--set", "train.seq_len=26"};
  auto r = testing::train_run(dir, "tiny-vlm.toml", "one", 1, settings);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  for (const auto& [layout, sets] : layouts) {
    r = testing::train_run(dir, "tiny-vlm.toml", layout, ranks, testing::with(settings, sets));
    ASSERT_EQ(r.exit_code, 0) << layout << ": " << r.output;
    testing::expect_losses_near(testing::losses(dir / layout / "metrics.jsonl"), want, 1e-5, layout);
    testing::expect_checkpoints_near(dir / layout / "checkpoints" / "step_00000006.h5",
                                     dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, layout);
  }
  fs::remove_all(dir);
}

}  // namespace

// 30 steps on one rank in process: the loss falls from ln(15) = 2.71 (measured: to 1.74), and the
// vision tower's and projector's parameters are in the store.
TEST(VlmTraining, LearnsOnOneRank) {
  const Config cfg = parse_config_string(kTinyVlm, "tiny-vlm.toml");
  Trainer t(cfg, "", MPI_COMM_NULL);
  std::vector<double> losses;
  for (int64_t s = 0; s < cfg.train.steps; ++s) losses.push_back(t.step(s).loss);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  for (const char* name : {"vision.patch.weight", "vision.pos.weight", "vision.blocks.0.attn.q.weight",
                           "projector.fc2.weight", "wte.weight"})
    EXPECT_GE(t.params().find(name), 0) << name;
}

TEST(VlmTraining, RefusesWhatIsNotBuilt) {
  EXPECT_TRUE(testing::throws_with(
      [&] { check_supported(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"parallel.cp=2"})); },
      {"model.kind = \"vlm\" trains under data and tensor parallelism only", "parallel.cp = 1"}));
  // tp trains, with sequence parallelism too.
  check_supported(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"parallel.tp=2", "parallel.sequence_parallel=true"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { Trainer t(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"data.task=\"addition\""}), "", MPI_COMM_NULL); },
      {"data.task = \"addition\" with model.kind = \"vlm\""}));
  EXPECT_TRUE(testing::throws_with(
      [&] { Trainer t(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"vision.placeholder_id=3"}), "", MPI_COMM_NULL); },
      {"vision.placeholder_id = 3 but the data marks images with token id 14"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { Trainer t(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"train.seq_len=10"}), "", MPI_COMM_NULL); },
      {"train.seq_len = 10 cannot hold an image's 4 placeholder tokens"}));
}

// data.task = "image_text": an HDF5 file (docs/data.md) of 48 scenes, every third sample text only
// (its caption without the image), trains in process and its validation file is scored.
TEST(VlmTraining, TrainsFromAnImageTextFile) {
  const fs::path dir = testing::temp_dir("vlm_file");
  const SceneTask task(8, 3);
  const SceneTokenizer& tok = task.tokenizer();
  auto write = [&](const fs::path& path, bool validation) {
    ImageTextData d;
    d.image_shape = {8, 8, 3};
    d.tokenizer = "scene-words";
    d.vocab_size = tok.vocab_size();
    d.placeholder_id = tok.placeholder_id();
    d.pad_id = tok.eos_id();
    d.offsets = {0};
    for (int64_t i = 0; i < 48; ++i) {
      const Scene sc = task.scene(static_cast<uint64_t>(i), validation);
      const bool text_only = i % 3 == 2;
      if (!text_only) {
        d.image_index.push_back(d.num_images());
        d.images.insert(d.images.end(), sc.image.begin(), sc.image.end());
        d.tokens.insert(d.tokens.end(), 4, tok.placeholder_id());
      } else {
        d.image_index.push_back(-1);
      }
      for (int32_t id : tok.encode(sc.caption)) d.tokens.push_back(id);
      d.tokens.push_back(tok.eos_id());
      d.offsets.push_back(static_cast<int64_t>(d.tokens.size()));
    }
    write_image_text(path.string(), d);
  };
  write(dir / "train.h5", false);
  write(dir / "valid.h5", true);
  const Config cfg = parse_config_string(
      kTinyVlm, "tiny-vlm.toml",
      {"data.task=\"image_text\"", "data.train=[{path=\"" + (dir / "train.h5").string() + "\"}]",
       "data.valid=\"" + (dir / "valid.h5").string() + "\"", "train.steps=20"});
  Trainer t(cfg, "", MPI_COMM_NULL);
  std::vector<double> losses;
  for (int64_t s = 0; s < cfg.train.steps; ++s) losses.push_back(t.step(s).loss);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  EXPECT_TRUE(testing::throws_with(
      [&] {
        Trainer bad(parse_config_string(kTinyVlm, "tiny-vlm.toml",
                                        {"data.task=\"image_text\"", "data.train=[{path=\"" + (dir / "none.h5").string() + "\"}]"}),
                    "", MPI_COMM_NULL);
      },
      {"none.h5"}));
  fs::remove_all(dir);
}

TEST(VlmTrainingSlow, DataParallelEqualsTheOneRankRun) {
  const fs::path dir = testing::temp_dir("vlm_dp");
  std::ofstream(dir / "tiny-vlm.toml") << kTinyVlm;
  const std::vector<std::string> settings = {"--set", "train.steps=6", "--set", "train.micro_batch=2"};
  auto r = testing::train_run(dir, "tiny-vlm.toml", "one", 1, settings);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  r = testing::train_run(dir, "tiny-vlm.toml", "dp2", 2, settings);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  testing::expect_losses_near(testing::losses(dir / "dp2" / "metrics.jsonl"), want, 1e-5, "dp2");
  testing::expect_checkpoints_near(dir / "dp2" / "checkpoints" / "step_00000006.h5",
                                   dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, "dp2");
  // The 2-rank checkpoint (vision.* and projector.* with the rest) continues on 1 rank.
  fs::copy(dir / "dp2", dir / "resumed", fs::copy_options::recursive);
  r = testing::train_run(dir, "tiny-vlm.toml", "resumed", 1, testing::with(settings, {"--set", "train.steps=8"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 6"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// Tensor parallelism: the encoder's blocks (vision.n_head = 2, vision.ffn_hidden = 64) and the
// language model's split over 2 ranks; patch embedding, positions, final norm and projector
// replicated. With sequence parallelism an image's rows straddle the two ranks.
TEST(VlmTrainingSlow, TensorParallelEqualsTheOneRankRun) {
  expect_layouts_equal_one_rank(
      "vlm_tp", 2,
      {{"tp2", {"--set", "parallel.tp=2"}},
       {"tp2sp", {"--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true"}}});
}

// dp 2 x tp 2 with sequence parallelism on four ranks: each dp rank's tp pair sees its own images. Four processes on two
// cores: 23-45 s.
TEST(VlmTrainingSlow, DataTimesTensorParallelEqualsTheOneRankRun) {
  expect_layouts_equal_one_rank(
      "vlm_dptp", 4, {{"dp2tp2sp", {"--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true"}}});
}

TEST(VlmTraining, RefusesAnEncoderThatDoesNotSplit) {
  const fs::path dir = testing::temp_dir("vlm_tp_heads");
  std::ofstream(dir / "tiny-vlm.toml") << kTinyVlm;
  const auto r = testing::train_run(dir, "tiny-vlm.toml", "heads", 2,
                                    {"--set", "train.steps=1", "--set", "parallel.tp=2", "--set", "vision.n_head=1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("vision.n_head = 1 is not divisible by parallel.tp = 2"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace tessera
