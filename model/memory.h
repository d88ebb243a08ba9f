// The memory one rank's model needs, counted from the architecture without allocating anything:
// its parameters (tensor-parallel shard), what a forward keeps for backward, and the temporaries
// of backward at their peak. The trainer checks a run against the available memory with it before
// it allocates (app/memory_check.h); the allocator's counts are the oracle (tests/model/test_memory.cpp).
// Every size is computed with checked arithmetic: one that does not fit in 64 bits throws.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/activation_compression.h"
#include "kernels/check.h"
#include "model/config.h"
#include "model/gpt.h"
#include "parallel/tp_compression.h"
#include "model/recompute_ops.h"

namespace tessera {

// A size that overflowed 64-bit arithmetic (the config asks for absurd sizes).
class SizeOverflow : public Error {
 public:
  using Error::Error;
};

// a x b and a + b for non-negative sizes; throw SizeOverflow instead of wrapping.
int64_t checked_mul(int64_t a, int64_t b);
int64_t checked_add(int64_t a, int64_t b);

// How one micro-batch runs on this rank.
struct ModelMemoryLayout {
  int64_t batch = 1;    // B: sequences per forward
  int64_t seq_len = 1;  // T
  int64_t tp = 1;       // tensor-parallel ranks sharing the model
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;  // the policy of the stage's blocks (model.recompute)
  // The part of the model this rank runs: the whole model, or one pipeline stage (a chunk of
  // model/stage_cut.h). A stage without the embedding reads its input from, and writes its input
  // gradient into, tensors its caller owns (the pipeline's received activations and gradients):
  // they are not counted here (app/memory_check.cpp adds them per micro-batch in flight).
  StageSpec stage = {};
  // The stage's first full_layers blocks (all of them when it has fewer) recompute fully whatever
  // `recompute` says (model.recompute_layers).
  int64_t full_layers = 0;
  // A stage without the head whose caller takes its output out of the context before backward and
  // keeps it beyond (the pipeline keeps what it sent until the step's transfers end): the backward
  // does not release it.
  bool output_kept = false;
  // Zero-bubble's split backward (parallel.pp_schedule = "zb-h1"): the backward is B alone, which
  // keeps copies of every Linear's input and output gradient for the micro-batch's W
  // (model/weight_grads.h); they stay allocated after B, in place of the context B released.
  bool split_backward = false;
  // kind = "vlm", a stage with the embedding: the images of the micro-batch (at most one per
  // sequence, so at most `batch`; the estimate of a run takes `batch`). The vision tower's
  // parameters are counted whatever this is; its activations and temporaries for these images
  // (the encoder keeps everything: model.recompute applies to the language model's blocks). The
  // patches (images, P, K) are the caller's (app/memory_check.cpp counts them).
  int64_t images = 0;
  // train.dtype = "bf16" (CPU mixed precision, kernels/cpu/matmul.cpp): each Linear rounds its fp32
  // input into workspace while its forward GEMM runs, and its output gradient and input while its
  // backward's weight-gradient GEMM runs (2 bytes an element, counted here as whole fp32 elements,
  // rounded up). Exact for the LM head, whose N x V output gradient dominates; within a block, the
  // largest Linear's rounding is added to the block's peak (an upper bound: the two need not meet).
  bool bf16 = false;
  // model.recompute = "bubble": the blocks that recompute fully do it ahead of the backward, in the
  // schedule's R action (Gpt::recompute), and keep every recomputed context until the backward:
  // ModelMemory::recompute_peak and ::recomputed count R, and backward_peak is then the backward
  // that finds the contexts there (it recomputes nothing).
  bool recompute_ahead = false;
  // model.activation_compression: one entry per layer of the whole model (the stage uses its own
  // layers'; model/compression_policy.h), empty for none. A compressing block (Recompute::None
  // only) keeps its normed inputs and its MLP's last input in compressed form
  // (kernels/activation_compression.h compressed_bytes, exact: F32 activations) and restores each
  // branch's just before its backward.
  std::vector<ActivationCompression> compression = {};
  // parallel.tp_comm_compression{,_forward}: with forward "int8-ef" (tp > 1) a fully recomputing
  // block keeps what each region's leaving collective received, for its re-run to replay
  // (parallel/tp_compression.h TpReceived, tp_replay_words a region): allocated at the region's
  // end in the forward (the reduce-scatter's staging alive), released when the block's backward ends.
  TpCompressionModes tp_compression = {};
  // model.recompute_ops: one entry per layer of the whole model (model/recompute_ops.h), empty for
  // none; applies to the blocks whose policy is Recompute::None (not the full_layers).
  std::vector<RecomputeOps> recompute_ops = {};
  // parallel.tp_overlap_chunks: > 1 under sequence parallelism (tp > 1) runs every block's region
  // edges chunk by chunk (parallel/tp_overlap.h; min(k, T / tp) chunks): the chunks' send and
  // receive buffers and partial sums, and each GEMM's rows of one chunk before they are placed,
  // replace the whole-sequence staging of k = 1, in the forward, the backward, and the per-op
  // recomputation of qkv and mlp_in (which re-gather chunk by chunk too). Ignored without
  // sequence parallelism.
  int64_t tp_overlap_chunks = 1;
  // parallel.cp > 1: each sequence's positions split over this many ranks (seq_len above is this
  // rank's share). Every block's attention runs parallel/context_attention.cpp, whose temporaries
  // (chunk-major copies of q and out, lse, the K/V buffers; backward also dout, dq and the dK/dV
  // partials) live inside the attention forward (beside ln1's output, q, k, v, out and lse) and
  // the attention backward (beside d(out), dq, dk and dv); cp_allgather: parallel.cp_comm =
  // "allgather" (every rank's K/V gathered) instead of the ring.
  int64_t cp = 1;
  bool cp_allgather = false;
};

// Element counts (of the parameter dtype) on one rank.
struct ModelMemory {
  int64_t parameters = 0;     // this rank's parameters, tp padding rows included (ParameterStore::numel)
  int64_t activations = 0;    // what a forward with targets keeps for backward (the GptCtx)
  int64_t training_peak = 0;  // activations plus temporaries at the highest point of forward + backward
  int64_t forward_peak = 0;   // the highest point of the forward with targets (its activations included)
  int64_t backward_peak = 0;  // and of the backward (training_peak is the larger of the two)
  int64_t inference_peak = 0; // a forward without targets (evaluation, generation), at its highest
  int64_t inference_kept = 0; // what that forward leaves allocated (its context, logits included)
  int64_t weight_grads = 0;   // split_backward: the copies B keeps for W (WeightGrads::bytes() / element size)
  // recompute_ahead: the R action (Gpt::recompute) at its highest, what the forward kept included,
  // and what it leaves allocated until the backward beyond that (the recomputed blocks' contexts).
  // backward_peak then counts those as live from its start. Both 0 otherwise.
  int64_t recompute_peak = 0;
  int64_t recomputed = 0;
  // Besides the elements above, a forward with targets keeps its loss sum and target count (one
  // F64 pair, GptCtx::loss_sums) until backward ends: in bytes, whatever the parameter dtype.
  static constexpr int64_t kLossSumsBytes = 2 * 8;
};

// cfg resolved (model/config.h resolve()). tp must divide the heads and the MLP as the model requires.
// Of a pipeline stage (layout.stage): its parameters only (the last stage's copy of a tied
// embedding included), and what its forward and backward allocate.
ModelMemory model_memory(const ModelConfig& cfg, const ModelMemoryLayout& layout);

// What per-op recomputation (model/recompute_ops.h) trades in one block on this rank, for one
// micro-batch of `layout` (its batch, seq_len, tp and sequence_parallel are read), so a planner can
// choose ops per layer: the elements its kept context shrinks by (the activation peak's change is
// model_memory's: the backward holds one branch's recomputed tensors at a time), and the forward
// work its backward runs again. FLOPs: 2 m n k per GEMM (all KV heads' k and v when they are
// replicated over tp); the attention kernel's QK^T and PV over the causal pairs, 2 x 2 D per
// (query, visible key), B H_local T (T + 1) / 2 pairs.
struct RecomputeOpsCost {
  int64_t elements_saved = 0;   // activation elements (F32 in training: bytes_saved = 4x)
  int64_t bytes_saved = 0;
  double gemm_flops = 0;        // qkv: q, k, v; mlp_in: fc, or gate and up
  double attention_flops = 0;   // attn: the attention forward
  int64_t elementwise = 0;      // elements the recomputed elementwise ops write: norm 2 (B, T_local, C),
                                // mlp_act (B, T, F_local), RoPE's q and k under qkv (llama)
};
RecomputeOpsCost recompute_ops_cost(const ModelConfig& cfg, const ModelMemoryLayout& layout, const RecomputeOps& ops);

// What one micro-batch's forward keeps for backward, by part (elements on one rank): the
// activation side of the pipeline cut's cost model (model/stage_cut.h). The model's activations
// are embedding + n_layer x block + head.
struct ActivationParts {
  int64_t embedding = 0;  // its output, the residual stream's first (B, T_local, C)
  int64_t block = 0;      // one block's context under layout.recompute (none under full recomputation)
                          // and its output (B, T_local, C)
  int64_t head = 0;       // final norm, (sequence parallel: its gathered output,) logits, losses and lse
  int64_t vision = 0;     // kind = "vlm": the vision tower's context for layout.images images
};
ActivationParts activation_parts(const ModelConfig& cfg, const ModelMemoryLayout& layout);

}  // namespace tessera
