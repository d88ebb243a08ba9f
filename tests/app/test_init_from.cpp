// checkpoint.init_from (docs/checkpoints.md, docs/multimodal.md): a fresh run's weights from
// another checkpoint's tensors. A text-only GPT's checkpoint started into a tiny VLM: every LLM
// tensor equals the file's bit for bit, the vision encoder and projector equal a fresh VLM's
// initialization (the independent oracle: the same config without init_from), the step and the
// moments start at zero; init_prefixes loads a subset; refusals (another shape, another preset or
// head split, prefixes that match nothing). The two-stage recipe on the scenes task: stage 1 trains
// the projector alone from the GPT's weights (every frozen tensor in its checkpoint is bit for bit
// what it started as), stage 2 starts from stage 1's file with the LLM unfrozen (or resumes it).
// InitFromSlow: the same start under `mpiexec -n 2` data parallelism, and a GPT into tp 2 and
// pp 2, equal the 1-rank run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/trainer.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "trainer_testing.h"
#include "vlm_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

// The VLM of tests/app/vlm_testing.h, 10 steps.
const std::string kTinyVlm = testing::tiny_vlm_toml(10, 2);

// Its language model alone, trained on text (the addition task) at the VLM's vocabulary size.
const std::vector<std::string> kTextGpt = {"model.kind=\"gpt\"", "data.task=\"addition\"", "model.vocab_size=15",
                                           "train.steps=3"};
// Every parameter of the language model (the VLM's names outside vision.* and projector.*).
const std::string kFreezeLlm = "train.freeze=[\"wte.*\", \"wpe.*\", \"blocks.*\", \"ln_f.*\"]";

Config config(const std::vector<std::string>& settings) {
  return parse_config_string(kTinyVlm, "tiny-vlm.toml", settings);
}

std::vector<float> tensor_of(const ParameterStore& ps, const std::string& name) {
  const Tensor t = ps.param(ps.find(name));
  return {t.ptr<float>(), t.ptr<float>() + t.numel()};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool is_vision_side(const std::string& name) {
  return name.rfind("vision.", 0) == 0 || name.rfind("projector.", 0) == 0;
}

// A text-only GPT trained 3 steps and saved: <dir>/gpt/checkpoints/step_00000003.h5.
std::string train_text_gpt(const fs::path& dir) {
  {
    Trainer gpt(config(kTextGpt), (dir / "gpt").string(), MPI_COMM_SELF);
    gpt.run();
  }
  const fs::path file = dir / "gpt" / "checkpoints" / "step_00000003.h5";
  EXPECT_TRUE(fs::exists(file));
  return file.string();
}

}  // namespace

TEST(InitFrom, TextGptIntoVlmLoadsTheLlmAndKeepsTheFreshEncoder) {
  testing::test_world();  // MPI for the checkpoint files
  const fs::path dir = testing::temp_dir("init_from");
  const std::string gpt = train_text_gpt(dir);
  const Trainer fresh(config({}), "", MPI_COMM_NULL);
  Trainer vlm(config({"checkpoint.init_from=\"" + gpt + "\""}), "", MPI_COMM_NULL);
  EXPECT_EQ(vlm.start_step(), 0);
  EXPECT_EQ(vlm.resumed_from(), "");
  const CheckpointReader file(gpt, MPI_COMM_SELF);
  int loaded = 0, kept = 0;
  for (const ParamEntry& e : vlm.params().entries()) {
    const std::string& name = e.spec.name;
    const std::vector<float> got = tensor_of(vlm.params(), name);
    if (is_vision_side(name)) {
      EXPECT_FALSE(file.has("/model/" + name)) << name;
      EXPECT_TRUE(bitwise_equal(got, tensor_of(fresh.params(), name))) << name << " is not the fresh initialization";
      ++kept;
    } else {
      ASSERT_TRUE(file.has("/model/" + name)) << name;
      EXPECT_TRUE(bitwise_equal(got, file.read_all("/model/" + name))) << name << " is not the file's";
      EXPECT_FALSE(bitwise_equal(got, tensor_of(fresh.params(), name))) << name << " kept its initialization";
      ++loaded;
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(kept, 0);
  // Every /model tensor of the GPT file went into the VLM: nothing of it is left behind.
  for (const TensorInfo& t : file.tensors())
    if (t.path.rfind("/model/", 0) == 0) {
      EXPECT_GE(vlm.params().find(t.path.substr(7)), 0) << t.path;
    }
  // Weights only: the moments start at zero, and the run trains from step 0.
  const FullOptimizerState m = vlm.optimizer().gather_state();
  for (int64_t i = 0; i < m.state.exp_avg.numel(); ++i) ASSERT_EQ(m.state.exp_avg.ptr<float>()[i], 0.0f);
  EXPECT_TRUE(std::isfinite(vlm.step(0).loss));

  // init_prefixes: the transformer blocks only; the embeddings keep their initialization.
  const Trainer blocks(config({"checkpoint.init_from=\"" + gpt + "\"", "checkpoint.init_prefixes=[\"blocks.\"]"}), "",
                       MPI_COMM_NULL);
  EXPECT_TRUE(bitwise_equal(tensor_of(blocks.params(), "blocks.0.attn.q.weight"),
                            file.read_all("/model/blocks.0.attn.q.weight")));
  EXPECT_TRUE(bitwise_equal(tensor_of(blocks.params(), "wte.weight"), tensor_of(fresh.params(), "wte.weight")));
  fs::remove_all(dir);
}

TEST(InitFrom, RefusesWhatDoesNotFit) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("init_from_refused");
  const std::string gpt = train_text_gpt(dir);
  const std::string from = "checkpoint.init_from=\"" + gpt + "\"";
  auto start = [&](std::vector<std::string> settings) {
    settings.push_back(from);
    Trainer t(config(settings), "", MPI_COMM_NULL);
  };
  // Another shape: every such tensor named, with both shapes.
  EXPECT_TRUE(testing::throws_with([&] { start({"model.ffn_hidden=64"}); },
                                   {gpt, "blocks.0.mlp.fc.weight is (128, 32) in the file, (64, 32) in this model",
                                    "checkpoint.init_prefixes"}));
  EXPECT_TRUE(testing::throws_with([&] { start({"model.vocab_size=20", "vision.placeholder_id=14"}); },
                                   {"wte.weight is (15, 32) in the file, (20, 32) in this model"}));
  // Another model whose shapes may agree: refused by its config.
  EXPECT_TRUE(testing::throws_with([&] { start({"model.preset=\"llama\""}); },
                                   {gpt, "holds another model's weights", "model.preset = gpt2 in the file, llama in this run"}));
  EXPECT_TRUE(testing::throws_with([&] { start({"model.n_head=4"}); }, {"model.n_head = 2 in the file, 4 in this run"}));
  EXPECT_TRUE(testing::throws_with([&] { start({"model.n_embd=64"}); }, {"model.n_embd = 32 in the file, 64 in this run"}));
  // An untied head would keep its initialization while wte loads: refused too.
  EXPECT_TRUE(testing::throws_with([&] { start({"model.lm_head=\"untied\""}); },
                                   {"model.lm_head = tied in the file, untied in this run"}));
  // Prefixes that select nothing.
  EXPECT_TRUE(testing::throws_with([&] { start({"checkpoint.init_prefixes=[\"nope.\"]"}); },
                                   {"checkpoint.init_prefixes = [\"nope.\"]", "matches no parameter of this model"}));
  EXPECT_TRUE(testing::throws_with([&] { start({"checkpoint.init_prefixes=[\"vision.\"]"}); },
                                   {"\"vision.\" matches no tensor of " + gpt + " (it holds blocks.0."}));
  // Config checks.
  EXPECT_TRUE(testing::throws_with([] { config({"checkpoint.init_prefixes=[\"blocks.\"]"}); },
                                   {"checkpoint.init_prefixes = [\"blocks.\"]", "checkpoint.init_from, which is not set"}));
  EXPECT_TRUE(testing::throws_with([&] { config({from, "checkpoint.resume=\"x.h5\""}); },
                                   {"checkpoint.init_from", "checkpoint.resume = \"x.h5\"", "set one of them"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { Trainer t(config({"checkpoint.init_from=\"" + (dir / "none.h5").string() + "\""}), "", MPI_COMM_NULL); },
      {"none.h5"}));
  fs::remove_all(dir);
}

// The two-stage recipe of docs/multimodal.md on the scenes task.
TEST(InitFrom, TwoStageRecipe) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("init_from_stages");
  const std::string gpt = train_text_gpt(dir);
  const Trainer fresh(config({}), "", MPI_COMM_NULL);
  // Stage 1: the GPT's weights, a fresh encoder; only the projector trains (the encoder frozen too).
  const std::vector<std::string> stage1 = {"checkpoint.init_from=\"" + gpt + "\"",
                                           "train.freeze=[\"wte.*\", \"wpe.*\", \"blocks.*\", \"ln_f.*\", \"vision.*\"]"};
  {
    Trainer t(config(stage1), (dir / "stage1").string(), MPI_COMM_SELF);
    EXPECT_EQ(t.start_step(), 0);
    for (const ParamEntry& e : t.params().entries())
      EXPECT_EQ(e.frozen, e.spec.name.rfind("projector.", 0) != 0) << e.spec.name;
    t.run();
  }
  const std::string s1 = (dir / "stage1" / "checkpoints" / "step_00000010.h5").string();
  {
    const CheckpointReader r(s1, MPI_COMM_SELF), g(gpt, MPI_COMM_SELF);
    for (const ParamEntry& e : fresh.params().entries()) {
      const std::string& name = e.spec.name;
      const std::vector<float> saved = r.read_all("/model/" + name);
      if (name.rfind("projector.", 0) == 0)
        EXPECT_FALSE(bitwise_equal(saved, tensor_of(fresh.params(), name))) << name << " did not train";
      else if (name.rfind("vision.", 0) == 0)
        EXPECT_TRUE(bitwise_equal(saved, tensor_of(fresh.params(), name))) << name << " changed while frozen";
      else
        EXPECT_TRUE(bitwise_equal(saved, g.read_all("/model/" + name))) << name << " changed while frozen";
      EXPECT_EQ(r.has("/optim/" + name + "/exp_avg"), name.rfind("projector.", 0) == 0) << name;
    }
  }
  // Stage 2: a new run from stage 1's weights, the LLM unfrozen (the encoder stays frozen).
  std::vector<double> losses;
  {
    Trainer t(config({"checkpoint.init_from=\"" + s1 + "\"", "train.freeze=[\"vision.*\"]"}), (dir / "stage2").string(),
              MPI_COMM_SELF);
    EXPECT_EQ(t.start_step(), 0);
    const CheckpointReader r(s1, MPI_COMM_SELF);
    for (const ParamEntry& e : t.params().entries())  // every tensor from stage 1
      EXPECT_TRUE(bitwise_equal(tensor_of(t.params(), e.spec.name), r.read_all("/model/" + e.spec.name))) << e.spec.name;
    for (int64_t s = 0; s < 10; ++s) losses.push_back(t.step(s).loss);
    EXPECT_FALSE(bitwise_equal(tensor_of(t.params(), "blocks.0.attn.q.weight"), r.read_all("/model/blocks.0.attn.q.weight")));
    EXPECT_TRUE(bitwise_equal(tensor_of(t.params(), "vision.patch.weight"), r.read_all("/model/vision.patch.weight")));
  }
  // Measured: 2.652 -> 2.278 in 10 steps.
  EXPECT_LT(losses.back(), 0.95 * losses.front()) << "stage 2 losses " << ::testing::PrintToString(losses);
  // Or stage 2 as a continuation of stage 1's run: resumed with the LLM unfrozen, from step 10.
  Trainer resumed(config({"checkpoint.resume=\"" + s1 + "\"", "train.freeze=[\"vision.*\"]", "train.steps=12"}),
                  (dir / "stage2b").string(), MPI_COMM_SELF);
  EXPECT_EQ(resumed.start_step(), 10);
  EXPECT_TRUE(std::isfinite(resumed.step(10).loss));
  fs::remove_all(dir);
}

// `mpiexec -n 2`: a VLM started from the GPT's file under data parallelism, and the GPT's file
// into a GPT under tensor and pipeline parallelism, each equal to its 1-rank run (losses and every tensor of
// the final checkpoint).
TEST(InitFromSlow, ParallelLayoutsEqualTheOneRankRun) {
  const fs::path dir = testing::temp_dir("init_from_layouts");
  std::ofstream(dir / "tiny-vlm.toml") << kTinyVlm;
  std::vector<std::string> gpt_settings;
  for (const std::string& s : kTextGpt)
    if (s.rfind("train.steps", 0) != 0) gpt_settings.insert(gpt_settings.end(), {"--set", s});
  auto r = testing::train_run(dir, "tiny-vlm.toml", "gpt", 1, testing::with(gpt_settings, {"--set", "train.steps=3"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string gpt = (dir / "gpt" / "checkpoints" / "step_00000003.h5").string();
  const std::vector<std::string> vlm = {"--set", "train.steps=4", "--set", "train.micro_batch=2", "--set",
                                        "checkpoint.init_from=\"" + gpt + "\""};
  r = testing::train_run(dir, "tiny-vlm.toml", "vlm1", 1, vlm);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("initialized from " + gpt), std::string::npos) << r.output;
  r = testing::train_run(dir, "tiny-vlm.toml", "vlm_dp2", 2, vlm);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp 1 x dp 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("initialized from " + gpt), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "vlm_dp2" / "metrics.jsonl"),
                              testing::losses(dir / "vlm1" / "metrics.jsonl"), 1e-5, "dp2");
  testing::expect_checkpoints_near(dir / "vlm_dp2" / "checkpoints" / "step_00000004.h5",
                                   dir / "vlm1" / "checkpoints" / "step_00000004.h5", 1e-5, "dp2");
  // tp 2 reads its shards of the stored tensors.
  const std::vector<std::string> gpt2 = testing::with(
      gpt_settings, {"--set", "train.steps=4", "--set", "checkpoint.init_from=\"" + gpt + "\"", "--set", "train.seed=7"});
  r = testing::train_run(dir, "tiny-vlm.toml", "gpt1", 1, gpt2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny-vlm.toml", "gpt_tp2", 2, testing::with(gpt2, {"--set", "parallel.tp=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp 2 x dp 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(weights only, step 0): 20 tensors loaded"), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "gpt_tp2" / "metrics.jsonl"),
                              testing::losses(dir / "gpt1" / "metrics.jsonl"), 1e-5, "tp2");
  testing::expect_checkpoints_near(dir / "gpt_tp2" / "checkpoints" / "step_00000004.h5",
                                   dir / "gpt1" / "checkpoints" / "step_00000004.h5", 1e-5, "tp2");
  // pp 2 (two layers: the file's one block fills blocks.0, blocks.1 keeps its initialization; the
  // last stage's copy of the tied wte.weight is read from the same stored tensor).
  const std::vector<std::string> deeper = testing::with(gpt2, {"--set", "model.n_layer=2"});
  r = testing::train_run(dir, "tiny-vlm.toml", "gpt1_deeper", 1, deeper);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kept their initialization (blocks.1."), std::string::npos) << r.output;
  r = testing::train_run(dir, "tiny-vlm.toml", "gpt_pp2", 2, testing::with(deeper, {"--set", "parallel.pp=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pp 2"), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "gpt_pp2" / "metrics.jsonl"),
                              testing::losses(dir / "gpt1_deeper" / "metrics.jsonl"), 1e-5, "pp2");
  testing::expect_checkpoints_near(dir / "gpt_pp2" / "checkpoints" / "step_00000004.h5",
                                   dir / "gpt1_deeper" / "checkpoints" / "step_00000004.h5", 1e-5, "pp2");
  fs::remove_all(dir);
}

}  // namespace tessera
