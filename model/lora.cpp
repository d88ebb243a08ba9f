// LoRA adapters: parameter registration (A Kaiming-uniform, B zero), the target names, and the
// forward/backward GEMMs around a Linear's.
#include "model/lora.h"

#include <fnmatch.h>

#include <cmath>

#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"

namespace tessera {

std::string lora_layer_suffix(const std::string& layer) {
  if (layer.rfind("blocks.", 0) != 0) return "";
  const size_t dot = layer.find('.', 7);  // after "blocks.<i>"
  return dot == std::string::npos ? "" : layer.substr(dot + 1);
}

bool lora_targets_layer(const LoraConfig& cfg, const std::string& layer) {
  if (!cfg.enabled()) return false;
  const std::string suffix = lora_layer_suffix(layer);
  if (suffix.empty()) return false;
  for (const std::string& t : cfg.targets)
    if (::fnmatch(t.c_str(), suffix.c_str(), 0) == 0) return true;
  return false;
}

std::vector<std::string> lora_layer_names(const std::string& preset) {
  if (preset == "llama") return {"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.gate", "mlp.up", "mlp.down"};
  return {"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj"};
}

void validate_lora(const LoraConfig& cfg, const std::string& preset) {
  TESSERA_CHECK(cfg.rank >= 0, "lora.rank = ", cfg.rank, ": expected a rank >= 1 (or 0 for no adapters)");
  if (!cfg.enabled()) return;
  TESSERA_CHECK(cfg.alpha > 0 && std::isfinite(cfg.alpha), "lora.alpha = ", cfg.alpha, ": expected a number > 0");
  TESSERA_CHECK(cfg.dropout >= 0.0 && cfg.dropout < 1.0, "lora.dropout = ", cfg.dropout,
                ": expected a probability in [0, 1)");
  TESSERA_CHECK(!cfg.targets.empty(), "lora.targets is empty: name the linear layers to adapt, e.g. [\"attn.q\", "
                "\"attn.v\"]");
  const std::vector<std::string> names = lora_layer_names(preset);
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "\"" : ", \"") + n + "\"";
  for (const std::string& t : cfg.targets) {
    bool matched = false;
    for (const std::string& n : names) matched = matched || ::fnmatch(t.c_str(), n.c_str(), 0) == 0;
    TESSERA_CHECK(matched, "lora.targets: \"", t, "\" names no linear layer of a ", preset, " block (they are ", known,
                  "; q, k and v are separate layers, there is no fused attn.qkv; globs like \"mlp.*\" allowed)");
  }
}

LoraAdapter::LoraAdapter(ParameterStore& ps, const std::string& layer, int64_t in, int64_t out, ShardSpec layer_shard,
                         bool sum_grad_over_tp, const LoraConfig& cfg)
    : ps_(&ps), layer_(layer), rank_(cfg.rank), scale_(cfg.scale()), dropout_(cfg.dropout) {
  TESSERA_CHECK(cfg.enabled(), "LoraAdapter for ", layer, " with lora.rank = ", cfg.rank);
  const bool column = layer_shard.axis == GridAxis::Tp && layer_shard.dim == 0;
  const bool row = layer_shard.axis == GridAxis::Tp && layer_shard.dim == 1;
  // Column-parallel: A whole, each rank's dA a partial sum over its out rows; B split on out.
  // Row-parallel: A split on in; B whole, each rank's dB from its partial A x. Replicated: the layer's.
  ParamSpec a{layer + ".lora_A.weight", {cfg.rank, in}, row ? ShardSpec::tp(1) : ShardSpec::replicated(),
              ParamKind::Matrix, InitKind::Uniform, 1.0 / std::sqrt(static_cast<double>(in)),
              column || sum_grad_over_tp};
  ParamSpec b{layer + ".lora_B.weight", {out, cfg.rank}, column ? ShardSpec::tp(0) : ShardSpec::replicated(),
              ParamKind::Matrix, InitKind::Zeros, 0.0, row || sum_grad_over_tp};
  a_ = ps.add(std::move(a));
  b_ = ps.add(std::move(b));
}

DropoutCoords LoraAdapter::dropout_coords(const LoraDropout& drop) const {
  const ParamEntry& a = ps_->entry(a_);  // (r, in_local): split on in under a row-parallel layer
  const bool split_in = a.spec.shard.axis == GridAxis::Tp && a.spec.shard.dim == 1;
  const std::string stream = layer_ + ".lora_dropout";
  return {philox::make_key(drop.seed, stream.c_str()), static_cast<uint64_t>(drop.step), drop.sample0, drop.positions,
          split_in ? a.shard_start : 0};
}

Buffer LoraAdapter::dropped(const Exec& ex, const Tensor& x, const LoraDropout& drop) const {
  const int64_t in = ps_->entry(a_).local_shape[1];
  const int64_t n = x.numel() / in;
  Buffer xd(ps_->allocator(), x.dtype, {n, in}, MemCategory::Workspace);
  dropout_forward(ex, xd.tensor(), x.view({n, in}), dropout_, dropout_coords(drop));
  return xd;
}

Buffer LoraAdapter::down(const Exec& ex, const Tensor& x) const {
  const Tensor A = ps_->compute_param(a_);  // (r, in_local)
  const int64_t n = x.numel() / A.dim(1);
  Buffer u(ps_->allocator(), x.dtype, {n, rank_}, MemCategory::Workspace);
  matmul(ex, u.tensor(), x.view({n, A.dim(1)}), A, false, true);  // (N, r) = x A^T
  return u;
}

void LoraAdapter::forward(const Exec& ex, const Tensor& y, const Tensor& x, const LoraDropout* drop) const {
  const Tensor B = ps_->compute_param(b_);  // (out_local, r)
  Buffer u;                                 // (N, r)
  if (drops(drop)) {
    const Buffer xd = dropped(ex, x, *drop);
    u = down(ex, xd.tensor());
  } else {
    u = down(ex, x);
  }
  const int64_t n = u.tensor().dim(0);
  matmul(ex, y.view({n, B.dim(0)}), u.tensor(), B, false, true, scale_, 1.0);  // y += s u B^T
}

void LoraAdapter::backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x, bool weights,
                           const LoraDropout* drop) const {
  const Tensor A = ps_->compute_param(a_), B = ps_->compute_param(b_);  // (r, in_local), (out_local, r)
  const int64_t n = dy.numel() / B.dim(0), in = A.dim(1);
  const Tensor dy2 = dy.view({n, B.dim(0)});
  const Tensor dA = ps_->grad(a_), dB = ps_->grad(b_);
  const bool dropping = drops(drop);
  if (dx.defined() || (weights && dA.defined())) {
    Buffer gu(ps_->allocator(), dy.dtype, {n, rank_}, MemCategory::Workspace);
    matmul(ex, gu.tensor(), dy2, B, false, false, scale_, 0.0);  // (N, r) = s dy B
    if (dx.defined() && !dropping) matmul(ex, dx.view({n, in}), gu.tensor(), A, false, false, 1.0, 1.0);  // dx += gu A
    if (dx.defined() && dropping) {  // dx += dropout'(gu A): the mask recomputed
      Buffer t(ps_->allocator(), dy.dtype, {n, in}, MemCategory::Workspace);
      matmul(ex, t.tensor(), gu.tensor(), A, false, false, 1.0, 0.0);
      dropout_backward(ex, t.tensor(), t.tensor(), dropout_, dropout_coords(*drop));
      accumulate(ex, dx.view({n, in}), t.tensor());
    }
    if (weights && dA.defined()) {
      if (dropping) {
        const Buffer xd = dropped(ex, x, *drop);
        matmul(ex, dA, gu.tensor(), xd.tensor(), true, false, 1.0, 1.0);  // dA += gu^T x'
      } else {
        matmul(ex, dA, gu.tensor(), x.view({n, in}), true, false, 1.0, 1.0);
      }
    }
  }
  if (weights && dB.defined()) {
    Buffer u;
    if (dropping) {
      const Buffer xd = dropped(ex, x, *drop);
      u = down(ex, xd.tensor());
    } else {
      u = down(ex, x);
    }
    matmul(ex, dB, dy2, u.tensor(), true, false, scale_, 1.0);  // (out, r) += s dy^T u
  }
}

void LoraAdapter::backward_weight(const Exec& ex, const Tensor& dy, const Tensor& x, const LoraDropout* drop) const {
  backward(ex, Tensor(), dy, x, true, drop);
}

}  // namespace tessera
