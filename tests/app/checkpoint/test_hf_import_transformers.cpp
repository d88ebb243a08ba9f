// Tests `tessera ckpt import` against transformers itself: tiny GPT-2 (tied and untied head) and
// LLaMA (GQA; sharded with an index; saved in bf16) folders that transformers made and saved, with
// the tokenizer.json of a `tokenizers`-trained BPE (tests/reference/make_hf_models.py). Imported by
// the real command, each model's logits equal transformers' within 1e-5 relative (float32), its loss
// equals, `generate` gives transformers' greedy tokens, the tokenizer.json is recorded by path and
// `ckpt export` writes it back.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/hf_import_testing.h"
#include "app/cli_testing.h"
#include "app/config.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/json.h"
#include "mpi_testing.h"
#include "testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;

fs::path models_dir() { return fs::path(TESSERA_TEST_DATA_DIR) / "hf_models"; }

// transformers' float32 logits (T, V) of the reference sequence.
std::vector<float> reference_logits(const fs::path& folder) {
  const std::string bytes = testing::read_file(folder / "logits.f32");
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

class HfImportTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(HfImportTransformers, LogitsLossAndGreedyTokensEqualTransformers) {
  testing::test_world();  // MPI for the checkpoint reader
  const std::string name = GetParam();
  const Json ref = read_json_file((models_dir() / "reference.json").string()).at(name);
  const fs::path folder = models_dir() / name;
  const fs::path dir = testing::temp_dir("hf_import_transformers_" + name);
  const fs::path out = dir / (name + ".h5");
  RunResult r = testing::run_tessera({"ckpt", "import", folder.string(), "--out", out.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The folder's tokenizer.json, recorded by its absolute path, gives the library's ids.
  const std::string tokenizer = fs::absolute(folder / "tokenizer.json").lexically_normal().string();
  {
    const CheckpointReader c(out.string(), MPI_COMM_SELF);
    EXPECT_EQ(parse_config_string(c.meta().config_toml, "stored").data.tokenizer, tokenizer);
  }
  const std::string prompt = ref.at("prompt").get<std::string>();
  const HfBpeTokenizer tok(tokenizer);
  EXPECT_EQ(tok.encode(prompt), ref.at("prompt_ids").get<std::vector<int32_t>>());

  // Logits of positions 0..T-2 (tessera predicts ids[1:]) and the loss.
  const std::vector<int32_t> ids = ref.at("ids").get<std::vector<int32_t>>();
  const testing::CheckpointForward got = testing::forward_checkpoint(out, ids);
  const std::vector<float> want = reference_logits(folder);
  const int64_t V = ref.at("vocab_size").get<int64_t>(), T = static_cast<int64_t>(ids.size());
  ASSERT_EQ(static_cast<int64_t>(want.size()), T * V);
  ASSERT_EQ(static_cast<int64_t>(got.logits.size()), (T - 1) * V);
  EXPECT_LT(testing::max_rel_error(got.logits.data(), want.data(), (T - 1) * V), 1e-5) << name;
  const double loss = ref.at("loss").get<double>();
  EXPECT_NEAR(got.loss, loss, 1e-6 * loss) << name;

  // Greedy generation (generate's default, temperature 0) through the recorded tokenizer, and once
  // through --tokenizer naming it: generate prints the bytes of the ids it chose (which need not be
  // whole UTF-8 characters), so the expected text is the bytes of transformers' greedy ids.
  const std::string greedy = tok.decode(ref.at("greedy_ids").get<std::vector<int32_t>>());
  const std::vector<std::string> args = {"generate", "--ckpt", out.string(), "--prompt", prompt, "--max-tokens", "8"};
  r = testing::run_tessera(args, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(prompt + greedy, 0), 0u) << "expected \"" << prompt + greedy << "\", got: " << r.output;
  std::vector<std::string> named = args;
  named.insert(named.end(), {"--tokenizer", tokenizer});
  r = testing::run_tessera(named, dir);
  EXPECT_EQ(r.output.rfind(prompt + greedy, 0), 0u) << r.output;

  // Export writes the tokenizer.json back, as it was, with a tokenizer_config.json for it.
  r = testing::run_tessera({"ckpt", "export", out.string(), "--out", (dir / "export").string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::read_file(dir / "export" / "tokenizer.json"), testing::read_file(folder / "tokenizer.json"));
  const Json config = read_json_file((dir / "export" / "tokenizer_config.json").string());
  EXPECT_EQ(config.at("tokenizer_class"), "PreTrainedTokenizerFast");
  EXPECT_FALSE(fs::exists(dir / "export" / "vocab.json"));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, HfImportTransformers,
                         ::testing::Values("gpt2_tied", "gpt2_untied", "llama_sharded", "llama_bf16"));

}  // namespace
}  // namespace tessera
