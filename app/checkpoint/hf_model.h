// The Hugging Face model conventions tessera maps to, in both directions: which HF tensor is which
// tessera parameter (one table per preset, used by the export as it is and by the import
// inverted), and config.json (written for a ModelConfig; read into one, refusing what tessera
// cannot represent). GPT2LMHeadModel for preset gpt2; LlamaForCausalLM (and MistralForCausalLM on
// import, the same tensors) for llama. docs/checkpoints.md has the tables.
#pragma once

#include <string>
#include <vector>

#include "data/json.h"
#include "model/config.h"

namespace tessera {

// One HF tensor: the tessera tensors `sources` (dataset paths, "/model/<name>") concatenated along
// dim 0, then transposed when `transpose` (2-D only: GPT-2's Conv1D stores weights (in, out)).
// The import splits it back: transpose, then cut along dim 0 at the sources' row counts.
struct HfTensor {
  std::string name;
  std::vector<std::string> sources;
  bool transpose = false;
};
// The mapping table for cfg's preset and head (lm_head.weight only when untied), in HF module
// order.
std::vector<HfTensor> hf_tensor_map(const ModelConfig& cfg);

// HF tensors that are buffers, not parameters, which the import skips: GPT-2's causal masks
// (h.L.attn.bias, h.L.attn.masked_bias) and LLaMA's rotary inverse frequencies
// (layers.L.self_attn.rotary_emb.inv_freq) that older checkpoints store. `name` is with the base
// model's prefix ("transformer." / "model.").
bool hf_ignored_buffer(const std::string& preset, const std::string& name);
// The base model's prefix of the architecture's tensor names: "transformer." (gpt2), "model."
// (llama). A folder saved from the base model (GPT2Model, LlamaModel) stores its names without it.
std::string hf_base_prefix(const std::string& preset);

// config.json for cfg (a complete JSON document); bos_token_id and eos_token_id = eos_id.
std::string hf_config_json(const ModelConfig& cfg, int32_t eos_id);

// A model described by a Hugging Face config.json, as tessera represents it.
struct HfModelConfig {
  std::string architecture;        // "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM"
  ModelConfig model;               // resolved
  std::vector<std::string> notes;  // what was adapted, e.g. max_seq_len capped at sliding_window
};
// Reads config.json (`source` names it in errors). Keys absent take transformers' defaults for the
// architecture (save_pretrained leaves out values equal to them). Refused, naming the key and
// source: another architecture or model_type; a quantization_config; GPT-2's activation_function
// other than the tanh GELU, scale_attn_weights = false, scale_attn_by_inverse_layer_idx,
// add_cross_attention; LLaMA's hidden_act other than silu, attention_bias, mlp_bias, a head_dim
// other than hidden_size / num_attention_heads, rope_scaling (or rope_parameters) of any type but
// "default"; sizes tessera refuses (model/config.h resolve). Mistral's sliding_window below
// max_position_embeddings caps max_seq_len at the window (within it full causal attention is the
// same), with a note.
HfModelConfig hf_model_config(const Json& config, const std::string& source);

}  // namespace tessera
