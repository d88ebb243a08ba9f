// A training layout as the planner chooses it: the parallel degrees and every option the trainer
// takes from [parallel], train.micro_batch, model.recompute and train.dtype; and the workload it is
// planned for (the model and the batch, from the config).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/gpt.h"
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
  bool bf16 = false;                // train.dtype

  int64_t ranks() const { return dp * tp * pp * cp; }
  bool operator==(const Layout&) const = default;
};

// "none", "selective", "full" (model.recompute's spelling).
const char* recompute_name(Recompute r);
// The layout's recomputation: recompute_name ("bubble" for recompute_bubble), or "none+2f" (2 blocks a chunk in full, the rest none)
// when recompute_layers > 0.
std::string recompute_text(const Layout& l);
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
