// In-run growth ([upscale] method, at_step: app/trainer.cpp Trainer::grow) against the offline path
// (train N steps and save, `tessera upscale`, resume the grown file): the same final checkpoint bit
// for bit on one rank, and on dp 2, tp 2 and pp 2 against the same layout's offline path
// (UpscaleInRunLayouts, mpiexec -n 2); the
// metrics mark the growth; [upscale] rewarm_steps restarts the learning rate at the growth step,
// in the run that grows and in a run resumed from a grown file; train.freeze = "original" after an
// in-run expand keeps the carried-over tensors and gives them no moments; upscale.align_data (ot)
// equals --align-data, and is refused for other methods.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "app/checkpoint/checkpoint_io.h"
#include "app/trainer.h"
#include "app/upscale.h"
#include "app/checkpoint/hf_export.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The tiny GPT-2 of the layout tests (2 layers, 4 heads), 6 steps of 4 micro-batches, every step
// recorded; growth after step 3.
const std::vector<std::string> kBase = {"train.steps=6", "train.global_batch=8", "train.micro_batch=2", "log.every=1",
                                        "checkpoint.at_end=true"};

Config config(const std::vector<std::string>& sets) {
  return parse_config_string(testing::layout_config("gpt2"), "grow.toml", sets);
}

void run(const std::vector<std::string>& sets, const fs::path& dir, MPI_Comm comm) {
  Trainer t(config(sets), dir.string(), comm);
  t.run();
}

// The [upscale] settings of a method, and the same as `tessera upscale` options.
struct Growth {
  std::string name;
  std::vector<std::string> sets;  // upscale.* besides method and at_step
  UpscaleOptions options;
  int64_t layers;
};

const std::vector<Growth> kGrowths = {
    {"expand", {}, {.method = "expand"}, 4},
    {"ot", {"upscale.layers=3"}, {.method = "ot", .layers = 3}, 3},
    {"solar", {"upscale.overlap=0", "upscale.carry_optimizer=true"}, {.method = "solar", .overlap = 0}, 4},
    // ot aligned by activations on 2 micro-batches of the validation data, as --align-data
    // --align-batches 2: the same batches in both paths, and the in-run run's own data position
    // unmoved (its later steps read what the resumed offline run reads).
    {"ot_align", {"upscale.layers=3", "upscale.align_data=2"},
     {.method = "ot", .layers = 3, .align_data = true, .align_batches = 2}, 3},
};

std::vector<std::string> in_run(const Growth& g) {
  return std::vector<std::string>{"upscale.method=\"" + g.options.method + "\"", "upscale.at_step=3"} + g.sets;
}

// The offline path: 3 steps saved, grown by `tessera upscale` (on world rank 0), resumed for 3 more
// under `layout` settings (both runs) and `resumed` ones (the grown run), on the ranks of comm
// (MPI_COMM_SELF: one process). Returns the final checkpoint.
fs::path offline(const Growth& g, const fs::path& dir, const std::vector<std::string>& layout = {},
                 MPI_Comm comm = MPI_COMM_SELF, const std::vector<std::string>& resumed = {}) {
  const std::vector<std::string>& extra = layout;
  run(kBase + extra + std::vector<std::string>{"train.exit_after_steps=3"}, dir / "source", comm);
  UpscaleArgs args;
  args.from = (dir / "source" / "checkpoints" / "step_00000003.h5").string();
  args.out = (dir / (g.name + "_grown.h5")).string();
  args.options = g.options;
  args.carry_optimizer = std::find(g.sets.begin(), g.sets.end(), "upscale.carry_optimizer=true") != g.sets.end();
  std::string error;
  if (comm_rank(comm) == 0) {
    error = testing::error_of([&] {
      std::ostringstream out;
      run_upscale_command(args, out);
    });
  }
  throw_if_any_failed(comm, error);
  run(kBase + extra + resumed +
          std::vector<std::string>{"model.n_layer=" + std::to_string(g.layers), "checkpoint.resume=" + args.out},
      dir / "offline", comm);
  return dir / "offline" / "checkpoints" / "step_00000006.h5";
}

// Every tensor and the /optim step of two files, bit for bit.
void expect_files_equal(const fs::path& got, const fs::path& want, const std::string& what) {
  CheckpointReader a(got.string(), MPI_COMM_SELF), b(want.string(), MPI_COMM_SELF);
  ASSERT_EQ(a.tensors().size(), b.tensors().size()) << what;
  for (const TensorInfo& t : b.tensors()) {
    ASSERT_TRUE(a.has(t.path)) << what << ": " << t.path;
    const std::vector<float> x = a.read_all(t.path), y = b.read_all(t.path);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << what << ": " << t.path;
  }
  EXPECT_EQ(std::get<int64_t>(a.group_attributes().at("/optim").at("step")),
            std::get<int64_t>(b.group_attributes().at("/optim").at("step")))
      << what;
}

// metrics.jsonl's records of training steps: step -> value of `key`.
std::map<int64_t, double> by_step(const fs::path& metrics, const std::string& key) {
  std::map<int64_t, double> out;
  std::istringstream in(testing::read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto s = line.find("\"step\": "), k = line.find("\"" + key + "\": ");
    if (s != std::string::npos && k != std::string::npos && line.find("\"loss\"") != std::string::npos)
      out[std::stoll(line.substr(s + 8))] = std::stod(line.substr(k + key.size() + 4));
  }
  return out;
}

TEST(UpscaleInRun, EqualsTheOfflinePathBitForBit) {
  testing::test_world();
  std::map<std::string, std::vector<float>> fused;  // the fused layer's MLP weights at the end, ot and ot_align
  for (const Growth& g : kGrowths) {
    const fs::path dir = testing::temp_dir("grow_" + g.name);
    run(kBase + in_run(g), dir / "inrun", MPI_COMM_SELF);
    const fs::path want = offline(g, dir);
    expect_files_equal(dir / "inrun" / "checkpoints" / "step_00000006.h5", want, g.name);
    // The losses after the growth too, and the growth is marked at step 3.
    const auto a = by_step(dir / "inrun" / "metrics.jsonl", "loss"), b = by_step(dir / "offline" / "metrics.jsonl", "loss");
    for (int64_t s = 4; s <= 6; ++s) EXPECT_EQ(a.at(s), b.at(s)) << g.name << " step " << s;
    const std::string metrics = testing::read_file(dir / "inrun" / "metrics.jsonl");
    EXPECT_NE(metrics.find("{\"step\": 3, \"event\": \"upscale\", \"method\": \"" + g.options.method + "\""),
              std::string::npos)
        << metrics;
    CheckpointReader r((dir / "inrun" / "checkpoints" / "step_00000006.h5").string(), MPI_COMM_SELF);
    EXPECT_EQ(std::get<int64_t>(r.group_attributes().at("/upscale").at("source_step")), 3);
    EXPECT_EQ(model_config_of(r).n_layer, g.layers) << g.name;
    if (g.options.method == "ot") fused[g.name] = r.read_all("/model/blocks.1.mlp.fc.weight");
    fs::remove_all(dir);
  }
  // The activations aligned the units otherwise than the weights did.
  EXPECT_NE(fused.at("ot"), fused.at("ot_align"));
}

// rewarm_steps = 2 from the growth at step 3 of 10: steps 4, 5 warm up to optim.lr, then the cosine
// over the 4 steps left reaches min_lr at step 10; the same in a run resumed from the offline file.
TEST(UpscaleInRun, RewarmRestartsTheScheduleAtTheGrowth) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("grow_rewarm");
  const std::vector<std::string> sets = {"train.steps=10", "optim.lr=0.01", "optim.min_lr=0.001", "optim.warmup_steps=2",
                                         "upscale.rewarm_steps=2"};
  run(kBase + sets + in_run(kGrowths[0]), dir / "inrun", MPI_COMM_SELF);
  // metrics step k is 0-based step k - 1.
  const std::map<int64_t, double> want = {{1, 0.005}, {2, 0.01}, {4, 0.005}, {5, 0.01}, {6, 0.01},
                                          {8, 0.001 + 0.5 * 0.009 * (1 + std::cos(M_PI * 0.5))}, {10, 0.001}};
  const auto got = by_step(dir / "inrun" / "metrics.jsonl", "lr");
  for (const auto& [step, lr] : want) EXPECT_NEAR(got.at(step), lr, 1e-12) << "in-run, step " << step;
  // Before the growth, the original schedule (warm-up 2, then the cosine over 8 steps): step 3 is
  // its peak; without the restart step 4 would be 0.001 + 0.0045 (1 + cos(pi / 7)).
  EXPECT_NEAR(got.at(3), 0.01, 1e-12);
  // Resumed from the offline grown file: the record's source step is the growth step.
  run(kBase + sets + std::vector<std::string>{"train.exit_after_steps=3"}, dir / "source", MPI_COMM_SELF);
  UpscaleArgs args;
  args.from = (dir / "source" / "checkpoints" / "step_00000003.h5").string();
  args.out = (dir / "grown.h5").string();
  args.options = kGrowths[0].options;
  std::ostringstream out;
  run_upscale_command(args, out);
  run(kBase + sets + std::vector<std::string>{"model.n_layer=4", "checkpoint.resume=" + args.out}, dir / "resumed",
      MPI_COMM_SELF);
  const auto resumed = by_step(dir / "resumed" / "metrics.jsonl", "lr");
  for (const auto& [step, lr] : want)
    if (step > 3) {
      EXPECT_NEAR(resumed.at(step), lr, 1e-12) << "resumed, step " << step;
    }
  fs::remove_all(dir);
}

// train.freeze = "original" with an in-run expand: the carried-over tensors (layers 0 and 2 of
// "0 expand(0) 1 expand(1)", the embeddings, the final norm) are the source's after three more
// steps, have no moments, and the run equals the offline path with the same freeze bit for bit.
TEST(UpscaleInRun, FreezeOriginalTrainsOnlyTheNewLayers) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("grow_freeze");
  const std::vector<std::string> freeze = {"train.freeze=[\"original\"]"};
  run(kBase + freeze + in_run(kGrowths[0]), dir / "inrun", MPI_COMM_SELF);
  const fs::path want = offline(kGrowths[0], dir, {}, MPI_COMM_SELF, freeze);
  const fs::path got = dir / "inrun" / "checkpoints" / "step_00000006.h5";
  expect_files_equal(got, want, "freeze original");
  CheckpointReader r(got.string(), MPI_COMM_SELF),
      src((dir / "source" / "checkpoints" / "step_00000003.h5").string(), MPI_COMM_SELF);
  for (const auto& [grown, source] : std::vector<std::pair<std::string, std::string>>{
           {"blocks.0.attn.q.weight", "blocks.0.attn.q.weight"}, {"blocks.2.mlp.fc.weight", "blocks.1.mlp.fc.weight"},
           {"wte.weight", "wte.weight"}, {"ln_f.weight", "ln_f.weight"}}) {
    if (!r.has("/model/" + grown)) continue;  // names differ by preset: checked below that some were
    EXPECT_EQ(r.read_all("/model/" + grown), src.read_all("/model/" + source)) << grown;
    EXPECT_FALSE(r.has("/optim/" + grown + "/exp_avg")) << grown;
  }
  EXPECT_TRUE(r.has("/model/blocks.2.mlp.fc.weight"));
  EXPECT_TRUE(r.has("/optim/blocks.1.mlp.fc.weight/exp_avg"));   // expand(0): trained
  EXPECT_NE(r.read_all("/model/blocks.1.mlp.proj.weight"),         // was zero at the growth
            std::vector<float>(r.read_all("/model/blocks.1.mlp.proj.weight").size(), 0.0f));
  fs::remove_all(dir);
}

// tessera upscale --method ot --align-data on a checkpoint of the addition task: the units aligned by
// their activations on the stored config's data (the oracle, a permuted copy recovered, is
// tests/model/test_upscale.cpp ActivationCostsRecoverAPermutation); the record names the option and
// the grown file resumes.
TEST(UpscaleInRun, OtAlignDataGrowsFromTheStoredConfigsData) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("grow_align");
  run(kBase + std::vector<std::string>{"train.exit_after_steps=3"}, dir / "source", MPI_COMM_SELF);
  UpscaleArgs args;
  args.from = (dir / "source" / "checkpoints" / "step_00000003.h5").string();
  args.out = (dir / "grown.h5").string();
  args.options = {.method = "ot", .align_data = true, .align_batches = 2};
  std::ostringstream out;
  ASSERT_EQ(run_upscale_command(args, out), 0);
  CheckpointReader r(args.out, MPI_COMM_SELF);
  EXPECT_EQ(std::get<std::string>(r.group_attributes().at("/upscale").at("options")), "--align-data --align-batches 2");
  EXPECT_EQ(std::get<std::string>(r.group_attributes().at("/upscale").at("mapping")), "0 ot(0,1) 1");
  for (float x : r.read_all("/model/blocks.1.mlp.fc.weight")) ASSERT_TRUE(std::isfinite(x));
  run(kBase + std::vector<std::string>{"model.n_layer=3", "checkpoint.resume=" + args.out}, dir / "resumed", MPI_COMM_SELF);
  EXPECT_EQ(testing::losses(dir / "resumed" / "metrics.jsonl").size(), 3u);
  fs::remove_all(dir);
}

// upscale.align_data is ot's alone: another method, or none, is refused naming the key.
TEST(UpscaleInRun, AlignDataIsRefusedForOtherMethods) {
  for (const std::string method : {"expand", "average", "solar"})
    EXPECT_TRUE(testing::throws_with(
        [&] { config(kBase + std::vector<std::string>{"upscale.method=\"" + method + "\"", "upscale.at_step=3",
                                                      "upscale.align_data=2"}); },
        {"upscale.align_data = 2", "only upscale.method = \"ot\"", "upscale.method = \"" + method + "\""}))
        << method;
  EXPECT_TRUE(testing::throws_with([&] { config(kBase + std::vector<std::string>{"upscale.align_data=2"}); },
                                   {"upscale.align_data = 2", "upscale.method = \"\""}));
}

// [upscale] tp, pp, dp keep the ranks the run has: another count is refused naming the keys and
// sizes; without upscale.method they mean nothing and are refused too.
TEST(UpscaleInRun, AnotherLayoutKeepsTheWorldSize) {
  testing::test_world();
  EXPECT_TRUE(testing::throws_with(
      [&] { Trainer t(config(kBase + in_run(kGrowths[0]) + std::vector<std::string>{"upscale.tp=2"}), "", MPI_COMM_NULL); },
      {"the layout after the growth (upscale.tp = 2 x upscale.pp = 1 (parallel.pp) x parallel.cp = 1)",
       "needs a multiple of 2 ranks, but the run has 1"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { Trainer t(config(kBase + in_run(kGrowths[0]) + std::vector<std::string>{"upscale.dp=3"}), "", MPI_COMM_NULL); },
      {"upscale.dp = 3", "needs 3 ranks, but the run has 1"}));
  EXPECT_TRUE(testing::throws_with([&] { config(kBase + std::vector<std::string>{"upscale.tp=2"}); },
                                   {"upscale.tp = 2", "needs upscale.method"}));
}

// mpiexec -n 2: in-run growth on dp 2, tp 2 and pp 2 (the stages cut again for the new depth)
// equals the offline path on the same layout bit
// for bit (gathering, mapping and re-sharding lose nothing), and the offline path on one rank to
// 1e-4 of each family's largest value. Not 1e-5 as for the layouts without growth: the first AdamW
// step after the growth starts from fresh moments, where an element's update is about
// lr g / |g|, so the reduction-order rounding of a small gradient (measured 4e-5 on ot's tp 2 k
// and v weights) reaches the parameter undamped. Label slow: 3 s on two idle cores, a minute on busy ones.
TEST(UpscaleInRunLayouts, DataAndTensorParallelEqualTheOfflinePath) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  ASSERT_EQ(world.size(), 2);
  const std::string dir =
      broadcast_bytes(world.comm(), world.rank() == 0 ? testing::temp_dir("grow_layouts").string() : "", 0);
  for (const Growth& g : {kGrowths[0], kGrowths[1]}) {
    std::string error;
    if (world.rank() == 0) error = testing::error_of([&] { offline(g, fs::path(dir) / g.name / "one"); });
    throw_if_any_failed(world.comm(), error);
    const fs::path one = fs::path(dir) / g.name / "one";
    for (const std::string& layout : {std::string("dp2"), std::string("tp2"), std::string("pp2")}) {
      const std::vector<std::string> sets = layout == "tp2"   ? std::vector<std::string>{"parallel.tp=2"}
                                            : layout == "pp2" ? std::vector<std::string>{"parallel.pp=2"}
                                                              : std::vector<std::string>{};
      MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
      const fs::path run_dir = fs::path(dir) / g.name / layout;
      run(kBase + sets + in_run(g), run_dir / "inrun", comm.comm());
      const fs::path same = offline(g, run_dir, sets, comm.comm());
      MPI_Barrier(world.comm());
      const std::string what = g.name + " " + layout;
      expect_files_equal(run_dir / "inrun" / "checkpoints" / "step_00000006.h5", same, what + " vs offline " + layout);
      testing::expect_checkpoints_near(run_dir / "inrun" / "checkpoints" / "step_00000006.h5",
                                       one / "offline" / "checkpoints" / "step_00000006.h5", 1e-4, what + " vs 1 rank");
      const std::vector<double> got = testing::losses(run_dir / "inrun" / "metrics.jsonl");
      ASSERT_EQ(got.size(), 6u) << what;
      testing::expect_losses_near({got.begin() + 3, got.end()}, testing::losses(one / "offline" / "metrics.jsonl"), 1e-5,
                                  what);
    }
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) fs::remove_all(dir);
}

// mpiexec -n 2: growing into another layout inside the run ([upscale] tp, pp, dp: the global tensors
// gathered, the grid and its communicators made again, the grown model cut and sharded for the new
// layout) equals the path through a checkpoint (3 steps on the first layout and save, `tessera
// upscale`, resume on the second) bit for bit: both run the same operations in the same order on
// each layout, and a checkpoint holds global tensors as the gather does. dp 2 -> tp 2, pp 2 -> dp 2,
// tp 2 -> pp 2 (ot with align_data once, and solar with carried moments once). Label slow: 3 s on
// two idle cores, 1 to 5 minutes beside other builds.
TEST(UpscaleRelayout, GrowingIntoAnotherLayoutEqualsTheCheckpointPath) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  ASSERT_EQ(world.size(), 2);
  const std::string dir =
      broadcast_bytes(world.comm(), world.rank() == 0 ? testing::temp_dir("grow_relayout").string() : "", 0);
  struct Switch {
    std::string name;
    const Growth& growth;
    std::vector<std::string> before, keys, after;  // parallel.* before; upscale.*; parallel.* of the resumed run
  };
  const std::vector<Switch> switches = {
      {"dp2_tp2", kGrowths[0], {}, {"upscale.tp=2"}, {"parallel.tp=2"}},
      {"pp2_dp2", kGrowths[3], {"parallel.pp=2"}, {"upscale.pp=1"}, {"parallel.pp=1"}},
      {"tp2_pp2", kGrowths[2], {"parallel.tp=2"}, {"upscale.tp=1", "upscale.pp=2"}, {"parallel.tp=1", "parallel.pp=2"}},
  };
  for (const Switch& sw : switches) {
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    const fs::path run_dir = fs::path(dir) / sw.name;
    run(kBase + sw.before + in_run(sw.growth) + sw.keys, run_dir / "inrun", comm.comm());
    const fs::path want = offline(sw.growth, run_dir, sw.before, comm.comm(), sw.after);
    MPI_Barrier(world.comm());
    expect_files_equal(run_dir / "inrun" / "checkpoints" / "step_00000006.h5", want, sw.name);
    const std::vector<double> got = testing::losses(run_dir / "inrun" / "metrics.jsonl"),
                              path = testing::losses(run_dir / "offline" / "metrics.jsonl");
    ASSERT_EQ(got.size(), 6u) << sw.name;
    ASSERT_EQ(path.size(), 3u) << sw.name;
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[3 + i], path[i]) << sw.name << " step " << 4 + i;
    const std::string metrics = testing::read_file(run_dir / "inrun" / "metrics.jsonl");
    EXPECT_NE(metrics.find("\"layout\": "), std::string::npos) << metrics;
    // The saved config is the new layout's: resuming it needs no [upscale] keys.
    CheckpointReader r((run_dir / "inrun" / "checkpoints" / "step_00000006.h5").string(), MPI_COMM_SELF);
    const Config saved = parse_config_string(r.meta().config_toml, "saved");
    const Config resumed = config(kBase + sw.after);
    EXPECT_EQ(saved.parallel.tp, resumed.parallel.tp) << sw.name;
    EXPECT_EQ(saved.parallel.pp, resumed.parallel.pp) << sw.name;
    EXPECT_EQ(saved.upscale.tp + saved.upscale.pp + saved.upscale.dp, 0) << sw.name;
    // Resumed with the run's own config (the shallow depth, the [upscale] section) past the growth:
    // the grown model on the layout after it, each rank holding what it holds in the offline run.
    const Trainer again(config(kBase + sw.before + in_run(sw.growth) + sw.keys), (run_dir / "inrun").string(), comm.comm());
    const Trainer offline_layout(config(kBase + sw.before + sw.after +
                                        std::vector<std::string>{"model.n_layer=" + std::to_string(sw.growth.layers)}),
                                 "", comm.comm());
    EXPECT_EQ(again.start_step(), 6) << sw.name;
    EXPECT_EQ(again.params().numel(), offline_layout.params().numel()) << sw.name << " on rank " << world.rank();
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
