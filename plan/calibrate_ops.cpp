// The op families of plan/calibrate.h besides the GEMMs: which shapes a model's step runs them at
// (model_op_shapes), and timing each one through the kernel the trainer calls (time_ops).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/check.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "plan/calibrate.h"
#include "plan/calibrate_ops.h"

namespace tessera::plan {

std::vector<OpTime> model_op_shapes(const Workload& w, int64_t ranks) {
  const ModelConfig& m = w.model;
  std::set<std::tuple<int, std::vector<int64_t>, bool>> seen;
  std::vector<OpTime> out;
  const auto add = [&](OpKind op, std::vector<int64_t> shape, bool bf16 = false) {
    if (seen.insert({int(op), shape, bf16}).second) out.push_back({op, shape, bf16, 0});
  };
  const bool layernorm = m.norm == NormKind::LayerNorm, swiglu = m.mlp == MlpKind::SwiGlu;
  const bool rope = m.position == PositionKind::Rope;
  for (int64_t tp = 1; tp <= ranks; ++tp) {
    if (ranks % tp != 0 || m.n_head % tp != 0 || m.ffn_hidden % tp != 0) continue;
    const int64_t C = m.n_embd, D = m.head_dim(), H = m.n_head / tp, F = m.ffn_hidden / tp;
    const int64_t KV = m.kv_heads() % tp == 0 ? m.kv_heads() / tp : m.kv_heads();
    const int64_t V = (m.vocab_size + tp - 1) / tp, T = w.seq_len;
    for (int64_t mb = 1; mb <= 8; mb *= 2) {
      if (w.global_batch % mb != 0) continue;
      const int64_t N = mb * T;
      // Fewer KV heads than tp ranks: k and v are replicated and each rank attends with its one KV head.
      const int64_t KVa = m.kv_heads() % tp == 0 ? KV : 1;
      add(OpKind::AttentionForward, {mb, T, T, H, KVa, D});
      add(OpKind::AttentionBackward, {mb, T, T, H, KVa, D});
      for (int64_t rows : {N, tp > 1 && N % tp == 0 ? N / tp : N}) {  // without and with sequence parallelism
        add(layernorm ? OpKind::LayerNormForward : OpKind::RmsNormForward, {rows, C});
        add(layernorm ? OpKind::LayerNormBackward : OpKind::RmsNormBackward, {rows, C});
        add(OpKind::ResidualForward, {rows * C});
        add(OpKind::ResidualBackward, {rows * C});
      }
      add(swiglu ? OpKind::SwigluForward : OpKind::GeluForward, {N * F});
      add(swiglu ? OpKind::SwigluBackward : OpKind::GeluBackward, {N * F});
      if (rope)
        for (int64_t heads : {H, KV}) add(OpKind::RopeForward, {N * heads * D}), add(OpKind::RopeBackward, {N * heads * D});
      add(OpKind::EmbeddingForward, {N, C, V});
      add(OpKind::EmbeddingBackward, {N, C, V});
      add(OpKind::CrossEntropyForward, {N, V});
      add(OpKind::CrossEntropyBackward, {N, V});
      // The Linears (rows N: under sequence parallelism they run on the gathered sequence): q, k and
      // v, the attention's output, the MLP's one or two inputs and its output (biases as the model
      // has them), and the LM head (none); fp32 and with the weight's bf16 copy.
      const int64_t bias = m.bias ? 1 : 0;
      const std::vector<std::vector<int64_t>> linears = {
          {N, C, H * D, bias}, {N, C, KV * D, bias}, {N, H * D, C, bias}, {N, C, F, bias}, {N, F, C, bias}, {N, C, V, 0}};
      for (const std::vector<int64_t>& shape : linears)
        for (OpKind op : {OpKind::LinearForward, OpKind::LinearBackwardInput, OpKind::LinearBackwardWeight})
          for (bool bf16 : {false, true}) add(op, shape, bf16);
    }
  }
  CostCache cache;
  const double params = cache.stages(w, Layout{}).parameters.front();
  for (int64_t shards = 1; shards <= 2 * ranks; shards *= 2) {
    const int64_t n = std::max<int64_t>(1, int64_t(std::ceil(params / double(shards))));
    add(OpKind::AdamW, {n}, false);
    add(OpKind::AdamW, {n}, true);
    add(OpKind::GradNorm, {n});
  }
  return out;
}

namespace {

// The shape actually timed: the leading dim (rows, elements, the attention's batch) reduced while
// the largest tensor holds more than max_elements, or the attention more than max_flops.
std::vector<int64_t> timed_shape(const OpTime& t, const CalibrationOptions& o) {
  std::vector<int64_t> s = t.shape;
  const auto largest = [&] {
    switch (t.op) {
      case OpKind::AttentionForward:
      case OpKind::AttentionBackward: return double(s[0] * std::max(s[1], s[2]) * s[3] * s[5]);
      case OpKind::EmbeddingForward:
      case OpKind::EmbeddingBackward: return double(std::max(s[0], s[2]) * s[1]);
      case OpKind::LinearForward:
      case OpKind::LinearBackwardInput:
      case OpKind::LinearBackwardWeight: return double(std::max({s[0] * s[1], s[0] * s[2], s[1] * s[2]}));
      default: {
        double n = 1;
        for (int64_t d : s) n *= double(d);
        return n;
      }
    }
  };
  const auto flops = [&] {
    if (t.op == OpKind::AttentionForward || t.op == OpKind::AttentionBackward)
      return 2.0 * double(s[0] * s[1] * s[2] * s[3] * s[5]);
    return is_linear(t.op) ? 2.0 * double(s[0] * s[1] * s[2]) : 0.0;
  };
  while (s[0] > 1 && (largest() > o.max_op_elements || flops() > o.max_gemm_flops)) s[0] = (s[0] + 1) / 2;
  return s;
}

}  // namespace

CalibrationBuffers::CalibrationBuffers(const Exec& ex) : ex_(ex), alloc_(ex.device, ex.stream) {}

CalibrationBuffers::~CalibrationBuffers() {
  synchronize(ex_);  // nothing queued may still use a block
  buffers_.clear();
}

Tensor CalibrationBuffers::zeros(DType dtype, Shape shape) {
  buffers_.emplace_back(alloc_, dtype, shape, MemCategory::Workspace);
  return buffers_.back().tensor();
}

Tensor CalibrationBuffers::f(Shape shape, float scale) {
  const Tensor t = zeros(DType::F32, shape);
  std::vector<float> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * float(int64_t(i % 97) - 48) / 48.0f;
  copy(ex_, t, Tensor(v.data(), DType::F32, shape));
  return t;
}

Tensor CalibrationBuffers::ids(Shape shape, int64_t bound) {
  const Tensor t = zeros(DType::I32, shape);
  std::vector<int32_t> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t((int64_t(i) * 7919) % bound);
  copy(ex_, t, Tensor(v.data(), DType::I32, shape));
  return t;
}

Tensor CalibrationBuffers::bf16(Shape shape) { return zeros(DType::BF16, shape); }
Tensor CalibrationBuffers::f64(Shape shape) { return zeros(DType::F64, shape); }

std::function<void()> op_runner(OpKind op, const std::vector<int64_t>& s, bool bf16, const Exec& ex,
                                std::shared_ptr<void>& keep) {
  auto b = std::make_shared<CalibrationBuffers>(ex);
  keep = b;
  switch (op) {
    case OpKind::AttentionForward:
    case OpKind::AttentionBackward: {
      const int64_t B = s[0], T = s[1], S = s[2], H = s[3], KV = s[4], D = s[5];
      const Tensor q = b->f({B, T, H, D}, 0.3f), k = b->f({B, S, KV, D}, 0.3f), v = b->f({B, S, KV, D});
      const Tensor out = b->f({B, T, H, D}), lse = b->f({B, H, T});
      const int64_t q_offset = S - T;  // the queries are the sequence's last T positions
      attention_forward(ex, out, lse, q, k, v, q_offset, 0);
      if (op == OpKind::AttentionForward) return [=] { attention_forward(ex, out, lse, q, k, v, q_offset, 0); };
      const Tensor dout = b->f({B, T, H, D}), dq = b->f({B, T, H, D}), dk = b->f({B, S, KV, D}), dv = b->f({B, S, KV, D});
      return [=] { attention_backward(ex, dq, dk, dv, dout, q, k, v, out, lse, q_offset, 0); };
    }
    case OpKind::LayerNormForward:
    case OpKind::LayerNormBackward: {
      const int64_t N = s[0], C = s[1];
      const Tensor x = b->f({N, C}), y = b->f({N, C}), w = b->f({C}), bias = b->f({C}), mean = b->f({N}), rstd = b->f({N});
      layernorm_forward(ex, y, mean, rstd, x, w, bias, 1e-5);
      if (op == OpKind::LayerNormForward) return [=] { layernorm_forward(ex, y, mean, rstd, x, w, bias, 1e-5); };
      const Tensor dx = b->f({N, C}, 0), dw = b->f({C}, 0), db = b->f({C}, 0);
      return [=] { layernorm_backward(ex, dx, dw, db, y, x, w, mean, rstd); };
    }
    case OpKind::RmsNormForward:
    case OpKind::RmsNormBackward: {
      const int64_t N = s[0], C = s[1];
      const Tensor x = b->f({N, C}), y = b->f({N, C}), w = b->f({C}), rstd = b->f({N});
      rmsnorm_forward(ex, y, rstd, x, w, 1e-5);
      if (op == OpKind::RmsNormForward) return [=] { rmsnorm_forward(ex, y, rstd, x, w, 1e-5); };
      const Tensor dx = b->f({N, C}, 0), dw = b->f({C}, 0);
      return [=] { rmsnorm_backward(ex, dx, dw, y, x, w, rstd); };
    }
    case OpKind::ResidualForward: {
      const Tensor x = b->f({s[0]}), y = b->f({s[0]}), out = b->f({s[0]});
      return [=] { residual_forward(ex, out, x, y); };
    }
    case OpKind::ResidualBackward: {
      const Tensor dy = b->f({s[0]}, 1e-3f), da = b->f({s[0]}, 0), db = b->f({s[0]}, 0);
      return [=] { residual_backward(ex, da, db, dy); };
    }
    case OpKind::GeluForward:
    case OpKind::GeluBackward: {
      const Tensor x = b->f({s[0]}), y = b->f({s[0]});
      if (op == OpKind::GeluForward) return [=] { gelu_forward(ex, y, x); };
      const Tensor dx = b->f({s[0]});
      return [=] { gelu_backward(ex, dx, y, x); };
    }
    case OpKind::SwigluForward:
    case OpKind::SwigluBackward: {
      const Tensor gate = b->f({s[0]}), up = b->f({s[0]}), y = b->f({s[0]});
      if (op == OpKind::SwigluForward) return [=] { swiglu_forward(ex, y, gate, up); };
      const Tensor dgate = b->f({s[0]}), dup = b->f({s[0]});
      return [=] { swiglu_backward(ex, dgate, dup, y, gate, up); };
    }
    case OpKind::RopeForward:
    case OpKind::RopeBackward: {
      // (1, positions, 1, 64): the elements of q or k, a head dim of 64 (the op streams its elements).
      const int64_t D = s[0] % 64 == 0 ? 64 : 2, P = s[0] / D;
      const Tensor x = b->f({1, P, 1, D}), y = b->f({1, P, 1, D});
      if (op == OpKind::RopeForward) return [=] { rope_forward(ex, y, x, 0, 10000.0); };
      return [=] { rope_backward(ex, y, x, 0, 10000.0); };
    }
    case OpKind::EmbeddingForward:
    case OpKind::EmbeddingBackward: {
      const int64_t N = s[0], C = s[1], V = s[2];
      const Tensor tokens = b->ids({1, N}, V), wte = b->f({V, C}), out = b->f({1, N, C});
      // Learned positions (GPT-2) add a table of N rows; RoPE models have none: the look-up dominates.
      const Tensor wpe = b->f({N, C});
      if (op == OpKind::EmbeddingForward) return [=] { embedding_forward(ex, out, tokens, wte, wpe, 0); };
      return [=] { embedding_backward(ex, wte, wpe, out, tokens, 0); };
    }
    case OpKind::CrossEntropyForward:
    case OpKind::CrossEntropyBackward: {
      const int64_t N = s[0], V = s[1];
      const Tensor logits = b->f({N, V}), targets = b->ids({N}, V), losses = b->f({N}), lse = b->f({N});
      cross_entropy_forward(ex, losses, lse, logits, targets);
      if (op == OpKind::CrossEntropyForward) return [=] { cross_entropy_forward(ex, losses, lse, logits, targets); };
      const Tensor dlogits = b->f({N, V});
      return [=] { cross_entropy_backward(ex, dlogits, logits, lse, targets, 1.0 / double(N)); };
    }
    case OpKind::AdamW: {
      const int64_t n = s[0];
      const Tensor p = b->f({n}), g = b->f({n}, 1e-3f), m = b->f({n}, 0), v = b->f({n}, 0);
      const Tensor compute = bf16 ? b->bf16({n}) : Tensor();
      AdamWStep step;
      step.lr = 1e-6, step.weight_decay = 0.1;
      return [=] { adamw_update(ex, p, g, m, v, step, compute); };
    }
    case OpKind::LinearForward:
    case OpKind::LinearBackwardInput:
    case OpKind::LinearBackwardWeight: {
      // As model/layers.cpp runs a Linear: forward linear_forward; dx = dy W (matmul, as backward_input);
      // dW += dy^T x and the bias gradient (linear_backward without dx, as weight_grads).
      const int64_t N = s[0], in = s[1], out = s[2];
      const Tensor x = b->f({N, in}), y = b->f({N, out}), dy = b->f({N, out}, 1e-3f), dx = b->f({N, in});
      const Tensor w32 = b->f({out, in}, 0.1f), dw = b->f({out, in}, 0);
      const Tensor bias = s[3] ? b->f({out}) : Tensor(), dbias = s[3] ? b->f({out}, 0) : Tensor();
      Tensor w = w32;
      if (bf16) {
        w = b->bf16({out, in});
        convert(ex, w, w32);
      }
      if (op == OpKind::LinearForward) return [=] { linear_forward(ex, y, x, w, bias); };
      if (op == OpKind::LinearBackwardInput) return [=] { matmul(ex, dx, dy, w, false, false); };
      return [=] { linear_backward(ex, Tensor(), dw, dbias, dy, x, w); };
    }
    case OpKind::GradNorm: {
      const Tensor g = b->f({s[0]}, 1e-3f), sq = b->f64({1});
      return [=] { squared_norm(ex, sq, g); };
    }
  }
  detail::fail("op_runner: unknown op");
}

void time_ops(const Exec& ex, const CalibrationOptions& o, std::vector<OpTime>& ops,
              const std::function<double(const std::function<void()>&)>& timed) {
  for (OpTime& t : ops) {
    const std::vector<int64_t> s = timed_shape(t, o);
    std::shared_ptr<void> keep;
    const std::function<void()> run = op_runner(t.op, s, t.bf16, ex, keep);
    const double seconds = timed(run);
    std::vector<double> asked(t.shape.begin(), t.shape.end()), measured(s.begin(), s.end());
    t.seconds = seconds * op_work(t.op, asked) / op_work(t.op, measured);
  }
}

}  // namespace tessera::plan
