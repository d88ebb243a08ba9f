// A training layout as the planner chooses it: the parallel degrees and every option the trainer
// takes from [parallel], train.micro_batch, model.recompute and train.dtype; and the workload it is
// planned for (the model and the batch, from the config).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gpt.h"
#include "model/recompute_ops.h"
#include "parallel/pipeline_schedule.h"

namespace tessera::plan {

struct Layout {
  int64_t dp = 1, tp = 1, pp = 1, vpp = 1, cp = 1;
  bool sp = false;                  // parallel.sequence_parallel
  int64_t zero = 0;                 // parallel.zero
  PipelineKind schedule = PipelineKind::OneFOneB;  // parallel.pp_schedule (1f1b when pp = 1)
  bool cp_ring = true;              // parallel.cp_comm: "ring" or "allgather"
  int64_t micro_batch = 1;          // train.micro_batch
  Recompute recompute = Recompute::None;  // model.recompute: the blocks recompute_layers leaves
  int64_t recompute_layers = 0;     // model.recompute_layers: the first k blocks of each chunk recompute in full
  // model.recompute = "bubble" (recompute Full, pp > 1): the schedule's R actions run the
  // recomputation where the rank would wait (parallel/pipeline_schedule.h), not inside the backward.
  bool recompute_bubble = false;
  // model.recompute_ahead with "bubble": at most this many recomputed micro-batches held, each R
  // placed that far ahead of its B where the rank would wait (parallel/pipeline_schedule.h); 1
  // otherwise (R right before its B).
  int64_t recompute_ahead = 1;
  // Per-op recomputation (model/recompute_ops.h), with recompute = None: the ops block i of every
  // chunk recomputes, first block first; blocks past the end (and the first recompute_layers, which
  // recompute in full) none. Written as model.recompute_ops_layers (recompute_ops_layers below).
  std::vector<RecomputeOps> recompute_ops = {};
  bool bf16 = false;                // train.dtype

  int64_t ranks() const { return dp * tp * pp * cp; }
  bool operator==(const Layout&) const = default;
};

// "none", "selective", "full" (model.recompute's spelling).
const char* recompute_name(Recompute r);
// The layout's recomputation: recompute_name ("bubble" for recompute_bubble; "bubble+2a" with
// recompute_ahead 2), or "none+2f" (2 blocks a chunk in full, the rest none)
// when recompute_layers > 0; per-op recomputation adds a chunk's runs of op sets in block order,
// each set by its ops' letters (n norm, q qkv, a attn, i mlp_in, m mlp_act): "none+1f+3nim+2n" is
// per chunk 1 block in full, 3 recomputing norm+mlp_in+mlp_act, 2 norm, the rest none.
std::string recompute_text(const Layout& l);
// The ops of block `position` of a chunk (0: its first): recompute_ops' entry, none past its end or
// where the block recomputes in full (the first recompute_layers) or the policy is not None.
RecomputeOps chunk_block_ops(const Layout& l, int64_t position);
// model.recompute_ops_layers for the layout: one op-set name per layer of the model (n_layer, the
// chunks of `cut` as model/gpt.h StageSpec, the whole model when empty); empty when no block
// recomputes ops.
std::vector<std::string> recompute_ops_layers(const Layout& l, const std::vector<StageSpec>& cut, int64_t n_layer);
// "dp 8 tp 1 pp 1 cp 1 mb 4 1f1b none fp32"-style, every field, for messages and tests.
std::string describe(const Layout& l);

// What is trained: the resolved model (model/config.h resolve(), the data's vocabulary filled in),
// the sequence length and the global batch (sequences per optimizer step).
struct Workload {
  ModelConfig model;
  int64_t seq_len = 1024;
  int64_t global_batch = 32;
  // parallel.tp_comm_compression: the blocks' tp collectives move this fraction of their fp32 bytes,
  // forward (activations) and backward (gradients) (parallel/tp_compression.h tp_bytes_factor).
  double tp_bytes_forward = 1.0, tp_bytes_backward = 1.0;
  int64_t micro_batches(const Layout& l) const { return global_batch / (l.micro_batch * l.dp); }
};

}  // namespace tessera::plan
