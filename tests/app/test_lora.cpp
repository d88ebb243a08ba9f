// [lora] in training (app/lora.h, docs/finetuning.md): a LoRA run freezes the whole base (it stays
// bit for bit, has no moments and its matrices no gradient buffer), trains the adapters, shows the
// section in the resolved config, its checkpoints name the base (path and checksum) and resume
// only with it unchanged, and LoraLayouts (mpiexec -n 2: dp 2, tp 2, pp 2) equals the 1-rank run.
#include "app/lora.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/ckpt_commands.h"
#include "app/checkpoint/hf_export.h"
#include "app/checkpoint/hf_import.h"
#include "app/config.h"
#include "app/freeze.h"
#include "app/trainer.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "parallel/mpi_communicator.h"
#include "cli_testing.h"
#include "testing.h"
#include "trainer_testing.h"

namespace tessera {
namespace {

using testing::Trained;

const std::vector<std::string> kBase = {"train.steps=3", "train.global_batch=8", "train.micro_batch=2",
                                        "parallel.bucket_mb=0.01", "optim.lr=3e-2"};
const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=8", "lora.targets=[\"attn.*\", \"mlp.*\"]"};

Config config(const std::string& preset, std::vector<std::string> sets) {
  return parse_config_string(testing::layout_config(preset), "lora.toml", sets);
}

TEST(LoraNames, TheBaseIsEverythingButTheAdapters) {
  const std::vector<std::string> names = {"wte.weight", "blocks.0.attn.q.weight", "blocks.0.attn.q.lora_A.weight",
                                          "blocks.0.attn.q.lora_B.weight", "ln_f.weight"};
  EXPECT_EQ(lora_frozen_base(names), (std::set<std::string>{"wte.weight", "blocks.0.attn.q.weight", "ln_f.weight"}));
  EXPECT_TRUE(is_lora_parameter("blocks.3.mlp.down.lora_B.weight"));
  EXPECT_FALSE(is_lora_parameter("blocks.3.mlp.down.weight"));
}

TEST(LoraTraining, TrainsTheAdaptersOnAFrozenBase) {
  for (const std::string preset : {"gpt2", "llama"}) {
    const Trained initial{std::make_unique<Trainer>(config(preset, testing::with(kBase, kLora)), "", MPI_COMM_NULL), {}};
    const Trained got = testing::train(config(preset, testing::with(kBase, kLora)), MPI_COMM_NULL);
    const ParameterStore &gp = got.trainer->params(), &ip = initial.trainer->params();
    int64_t adapters = 0, no_grad = 0;
    for (const ParamEntry& e : gp.entries()) {
      const Tensor g = gp.param(gp.find(e.spec.name)), w = ip.param(ip.find(e.spec.name));
      const bool same = std::equal(g.ptr<float>(), g.ptr<float>() + g.numel(), w.ptr<float>());
      EXPECT_EQ(e.frozen, !is_lora_parameter(e.spec.name)) << preset << " " << e.spec.name;
      if (is_lora_parameter(e.spec.name)) {
        adapters += e.local_shape.numel();
        EXPECT_FALSE(same) << preset << " " << e.spec.name << " did not train";
      } else {
        EXPECT_TRUE(same) << preset << " " << e.spec.name << " changed";
        if (!e.has_grad()) no_grad += e.local_shape.numel();
      }
    }
    EXPECT_GT(adapters, 0);
    // Moments for the adapters only; gradients for everything but the frozen matrices and embeddings.
    EXPECT_EQ(got.trainer->allocator().counter(MemCategory::OptimizerState).current, size_t(2 * adapters * 4)) << preset;
    EXPECT_EQ(got.trainer->allocator().counter(MemCategory::Gradients).current,
              size_t((gp.padded_numel() - no_grad) * 4)) << preset;
    EXPECT_LT(got.losses.back(), got.losses.front()) << preset;
  }
}

TEST(LoraConfig, ShownInTheResolvedConfigAndRefusedNamingTheKey) {
  const std::string toml = to_toml(config("gpt2", testing::with(kBase, kLora)));
  EXPECT_NE(toml.find("[lora]\n"), std::string::npos);
  EXPECT_NE(toml.find("rank = 4"), std::string::npos);
  EXPECT_NE(toml.find("targets = [\"attn.*\", \"mlp.*\"]"), std::string::npos);
  EXPECT_TRUE(testing::throws_with([] { config("gpt2", {"lora.rank=4", "lora.targets=[\"attn.qkv\"]"}); },
                                   {"lora.targets", "attn.qkv"}));
  EXPECT_TRUE(testing::throws_with([] { config("llama", {"lora.rank=4", "lora.targets=[\"mlp.fc\"]"}); },
                                   {"lora.targets", "mlp.fc", "mlp.gate"}));
  EXPECT_NO_THROW(config("gpt2", {"lora.rank=4", "lora.dropout=0.1"}));
  EXPECT_TRUE(testing::throws_with([] { config("gpt2", {"lora.rank=4", "lora.dropout=1.0"}); }, {"lora.dropout"}));
  EXPECT_TRUE(testing::throws_with([] { config("gpt2", {"lora.rank=4", "lora.dropout=0.1", "train.device=\"cuda\""}); },
                                   {"lora.dropout = 0.1", "train.device = \"cuda\"", "no CUDA kernel"}));
  EXPECT_TRUE(testing::throws_with([] { config("gpt2", {"lora.rank=-1"}); }, {"lora.rank"}));
}

TEST(LoraCheckpoints, NameTheBaseAndResumeOnlyWithItUnchanged) {
  testing::test_world();  // MPI for the checkpoint files
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir("lora_ckpt");
  {  // The base: two steps of full training, a checkpoint after each.
    Trainer base(config("gpt2", testing::with(kBase, {"train.steps=2", "checkpoint.every=1", "checkpoint.keep_last=5"})),
                 (dir / "base").string(), MPI_COMM_SELF);
    base.run();
  }
  const std::string base_file = (dir / "base" / "checkpoints" / "step_00000002.h5").string();
  const std::vector<std::string> lora =
      testing::with(testing::with(kBase, kLora), {"train.steps=4", "checkpoint.init_from=" + base_file});
  const Trained whole = testing::train(config("gpt2", lora), MPI_COMM_NULL);
  {
    Trainer first(config("gpt2", testing::with(lora, {"train.exit_after_steps=2"})), (dir / "lora").string(),
                  MPI_COMM_SELF);
    first.run();
  }
  const std::string file = (dir / "lora" / "checkpoints" / "step_00000002.h5").string();
  {
    CheckpointReader r(file, MPI_COMM_SELF);
    ASSERT_EQ(r.group_attributes().count(kLoraGroup), 1u);
    const AttrMap& rec = r.group_attributes().at(kLoraGroup);
    EXPECT_EQ(string_attr(rec, "base"), fs::absolute(base_file).lexically_normal().string());
    EXPECT_EQ(string_attr(rec, "base_checksum").rfind("fnv1a64:", 0), 0u);
    EXPECT_TRUE(r.has("/model/blocks.0.attn.q.lora_A.weight"));
    EXPECT_TRUE(r.has("/optim/blocks.0.attn.q.lora_B.weight/exp_avg"));
    EXPECT_FALSE(r.has("/optim/blocks.0.attn.q.weight/exp_avg"));
  }
  // The checksum covers the base tensors only, so the LoRA checkpoint (same base) has the base's.
  EXPECT_EQ(lora_base_checksum(file, MPI_COMM_SELF), lora_base_checksum(base_file, MPI_COMM_SELF));
  {  // Resumed with its base: the uninterrupted run.
    Trainer resumed(config("gpt2", lora), (dir / "lora").string(), MPI_COMM_SELF);
    ASSERT_EQ(resumed.start_step(), 2);
    for (int64_t s = 2; s < 4; ++s) resumed.step(s);
    testing::expect_state_near(resumed, *whole.trainer, 1e-6, "resumed");
  }
  // The base changed (another checkpoint copied over it): refused, naming both files.
  const std::string other = (dir / "base" / "checkpoints" / "step_00000001.h5").string();
  fs::copy_file(other, base_file, fs::copy_options::overwrite_existing);
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(config("gpt2", lora), (dir / "lora").string(), MPI_COMM_SELF); },
                                   {"[lora]", file, "step_00000002.h5", "checksum", "the base changed"}));
  fs::remove(base_file);
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(config("gpt2", lora), (dir / "lora").string(), MPI_COMM_SELF); },
                                   {"[lora]", "no longer exists"}));
  fs::remove_all(dir);
}

const std::vector<std::string> kDropout = {"lora.dropout=0.1"};

// Every parameter and both moments of a and b, bit for bit.
void expect_state_bitwise(Trainer& a, Trainer& b, const std::string& what) {
  const auto equal = [](const Tensor& x, const Tensor& y) {
    return x.numel() == y.numel() && std::equal(x.ptr<float>(), x.ptr<float>() + x.numel(), y.ptr<float>());
  };
  EXPECT_TRUE(equal(a.params().flat_params(), b.params().flat_params())) << what << ": parameters";
  const FullOptimizerState sa = a.optimizer().gather_state(), sb = b.optimizer().gather_state();
  EXPECT_TRUE(equal(sa.state.exp_avg, sb.state.exp_avg)) << what << ": exp_avg";
  EXPECT_TRUE(equal(sa.state.exp_avg_sq, sb.state.exp_avg_sq)) << what << ": exp_avg_sq";
}

// lora.dropout = 0.1: training differs from p = 0 once B is nonzero (step 0's adapters add
// nothing, so its loss is p = 0's), and a run resumed from its step-2 checkpoint continues bit for
// bit: the mask depends on the step and the sample, not on the process.
TEST(LoraDropout, ChangesTrainingAndResumesBitExact) {
  testing::test_world();
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir("lora_dropout_resume");
  const std::vector<std::string> lora = testing::with(testing::with(kBase, kLora), {"train.steps=4"});
  const Trained plain = testing::train(config("gpt2", lora), MPI_COMM_NULL);
  const Trained whole = testing::train(config("gpt2", testing::with(lora, kDropout)), MPI_COMM_NULL);
  EXPECT_EQ(whole.losses[0], plain.losses[0]);
  EXPECT_NE(whole.losses[2], plain.losses[2]);
  {
    Trainer first(config("gpt2", testing::with(testing::with(lora, kDropout), {"train.exit_after_steps=2"})),
                  dir.string(), MPI_COMM_SELF);
    first.run();
  }
  Trainer resumed(config("gpt2", testing::with(lora, kDropout)), dir.string(), MPI_COMM_SELF);
  ASSERT_EQ(resumed.start_step(), 2);
  for (int64_t s = 2; s < 4; ++s) EXPECT_EQ(resumed.step(s).loss, whole.losses[static_cast<size_t>(s)]) << s;
  expect_state_bitwise(resumed, *whole.trainer, "resumed with dropout");
  fs::remove_all(dir);
}

// The logits of a checkpoint's model (its stored config, [lora] included) on fixed tokens.
std::vector<float> logits_of(const std::string& file) {
  CheckpointReader r(file, MPI_COMM_SELF);
  const ModelConfig cfg = model_config_of(r);
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  const Gpt gpt(cfg, ps);
  ps.finalize();
  for (const ParamEntry& e : ps.entries()) {
    const std::vector<float> v = r.read_all("/model/" + e.spec.name);
    std::copy(v.begin(), v.end(), ps.param(ps.find(e.spec.name)).ptr<float>());
  }
  const auto tokens = testing::random_ids({2, 12}, 10, 5);
  GptCtx ctx;
  gpt.forward(testing::kCpu, ctx, alloc, tokens.t(), Tensor());
  const Tensor l = ctx.logits.tensor();
  return {l.ptr<float>(), l.ptr<float>() + l.numel()};
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  return testing::max_rel_error(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

// `ckpt export --merge-lora`: a LoRA checkpoint exported merged (W + (alpha / r) B A), imported back
// as a plain model, gives the adapted model's logits; without --merge-lora the export is refused.
TEST(LoraExport, MergedExportGivesTheAdaptedModel) {
  testing::test_world();
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir("lora_export");
  {
    Trainer base(config("gpt2", testing::with(kBase, {"train.steps=2"})), (dir / "base").string(), MPI_COMM_SELF);
    base.run();
  }
  const std::string base_file = (dir / "base" / "checkpoints" / "step_00000002.h5").string();
  {
    Trainer lora(config("gpt2", testing::with(testing::with(kBase, kLora), {"checkpoint.init_from=" + base_file})),
                 (dir / "lora").string(), MPI_COMM_SELF);
    lora.run();
  }
  const std::string file = (dir / "lora" / "checkpoints" / "step_00000003.h5").string();
  std::ostringstream out;
  CkptExportArgs args;
  args.file = file;
  args.out_dir = (dir / "plain").string();
  EXPECT_TRUE(testing::throws_with([&] { run_ckpt_export(args, out); }, {file, "LoRA adapters", "--merge-lora"}));
  args.merge_lora = true;
  args.out_dir = (dir / "merged").string();
  ASSERT_EQ(run_ckpt_export(args, out), 0);
  CkptImportArgs in;
  in.dir = args.out_dir;
  in.out = (dir / "merged.h5").string();
  import_hf_model(in);
  const std::vector<float> adapted = logits_of(file), merged = logits_of(in.out), base = logits_of(base_file);
  // f32: the merged weight is rounded once more than the two GEMMs' sum (~1e-7 relative per element).
  EXPECT_LT(max_rel(merged, adapted), 1e-5);
  EXPECT_GT(max_rel(base, adapted), 1e-3);  // the adapters changed the model: the check can fail
  CkptExportArgs base_args;
  base_args.file = base_file;
  base_args.out_dir = (dir / "base_hf").string();
  base_args.merge_lora = true;
  EXPECT_TRUE(testing::throws_with([&] { run_ckpt_export(base_args, out); }, {"--merge-lora", "no LoRA adapters"}));
  fs::remove_all(dir);
}

// Under mpiexec -n 2: each layout's LoRA run equals the 1-rank LoRA run (losses, every parameter
// and the adapters' moments), both presets: tp 2 splits B of the column-parallel layers and A of
// the row-parallel ones; pp 2 and dp 2 treat adapters as parameters.
TEST(LoraLayouts, EqualTheOneRankRun) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  ASSERT_EQ(world.size(), 2);
  for (const std::string preset : {"gpt2", "llama"}) {
    const Trained one = testing::train(config(preset, testing::with(kBase, kLora)), MPI_COMM_NULL);
    for (const auto& [name, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"dp2", {}}, {"tp2", {"parallel.tp=2"}}, {"tp2_sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
             {"pp2", {"parallel.pp=2"}}}) {
      const std::string what = preset + " " + name + " (rank " + std::to_string(world.rank()) + ")";
      MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
      Trained got = testing::train(config(preset, testing::with(testing::with(kBase, kLora), sets)), comm.comm());
      testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
      testing::expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
    }
  }
}

// Under mpiexec -n 2, with lora.dropout = 0.1: the masks are drawn at global coordinates (the
// sample's index in the step's batch, the row's global position, the layer, the global input
// feature), so dp 2 (samples split), tp 2 (row-parallel A split on its input features), tp 2 with
// sequence parallelism (the region input gathered) and pp 2 (layers on two stages) draw the 1-rank
// run's masks and equal it.
TEST(LoraDropoutLayouts, EqualTheOneRankRun) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  ASSERT_EQ(world.size(), 2);
  const std::vector<std::string> lora = testing::with(testing::with(kBase, kLora), kDropout);
  for (const std::string preset : {"gpt2", "llama"}) {
    const Trained one = testing::train(config(preset, lora), MPI_COMM_NULL);
    const Trained plain = testing::train(config(preset, testing::with(kBase, kLora)), MPI_COMM_NULL);
    EXPECT_NE(one.losses.back(), plain.losses.back()) << preset << ": dropout changed nothing";
    for (const auto& [name, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"dp2", {}}, {"tp2", {"parallel.tp=2"}}, {"tp2_sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
             {"pp2", {"parallel.pp=2"}}}) {
      const std::string what = preset + " dropout " + name + " (rank " + std::to_string(world.rank()) + ")";
      MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
      Trained got = testing::train(config(preset, testing::with(lora, sets)), comm.comm());
      testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
      testing::expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
    }
  }
}

}  // namespace
}  // namespace tessera
