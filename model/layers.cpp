// Linear, Embedding and Norm: thin modules over the kernels, owning parameter ids, not memory.
#include "model/layers.h"

#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/weight_grads.h"

namespace tessera {

// ---- Linear ----

Linear::Linear(ParameterStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
               ShardSpec weight_shard, double init_std, bool sum_grad_over_tp)
    : ps_(&ps) {
  weight_ = ps.add(
      {name + ".weight", {out, in}, weight_shard, ParamKind::Matrix, InitKind::Normal, init_std, sum_grad_over_tp});
  if (bias) {
    // A column-parallel layer's bias is split with its output features; a row-parallel one's is whole.
    ShardSpec bias_shard = weight_shard.dim == 0 ? ShardSpec::tp(0) : ShardSpec::replicated();
    bias_ = ps.add({name + ".bias", {out}, bias_shard, ParamKind::Bias, InitKind::Zeros, 0.0, sum_grad_over_tp});
  }
}

Linear Linear::tied(ParameterStore& ps, int weight_id) {
  Linear l;
  l.ps_ = &ps;
  l.weight_ = weight_id;
  return l;
}

void Linear::add_lora(ParameterStore& ps, const std::string& name, ShardSpec weight_shard, bool sum_grad_over_tp,
                      const LoraConfig& cfg) {
  const Shape& g = ps.entry(weight_).spec.global_shape;  // (out, in)
  lora_ = std::make_shared<const LoraAdapter>(ps, name, g[1], g[0], weight_shard, sum_grad_over_tp, cfg);
}

int64_t Linear::in() const { return ps_->entry(weight_).local_shape[1]; }
int64_t Linear::out() const { return ps_->entry(weight_).local_shape[0]; }

void Linear::forward(const Exec& ex, const Tensor& y, const Tensor& x, bool with_bias, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Matmul);
  linear_forward(ex, y, x, ps_->compute_param(weight_), bias_ >= 0 && with_bias ? ps_->param(bias_) : Tensor());
  if (lora_) lora_->forward(ex, y, x, drop);
}

void Linear::backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate_dx,
                      WeightGrads* deferred, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Matmul);
  const Tensor w = ps_->compute_param(weight_);  // the bf16 copy under mixed precision
  const int64_t n = dy.numel() / out();
  const bool whole = ps_->grad(weight_).defined() && !deferred;
  if (!whole) {
    // dx = dy W (+ dx): linear_backward's own GEMM for it, alone; dW and db go to W (deferred) or
    // nowhere (a frozen weight).
    if (dx.defined()) matmul(ex, dx.view({n, in()}), dy.view({n, out()}), w, false, false, 1.0, accumulate_dx ? 1.0 : 0.0);
    if (lora_) lora_->backward(ex, dx, dy, x, /*weights=*/!deferred, drop);
    if (deferred) deferred->defer(ex, *this, dy, x, lora_ && lora_->drops(drop) ? drop : nullptr);
    else weight_grads(ex, dy, x);  // the bias check
    return;
  }
  const Tensor db = bias_ >= 0 ? ps_->grad(bias_) : Tensor();
  if (!accumulate_dx || !dx.defined()) {
    linear_backward(ex, dx, ps_->grad(weight_), db, dy, x, w);
  } else {
    linear_backward(ex, Tensor(), ps_->grad(weight_), db, dy, x, w);
    matmul(ex, dx.view({n, in()}), dy.view({n, out()}), w, false, false, 1.0, 1.0);  // dx += dy W
  }
  if (lora_) lora_->backward(ex, dx, dy, x, true, drop);
}

void Linear::backward_input(const Exec& ex, const Tensor& dx, const Tensor& dy, bool accumulate_dx) const {
  ProfileScope scope(prof_, OpFamily::Matmul);
  const int64_t n = dy.numel() / out();
  matmul(ex, dx.view({n, in()}), dy.view({n, out()}), ps_->compute_param(weight_), false, false, 1.0,
         accumulate_dx ? 1.0 : 0.0);
  if (lora_) lora_->backward(ex, dx, dy, Tensor(), /*weights=*/false);
}

void Linear::weight_grads(const Exec& ex, const Tensor& dy, const Tensor& x) const {
  const Tensor dw = ps_->grad(weight_);
  if (!dw.defined()) {
    // A frozen weight's bias is frozen too (its gradient, if it keeps one, is not used).
    TESSERA_CHECK(bias_ < 0 || ps_->entry(bias_).frozen, "train.freeze freezes ", ps_->entry(weight_).spec.name,
                  " but not ", ps_->entry(bias_).spec.name, ": freeze a linear layer's weight and bias together");
    return;
  }
  // w's dtype picks the GEMM the whole backward uses (the bf16 copy under mixed precision).
  linear_backward(ex, Tensor(), dw, bias_ >= 0 ? ps_->grad(bias_) : Tensor(), dy, x, ps_->compute_param(weight_));
}

void Linear::backward_weight(const Exec& ex, const Tensor& dy, const Tensor& x, const LoraDropout* drop) const {
  ProfileScope scope(prof_, OpFamily::Matmul);
  weight_grads(ex, dy, x);
  if (lora_) lora_->backward_weight(ex, dy, x, drop);
}

// ---- Embedding ----

ParamSpec Embedding::token_spec(const ModelConfig& cfg) {
  return {"wte.weight", {cfg.vocab_size, cfg.n_embd}, ShardSpec::tp_padded(0), ParamKind::Embedding, InitKind::Normal,
          cfg.init_std};
}

Embedding::Embedding(ParameterStore& ps, const ModelConfig& cfg, const TensorParallel& tp,
                     bool sum_grad_over_embedding_group)
    : ps_(&ps), tp_(tp), shard_(VocabShard::of(cfg.vocab_size, tp.size(), tp.rank())) {
  ParamSpec wte = token_spec(cfg);
  wte.sum_grad_over_embedding_group = sum_grad_over_embedding_group;
  wte_ = ps.add(std::move(wte));
  // Every tp rank computes the whole position gradient from the full output gradient: no sum.
  if (cfg.position == PositionKind::Learned)
    wpe_ = ps.add({"wpe.weight", {cfg.max_seq_len, cfg.n_embd}, ShardSpec::replicated(), ParamKind::Embedding,
                   InitKind::Normal, cfg.init_std / 2});
}

namespace {
void check_layout(const char* op, const char* arg, const Tensor& t, const SequenceLayout& seq) {
  TESSERA_CHECK(t.ndim() >= 2 && t.dim(1) == seq.length(), op, ": ", arg, " ", t.shape.str(),
                " does not hold the sequence layout ", seq.str(), " (", seq.length(), " positions) along dim 1");
}
}  // namespace

void Embedding::forward(const Exec& ex, Allocator& alloc, const Tensor& out, const Tensor& tokens,
                        const SequenceLayout& seq) const {
  ProfileScope scope(prof_, OpFamily::Embedding);
  check_layout("Embedding::forward", "tokens", tokens, seq);
  // The full (B, T, C) output, partial over tp: this rank's ids, positions on rank 0 only.
  Buffer staging;
  const Tensor full = region_full(tp_, alloc, staging, out, tokens.dim(1));
  const bool positions = wpe_ >= 0 && tp_.rank() == 0;
  const Tensor wte = ps_->param(wte_), wpe = positions ? ps_->param(wpe_) : Tensor();
  for (const SequenceRun& r : seq.runs(tokens.dim(0)))
    embedding_forward(ex, run_view(full, r), run_view(tokens, r), wte, wpe, r.position, shard_);
  leave_region(ex, tp_, alloc, out, full);
}

void Embedding::backward(const Exec& ex, Allocator& alloc, const Tensor& dout, const Tensor& tokens,
                         const SequenceLayout& seq) const {
  ProfileScope scope(prof_, OpFamily::Embedding);
  check_layout("Embedding::backward", "tokens", tokens, seq);
  Buffer staging;
  const Tensor full = leave_region_backward(ex, tp_, alloc, staging, dout, tokens.dim(1));
  const Tensor dwte = ps_->grad(wte_), dwpe = wpe_ >= 0 ? ps_->grad(wpe_) : Tensor();
  if (!dwte.defined() && !dwpe.defined()) return;  // frozen: no gradient to compute
  if (!dwte.defined()) {  // the token table frozen (no gradient), the positions trained
    const int64_t T = full.dim(1), C = full.dim(2);
    const Tensor rows = full.view({full.dim(0) * T, C});
    for (const SequenceRun& r : seq.runs(tokens.dim(0)))
      for (int64_t b = r.b_begin; b < r.b_end; ++b)  // dwpe[position + i] += dout[b, row + i]
        accumulate(ex, dwpe.slice_rows(r.position, r.position + r.length),
                   rows.slice_rows(b * T + r.row, b * T + r.row + r.length));
    return;
  }
  for (const SequenceRun& r : seq.runs(tokens.dim(0)))
    embedding_backward(ex, dwte, dwpe, run_view(full, r), run_view(tokens, r), r.position, shard_);
}

// ---- Rope ----

void Rope::forward(const Exec& ex, const Tensor& y, const Tensor& x, const SequenceLayout& seq) const {
  check_layout("Rope::forward", "x", x, seq);
  for (const SequenceRun& r : seq.runs(x.dim(0))) rope_forward(ex, run_view(y, r), run_view(x, r), r.position, theta_);
}

void Rope::backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const SequenceLayout& seq) const {
  check_layout("Rope::backward", "dy", dy, seq);
  for (const SequenceRun& r : seq.runs(dy.dim(0)))
    rope_backward(ex, run_view(dx, r), run_view(dy, r), r.position, theta_);
}

// ---- Norm ----

Norm::Norm(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, bool sequence_parallel)
    : ps_(&ps), kind_(cfg.norm), eps_(cfg.norm_eps) {
  weight_ = ps.add({name + ".weight", {cfg.n_embd}, ShardSpec::replicated(), ParamKind::Norm, InitKind::Ones, 0.0,
                    sequence_parallel});
  if (cfg.bias)
    bias_ = ps.add({name + ".bias", {cfg.n_embd}, ShardSpec::replicated(), ParamKind::Norm, InitKind::Zeros, 0.0,
                    sequence_parallel});
}

void Norm::forward(const Exec& ex, NormCtx& ctx, Allocator& alloc, const Tensor& x) const {
  const int64_t rows = x.numel() / x.dim(-1);
  ctx.y = Buffer(alloc, x.dtype, x.shape, MemCategory::Activations);
  ctx.rstd = Buffer(alloc, x.dtype, {rows}, MemCategory::Activations);
  if (kind_ == NormKind::LayerNorm) ctx.mean = Buffer(alloc, x.dtype, {rows}, MemCategory::Activations);
  run(ex, ctx, x);
}

void Norm::recompute_output(const Exec& ex, NormCtx& ctx, Allocator& alloc, const Tensor& x) const {
  TESSERA_CHECK(ctx.rstd.defined(), "Norm::recompute_output needs the context of a forward");
  ctx.y = Buffer(alloc, x.dtype, x.shape, MemCategory::Activations);
  run(ex, ctx, x);
}

void Norm::run(const Exec& ex, NormCtx& ctx, const Tensor& x) const {
  ProfileScope scope(prof_, OpFamily::Norm);
  if (kind_ == NormKind::LayerNorm) {
    layernorm_forward(ex, ctx.y, ctx.mean, ctx.rstd, x, ps_->param(weight_), bias_ >= 0 ? ps_->param(bias_) : Tensor(),
                      eps_);
  } else {
    rmsnorm_forward(ex, ctx.y, ctx.rstd, x, ps_->param(weight_), eps_);
  }
}

void Norm::backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x, const NormCtx& ctx) const {
  ProfileScope scope(prof_, OpFamily::Norm);
  if (kind_ == NormKind::LayerNorm)
    layernorm_backward(ex, dx, ps_->grad(weight_), bias_ >= 0 ? ps_->grad(bias_) : Tensor(), dy, x, ps_->param(weight_),
                       ctx.mean, ctx.rstd);
  else
    rmsnorm_backward(ex, dx, ps_->grad(weight_), dy, x, ps_->param(weight_), ctx.rstd);
}

}  // namespace tessera
