// GPT forward and backward. Model code is backend-free: it calls kernels on tensors that know
// their device. Gradient temporaries come from the Workspace category and die with the call.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/swiglu.h"
#include "parallel/context_attention.h"
#include "model/compression_policy.h"
#include "parallel/tp_overlap.h"
#include "model/vision.h"

namespace tessera {

namespace {
Buffer activation(Allocator& alloc, DType dt, Shape s) { return Buffer(alloc, dt, s, MemCategory::Activations); }
Buffer workspace(Allocator& alloc, DType dt, Shape s) { return Buffer(alloc, dt, s, MemCategory::Workspace); }
double residual_init_std(const ModelConfig& cfg) { return cfg.init_std / std::sqrt(2.0 * cfg.n_layer); }

// A block's Linear (cfg.bias), with a LoRA adapter when cfg.lora targets it (model/lora.h).
Linear adapted_linear(ParameterStore& ps, const std::string& name, int64_t in, int64_t out, const ModelConfig& cfg,
                      ShardSpec shard, double init_std, bool sum_grad_over_tp = false) {
  Linear l(ps, name, in, out, cfg.bias, shard, init_std, sum_grad_over_tp);
  if (lora_targets_layer(cfg.lora, name)) l.add_lora(ps, name, shard, sum_grad_over_tp, cfg.lora);
  return l;
}

bool whole_sequence(const SequenceLayout& seq) { return seq.chunks().size() == 1 && seq.chunks()[0].start == 0; }

// Training attention sees only the positions its tp group holds, under a causal mask: a whole
// sequence [0, T) is attended here (also under cp: evaluation's greedy decoding runs whole prompts
// on every rank); anything else are the cp group's chunks of a longer one
// (parallel/context_attention.h checks them against its load-balanced layout). Returns whether
// the cp group attends.
bool attends_over_cp(const SequenceLayout& seq, const ContextParallel& cp) {
  if (whole_sequence(seq)) return false;
  TESSERA_CHECK(cp.active(), "attention over the positions ", seq.str(),
                " needs context-parallel attention; this attention takes a whole sequence [0, T)");
  return true;
}
}  // namespace

// ---- Attention ----

Attention::Attention(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, const TensorParallel& tp,
                     const ContextParallel& cp, bool causal)
    : tp_(tp),
      cp_(cp),
      n_head_(cfg.n_head),
      n_kv_head_(cfg.kv_heads()),
      head_dim_(cfg.head_dim()),
      kv_replicated_(n_kv_head_ % tp.size() != 0),
      rope_(cfg.position == PositionKind::Rope),
      causal_(causal),
      rotary_(cfg.rope_theta) {
  TESSERA_CHECK(causal || !cp.active(), "bidirectional attention (", name, ") under context parallelism is not "
                "built; set parallel.cp = 1");
  TESSERA_CHECK(n_head_ % tp.size() == 0, "model.n_head = ", n_head_, " is not divisible by parallel.tp = ", tp.size());
  if (kv_replicated_) {
    TESSERA_CHECK(tp.size() % n_kv_head_ == 0, "parallel.tp = ", tp.size(), " is not a multiple of model.n_kv_head = ",
                  n_kv_head_);
    kv_head_ = tp.rank() * (n_head_ / tp.size()) / (n_head_ / n_kv_head_);
  }
  const int64_t C = cfg.n_embd, kv = n_kv_head_ * head_dim_;
  const ShardSpec kv_shard = kv_replicated_ ? ShardSpec::replicated() : ShardSpec::tp(0);
  q_ = adapted_linear(ps, name + ".q", C, C, cfg, ShardSpec::tp(0), cfg.init_std);
  k_ = adapted_linear(ps, name + ".k", C, kv, cfg, kv_shard, cfg.init_std, kv_replicated_);
  v_ = adapted_linear(ps, name + ".v", C, kv, cfg, kv_shard, cfg.init_std, kv_replicated_);
  proj_ = adapted_linear(ps, name + ".proj", C, C, cfg, ShardSpec::tp(1), residual_init_std(cfg));
}

void Attention::project_kv(const Exec& ex, const Linear& proj, Allocator& alloc, const Tensor& out,
                           const Tensor& x, const LoraDropout* drop) const {
  const int64_t B = x.dim(0), T = x.dim(1), D = head_dim_;
  if (!kv_replicated_) {
    proj.forward(ex, out.view({B, T, out.dim(2) * D}), x, true, drop);
    return;
  }
  // All KV heads, then this rank's one: columns [kv_head D, (kv_head + 1) D) of (B T, KV D).
  Buffer all = workspace(alloc, x.dtype, {B * T, n_kv_head_ * D});
  proj.forward(ex, all.tensor().view({B, T, n_kv_head_ * D}), x, true, drop);
  copy_columns(ex, out.view({B * T, D}), all, kv_head_ * D);
}

void Attention::project_kv_backward(const Exec& ex, const Linear& proj, Allocator& alloc, const Tensor& dx,
                                    const Tensor& d, const Tensor& x, WeightGrads* deferred,
                                    const LoraDropout* drop) const {
  const int64_t B = x.dim(0), T = x.dim(1), D = head_dim_;
  if (!kv_replicated_) {
    proj.backward(ex, dx, d.view({B, T, d.dim(2) * D}), x, /*accumulate_dx=*/true, deferred, drop);
    return;
  }
  Buffer all = workspace(alloc, x.dtype, {B * T, n_kv_head_ * D});
  fill_zero(ex, all);
  paste_columns(ex, all, d.view({B * T, D}), kv_head_ * D);
  proj.backward(ex, dx, all.tensor().view({B, T, n_kv_head_ * D}), x, true, deferred, drop);
}

void Attention::allocate_qkv(AttentionCtx& ctx, Allocator& alloc, DType dtype, int64_t B, int64_t T) const {
  const int64_t H = q_.out() / head_dim_, KV = kv_replicated_ ? 1 : k_.out() / head_dim_, D = head_dim_;
  ctx.q = activation(alloc, dtype, {B, T, H, D});
  ctx.k = activation(alloc, dtype, {B, T, KV, D});
  ctx.v = activation(alloc, dtype, {B, T, KV, D});
}

void Attention::rotate_qk(const Exec& ex, AttentionCtx& ctx, const SequenceLayout& seq) const {
  if (!rope_) return;
  ProfileScope rope(prof_, OpFamily::Rope);
  rotary_.forward(ex, ctx.q, ctx.q, seq);
  rotary_.forward(ex, ctx.k, ctx.k, seq);
}

void Attention::allocate_out(AttentionCtx& ctx, Allocator& alloc) const {
  const Tensor& q = ctx.q;
  ctx.out = activation(alloc, q.dtype, q.shape);
  ctx.lse = activation(alloc, q.dtype, {q.dim(0), q.dim(2), q.dim(1)});
}

void Attention::project_qkv(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& xf,
                            const SequenceLayout& seq, const LoraDropout* drop, bool with_out) const {
  const int64_t B = xf.dim(0), T = xf.dim(1);
  allocate_qkv(ctx, alloc, xf.dtype, B, T);
  q_.forward(ex, ctx.q.tensor().view({B, T, q_.out()}), xf, true, drop);
  project_kv(ex, k_, alloc, ctx.k, xf, drop);
  project_kv(ex, v_, alloc, ctx.v, xf, drop);
  rotate_qk(ex, ctx, seq);
  if (with_out) allocate_out(ctx, alloc);
}

void Attention::recompute_qkv(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& x,
                              const SequenceLayout& seq, const LoraDropout* drop) const {
  if (overlaps(tp_)) {  // the forward's chunks and GEMMs again (no adapter dropout: config refuses it)
    project_qkv_overlapped(ex, ctx, alloc, x, seq, /*with_out=*/false);
    return;
  }
  Buffer gathered;
  const Tensor xf = enter_region(ex, tp_, alloc, gathered, x, seq.length());  // (B, T, C)
  project_qkv(ex, ctx, alloc, xf, seq, drop, /*with_out=*/false);
}

void Attention::attend(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const SequenceLayout& seq) const {
  if (attends_over_cp(seq, cp_))
    context_attention_forward(ex, cp_, alloc, ctx.out, ctx.lse, ctx.q, ctx.k, ctx.v, seq);
  else
    attention_forward(ex, ctx.out, ctx.lse, ctx.q, ctx.k, ctx.v, query_offset(seq.length()), 0, seq.doc_starts());
}

void Attention::recompute_attention(const Exec& ex, AttentionCtx& ctx, Allocator& alloc,
                                    const SequenceLayout& seq) const {
  ProfileScope scope(prof_, OpFamily::Attention);
  TESSERA_CHECK(ctx.q.defined(), "Attention::recompute_attention needs q, k and v");
  allocate_out(ctx, alloc);
  attend(ex, ctx, alloc, seq);
}

void Attention::project_qkv_overlapped(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& x,
                                      const SequenceLayout& seq, bool with_out) const {
  const int64_t B = x.dim(0), T = seq.length();
  allocate_qkv(ctx, alloc, x.dtype, B, T);
  const int64_t KV = ctx.k.tensor().dim(2), D = head_dim_;
  auto kv_rows = [&](const Linear& proj) {  // rows (N, n, KV D) viewed as project_kv's (N, n, KV, D)
    return [&, p = &proj](const Tensor& y, const Tensor& xr) {
      project_kv(ex, *p, alloc, y.view({y.dim(0), y.dim(1), KV, D}), xr, nullptr);
    };
  };
  gather_then_gemms(ex, tp_, alloc, x,
                    {{ctx.q.tensor().view({B, T, q_.out()}), [&](const Tensor& y, const Tensor& xr) { q_.forward(ex, y, xr); }},
                     {ctx.k.tensor().view({B, T, KV * D}), kv_rows(k_)},
                     {ctx.v.tensor().view({B, T, KV * D}), kv_rows(v_)}});
  rotate_qk(ex, ctx, seq);
  if (with_out) allocate_out(ctx, alloc);
}

void Attention::project_out(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& y,
                            const LoraDropout* drop) const {
  const Tensor& out = ctx.out;
  const int64_t B = out.dim(0), T = out.dim(1), HD = out.dim(2) * out.dim(3);
  if (overlaps(tp_)) {
    gemms_then_reduce_scatter(ex, tp_, alloc, y, {{out.view({B, T, HD}), [&](const Tensor& yr, const Tensor& xr) {
                                proj_.forward(ex, yr, xr, /*with_bias=*/tp_.rank() == 0);
                              }}});
    return;
  }
  // The row-parallel projection's partial sums, then their sum over tp (bias added once).
  Buffer partial;
  const Tensor yf = region_full(tp_, alloc, partial, y, T);
  proj_.forward(ex, yf, out.view({B, T, HD}), /*with_bias=*/tp_.rank() == 0, drop);
  leave_region(ex, tp_, alloc, y, yf, &ctx.leave);
}

void Attention::forward(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                        const SequenceLayout& seq, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Attention);  // the kernel; projections and edges time themselves
  const int64_t T = seq.length();
  Buffer gathered;  // lives to the end, as model/memory.h counts it
  if (overlaps(tp_)) {
    project_qkv_overlapped(ex, ctx, alloc, x, seq);
  } else {
    const Tensor xf = enter_region(ex, tp_, alloc, gathered, x, T);  // (B, T, C)
    project_qkv(ex, ctx, alloc, xf, seq, drop);
  }
  attend(ex, ctx, alloc, seq);
  project_out(ex, ctx, alloc, y, drop);
}

void Attention::forward_cached(const Exec& ex, AttentionCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                               Buffer& cache_k, Buffer& cache_v, int64_t pos) const {
  ProfileScope scope(prof_, OpFamily::Attention);
  TESSERA_CHECK(!tp_.active(), "cached decoding runs on one rank (tp = 1)");
  TESSERA_CHECK(causal_, "cached decoding is causal; this attention is bidirectional");
  TESSERA_CHECK(x.ndim() == 3 && x.dim(0) == 1, "cached decoding takes one sequence (1, T, C), got ", x.shape.str());
  const int64_t T = x.dim(1);
  project_qkv(ex, ctx, alloc, x, SequenceLayout::contiguous(T, pos), nullptr);
  const int64_t KV = ctx.k.tensor().dim(2), D = head_dim_;
  TESSERA_CHECK(pos + T <= cache_k.tensor().dim(0), "KV cache full: ", pos, " + ", T, " positions exceed its capacity ",
                cache_k.tensor().dim(0));
  // (capacity, KV, D) caches: append rows [pos, pos + T), attend to [0, pos + T).
  copy(ex, cache_k.tensor().slice_rows(pos, pos + T), ctx.k.tensor().view({T, KV, D}));
  copy(ex, cache_v.tensor().slice_rows(pos, pos + T), ctx.v.tensor().view({T, KV, D}));
  const Tensor k_all = cache_k.tensor().slice_rows(0, pos + T).view({1, pos + T, KV, D});
  const Tensor v_all = cache_v.tensor().slice_rows(0, pos + T).view({1, pos + T, KV, D});
  attention_forward(ex, ctx.out, ctx.lse, ctx.q, k_all, v_all, pos, 0);
  project_out(ex, ctx, alloc, y, nullptr);
}

void Attention::backward(const Exec& ex, const AttentionCtx& ctx, Allocator& alloc, const Tensor& dx, const Tensor& dy,
                         const Tensor& x, const SequenceLayout& seq, WeightGrads* deferred,
                         const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Attention);
  const Tensor& q = ctx.q;
  const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), D = q.dim(3), KV = ctx.k.tensor().dim(2);
  Buffer dy_gathered, dout;  // dy_gathered lives to the end, as model/memory.h counts it
  if (overlaps(tp_)) {
    dout = workspace(alloc, x.dtype, {B, T, H, D});
    proj_backward_overlapped(ex, ctx, alloc, dout, dy, deferred);
  } else {
    const Tensor dyf = leave_region_backward(ex, tp_, alloc, dy_gathered, dy, T);  // (B, T, C)
    dout = workspace(alloc, x.dtype, {B, T, H, D});
    proj_.backward(ex, dout.tensor().view({B, T, H * D}), dyf, ctx.out.tensor().view({B, T, H * D}), false, deferred,
                   drop);
  }
  Buffer dq = workspace(alloc, x.dtype, {B, T, H, D});
  Buffer dk = workspace(alloc, x.dtype, {B, T, KV, D});
  Buffer dv = workspace(alloc, x.dtype, {B, T, KV, D});
  // dq, dk, dv start at zero (the allocator's); both attentions accumulate into them.
  if (attends_over_cp(seq, cp_))
    context_attention_backward(ex, cp_, alloc, dq, dk, dv, dout, ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, seq);
  else
    attention_backward(ex, dq, dk, dv, dout, ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, query_offset(T), 0,
                       seq.doc_starts());
  dout.release();
  if (rope_) {
    ProfileScope rope(prof_, OpFamily::Rope);
    rotary_.backward(ex, dq, dq, seq);
    rotary_.backward(ex, dk, dk, seq);
  }
  if (overlaps(tp_)) {
    qkv_backward_overlapped(ex, alloc, dx, dq, dk, dv, x, T, deferred);
    return;
  }
  // The input gradient over the full sequence, partial over tp; then summed (or reduce-scattered).
  Buffer x_gathered, dx_full;
  const Tensor xf = enter_region(ex, tp_, alloc, x_gathered, x, T);
  const Tensor dxf = region_full(tp_, alloc, dx_full, dx, T);
  const WeightGrads::SharedInput one_x(deferred);  // q, k and v read the same xf
  q_.backward(ex, dxf, dq.tensor().view({B, T, H * D}), xf, false, deferred, drop);
  project_kv_backward(ex, k_, alloc, dxf, dk, xf, deferred, drop);
  project_kv_backward(ex, v_, alloc, dxf, dv, xf, deferred, drop);
  enter_region_backward(ex, tp_, alloc, dx, dxf);
}

// The row layer's backward with dy gathered chunk by chunk: dout's rows (the input gradient) as
// each chunk arrives, then the weight gradients once over the whole gathered dy (the same GEMM on
// the same operands as without overlap).
void Attention::proj_backward_overlapped(const Exec& ex, const AttentionCtx& ctx, Allocator& alloc,
                                         const Tensor& dout, const Tensor& dy, WeightGrads* deferred) const {
  const int64_t B = dout.dim(0), T = dout.dim(1), HD = dout.dim(2) * dout.dim(3);
  Buffer dyf = workspace(alloc, dy.dtype, {B, T, dy.dim(2)});
  gather_then_gemms(ex, tp_, alloc, dy, {{dout.view({B, T, HD}), [&](const Tensor& d, const Tensor& g) {
                      proj_.backward_input(ex, d, g, /*accumulate_dx=*/false);
                    }}}, dyf);
  proj_.backward(ex, Tensor(), dyf, ctx.out.tensor().view({B, T, HD}), false, deferred);
}

// The column layers' backward: weight gradients over the whole gathered x, then the input
// gradient's rows chunk by chunk, each chunk reduce-scattered beside the next one's GEMMs.
void Attention::qkv_backward_overlapped(const Exec& ex, Allocator& alloc, const Tensor& dx, const Tensor& dq,
                                        const Tensor& dk, const Tensor& dv, const Tensor& x, int64_t T,
                                        WeightGrads* deferred) const {
  const int64_t B = dq.dim(0), HD = dq.dim(2) * dq.dim(3), KVD = dk.dim(2) * dk.dim(3);
  {
    Buffer x_gathered;
    const Tensor xf = enter_region(ex, tp_, alloc, x_gathered, x, T);
    const WeightGrads::SharedInput one_x(deferred);  // q, k and v read the same xf
    q_.backward(ex, Tensor(), dq.view({B, T, HD}), xf, false, deferred);
    project_kv_backward(ex, k_, alloc, Tensor(), dk, xf, deferred, nullptr);
    project_kv_backward(ex, v_, alloc, Tensor(), dv, xf, deferred, nullptr);
  }
  gemms_then_reduce_scatter(
      ex, tp_, alloc, dx,
      {{dq.view({B, T, HD}), [&](const Tensor& d, const Tensor& g) { q_.backward_input(ex, d, g, false); }},
       {dk.view({B, T, KVD}), [&](const Tensor& d, const Tensor& g) { project_kv_backward_input(ex, k_, alloc, d, g); }},
       {dv.view({B, T, KVD}), [&](const Tensor& d, const Tensor& g) { project_kv_backward_input(ex, v_, alloc, d, g); }}});
}

void Attention::project_kv_backward_input(const Exec& ex, const Linear& proj, Allocator& alloc, const Tensor& dx,
                                          const Tensor& d) const {
  if (!kv_replicated_) {
    proj.backward_input(ex, dx, d, /*accumulate_dx=*/true);
    return;
  }
  // d holds this rank's one KV head: zero for the others, as project_kv_backward.
  const int64_t N = d.numel() / head_dim_, D = head_dim_;
  Buffer all = workspace(alloc, d.dtype, {N, n_kv_head_ * D});
  fill_zero(ex, all);
  paste_columns(ex, all, d.view({N, D}), kv_head_ * D);
  proj.backward_input(ex, dx, all, true);
}

// ---- Mlp ----

Mlp::Mlp(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, const TensorParallel& tp)
    : tp_(tp), kind_(cfg.mlp) {
  const int64_t C = cfg.n_embd, F = cfg.ffn_hidden;
  TESSERA_CHECK(F % tp.size() == 0, "model.ffn_hidden = ", F, " is not divisible by parallel.tp = ", tp.size());
  if (kind_ == MlpKind::Gelu) {
    in_ = adapted_linear(ps, name + ".fc", C, F, cfg, ShardSpec::tp(0), cfg.init_std);
    out_ = adapted_linear(ps, name + ".proj", F, C, cfg, ShardSpec::tp(1), residual_init_std(cfg));
  } else {
    in_ = adapted_linear(ps, name + ".gate", C, F, cfg, ShardSpec::tp(0), cfg.init_std);
    up_ = adapted_linear(ps, name + ".up", C, F, cfg, ShardSpec::tp(0), cfg.init_std);
    out_ = adapted_linear(ps, name + ".down", F, C, cfg, ShardSpec::tp(1), residual_init_std(cfg));
  }
}

void Mlp::forward(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                  const SequenceLayout& seq, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Activation);
  if (overlaps(tp_)) {
    forward_overlapped(ex, ctx, alloc, y, x);
    return;
  }
  const int64_t B = x.dim(0), T = seq.length(), F = in_.out();
  Buffer gathered;
  const Tensor xf = enter_region(ex, tp_, alloc, gathered, x, T);  // (B, T, C)
  ctx.act = activation(alloc, x.dtype, {B, T, F});
  project_in(ex, ctx, alloc, xf, drop);
  activate(ex, ctx);
  Buffer partial;
  const Tensor yf = region_full(tp_, alloc, partial, y, T);
  out_.forward(ex, yf, ctx.act, /*with_bias=*/tp_.rank() == 0, drop);
  leave_region(ex, tp_, alloc, y, yf, &ctx.leave);
}

void Mlp::project_in(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& xf, const LoraDropout* drop) const {
  const int64_t B = xf.dim(0), T = xf.dim(1), F = in_.out();
  ctx.h = activation(alloc, xf.dtype, {B, T, F});
  in_.forward(ex, ctx.h, xf, true, drop);
  if (kind_ == MlpKind::SwiGlu) {
    ctx.up = activation(alloc, xf.dtype, {B, T, F});
    up_.forward(ex, ctx.up, xf, true, drop);
  }
}

void Mlp::activate(const Exec& ex, const MlpCtx& ctx) const {
  if (kind_ == MlpKind::Gelu)
    gelu_forward(ex, ctx.act, ctx.h);
  else
    swiglu_forward(ex, ctx.act, ctx.h, ctx.up);
}

void Mlp::recompute_activation(const Exec& ex, MlpCtx& ctx, Allocator& alloc) const {
  ProfileScope scope(prof_, OpFamily::Activation);
  TESSERA_CHECK(ctx.h.defined(), "Mlp::recompute_activation needs the context of a forward");
  ctx.act = activation(alloc, ctx.h.tensor().dtype, ctx.h.tensor().shape);
  activate(ex, ctx);
}

void Mlp::recompute_input(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& x, const SequenceLayout& seq,
                          const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Activation);
  if (overlaps(tp_)) {  // the forward's chunks and GEMMs again (no adapter dropout: config refuses it)
    project_in_overlapped(ex, ctx, alloc, x);
    return;
  }
  Buffer gathered;
  project_in(ex, ctx, alloc, enter_region(ex, tp_, alloc, gathered, x, seq.length()), drop);  // (B, T, C)
}

void Mlp::backward(const Exec& ex, const MlpCtx& ctx, Allocator& alloc, const Tensor& dx, const Tensor& dy,
                   const Tensor& x, WeightGrads* deferred, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Activation);
  if (overlaps(tp_)) {
    backward_overlapped(ex, ctx, alloc, dx, dy, x, deferred);
    return;
  }
  const int64_t T = ctx.act.tensor().dim(1);
  Buffer dy_gathered;
  const Tensor dyf = leave_region_backward(ex, tp_, alloc, dy_gathered, dy, T);
  Buffer dact = workspace(alloc, x.dtype, ctx.act.tensor().shape);
  out_.backward(ex, dact, dyf, ctx.act, false, deferred, drop);
  Buffer x_gathered, dx_full;
  const Tensor xf = enter_region(ex, tp_, alloc, x_gathered, x, T);
  const Tensor dxf = region_full(tp_, alloc, dx_full, dx, T);
  if (kind_ == MlpKind::Gelu) {
    gelu_backward(ex, dact, dact, ctx.h);  // in place: dact becomes dh
    in_.backward(ex, dxf, dact, xf, false, deferred, drop);
  } else {
    Buffer dup = workspace(alloc, x.dtype, ctx.up.tensor().shape);
    swiglu_backward(ex, dact, dup, dact, ctx.h, ctx.up);  // dact becomes dgate
    const WeightGrads::SharedInput one_x(deferred);        // gate and up read the same xf
    in_.backward(ex, dxf, dact, xf, false, deferred, drop);
    up_.backward(ex, dxf, dup, xf, /*accumulate_dx=*/true, deferred, drop);
  }
  enter_region_backward(ex, tp_, alloc, dx, dxf);
}

void Mlp::project_in_overlapped(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& x) const {
  const int64_t B = x.dim(0), T = x.dim(1) * tp_.size(), F = in_.out();
  ctx.h = activation(alloc, x.dtype, {B, T, F});
  std::vector<GatheredOutput> outputs{{ctx.h, [&](const Tensor& h, const Tensor& xr) { in_.forward(ex, h, xr); }}};
  if (kind_ == MlpKind::SwiGlu) {
    ctx.up = activation(alloc, x.dtype, {B, T, F});
    outputs.push_back({ctx.up, [&](const Tensor& u, const Tensor& xr) { up_.forward(ex, u, xr); }});
  }
  gather_then_gemms(ex, tp_, alloc, x, outputs);
}

void Mlp::forward_overlapped(const Exec& ex, MlpCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x) const {
  const int64_t B = x.dim(0), T = x.dim(1) * tp_.size(), F = in_.out();
  ctx.act = activation(alloc, x.dtype, {B, T, F});  // before the gathers, as model/memory.cpp counts it
  project_in_overlapped(ex, ctx, alloc, x);
  activate(ex, ctx);
  gemms_then_reduce_scatter(ex, tp_, alloc, y, {{ctx.act, [&](const Tensor& yr, const Tensor& ar) {
                              out_.forward(ex, yr, ar, /*with_bias=*/tp_.rank() == 0);
                            }}});
}

// As Attention's overlapped backward: input-gradient GEMMs chunk by chunk beside the collectives,
// weight gradients once over the whole sequence.
void Mlp::backward_overlapped(const Exec& ex, const MlpCtx& ctx, Allocator& alloc, const Tensor& dx,
                              const Tensor& dy, const Tensor& x, WeightGrads* deferred) const {
  const Tensor& act = ctx.act;
  const int64_t B = act.dim(0), T = act.dim(1);
  Buffer dact = workspace(alloc, x.dtype, act.shape);
  {
    Buffer dyf = workspace(alloc, dy.dtype, {B, T, dy.dim(2)});
    gather_then_gemms(ex, tp_, alloc, dy, {{dact, [&](const Tensor& d, const Tensor& g) {
                        out_.backward_input(ex, d, g, /*accumulate_dx=*/false);
                      }}}, dyf);
    out_.backward(ex, Tensor(), dyf, act, false, deferred);
  }
  Buffer x_gathered, dup;
  const Tensor xf = enter_region(ex, tp_, alloc, x_gathered, x, T);
  std::vector<ScatteredInput> inputs{{dact, [&](const Tensor& d, const Tensor& g) { in_.backward_input(ex, d, g, false); }}};
  if (kind_ == MlpKind::Gelu) {
    gelu_backward(ex, dact, dact, ctx.h);  // in place: dact becomes dh
    in_.backward(ex, Tensor(), dact, xf, false, deferred);
  } else {
    dup = workspace(alloc, x.dtype, ctx.up.tensor().shape);
    swiglu_backward(ex, dact, dup, dact, ctx.h, ctx.up);  // dact becomes dgate
    const WeightGrads::SharedInput one_x(deferred);        // gate and up read the same xf
    in_.backward(ex, Tensor(), dact, xf, false, deferred);
    up_.backward(ex, Tensor(), dup, xf, false, deferred);
    inputs.push_back({dup, [&](const Tensor& d, const Tensor& g) { up_.backward_input(ex, d, g, true); }});
  }
  x_gathered.release();
  gemms_then_reduce_scatter(ex, tp_, alloc, dx, inputs);
}

// ---- Block ----

Block::Block(ParameterStore& ps, int index, const ModelConfig& cfg, Recompute recompute, const TensorParallel& tp,
             const ContextParallel& cp, ActivationCompression compression, RecomputeOps ops)
    : recompute_(recompute),
      compression_(compression),
      ops_(recompute == Recompute::Selective ? RecomputeOps::selective() : ops) {
  const std::string p = "blocks." + std::to_string(index);
  TESSERA_CHECK(!compression.active() || recompute == Recompute::None, p, ": activation compression \"",
                compression_name(compression.method), "\" needs a block that keeps its inputs (no recomputation)");
  TESSERA_CHECK(!ops.any() || recompute == Recompute::None, p, ": recompute ops \"", recompute_ops_name(ops),
                "\" need a block that keeps its context (model.recompute = \"none\")");
  TESSERA_CHECK(!ops.any() || !compression.active(), p, ": recompute ops \"", recompute_ops_name(ops),
                "\" and activation compression \"", compression_name(compression.method), "\" on the same block");
  ln1_ = Norm(ps, p + ".ln1", cfg, tp.sequence_sharded());
  attn_ = Attention(ps, p + ".attn", cfg, tp.at_site(2 * index), cp);  // sites: parallel.tp_comm_compression
  ln2_ = Norm(ps, p + ".ln2", cfg, tp.sequence_sharded());
  mlp_ = Mlp(ps, p + ".mlp", cfg, tp.at_site(2 * index + 1));
}

Block::Block(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, Recompute recompute,
             const TensorParallel& tp, bool causal)
    : recompute_(recompute), ops_(recompute == Recompute::Selective ? RecomputeOps::selective() : RecomputeOps{}) {
  ln1_ = Norm(ps, name + ".ln1", cfg, tp.sequence_sharded());
  attn_ = Attention(ps, name + ".attn", cfg, tp, {}, causal);
  ln2_ = Norm(ps, name + ".ln2", cfg, tp.sequence_sharded());
  mlp_ = Mlp(ps, name + ".mlp", cfg, tp);
}

template <class Attend>
void Block::forward_saved(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                          const SequenceLayout& seq, const LoraDropout* drop, Attend&& attend) const {
  ProfileScope scope(prof_, OpFamily::Elementwise);  // the residual adds
  ln1_.forward(ex, ctx.ln1, alloc, x);
  ctx.x1 = activation(alloc, x.dtype, x.shape);
  attend(ctx.x1, ctx.ln1.y);
  residual_forward(ex, ctx.x1, ctx.x1, x);  // x1 = x + attn(ln1(x))
  ln2_.forward(ex, ctx.ln2, alloc, ctx.x1);
  mlp_.forward(ex, ctx.mlp, alloc, y, ctx.ln2.y, seq, drop);
  residual_forward(ex, y, y, ctx.x1);  // y = x1 + mlp(ln2(x1))
  ctx.saved = true;
}

void Block::forward(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                    const SequenceLayout& seq, const LoraDropout* drop) const {
  // Full: the re-run of this forward replays what its error-feedback collectives receive now (a
  // first forward: nothing an earlier one kept is replayed).
  for (TpReceived* r : {&ctx.attn.leave, &ctx.mlp.leave}) {
    r->wire.release();
    r->keep = recompute_ == Recompute::Full;
  }
  forward_saved(ex, ctx, alloc, y, x, seq, drop,
                [&](const Tensor& ya, const Tensor& xa) { attn_.forward(ex, ctx.attn, alloc, ya, xa, seq, drop); });
  if (recompute_ == Recompute::Full) {  // keep only x, which the caller owns, and what the re-run replays
    BlockCtx kept;
    kept.attn.leave = std::move(ctx.attn.leave);
    kept.mlp.leave = std::move(ctx.mlp.leave);
    ctx = std::move(kept);
  }
  drop_recomputed(ctx);
  if (compression_.active()) compress_inputs(ex, ctx, alloc);
}

void Block::drop_recomputed(BlockCtx& ctx) const {
  release_mlp_branch(ctx);
  if (ops_.norm) ctx.ln1.y.release();
  if (ops_.qkv) {
    ctx.attn.q.release();
    ctx.attn.k.release();
    ctx.attn.v.release();
  }
  if (ops_.attn) {
    ctx.attn.out.release();
    ctx.attn.lse.release();
  }
}

void Block::recompute_mlp_branch(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const SequenceLayout& seq,
                                 const LoraDropout* drop) const {
  if (ops_.norm) ln2_.recompute_output(ex, ctx.ln2, alloc, ctx.x1);
  if (ops_.mlp_in) mlp_.recompute_input(ex, ctx.mlp, alloc, ctx.ln2.y, seq, drop);
  if (ops_.mlp_act) mlp_.recompute_activation(ex, ctx.mlp, alloc);
}

void Block::release_mlp_branch(BlockCtx& ctx) const {
  if (ops_.mlp_act) ctx.mlp.act.release();
  if (ops_.mlp_in) {
    ctx.mlp.up.release();
    ctx.mlp.h.release();
  }
  if (ops_.norm) ctx.ln2.y.release();
}

void Block::recompute_attention_branch(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& x,
                                       const SequenceLayout& seq, const LoraDropout* drop) const {
  if (ops_.norm) ln1_.recompute_output(ex, ctx.ln1, alloc, x);
  if (ops_.qkv) attn_.recompute_qkv(ex, ctx.attn, alloc, ctx.ln1.y, seq, drop);
  if (ops_.attn) attn_.recompute_attention(ex, ctx.attn, alloc, seq);
}

void Block::compress_inputs(const Exec& ex, BlockCtx& ctx, Allocator& alloc) const {
  ctx.compressed.ln1_y = compress_activation(ex, alloc, std::move(ctx.ln1.y), compression_);
  ctx.compressed.ln2_y = compress_activation(ex, alloc, std::move(ctx.ln2.y), compression_);
  ctx.compressed.mlp_act = compress_activation(ex, alloc, std::move(ctx.mlp.act), compression_);
}

void Block::forward_cached(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& y, const Tensor& x,
                           Buffer& cache_k, Buffer& cache_v, int64_t pos) const {
  forward_saved(ex, ctx, alloc, y, x, SequenceLayout::contiguous(x.dim(1), pos), nullptr,
                [&](const Tensor& ya, const Tensor& xa) {
    attn_.forward_cached(ex, ctx.attn, alloc, ya, xa, cache_k, cache_v, pos);
  });
}

void Block::recompute(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& x,
                      const SequenceLayout& seq, const LoraDropout* drop) const {
  if (ctx.saved) return;
  Buffer y = workspace(alloc, x.dtype, x.shape);
  forward_saved(ex, ctx, alloc, y, x, seq, drop,
                [&](const Tensor& ya, const Tensor& xa) { attn_.forward(ex, ctx.attn, alloc, ya, xa, seq, drop); });
}

void Block::backward(const Exec& ex, BlockCtx& ctx, Allocator& alloc, const Tensor& dres, const Tensor& x,
                     const SequenceLayout& seq, WeightGrads* deferred, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Elementwise);
  if (!ctx.saved) {  // full recomputation not run ahead (Gpt::recompute): the y workspace lives through backward
    Buffer y = workspace(alloc, x.dtype, x.shape);
    forward_saved(ex, ctx, alloc, y, x, seq, drop,
                  [&](const Tensor& ya, const Tensor& xa) { attn_.forward(ex, ctx.attn, alloc, ya, xa, seq, drop); });
  }
  // Recomputed ops (ops_, selective's included): each branch's dropped tensors are recomputed just
  // before its backward and released after it, so one branch's are alive at a time
  // (model/memory.cpp counts them so). Compression: likewise each branch's compressed inputs are
  // restored just before its backward (their compressed form released) and the restored ones
  // released after it. A context recomputed whole (above, or by Gpt::recompute) lacks nothing.
  const bool compressed = ctx.compressed.ln2_y.defined();
  const bool ops = ops_.any();  // never with compression nor Full (the constructor's checks)
  // MLP branch: dres holds dL/dy = dL/dx1 (skip path) + the path through ln2 and the MLP.
  Buffer dln = workspace(alloc, x.dtype, x.shape);
  if (ops) recompute_mlp_branch(ex, ctx, alloc, seq, drop);
  if (compressed) {
    ctx.ln2.y = decompress_activation(ex, alloc, std::move(ctx.compressed.ln2_y));
    ctx.mlp.act = decompress_activation(ex, alloc, std::move(ctx.compressed.mlp_act));
  }
  mlp_.backward(ex, ctx.mlp, alloc, dln, dres, ctx.ln2.y, deferred, drop);
  ln2_.backward(ex, dres, dln, ctx.x1, ctx.ln2);  // dres is now dL/dx1
  if (ops) release_mlp_branch(ctx);
  if (compressed) {
    ctx.mlp.act.release();
    ctx.ln2.y.release();
  }
  if (ops) recompute_attention_branch(ex, ctx, alloc, x, seq, drop);
  if (compressed) ctx.ln1.y = decompress_activation(ex, alloc, std::move(ctx.compressed.ln1_y));
  // Attention branch: dL/dx = dL/dx1 + the path through ln1 and attention.
  attn_.backward(ex, ctx.attn, alloc, dln, dres, ctx.ln1.y, seq, deferred, drop);
  ln1_.backward(ex, dres, dln, x, ctx.ln1);
  ctx = BlockCtx{};
}

// ---- Profiling: every module passes the profiler down to what it holds ----

void Attention::set_profiler(Profiler* p) {
  prof_ = p;
  for (Linear* l : {&q_, &k_, &v_, &proj_}) l->set_profiler(p);
}

void Mlp::set_profiler(Profiler* p) {
  prof_ = p;
  for (Linear* l : {&in_, &up_, &out_}) l->set_profiler(p);
}

void Block::set_profiler(Profiler* p) {
  prof_ = p;
  ln1_.set_profiler(p);
  ln2_.set_profiler(p);
  attn_.set_profiler(p);
  mlp_.set_profiler(p);
}

void Gpt::set_profiler(Profiler* p) {
  prof_ = p;
  embed_.set_profiler(p);
  if (vision_) vision_->set_profiler(p);
  for (Block& b : blocks_) b.set_profiler(p);
  ln_f_.set_profiler(p);
  lm_head_.set_profiler(p);
}

// ---- Stages ----

StageSpec StageSpec::split(int64_t n_layer, int64_t stages, int64_t index) {
  TESSERA_CHECK(stages >= 1 && stages <= n_layer, "cannot split ", n_layer, " layers into ", stages,
                " pipeline stages: each stage needs at least one block");
  TESSERA_CHECK(index >= 0 && index < stages, "pipeline stage ", index, " outside [0, ", stages, ")");
  const int64_t base = n_layer / stages, extra = n_layer % stages;
  StageSpec s;
  s.first_layer = index * base + std::min(index, extra);
  s.end_layer = s.first_layer + base + (index < extra ? 1 : 0);
  s.embedding = index == 0;
  s.head = index == stages - 1;
  return s;
}

StageSpec resolve_stage(const StageSpec& stage, const ModelConfig& cfg) {
  const int64_t n_layer = cfg.n_layer;
  StageSpec s = stage;
  if (s.end_layer == -1) s.end_layer = n_layer;
  const std::string what =
      "pipeline stage with layers [" + std::to_string(s.first_layer) + ", " + std::to_string(s.end_layer) + ")";
  TESSERA_CHECK(s.first_layer >= 0 && s.end_layer >= 0 && s.end_layer <= n_layer, "the ", what,
                " lies outside the model's layers [0, ", n_layer, ") (model.n_layer = ", n_layer, ")");
  // A vision-language model's first stage may hold the vision tower, the projector and the
  // embedding alone (the image rows are merged into the embedded sequence there).
  const bool encoder_stage = cfg.is_vlm() && s.first_layer == 0 && s.end_layer == 0 && s.embedding && !s.head;
  TESSERA_CHECK(s.end_layer > s.first_layer || encoder_stage, "the ", what,
                " holds no block; every stage needs at least one",
                cfg.is_vlm() ? " (only a vision-language model's first stage may hold none: the vision tower, "
                               "projector and embedding alone)"
                             : "");
  // After a VLM's encoder stage the next stage starts at layer 0 too, without the embedding
  // (which stage holds the embedding is then the cut's to say: model/stage_cut.h).
  TESSERA_CHECK(s.embedding ? s.first_layer == 0 : s.first_layer > 0 || cfg.is_vlm(), "the ", what,
                s.embedding ? " cannot hold the embedding: only the stage starting at layer 0 does"
                            : " must hold the embedding: the first block's input is the token embedding");
  TESSERA_CHECK(s.head == (s.end_layer == n_layer), "the ", what,
                s.head ? " cannot hold the head: only the stage ending at the last layer (" + std::to_string(n_layer) +
                             ") does"
                       : " must hold the head: the last block's output goes to the final norm and LM head");
  return s;
}

// ---- Gpt ----

Gpt::Gpt(const ModelConfig& cfg, ParameterStore& ps, std::vector<Recompute> recompute, TensorParallel tp,
         StageSpec stage, ContextParallel cp, std::vector<ActivationCompression> compression,
         std::vector<RecomputeOps> recompute_ops)
    : cfg_(resolve(cfg)),
      stage_(resolve_stage(stage, cfg_)),
      ps_(&ps),
      tp_(tp),
      vocab_shard_(VocabShard::of(cfg_.vocab_size, tp.size(), tp.rank())) {
  TESSERA_CHECK(ps.layout().tp_size == tp.size() && ps.layout().tp_rank == tp.rank(), "the parameter store is laid out for tp rank ",
                ps.layout().tp_rank, " of ", ps.layout().tp_size, ", the model for rank ", tp.rank(), " of ", tp.size());
  TESSERA_CHECK(recompute.empty() || static_cast<int64_t>(recompute.size()) == cfg_.n_layer, "recompute policy has ",
                recompute.size(), " entries for ", cfg_.n_layer, " layers");
  TESSERA_CHECK(compression.empty() || static_cast<int64_t>(compression.size()) == cfg_.n_layer,
                "activation compression policy has ", compression.size(), " entries for ", cfg_.n_layer, " layers");
  check_compression_policy(compression, recompute);
  TESSERA_CHECK(recompute_ops.empty() || static_cast<int64_t>(recompute_ops.size()) == cfg_.n_layer,
                "recompute ops policy has ", recompute_ops.size(), " entries for ", cfg_.n_layer, " layers");
  check_recompute_ops(recompute_ops, recompute);
  // Each part registers a contiguous run of parameter ids; remember them for GradsReady.
  auto registered = [&](auto&& make) {
    const int first = ps.size();
    make();
    return IdRange{first, ps.size()};
  };
  // The vision tower (kind = "vlm") goes with the embedding; its ids come first.
  vision_ids_ = registered([&] {
    if (cfg_.is_vlm() && stage_.embedding) vision_ = std::make_shared<VisionTower>(ps, cfg_, tp_);
  });
  // A tied LM head on a later stage than the embedding reads its own copy of the token table.
  const bool tied_across_stages = cfg_.tied_embeddings && stage_.embedding != stage_.head;
  embed_ids_ = registered([&] {
    if (stage_.embedding) embed_ = Embedding(ps, cfg_, tp_, tied_across_stages);
  });
  for (int64_t l = stage_.first_layer; l < stage_.end_layer; ++l)
    block_ids_.push_back(registered([&] {
      blocks_.emplace_back(ps, static_cast<int>(l), cfg_, recompute.empty() ? Recompute::None : recompute[l], tp_,
                           cp, compression.empty() ? ActivationCompression{} : compression[l],
                           recompute_ops.empty() ? RecomputeOps{} : recompute_ops[l]);
    }));
  ln_f_ids_ = registered([&] {
    if (stage_.head) ln_f_ = Norm(ps, "ln_f", cfg_, tp_.sequence_sharded());
  });
  head_ids_ = registered([&] {
    if (!stage_.head) return;
    if (!cfg_.tied_embeddings) {
      lm_head_ = Linear(ps, "lm_head", cfg_.n_embd, cfg_.vocab_size, false, ShardSpec::tp_padded(0), cfg_.init_std);
    } else if (stage_.embedding) {
      lm_head_ = Linear::tied(ps, embed_.token_weight_id());
    } else {
      ParamSpec copy = Embedding::token_spec(cfg_);
      copy.sum_grad_over_embedding_group = true;
      copy.stage_copy = true;
      lm_head_ = Linear::tied(ps, ps.add(std::move(copy)));
    }
  });
}

Tensor Gpt::block_input(const GptCtx& ctx, int64_t l) const {
  return l == 0 && !stage_.embedding ? ctx.input : ctx.resid[static_cast<size_t>(l)].tensor();
}

void Gpt::forward_layers(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& input,
                         const SequenceLayout& layout, KvCache* cache, const ImageInput* images,
                         const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Other);
  SequenceLayout seq = layout;
  if (stage_.embedding) {
    check_dtype("Gpt::forward", "tokens", input, DType::I32);
    TESSERA_CHECK(input.ndim() == 2, "Gpt::forward: tokens must be (B, T), got ", input.shape.str());
    const int64_t T = input.dim(1);
    if (cache) seq = SequenceLayout::contiguous(T, cache->length);
    if (seq.empty()) seq = SequenceLayout::contiguous(T);
    TESSERA_CHECK(seq.length() == T, "Gpt::forward: tokens ", input.shape.str(), " for the sequence layout ", seq.str(),
                  " of ", seq.length(), " positions");
  } else {
    TESSERA_CHECK(!seq.empty(), "Gpt::forward: the pipeline stage with layers [", stage_.first_layer, ", ",
                  stage_.end_layer, ") takes activations: it needs their sequence layout (seq)");
    check_dtype("Gpt::forward", "input", input, ps_->dtype());
    TESSERA_CHECK(input.ndim() == 3, "Gpt::forward: input activations must be (B, T_local, C), got ",
                  input.shape.str());
  }
  TESSERA_CHECK(!images || images->count() == 0 || vision_, "Gpt::forward: images given to ",
                cfg_.is_vlm() ? "a pipeline stage without the embedding" : "a model without a vision encoder (model.kind = \"gpt\")");
  const int64_t B = input.dim(0), T = seq.length(), C = cfg_.n_embd;
  const int64_t L = stage_.layers();
  TESSERA_CHECK(seq.end_position() <= cfg_.max_seq_len, "sequence positions ", seq.str(),
                " exceed model.max_seq_len = ", cfg_.max_seq_len);
  TESSERA_CHECK(!tp_.sequence_sharded() || T % tp_.size() == 0, "sequence parallelism: sequence length ", T,
                " is not divisible by parallel.tp = ", tp_.size());
  const int64_t Tl = tp_.shard_sequence(seq).length();
  if (!stage_.embedding) check_shape("Gpt::forward", "input", input, Shape{B, Tl, C});
  const DType dt = ps_->dtype();
  ctx = GptCtx{};
  ctx.B = B;
  ctx.T = T;
  ctx.seq = seq;
  if (drop && !cache && cfg_.lora.enabled() && cfg_.lora.dropout > 0.0) {
    auto d = std::make_shared<LoraDropout>(*drop);
    d->positions.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) d->positions[static_cast<size_t>(t)] = seq.position(t);
    ctx.lora_dropout = std::move(d);
  }
  ctx.resid.reserve(static_cast<size_t>(L + 1));
  // Without the embedding the first block reads the caller's input (ctx.input): no copy.
  for (int64_t l = 0; l <= L; ++l)
    ctx.resid.push_back(l == 0 && !stage_.embedding ? Buffer() : activation(alloc, dt, {B, Tl, C}));
  ctx.blocks.resize(static_cast<size_t>(L));
  if (stage_.embedding) {
    ctx.tokens = input;
    embed_.forward(ex, alloc, ctx.resid[0], input, seq);
    if (images && images->count() > 0) images_forward(ex, ctx, alloc, *images);
  } else {
    ctx.input = input;
  }
  for (int64_t l = 0; l < L; ++l) {
    const size_t layer = static_cast<size_t>(stage_.first_layer + l);
    if (cache)
      blocks_[l].forward_cached(ex, ctx.blocks[l], alloc, ctx.resid[l + 1], block_input(ctx, l), cache->k[layer],
                                cache->v[layer], cache->length);
    else
      blocks_[l].forward(ex, ctx.blocks[l], alloc, ctx.resid[l + 1], block_input(ctx, l), seq, ctx.lora_dropout.get());
  }
  if (!stage_.head) return;
  ln_f_.forward(ex, ctx.ln_f, alloc, ctx.resid[L]);
  // The LM head is column-parallel over the vocabulary: it needs the whole sequence.
  if (tp_.sequence_sharded()) {
    ctx.head_in = activation(alloc, dt, {B, T, C});
    gather_sequence(ex, tp_, alloc, ctx.head_in, ctx.ln_f.y);
  }
  const Tensor head_in = ctx.head_in.defined() ? ctx.head_in.tensor() : ctx.ln_f.y.tensor();
  ctx.logits = activation(alloc, dt, {B * T, lm_head_.out()});
  lm_head_.forward(ex, ctx.logits, head_in.view({B * T, C}));
}

void Gpt::loss_forward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& flat_targets) const {
  ProfileScope scope(prof_, OpFamily::CrossEntropy);
  const int64_t BT = ctx.B * ctx.T;
  const DType dt = ps_->dtype();
  ctx.losses = activation(alloc, dt, {BT});
  ctx.lse = activation(alloc, dt, {BT});
  if (!tp_.active()) {
    cross_entropy_forward(ex, ctx.losses, ctx.lse, ctx.logits, flat_targets);
    return;
  }
  // Vocabulary-parallel: per-rank log-sum-exp and target logit, combined over tp; the (B T, V)
  // logits are never gathered, only 2 B T numbers per rank move.
  Buffer lse_part = workspace(alloc, dt, {BT}), target_logit = workspace(alloc, dt, {BT});
  Buffer lse_parts = workspace(alloc, dt, {tp_.size(), BT});
  cross_entropy_shard_forward(ex, lse_part, target_logit, ctx.logits, flat_targets, vocab_shard_);
  tp_.comm->all_gather(lse_part, lse_parts);
  all_reduce_tp(tp_, target_logit);
  cross_entropy_combine(ex, ctx.losses, ctx.lse, lse_parts, target_logit, flat_targets);
}

std::vector<Gpt::ImageRows> Gpt::image_rows(const SequenceLayout& seq, int64_t start, int64_t P) const {
  // This rank's rows of each sequence: the chunks of the tp group's positions (all of [0, T), or
  // under cp this cp rank's load-balanced chunks) and, under sequence parallelism, its part of
  // them (tensor_parallel.h shard_sequence), in local row order.
  std::vector<ImageRows> runs;
  int64_t local = 0;
  const SequenceLayout mine = tp_.shard_sequence(seq);  // kept: the loop reads its chunks
  for (const SequenceChunk& c : mine.chunks()) {
    const int64_t lo = std::max(start, c.start), hi = std::min(start + P, c.end());
    if (lo < hi) runs.push_back({local + lo - c.start, lo - start, hi - lo});
    local += c.length;
  }
  return runs;
}

void Gpt::images_forward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const ImageInput& images) const {
  const int64_t N = images.count(), P = vision_->num_patches(), B = ctx.B, T = ctx.T, C = cfg_.n_embd;
  TESSERA_CHECK(images.start.size() == images.sample.size(), "Gpt::forward: images have ", images.sample.size(),
                " samples but ", images.start.size(), " start positions");
  TESSERA_CHECK(images.patches.ndim() == 3 && images.patches.dim(0) == N, "Gpt::forward: patches ",
                images.patches.shape.str(), " for ", N, " images");
  std::vector<bool> taken(static_cast<size_t>(B), false);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t b = images.sample[i], t0 = images.start[i];
    TESSERA_CHECK(b >= 0 && b < B, "Gpt::forward: image ", i, " belongs to sample ", b, " outside the batch [0, ", B,
                  ")");
    TESSERA_CHECK(!taken[static_cast<size_t>(b)], "Gpt::forward: sample ", b, " has more than one image");
    taken[static_cast<size_t>(b)] = true;
    // Start positions are global: under cp this rank's chunks hold only some of the sequence.
    const int64_t end = whole_sequence(ctx.seq) ? T : cfg_.max_seq_len;
    TESSERA_CHECK(t0 >= 0 && t0 + P <= end, "Gpt::forward: image ", i, "'s ", P, " placeholder positions from ", t0,
                  " do not fit the sequence of ", end);
  }
  // Every tp and cp rank runs the whole encoder (its blocks split over tp) on every image of its
  // samples, and writes the image rows it holds.
  ctx.vision = std::make_shared<VisionCtx>();
  vision_->forward(ex, *ctx.vision, alloc, images.patches);
  const Tensor out = ctx.vision->out.tensor().view({N * P, C});
  const int64_t Tl = ctx.resid[0].tensor().dim(1);
  const Tensor x0 = ctx.resid[0].tensor().view({B * Tl, C});
  for (int64_t i = 0; i < N; ++i)
    for (const ImageRows& r : image_rows(ctx.seq, images.start[i], P)) {
      const int64_t row = images.sample[i] * Tl + r.local, src = i * P + r.patch;
      copy(ex, x0.slice_rows(row, row + r.count), out.slice_rows(src, src + r.count));
    }
  ctx.image_sample = images.sample;
  ctx.image_start = images.start;
}

void Gpt::images_backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& dres) const {
  const int64_t N = static_cast<int64_t>(ctx.image_sample.size()), P = vision_->num_patches();
  const int64_t C = cfg_.n_embd;
  Buffer dout = workspace(alloc, ps_->dtype(), {N, P, C});
  // Each rank copies out the gradient of the image rows it holds; the rest are zero here. Under
  // sequence parallelism the sum over tp gives every rank of the tp group the whole gradient of its
  // rows, which the encoder's tp-split backward needs on every tp rank. Under context parallelism
  // it is not summed: each cp rank's encoder backward gives the parameter gradients from its own
  // rows, and the gradient reduction over dp x cp (a sum, as for every parameter: the loss scale
  // is 1 / the targets of the whole dp x cp batch) adds the cp ranks' parts into the whole.
  fill_zero(ex, dout);
  const int64_t Tl = dres.dim(1);
  const Tensor d = dres.view({ctx.B * Tl, C}), dflat = dout.tensor().view({N * P, C});
  for (int64_t i = 0; i < N; ++i)
    for (const ImageRows& r : image_rows(ctx.seq, ctx.image_start[static_cast<size_t>(i)], P)) {
      const int64_t row = ctx.image_sample[static_cast<size_t>(i)] * Tl + r.local, src = i * P + r.patch;
      copy(ex, dflat.slice_rows(src, src + r.count), d.slice_rows(row, row + r.count));
      fill_zero(ex, d.slice_rows(row, row + r.count));
    }
  if (tp_.sequence_sharded()) all_reduce_tp(tp_, dout);
  vision_->backward(ex, *ctx.vision, alloc, dout);
}

Tensor Gpt::forward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& input, const Tensor& targets,
                    const SequenceLayout& seq, const ImageInput* images, const LoraDropout* drop) const {
  if (targets.defined()) {
    TESSERA_CHECK(stage_.head, "Gpt::forward: targets given to the pipeline stage with layers [", stage_.first_layer,
                  ", ", stage_.end_layer, "), which has no head (the loss is the last stage's)");
    TESSERA_CHECK(input.ndim() >= 1, "Gpt::forward: input of shape ", input.shape.str());
    const int64_t T = stage_.embedding && seq.empty() ? input.dim(1) : seq.length();
    check_shape("Gpt::forward", "targets", targets, Shape{input.dim(0), T});
  }
  forward_layers(ex, ctx, alloc, input, seq, nullptr, images, drop);
  if (!stage_.head) return ctx.resid.back();
  ctx.targets = targets;
  if (!targets.defined()) return Tensor();
  const Tensor flat_targets = targets.view({ctx.B * ctx.T});
  loss_forward(ex, ctx, alloc, flat_targets);
  // Workspace, not Activations: two numbers, which backward releases with the rest of ctx.
  ctx.loss_sums = workspace(alloc, DType::F64, {2});
  sum(ex, ctx.loss_sums.tensor().slice_rows(0, 1), ctx.losses);
  count_not_equal(ex, ctx.loss_sums.tensor().slice_rows(1, 2), flat_targets, kIgnoreIndex);
  return Tensor();
}

LossSums read_loss_sums(const Exec& ex, const Tensor& sums) {
  check_shape("read_loss_sums", "sums", sums, Shape{2});
  const std::vector<double> v = read_values(ex, sums);
  return {v[0], static_cast<int64_t>(v[1])};
}

void Gpt::logits_at(const Exec& ex, const GptCtx& ctx, Allocator& alloc, int64_t position, const Tensor& out) const {
  TESSERA_CHECK(ctx.logits.defined(), "logits_at needs a forward of the stage with the head");
  const int64_t B = ctx.B, T = ctx.T, V = cfg_.vocab_size, Vl = ctx.logits.tensor().dim(1), R = tp_.size();
  TESSERA_CHECK(position >= 0 && position < T, "logits_at: position ", position, " outside [0, ", T, ")");
  check_shape("Gpt::logits_at", "out", out, Shape{B, V});
  // This rank's (B, V_local) rows, all ranks' side by side, then each rank's real columns.
  Buffer mine = workspace(alloc, out.dtype, {B, Vl});
  const Tensor all_rows = ctx.logits.tensor().view({B, T * Vl});
  copy_columns(ex, mine, all_rows, position * Vl);
  if (R == 1) {
    copy(ex, out, mine);
    return;
  }
  Buffer gathered = workspace(alloc, out.dtype, {R, B, Vl});
  tp_.comm->all_gather(mine, gathered);
  for (int64_t r = 0; r < R; ++r) {
    const VocabShard s = VocabShard::of(V, R, r);
    if (s.valid == 0) continue;
    Buffer cols = workspace(alloc, out.dtype, {B, s.valid});
    copy_columns(ex, cols, gathered.tensor().slice_rows(r, r + 1).view({B, Vl}), 0);
    paste_columns(ex, out, cols, s.start);
  }
}

KvCache Gpt::make_cache(Allocator& alloc, int64_t capacity) const {
  TESSERA_CHECK(capacity > 0 && capacity <= cfg_.max_seq_len, "KV cache capacity ", capacity, " outside [1, ",
                cfg_.max_seq_len, "]");
  TESSERA_CHECK(!tp_.active(), "cached decoding runs on one rank (tp = 1)");
  TESSERA_CHECK(stage_.whole(cfg_.n_layer), "cached decoding runs the whole model, not a pipeline stage");
  KvCache c;
  c.capacity = capacity;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    c.k.emplace_back(alloc, ps_->dtype(), Shape{capacity, cfg_.kv_heads(), cfg_.head_dim()}, MemCategory::Activations);
    c.v.emplace_back(alloc, ps_->dtype(), Shape{capacity, cfg_.kv_heads(), cfg_.head_dim()}, MemCategory::Activations);
  }
  return c;
}

void Gpt::forward_cached(const Exec& ex, GptCtx& ctx, Allocator& alloc, const Tensor& tokens, KvCache& cache) const {
  TESSERA_CHECK(stage_.whole(cfg_.n_layer), "cached decoding runs the whole model, not a pipeline stage");
  TESSERA_CHECK(tokens.ndim() == 2 && tokens.dim(0) == 1, "cached decoding takes one sequence (1, T), got ",
                tokens.shape.str());
  TESSERA_CHECK(cache.length + tokens.dim(1) <= cache.capacity, "KV cache full: ", cache.length, " + ",
                tokens.dim(1), " positions exceed its capacity ", cache.capacity);
  forward_layers(ex, ctx, alloc, tokens, SequenceLayout(), &cache);
  cache.length += tokens.dim(1);
}

Tensor Gpt::residual_grad(const GptCtx& ctx, Allocator& alloc, Buffer& storage, const Tensor& dx) const {
  const Shape shape{ctx.B, tp_.shard_sequence(ctx.seq).length(), cfg_.n_embd};
  if (stage_.embedding) {
    TESSERA_CHECK(!dx.defined(), "Gpt::backward: the stage with the embedding has no input gradient (dx must be "
                  "undefined)");
    storage = workspace(alloc, ps_->dtype(), shape);
    return storage;
  }
  TESSERA_CHECK(dx.defined(), "Gpt::backward: the pipeline stage with layers [", stage_.first_layer, ", ",
                stage_.end_layer, ") writes the gradient of its input: dx is required");
  check_dtype("Gpt::backward", "dx", dx, ps_->dtype());
  check_shape("Gpt::backward", "dx", dx, shape);
  return dx;
}

void Gpt::head_backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, double loss_scale, Buffer& dres_storage,
                        Tensor& dres, const Tensor& dx, WeightGrads* deferred) const {
  TESSERA_CHECK(ctx.targets.defined() && ctx.logits.defined(), "Gpt::backward needs a forward with targets");
  const int64_t B = ctx.B, T = ctx.T, C = cfg_.n_embd, Tl = tp_.shard_sequence(ctx.seq).length();
  const DType dt = ps_->dtype();
  // Loss -> logits (in place) -> final norm input (summed over the vocabulary shards of tp).
  {
    ProfileScope ce(prof_, OpFamily::CrossEntropy);
    cross_entropy_backward(ex, ctx.logits, ctx.logits, ctx.lse, ctx.targets.view({B * T}), loss_scale,
                           tp_.active() ? vocab_shard_ : VocabShard{});
  }
  const Tensor head_in = ctx.head_in.defined() ? ctx.head_in.tensor() : ctx.ln_f.y.tensor();
  Buffer dln = workspace(alloc, dt, {B, T, C});
  lm_head_.backward(ex, dln.tensor().view({B * T, C}), ctx.logits, head_in.view({B * T, C}), false, deferred);
  Buffer dln_local;
  if (tp_.sequence_sharded()) dln_local = workspace(alloc, dt, {B, Tl, C});
  const Tensor dlnl = dln_local.defined() ? dln_local.tensor() : dln.tensor();
  enter_region_backward(ex, tp_, alloc, dlnl, dln);
  // The norm's backward adds to dres (its input is the residual stream): start from zero.
  dres = residual_grad(ctx, alloc, dres_storage, dx);
  if (!dres_storage.defined()) fill_zero(ex, dres);
  ln_f_.backward(ex, dres, dlnl, ctx.resid.back(), ctx.ln_f);
}

void Gpt::backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, double loss_scale, const GradsReady& on_ready) const {
  backward(ex, ctx, alloc, OutputGrad::loss(loss_scale), Tensor(), on_ready);
}

void Gpt::backward(const Exec& ex, GptCtx& ctx, Allocator& alloc, const OutputGrad& from, const Tensor& dx,
                   const GradsReady& on_ready, WeightGrads* deferred) const {
  ProfileScope scope(prof_, OpFamily::Other);
  TESSERA_CHECK(!deferred || !on_ready, "Gpt::backward: a backward that defers its weight gradients finalizes none; "
                "backward_weight reports them (on_ready must be empty here)");
  TESSERA_CHECK(!deferred || deferred->empty(), "Gpt::backward: the WeightGrads given still hold another backward's "
                "deferred work (run backward_weight first)");
  // Split (zero-bubble's B): a range is final only after the weight GEMMs deferred before it.
  auto ready = [&](const IdRange& r) {
    if (deferred) deferred->ready(r.first, r.end);
    else if (on_ready && r.end > r.first) on_ready(r.first, r.end);
  };
  const int64_t L = stage_.layers();
  TESSERA_CHECK(static_cast<int64_t>(ctx.blocks.size()) == L, "Gpt::backward needs a forward first");
  // dres carries dL/d(block l's input), last block first. Without the embedding its final value
  // is the stage's input gradient: dx is its storage.
  Buffer dres_storage;
  Tensor dres;
  if (stage_.head) {
    TESSERA_CHECK(!from.dy.defined(), "Gpt::backward: the stage with the head starts from its loss (loss_scale), "
                  "not from an output gradient dy");
    head_backward(ex, ctx, alloc, from.loss_scale, dres_storage, dres, dx, deferred);
    // The tied head's gradient is final here only on a later stage than the embedding (its copy);
    // on the whole model the token embedding's is final after the embedding's backward.
    ready(head_ids_);
    ready(ln_f_ids_);
  } else {
    TESSERA_CHECK(from.dy.defined(), "Gpt::backward: the pipeline stage with layers [", stage_.first_layer, ", ",
                  stage_.end_layer, ") has no head: it starts from dy, the gradient of its output");
    dres = residual_grad(ctx, alloc, dres_storage, dx);
    check_shape("Gpt::backward", "dy", from.dy, dres.shape);
    if (from.dy.data != dres.data) copy(ex, dres, from.dy);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    blocks_[l].backward(ex, ctx.blocks[l], alloc, dres, block_input(ctx, l), ctx.seq, deferred, ctx.lora_dropout.get());
    ctx.resid[l + 1].release();
    ready(block_ids_[static_cast<size_t>(l)]);
  }
  if (stage_.embedding) {
    if (ctx.vision) images_backward(ex, ctx, alloc, dres);
    embed_.backward(ex, alloc, dres, ctx.tokens, ctx.seq);
    ready(embed_ids_);
    ready(vision_ids_);
  }
  ctx = GptCtx{};
}

void Gpt::recompute(const Exec& ex, GptCtx& ctx, Allocator& alloc) const {
  ProfileScope scope(prof_, OpFamily::Other);
  const int64_t L = stage_.layers();
  TESSERA_CHECK(static_cast<int64_t>(ctx.blocks.size()) == L, "Gpt::recompute needs a forward first");
  for (int64_t l = 0; l < L; ++l)
    blocks_[l].recompute(ex, ctx.blocks[l], alloc, block_input(ctx, l), ctx.seq, ctx.lora_dropout.get());
}

void Gpt::backward_weight(const Exec& ex, WeightGrads& deferred, const GradsReady& on_ready) const {
  ProfileScope scope(prof_, OpFamily::Other);
  deferred.run(ex, on_ready);
}

}  // namespace tessera
