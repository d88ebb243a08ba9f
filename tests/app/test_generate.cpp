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
#include "data/image_files.h"
#include "data/image_text.h"
#include "data/scenes.h"
#include "vlm_testing.h"
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
  // --image with a text-only checkpoint.
  testing::write_png((dir / "x.png").string(), 2, 2, PNG_COLOR_TYPE_GRAY, 8, {0, 50, 100, 150});
  r = generate({"--image", (dir / "x.png").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("generate: --image needs a vision-language checkpoint; " + ckpt +
                          " holds a text-only model (model.kind = \"gpt\")"),
            std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

// A tiny VLM trained a few steps on the scenes, saved, then asked to caption a held-out scene
// written as a PNG: it runs, prints words of the scenes' vocabulary, and does so identically every
// time (greedy); the 8x8 scene and the same scene drawn at 16x16 (resized to 8x8 on the way in)
// both work. A prompt continues after the image. A VLM without --image continues text (samples with
// no image are part of its training); an empty prompt without an image is refused; a bad image
// file is refused naming it.
TEST(GenerateCommand, CaptionsAnImageFromAVlmCheckpoint) {
  const fs::path dir = testing::temp_dir("generate_vlm");
  std::ofstream(dir / "vlm.toml") << testing::tiny_vlm_toml(/*steps=*/20, /*warmup_steps=*/5);
  auto r = testing::run_tessera({"train", (dir / "vlm.toml").string(), "--run-dir", (dir / "run").string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = (dir / "run" / "checkpoints" / "step_00000020.h5").string();
  const SceneTask task(8, 1234), big(16, 1234);  // data.seed's default: the run's own validation scenes
  const Scene sc = task.scene(3, /*validation=*/true), sc16 = big.scene(3, /*validation=*/true);
  testing::write_png((dir / "scene.png").string(), 8, 8, PNG_COLOR_TYPE_RGB, 8, sc.image);
  testing::write_png((dir / "scene16.png").string(), 16, 16, PNG_COLOR_TYPE_RGB, 8, sc16.image);
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--checkpoint", ckpt};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_tessera(args, dir);
  };
  // stdout's caption line (the output also holds stderr's timing line).
  auto caption = [](const std::string& out) { return out.substr(0, out.find('\n')); };
  const SceneTokenizer tok;
  for (const std::string image : {"scene.png", "scene16.png"}) {
    r = generate({"--image", (dir / image).string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string first = caption(r.output);
    EXPECT_FALSE(first.empty()) << r.output;
    EXPECT_NO_THROW(tok.encode(first)) << first;  // words of the scenes' vocabulary
    EXPECT_NE(r.output.find("tokens in"), std::string::npos) << r.output;
    // At most the context's room: 13 positions - 4 placeholders.
    EXPECT_LE(tok.encode(first).size(), 9u) << first;
    for (int again = 0; again < 2; ++again) {
      const auto r2 = generate({"--image", (dir / image).string(), again ? "--no-cache" : "--seed=5"});
      ASSERT_EQ(r2.exit_code, 0) << r2.output;
      EXPECT_EQ(caption(r2.output), first) << image;
    }
  }
  // --held-out: the first 5 validation scenes captioned in batches (the trainer's scoring), one line
  // each; scene 3's caption is the one --image gave for its PNG (a different path: one image, the
  // generate loop). --dump writes the 5 samples.
  r = generate({"--held-out", "5", "--dump", (dir / "dump.h5").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sample\tresult\tgenerated\texpected\n"), std::string::npos) << r.output;
  const std::string line3 = r.output.substr(r.output.find("\n3\t") + 1);
  const std::string want3 = "\t" + caption(generate({"--image", (dir / "scene.png").string()}).output) + "\t" +
                            sc.caption + "\n";
  EXPECT_NE(line3.find(want3), std::string::npos) << r.output << "\nwant " << want3;
  EXPECT_NE(r.output.find("caption accuracy "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/5) on held-out scenes"), std::string::npos) << r.output;
  const ImageTextData dumped = read_image_text((dir / "dump.h5").string());
  ASSERT_EQ(dumped.num_samples(), 5);
  EXPECT_EQ(std::vector<uint8_t>(dumped.images.begin() + 3 * 192, dumped.images.begin() + 4 * 192), sc.image);
  r = generate({"--held-out", "5", "--image", (dir / "scene.png").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--held-out captions the held-out images; it takes no --image or --prompt"), std::string::npos)
      << r.output;
  // A prompt after the image: printed, then continued.
  r = generate({"--image", (dir / "scene.png").string(), "--prompt", "a red", "--max-tokens", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(caption(r.output).rfind("a red", 0), 0u) << r.output;
  EXPECT_LE(tok.encode(caption(r.output)).size(), 5u) << r.output;
  // Text only: the model continues words.
  r = generate({"--prompt", "a red"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("a red", 0), 0u) << r.output;
  r = generate({});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the prompt is empty (give --image FILE to caption an image)"), std::string::npos) << r.output;
  std::ofstream(dir / "bad.png") << "no image here";
  r = generate({"--image", (dir / "bad.png").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((dir / "bad.png").string() + ": not a PNG or JPEG file"), std::string::npos) << r.output;
  r = generate({"--image", (dir / "scene.png").string(), "--max-tokens", "12"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the prompt has 4 tokens and the model's context is 13, so at most 9 new tokens fit"),
            std::string::npos)
      << r.output;
  // The commands that take text-only GPT checkpoints refuse this one saying why, before they
  // compare a tensor.
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"upscale", "--from", ckpt, "--method", "stack", "--factor", "2", "--out",
                                 (dir / "grown.h5").string()},
        std::vector<std::string>{"ckpt", "export", ckpt, "--out", (dir / "hf").string()}}) {
    r = testing::run_tessera(cmd, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(ckpt + " holds a vision-language model (model.kind = \"vlm\" in its stored config): tessera " +
                            cmd[0] + (cmd[0] == "ckpt" ? " export" : "") + " takes text-only GPT checkpoints"),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "grown.h5"));
  EXPECT_FALSE(fs::exists(dir / "hf"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
