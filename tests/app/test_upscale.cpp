// Tests `tessera upscale` (app/upscale.h) through the binary, on checkpoints of tiny GPT-2 and LLaMA
// models written from a real ParameterStore: the grown file's tensors against their sources bit for
// bit, its metadata (step, data position, fresh or carried moments, the /upscale record, the stored
// config's depth), `ckpt inspect` showing the record, an expanded checkpoint computing the source's
// loss, and the refusals. UpscaleResumeSlow: a grown checkpoint resumed under dp 2 x tp 2 (mpiexec
// -n 4) equals the 1-rank continuation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/config.h"
#include "app/upscale.h"
#include "kernels/allocator.h"
#include "layout_testing.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "mpi_testing.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

namespace fs = std::filesystem;

// This process alone (MPI initialized once for the binary).
MPI_Comm self() {
  testing::test_world();
  return MPI_COMM_SELF;
}

std::string tiny_toml(const std::string& preset, int64_t layers) {
  Config c = parse_config_string(testing::layout_config(preset), "tiny.toml",
                                 {"model.n_layer=" + std::to_string(layers), "model.vocab_size=14"});
  return to_toml(c);
}

// A source checkpoint: every parameter and moment distinct, so a misplaced tensor shows.
struct Source {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  fs::path file;
  Source(const std::string& preset, int64_t layers, const fs::path& dir, bool moments = true)
      : ps(alloc, DType::F32),
        gpt(to_model_config(parse_config_string(tiny_toml(preset, layers), "tiny.toml"), 14), ps),
        file(dir / "source.h5") {
    ps.finalize();
    ps.initialize(kCpu, 1234);
    float* p = ps.flat_params().ptr<float>();
    for (int64_t i = 0; i < ps.numel(); ++i) p[i] += 0.001f * static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    CheckpointMeta meta;
    meta.step = 40;
    meta.tokens_seen = 7680;
    meta.consumed_samples = 320;
    meta.config_toml = tiny_toml(preset, layers);
    meta.extra["run_id"] = std::string("20260101T000000Z-0000000000000001");
    GroupAttributes groups{{"/optim", {{"step", int64_t{40}}}}, {"/data", {{"consumed_samples", int64_t{320}}}},
                           {"/rng", {{"train_seed", int64_t{1337}}}}};
    std::vector<TensorSlice> slices;
    for (const ParamEntry& e : ps.entries()) {
      const float* x = ps.param(ps.find(e.spec.name)).ptr<float>();
      slices.push_back({"/model/" + e.spec.name, e.spec.global_shape, TensorSlice::kWhole, 0, e.spec.global_shape, x});
      if (!moments) continue;
      for (const std::string kind : {"exp_avg", "exp_avg_sq"}) {
        auto& m = moment_data_.emplace_back(x, x + e.spec.global_shape.numel());
        for (float& v : m) v = kind == "exp_avg" ? 0.5f * v : v * v + 1e-3f;
        slices.push_back({"/optim/" + e.spec.name + "/" + kind, e.spec.global_shape, TensorSlice::kWhole, 0,
                          e.spec.global_shape, m.data()});
      }
    }
    write_checkpoint_file(file.string(), meta, slices, self(), groups);
  }
  std::vector<std::vector<float>> moment_data_;
};

// Mean loss of a fixed batch through the model whose tensors are read from `file` by name.
double loss_of(const fs::path& file) {
  CheckpointReader r(file.string(), self());
  const Config c = parse_config_string(r.meta().config_toml, file.string());
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt(to_model_config(c, 14), ps);
  ps.finalize();
  for (const ParamEntry& e : ps.entries()) {
    const auto v = r.read_all("/model/" + e.spec.name);
    std::copy(v.begin(), v.end(), ps.param(ps.find(e.spec.name)).ptr<float>());
  }
  auto tokens = testing::random_ids({2, 8}, 14, 1);
  auto targets = testing::random_ids({2, 8}, 14, 2);
  GptCtx ctx;
  gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t());
  return read_loss_sums(kCpu, ctx.loss_sums).mean();
}

std::string block(int64_t l, const std::string& suffix) { return "blocks." + std::to_string(l) + "." + suffix; }

int64_t int_of(const GroupAttributes& g, const std::string& group, const std::string& key) {
  return std::get<int64_t>(g.at(group).at(key));
}
std::string str_of(const GroupAttributes& g, const std::string& group, const std::string& key) {
  return std::get<std::string>(g.at(group).at(key));
}

}  // namespace

class UpscaleCommand : public ::testing::TestWithParam<std::string> {};

TEST_P(UpscaleCommand, SolarCopiesLayersAndCarriesThePosition) {
  const fs::path dir = testing::temp_dir("upscale_solar_" + GetParam());
  const Source src(GetParam(), 6, dir);
  const fs::path out = dir / "grown.h5";
  auto r = testing::run_tessera({"upscale", "--from", src.file.string(), "--method", "solar", "--out", out.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("by solar to 8 layers: 0 1 2 3 2 3 4 5"), std::string::npos) << r.output;

  CheckpointReader g(out.string(), self()), s(src.file.string(), self());
  const int64_t from[8] = {0, 1, 2, 3, 2, 3, 4, 5};
  int64_t model_tensors = 0;
  for (const TensorInfo& t : g.tensors()) {
    if (t.path.rfind("/model/", 0) == 0) {
      ++model_tensors;
      const auto [layer, suffix] = split_block_name(t.path.substr(7));
      const std::string want = layer < 0 ? t.path : "/model/" + block(from[layer], suffix);
      EXPECT_EQ(g.read_all(t.path), s.read_all(want)) << t.path;
    } else {  // fresh moments
      const auto m = g.read_all(t.path);
      EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](float x) { return x == 0.0f; })) << t.path;
    }
  }
  const int64_t per_block = GetParam() == "gpt2" ? 16 : 9, outside = GetParam() == "gpt2" ? 4 : 3;
  EXPECT_EQ(model_tensors, 8 * per_block + outside);
  EXPECT_EQ(static_cast<int64_t>(g.tensors().size()), 3 * model_tensors);
  EXPECT_EQ(g.meta().step, 40);
  EXPECT_EQ(g.meta().consumed_samples, 320);
  EXPECT_EQ(g.meta().tokens_seen, 7680);
  EXPECT_NE(std::get<std::string>(g.meta().extra.at("run_id")), "20260101T000000Z-0000000000000001");
  const GroupAttributes& ga = g.group_attributes();
  EXPECT_EQ(int_of(ga, "/optim", "step"), 0);
  EXPECT_EQ(int_of(ga, "/data", "consumed_samples"), 320);
  EXPECT_EQ(int_of(ga, "/rng", "train_seed"), 1337);
  EXPECT_EQ(str_of(ga, "/upscale", "method"), "solar");
  EXPECT_EQ(str_of(ga, "/upscale", "mapping"), "0 1 2 3 2 3 4 5");
  EXPECT_EQ(str_of(ga, "/upscale", "source_file"), src.file.string());
  EXPECT_EQ(int_of(ga, "/upscale", "source_step"), 40);
  EXPECT_EQ(int_of(ga, "/upscale", "source_layers"), 6);
  EXPECT_EQ(int_of(ga, "/upscale", "layers"), 8);
  const Config stored = parse_config_string(g.meta().config_toml, "stored");
  EXPECT_EQ(stored.model.n_layer, 8);
  EXPECT_EQ(stored.model.preset, GetParam());

  r = testing::run_tessera({"ckpt", "inspect", out.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("/upscale mapping  \"0 1 2 3 2 3 4 5\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/upscale method   \"solar\""), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST_P(UpscaleCommand, ExpandKeepsTheLossAndCarriesTheOptimizer) {
  const fs::path dir = testing::temp_dir("upscale_expand_" + GetParam());
  const Source src(GetParam(), 4, dir);
  const fs::path out = dir / "grown.h5";
  auto r = testing::run_tessera({"upscale", "--from", src.file.string(), "--method", "expand", "--every", "2",
                                 "--carry-optimizer", "--out", out.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 0 1 expand(1) 2 3 expand(3): the grown model computes the source's loss (fp32 rounding).
  const double want = loss_of(src.file);
  EXPECT_NEAR(loss_of(out), want, 1e-6 * want);
  CheckpointReader g(out.string(), self()), s(src.file.string(), self());
  EXPECT_EQ(int_of(g.group_attributes(), "/optim", "step"), 40);
  const std::string proj = GetParam() == "gpt2" ? "mlp.proj.weight" : "mlp.down.weight";
  EXPECT_EQ(g.read_all("/optim/" + block(2, "attn.q.weight") + "/exp_avg"), s.read_all("/optim/" + block(1, "attn.q.weight") + "/exp_avg"));
  EXPECT_EQ(g.read_all("/optim/" + block(4, proj) + "/exp_avg_sq"), s.read_all("/optim/" + block(3, proj) + "/exp_avg_sq"));
  for (const std::string& name : {"/model/" + block(2, proj), "/optim/" + block(5, proj) + "/exp_avg_sq"}) {
    const auto z = g.read_all(name);
    EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](float x) { return x == 0.0f; })) << name;
  }
  EXPECT_EQ(g.read_all("/optim/wte.weight/exp_avg"), s.read_all("/optim/wte.weight/exp_avg"));
  EXPECT_EQ(str_of(g.group_attributes(), "/upscale", "options"), "--every 2 --carry-optimizer");
  fs::remove_all(dir);
}

TEST_P(UpscaleCommand, OtWritesAFusedModel) {
  const fs::path dir = testing::temp_dir("upscale_ot_" + GetParam());
  const Source src(GetParam(), 3, dir);
  const fs::path out = dir / "grown.h5";
  auto r = testing::run_tessera({"upscale", "--from", src.file.string(), "--method", "ot", "--layers", "4",
                                 "--position", "top", "--sinkhorn-eps", "0.05", "--out", out.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  CheckpointReader g(out.string(), self());
  EXPECT_EQ(str_of(g.group_attributes(), "/upscale", "mapping"), "0 1 ot(1,2) 2");
  EXPECT_TRUE(std::isfinite(loss_of(out)));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, UpscaleCommand, ::testing::Values("gpt2", "llama"));

TEST(UpscaleCommand, RefusesBadRequests) {
  const fs::path dir = testing::temp_dir("upscale_refuse");
  const Source src("gpt2", 6, dir);
  const fs::path out = dir / "grown.h5";
  auto refused = [&](std::vector<std::string> args, const std::string& message) {
    std::vector<std::string> a = {"upscale", "--from", src.file.string(), "--out", out.string()};
    a.insert(a.end(), args.begin(), args.end());
    const auto r = testing::run_tessera(a, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << message;
  };
  refused({"--method", "deepen"}, "upscale: unknown method \"deepen\"; the methods are solar, stack");
  refused({"--method", "interleave", "--layers", "13"}, "interleave can give at most 12 layers from 6");
  refused({"--method", "solar", "--layers", "13"}, "solar gives an even number of layers");
  refused({"--method", "stack", "--overlap", "2"}, "--overlap does not apply to --method stack");
  refused({"--method", "average", "--sinkhorn-eps", "0.1"}, "--sinkhorn-eps does not apply to --method average");
  refused({"--method", "expand", "--every", "2", "--position", "top"}, "--position top needs --layers");
  const Source bare("gpt2", 6, dir / "..", false);  // no moments
  {
    const auto r = testing::run_tessera({"upscale", "--from", bare.file.string(), "--method", "stack",
                                         "--carry-optimizer", "--out", out.string()}, dir);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("holds no optimizer moments"), std::string::npos) << r.output;
    fs::remove(bare.file);
  }
  std::ofstream(out) << "x";
  auto r = testing::run_tessera({"upscale", "--from", src.file.string(), "--method", "stack", "--out", out.string()}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(out.string()), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_file(out), "x");  // never written through
  fs::remove(out);

  // A grown gpt2 checkpoint does not resume as llama: the shapes are listed, nothing is trained.
  r = testing::run_tessera({"upscale", "--from", src.file.string(), "--method", "stack", "--out", out.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(dir / "llama.toml") << testing::layout_config("llama");
  r = testing::run_tessera({"train", (dir / "llama.toml").string(), "--run-dir", (dir / "run").string(), "--set",
                            "model.n_layer=12", "--set", "checkpoint.resume=" + out.string()}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("does not match the model"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// The grown checkpoint of a 1-rank run resumed on 1 rank and on dp 2 x tp 2: the same losses and
// final state up to the order of the sums (fp32; 1e-5 as the other cross-layout runs). gpt2 grows
// by solar with fresh moments, llama (grouped-query attention, split over tp) by ot with its moments
// carried. (With fresh moments AdamW's first update is about lr * sign(g) per element, which makes
// near-zero gradients' reduction-order noise visible: llama's fused layer then differed by 1.1e-5.)
TEST(UpscaleResumeSlow, DpTwoTpTwoEqualsTheOneRankContinuation) {
  struct Case {
    std::string preset, method;
    bool carry;
  };
  for (const auto& [preset, method, carry] : {Case{"gpt2", "solar", false}, Case{"llama", "ot", true}}) {
    const fs::path dir = testing::temp_dir("upscale_resume_" + preset);
    std::ofstream(dir / "tiny.toml") << testing::layout_config(preset);
    const std::vector<std::string> small = {"--set", "model.n_layer=3", "--set", "train.global_batch=8", "--set",
                                            "train.micro_batch=2", "--set", "log.every=1"};
    auto r = testing::train_run(dir, "tiny.toml", "small", 1, testing::with(small, {"--set", "train.steps=3"}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const fs::path grown = dir / "grown.h5";
    std::vector<std::string> grow = {"upscale", "--from", (dir / "small" / "checkpoints" / "step_00000003.h5").string(),
                                     "--method", method, "--layers", "4", "--out", grown.string()};
    if (carry) grow.push_back("--carry-optimizer");
    r = testing::run_tessera(grow, dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> deep = {"--set", "model.n_layer=4", "--set", "train.global_batch=8", "--set",
                                           "train.micro_batch=2", "--set", "log.every=1", "--set", "train.steps=6",
                                           "--set", "checkpoint.resume=" + grown.string()};
    r = testing::train_run(dir, "tiny.toml", "one", 1, deep);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("at step 3"), std::string::npos) << r.output;
    r = testing::train_run(dir, "tiny.toml", "dp2tp2", 4, testing::with(deep, {"--set", "parallel.tp=2"}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto want = testing::losses(dir / "one" / "metrics.jsonl");
    ASSERT_EQ(want.size(), 3u) << preset;
    testing::expect_losses_near(testing::losses(dir / "dp2tp2" / "metrics.jsonl"), want, 1e-5, preset);
    testing::expect_checkpoints_near(dir / "dp2tp2" / "checkpoints" / "step_00000006.h5",
                                     dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, preset);
    fs::remove_all(dir);
  }
}

}  // namespace tessera
