// The vision encoder and projector (model/vision.h): modules over the same kernels as the GPT.
#include "model/vision.h"

#include <cmath>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/gelu.h"

namespace tessera {

namespace {
Buffer activation(Allocator& alloc, DType dt, Shape s) { return Buffer(alloc, dt, s, MemCategory::Activations); }
Buffer workspace(Allocator& alloc, DType dt, Shape s) { return Buffer(alloc, dt, s, MemCategory::Workspace); }
}  // namespace

VisionTower::VisionTower(ParameterStore& ps, const ModelConfig& cfg, TensorParallel tp) : ps_(&ps) {
  const ModelConfig vc = vision_block_config(cfg);
  // The blocks' own checks would name model.n_head and model.ffn_hidden: name the vision keys.
  TESSERA_CHECK(vc.n_head % tp.size() == 0, "vision.n_head = ", vc.n_head, " is not divisible by parallel.tp = ",
                tp.size());
  TESSERA_CHECK(vc.ffn_hidden % tp.size() == 0, "vision.ffn_hidden = ", vc.ffn_hidden,
                " is not divisible by parallel.tp = ", tp.size());
  tp.sequence_parallel = false;  // the encoder's stream stays whole on every tp rank
  P_ = cfg.vision.num_patches();
  K_ = cfg.vision.patch_dim();
  W_ = vc.n_embd;
  C_ = cfg.n_embd;
  patch_ = Linear(ps, "vision.patch", K_, W_, true, ShardSpec::replicated(), cfg.init_std);
  pos_ = ps.add({"vision.pos.weight", {P_, W_}, ShardSpec::replicated(), ParamKind::Embedding, InitKind::Normal,
                 cfg.init_std / 2});
  for (int64_t l = 0; l < vc.n_layer; ++l)
    blocks_.emplace_back(ps, "vision.blocks." + std::to_string(l), vc, Recompute::None, tp,
                         /*causal=*/false);
  ln_f_ = Norm(ps, "vision.ln_f", vc);
  fc1_ = Linear(ps, "projector.fc1", W_, C_, true, ShardSpec::replicated(), cfg.init_std);
  fc2_ = Linear(ps, "projector.fc2", C_, C_, true, ShardSpec::replicated(), cfg.init_std);
}

void VisionTower::forward(const Exec& ex, VisionCtx& ctx, Allocator& alloc, const Tensor& patches) const {
  check_dtype("VisionTower::forward", "patches", patches, ps_->dtype());
  TESSERA_CHECK(patches.ndim() == 3, "VisionTower::forward: patches must be (N, P, K), got ", patches.shape.str());
  const int64_t N = patches.dim(0);
  check_shape("VisionTower::forward", "patches", patches, Shape{N, P_, K_});
  const DType dt = ps_->dtype();
  const int64_t L = static_cast<int64_t>(blocks_.size());
  ctx = VisionCtx{};
  ctx.N = N;
  ctx.patches = patches;
  for (int64_t l = 0; l <= L; ++l) ctx.resid.push_back(activation(alloc, dt, {N, P_, W_}));
  ctx.blocks.resize(static_cast<size_t>(L));
  // Patch embedding (one GEMM over every patch of every image), then the learned positions.
  const Tensor x0 = ctx.resid[0];
  patch_.forward(ex, x0, patches);
  const Tensor pos = ps_->param(pos_);
  for (int64_t n = 0; n < N; ++n) {
    const Tensor img = x0.slice_rows(n, n + 1).view({P_, W_});
    residual_forward(ex, img, img, pos);
  }
  const SequenceLayout seq = SequenceLayout::contiguous(P_);
  for (int64_t l = 0; l < L; ++l)
    blocks_[l].forward(ex, ctx.blocks[l], alloc, ctx.resid[l + 1], ctx.resid[l], seq);
  ln_f_.forward(ex, ctx.ln_f, alloc, ctx.resid[L]);
  // Projector: fc1, GELU, fc2.
  ctx.h = activation(alloc, dt, {N, P_, C_});
  ctx.act = activation(alloc, dt, {N, P_, C_});
  ctx.out = activation(alloc, dt, {N, P_, C_});
  fc1_.forward(ex, ctx.h, ctx.ln_f.y);
  gelu_forward(ex, ctx.act, ctx.h);
  fc2_.forward(ex, ctx.out, ctx.act);
}

void VisionTower::backward(const Exec& ex, VisionCtx& ctx, Allocator& alloc, const Tensor& dout) const {
  TESSERA_CHECK(ctx.out.defined(), "VisionTower::backward needs a forward first");
  const int64_t N = ctx.N, L = static_cast<int64_t>(blocks_.size());
  const DType dt = ps_->dtype();
  check_shape("VisionTower::backward", "dout", dout, Shape{N, P_, C_});
  Buffer dact = workspace(alloc, dt, {N, P_, C_});
  fc2_.backward(ex, dact, dout, ctx.act);
  gelu_backward(ex, dact, dact, ctx.h);  // in place: dact becomes dh
  Buffer dln = workspace(alloc, dt, {N, P_, W_});
  fc1_.backward(ex, dln, dact, ctx.ln_f.y);
  dact.release();
  // The residual stream's gradient; the norm's backward adds to it.
  Buffer dres = workspace(alloc, dt, {N, P_, W_});
  fill_zero(ex, dres);
  ln_f_.backward(ex, dres, dln, ctx.resid[L], ctx.ln_f);
  dln.release();
  const SequenceLayout seq = SequenceLayout::contiguous(P_);
  for (int64_t l = L - 1; l >= 0; --l) {
    blocks_[l].backward(ex, ctx.blocks[l], alloc, dres, ctx.resid[l], seq);
    ctx.resid[l + 1].release();
  }
  // Positions: each image's rows add to the (P, W) table; the patch GEMM's weight and bias.
  const Tensor dpos = ps_->grad(pos_);
  if (dpos.defined())  // frozen: none
    for (int64_t n = 0; n < N; ++n) accumulate(ex, dpos, dres.tensor().slice_rows(n, n + 1).view({P_, W_}));
  patch_.backward(ex, Tensor(), dres, ctx.patches);
  ctx = VisionCtx{};
}

void VisionTower::set_profiler(Profiler* p) {
  prof_ = p;
  patch_.set_profiler(p);
  for (Block& b : blocks_) b.set_profiler(p);
  ln_f_.set_profiler(p);
  fc1_.set_profiler(p);
  fc2_.set_profiler(p);
}

}  // namespace tessera
