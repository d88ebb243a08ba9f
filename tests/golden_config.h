// The model shape a golden fixture stores as attributes of its preset's group (golden.h5,
// lora_golden.h5, sft_golden.h5: written by tests/reference/gpt_reference.py's callers).
#pragma once

#include <string>

#include "h5_reader.h"
#include "model/config.h"

namespace tessera::testing {

inline ModelConfig golden_model_config(const H5Reader& f, const std::string& group) {
  ModelConfig c;
  c.preset = f.attr_string(group, "preset");
  c.vocab_size = f.attr_int(group, "vocab_size");
  c.n_layer = f.attr_int(group, "n_layer");
  c.n_head = f.attr_int(group, "n_head");
  c.n_kv_head = f.attr_int(group, "n_kv_head");
  c.n_embd = f.attr_int(group, "n_embd");
  c.ffn_hidden = f.attr_int(group, "ffn_hidden");
  c.max_seq_len = f.attr_int(group, "max_seq_len");
  c.norm_eps = f.attr_double(group, "norm_eps");
  c.rope_theta = f.attr_double(group, "rope_theta");
  return c;
}

}  // namespace tessera::testing
