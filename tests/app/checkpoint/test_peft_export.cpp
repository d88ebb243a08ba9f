// `ckpt export --adapters-only` (app/checkpoint/peft_export.h): the adapter folder against one the
// peft library made (tests/reference/make_peft_adapters.py: the same adapters, filled by a formula,
// saved by peft's save_pretrained): adapter_config.json's keys and tensor names, shapes and values
// equal; a trained LoRA checkpoint's adapters exported value for value; the refusals.
#include "app/checkpoint/peft_export.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/ckpt_commands.h"
#include "app/checkpoint/hf_export.h"
#include "app/checkpoint/safetensors.h"
#include "app/config.h"
#include "app/lora.h"
#include "app/trainer.h"
#include "app/cli_testing.h"
#include "app/layout_testing.h"
#include "data/json.h"
#include "error_testing.h"
#include "model/lora.h"
#include "mpi_testing.h"
#include "testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir(const std::string& preset) { return fs::path(TESSERA_TEST_DATA_DIR) / "peft_adapters" / preset; }

// The models of make_peft_adapters.py, with its adapters: r 4, alpha 8.
ModelConfig fixture_model(const std::string& preset) {
  ModelConfig m;
  m.preset = preset;
  m.vocab_size = 64;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 32;
  m.max_seq_len = 64;
  m.lora.rank = 4;
  m.lora.alpha = 8;
  if (preset == "llama") {
    m.n_kv_head = 2;
    m.ffn_hidden = 48;
    m.lora.targets = {"attn.*", "mlp.*"};
  } else {
    m.lora.targets = {"attn.proj", "mlp.*"};
  }
  return resolve(m);
}

// make_peft_adapters.py's values for a tessera adapter "blocks.<l>.<layer>.lora_<A|B>.weight":
// ((7 i + 13 l + 5 m + 3 is_b) mod 17 - 8) / 16, m the layer's index in lora_layer_names.
std::vector<float> formula(const ModelConfig& cfg, const std::string& name, int64_t numel) {
  const int64_t l = std::stoll(name.substr(7));
  const std::string layer = lora_layer_suffix(name.substr(0, name.find(".lora_")));
  const auto names = lora_layer_names(cfg.preset);
  const int64_t m = std::find(names.begin(), names.end(), layer) - names.begin();
  const int64_t is_b = name.find(".lora_B.") != std::string::npos ? 1 : 0;
  std::vector<float> v(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) v[static_cast<size_t>(i)] = static_cast<float>(((7 * i + 13 * l + 5 * m + 3 * is_b) % 17 - 8) / 16.0);
  return v;
}

Json read_json(const fs::path& p) { return parse_json(testing::read_file(p), p.string()); }

std::set<std::string> as_set(const Json& array) {
  std::set<std::string> s;
  for (const auto& e : array) s.insert(e.get<std::string>());
  return s;
}

TEST(PeftExport, MatchesTheFolderPeftMade) {
  for (const std::string preset : {"llama", "gpt2"}) {
    const ModelConfig cfg = fixture_model(preset);
    std::map<std::string, int64_t> numel;
    for (const auto& [path, shape] : model_tensor_shapes(cfg)) numel[path.substr(7)] = shape.numel();
    const auto tensors = peft_adapter_tensors(cfg, "test", [&](const std::string& n) { return formula(cfg, n, numel.at(n)); });
    const SafetensorsFile want((fixture_dir(preset) / "adapter_model.safetensors").string());
    ASSERT_EQ(tensors.size(), want.tensors().size()) << preset;
    for (const SafetensorsEntry& got : tensors) {
      const SafetensorsTensor* w = want.find(got.name);
      ASSERT_NE(w, nullptr) << preset << ": peft has no tensor " << got.name;
      EXPECT_EQ(got.shape.str(), w->shape_str()) << got.name;  // both "(4, 32)"
      EXPECT_EQ(got.data(), want.read_f32(*w)) << got.name;
    }
    const Json ours = parse_json(peft_adapter_config_json(cfg, "base"), "ours");
    const Json peft = read_json(fixture_dir(preset) / "adapter_config.json");
    for (const auto& [key, value] : ours.items()) {
      ASSERT_TRUE(peft.contains(key)) << preset << ": peft writes no key " << key;
      if (key == "target_modules") {
        EXPECT_EQ(as_set(value), as_set(peft[key])) << preset;
      } else if (key != "base_model_name_or_path") {
        EXPECT_EQ(value, peft[key]) << preset << " " << key;
      }
    }
    EXPECT_EQ(ours["base_model_name_or_path"], "base");
  }
}

const std::vector<std::string> kBase = {"train.steps=2", "train.global_batch=8", "train.micro_batch=4", "optim.lr=3e-2"};

Config config(const std::string& preset, const std::vector<std::string>& sets) {
  return parse_config_string(testing::layout_config(preset), "peft.toml", sets);
}

// A trained LoRA checkpoint (started from a base checkpoint): every adapter exported as it is
// stored, under its PEFT name, and the base named by path.
TEST(PeftExport, WritesTheCheckpointsAdapters) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("peft_export");
  {
    Trainer base(config("llama", kBase), (dir / "base").string(), MPI_COMM_SELF);
    base.run();
  }
  const std::string base_file = (dir / "base" / "checkpoints" / "step_00000002.h5").string();
  {
    Trainer lora(config("llama", testing::with(kBase, {"lora.rank=4", "lora.alpha=8", "lora.targets=[\"attn.q\", \"mlp.down\"]",
                                                       "checkpoint.init_from=" + base_file})),
                 (dir / "lora").string(), MPI_COMM_SELF);
    lora.run();
  }
  const std::string file = (dir / "lora" / "checkpoints" / "step_00000002.h5").string();
  CkptExportArgs args;
  args.file = file;
  args.out_dir = (dir / "adapter").string();
  args.adapters_only = true;
  std::ostringstream out;
  ASSERT_EQ(run_ckpt_export(args, out), 0);
  const Json json = read_json(dir / "adapter" / "adapter_config.json");
  EXPECT_EQ(json["base_model_name_or_path"], fs::absolute(base_file).lexically_normal().string());
  EXPECT_EQ(as_set(json["target_modules"]), (std::set<std::string>{"q_proj", "down_proj"}));
  EXPECT_EQ(json["r"], 4);
  const SafetensorsFile got((dir / "adapter" / "adapter_model.safetensors").string());
  CheckpointReader reader(file, MPI_COMM_SELF);
  const ModelConfig cfg = model_config_of(reader);
  EXPECT_EQ(got.tensors().size(), static_cast<size_t>(cfg.n_layer * 2 * 2));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const std::string hf = "base_model.model.model.layers." + std::to_string(l) + ".";
    for (const auto& [tessera, peft] : std::vector<std::pair<std::string, std::string>>{
             {"attn.q.lora_A", "self_attn.q_proj.lora_A"}, {"attn.q.lora_B", "self_attn.q_proj.lora_B"},
             {"mlp.down.lora_A", "mlp.down_proj.lora_A"}, {"mlp.down.lora_B", "mlp.down_proj.lora_B"}}) {
      const SafetensorsTensor* t = got.find(hf + peft + ".weight");
      ASSERT_NE(t, nullptr) << hf + peft;
      const std::vector<float> want = reader.read_all("/model/blocks." + std::to_string(l) + "." + tessera + ".weight");
      EXPECT_EQ(got.read_f32(*t), want) << hf + peft;
    }
  }
  // --base-model overrides the record; --merge-lora with it, and a checkpoint without adapters, are refused.
  args.base_model = "meta-llama/Llama-3.2-1B";
  args.out_dir = (dir / "adapter2").string();
  ASSERT_EQ(run_ckpt_export(args, out), 0);
  EXPECT_EQ(read_json(dir / "adapter2" / "adapter_config.json")["base_model_name_or_path"], "meta-llama/Llama-3.2-1B");
  args.merge_lora = true;
  EXPECT_TRUE(testing::throws_with([&] { run_ckpt_export(args, out); }, {"--adapters-only", "--merge-lora"}));
  CkptExportArgs plain;
  plain.file = base_file;
  plain.out_dir = (dir / "none").string();
  plain.adapters_only = true;
  EXPECT_TRUE(testing::throws_with([&] { run_ckpt_export(plain, out); }, {"--adapters-only", base_file, "no LoRA adapters"}));
  fs::remove_all(dir);
}

// GPT-2's q, k and v are one Conv1D (c_attn) in Hugging Face: their adapters have no PEFT name.
TEST(PeftExport, RefusesGpt2QkvAdaptersNamingMergeLora) {
  ModelConfig cfg = fixture_model("gpt2");
  cfg.lora.targets = {"attn.q", "attn.v"};
  EXPECT_TRUE(testing::throws_with([&] { peft_adapter_tensors(cfg, "run.h5", [](const std::string&) { return std::vector<float>{}; }); },
                                   {"run.h5", "attn.q", "c_attn", "--merge-lora"}));
  cfg.lora.targets = {"attn.proj"};
  EXPECT_EQ(peft_adapter_tensors(cfg, "run.h5", [](const std::string&) { return std::vector<float>{}; }).size(), 4u);
}

}  // namespace
}  // namespace tessera
