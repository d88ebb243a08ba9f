// Tests app/checkpoint/adapter_checkpoint.h (lora.checkpoint = "adapters"): the run's checkpoints
// hold the adapters, their moments and the run state but no base tensor, and are smaller; resuming
// from one continues bit for bit; `ckpt export --merge-lora` / `--adapters-only` and `generate`
// from one give what the same run's full checkpoint gives; a missing or changed base, a base drawn
// from train.seed and a run without checkpoint.init_from are refused naming the files or keys; and
// (AdapterCheckpointSlow, mpiexec) an adapters-only checkpoint resumes on another layout.
#include "app/checkpoint/adapter_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/ckpt_commands.h"
#include "app/config.h"
#include "app/freeze.h"
#include "app/lora.h"
#include "app/trainer.h"
#include "app/cli_testing.h"
#include "error_testing.h"
#include "app/layout_testing.h"
#include "testing.h"
#include "app/trainer_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::Trained;
using testing::with;

const std::vector<std::string> kBase = {"train.global_batch=8", "train.micro_batch=2", "parallel.bucket_mb=0.01",
                                        "optim.lr=3e-2"};
// attn.proj and mlp.*: a GPT-2 PEFT export (--adapters-only) refuses q, k, v (peft_export.h).
const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=8", "lora.targets=[\"attn.proj\", \"mlp.*\"]",
                                        "lora.dropout=0.1"};

Config config(std::vector<std::string> sets) {
  return parse_config_string(testing::layout_config("gpt2"), "lora.toml", sets);
}

// A base model (two steps of full training) in dir/base, and its step-2 checkpoint's path.
std::string train_base(const fs::path& dir) {
  Trainer base(config(with(kBase, {"train.steps=2", "checkpoint.every=1", "checkpoint.keep_last=5"})),
               (dir / "base").string(), MPI_COMM_SELF);
  base.run();
  return (dir / "base" / "checkpoints" / "step_00000002.h5").string();
}

// A LoRA run on base_file in dir/<name>, lora.checkpoint = mode, stopped after `steps` of 4.
std::vector<std::string> lora_run(const std::string& base_file, const std::string& mode) {
  return with(with(kBase, kLora), {"train.steps=4", "checkpoint.init_from=" + base_file, "lora.checkpoint=\"" + mode + "\""});
}
std::string train_lora(const fs::path& dir, const std::string& name, const std::string& base_file,
                       const std::string& mode, int64_t steps) {
  Trainer t(config(with(lora_run(base_file, mode), {"train.exit_after_steps=" + std::to_string(steps)})),
            (dir / name).string(), MPI_COMM_SELF);
  t.run();
  return (dir / name / "checkpoints" / checkpoint_file_name(steps)).string();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::equal(a.ptr<float>(), a.ptr<float>() + a.numel(), b.ptr<float>());
}

TEST(AdapterCheckpoint, HoldsNoBaseTensorAndResumesBitExact) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("adapter_ckpt_resume");
  const std::string base_file = train_base(dir);
  const std::string full = train_lora(dir, "full", base_file, "full", 2);
  const std::string adapters = train_lora(dir, "adapters", base_file, "adapters", 2);
  {
    CheckpointReader r(adapters, MPI_COMM_SELF);
    const AttrMap& rec = r.group_attributes().at(kLoraGroup);
    EXPECT_TRUE(is_adapters_only(rec));
    EXPECT_EQ(string_attr(rec, "base"), fs::absolute(base_file).lexically_normal().string());
    EXPECT_FALSE(r.has("/model/blocks.0.attn.q.weight"));
    EXPECT_FALSE(r.has("/model/wte.weight"));
    EXPECT_TRUE(r.has("/model/blocks.0.attn.proj.lora_A.weight"));
    EXPECT_TRUE(r.has("/optim/blocks.1.mlp.proj.lora_B.weight/exp_avg"));
    for (const TensorInfo& t : r.tensors()) {
      if (t.path.rfind("/model/", 0) == 0) EXPECT_TRUE(is_lora_parameter(t.path)) << t.path;
    }
    // Opened for its model: the base's tensors, the file's adapters.
    const auto opened = open_model_checkpoint(adapters, MPI_COMM_SELF);
    const CheckpointReader base(base_file, MPI_COMM_SELF), whole(full, MPI_COMM_SELF);
    EXPECT_EQ(opened->read_all("/model/wte.weight"), base.read_all("/model/wte.weight"));
    EXPECT_EQ(opened->read_all("/model/blocks.0.attn.proj.lora_A.weight"),
              whole.read_all("/model/blocks.0.attn.proj.lora_A.weight"));
    EXPECT_EQ(opened->tensors().size(), whole.tensors().size());
  }
  const auto full_bytes = fs::file_size(full), adapter_bytes = fs::file_size(adapters);
  std::cout << "[ sizes    ] tiny gpt2 LoRA r=4 checkpoint: full " << full_bytes << " bytes, adapters " << adapter_bytes
            << " bytes\n";
  EXPECT_LT(adapter_bytes, full_bytes);
  // Resumed from the adapters-only file: the uninterrupted run, bit for bit.
  const Trained whole = testing::train(config(lora_run(base_file, "adapters")), MPI_COMM_NULL);
  Trainer resumed(config(lora_run(base_file, "adapters")), (dir / "adapters").string(), MPI_COMM_SELF);
  ASSERT_EQ(resumed.start_step(), 2);
  for (int64_t s = 2; s < 4; ++s) EXPECT_EQ(resumed.step(s).loss, whole.losses[static_cast<size_t>(s)]) << s;
  EXPECT_TRUE(bitwise_equal(resumed.params().flat_params(), whole.trainer->params().flat_params()));
  const FullOptimizerState a = resumed.optimizer().gather_state(), b = whole.trainer->optimizer().gather_state();
  EXPECT_TRUE(bitwise_equal(a.state.exp_avg, b.state.exp_avg));
  EXPECT_TRUE(bitwise_equal(a.state.exp_avg_sq, b.state.exp_avg_sq));
  fs::remove_all(dir);
}

TEST(AdapterCheckpoint, ExportAndGenerateGiveTheFullCheckpointsResult) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("adapter_ckpt_export");
  const std::string base_file = train_base(dir);
  const std::string full = train_lora(dir, "full", base_file, "full", 3);
  const std::string adapters = train_lora(dir, "adapters", base_file, "adapters", 3);
  std::ostringstream out;
  for (const bool merge : {true, false}) {
    std::string files[2];
    for (int i = 0; i < 2; ++i) {
      CkptExportArgs args;
      args.file = i == 0 ? full : adapters;
      args.out_dir = (dir / ((merge ? "merged_" : "peft_") + std::to_string(i))).string();
      args.merge_lora = merge;
      args.adapters_only = !merge;
      ASSERT_EQ(run_ckpt_export(args, out), 0);
      files[i] = testing::read_file(fs::path(args.out_dir) / (merge ? "model.safetensors" : "adapter_model.safetensors"));
    }
    EXPECT_FALSE(files[0].empty());
    EXPECT_EQ(files[0], files[1]) << (merge ? "--merge-lora" : "--adapters-only");
  }
  std::string generated[2];
  for (int i = 0; i < 2; ++i) {
    const auto g = testing::run_tessera({"generate", "--ckpt", i == 0 ? full : adapters, "--prompt", "12+34=",
                                         "--max-tokens", "6"}, dir);
    ASSERT_EQ(g.exit_code, 0) << g.output;
    generated[i] = g.output.substr(0, g.output.find(" tokens in "));  // the text, not the timing line
  }
  EXPECT_EQ(generated[0], generated[1]);
  fs::remove_all(dir);
}

TEST(AdapterCheckpoint, RefusalsNameTheFilesAndKeys) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("adapter_ckpt_refusals");
  // No checkpoint.init_from (the base drawn from train.seed), or no [lora]: refused by the config.
  EXPECT_TRUE(testing::throws_with([] { config(with(with(kBase, kLora), {"lora.checkpoint=\"adapters\""})); },
                                   {"lora.checkpoint = \"adapters\"", "checkpoint.init_from", "train.seed"}));
  EXPECT_TRUE(testing::throws_with([] { config({"lora.checkpoint=\"adapters\"", "checkpoint.init_from=x.h5"}); },
                                   {"lora.checkpoint", "lora.rank"}));
  EXPECT_TRUE(testing::throws_with([] { config(with(kLora, {"lora.checkpoint=\"base\""})); }, {"lora.checkpoint"}));
  const std::string base_file = train_base(dir);
  const std::string adapters = train_lora(dir, "adapters", base_file, "adapters", 2);
  // A full LoRA run whose base came from train.seed cannot go on as adapters-only.
  {
    Trainer seeded(config(with(with(kBase, kLora), {"train.steps=4", "train.exit_after_steps=1"})),
                   (dir / "seeded").string(), MPI_COMM_SELF);
    seeded.run();
  }
  EXPECT_TRUE(testing::throws_with(
      [&] {
        Trainer t(config(with(with(kBase, kLora), {"train.steps=4", "lora.checkpoint=\"adapters\"",
                                                   "checkpoint.init_from=" + base_file})),
                  (dir / "seeded").string(), MPI_COMM_SELF);
      },
      {"lora.checkpoint = \"adapters\"", "step_00000001.h5", "train.seed"}));
  CkptExportArgs args;
  args.file = adapters;
  args.out_dir = (dir / "merged").string();
  args.merge_lora = true;
  std::ostringstream out;
  // The base changed (another checkpoint copied over it), then missing: resume, export and generate
  // refuse, naming the adapters' checkpoint and the base.
  const std::string other = (dir / "base" / "checkpoints" / "step_00000001.h5").string();
  fs::copy_file(other, base_file, fs::copy_options::overwrite_existing);
  for (const std::string& why : {std::string("the base changed"), std::string("no longer exists")}) {
    EXPECT_TRUE(testing::throws_with(
        [&] { Trainer t(config(lora_run(base_file, "adapters")), (dir / "adapters").string(), MPI_COMM_SELF); },
        {"[lora]", adapters, base_file, why}));
    EXPECT_TRUE(testing::throws_with([&] { run_ckpt_export(args, out); }, {adapters, base_file, why}));
    const auto g = testing::run_tessera({"generate", "--ckpt", adapters, "--prompt", "1+1="}, dir);
    EXPECT_NE(g.exit_code, 0);
    EXPECT_NE(g.output.find(base_file), std::string::npos) << g.output;
    EXPECT_NE(g.output.find(why), std::string::npos) << g.output;
    fs::remove(base_file);
  }
  fs::remove_all(dir);
}

// mpiexec: an adapters-only checkpoint written by one rank resumes under tp 2 and under dp 2 (each
// rank reads its shards of the base from the base file and of the adapters from the checkpoint),
// continuing the one-rank run.
TEST(AdapterCheckpointSlow, ResumesOnAnotherLayout) {
  const fs::path dir = testing::temp_dir("adapter_ckpt_layouts");
  std::ofstream(dir / "lora.toml") << testing::layout_config("gpt2");
  const auto sets = [](const std::vector<std::string>& s) {
    std::vector<std::string> a;
    for (const std::string& x : s) a.insert(a.end(), {"--set", x});
    return a;
  };
  auto r = testing::train_run(dir, "lora.toml", "base", 1, sets(with(kBase, {"train.steps=2"})));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string base_file = (dir / "base" / "checkpoints" / "step_00000002.h5").string();
  const std::vector<std::string> lora = with(lora_run(base_file, "adapters"), {"log.every=1"});
  r = testing::train_run(dir, "lora.toml", "one", 1, sets(lora));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"tp2", {"parallel.tp=2"}}, {"dp2", {}}}) {
    r = testing::train_run(dir, "lora.toml", name, 1, sets(with(lora, {"train.exit_after_steps=2"})));
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    r = testing::train_run(dir, "lora.toml", name, 2, sets(with(lora, layout)));
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("at step 2"), std::string::npos) << r.output;
    const auto got = testing::losses(dir / name / "metrics.jsonl");
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << name << " step " << i + 1;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
