// Tests app/checkpoint/hf_model.h: config.json written for every preset and head and read back to
// the same model; Hugging Face's published configs (GPT-2, LLaMA-2 7B, Mistral 7B v0.1 and v0.3,
// a LLaMA-3 with its rope_scaling) read as transformers would, absent keys taking transformers'
// class defaults; every option tessera cannot represent refused naming the key and the file; and
// the name tables (lm_head only when untied, buffers, prefixes).
#include "app/checkpoint/hf_model.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "error_testing.h"

namespace tessera {
namespace {

using testing::error_of;
using testing::throws_with;

const std::string kSrc = "hf/config.json";

HfModelConfig read(const std::string& text) { return hf_model_config(parse_json(text, kSrc), kSrc); }
std::string refusal(const std::string& text) {
  return error_of([&] { read(text); });
}

ModelConfig tiny(const std::string& preset, const std::string& lm_head) {
  ModelConfig c;
  c.preset = preset;
  c.lm_head = lm_head;
  c.vocab_size = 40;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = preset == "llama" ? 2 : 0;
  c.n_embd = 16;
  c.ffn_hidden = preset == "llama" ? 40 : 0;
  c.max_seq_len = 24;
  c.norm_eps = 1e-6;
  c.rope_theta = 500000.0;
  return resolve(c);
}

TEST(HfModelConfig, WhatTheExportWritesReadsBackAsTheSameModel) {
  for (const std::string preset : {"gpt2", "llama"})
    for (const std::string head : {"preset", "tied", "untied"}) {
      const ModelConfig want = tiny(preset, head);
      const HfModelConfig got = read(hf_config_json(want, 7));
      EXPECT_EQ(got.architecture, preset == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM");
      ModelConfig g = got.model;
      EXPECT_EQ(g.tied_embeddings, want.tied_embeddings) << preset << " " << head;
      g.lm_head = want.lm_head;  // read back as "tied" / "untied": the same head
      if (preset == "gpt2") g.rope_theta = want.rope_theta;  // not a GPT-2 option
      EXPECT_EQ(g, want) << preset << " " << head;
      EXPECT_TRUE(got.notes.empty());
    }
}

// openai-community/gpt2's config.json (its keys; task_specific_params shortened).
const char* kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

TEST(HfModelConfig, ReadsGpt2AndTakesTransformersDefaults) {
  const ModelConfig m = read(kGpt2).model;
  EXPECT_EQ(m.preset, "gpt2");
  EXPECT_EQ(m.vocab_size, 50257);
  EXPECT_EQ(m.n_layer, 12);
  EXPECT_EQ(m.n_head, 12);
  EXPECT_EQ(m.n_embd, 768);
  EXPECT_EQ(m.ffn_hidden, 3072);  // n_inner absent: 4 x n_embd
  EXPECT_EQ(m.max_seq_len, 1024);
  EXPECT_EQ(m.norm_eps, 1e-5);
  EXPECT_TRUE(m.tied_embeddings);
  // save_pretrained leaves out values equal to GPT2Config's defaults: the same model.
  const ModelConfig d = read(R"({"model_type": "gpt2"})").model;
  EXPECT_EQ(d, m);
  EXPECT_EQ(read(R"({"model_type": "gpt2", "n_inner": null, "tie_word_embeddings": false})").model.lm_head, "untied");
  EXPECT_EQ(read(R"({"model_type": "gpt2", "activation_function": "gelu_pytorch_tanh"})").model, m);
}

// meta-llama/Llama-2-7b-hf's config.json.
const char* kLlama2 = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
  "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

// mistralai/Mistral-7B-v0.1's config.json.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

TEST(HfModelConfig, ReadsLlamaAndMistral) {
  const HfModelConfig l = read(kLlama2);
  EXPECT_EQ(l.model.preset, "llama");
  EXPECT_EQ(l.model.n_embd, 4096);
  EXPECT_EQ(l.model.ffn_hidden, 11008);
  EXPECT_EQ(l.model.kv_heads(), 32);
  EXPECT_EQ(l.model.max_seq_len, 4096);
  EXPECT_EQ(l.model.norm_eps, 1e-5);
  EXPECT_EQ(l.model.rope_theta, 10000.0);
  EXPECT_FALSE(l.model.tied_embeddings);

  // Mistral v0.1: sliding-window attention over 4096 tokens, which is full attention up to 4096.
  const HfModelConfig m = read(kMistral);
  EXPECT_EQ(m.architecture, "MistralForCausalLM");
  EXPECT_EQ(m.model.preset, "llama");
  EXPECT_EQ(m.model.kv_heads(), 8);
  EXPECT_EQ(m.model.ffn_hidden, 14336);
  EXPECT_EQ(m.model.max_seq_len, 4096);
  ASSERT_EQ(m.notes.size(), 1u);
  EXPECT_NE(m.notes[0].find("sliding_window"), std::string::npos) << m.notes[0];
  // v0.2 and later: no window.
  std::string v3 = kMistral;
  v3.replace(v3.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  EXPECT_EQ(read(v3).model.max_seq_len, 32768);
  EXPECT_TRUE(read(v3).notes.empty());
  // MistralConfig's defaults when keys are absent: 8 kv heads and a 4096 window.
  const HfModelConfig md = read(R"({"model_type": "mistral", "num_hidden_layers": 2})");
  EXPECT_EQ(md.model.kv_heads(), 8);
  EXPECT_EQ(md.model.max_seq_len, 4096);
  // LlamaConfig's: num_key_value_heads absent or null is num_attention_heads.
  EXPECT_EQ(read(R"({"model_type": "llama", "num_key_value_heads": null})").model.kv_heads(), 32);
  EXPECT_EQ(read(R"({"model_type": "llama"})").model.max_seq_len, 2048);
}

TEST(HfModelConfig, RopeParametersOfTheDefaultKindAreRead) {
  const std::string base = R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "tie_word_embeddings": true, )";
  EXPECT_EQ(read(base + R"("rope_theta": 500000.0})").model.rope_theta, 500000.0);
  EXPECT_EQ(read(base + R"("rope_scaling": {"rope_type": "default"}})").model.rope_theta, 10000.0);
  // transformers 5 writes rope_parameters.
  const ModelConfig m = read(base + R"("rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})").model;
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(read(base + R"("head_dim": 16})").model.head_dim(), 16);
}

TEST(HfModelConfig, RefusesWhatTesseraCannotRepresentNamingTheKey) {
  const std::string llama = R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, )";
  struct Case {
    std::string config, message;
  };
  const std::vector<Case> cases = {
      {R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"})",
       kSrc + ": \"architectures\": [\"Qwen2ForCausalLM\"] is not supported: tessera imports GPT2LMHeadModel, "
              "LlamaForCausalLM and MistralForCausalLM"},
      {R"({"model_type": "bert"})", kSrc + ": no \"architectures\", and \"model_type\": \"bert\" is not one tessera imports"},
      {R"({"architectures": ["LlamaForCausalLM"], "model_type": "mistral"})",
       kSrc + ": \"model_type\": \"mistral\" does not match LlamaForCausalLM (expected \"llama\")"},
      {R"({"architectures": ["LlamaForCausalLM", "LlamaModel"]})", kSrc + ": \"architectures\" must list one architecture"},
      {llama + R"("quantization_config": {"quant_method": "gptq", "bits": 4}})",
       kSrc + ": \"quantization_config\" is set: tessera imports unquantized models only"},
      {llama + R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
       kSrc + ": \"rope_scaling\" has rope_type \"llama3\", which tessera does not implement"},
      {llama + R"("rope_scaling": {"type": "linear", "factor": 2.0}})", "\"rope_scaling\" has rope_type \"linear\""},
      {llama + R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})", "\"rope_parameters\" has rope_type \"yarn\""},
      {llama + R"("rope_scaling": 2})", kSrc + ": \"rope_scaling\" is an integer, expected an object"},
      {llama + R"("attention_bias": true})", kSrc + ": \"attention_bias\": true is not supported: tessera's llama attention has no biases"},
      {llama + R"("mlp_bias": true})", kSrc + ": \"mlp_bias\": true is not supported"},
      {llama + R"("hidden_act": "gelu"})", kSrc + ": \"hidden_act\": \"gelu\" is not supported: tessera's llama MLP is SwiGLU (silu)"},
      {llama + R"("head_dim": 32})", kSrc + ": \"head_dim\": 32 is not supported: tessera's head dimension is hidden_size / num_attention_heads = 64 / 4"},
      {R"({"model_type": "gpt2", "activation_function": "gelu"})",
       kSrc + ": \"activation_function\": \"gelu\" is not supported: tessera's gpt2 uses the tanh GELU"},
      {R"({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true})",
       kSrc + ": \"scale_attn_by_inverse_layer_idx\": true is not supported"},
      {R"({"model_type": "gpt2", "scale_attn_weights": false})", kSrc + ": \"scale_attn_weights\": false is not supported"},
      {R"({"model_type": "gpt2", "add_cross_attention": true})", "\"add_cross_attention\": true is not supported"},
      {R"({"model_type": "gpt2", "n_layer": "12"})", kSrc + ": \"n_layer\" must be an integer, got a string"},
      {R"({"model_type": "gpt2", "n_embd": 100})",
       kSrc + " describes a model tessera cannot build: model.n_embd = 100 must be a positive multiple of model.n_head = 12"},
      {llama + R"("num_key_value_heads": 3})", kSrc + " describes a model tessera cannot build: model.n_kv_head = 3 must divide"},
      {"[1]", kSrc + " is an array, expected an object"},
  };
  for (const Case& c : cases) {
    const std::string got = refusal(c.config);
    EXPECT_NE(got.find(c.message), std::string::npos) << c.config << "\n  got: " << got;
  }
}

TEST(HfTensorMap, HasLmHeadOnlyWhenUntiedAndKnowsTheBuffers) {
  auto names = [](const ModelConfig& c) {
    std::vector<std::string> n;
    for (const HfTensor& t : hf_tensor_map(c)) n.push_back(t.name);
    return n;
  };
  auto has = [&](const ModelConfig& c, const std::string& name) {
    const auto n = names(c);
    return std::find(n.begin(), n.end(), name) != n.end();
  };
  EXPECT_FALSE(has(tiny("gpt2", "preset"), "lm_head.weight"));
  EXPECT_TRUE(has(tiny("gpt2", "untied"), "lm_head.weight"));
  EXPECT_TRUE(has(tiny("llama", "preset"), "lm_head.weight"));
  EXPECT_FALSE(has(tiny("llama", "tied"), "lm_head.weight"));
  EXPECT_EQ(names(tiny("gpt2", "preset")).size(), 2u + 12u * 3 + 2u);
  EXPECT_EQ(names(tiny("llama", "preset")).size(), 1u + 9u * 3 + 2u);
  EXPECT_TRUE(hf_ignored_buffer("gpt2", "transformer.h.11.attn.bias"));
  EXPECT_TRUE(hf_ignored_buffer("gpt2", "transformer.h.0.attn.masked_bias"));
  EXPECT_FALSE(hf_ignored_buffer("gpt2", "transformer.h.0.attn.c_attn.bias"));
  EXPECT_TRUE(hf_ignored_buffer("llama", "model.layers.3.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(hf_ignored_buffer("llama", "transformer.h.0.attn.bias"));
  EXPECT_EQ(hf_base_prefix("gpt2"), "transformer.");
  EXPECT_EQ(hf_base_prefix("llama"), "model.");
}

}  // namespace
}  // namespace tessera
