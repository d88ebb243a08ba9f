// The cost model of plan/cost_model.h. Letters as in model/gpt.h: per micro-batch and rank,
// B sequences, T = seq_len / cp positions (a cp rank's two chunks), N = B T token rows of a tensor-
// parallel region, Nr = N / tp the rows between regions under sequence parallelism (N without),
// C width, D head dim, Hl = H / tp heads, KVl KV heads per rank (all of them when fewer than tp:
// replicated), Fl = F / tp, Vl = ceil(V / tp). Activations and gradients are fp32 (4 bytes), as the
// trainer keeps them under both dtypes; train.dtype = "bf16" makes the GEMM operands 2 bytes.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "kernels/check.h"
#include "model/memory.h"
#include "model/stage_cut.h"
#include "parallel/pipeline_sim.h"
#include "parallel/process_grid.h"

namespace tessera::plan {

// ---- Collectives ----------------------------------------------------------------------------

double all_reduce_seconds(double bytes, int64_t n, const Link& link) {
  return n <= 1 ? 0.0 : 2.0 * double(n - 1) * (link.latency + bytes / (double(n) * link.bandwidth));
}
namespace {
// (n - 1) steps of a ring on the link's fit for that collective (bandwidth 0: the all-reduce's).
double ring_seconds(double bytes, int64_t n, const Link& link, double bandwidth, double latency) {
  if (bandwidth <= 0) bandwidth = link.bandwidth, latency = link.latency;
  return n <= 1 ? 0.0 : double(n - 1) * (latency + bytes / (double(n) * bandwidth));
}
}  // namespace
double all_gather_seconds(double bytes, int64_t n, const Link& link) {
  return ring_seconds(bytes, n, link, link.all_gather_bandwidth, link.all_gather_latency);
}
double reduce_scatter_seconds(double bytes, int64_t n, const Link& link) {
  return ring_seconds(bytes, n, link, link.reduce_scatter_bandwidth, link.reduce_scatter_latency);
}
double p2p_seconds(double bytes, const Link& link) {
  if (link.p2p_bandwidth > 0) return link.p2p_latency + bytes / link.p2p_bandwidth;
  return link.latency + bytes / link.bandwidth;
}
double all_reduce_bytes(double bytes, int64_t n) { return n <= 1 ? 0.0 : 2.0 * double(n - 1) / double(n) * bytes; }
double all_gather_bytes(double bytes, int64_t n) { return n <= 1 ? 0.0 : double(n - 1) / double(n) * bytes; }

// ---- Placement ------------------------------------------------------------------------------

GroupLinks group_links(const Layout& l, const ClusterSpec& c) {
  const int64_t world = l.ranks();
  const ProcessGrid grid({l.tp, l.cp, l.pp, l.dp}, world, 0);
  const auto node = [&](const GridCoords& x) { return grid.rank_of(x) / c.devices_per_node; };
  GroupLinks g;
  // Ranks grow with every coordinate and a node is a run of consecutive ranks, so a group lies in
  // one node exactly when its first and last members do.
  for (int64_t r = 0; r < world; ++r) {
    const GridCoords x = grid.coords_of(r);
    GridCoords lo = x, hi = x;
    lo.tp = 0, hi.tp = l.tp - 1;
    g.tp_across |= node(lo) != node(hi);
    lo = x, hi = x;
    lo.cp = 0, hi.cp = l.cp - 1;
    g.cp_across |= node(lo) != node(hi);
    lo = x, hi = x;
    lo.cp = 0, lo.dp = 0, hi.cp = l.cp - 1, hi.dp = l.dp - 1;
    g.dp_across |= node(lo) != node(hi);
    lo = x, hi = x;
    lo.pp = 0, hi.pp = l.pp - 1;
    g.pp_across |= node(lo) != node(hi);
  }
  g.embedding_across = g.pp_across;  // the first and last stage: the pp group's ends
  // Within a node, each group on the link calibrated for its size (intra_link).
  const auto link = [&](bool across, int64_t size) { return across ? c.inter : intra_link(c, size); };
  g.tp = link(g.tp_across, l.tp);
  g.cp = link(g.cp_across, l.cp);
  g.dp = link(g.dp_across, l.dp * l.cp);
  g.pp = link(g.pp_across, l.pp);
  g.embedding = link(g.embedding_across, 2);
  return g;
}

namespace {

constexpr double kAct = 4;  // bytes of an activation or gradient element (fp32)

// The roofline of one op: its FLOPs at peak x efficiency, its bytes at the memory bandwidth, and
// at least the op latency. Activations and gradients are fp32; a Linear's weight is bf16 under
// train.dtype = "bf16" (the parameters' compute copy), fp32 otherwise.
struct Roofline {
  double peak, bandwidth, latency, weight_bytes, half_flops;
  const ClusterSpec* measured = nullptr;  // its gemm_rates by shape, when it has some of this dtype
  bool bf16 = false;
  std::vector<GemmShape>* record = nullptr;  // gemm_shapes(): every GEMM asked for
  // (m, k) x (k, n) -> (m, n) with a_bytes, b_bytes per element of the inputs, fp32 out; a small
  // GEMM at the calibrated fraction f / (f + half) of the rate; with rates measured by shape, the
  // nearest shape's rate (it already holds the memory traffic).
  double gemm(double m, double n, double k, double a_bytes, double b_bytes) const {
    const double flops = 2 * m * n * k, bytes = m * k * a_bytes + k * n * b_bytes + m * n * kAct;
    if (record) record->push_back({int64_t(m), int64_t(n), int64_t(k)});
    if (measured) {
      const double rate = measured_gemm_rate(*measured, m, n, k, bf16);
      if (rate > 0) return std::max(flops / rate, latency);
    }
    return std::max({(flops + half_flops) / peak, bytes / bandwidth, latency});
  }
  double compute(double flops) const { return std::max(flops / peak, latency); }
  double stream(double elements) const { return std::max(elements * kAct / bandwidth, latency); }
  // The op's measured time at this shape (calibration: measured_op_seconds), else `roofline`.
  double op(OpKind kind, const std::vector<double>& shape, double roofline) const {
    if (measured && has_op_times(*measured, kind)) {
      const double t = measured_op_seconds(*measured, kind, shape, bf16);
      if (t > 0) return std::max(t, latency);
    }
    return roofline;
  }
  bool measures(OpKind kind) const { return measured && has_op_times(*measured, kind); }
};

// One Linear of the block: in -> out features on N rows; forward (x W^T), dX (dY W) and dW (dY^T x).
struct LinearCost {
  double forward = 0, dx = 0, dw = 0, flops = 0;
};
// Calibrated (linear_* op times, as model/layers.cpp runs the Linear: operand layouts, the bias,
// bf16 rounding), else each GEMM at its measured rate or the roofline.
LinearCost linear(const Roofline& r, double rows, double in, double out, bool bias) {
  const std::vector<double> shape = {rows, in, out, bias ? 1.0 : 0.0};
  return {r.op(OpKind::LinearForward, shape, r.gemm(rows, out, in, kAct, r.weight_bytes)),
          r.op(OpKind::LinearBackwardInput, shape, r.gemm(rows, in, out, kAct, r.weight_bytes)),
          r.op(OpKind::LinearBackwardWeight, shape, r.gemm(out, in, rows, kAct, kAct)), 6 * rows * in * out};
}

struct Dims {
  double B, T, Tfull, N, Nr, C, D, Hl, KVl, KVa, Fl, Vl;
  bool swiglu, layernorm, rope, bias;
};

Dims dims_of(const Workload& w, const Layout& l) {
  const ModelConfig& m = w.model;
  Dims d;
  d.B = double(l.micro_batch);
  d.T = double(w.seq_len / l.cp);
  d.Tfull = double(w.seq_len);
  d.N = d.B * d.T;
  d.Nr = l.sp && l.tp > 1 ? d.N / double(l.tp) : d.N;
  d.C = double(m.n_embd);
  d.D = double(m.head_dim());
  d.Hl = double(m.n_head / l.tp);
  d.KVl = double(m.kv_heads() % l.tp == 0 ? m.kv_heads() / l.tp : m.kv_heads());
  d.KVa = m.kv_heads() % l.tp == 0 ? d.KVl : 1.0;  // replicated K and V: each rank attends with its one KV head
  d.Fl = double(m.ffn_hidden / l.tp);
  d.Vl = double((m.vocab_size + l.tp - 1) / l.tp);
  d.swiglu = m.mlp == MlpKind::SwiGlu;
  d.layernorm = m.norm == NormKind::LayerNorm;
  d.rope = m.position == PositionKind::Rope;
  d.bias = m.bias;
  return d;
}

// A block's elementwise ops: the two norms, the two residual adds, the activation, RoPE.
struct ElementwiseOps {
  double norm_forward = 0, act_forward = 0;  // one norm's and the activation's forward
  double rope_forward = 0;                   // RoPE on q and k (0 without)
  double forward = 0, backward = 0;          // all of them
};
ElementwiseOps elementwise_ops(const Dims& d, const Roofline& r) {
  const double q = d.Hl * d.D, kv = d.KVl * d.D;
  const OpKind norm_f = d.layernorm ? OpKind::LayerNormForward : OpKind::RmsNormForward;
  const OpKind norm_b = d.layernorm ? OpKind::LayerNormBackward : OpKind::RmsNormBackward;
  const OpKind act_f = d.swiglu ? OpKind::SwigluForward : OpKind::GeluForward;
  const OpKind act_b = d.swiglu ? OpKind::SwigluBackward : OpKind::GeluBackward;
  const std::vector<double> rows = {d.Nr, d.C}, stream = {d.Nr * d.C}, hidden = {d.N * d.Fl};
  const double norm = r.stream(2 * d.Nr * d.C), add = r.stream(3 * d.Nr * d.C);
  const double act = r.stream((d.swiglu ? 3 : 2) * d.N * d.Fl);
  ElementwiseOps e;
  e.norm_forward = r.op(norm_f, rows, norm);
  e.act_forward = r.op(act_f, hidden, act);
  e.forward = 2 * e.norm_forward + 2 * r.op(OpKind::ResidualForward, stream, add) + e.act_forward;
  e.backward = 2 * r.op(norm_b, rows, 2 * norm) + 2 * r.op(OpKind::ResidualBackward, stream, 2 * add) +
               r.op(act_b, hidden, 2 * act);
  if (d.rope) {
    const double rope = r.stream(2 * d.N * (q + kv));
    const bool f = r.measures(OpKind::RopeForward), b = r.measures(OpKind::RopeBackward);
    e.rope_forward = f ? r.op(OpKind::RopeForward, {d.N * q}, 0) + r.op(OpKind::RopeForward, {d.N * kv}, 0) : rope;
    e.forward += e.rope_forward;
    e.backward += b ? r.op(OpKind::RopeBackward, {d.N * q}, 0) + r.op(OpKind::RopeBackward, {d.N * kv}, 0) : 2 * rope;
  }
  return e;
}

// One block's forward without communication, and its backward halves.
struct BlockCompute {
  double forward = 0, dx = 0, dw = 0, flops = 0;
  double attention_forward = 0, attention_backward = 0;  // (for the cp overlap)
  double norms_and_activation = 0;  // selective recomputation re-runs these (forward elementwise)
  // Per-op recomputation (model/recompute_ops.h) re-runs these forwards: both norms; q, k, v's
  // GEMMs and RoPE; the MLP's first GEMM(s) (fc, or gate and up); the activation.
  double norms = 0, qkv = 0, mlp_in = 0, activation = 0;
};

BlockCompute block_compute(const Dims& d, const Roofline& r) {
  BlockCompute b;
  const double q = d.Hl * d.D, kv = d.KVl * d.D;
  std::vector<LinearCost> lin = {linear(r, d.N, d.C, q, d.bias), linear(r, d.N, d.C, kv, d.bias),
                                 linear(r, d.N, d.C, kv, d.bias), linear(r, d.N, q, d.C, d.bias)};
  if (d.swiglu) lin.push_back(linear(r, d.N, d.C, d.Fl, d.bias));
  lin.push_back(linear(r, d.N, d.C, d.Fl, d.bias));
  lin.push_back(linear(r, d.N, d.Fl, d.C, d.bias));
  for (const LinearCost& c : lin) b.forward += c.forward, b.dx += c.dx, b.dw += c.dw, b.flops += c.flops;
  b.qkv = lin[0].forward + lin[1].forward + lin[2].forward;
  b.mlp_in = lin[4].forward + (d.swiglu ? lin[5].forward : 0.0);
  // Causal attention over a cp rank's queries: about half the T x (cp T) square (the load-balanced
  // chunks make it half on every rank); backward recomputes the probabilities from the saved lse:
  // 5 products against the forward's 2.
  const double attn_flops = 2 * 2 * d.B * d.Hl * d.T * d.Tfull * d.D * 0.5;
  const std::vector<double> attn = {d.B, d.T, d.Tfull, d.Hl, d.KVa, d.D};
  b.attention_forward = r.op(OpKind::AttentionForward, attn, r.compute(attn_flops));
  b.attention_backward = r.op(OpKind::AttentionBackward, attn, r.compute(2.5 * attn_flops));
  b.flops += 3.5 * attn_flops;
  // Elementwise, measured by shape when calibrated, else the roofline of their fp32 element traffic:
  // two norms (read x, write y), two residual adds (2 reads, 1 write), the activation (GELU: 1 read
  // 1 write; SwiGLU: 2 reads 1 write), RoPE on q and k; each backward twice its forward's traffic
  // (it reads the saved input and the gradient, writes one).
  const ElementwiseOps e = elementwise_ops(d, r);
  b.norms_and_activation = 2 * e.norm_forward + e.act_forward;
  b.norms = 2 * e.norm_forward;
  b.activation = e.act_forward;
  b.qkv += e.rope_forward;
  b.forward += b.attention_forward + e.forward;
  b.dx += b.attention_backward + e.backward;
  return b;
}

// What one block's per-op recomputation (model/recompute_ops.h) adds to its backward: each op's
// forward again as the forward prices it (so calibrated op times apply), the FLOPs as
// model/memory.h recompute_ops_cost counts them, and under sequence parallelism a region re-entered
// for qkv or mlp_in gathers its input again (an all-gather of the (N, C) stream).
struct OpsRecompute {
  double compute = 0, tp = 0, tp_bytes = 0, flops = 0;
};
OpsRecompute ops_recompute(const Workload& w, const Layout& l, const Dims& d, const BlockCompute& b,
                           const GroupLinks& links, const RecomputeOps& o) {
  OpsRecompute x;
  if (!o.any()) return x;
  x.compute = (o.norm ? b.norms : 0.0) + (o.qkv ? b.qkv : 0.0) + (o.attn ? b.attention_forward : 0.0) +
              (o.mlp_in ? b.mlp_in : 0.0) + (o.mlp_act ? b.activation : 0.0);
  ModelMemoryLayout m;
  m.batch = l.micro_batch;
  m.seq_len = w.seq_len / l.cp;
  m.tp = l.tp;
  m.sequence_parallel = l.sp && l.tp > 1;
  const RecomputeOpsCost cost = recompute_ops_cost(w.model, m, o);
  x.flops = cost.gemm_flops + cost.attention_flops;
  const int regions = (o.qkv ? 1 : 0) + (o.mlp_in ? 1 : 0);
  if (m.sequence_parallel && regions > 0) {
    const double xf = d.N * d.C * kAct * w.tp_bytes_forward;
    x.tp = regions * all_gather_seconds(xf, l.tp, links.tp);
    x.tp_bytes = regions * all_gather_bytes(xf, l.tp);
  }
  return x;
}

}  // namespace

std::vector<GemmShape> gemm_shapes(const Workload& w, const Layout& l) {
  std::vector<GemmShape> shapes;
  Roofline r{1, 1, 0, kAct, 0};
  r.record = &shapes;
  const Dims d = dims_of(w, l);
  block_compute(d, r);
  linear(r, d.N, d.C, d.Vl, false);  // the LM head
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  return shapes;
}

ChunkTime chunk_time(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                     const StageSpec& chunk) {
  const Dims d = dims_of(w, l);
  const Roofline r{c.peak_flops(l.bf16) * c.compute_efficiency, c.memory_bandwidth, c.op_latency, l.bf16 ? 2.0 : kAct,
                   c.gemm_half_flops, &c, l.bf16};
  ChunkTime t;
  const double blocks = double(chunk.layers());
  // Blocks that recompute their whole forward: all under "full", else model.recompute_layers of them.
  const double full = l.recompute == Recompute::Full ? blocks : std::min(blocks, double(l.recompute_layers));
  if (blocks > 0) {
    const BlockCompute b = block_compute(d, r);
    t.forward += blocks * b.forward;
    t.backward += blocks * b.dx;
    t.weight += blocks * b.dw;
    t.flops += blocks * b.flops;
    // Tensor parallel: per block two regions (attention, MLP), each an all-reduce of the (N, C)
    // activations forward and one backward (sequence parallel: an all-gather and a reduce-scatter
    // of the same bytes instead of each). Compressed (parallel.tp_comm_compression): the bytes of
    // each direction scaled by its factor, the algorithms' volumes unchanged.
    const double x = d.N * d.C * kAct, xf = x * w.tp_bytes_forward, xb = x * w.tp_bytes_backward;
    // A region's pair of collectives: an all-reduce, or under sequence parallelism an all-gather
    // entering and a reduce-scatter leaving (each on its own fit where calibrated; with the
    // all-reduce's link they sum to its time).
    const bool sp = l.sp && l.tp > 1;
    const auto region_pair = [&](double bytes) {
      return sp ? all_gather_seconds(bytes, l.tp, links.tp) + reduce_scatter_seconds(bytes, l.tp, links.tp)
                : all_reduce_seconds(bytes, l.tp, links.tp);
    };
    const double region = region_pair(xf);
    t.tp_forward += blocks * 2 * region;
    t.tp_backward += blocks * 2 * region_pair(xb);
    t.tp_bytes += blocks * 2 * (all_reduce_bytes(xf, l.tp) + all_reduce_bytes(xb, l.tp));
    if (sp) {
      // Sequence parallel: backward gathers each region's input again for the weight gradients
      // (model/gpt.cpp, Megatron's way: the gathered input is not kept from the forward).
      t.tp_backward += blocks * 2 * all_gather_seconds(xf, l.tp, links.tp);
      t.tp_bytes += blocks * 2 * all_gather_bytes(xf, l.tp);
    }
    // Context parallel: K and V of the rank's T positions, kv = 2 B T KVl D elements.
    if (l.cp > 1) {
      const double kv = 2 * d.B * d.T * d.KVl * d.D * kAct;
      double fwd = 0, bwd = 0;
      if (l.cp_ring) {
        // cp - 1 transfers forward, each behind one block of attention; backward the K/V again and
        // the dK/dV (3 cp - 2 K/V volumes in all, docs/parallel.md) over cp steps.
        const double step_f = p2p_seconds(kv, links.cp), step_b = p2p_seconds(kv * (2 * l.cp - 1) / l.cp, links.cp);
        const double hide_f = c.async_progress ? b.attention_forward / double(l.cp) : 0.0;
        const double hide_b = c.async_progress ? b.attention_backward / double(l.cp) : 0.0;
        fwd = double(l.cp - 1) * std::max(0.0, step_f - hide_f);
        bwd = double(l.cp) * std::max(0.0, step_b - hide_b);
        t.cp_bytes += blocks * double(3 * l.cp - 2) * kv;
      } else {
        // All-gather K/V forward; again backward, and reduce-scatter dK/dV: nothing overlaps.
        fwd = all_gather_seconds(kv * l.cp, l.cp, links.cp);
        bwd = 2 * fwd;
        t.cp_bytes += blocks * 3 * double(l.cp - 1) * kv;
      }
      t.cp_forward += blocks * fwd;
      t.cp_backward += blocks * bwd;
      t.cp_backward += full * fwd;
      t.recompute_comm += full * fwd;
    }
    // Recomputation: selective re-runs the norms and the activation function; full the whole
    // block forward, its tensor-parallel collectives and context-parallel transfers with it. The
    // first recompute_layers blocks of the chunk recompute in full, the rest by the policy.
    if (l.recompute == Recompute::Selective) t.recompute += (blocks - full) * b.norms_and_activation;
    for (int64_t i = int64_t(full); i < chunk.layers(); ++i) {  // per-op recomputation, block by block
      const OpsRecompute o = ops_recompute(w, l, d, b, links, chunk_block_ops(l, i));
      t.recompute += o.compute;
      t.tp_backward += o.tp;
      t.recompute_comm += o.tp;
      t.tp_bytes += o.tp_bytes;
      t.flops += o.flops;
    }
    if (full > 0) {
      t.recompute += full * b.forward;
      t.tp_backward += full * 2 * region;
      t.recompute_comm += full * 2 * region;
      t.tp_bytes += full * 2 * all_reduce_bytes(xf, l.tp);
      t.flops += full * b.flops / 3;
    }
    t.backward += t.recompute;
  }
  const double x = d.N * d.C * kAct;
  if (chunk.embedding) {
    // Look-up (and learned positions) writing the (Nr, C) stream; backward scatters the gradient.
    const std::vector<double> emb = {d.N, d.C, d.Vl};
    t.forward += r.op(OpKind::EmbeddingForward, emb, r.stream(3 * d.N * d.C));
    t.backward += r.op(OpKind::EmbeddingBackward, emb, r.stream(2 * d.N * d.C));
    // Vocabulary-parallel: leave the region (an all-reduce; sequence parallel: a reduce-scatter,
    // its backward an all-gather).
    if (l.sp) {
      t.tp_forward += reduce_scatter_seconds(x, l.tp, links.tp);
      t.tp_backward += all_gather_seconds(x, l.tp, links.tp);
      t.tp_bytes += 2 * all_gather_bytes(x, l.tp);
    } else {
      t.tp_forward += all_reduce_seconds(x, l.tp, links.tp);
      t.tp_bytes += all_reduce_bytes(x, l.tp);
    }
    // A vision-language model's tower and projector, replicated over tp and cp: its FLOPs.
    const double vision = vision_flops_per_image(w.model) * d.B;
    if (vision > 0) {
      t.forward += r.compute(vision / 3);
      t.backward += r.compute(vision / 3);
      t.weight += r.compute(vision / 3);
      t.flops += vision;
    }
  }
  if (chunk.head) {
    // Final norm, the LM head (N, C) -> (N, Vl), the vocabulary-parallel cross-entropy over the
    // logits (softmax read twice, loss gradient written in place).
    const LinearCost head = linear(r, d.N, d.C, d.Vl, false);
    const OpKind norm_f = d.layernorm ? OpKind::LayerNormForward : OpKind::RmsNormForward;
    const OpKind norm_b = d.layernorm ? OpKind::LayerNormBackward : OpKind::RmsNormBackward;
    const std::vector<double> rows = {d.Nr, d.C}, logits = {d.N, d.Vl};
    t.forward += r.op(norm_f, rows, r.stream(2 * d.Nr * d.C)) + head.forward +
                 r.op(OpKind::CrossEntropyForward, logits, r.stream(2 * d.N * d.Vl));
    t.backward += r.op(norm_b, rows, r.stream(3 * d.Nr * d.C)) + head.dx +
                  r.op(OpKind::CrossEntropyBackward, logits, r.stream(d.N * d.Vl));
    t.weight += head.dw;
    t.flops += head.flops;
    // Entering the head's region (backward all-reduce; sequence parallel: forward all-gather,
    // backward reduce-scatter), and the cross-entropy's all-gather of the log-sum-exps and
    // all-reduce of the target logits (N values each).
    if (l.sp) {
      t.tp_forward += all_gather_seconds(x, l.tp, links.tp);
      t.tp_backward += reduce_scatter_seconds(x, l.tp, links.tp);
      t.tp_bytes += 2 * all_gather_bytes(x, l.tp);
    } else {
      t.tp_backward += all_reduce_seconds(x, l.tp, links.tp);
      t.tp_bytes += all_reduce_bytes(x, l.tp);
    }
    t.tp_forward += all_gather_seconds(d.N * kAct * l.tp, l.tp, links.tp) + all_reduce_seconds(d.N * kAct, l.tp, links.tp);
    t.tp_bytes += all_gather_bytes(d.N * kAct * l.tp, l.tp) + all_reduce_bytes(d.N * kAct, l.tp);
  }
  // The ops in a chain, as calibrated (cluster.h chain_scale) at this micro-batch's positions per
  // rank: every computation, no communication. A tp (cp) layout's ranks as measured at its degree
  // (cluster.h tp_scales, cp_scales): computation and that group's collectives (transfers).
  const double chain = c.chain_scale(l.bf16, double(l.micro_batch) * double(w.seq_len) / double(l.cp));
  const double tp = c.tp_scale(l.tp, l.bf16), cp = c.cp_scale(l.cp, l.bf16);
  const double compute = chain * tp * cp;
  t.forward *= compute, t.backward *= compute, t.weight *= compute, t.recompute *= compute;
  t.tp_forward *= tp, t.tp_backward *= tp;
  t.cp_forward *= cp, t.cp_backward *= cp;
  return t;
}

namespace {

// Parameters (elements) a rank holds for its chunks, as the trainer's ParameterStore lays them
// out (model/memory.h model_memory).
int64_t chunk_parameters(const Workload& w, const Layout& l, const StageSpec& chunk) {
  ModelMemoryLayout m;
  m.batch = 1;
  m.seq_len = l.sp ? l.tp : 1;
  m.tp = l.tp;
  m.sequence_parallel = l.sp;
  m.stage = chunk;
  return model_memory(w.model, m).parameters;
}

// The tp-partial gradients summed over tp after backward (parallel/finalize_grads.h): the norms'
// weights (and biases) under sequence parallelism, the replicated K and V projections when there
// are fewer KV heads than tp ranks. Elements.
double tp_partial_elements(const Workload& w, const Layout& l, const std::vector<StageSpec>& chunks) {
  if (l.tp == 1) return 0;
  const ModelConfig& m = w.model;
  const double norm = double(m.n_embd) * (m.norm == NormKind::LayerNorm ? 2 : 1);
  double n = 0;
  for (const StageSpec& c : chunks) {
    const double blocks = double(c.layers());
    if (l.sp) n += blocks * 2 * norm + (c.head ? norm : 0);
    if (m.kv_heads() % l.tp != 0)
      n += blocks * 2 * double(m.kv_heads() * m.head_dim()) * (double(m.n_embd) + (m.bias ? 1 : 0));
  }
  return n;
}

// model.recompute = "bubble" as the trainer runs it: with pp > 1 the schedule's R actions
// (app/config.h recompute_in_bubbles).
bool bubble_recompute(const Layout& l) { return l.recompute_bubble && l.recompute == Recompute::Full && l.pp > 1; }

// The pipeline step: the simulator on the schedule's action lists with each chunk's costs and
// p2p time as the message latency. Past 8 pp micro-batches the steady phase repeats, so the step is
// extrapolated from two short ones (as app/memory_check.cpp does for the memory peak).
SimResult simulate_pipeline(const Layout& l, int64_t m, const std::vector<ChunkCost>& costs, double transfer,
                            CostCache* cache, std::vector<double>* busy) {
  SimOptions o;
  o.chunks = costs;
  o.latency = transfer;
  const bool bubble = bubble_recompute(l);
  const int64_t ahead = bubble ? l.recompute_ahead : 1;
  const auto run = [&](int64_t micro_batches) {
    if (cache) return simulate(cache->schedule(l.pp, l.vpp, micro_batches, l.schedule, bubble, ahead), o);
    return simulate(pipeline_schedule(l.pp, l.vpp, micro_batches, l.schedule, bubble, ahead), o);
  };
  busy->assign(size_t(l.pp), 0.0);
  for (int64_t r = 0; r < l.pp; ++r)
    for (int64_t v = 0; v < l.vpp; ++v) {
      const ChunkCost& k = costs[size_t(v * l.pp + r)];
      (*busy)[size_t(r)] += double(m) * (k.forward + k.backward + k.weight + std::max(k.recompute, 0.0));
    }
  const auto extrapolated = [&] {
    if (m <= 8 * l.pp) return run(m);
    const int64_t m1 = 4 * l.pp + m % l.pp, periods = (m - m1) / l.pp;
    SimResult a = run(m1);
    const SimResult b = run(m1 + l.pp);
    a.makespan += double(periods) * (b.makespan - a.makespan);
    return a;
  };
  if (!cache || !cache->memoise) return extrapolated();
  // By what the simulation reads: the schedule's arguments, each chunk's four costs, the latency.
  std::vector<double> flat;
  flat.reserve(4 * costs.size());
  for (const ChunkCost& k : costs) flat.insert(flat.end(), {k.forward, k.backward, k.weight, k.recompute});
  CostCache::SimKey key{l.pp, l.vpp, m, int(l.schedule), bubble, ahead, transfer, std::move(flat)};
  auto it = cache->simulated().find(key);
  if (it == cache->simulated().end()) {
    const SimResult r = extrapolated();
    it = cache->simulated().emplace(std::move(key), CostCache::Simulated{r.makespan, r.deadlock}).first;
  }
  SimResult r;
  r.makespan = it->second.makespan;
  r.deadlock = it->second.deadlock;
  return r;
}

}  // namespace

const Schedule& CostCache::schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind, bool bubble,
                                    int64_t ahead) {
  const auto key = std::make_tuple(pp, vpp, micro_batches, int(kind), bubble, ahead);
  auto it = schedules_->find(key);
  if (it == schedules_->end())
    it = schedules_->emplace(key, pipeline_schedule(pp, vpp, micro_batches, kind, bubble, ahead)).first;
  return it->second;
}

namespace {
CostCache::Stages stages_of(const Workload& w, const Layout& l) {
  CostCache::Stages s;
  s.cut = l.pp == 1 ? std::vector<StageSpec>{resolve_stage(StageSpec{}, w.model)}
                    : cut_stages(w.model, w.seq_len, l.pp, l.vpp);
  for (int64_t r = 0; r < l.pp; ++r) {
    double params = 0;
    for (const StageSpec& chunk : rank_chunks(s.cut, l.pp, r)) params += double(chunk_parameters(w, l, chunk));
    s.parameters.push_back(params);
  }
  return s;
}
}  // namespace

const CostCache::Stages& CostCache::stages(const Workload& w, const Layout& l) {
  const auto key = std::make_tuple(l.tp, l.sp, l.pp, l.vpp);
  auto it = stages_.find(key);
  if (it == stages_.end()) it = stages_.emplace(key, stages_of(w, l)).first;
  return it->second;
}

StepCost predict_step(const Workload& w, const Layout& l, const ClusterSpec& c) {
  return predict_step(w, l, c, group_links(l, c), true);
}

StepCost predict_step(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                      bool simulate, CostCache* cache) {
  TESSERA_CHECK(l.micro_batch >= 1 && l.dp >= 1 && w.global_batch % (l.micro_batch * l.dp) == 0,
                "predict_step: train.global_batch = ", w.global_batch, " is not a multiple of micro_batch x dp = ",
                l.micro_batch, " x ", l.dp);
  const ModelConfig& mc = w.model;
  const int64_t m = w.micro_batches(l);
  const CostCache::Stages own = cache ? CostCache::Stages{} : stages_of(w, l);
  const CostCache::Stages& stages = cache ? cache->stages(w, l) : own;
  const std::vector<StageSpec>& cut = stages.cut;
  StepCost s;
  s.micro_batches = m;

  // Every chunk's time (by virtual stage), and what each pipeline rank holds and computes.
  std::vector<ChunkTime> times;
  std::vector<ChunkCost> costs;
  for (const StageSpec& chunk : cut) {
    times.push_back(chunk_time(w, l, c, links, chunk));
    const ChunkTime& t = times.back();
    if (bubble_recompute(l)) {  // the recomputation (and its collectives) as the schedule's R actions
      const double r = t.recompute + t.recompute_comm;
      costs.push_back({t.f(), t.b() - r, t.w(), r});
    } else {
      costs.push_back({t.f(), t.b(), t.w()});
    }
  }
  const Dims d = dims_of(w, l);
  const double x_pp = d.B * d.T / (l.sp && l.tp > 1 ? double(l.tp) : 1.0) * d.C * kAct;  // (B, T_local, C)
  const double transfer = l.pp > 1 ? p2p_seconds(x_pp, links.pp) : 0.0;

  double makespan = 0;
  std::vector<double> busy;
  if (l.pp == 1 || !simulate) {
    busy.assign(size_t(l.pp), 0.0);
    for (size_t v = 0; v < costs.size(); ++v)
      busy[v % size_t(l.pp)] +=
          double(m) * (costs[v].forward + costs[v].backward + costs[v].weight + std::max(costs[v].recompute, 0.0));
    makespan = *std::max_element(busy.begin(), busy.end());
  } else {
    const SimResult sim = simulate_pipeline(l, m, costs, transfer, cache, &busy);
    TESSERA_CHECK(!sim.deadlock, "predict_step: the simulated schedule deadlocks: ", describe(l));
    makespan = std::max(sim.makespan, *std::max_element(busy.begin(), busy.end()));  // (extrapolated: no less)
  }
  // The busiest rank sets the breakdown.
  const int64_t critical = int64_t(std::max_element(busy.begin(), busy.end()) - busy.begin());
  double sum_busy = 0;
  for (double b : busy) sum_busy += b;
  s.bubble_fraction = l.pp > 1 && makespan > 0 ? 1.0 - sum_busy / (double(l.pp) * makespan) : 0.0;
  double tp_bytes = 0, cp_bytes = 0, tp_seconds = 0, cp_seconds = 0;
  for (int64_t v = 0; v < l.vpp; ++v) {
    const ChunkTime& t = times[size_t(v * l.pp + critical)];
    const double n = double(m);
    s.compute += n * (t.forward + t.backward - t.recompute + t.weight);
    s.recompute += n * t.recompute;
    s.tp_exposed += n * (t.tp_forward + t.tp_backward);
    s.cp_exposed += n * (t.cp_forward + t.cp_backward);
    tp_bytes += n * t.tp_bytes;
    cp_bytes += n * t.cp_bytes;
  }
  tp_seconds = s.tp_exposed;
  cp_seconds = s.cp_exposed;
  s.bubble = makespan - busy[size_t(critical)];

  // After the schedule: the tp-partial sums, the dp x cp gradient reduction, the embedding group,
  // the optimizer. Each pipeline rank reduces its own parameters; the slowest sets the step.
  const int64_t shards = l.dp * l.cp;
  const bool zero = l.zero == 1 && shards > 1;
  double after = -1, dp_bytes = 0, dp_seconds = 0, emb_bytes = 0, emb_seconds = 0;
  GroupTraffic tp_g{"tp", l.tp, links.tp_across, tp_bytes, tp_seconds, tp_seconds};
  for (int64_t r = 0; r < l.pp; ++r) {
    const std::vector<StageSpec> chunks = rank_chunks(cut, l.pp, r);
    const double params = stages.parameters[size_t(r)];
    double last_backward = 0;
    for (int64_t v = 0; v < l.vpp; ++v) {
      const ChunkTime& t = times[size_t(v * l.pp + r)];
      last_backward += t.b() + t.w();
    }
    const double grads = params * kAct;
    s.parameters = std::max(s.parameters, params);
    // tp-partial gradients (blocking, one packed all-reduce).
    const double partial = tp_partial_elements(w, l, chunks) * kAct;
    const double tp_sum = partial > 0 ? all_reduce_seconds(partial, l.tp, links.tp) : 0.0;
    // Data parallel (dp x cp): buckets during the last micro-batch's backward, or ZeRO-1's
    // reduce-scatter and all-gather after it.
    double dp_time = 0, dp_exposed = 0;
    if (shards > 1) {
      if (zero) {
        dp_time = reduce_scatter_seconds(grads, shards, links.dp) + all_gather_seconds(grads, shards, links.dp) +
                  all_reduce_seconds(8, shards, links.dp);
        dp_exposed = dp_time;
      } else {
        const double bucket = 25.0 * (1 << 20);  // parallel.bucket_mb's default
        const double buckets = std::max(1.0, std::ceil(grads / bucket));
        dp_time = all_reduce_seconds(grads, shards, links.dp) + (buckets - 1) * 2 * double(shards - 1) * links.dp.latency;
        // Buckets are cut from the end of the buffer (the last layers, final first); the last one,
        // holding the first layers and the embedding, starts when backward ends: never hidden.
        const double last = all_reduce_seconds(grads - (buckets - 1) * bucket, shards, links.dp);
        dp_exposed = c.async_progress ? std::max(last, dp_time - last_backward) : dp_time;
      }
    }
    // The tied embedding (gpt2) summed over the first and last stage.
    double emb = 0, emb_b = 0;
    if (l.pp > 1 && mc.tied_embeddings && (r == 0 || r == l.pp - 1)) {
      const double table = d.Vl * d.C * kAct;
      emb = all_reduce_seconds(table, 2, links.embedding);
      emb_b = all_reduce_bytes(table, 2);
    }
    // AdamW over the rank's (ZeRO-1: shard of the) trainable elements: p, g, m, v read, p, m, v
    // written; the norm reads the gradients; bf16 writes the compute copy of every parameter.
    const double owned = zero ? std::ceil(params / double(shards)) : params;
    const double opt_bytes = owned * (7 * 4 + 4) + (l.bf16 ? params * 2 : 0.0);
    double optimizer = std::max(opt_bytes / c.memory_bandwidth, 3 * c.op_latency);
    if (has_op_times(c, OpKind::AdamW) && has_op_times(c, OpKind::GradNorm)) {
      const double adamw = measured_op_seconds(c, OpKind::AdamW, {owned}, l.bf16);
      const double norm = measured_op_seconds(c, OpKind::GradNorm, {owned}, false);
      if (adamw > 0 && norm > 0) optimizer = std::max(adamw, c.op_latency) + std::max(norm, c.op_latency);
    }
    const double total = tp_sum + dp_exposed + emb + optimizer;
    if (total > after) {
      after = total;
      s.dp_exposed = dp_exposed;
      s.embedding_exposed = emb;
      s.optimizer = optimizer;
      s.tp_exposed = tp_seconds + tp_sum;
      dp_seconds = dp_time;
      dp_bytes = shards > 1 ? all_reduce_bytes(grads, shards) : 0.0;
      emb_seconds = emb;
      emb_bytes = emb_b;
      tp_g.bytes = tp_bytes + all_reduce_bytes(partial, l.tp);
      tp_g.seconds = tp_g.exposed = s.tp_exposed;
    }
  }
  s.step = makespan + after;
  s.tokens_per_s = double(w.global_batch) * double(w.seq_len) / s.step;
  s.mfu = flops_per_token(mc, w.seq_len) * s.tokens_per_s / (double(l.ranks()) * c.peak_flops(l.bf16));

  const double pp_bytes = l.pp > 1 ? 2.0 * double(m) * x_pp * double(l.pp * l.vpp - 1) / double(l.pp) : 0.0;
  s.groups = {tp_g,
              {"cp", l.cp, links.cp_across, cp_bytes, cp_seconds, cp_seconds},
              {"pp", l.pp, links.pp_across, pp_bytes, l.pp > 1 ? 2.0 * double(m * l.vpp) * transfer : 0.0, s.bubble},
              {"dp", shards, links.dp_across, dp_bytes, dp_seconds, s.dp_exposed},
              {"embedding", l.pp > 1 && mc.tied_embeddings ? 2 : 1, links.embedding_across, emb_bytes, emb_seconds,
               s.embedding_exposed}};
  return s;
}

double block_recompute_seconds(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                               const RecomputeOps& ops, bool full) {
  const StageSpec block{0, 1, false, false};
  Layout keep = l;
  keep.recompute = Recompute::None;
  keep.recompute_layers = 0;
  keep.recompute_ops.clear();
  Layout again = keep;
  if (full) again.recompute_layers = 1;
  else again.recompute_ops = {ops};
  return chunk_time(w, again, c, links, block).b() - chunk_time(w, keep, c, links, block).b();
}

}  // namespace tessera::plan
