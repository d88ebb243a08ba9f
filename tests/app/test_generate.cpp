// Tests app/generate.h: the sampling rule, and `tessera generate` on a trained checkpoint:
// the KV cache gives the same text as re-running the whole sequence, a model trained on
// 1-digit addition answers held-out problems correctly, and a checkpoint written by pipeline
// stages generates what the 1-rank run's does.
#include "app/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cli_testing.h"
#include "layout_testing.h"
#include "kernels/check.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

TEST(SampleToken, GreedyTopKAndTemperature) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -5.0f};
  EXPECT_EQ(sample_token(logits, 0.0, 0, 0.99), 1);  // greedy ignores u
  EXPECT_EQ(sample_token(logits, 1.0, 1, 0.99), 1);  // top-1 is greedy
  // softmax([0, ln 3]) over the top 2 = [0.25, 0.75], sorted by logit: token 1 first.
  EXPECT_EQ(sample_token(logits, 1.0, 2, 0.70), 1);
  EXPECT_EQ(sample_token(logits, 1.0, 2, 0.80), 0);
  // A very low temperature is greedy; a very high one is uniform over the top k.
  EXPECT_EQ(sample_token(logits, 1e-6, 0, 0.999), 1);
  EXPECT_EQ(sample_token(logits, 1e6, 3, 0.40), 0);
  EXPECT_EQ(sample_token(logits, 1e6, 3, 0.90), 2);
}

// A 2-layer model learns 1-digit addition in a few hundred steps; its greedy answers, with and
// without the KV cache, must be the same text, and right.
TEST(GenerateCommand, CachedEqualsUncachedAndAnswersAreRight) {
  const fs::path dir = testing::temp_dir("generate");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  testing::RunResult r = testing::run_tessera(
      {"train", (dir / "tiny.toml").string(), "--run-dir", (dir / "run").string(), "--set", "train.steps=600",
       "--set", "optim.lr=1e-2", "--set", "train.global_batch=16", "--set", "train.micro_batch=16", "--set",
       "model.n_embd=48", "--set", "data.val_examples=64", "--set", "log.every=100"},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = (dir / "run" / "checkpoints" / "step_00000600.h5").string();
  int right = 0;
  const std::vector<std::pair<std::string, std::string>> problems = {{"3+4=", "7"}, {"8+9=", "17"}, {"0+6=", "6"},
                                                                     {"5+5=", "10"}, {"9+2=", "11"}, {"1+7=", "8"}};
  for (const auto& [prompt, answer] : problems) {
    std::vector<std::string> args = {"generate", "--ckpt", ckpt, "--prompt", prompt, "--max-tokens", "4",
                                     "--stop-at-newline"};
    const auto cached = testing::run_tessera(args, dir);
    args.push_back("--no-cache");
    const auto uncached = testing::run_tessera(args, dir);
    ASSERT_EQ(cached.exit_code, 0) << cached.output;
    const std::string text = cached.output.substr(0, cached.output.find('\n'));
    EXPECT_EQ(text, uncached.output.substr(0, uncached.output.find('\n'))) << prompt;
    EXPECT_NE(cached.output.find("tokens/s (KV cache)"), std::string::npos) << cached.output;
    right += text == prompt + answer;
  }
  // Held-out accuracy of this run is printed by the trainer; these six include held-out and
  // training pairs alike. Require most of them right (the model is small and trained briefly).
  EXPECT_GE(right, 5) << r.output;
  const auto bad = testing::run_tessera({"generate", "--ckpt", (dir / "missing.h5").string(), "--prompt", "1+1="}, dir);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("missing.h5"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

// `tessera generate` on a checkpoint written by two pipeline stages (the tied gpt2 table stored
// once, by the first stage, the last stage's copy not at all) loads the whole model on one process
// and continues prompts as it does from the 1-rank run's checkpoint: the same greedy text. The runs
// train the same 60 steps (equal within 1e-5: test_pipeline_training.cpp), after which the model
// answers with confident, distinct tokens.
TEST(GenerateCommand, FromAPipelineCheckpointAsFromTheOneRankOne) {
  const fs::path dir = testing::temp_dir("generate_pp");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "train.micro_batch=2", "--set", "log.every=60"};
  ASSERT_EQ(testing::train_run(dir, "tiny.toml", "one", 1, base).exit_code, 0);
  const auto pp = testing::train_run(dir, "tiny.toml", "pp", 2, testing::with(base, {"--set", "parallel.pp=2"}));
  ASSERT_EQ(pp.exit_code, 0) << pp.output;
  ASSERT_NE(pp.output.find("x pp 2 (1f1b)"), std::string::npos) << pp.output;
  for (const std::string prompt : {"3+4=", "8+9=\n5+5=", "1+"}) {
    std::vector<std::string> texts;
    for (const std::string run : {"one", "pp"}) {
      const std::string ckpt = (dir / run / "checkpoints" / "step_00000060.h5").string();
      const auto g = testing::run_tessera({"generate", "--ckpt", ckpt, "--prompt", prompt, "--max-tokens", "8"}, dir);
      ASSERT_EQ(g.exit_code, 0) << g.output;
      // The prompt and its 8 new tokens (newlines too), without the tokens/s line (stderr) after them.
      const auto end = g.output.find("8 tokens in ");
      ASSERT_NE(end, std::string::npos) << g.output;
      texts.push_back(g.output.substr(0, end));
    }
    EXPECT_EQ(texts[1], texts[0]) << prompt;
    EXPECT_GE(texts[0].size(), prompt.size() + 8) << texts[0];
  }
  fs::remove_all(dir);
}

// Out-of-range sampling options used to be accepted (--top-k -3 sampled from the whole
// vocabulary); each is refused naming the option. --max-tokens beyond the model's context (it
// used to stop there silently) says how many fit.
TEST(GenerateCommand, OutOfRangeOptionsAreRefused) {
  for (auto [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--top-k", "-3"}, {"--temperature", "-1"}, {"--temperature", "inf"}, {"--temperature", "nan"},
           {"--max-tokens", "-2"}}) {
    GenerateArgs a;
    if (option == "--top-k") a.top_k = std::stoll(value);
    if (option == "--temperature") a.temperature = std::stod(value);
    if (option == "--max-tokens") a.max_tokens = std::stoll(value);
    try {
      check_generate_args(a);
      ADD_FAILURE() << option << " " << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(option + " must be"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(check_generate_args(GenerateArgs{}));

  const fs::path dir = testing::temp_dir("generate_args");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  ASSERT_EQ(testing::run_tessera({"train", (dir / "tiny.toml").string(), "--run-dir", (dir / "run").string(), "--set",
                                  "train.steps=1"},
                                 dir)
                .exit_code,
            0);
  const std::string ckpt = (dir / "run" / "checkpoints" / "step_00000001.h5").string();
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--ckpt", ckpt, "--prompt", "3+4="};
    if (std::find(extra.begin(), extra.end(), "--max-tokens") == extra.end()) args.insert(args.end(), {"--max-tokens", "2"});
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_tessera(args, dir);
  };
  testing::RunResult r = generate({"--top-k", "-3", "--temperature", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("generate: --top-k must be >= 0 (0 = the whole vocabulary), got -3"), std::string::npos)
      << r.output;
  r = generate({"--temperature", "-0.5"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--temperature must be a finite number >= 0"), std::string::npos) << r.output;
  // The tiny model's context is train.seq_len = 24: a 4-token prompt leaves room for 20.
  r = generate({"--max-tokens", "30"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--max-tokens 30 does not fit: the prompt has 4 tokens and the model's context is 24, so at "
                          "most 20 new tokens fit"),
            std::string::npos)
      << r.output;
  r = generate({"--top-k", "3", "--temperature", "0.7"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
