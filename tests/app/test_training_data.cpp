// Tests app/training_data.h and the trainer's data error path with real `tessera train` processes:
// a dataset truncated while training runs ends the run with an error naming the file and a saved
// checkpoint that resumes once the file is restored (one process, and two ranks under mpiexec).
#include "app/training_data.h"

#include <gtest/gtest.h>

#include "app/config.h"
#include "app/trainer.h"
#include "cli_testing.h"
#include "error_testing.h"
#include "process_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::Spawned;

// A byte-level dataset prepared by `tessera prepare` (about 240k tokens) and a tiny model on it.
struct TokenRun {
  fs::path dir;
  explicit TokenRun(const std::string& name) : dir(testing::temp_dir(name)) {
    {
      std::ofstream text(dir / "corpus.txt");
      for (int doc = 0; doc < 400; ++doc) {
        for (int w = 0; w < 50; ++w) text << (w % 3 ? "lazy dog " : "quick brown fox ") << (doc * 7 + w) % 13 << ' ';
        text << "\n\n";
      }
    }
    const auto r = testing::run_tessera({"prepare", "--input", (dir / "corpus.txt").string(), "--tokenizer", "byte",
                                         "--separator", "\\n\\n", "--out", (dir / "ds").string()},
                                        dir);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir / "tokens.toml") << R"(
[model]
n_layer = 2
n_head = 2
n_embd = 32
[data]
task = "tokens"
tokenizer = "byte"
[[data.train]]
path = ")" << (dir / "ds").string() << R"("
[train]
steps = 100000
global_batch = 8
micro_batch = 4
seq_len = 32
eval_every = 0
[optim]
lr = 3e-3
warmup_steps = 5
[log]
every = 1
progress = "lines"
peak_gflops = 100.0
)";
  }
  ~TokenRun() { fs::remove_all(dir); }
  fs::path run() const { return dir / "run"; }
  fs::path bin() const { return dir / "ds.bin"; }
  std::vector<std::string> args(const std::vector<std::string>& sets = {}) const {
    std::vector<std::string> a = {"train", (dir / "tokens.toml").string(), "--run-dir", run().string()};
    for (const auto& s : sets) a.push_back("--set"), a.push_back(s);
    return a;
  }
};

// The step the "... saved <file> after step N; ..." line names, or -1.
int64_t saved_step(const std::string& output) {
  const std::string key = "stopped by a data error: saved ";
  const auto at = output.find(key);
  if (at == std::string::npos) return -1;
  const auto step = output.find(" after step ", at);
  return step == std::string::npos ? -1 : std::stoll(output.substr(step + 12));
}

// Truncates the .bin once training has made progress, then checks the run's end: exit 1, the error
// names the file, the offset and the length, and the last completed step is saved. Returns the
// saved step.
int64_t truncate_mid_run(const TokenRun& t, Spawned& p) {
  EXPECT_TRUE(p.wait_for_file(t.run() / "metrics.jsonl")) << p.output();
  fs::resize_file(t.bin(), 1000);  // windows are shuffled over ~480 kB: the next ones lie beyond
  const auto code = p.wait_exit(60);
  EXPECT_TRUE(code.has_value()) << "still running 60 s after its data was truncated:\n" << p.output();
  EXPECT_EQ(code.value_or(-1), kExitError) << p.output();
  const std::string out = p.output();
  EXPECT_NE(out.find("error: " + t.bin().string() + ": cannot read "), std::string::npos) << out;
  EXPECT_NE(out.find(" bytes at byte offset "), std::string::npos) << out;
  EXPECT_NE(out.find("the file has 1000 bytes now"), std::string::npos) << out;
  const int64_t step = saved_step(out);
  EXPECT_GE(step, 1) << out;
  EXPECT_TRUE(fs::exists(t.run() / "checkpoints" / checkpoint_file_name(step))) << out;
  return step;
}

// Without the fix: SIGBUS (exit 135) when a mapped page of the truncated file is touched, and no
// checkpoint.
TEST(TrainingData, DatasetTruncatedMidRunSavesACheckpointThatResumes) {
  const TokenRun t("truncated");
  const std::string original = testing::read_file(t.bin());
  Spawned p(TESSERA_BINARY, t.args(), t.dir / "output.txt");
  const int64_t step = truncate_mid_run(t, p);
  ASSERT_GE(step, 1);
  // Restored, the same command resumes from the saved step.
  std::ofstream(t.bin(), std::ios::binary | std::ios::trunc) << original;
  const auto r = testing::run_tessera(t.args({"train.steps=" + std::to_string(step + 2)}), t.dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step " + std::to_string(step)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: " + std::to_string(step + 2) + " steps"), std::string::npos) << r.output;
}

// Two data-parallel ranks read different windows, so the truncation may fail one rank first: they
// vote before each step, and both save the same step and exit 1 instead of one aborting alone.
TEST(TrainingData, DatasetTruncatedUnderTwoRanksSavesOnBoth) {
  const TokenRun t("truncated_mpi");
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY};
  for (const auto& a : t.args()) args.push_back(a);
  Spawned p(TESSERA_MPIEXEC, args, t.dir / "output.txt");
  truncate_mid_run(t, p);
  EXPECT_EQ(p.output().find("failed alone"), std::string::npos) << p.output();
}

// data.tokenizer may name a Hugging Face tokenizer.json: the config accepts the path, and the
// vocabulary (model.vocab_size = 0) comes from the file; other names are refused naming the forms.
TEST(TrainingData, ATokenizerJsonPathSetsTheVocabulary) {
  const std::string json = std::string(TESSERA_TEST_DATA_DIR) + "/hf_tokenizers/llama3_style.json";
  const Config c = parse_config_string(testing::kTinyConfig, "tiny.toml",
                                       {"data.task=\"tokens\"", "data.tokenizer=\"" + json + "\"", "model.vocab_size=0"});
  EXPECT_EQ(c.data.tokenizer, json);
  EXPECT_EQ(data_vocab_size(c), 800);
  const std::string error = testing::error_of([] {
    parse_config_string(testing::kTinyConfig, "tiny.toml", {"data.tokenizer=\"tokenizer.model\""});
  });
  EXPECT_NE(error.find("or a path ending in \".json\""), std::string::npos) << error;
}

}  // namespace
}  // namespace tessera
