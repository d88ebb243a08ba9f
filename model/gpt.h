// The GPT, read small to large: Attention, Mlp, Block, Gpt. Each forward(ex, ctx, ...) fills a
// per-micro-batch context with what its backward(ex, ctx, ...) needs, so several micro-batches can
// be in flight; `ex` (kernels/exec.h) is where the ops run: the device and its stream.
// Dimension letters: B batch, T sequence, C channels, H heads, KV key/value heads, D head dim,
// F MLP hidden, V vocab, L layers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/activation_compression.h"
#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/parameters.h"
#include "model/recompute_ops.h"
#include "model/weight_grads.h"
#include "parallel/context_attention.h"
#include "parallel/tp_compression.h"

namespace tessera {

// Activation recomputation per block (docs/training.md, "Recomputation"):
// - None: keep everything the backward reads.
// - Selective: RecomputeOps::selective() (model/recompute_ops.h, which names other op sets too):
//   keep every GEMM output (q, k, v, the attention output and its lse, fc or gate and up) and the
//   residual x1; drop the outputs of the cheap elementwise ops whose inputs are kept (the two
//   norms' outputs and the activation function's output, (B, T_local, C) x 2 + (B, T, F)) and
//   recompute them in backward with the same kernels, so the gradients are bitwise those of
//   None. The attention probabilities are recomputed from the lse under every policy (the kernel).
// - Full: keep only the block's input and re-run its whole forward during backward, or earlier
//   through Gpt::recompute (model.recompute = "bubble": the pipeline schedule's R action runs it
//   where the rank would wait; the backward then finds the context saved and recomputes nothing).
//   Under forward error feedback (parallel.tp_comm_compression_forward = "int8-ef") the forward
//   also keeps what each region's leaving collective received (AttentionCtx::leave,
//   MlpCtx::leave), and the re-run decodes that instead of communicating: bitwise the first.
enum class Recompute { None, Selective, Full };

// Keys and values of the positions generated so far, per layer, for incremental decoding
// (one sequence: B = 1). Filled by Gpt::forward_cached, the training forward never sees it.
struct KvCache {
  int64_t capacity = 0;   // positions the buffers hold
  int64_t length = 0;     // positions filled
  std::vector<Buffer> k;  // per layer (capacity, KV, D)
  std::vector<Buffer> v;
};

struct AttentionCtx {
  Buffer q;    // (B, T, H, D), after RoPE
  Buffer k;    // (B, T, KV, D), after RoPE
  Buffer v;    // (B, T, KV, D)
  Buffer out;  // (B, T, H, D)
  Buffer lse;  // (B, H, T)
  TpReceived leave;  // full recomputation under forward "int8-ef": the output's collective, for the replay
};

// Causal multi-head (grouped-query) self-attention with its q, k, v and output projections.
// Tensor parallel: each rank holds H / tp query heads (q column-parallel, proj row-parallel) and
// the KV heads they read: KV / tp of them when tp divides KV; otherwise (fewer KV heads than tp)
// k and v are replicated, each rank computes them all and uses its one KV head.
class Attention {
 public:
  Attention() = default;
  // cp: the context-parallel group (parallel/context_attention.h); inactive: cp = 1.
  // causal = false: every query attends to every key of its sequence (a vision encoder's
  // bidirectional attention); the kernel's query offset makes every key visible (kernels/attention.h).
  Attention(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, const TensorParallel& tp,
            const ContextParallel& cp = {}, bool causal = true);
  // y (B, T_local, C) = proj(attention(q(x), k(x), v(x))), x (B, T_local, C); seq: the positions
  // of the tp group's sequence (T = seq.length(); T_local = T / tp under sequence parallelism,
  // else T): a whole sequence [0, T), or under cp this cp rank's load-balanced chunks, whose
  // attention over the whole sequence is context_attention_forward's.
  // drop: the adapters' dropout in a training forward (model/lora.h; null: none).
  void forward(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
               const SequenceLayout& seq, const LoraDropout* drop = nullptr) const;
  // Incremental decoding (B = 1, tp = 1), the same arithmetic with a cache: x (1, T, C) holds
  // positions [pos, pos + T); their keys and values are appended to the layer's cache_k and
  // cache_v (capacity, KV, D) at pos, and the queries attend to the cache's [0, pos + T).
  void forward_cached(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                      Buffer& cache_k, Buffer& cache_v, int64_t pos) const;
  // dx (B, T_local, C) written with the gradient through the branch; dy (B, T_local, C). deferred:
  // the projections' weight gradients are left to it (zero-bubble's B, model/weight_grads.h).
  void backward(const Exec& ex, const AttentionCtx& ctx, Allocator& alloc, const Tensor& dx, const Tensor& dy,
                const Tensor& x, const SequenceLayout& seq, WeightGrads* deferred = nullptr,
                const LoraDropout* drop = nullptr) const;
  // Per-op recomputation (model/recompute_ops.h), bitwise the forward's: "qkv": ctx.q, k, v
  // (allocated) again from x (B, T_local, C), the region re-entered (re-gathered under sequence
  // parallelism, released before returning; chunk by chunk as the forward under
  // parallel.tp_overlap_chunks > 1), RoPE at seq's positions; "attn": ctx.out and lse
  // (allocated) again from ctx.q, k, v.
  void recompute_qkv(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& x, const SequenceLayout& seq,
                     const LoraDropout* drop) const;
  void recompute_attention(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const SequenceLayout& seq) const;
  void set_profiler(Profiler* p);

 private:
  // The forward's first half, shared by both paths: ctx.q, k, v (RoPE at seq's positions) of xf
  // (B, T, C), the region's full-sequence input; ctx.out and lse allocated (with_out).
  void project_qkv(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& xf,
                   const SequenceLayout& seq, const LoraDropout* drop, bool with_out = true) const;
  // Its second half: y from ctx.out through the row-parallel projection, leaving the region.
  void project_out(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& y,
                   const LoraDropout* drop) const;
  // project_qkv's pieces: ctx.q, k, v (B, T, ·) allocated; RoPE; ctx.out, lse allocated.
  void allocate_qkv(AttentionCtx& ctx, Allocator& alloc, DType dtype, int64_t B, int64_t T) const;
  void rotate_qk(const Exec& ex, AttentionCtx& ctx, const SequenceLayout& seq) const;
  void allocate_out(AttentionCtx& ctx, Allocator& alloc) const;
  // ctx.out and lse from ctx.q, k, v: the attention kernel, or over cp.
  void attend(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const SequenceLayout& seq) const;
  // Under parallel.tp_overlap_chunks > 1 (parallel/tp_overlap.h): the region's edges and their
  // GEMMs chunk by chunk. x, dy, dx (B, T / tp, C); dout, dq, dk, dv over the full sequence T.
  // project_qkv_overlapped is project_qkv with x (B, T / tp, C) gathered chunk by chunk (also the
  // "qkv" recomputation's, with_out = false: the same chunks and GEMMs, so bitwise the forward's).
  void project_qkv_overlapped(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& x,
                              const SequenceLayout& seq, bool with_out = true) const;
  void proj_backward_overlapped(const Exec& ex, const AttentionCtx& ctx, Allocator& alloc, const Tensor& dout,
                                const Tensor& dy, WeightGrads* deferred) const;
  void qkv_backward_overlapped(const Exec& ex, Allocator& alloc, const Tensor& dx, const Tensor& dq,
                               const Tensor& dk, const Tensor& dv, const Tensor& x, int64_t T,
                               WeightGrads* deferred) const;
  // dx rows (N, C) += the input gradient through k or v from d rows (N, KV_local D), no weights.
  void project_kv_backward_input(const Exec& ex, const Linear& proj, Allocator& alloc, const Tensor& dx,
                                 const Tensor& d) const;
  // The kernel's query offset over S keys: 0 (causal), or S - 1 (bidirectional: query i sits at
  // position S - 1 + i, after every key, so every key is visible).
  int64_t query_offset(int64_t S) const { return causal_ ? 0 : S - 1; }
  // k or v of this rank's KV heads (B, T, KV_local, D) from x (B, T, C).
  void project_kv(const Exec& ex, const Linear& proj, Allocator& alloc, const Tensor& out, const Tensor& x,
                  const LoraDropout* drop) const;
  // dx (B, T, C) += the gradient through k or v, from d (B, T, KV_local, D).
  void project_kv_backward(const Exec& ex, const Linear& proj, Allocator& alloc, const Tensor& dx, const Tensor& d,
                           const Tensor& x, WeightGrads* deferred, const LoraDropout* drop) const;
  TensorParallel tp_;
  ContextParallel cp_;
  Profiler* prof_ = nullptr;
  int64_t n_head_ = 0, n_kv_head_ = 0, head_dim_ = 0;
  bool kv_replicated_ = false;  // fewer KV heads than tp ranks
  int64_t kv_head_ = 0;         // when replicated: the KV head this rank's queries read
  bool rope_ = false;
  bool causal_ = true;
  Rope rotary_;
  Linear q_, k_, v_, proj_;
};

struct MlpCtx {
  Buffer h;     // (B, T, F) gelu: fc output; swiglu: gate projection
  Buffer up;    // (B, T, F) swiglu only: up projection
  Buffer act;   // (B, T, F) gelu(h) or silu(h) * up: the down projection's input
  TpReceived leave;  // as AttentionCtx::leave
};

// GPT-2 MLP (fc, GELU, proj) or LLaMA's (gate, up, SwiGLU, down). Tensor parallel: the hidden
// features F are split (fc/gate/up column-parallel, proj/down row-parallel).
class Mlp {
 public:
  Mlp() = default;
  Mlp(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, const TensorParallel& tp);
  // y, x (B, T_local, C), as Attention (seq gives T).
  void forward(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
               const SequenceLayout& seq, const LoraDropout* drop = nullptr) const;
  // dx (B, T_local, C) written; deferred as Attention::backward.
  void backward(const Exec& ex, const MlpCtx& ctx, Allocator& alloc, const Tensor& dx, const Tensor& dy,
                const Tensor& x, WeightGrads* deferred = nullptr, const LoraDropout* drop = nullptr) const;
  // Selective recomputation: ctx.act (B, T, F) again from the kept ctx.h (and ctx.up), bitwise the
  // forward's.
  void recompute_activation(const Exec& ex, MlpCtx& ctx, Allocator& alloc) const;
  // Per-op recomputation "mlp_in": ctx.h (and ctx.up) (allocated) again from x (B, T_local, C), the
  // region re-entered (re-gathered under sequence parallelism, released before returning; chunk by
  // chunk as the forward under parallel.tp_overlap_chunks > 1), bitwise the forward's.
  void recompute_input(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& x, const SequenceLayout& seq,
                       const LoraDropout* drop) const;
  void set_profiler(Profiler* p);

 private:
  // ctx.h (and ctx.up) allocated and projected from xf (B, T, C), the region's full-sequence input:
  // the forward's first GEMM(s), shared with recompute_input.
  void project_in(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& xf, const LoraDropout* drop) const;
  // ctx.act (allocated) from ctx.h (and ctx.up): GELU or SwiGLU.
  void activate(const Exec& ex, const MlpCtx& ctx) const;
  // Under parallel.tp_overlap_chunks > 1 (parallel/tp_overlap.h): forward and backward with the
  // region's edges and their GEMMs chunk by chunk.
  void forward_overlapped(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x) const;
  // ctx.h (and ctx.up) allocated and projected from x (B, T / tp, C) gathered chunk by chunk: the
  // overlapped forward's first GEMM(s), shared with recompute_input ("mlp_in").
  void project_in_overlapped(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& x) const;
  void backward_overlapped(const Exec& ex, const MlpCtx& ctx, Allocator& alloc, const Tensor& dx, const Tensor& dy,
                           const Tensor& x, WeightGrads* deferred) const;
  TensorParallel tp_;
  Profiler* prof_ = nullptr;
  MlpKind kind_ = MlpKind::Gelu;
  Linear in_, up_, out_;  // in_: fc (gelu) or gate (swiglu)
};

struct BlockCtx {
  bool saved = false;  // false under full recomputation until backward re-runs the forward
                       // (under selective: ln1.y, ln2.y and mlp.act are undefined until backward)
  NormCtx ln1;
  AttentionCtx attn;
  Buffer x1;  // (B, T, C) residual stream after attention
  NormCtx ln2;
  MlpCtx mlp;
  // model.activation_compression: the inputs only a weight-gradient GEMM reads in backward, held
  // compressed from the end of the forward until their branch's backward (ln1.y, ln2.y and
  // mlp.act are then undefined in between). The attention output stays exact: the attention
  // kernel's backward reads it too.
  struct Compressed {
    CompressedTensor ln1_y;    // (B, T_local, C), q/k/v's input
    CompressedTensor ln2_y;    // (B, T_local, C), the MLP's first layer's input
    CompressedTensor mlp_act;  // (B, T, F_local), the MLP's last layer's input
  } compressed;
};

// Pre-norm transformer block: x1 = x + attn(ln1(x)); y = x1 + mlp(ln2(x1)).
class Block {
 public:
  Block() = default;
  // compression: how the block stores the inputs only its weight-gradient GEMMs read
  // (kernels/activation_compression.h); active only under Recompute::None (an Error otherwise).
  // ops: what it recomputes op by op (model/recompute_ops.h); only under Recompute::None and without
  // compression (an Error otherwise). Recompute::Selective is RecomputeOps::selective().
  Block(ParameterStore& ps, int index, const ModelConfig& cfg, Recompute recompute, const TensorParallel& tp,
        const ContextParallel& cp = {}, ActivationCompression compression = {}, RecomputeOps ops = {});
  // A block under another name prefix ("vision.blocks.0"); causal = false for bidirectional
  // attention (the vision encoder).
  Block(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, Recompute recompute,
        const TensorParallel& tp, bool causal);
  // y (B, T_local, C) from x (B, T_local, C); seq as Attention::forward. Under full
  // recomputation ctx keeps nothing; under selective it drops ln1.y, ln2.y and mlp.act.
  // drop: the adapters' dropout (model/lora.h; null: none), the same in backward and recompute.
  void forward(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
               const SequenceLayout& seq, const LoraDropout* drop = nullptr) const;
  // Incremental decoding with the layer's KV cache, as Attention::forward_cached (inference only).
  void forward_cached(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                      Buffer& cache_k, Buffer& cache_v, int64_t pos) const;
  // dres (B, T_local, C): on entry d loss / d y, on return d loss / d x; seq as in forward.
  // deferred: the linear layers' weight gradients are left to it (zero-bubble's B).
  void backward(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& dres, const Tensor& x,
                const SequenceLayout& seq, WeightGrads* deferred = nullptr, const LoraDropout* drop = nullptr) const;
  // Full recomputation ahead of backward: re-runs the forward from the same x (its output y a
  // workspace, dropped) and keeps the whole context in ctx, as the forward under None does; the
  // next backward then recomputes nothing. A no-op when ctx is already saved (None, Selective, or
  // recomputed before). The same kernels on the same values as the recomputation inside backward,
  // so the gradients are bitwise the same.
  void recompute(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& x, const SequenceLayout& seq,
                 const LoraDropout* drop = nullptr) const;
  Recompute recompute() const { return recompute_; }
  const ActivationCompression& compression() const { return compression_; }
  const RecomputeOps& recompute_ops() const { return ops_; }
  void set_profiler(Profiler* p);

 private:
  // After a forward: release what ops_ recomputes (the rest of the context stays): the MLP branch's
  // as release_mlp_branch, then the attention branch's.
  void drop_recomputed(BlockCtx& ctx) const;
  // Before each branch's backward: what ops_ dropped of that branch, in the forward's order (the
  // MLP's: ln2's output, h (and up), the activation; the attention's: ln1's output, q, k, v, out and
  // lse); after it, release them again (model/memory.cpp counts them so: one branch's at a time).
  void recompute_mlp_branch(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const SequenceLayout& seq,
                            const LoraDropout* drop) const;
  void recompute_attention_branch(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& x,
                                  const SequenceLayout& seq, const LoraDropout* drop) const;
  void release_mlp_branch(BlockCtx& ctx) const;
  // After a forward under compression: ln1.y, ln2.y and mlp.act into ctx.compressed, one at a time.
  void compress_inputs(const Exec& ex, BlockCtx& ctx, Allocator& alloc) const;
  // The block's forward, saving its context; attend(y, x) runs the attention (either path).
  template <class Attend>
  void forward_saved(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                     const SequenceLayout& seq, const LoraDropout* drop, Attend&& attend) const;
  Recompute recompute_ = Recompute::None;
  ActivationCompression compression_;
  RecomputeOps ops_;
  Profiler* prof_ = nullptr;
  Norm ln1_, ln2_;
  Attention attn_;
  Mlp mlp_;
};

// Which part of the model a Gpt instance is: one pipeline stage, in the manner of Megatron's
// pre_process / post_process. The default is the whole model (the one-stage case). A stage holds
// the blocks [first_layer, end_layer) (at least one; a VLM's first may hold none, resolve_stage), the
// embedding if and only if it starts at layer 0 (but after a VLM's empty first stage), and the
// final norm, LM head and loss if and only if it ends at the last layer.
struct StageSpec {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // one past the stage's last block; -1: the model's n_layer
  bool embedding = true;   // forward takes token ids; without: the previous stage's activations
  bool head = true;        // forward ends in the loss; without: activations for the next stage

  // Stage `index` of `stages` on an even split of n_layer blocks (the first n_layer % stages
  // stages hold one block more), with the embedding on the first and the head on the last.
  static StageSpec split(int64_t n_layer, int64_t stages, int64_t index);
  int64_t layers() const { return end_layer - first_layer; }
  bool whole(int64_t n_layer) const { return first_layer == 0 && end_layer == n_layer && embedding && head; }
};

// The spec with end_layer resolved (-1 -> cfg.n_layer), checked against the model: an Error names
// the stage and what is wrong (no blocks, a range outside [0, n_layer), the embedding on a stage
// not starting at layer 0, ...). A vision-language model's (cfg.kind = "vlm") first stage may hold
// no block, {0, 0, true, false}: the vision tower, the projector and the embedding (the encoder
// as a stage of its own; its output is the embedded sequence with the image rows merged in).
StageSpec resolve_stage(const StageSpec& stage, const ModelConfig& cfg);

class VisionTower;  // model/vision.h
struct VisionCtx;

// A micro-batch's images for a vision-language model (model.kind = "vlm"): patches (N, P, K) in
// the model's dtype on its device (data/image_text.h patchify), and for image i the sample
// sample[i] of the batch whose placeholder tokens start at position start[i] (host numbers; its P
// placeholders are the global positions [start[i], start[i] + P), of which a rank under context or
// sequence parallelism holds some or none). Samples with no image are text only.
struct ImageInput {
  Tensor patches;
  std::vector<int64_t> sample, start;
  int64_t count() const { return static_cast<int64_t>(sample.size()); }
};

struct GptCtx {
  int64_t B = 0, T = 0;
  SequenceLayout seq;         // the positions of the tp group's T; a rank's rows between regions
                              // are TensorParallel::shard_sequence(seq)
  Tensor tokens;              // (B, T) I32, owned by the caller (a stage with the embedding)
  Tensor input;               // (B, T_local, C), owned by the caller (a stage without the embedding)
  Tensor targets;             // (B, T) I32 or undefined (no loss)
  // The stage's residual stream, its layers' count + 1 of (B, T_local, C): the embedding output
  // (undefined without the embedding: `input` is the first block's input), then each block's
  // output. Without the head, the last is the stage's output.
  std::vector<Buffer> resid;
  std::vector<BlockCtx> blocks;
  NormCtx ln_f;
  Buffer head_in;  // (B, T, C) sequence parallel only: ln_f's output gathered for the LM head
  Buffer logits;   // (B*T, V_local); after backward it holds the logits' gradient
  Buffer losses;   // (B*T)
  Buffer lse;      // (B*T), over the whole vocabulary
  // (2) F64 on the model's device, with targets: {sum of the token losses, non-ignored targets}.
  // Left there: the trainer adds each micro-batch's into its step's sums and reads those once.
  Buffer loss_sums;
  // kind = "vlm" with images: the vision tower's context and where its outputs went.
  std::shared_ptr<VisionCtx> vision;
  std::vector<int64_t> image_sample, image_start;
  // A training forward's adapter dropout (model/lora.h), its positions those of seq; null: none.
  std::shared_ptr<const LoraDropout> lora_dropout;
};

// The host numbers of loss sums like GptCtx::loss_sums: a device read (synchronizes ex), so once
// per step or per evaluation batch, not per op.
struct LossSums {
  double loss_sum = 0;
  int64_t targets = 0;
  double mean() const { return targets > 0 ? loss_sum / static_cast<double>(targets) : 0.0; }
};
LossSums read_loss_sums(const Exec& ex, const Tensor& sums);

// The whole model, or one pipeline stage of it (StageSpec). Either way parameters keep their
// global names ("blocks.5.attn.q.weight" on whichever stage holds block 5), so checkpoints do
// not depend on the split.
class Gpt {
 public:
  // Registers the stage's parameters in ps (call ps.finalize() afterwards). recompute: one policy
  // per layer of the whole model (the stage uses its own layers' entries), or empty for none. tp:
  // the tensor-parallel group this rank belongs to (ps must be laid out for it); its ranks call
  // forward and backward together, on the same tokens. With tied embeddings and the head on a
  // later stage than the embedding, the head's stage registers its own copy of "wte.weight"
  // (ParamSpec::stage_copy), and both it and the first stage's are marked
  // sum_grad_over_embedding_group: Megatron's approach.
  // cp: the context-parallel group; its ranks share every sequence, each forward taking its
  // chunks' tokens with seq = cp.layout(T) (parallel/context_attention.h).
  // compression: one per layer of the whole model as recompute (model/compression_policy.h), or
  // empty for none. recompute_ops: likewise, per-op recomputation (model/recompute_ops.h), for the
  // layers whose recompute is None.
  Gpt(const ModelConfig& cfg, ParameterStore& ps, std::vector<Recompute> recompute = {}, TensorParallel tp = {},
      StageSpec stage = {}, ContextParallel cp = {}, std::vector<ActivationCompression> compression = {},
      std::vector<RecomputeOps> recompute_ops = {});

  // The forward of the stage. input: token ids (B, T) I32 for a stage with the embedding, else the
  // previous stage's output (B, T_local, C), which the caller keeps unchanged until backward.
  // targets (B, T) I32 (kIgnoreIndex allowed), for a stage with the head, or undefined for logits
  // only (and on every stage without the head); both on the model's device (upload host ids with
  // copy()). With targets, ctx.loss_sums holds the loss sum and the target count
  // (read_loss_sums(ex, ctx.loss_sums).mean() is the mean loss). seq: the positions of the
  // sequence the tp group holds (parallel/sequence_layout.h; T = seq.length()); empty: the whole
  // sequence [0, T) of the tokens. A stage without the embedding requires it.
  // Returns the stage's output activations (B, T_local, C), owned by ctx, to send to the next
  // stage; undefined for the stage with the head.
  // images (kind = "vlm", the stage with the embedding): each image's projected patches replace
  // the input embeddings (token and learned position) at its P placeholder positions; null or
  // empty: text only.
  // drop (a training forward with lora.dropout > 0): the step, train.seed and the micro-batch's
  // first sample index for the adapters' dropout masks (its positions are filled from seq); kept in
  // ctx for the backward, which recomputes the masks. Null (evaluation, generation): no dropout.
  Tensor forward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& input, const Tensor& targets,
                 const SequenceLayout& seq = {}, const ImageInput* images = nullptr,
                 const LoraDropout* drop = nullptr) const;
  // Inference with a KV cache (the whole model, tp = 1): tokens (1, T) are the positions
  // [cache.length, cache.length + T); fills ctx.logits (T, V) and advances the cache, which
  // make_cache sized.
  void forward_cached(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& tokens, KvCache& cache) const;
  KvCache make_cache(Allocator& alloc, int64_t capacity) const;
  // Accumulates the gradient of loss_scale * (sum of token losses) into the parameter gradients.
  // loss_scale = 1 / (non-ignored targets in the whole optimizer batch) gives the mean.
  // on_ready, when given, is called with each range [first, end) of parameter ids as soon as
  // their gradients are final for this backward (last layer first), so a data-parallel gradient
  // reduction of those parameters can start while earlier layers still compute. This form is
  // the whole model's (a stage with both the embedding and the head); stages use the next.
  using GradsReady = std::function<void(int first, int end)>;
  void backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, double loss_scale,
                const GradsReady& on_ready = {}) const;

  // Where a stage's backward starts: the stage with the head from its loss (the gradient of
  // loss_scale * (sum of token losses), as above), any other from dy (B, T_local, C), the
  // gradient of its output (Megatron's output_tensor_grad), which is left unchanged.
  struct OutputGrad {
    double loss_scale = 0;
    Tensor dy;
    static OutputGrad loss(double scale) { return {scale, Tensor()}; }
    static OutputGrad output(const Tensor& dy) { return {0.0, dy}; }
  };
  // The backward of the stage: accumulates its parameter gradients (on_ready as above, for its
  // parameters) and writes dx (B, T_local, C), the gradient of its input activations, for a stage
  // without the embedding (dx undefined for one with it). dx may be dy's storage.
  // With `deferred` it is the input-gradient half alone (zero-bubble's B): dx as above, the norms'
  // and embeddings' gradients too, but every linear layer's weight gradient (the GEMM dy^T x, and
  // its bias) is recorded in `deferred` for backward_weight; on_ready must then be empty (nothing
  // is final yet: backward_weight reports the ranges). ctx is released either way.
  void backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const OutputGrad& from, const Tensor& dx,
                const GradsReady& on_ready = {}, WeightGrads* deferred = nullptr) const;
  // The weight-gradient half (zero-bubble's W) of a backward split by `deferred`: runs its GEMMs in
  // order and reports each range of final gradients to on_ready, in the whole backward's order.
  // The gradients then equal the whole backward's bit for bit (the same kernels on the same values,
  // accumulated in the same order), except a tied LM head on the stage that also holds the
  // embedding (the whole model): its GEMM now adds after the embedding's scatter, one rounding.
  void backward_weight(const Exec& ex, WeightGrads& deferred, const GradsReady& on_ready = {}) const;
  // The recomputation half of a backward under full recomputation, run ahead of it (the pipeline's
  // R action, model.recompute = "bubble"): every block of the stage whose forward kept nothing
  // re-runs it now (Block::recompute), first block first, and keeps its context in ctx until the
  // backward, which then runs without recomputing (the same operations: the gradients are bitwise
  // those of a backward that recomputes inside). Needs a forward first; blocks that kept their
  // context are left alone.
  void recompute(const Exec& ex, GptCtx& ctx, Allocator& alloc) const;

  // The logits of position `position` of every sequence over the whole vocabulary: out (B, V),
  // gathered from the vocabulary shards of tp (collective over the tp group), after a forward.
  void logits_at(const Exec& ex, const GptCtx& ctx, Allocator& alloc, int64_t position, const Tensor& out) const;
  // Sequence lengths must be a multiple of this (tp under sequence parallelism, else 1). Inference
  // may pad a sequence on the right: causal attention keeps earlier positions unaffected.
  int64_t seq_multiple() const { return tp_.sequence_sharded() ? tp_.size() : 1; }

  const ModelConfig& config() const { return cfg_; }
  // Block i of this stage's blocks (its first layer's is 0).
  const Block& block(int64_t i) const { return blocks_.at(static_cast<size_t>(i)); }
  const StageSpec& stage() const { return stage_; }
  DType dtype() const { return ps_->dtype(); }  // of the parameters and activations
  // Times every op family of forward and backward into p (owned by the caller; null: off).
  void set_profiler(Profiler* p);

 private:
  // The forward shared by training and cached inference.
  void forward_layers(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& input, const SequenceLayout& seq,
                      KvCache* cache, const ImageInput* images = nullptr, const LoraDropout* drop = nullptr) const;
  // kind = "vlm": runs the vision tower on images and writes its outputs over ctx.resid[0] at the
  // placeholder positions.
  void images_forward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const ImageInput& images) const;
  // Its backward: the placeholder rows of dres (B, T, C) go to the vision tower, and are zeroed so
  // that the embedding's backward gives their token and position rows nothing.
  void images_backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& dres) const;
  // The rows of an image at global positions [start, start + P) that this rank holds under seq
  // (the tp group's positions: under cp its chunks) and, under sequence parallelism, its tp part:
  // runs of `count` rows from local row `local` of its (B, Tl, C) stream, patches from `patch`
  // (none: the image lies elsewhere; under cp it may fall in both of a rank's chunks).
  struct ImageRows {
    int64_t local = 0, patch = 0, count = 0;
  };
  std::vector<ImageRows> image_rows(const SequenceLayout& seq, int64_t start, int64_t P) const;
  // Where the residual stream's gradient (B, T_local, C) is kept during backward: dx (a stage
  // without the embedding: its final value is the input gradient), else a workspace in storage.
  Tensor residual_grad(const GptCtx& ctx, Allocator& alloc, Buffer& storage, const Tensor& dx) const;
  // The head's backward, from the loss to dres, the gradient of the last block's output (written;
  // set to residual_grad's after the head's temporaries, which keeps the memory peak in order).
  void head_backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, double loss_scale, Buffer& dres_storage,
                     Tensor& dres, const Tensor& dx, WeightGrads* deferred) const;
  // ctx.losses and ctx.lse from ctx.logits: local, or vocabulary-parallel over tp.
  void loss_forward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& flat_targets) const;
  // The input of the stage's block l (counted from its first layer): ctx.resid[l], or the
  // caller's input activations for block 0 of a stage without the embedding.
  Tensor block_input(const GptCtx& ctx, int64_t l) const;
  ModelConfig cfg_;
  StageSpec stage_;
  const ParameterStore* ps_;
  TensorParallel tp_;
  VocabShard vocab_shard_;  // the vocabulary ids this rank's embedding table and LM head hold
  Profiler* prof_ = nullptr;
  Embedding embed_;          // a stage with the embedding
  std::shared_ptr<VisionTower> vision_;  // kind = "vlm", the stage with the embedding
  std::vector<Block> blocks_;  // the stage's, first_layer first
  Norm ln_f_;                // a stage with the head
  Linear lm_head_;
  // Parameter-id ranges of each part, in registration order (which is the flat-buffer order);
  // empty for the parts the stage does not hold.
  struct IdRange {
    int first = 0, end = 0;
  };
  IdRange vision_ids_, embed_ids_, ln_f_ids_, head_ids_;
  std::vector<IdRange> block_ids_;
};

}  // namespace tessera
