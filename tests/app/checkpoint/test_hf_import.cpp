// Tests `tessera ckpt import` (app/checkpoint/hf_import.h) through the binary. Round trips: tiny
// GPT-2 and LLaMA models (each with the preset's head and the other one) trained a few steps,
// exported, imported: every tensor bit for bit, the same model config and loss, the same export
// again, `train` starting from it (checkpoint.init_from) with the original's losses, `generate` and
// `upscale` reading it. F16, BF16 and mixed files widened exactly (values rounded by the test's own
// writer); sharded folders; folders saved from the base model (no "transformer." prefix) with
// buffers; and every refusal, each naming the key and the file, with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/hf_export.h"
#include "app/checkpoint/safetensors.h"
#include "app/checkpoint/hf_import_testing.h"
#include "app/checkpoint/safetensors_testing.h"
#include "app/cli_testing.h"
#include "app/config.h"
#include "app/trainer.h"
#include "app/trainer_testing.h"
#include "data/json.h"
#include "kernels/allocator.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "mpi_testing.h"
#include "testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::float_tensor;
using testing::RawTensor;
using testing::RunResult;

RunResult tessera(const std::vector<std::string>& args, const fs::path& dir) { return testing::run_tessera(args, dir); }

// The tiny addition model of cli_testing.h as `name`: gpt2, llama, gpt2_untied, llama_tied.
std::vector<std::string> settings_of(const std::string& name) {
  const size_t us = name.find('_');
  std::vector<std::string> s = {"model.preset=\"" + name.substr(0, us) + "\"", "model.n_head=4", "train.steps=3",
                                "checkpoint.at_end=true"};
  if (us != std::string::npos) s.push_back("model.lm_head=\"" + name.substr(us + 1) + "\"");
  if (name.rfind("llama", 0) == 0) s.push_back("model.n_kv_head=2");
  return s;
}

Config tiny_config(const std::vector<std::string>& settings) {
  return parse_config_string(testing::kTinyConfig, "tiny.toml", settings);
}

// Trained 3 steps in this process and saved: the checkpoint.
fs::path train_tiny(const fs::path& dir, const std::string& name) {
  testing::test_world();
  {
    Trainer t(tiny_config(settings_of(name)), (dir / "run").string(), MPI_COMM_SELF);
    t.run();
  }
  const fs::path file = dir / "run" / "checkpoints" / "step_00000003.h5";
  EXPECT_TRUE(fs::exists(file)) << file;
  return file;
}

// Every /model tensor's bytes, by path.
std::map<std::string, std::vector<float>> model_tensors(const fs::path& file) {
  const CheckpointReader r(file.string(), MPI_COMM_SELF);
  std::map<std::string, std::vector<float>> out;
  for (const TensorInfo& t : r.tensors())
    if (t.path.rfind("/model/", 0) == 0) out[t.path] = r.read_all(t.path);
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const auto ta = model_tensors(a), tb = model_tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [path, values] : ta) {
    ASSERT_TRUE(tb.count(path)) << path << " missing from " << b;
    EXPECT_TRUE(bitwise_equal(values, tb.at(path))) << path;
  }
}

// The mean loss of the checkpoint's model predicting ids[1:] from ids[:-1], its weights loaded as
// `generate` does.
double loss_of(const fs::path& file, const std::vector<int32_t>& ids) { return testing::forward_checkpoint(file, ids).loss; }

const std::vector<int32_t> kIds = {3, 10, 4, 11, 7, 12, 1, 2, 10, 5, 11, 9, 0, 6};

// The same loss computed from the Hugging Face folder by tests/reference/hf_forward.py (numpy,
// float64, transformers' definitions of the models and their tensor names); nothing when
// /usr/bin/python3 with numpy is not there.
std::optional<double> reference_loss(const fs::path& folder, const std::vector<int32_t>& ids, const fs::path& dir) {
  if (!fs::exists("/usr/bin/python3") || testing::run_program("/usr/bin/python3", {"-c", "import numpy"}, dir).exit_code != 0)
    return std::nullopt;
  std::string list;
  for (const int32_t i : ids) list += (list.empty() ? "" : ",") + std::to_string(i);
  const RunResult r = testing::run_program(
      "/usr/bin/python3", {std::string(TESSERA_TEST_DATA_DIR) + "/hf_forward.py", folder.string(), list}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? std::optional<double>(std::stod(r.output)) : std::nullopt;
}

// tessera's float32 loss against the float64 reference: within 1e-5 relative, the float32 rounding
// of these few-dimensional sums (the bound for logits).
void expect_reference_loss(const fs::path& imported, const fs::path& folder, const std::vector<int32_t>& ids,
                           const fs::path& dir) {
  const std::optional<double> want = reference_loss(folder, ids, dir);
  if (!want) {
    std::cout << "[  NOTE    ] /usr/bin/python3 with numpy not found: the independent loss check is skipped\n";
    return;
  }
  const double got = loss_of(imported, ids);
  EXPECT_NEAR(got, *want, 1e-5 * std::abs(*want)) << imported;
}

// The F32 tensors of an exported model.safetensors, in file order.
std::vector<RawTensor> load_hf(const fs::path& file) {
  const SafetensorsFile f(file.string());
  std::vector<RawTensor> out;
  for (const SafetensorsTensor& t : f.tensors()) {
    EXPECT_EQ(t.dtype, "F32");
    const std::vector<float> v = f.read_f32(t);
    out.push_back({t.name, "F32", t.shape, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)});
  }
  return out;
}

std::vector<float> values_of(const RawTensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

// A copy of an exported folder, to change.
fs::path copy_folder(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

void edit_config(const fs::path& dir, const std::function<void(Json&)>& edit) {
  Json j = read_json_file((dir / "config.json").string());
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

// ---- round trips ----

class HfImportRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(HfImportRoundTrip, ExportThenImportGivesTheSameModelBitForBit) {
  const fs::path dir = testing::temp_dir("hf_import_" + GetParam());
  const fs::path original = train_tiny(dir, GetParam());
  RunResult r = tessera({"ckpt", "export", original.string(), "--out", (dir / "hf").string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path imported = dir / "imported.h5";
  r = tessera({"ckpt", "import", (dir / "hf").string(), "--out", imported.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string arch = GetParam().rfind("gpt2", 0) == 0 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
  EXPECT_NE(r.output.find("imported " + (dir / "hf").string() + " (" + arch + ", 1 safetensors file"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("tokenizer: addition"), std::string::npos) << r.output;

  // The same tensors, model and loss.
  expect_same_tensors(original, imported);
  {
    const CheckpointReader a(original.string(), MPI_COMM_SELF), b(imported.string(), MPI_COMM_SELF);
    EXPECT_EQ(model_config_of(a), model_config_of(b));
    EXPECT_EQ(b.meta().step, 0);
    for (const TensorInfo& t : b.tensors()) EXPECT_EQ(t.path.rfind("/model/", 0), 0u) << t.path << ": model tensors only";
    EXPECT_EQ(std::get<std::string>(b.group_attributes().at("/import").at("architecture")), arch);
  }
  EXPECT_EQ(loss_of(original, kIds), loss_of(imported, kIds));
  expect_reference_loss(imported, dir / "hf", kIds, dir);

  // Exported again: the same files.
  r = tessera({"ckpt", "export", imported.string(), "--out", (dir / "hf2").string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json", "vocab.json", "merges.txt",
                        "tokenizer_config.json"})
    EXPECT_EQ(testing::read_file(dir / "hf" / f), testing::read_file(dir / "hf2" / f)) << f;

  // generate reads it as it read the original; upscale grows it.
  const std::vector<std::string> gen = {"--prompt", "3+4=", "--max-tokens", "4"};
  auto generated = [&](const fs::path& ckpt) {
    std::vector<std::string> a = {"generate", "--ckpt", ckpt.string()};
    a.insert(a.end(), gen.begin(), gen.end());
    const RunResult g = tessera(a, dir);
    EXPECT_EQ(g.exit_code, 0) << g.output;
    return g.output.substr(0, g.output.find('\n'));
  };
  EXPECT_EQ(generated(imported), generated(original));
  r = tessera({"upscale", "--from", imported.string(), "--method", "stack", "--out", (dir / "up.h5").string()}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // train starts from it as from the original: the same losses, step for step.
  auto losses_from = [&](const fs::path& file) {
    std::vector<std::string> s = settings_of(GetParam());
    s.push_back("checkpoint.init_from=\"" + file.string() + "\"");
    return testing::train(tiny_config(s), MPI_COMM_NULL).losses;
  };
  EXPECT_EQ(losses_from(imported), losses_from(original));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, HfImportRoundTrip, ::testing::Values("gpt2", "llama", "gpt2_untied", "llama_tied"));

// An exported tiny model per test suite: its folder and checkpoint.
struct Exported {
  fs::path dir, original, hf;
};
Exported export_tiny(const std::string& name) {
  Exported e;
  e.dir = testing::temp_dir("hf_import_fixture_" + name);
  e.original = train_tiny(e.dir, name);
  e.hf = e.dir / "hf";
  const RunResult r = tessera({"ckpt", "export", e.original.string(), "--out", e.hf.string()}, e.dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return e;
}

// The import of `folder` into dir/<out>: the result and the file.
RunResult import(const fs::path& folder, const fs::path& out, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"ckpt", "import", folder.string(), "--out", out.string()};
  a.insert(a.end(), extra.begin(), extra.end());
  return tessera(a, out.parent_path());
}

// Each tensor of `hf` stored as dtypes[i % n]; the import equals the widened values bit for bit
// (checked through the export, whose F32 file then holds exactly those values under the same names).
void expect_widened_exactly(const Exported& e, const std::vector<std::string>& dtypes, const std::string& tag) {
  const fs::path folder = copy_folder(e.hf, e.dir / ("hf_" + tag));
  std::vector<RawTensor> tensors = load_hf(folder / "model.safetensors");
  std::map<std::string, std::vector<float>> want;
  for (size_t i = 0; i < tensors.size(); ++i) {
    RawTensor& t = tensors[i];
    t = float_tensor(t.name, dtypes[i % dtypes.size()], t.shape, values_of(t), &want[t.name]);
  }
  testing::write_binary((folder / "model.safetensors").string(), testing::safetensors_bytes(tensors));
  const fs::path out = e.dir / (tag + ".h5");
  RunResult r = import(folder, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& d : dtypes) EXPECT_NE(r.output.find(d), std::string::npos) << r.output;
  expect_reference_loss(out, folder, kIds, e.dir);
  r = tessera({"ckpt", "export", out.string(), "--out", (e.dir / ("back_" + tag)).string()}, e.dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<RawTensor> back = load_hf(e.dir / ("back_" + tag) / "model.safetensors");
  ASSERT_EQ(back.size(), want.size());
  std::map<std::string, std::vector<float>> f32;
  for (const RawTensor& t : load_hf(e.hf / "model.safetensors")) f32[t.name] = values_of(t);
  int narrowed = 0;  // tensors whose 16-bit values differ from the float32 ones (so the test shows something)
  for (const RawTensor& t : back) {
    EXPECT_TRUE(bitwise_equal(values_of(t), want.at(t.name))) << tag << ": " << t.name;
    narrowed += !bitwise_equal(values_of(t), f32.at(t.name));
  }
  EXPECT_GT(narrowed, 0) << tag;
}

TEST(HfImport, HalfPrecisionFilesWidenExactly) {
  for (const std::string name : {"gpt2", "llama"}) {
    const Exported e = export_tiny(name);
    expect_widened_exactly(e, {"F16"}, name + "_f16");
    expect_widened_exactly(e, {"BF16"}, name + "_bf16");
    expect_widened_exactly(e, {"F32", "F16", "BF16"}, name + "_mixed");
    fs::remove_all(e.dir);
  }
}

TEST(HfImport, AShardedFolderImportsAsOne) {
  const Exported e = export_tiny("llama");
  const fs::path folder = copy_folder(e.hf, e.dir / "sharded");
  const std::vector<RawTensor> tensors = load_hf(folder / "model.safetensors");
  fs::remove(folder / "model.safetensors");
  // Three shards, the tensors dealt round-robin (an index may put any tensor in any shard).
  std::vector<std::vector<RawTensor>> shards(3);
  Json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", Json::object()}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string file = "model-0000" + std::to_string(i % 3 + 1) + "-of-00003.safetensors";
    shards[i % 3].push_back(tensors[i]);
    index["weight_map"][tensors[i].name] = file;
  }
  for (size_t s = 0; s < 3; ++s)
    testing::write_binary((folder / ("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors")).string(),
                          testing::safetensors_bytes(shards[s]));
  std::ofstream(folder / "model.safetensors.index.json") << index.dump(2);
  const fs::path out = e.dir / "sharded.h5";
  RunResult r = import(folder, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 safetensors files"), std::string::npos) << r.output;
  expect_same_tensors(e.original, out);
  expect_reference_loss(out, folder, kIds, e.dir);

  // A shard missing: refused naming it, nothing written.
  fs::remove(folder / "model-00002-of-00003.safetensors");
  const fs::path out2 = e.dir / "sharded2.h5";
  r = import(folder, out2);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("model-00002-of-00003.safetensors, which is missing from " + folder.string()), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out2));
  fs::remove_all(e.dir);
}

TEST(HfImport, BaseModelNamesBuffersAndAStoredTiedHeadAreAccepted) {
  // GPT-2 saved as transformers' original checkpoints are: names without "transformer.", the
  // causal-mask buffers h.L.attn.bias and h.L.attn.masked_bias, and lm_head.weight = wte.
  const Exported g = export_tiny("gpt2");
  fs::path folder = copy_folder(g.hf, g.dir / "base");
  std::vector<RawTensor> tensors = load_hf(folder / "model.safetensors");
  RawTensor wte;
  for (RawTensor& t : tensors) {
    t.name = t.name.substr(std::string("transformer.").size());
    if (t.name == "wte.weight") wte = t;
  }
  for (int l = 0; l < 2; ++l) {
    tensors.push_back(float_tensor("h." + std::to_string(l) + ".attn.bias", "F32", {1, 1, 24, 24}, std::vector<float>(576, 1.0f)));
    tensors.push_back(float_tensor("h." + std::to_string(l) + ".attn.masked_bias", "F32", {}, {-1e4f}));
  }
  tensors.push_back({"lm_head.weight", "F32", wte.shape, wte.bytes});
  testing::write_binary((folder / "model.safetensors").string(), testing::safetensors_bytes(tensors));
  RunResult r = import(folder, g.dir / "base.h5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipped 5 buffer(s) and tied copies"), std::string::npos) << r.output;
  expect_same_tensors(g.original, g.dir / "base.h5");

  // The same lm_head but different: transformers would ignore it, so the config must be wrong.
  float* first = reinterpret_cast<float*>(tensors.back().bytes.data());
  *first += 1.0f;
  testing::write_binary((folder / "model.safetensors").string(), testing::safetensors_bytes(tensors));
  r = import(folder, g.dir / "base2.h5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("says tie_word_embeddings = true, but lm_head.weight in " + (folder / "model.safetensors").string() +
                          " differs from wte.weight"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(g.dir / "base2.h5"));

  // LLaMA with the rotary frequencies older checkpoints store.
  const Exported l = export_tiny("llama");
  folder = copy_folder(l.hf, l.dir / "inv_freq");
  tensors = load_hf(folder / "model.safetensors");
  tensors.push_back(float_tensor("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {4}, {1, 0.1f, 0.01f, 0.001f}));
  testing::write_binary((folder / "model.safetensors").string(), testing::safetensors_bytes(tensors));
  r = import(folder, l.dir / "inv_freq.h5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(l.original, l.dir / "inv_freq.h5");
  fs::remove_all(g.dir);
  fs::remove_all(l.dir);
}

// A LLaMA-shaped folder made here as transformers would save one (BF16 weights, GPT-2's vocabulary
// as vocab.json re-serialized in another layout, merges.txt with its "#version" line), not by
// tessera's export: the tokenizer is recognized as GPT-2's given --vocab, recorded, and `generate`
// decodes with it.
TEST(HfImport, AForeignLlamaOnGpt2TokensImportsAndGenerates) {
  testing::test_world();  // MPI for the checkpoint reader
  const fs::path dir = testing::temp_dir("hf_import_foreign");
  const fs::path folder = dir / "llama";
  fs::create_directories(folder);
  const std::string gpt2 = std::string(TESSERA_TEST_DATA_DIR) + "/gpt2";
  const int64_t V = 50257, C = 8, F = 16, KV = 4;  // 2 heads of 4, 1 key/value head
  std::ofstream(folder / "config.json") << Json{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                                                {"vocab_size", V}, {"hidden_size", C}, {"intermediate_size", F},
                                                {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                                                {"num_key_value_heads", 1}, {"max_position_embeddings", 64},
                                                {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                                                {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
                                                {"rope_scaling", nullptr}, {"attention_bias", false}}
                                               .dump(2);
  std::ofstream(folder / "vocab.json") << read_json_file(gpt2 + "/encoder.json").dump(2);
  std::string merges = testing::read_file(gpt2 + "/vocab.bpe");
  if (merges.rfind("#version", 0) != 0) merges = "#version: 0.2\n" + merges;
  std::ofstream(folder / "merges.txt") << merges;
  uint64_t state = 1;
  auto values = [&](int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      x = scale * (static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f);
    }
    return v;
  };
  const std::vector<RawTensor> tensors = {
      float_tensor("model.embed_tokens.weight", "BF16", {V, C}, values(V * C, 0.5f)),
      float_tensor("model.layers.0.input_layernorm.weight", "BF16", {C}, std::vector<float>(C, 1.0f)),
      float_tensor("model.layers.0.self_attn.q_proj.weight", "BF16", {C, C}, values(C * C, 0.6f)),
      float_tensor("model.layers.0.self_attn.k_proj.weight", "BF16", {KV, C}, values(KV * C, 0.6f)),
      float_tensor("model.layers.0.self_attn.v_proj.weight", "BF16", {KV, C}, values(KV * C, 0.6f)),
      float_tensor("model.layers.0.self_attn.o_proj.weight", "BF16", {C, C}, values(C * C, 0.6f)),
      float_tensor("model.layers.0.post_attention_layernorm.weight", "BF16", {C}, std::vector<float>(C, 1.0f)),
      float_tensor("model.layers.0.mlp.gate_proj.weight", "BF16", {F, C}, values(F * C, 0.6f)),
      float_tensor("model.layers.0.mlp.up_proj.weight", "BF16", {F, C}, values(F * C, 0.6f)),
      float_tensor("model.layers.0.mlp.down_proj.weight", "BF16", {C, F}, values(C * F, 0.4f)),
      float_tensor("model.norm.weight", "BF16", {C}, std::vector<float>(C, 1.0f)),
      float_tensor("lm_head.weight", "BF16", {V, C}, values(V * C, 0.5f)),
  };
  testing::write_binary((folder / "model.safetensors").string(), testing::safetensors_bytes(tensors));

  const fs::path out = dir / "llama.h5";
  RunResult r = tessera({"ckpt", "import", folder.string(), "--out", out.string(), "--vocab", gpt2}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("12 tensors in BF16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer: gpt2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("n_kv_head = 1"), std::string::npos) << r.output;
  {
    const CheckpointReader c(out.string(), MPI_COMM_SELF);
    const Config stored = parse_config_string(c.meta().config_toml, "stored");
    EXPECT_EQ(stored.data.tokenizer, "gpt2");
    EXPECT_EQ(stored.data.vocab_dir, gpt2);
    EXPECT_EQ(stored.model.max_seq_len, 64);
    // The embedding as BF16 stored it, widened.
    const std::vector<float> wte = c.read_all("/model/wte.weight");
    ASSERT_EQ(wte.size(), static_cast<size_t>(V * C));
    std::vector<uint16_t> bits(wte.size());
    std::memcpy(bits.data(), tensors[0].bytes.data(), tensors[0].bytes.size());
    for (size_t i = 0; i < wte.size(); ++i) ASSERT_EQ(wte[i], testing::from_bf16(bits[i])) << i;
  }
  expect_reference_loss(out, folder, {15496, 11, 995, 0, 383, 2068, 7586, 21831, 50256, 464}, dir);
  r = tessera({"generate", "--ckpt", out.string(), "--prompt", "Hello, world", "--max-tokens", "3"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("Hello, world", 0), 0u) << r.output;
  fs::remove_all(dir);
}

// Peak resident memory of `tessera args` (KiB), as /usr/bin/time measures it: a fresh process forks
// it, since a child of this test would inherit the test's own peak on Linux (ru_maxrss carries over
// exec from the parent's memory).
int64_t peak_kib_of(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> a = {"-f", "%M", "-o", (dir / "peak.txt").string(), TESSERA_BINARY};
  a.insert(a.end(), args.begin(), args.end());
  const RunResult r = testing::run_program("/usr/bin/time", a, dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return std::stoll(testing::read_file(dir / "peak.txt"));
}

// Tensor by tensor: importing a 124 MB (float32) model takes less than half of that above what a
// tiny model's import takes, where holding the model would take all of it (its largest tensor is 8 MB).
TEST(HfImport, StreamsTensorByTensor) {
  if (!fs::exists("/usr/bin/time")) GTEST_SKIP() << "/usr/bin/time (Debian's time) measures the peak memory";
  const Exported tiny = export_tiny("llama");
  const fs::path folder = tiny.dir / "big";
  fs::create_directories(folder);
  const int64_t V = 4096, C = 512, F = 1536, L = 8;
  std::ofstream(folder / "config.json") << Json{{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", V},
                                                {"hidden_size", C}, {"intermediate_size", F}, {"num_hidden_layers", L},
                                                {"num_attention_heads", 8}, {"max_position_embeddings", 64}}
                                               .dump();
  fs::copy_file(tiny.hf / "vocab.json", folder / "vocab.json");
  fs::copy_file(tiny.hf / "merges.txt", folder / "merges.txt");
  // Written tensor by tensor: this process's own peak memory is where the imports' measures start.
  std::vector<RawTensor> heads = {{"model.embed_tokens.weight", "BF16", {V, C}, {}}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm"}) heads.push_back({b + n + ".weight", "BF16", {C}, {}});
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) heads.push_back({b + "self_attn." + n + ".weight", "BF16", {C, C}, {}});
    for (const char* n : {"gate_proj", "up_proj"}) heads.push_back({b + "mlp." + n + ".weight", "BF16", {F, C}, {}});
    heads.push_back({b + "mlp.down_proj.weight", "BF16", {C, F}, {}});
  }
  heads.push_back({"model.norm.weight", "BF16", {C}, {}});
  heads.push_back({"lm_head.weight", "BF16", {V, C}, {}});
  int64_t numel = 0;
  testing::write_safetensors_streamed((folder / "model.safetensors").string(), heads, [&](size_t i) {
    const std::vector<int64_t>& shape = heads[i].shape;
    const int64_t n = shape.size() == 1 ? shape[0] : shape[0] * shape[1];
    numel += n;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) v[static_cast<size_t>(k)] = 0.01f * static_cast<float>((k * 7919) % 201 - 100);
    return float_tensor(heads[i].name, "BF16", shape, v).bytes;
  });

  const int64_t small = peak_kib_of({"ckpt", "import", tiny.hf.string(), "--out", (tiny.dir / "small.h5").string()}, tiny.dir);
  const int64_t big = peak_kib_of({"ckpt", "import", folder.string(), "--out", (tiny.dir / "big.h5").string()}, tiny.dir);
  const int64_t model_kib = numel * 4 / 1024;
  EXPECT_LT(big - small, model_kib / 2) << "peak " << big << " KiB against " << small << " KiB for a tiny model; the model is "
                                         << model_kib << " KiB";
  const CheckpointReader r((tiny.dir / "big.h5").string(), MPI_COMM_SELF);
  EXPECT_EQ(r.shape("/model/blocks.7.mlp.down.weight"), (Shape{C, F}));
  fs::remove_all(tiny.dir);
}

// ---- refusals ----

class HfImportRefuses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gpt2_ = new Exported(export_tiny("gpt2"));
    llama_ = new Exported(export_tiny("llama"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(gpt2_->dir);
    fs::remove_all(llama_->dir);
    delete gpt2_;
    delete llama_;
  }
  // A copy of the model's folder changed by `change`; imported, it fails with every one of
  // `parts` in the message and leaves no file.
  void expect_refused(const Exported& e, const std::string& tag, const std::function<void(const fs::path&)>& change,
                      const std::vector<std::string>& parts, const std::vector<std::string>& extra = {}) {
    const fs::path folder = copy_folder(e.hf, e.dir / ("bad_" + tag));
    change(folder);
    const fs::path out = e.dir / (tag + ".h5");
    const RunResult r = import(folder, out, extra);
    EXPECT_EQ(r.exit_code, 1) << tag << "\n" << r.output;
    for (std::string p : parts) {
      for (size_t at; (at = p.find("{DIR}")) != std::string::npos;) p.replace(at, 5, folder.string());
      EXPECT_NE(r.output.find(p), std::string::npos) << tag << ": no \"" << p << "\" in\n" << r.output;
    }
    EXPECT_FALSE(fs::exists(out)) << tag;
    for (const auto& f : fs::directory_iterator(e.dir))
      EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
  }
  // Rewrites model.safetensors with `change` applied to its tensors.
  static std::function<void(const fs::path&)> tensors_changed(const std::function<void(std::vector<RawTensor>&)>& change) {
    return [change](const fs::path& folder) {
      std::vector<RawTensor> t = load_hf(folder / "model.safetensors");
      change(t);
      testing::write_binary((folder / "model.safetensors").string(), testing::safetensors_bytes(t));
    };
  }
  static std::function<void(const fs::path&)> config_changed(const std::function<void(Json&)>& change) {
    return [change](const fs::path& folder) { edit_config(folder, change); };
  }
  static RawTensor* find(std::vector<RawTensor>& ts, const std::string& name) {
    for (RawTensor& t : ts)
      if (t.name == name) return &t;
    ADD_FAILURE() << "no " << name;
    return &ts[0];
  }
  static Exported* gpt2_;
  static Exported* llama_;
};
Exported* HfImportRefuses::gpt2_ = nullptr;
Exported* HfImportRefuses::llama_ = nullptr;

TEST_F(HfImportRefuses, MissingUnknownOrMisshapenTensors) {
  const std::string file = "{DIR}/model.safetensors";
  expect_refused(*gpt2_, "missing", tensors_changed([](std::vector<RawTensor>& t) {
                   t.erase(t.begin() + 5);  // transformer.h.0.attn.c_attn.bias, say
                 }),
                 {"ckpt import: {DIR} does not hold the GPT2LMHeadModel that {DIR}/config.json describes (1 problem; " + file + ")",
                  "missing transformer.h.0."});
  expect_refused(*gpt2_, "unknown", tensors_changed([](std::vector<RawTensor>& t) {
                   t.push_back(float_tensor("transformer.h.0.attn.c_attn.lora_A", "F32", {2}, {1, 2}));
                 }),
                 {"1 tensor(s) that GPT2LMHeadModel with this config.json does not have:",
                  "transformer.h.0.attn.c_attn.lora_A (2) in " + file});
  expect_refused(*llama_, "shape", tensors_changed([](std::vector<RawTensor>& t) {
                   RawTensor* n = find(t, "model.norm.weight");
                   n->shape = {16};
                   n->bytes.resize(64);
                 }),
                 {"model.norm.weight is (16) in " + file + ", expected (32)"});
  expect_refused(*llama_, "no_head", tensors_changed([](std::vector<RawTensor>& t) {
                   t.erase(std::remove_if(t.begin(), t.end(), [](const RawTensor& x) { return x.name == "lm_head.weight"; }), t.end());
                 }),
                 {"missing lm_head.weight (13, 32)"});
  // The config's sizes decide the shapes: a config that says 3 layers misses a layer's tensors.
  expect_refused(*llama_, "layers", config_changed([](Json& j) { j["num_hidden_layers"] = 3; }),
                 {"9 problems", "missing model.layers.2.input_layernorm.weight (32)"});
}

TEST_F(HfImportRefuses, QuantizedModels) {
  // An int8 weight with its scale (as compressed checkpoints store them).
  expect_refused(*llama_, "int8", tensors_changed([](std::vector<RawTensor>& t) {
                   RawTensor* q = find(t, "model.layers.0.self_attn.q_proj.weight");
                   q->dtype = "I8";
                   q->bytes.resize(q->bytes.size() / 4);
                   t.push_back(float_tensor("model.layers.0.self_attn.q_proj.weight_scale", "F32", {1}, {0.01f}));
                 }),
                 {"model.layers.0.self_attn.q_proj.weight is I8 in {DIR}/model.safetensors: tessera reads F32, F16 "
                  "and BF16 weights (a quantized model? import its unquantized release)",
                  "(a quantized model's: tessera imports unquantized weights)"});
  expect_refused(*llama_, "gptq", config_changed([](Json& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; }),
                 {"{DIR}/config.json: \"quantization_config\" is set: tessera imports unquantized models only"});
}

TEST_F(HfImportRefuses, ArchitecturesAndOptionsTesseraLacks) {
  expect_refused(*llama_, "qwen", config_changed([](Json& j) {
                   j["architectures"] = {"Qwen2ForCausalLM"};
                   j["model_type"] = "qwen2";
                 }),
                 {"{DIR}/config.json: \"architectures\": [\"Qwen2ForCausalLM\"] is not supported"});
  expect_refused(*llama_, "bias", config_changed([](Json& j) { j["attention_bias"] = true; }),
                 {"{DIR}/config.json: \"attention_bias\": true is not supported: tessera's llama attention has no biases"});
  expect_refused(*llama_, "rope", config_changed([](Json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; }),
                 {"\"rope_scaling\" has rope_type \"llama3\", which tessera does not implement"});
  expect_refused(*gpt2_, "gelu", config_changed([](Json& j) { j["activation_function"] = "gelu"; }),
                 {"\"activation_function\": \"gelu\" is not supported"});
  expect_refused(*gpt2_, "no_config", [](const fs::path& f) { fs::remove(f / "config.json"); },
                 {"ckpt import: {DIR} has no config.json"});
  expect_refused(*gpt2_, "bad_json", [](const fs::path& f) { std::ofstream(f / "config.json") << "{\"n_layer\": 2,"; },
                 {"{DIR}/config.json: malformed JSON"});
  expect_refused(*gpt2_, "no_weights", [](const fs::path& f) { fs::remove(f / "model.safetensors"); },
                 {"{DIR} has neither model.safetensors nor model.safetensors.index.json"});
  expect_refused(*gpt2_, "truncated", [](const fs::path& f) {
                   fs::resize_file(f / "model.safetensors", fs::file_size(f / "model.safetensors") - 100);
                 },
                 {"{DIR}/model.safetensors: tensor \"", "(truncated?)"});
}

TEST_F(HfImportRefuses, NonFiniteWeightsUnlessAllowed) {
  auto nan = tensors_changed([](std::vector<RawTensor>& t) {
    float* v = reinterpret_cast<float*>(find(t, "transformer.h.1.mlp.c_fc.weight")->bytes.data());
    v[3] = NAN;
  });
  expect_refused(*gpt2_, "nan", nan,
                 {"ckpt import: transformer.h.1.mlp.c_fc.weight in {DIR}/model.safetensors holds 1 NaN or inf value(s) "
                  "(/model/blocks.1.mlp.fc.weight)",
                  "--allow-non-finite"});
  const fs::path folder = copy_folder(gpt2_->hf, gpt2_->dir / "nan_allowed");
  nan(folder);
  const RunResult r = import(folder, gpt2_->dir / "nan_allowed.h5", {"--allow-non-finite"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(HfImportRefuses, ATokenizerItCannotName) {
  auto other_vocab = [](const fs::path& f) {
    Json v = read_json_file((f / "vocab.json").string());
    v["extra"] = 13;
    std::ofstream(f / "vocab.json") << v.dump();
  };
  expect_refused(*gpt2_, "tokenizer", other_vocab,
                 {"ckpt import: cannot tell which of tessera's tokenizers {DIR}'s model uses: its vocab.json and "
                  "merges.txt are not those of the addition task's characters, the byte tokenizer",
                  "Pass --tokenizer gpt2, byte or addition"});
  expect_refused(*gpt2_, "tokenizer_json", [](const fs::path& f) {
                   fs::remove(f / "vocab.json");
                   std::ofstream(f / "tokenizer.json") << "{}";
                 },
                 {"{DIR}/tokenizer.json: no \"model\" key"});  // a tokenizer.json is read first
  // Named: the byte tokenizer's 257 ids do not fit a 13-token vocabulary; the addition one does.
  expect_refused(*gpt2_, "byte", other_vocab,
                 {"ckpt import: the model's vocabulary (13, config.json's vocab_size) is smaller than the byte "
                  "tokenizer's (257)"},
                 {"--tokenizer", "byte"});
  const fs::path folder = copy_folder(gpt2_->hf, gpt2_->dir / "named");
  other_vocab(folder);
  RunResult r = import(folder, gpt2_->dir / "named.h5", {"--tokenizer", "addition"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // An existing output is never overwritten.
  r = import(gpt2_->hf, gpt2_->dir / "named.h5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

}  // namespace
}  // namespace tessera
