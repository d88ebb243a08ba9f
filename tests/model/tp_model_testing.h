// The tiny tensor-parallel GPT the multi-rank model tests share (test_gpt_tensor_parallel.cpp,
// test_gpt_tp_overlap.cpp): its config and a double-precision stage built on one shard layout.
#pragma once

#include <string>
#include <vector>

#include "model/gpt.h"
#include "testing.h"

namespace tessera::testing {

// vocab 37 (prime: every tp > 1 pads its vocabulary shard), 2 layers, 4 heads (llama: 2 KV heads,
// fewer than the ranks of tp 4), C 16, F 24.
inline ModelConfig tp_model_config(const std::string& preset, int64_t max_seq_len) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 37;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = preset == "llama" ? 2 : 0;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.max_seq_len = max_seq_len;
  c.init_std = 0.3;
  return c;
}

// One stage of cfg on `layout` (F64, every block recomputing as rc), initialised from seed 11.
struct TpModel {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  TpModel(const ModelConfig& cfg, ShardLayout layout, Recompute rc, TensorParallel tp, StageSpec stage = {})
      : ps(alloc, DType::F64, layout),
        gpt(cfg, ps, std::vector<Recompute>(static_cast<size_t>(cfg.n_layer), rc), tp, stage) {
    ps.finalize();
    ps.initialize(kCpu, 11);
  }
};

}  // namespace tessera::testing
