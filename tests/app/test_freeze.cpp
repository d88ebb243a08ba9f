// train.freeze (app/freeze.h, docs/training.md): which names the patterns and "original" select,
// the refusals, and training: frozen tensors stay bit for bit what they were, get no AdamW moments
// (the allocator's optimizer-state bytes count only the trainable elements, under ZeRO-1 too),
// and after one step without clipping the trainable ones equal the unfrozen run's (the same
// gradients: an independent oracle). FreezeLayouts (mpiexec -n 2: dp 2, dp 2 with ZeRO-1, tp 2)
// equals the 1-rank frozen run. Checkpoints of a frozen run hold no moments for the frozen
// tensors, resume to the uninterrupted run, and resume with another freeze setting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <filesystem>

#include "app/checkpoint/checkpoint_io.h"
#include "app/freeze.h"
#include "app/trainer.h"
#include "app/upscale.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "trainer_testing.h"

namespace tessera {
namespace {

using testing::Trained;

const std::vector<std::string> kNames = {"wte.weight",          "wpe.weight",          "blocks.0.ln1.weight",
                                         "blocks.0.attn.q.weight", "blocks.1.ln1.weight", "blocks.1.attn.q.weight",
                                         "blocks.2.ln1.weight", "blocks.2.attn.q.weight", "ln_f.weight"};

TEST(FreezeNames, GlobsSelectByGlobalName) {
  const auto f = frozen_parameters({"wte.*", "blocks.[01].ln1.*"}, kNames, 3, {});
  EXPECT_EQ(f, (std::set<std::string>{"wte.weight", "blocks.0.ln1.weight", "blocks.1.ln1.weight"}));
  EXPECT_EQ(frozen_parameters({}, kNames, 3, {}).size(), 0u);
}

TEST(FreezeNames, OriginalIsWhatTheGrowthCarriedOver) {
  // expand from 2 layers: 0 expand(0) 1 -> layers 0 and 2 original, 1 new; embeddings and norm original.
  const FreezeSource src{{{"mapping", std::string("0 expand(0) 1")}}, "checkpoint g.h5"};
  EXPECT_EQ(frozen_parameters({"original"}, kNames, 3, src),
            (std::set<std::string>{"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.attn.q.weight",
                                   "blocks.2.ln1.weight", "blocks.2.attn.q.weight", "ln_f.weight"}));
  // interleave of one layer: the second copy is new.
  const FreezeSource dup{{{"mapping", std::string("0 0 avg(0,1)")}}, "x"};
  const auto d = frozen_parameters({"original"}, kNames, 3, dup);
  EXPECT_TRUE(d.count("blocks.0.ln1.weight"));
  EXPECT_FALSE(d.count("blocks.1.ln1.weight"));
  EXPECT_FALSE(d.count("blocks.2.ln1.weight"));
}

TEST(FreezeNames, RefusalsNameTheKeyAndValue) {
  EXPECT_TRUE(testing::throws_with([] { frozen_parameters({"vision.*"}, kNames, 3, {}); },
                        {"train.freeze = [\"vision.*\"]", "\"vision.*\" matches no parameter"}));
  EXPECT_TRUE(testing::throws_with([] { frozen_parameters({"original"}, kNames, 3, {{}, "checkpoint plain.h5"}); },
                        {"train.freeze = [\"original\"]", "checkpoint plain.h5 has no up-scaling record"}));
  EXPECT_TRUE(testing::throws_with([] { frozen_parameters({"original"}, kNames, 3, {{{"mapping", std::string("0 1")}}, "g.h5"}); },
                        {"maps 2 layers", "the model has 3"}));
  EXPECT_TRUE(testing::throws_with([] { frozen_parameters({"*"}, kNames, 3, {}); }, {"freezes every one", "nothing would train"}));
  // Before an in-run growth, "original" waits (nothing frozen by it yet).
  EXPECT_TRUE(frozen_parameters({"original"}, kNames, 3, {}, /*apply_original=*/false).empty());
}

// The tiny GPT-2 of the CLI tests, 3 steps of 4 micro-batches, no clipping unless asked.
const std::vector<std::string> kBase = {"train.steps=3", "train.global_batch=8", "train.micro_batch=2",
                                        "parallel.bucket_mb=0.01"};
const std::vector<std::string> kFreeze = {"train.freeze=[\"wte.*\", \"blocks.0.*\", \"ln_f.*\"]"};

Config config(std::vector<std::string> sets) {
  return parse_config_string(testing::layout_config("gpt2"), "freeze.toml", sets);
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<float> tensor_of(const ParameterStore& ps, const std::string& name) {
  const Tensor t = ps.param(ps.find(name));
  return {t.ptr<float>(), t.ptr<float>() + t.numel()};
}

int64_t trainable_numel(const ParameterStore& ps) {
  int64_t n = 0;
  for (const ParamEntry& e : ps.entries()) n += e.frozen ? 0 : e.local_shape.numel();
  return n;
}

// Every frozen tensor of `got` equals `initial`'s bit for bit; the optimizer allocated moments for
// `moment_elems` elements only (two of them, fp32).
void expect_frozen_untouched(const Trainer& got, const Trainer& initial, int64_t moment_elems, const std::string& what) {
  int frozen = 0;
  for (const ParamEntry& e : got.params().entries()) {
    if (!e.frozen) continue;
    ++frozen;
    const std::vector<float> a = tensor_of(got.params(), e.spec.name), b = tensor_of(initial.params(), e.spec.name);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": " << e.spec.name << " changed";
  }
  EXPECT_GT(frozen, 0) << what;
  EXPECT_EQ(got.allocator().counter(MemCategory::OptimizerState).current, size_t(2 * moment_elems * 4)) << what;
}

TEST(Freeze, FrozenTensorsStayAndHaveNoMoments) {
  const Trained initial{std::make_unique<Trainer>(config(kBase + kFreeze), "", MPI_COMM_NULL), {}};
  const Trained got = testing::train(config(kBase + kFreeze), MPI_COMM_NULL);
  expect_frozen_untouched(*got.trainer, *initial.trainer, trainable_numel(got.trainer->params()), "1 rank");
  // The trainable ones moved.
  EXPECT_NE(tensor_of(got.trainer->params(), "blocks.1.attn.q.weight"),
            tensor_of(initial.trainer->params(), "blocks.1.attn.q.weight"));
  EXPECT_EQ(got.trainer->params().entry(got.trainer->params().find("wpe.weight")).frozen, false);
}

TEST(Freeze, OneStepUpdatesTheTrainableLikeTheUnfrozenRun) {
  // Without clipping, step 1's gradients of the trainable parameters are the unfrozen run's, and
  // AdamW is per element: the same values, bit for bit.
  const std::vector<std::string> one = {"train.steps=1", "optim.grad_clip=0"};
  const Trained frozen = testing::train(config(kBase + kFreeze + one), MPI_COMM_NULL);
  const Trained full = testing::train(config(kBase + one), MPI_COMM_NULL);
  for (const ParamEntry& e : frozen.trainer->params().entries()) {
    if (e.frozen) continue;
    EXPECT_EQ(tensor_of(frozen.trainer->params(), e.spec.name), tensor_of(full.trainer->params(), e.spec.name))
        << e.spec.name;
  }
  EXPECT_DOUBLE_EQ(frozen.losses[0], full.losses[0]);
}

TEST(Freeze, RefusedWhenAPatternMatchesNothingOrOriginalHasNoRecord) {
  EXPECT_TRUE(testing::throws_with([] { Trainer t(config(kBase + std::vector<std::string>{"train.freeze=[\"vision.*\"]"}), "", MPI_COMM_NULL); },
                        {"train.freeze = [\"vision.*\"]", "matches no parameter"}));
  EXPECT_TRUE(testing::throws_with([] { Trainer t(config(kBase + std::vector<std::string>{"train.freeze=[\"original\"]"}), "", MPI_COMM_NULL); },
                        {"train.freeze = [\"original\"]", "has no up-scaling record"}));
}

TEST(Freeze, CheckpointsHoldNoFrozenMomentsAndResume) {
  testing::test_world();  // MPI for the checkpoint files
  const auto dir = testing::temp_dir("freeze_ckpt");
  const std::vector<std::string> six = {"train.steps=6"};
  const Trained whole = testing::train(config(kBase + kFreeze + six), MPI_COMM_NULL);
  {
    Trainer first(config(kBase + kFreeze + six + std::vector<std::string>{"train.exit_after_steps=3"}), dir.string(),
                  MPI_COMM_SELF);
    first.run();
  }
  const std::string file = (dir / "checkpoints" / "step_00000003.h5").string();
  {
    CheckpointReader r(file, MPI_COMM_SELF);
    EXPECT_TRUE(r.has("/model/wte.weight"));
    EXPECT_FALSE(r.has("/optim/wte.weight/exp_avg"));
    EXPECT_FALSE(r.has("/optim/blocks.0.attn.q.weight/exp_avg_sq"));
    EXPECT_TRUE(r.has("/optim/blocks.1.attn.q.weight/exp_avg"));
    EXPECT_NE(string_attr(r.group_attributes().at("/optim"), kFrozenKey).find("blocks.0.attn.q.weight"),
              std::string::npos);
  }
  // Grown with carried moments: the frozen parameters' are zero, and the grown file lists none frozen.
  {
    UpscaleArgs args;
    args.from = file;
    args.out = (dir / "grown.h5").string();
    args.options = {.method = "expand"};
    args.carry_optimizer = true;
    std::ostringstream out;
    ASSERT_EQ(run_upscale_command(args, out), 0);
    CheckpointReader g(args.out, MPI_COMM_SELF);
    const std::vector<float> m = g.read_all("/optim/wte.weight/exp_avg");
    EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](float x) { return x == 0.0f; }));
    CheckpointReader src(file, MPI_COMM_SELF);
    EXPECT_EQ(g.read_all("/optim/blocks.2.attn.q.weight/exp_avg"), src.read_all("/optim/blocks.1.attn.q.weight/exp_avg"));
    EXPECT_EQ(g.group_attributes().at("/optim").count(kFrozenKey), 0u);
  }
  // Resumed with the same freeze: the uninterrupted run's state.
  Trainer resumed(config(kBase + kFreeze + six), dir.string(), MPI_COMM_SELF);
  ASSERT_EQ(resumed.start_step(), 3);
  for (int64_t s = 3; s < 6; ++s) resumed.step(s);
  testing::expect_state_near(resumed, *whole.trainer, 1e-6, "resumed");
  for (const ParamEntry& e : resumed.params().entries()) {
    if (e.frozen) {
      EXPECT_EQ(tensor_of(resumed.params(), e.spec.name), tensor_of(whole.trainer->params(), e.spec.name));
    }
  }
  // Resumed with nothing frozen: the formerly frozen ones train, from zero moments.
  Trainer thawed(config(kBase + six + std::vector<std::string>{"checkpoint.resume=" + file}), (dir / "thawed").string(),
                 MPI_COMM_SELF);
  ASSERT_EQ(thawed.start_step(), 3);
  const auto before = tensor_of(thawed.params(), "wte.weight");
  EXPECT_TRUE(std::isfinite(thawed.step(3).loss));
  EXPECT_NE(tensor_of(thawed.params(), "wte.weight"), before);
  // Resumed with more frozen than when saved: their stored moments are left unread.
  Trainer more(config(kBase + kFreeze + six + std::vector<std::string>{"train.freeze=[\"wte.*\", \"blocks.*\", \"ln_f.*\"]",
                                                                       "checkpoint.resume=" + file}),
               (dir / "more").string(), MPI_COMM_SELF);
  EXPECT_EQ(more.start_step(), 3);
  std::filesystem::remove_all(dir);
}

// Under mpiexec -n 2: each layout's frozen run equals the 1-rank frozen run (losses, every
// parameter and the trainable moments), its frozen tensors are the initial ones, and its moments
// cover the trainable elements only (ZeRO-1: this rank's shard of them).
TEST(FreezeLayouts, EqualTheOneRankFrozenRun) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  ASSERT_EQ(world.size(), 2);
  const Trained initial{std::make_unique<Trainer>(config(kBase + kFreeze), "", MPI_COMM_NULL), {}};
  const Trained one = testing::train(config(kBase + kFreeze), MPI_COMM_NULL);
  struct Layout {
    std::string name;
    std::vector<std::string> sets;
  };
  for (const Layout& l : std::vector<Layout>{{"dp2", {}}, {"dp2_zero", {"parallel.zero=1"}}, {"tp2", {"parallel.tp=2"}}}) {
    const std::string what = l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trained got = testing::train(config(kBase + kFreeze + l.sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    testing::expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
    int64_t moments = trainable_numel(got.trainer->params());
    if (l.name == "dp2_zero") moments = (got.trainer->params().padded_numel() - got.trainer->params().frozen_numel()) / 2;
    // Frozen tensors: this rank's shard of the initial ones (tp2 shards are compared per element).
    int frozen = 0;
    const ParameterStore &gp = got.trainer->params(), &ip = initial.trainer->params();
    for (const ParamEntry& e : gp.entries()) {
      if (!e.frozen) continue;
      ++frozen;
      const Tensor g = gp.param(gp.find(e.spec.name)), w = ip.param(ip.find(e.spec.name));
      for (int64_t i = 0; i < e.local_shape.numel(); ++i)
        if (!e.is_padding(i) && g.ptr<float>()[i] != w.ptr<float>()[global_index(e, i)]) {
          ADD_FAILURE() << what << ": " << e.spec.name << " element " << i << " changed";
          break;
        }
    }
    EXPECT_GT(frozen, 0) << what;
    EXPECT_EQ(got.trainer->allocator().counter(MemCategory::OptimizerState).current, size_t(2 * moments * 4)) << what;
  }
}

}  // namespace
}  // namespace tessera
