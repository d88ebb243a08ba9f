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
// seq_len 28 (context parallelism needs a multiple of 2 cp): under cp 2 rank 0 holds positions
// [0, 7) and [21, 28), rank 1 [7, 21), so an image at [0, 16) falls on both.
// base: settings of both runs (pipeline stages need model.n_layer >= pp). kQuietKeyBias: the
// attention key biases' exact gradient is zero (a key bias adds the same q.b to every score of a
// query), so theirs is rounding noise (about 1e-9), which AdamW with eps 1e-8 turns into lr-sized
// steps of random sign, different on each layout: measured 1.1-1.2e-5 of the largest parameter
// apart under cp 2 x tp 2 + sp and dp 2 x cp 2 after 6 steps, every other tensor within 1e-5
// (and 1.004e-5 after tp 2 + sp -> 1 rank on an Intel Xeon with AVX-512, 2026-12-06).
// optim.eps = 1e-6 in both runs leaves the real gradients' steps as they are and the noise's at
// 1e-3 of lr.
const std::vector<std::string> kQuietKeyBias = {"--set", "optim.eps=1e-6"};

void expect_layouts_equal_one_rank(const std::string& name, int ranks,
                                   const std::vector<std::pair<std::string, std::vector<std::string>>>& layouts,
                                   int64_t seq_len = 26, const std::vector<std::string>& base = {}) {
  const fs::path dir = testing::temp_dir(name);
  std::ofstream(dir / "tiny-vlm.toml") << kTinyVlm;
  const std::vector<std::string> settings = testing::with(
      {"--set", "train.steps=6", "--set", "train.micro_batch=2", "--set", "vision.patch_size=2", "--set",
       "train.seq_len=" + std::to_string(seq_len)},
      base);
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

// A checkpoint of the tiny VLM (2x2 patches, seq_len 26) written after 6 of 8 steps under one layout
// continues under another: the last two losses and every tensor of the step-8 checkpoint (vision.*
// and projector.* with their AdamW moments) equal the uninterrupted 1-rank run's within 1e-5.
void expect_vlm_resumes_across_layouts(const std::string& name, const std::vector<testing::LayoutHop>& hops,
                                   const std::vector<std::string>& base = {"--set", "train.seq_len=26"}) {
  const fs::path dir = testing::temp_dir(name);
  std::ofstream(dir / "tiny-vlm.toml") << kTinyVlm;
  const std::vector<std::string> settings = testing::with(
      {"--set", "train.steps=8", "--set", "train.micro_batch=2", "--set", "vision.patch_size=2"}, base);
  testing::expect_resumes_across_layouts(dir, "tiny-vlm.toml", settings, hops, true);
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

// Every layout is accepted (pp, cp, tp with sp); data that does not fit the model is refused naming why.
TEST(VlmTraining, AcceptsTheLayoutsAndRefusesDataThatDoesNotFit) {
  check_supported(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"parallel.pp=2", "model.n_layer=2"}));
  check_supported(parse_config_string(kTinyVlm, "tiny-vlm.toml", {"parallel.cp=2"}));
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

// Context parallelism: each cp rank runs the encoder on every image of its samples and writes the
// rows its two load-balanced chunks hold (a scene's image at [0, 16) of 28 positions: rows [0, 7)
// on rank 0, [7, 16) on rank 1); the encoder's gradients, each cp
// rank's from its own rows, add up in the reduction over dp x cp. cp 2 with the ring and with the
// all-gather exchange.
TEST(VlmTrainingSlow, ContextParallelEqualsTheOneRankRun) {
  expect_layouts_equal_one_rank("vlm_cp", 2,
                                {{"cp2", {"--set", "parallel.cp=2"}},
                                 {"cp2allgather", {"--set", "parallel.cp=2", "--set", "parallel.cp_comm=\"allgather\""}}},
                                28, kQuietKeyBias);
}

// cp 2 x tp 2 with sequence parallelism, and dp 2 x cp 2, on four ranks.
TEST(VlmTrainingSlow, ContextTimesTensorAndDataParallelEqualTheOneRankRun) {
  expect_layouts_equal_one_rank(
      "vlm_cp4", 4,
      {{"cp2tp2sp", {"--set", "parallel.cp=2", "--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true"}},
       {"dp2cp2", {"--set", "parallel.cp=2"}}},
      28, kQuietKeyBias);
}

// Pipeline parallelism: the encoder and projector live on the first stage with the embedding (the
// cut weighs them there, model/stage_cut.h); the images go to its forward and the patches stay
// until its backward. 2 stages of a 2-block language model, under the default schedule (1f1b),
// zero-bubble's zb-h1 (the encoder's backward runs inside B, its gradients final with the
// embedding's) and gpipe; the end-of-run caption evaluation runs through the stages.
TEST(VlmTrainingSlow, PipelineParallelEqualsTheOneRankRun) {
  expect_layouts_equal_one_rank("vlm_pp", 2,
                                {{"pp2", {"--set", "parallel.pp=2"}},
                                 {"pp2zb", {"--set", "parallel.pp=2", "--set", "parallel.pp_schedule=\"zb-h1\""}},
                                 {"pp2gpipe", {"--set", "parallel.pp=2", "--set", "parallel.pp_schedule=\"gpipe\""}}},
                                26, {"--set", "model.n_layer=2"});
}

// The encoder as a pipeline stage of its own: parallel.pp_layers = [0, 2] puts the vision tower,
// the projector and the embedding alone on the first stage (its output the embedded sequence with
// the image rows merged in, its backward the reverse) and both blocks on the second, under 1f1b and
// zb-h1.
TEST(VlmTrainingSlow, PipelineWithTheEncoderAloneOnTheFirstStageEqualsTheOneRankRun) {
  const std::vector<std::string> encoder_stage = {"--set", "parallel.pp=2", "--set", "parallel.pp_layers=[0, 2]"};
  expect_layouts_equal_one_rank("vlm_pp_encoder", 2,
                                {{"pp2enc", encoder_stage},
                                 {"pp2enczb", testing::with(encoder_stage, {"--set", "parallel.pp_schedule=\"zb-h1\""})}},
                                26, {"--set", "model.n_layer=2"});
}

// Interleaved 1f1b (vpp 2: rank 0 holds chunks 0 and 2 of a 4-block model, the tower on chunk 0).
TEST(VlmTrainingSlow, InterleavedPipelineEqualsTheOneRankRun) {
  expect_layouts_equal_one_rank(
      "vlm_vpp", 2, {{"pp2vpp2", {"--set", "parallel.pp=2", "--set", "parallel.vpp=2", "--set",
                                  "parallel.pp_schedule=\"interleaved\""}}},
      26, {"--set", "model.n_layer=4"});
}

// Four ranks: tp 2 + sp x pp 2 (the first stage's tp pair splits the encoder's blocks), and
// cp 2 x pp 2 (the first stage's cp pair each runs the encoder and writes its chunks' rows).
TEST(VlmTrainingSlow, PipelineTimesTensorAndContextParallelEqualTheOneRankRun) {
  expect_layouts_equal_one_rank(
      "vlm_pp4", 4,
      {{"tp2sppp2", {"--set", "parallel.pp=2", "--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true"}},
       {"cp2pp2", {"--set", "parallel.pp=2", "--set", "parallel.cp=2"}}},
      28, testing::with({"--set", "model.n_layer=2"}, kQuietKeyBias));
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

// Checkpoints across layouts: one rank to tp 2 and back (with sequence parallelism one way), one
// rank to dp 2 and back; with two blocks and seq_len 28, one rank to pp 2, pp 2 to cp 2 and cp 2
// to one rank (the encoder's tensors move between the first stage and every rank), with
// kQuietKeyBias (measured without it: blocks.1.attn.k.bias 1.004e-5 apart after cp2 -> one rank).
TEST(VlmTrainingSlow, CheckpointsResumeAcrossLayouts) {
  const std::vector<std::string> tp2 = {"--set", "parallel.tp=2"};
  const std::vector<std::string> tp2sp = testing::with(tp2, {"--set", "parallel.sequence_parallel=true"});
  expect_vlm_resumes_across_layouts("vlm_resume", {{"one_to_tp2", 1, {}, 2, tp2},
                                               {"tp2sp_to_one", 2, tp2sp, 1, {}},
                                               {"one_to_dp2", 1, {}, 2, {}},
                                               {"dp2_to_one", 2, {}, 1, {}}},
                                testing::with({"--set", "train.seq_len=26"}, kQuietKeyBias));
  const std::vector<std::string> pp2 = {"--set", "parallel.pp=2"}, cp2 = {"--set", "parallel.cp=2"};
  expect_vlm_resumes_across_layouts("vlm_resume_pp_cp",
                                {{"one_to_pp2", 1, {}, 2, pp2}, {"pp2_to_cp2", 2, pp2, 2, cp2}, {"cp2_to_one", 2, cp2, 1, {}}},
                                testing::with({"--set", "train.seq_len=28", "--set", "model.n_layer=2"}, kQuietKeyBias));
}

}  // namespace tessera
