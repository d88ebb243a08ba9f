// The analytic memory model: one rank's parameters, activations and backward temporaries,
// following model/gpt.cpp's allocations in order (which buffer is live when). Letters as in gpt.h;
// R = tp, Tl = T / R under sequence parallelism (else T), Hl = H / R, KVl = KV heads per rank
// (1 when fewer KV heads than ranks: they are replicated), Fl = F / R, Vl = ceil(V / R).
#include "model/memory.h"

#include <algorithm>
#include <string>
#include <vector>

#include "model/lora.h"
#include "parallel/tp_overlap.h"

namespace tessera {

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    throw SizeOverflow("size arithmetic overflows 64 bits: " + std::to_string(a) + " x " + std::to_string(b));
  return r;
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
    throw SizeOverflow("size arithmetic overflows 64 bits: " + std::to_string(a) + " + " + std::to_string(b));
  return r;
}

namespace {

// A non-negative size whose + and x are checked, so the formulas below read as formulas.
struct N {
  int64_t v = 0;
};
N operator*(N a, N b) { return {checked_mul(a.v, b.v)}; }
N operator+(N a, N b) { return {checked_add(a.v, b.v)}; }
N max(N a, N b) { return a.v > b.v ? a : b; }

struct Dims {
  N B, T, Tl, C, D, Hl, KVh, KVl, Fl, V, Vl, L;
  bool layernorm, swiglu, learned_positions, bias, tied, kv_replicated, sp;
  // parallel.cp > 1: the context attention's temporaries in the attention forward and backward
  // (ModelMemoryLayout::cp), 0 without.
  N cp_forward, cp_backward;
  // parallel.tp_overlap_chunks > 1 under sequence parallelism: the positions per rank of each
  // chunk (parallel/tp_overlap.h SequenceChunks), empty when the edges run whole.
  std::vector<int64_t> chunks;
  bool overlap() const { return !chunks.empty(); }
};

Dims dims_of(const ModelConfig& c, const ModelMemoryLayout& lay) {
  TESSERA_CHECK(lay.tp >= 1 && c.n_head % lay.tp == 0 && c.ffn_hidden % lay.tp == 0, "model_memory: tp = ", lay.tp,
                " must divide model.n_head = ", c.n_head, " and model.ffn_hidden = ", c.ffn_hidden);
  TESSERA_CHECK(lay.batch >= 1 && lay.seq_len >= 1, "model_memory: batch and seq_len must be >= 1");
  Dims d;
  const int64_t R = lay.tp;
  d.sp = lay.sequence_parallel && R > 1;
  TESSERA_CHECK(!d.sp || lay.seq_len % R == 0, "model_memory: seq_len ", lay.seq_len, " is not divisible by tp = ", R);
  d.B = {lay.batch};
  d.T = {lay.seq_len};
  d.Tl = {d.sp ? lay.seq_len / R : lay.seq_len};
  d.C = {c.n_embd};
  d.D = {c.head_dim()};
  d.Hl = {c.n_head / R};
  d.KVh = {c.kv_heads()};
  d.kv_replicated = c.kv_heads() % R != 0;
  d.KVl = {d.kv_replicated ? 1 : c.kv_heads() / R};
  d.Fl = {c.ffn_hidden / R};
  d.V = {c.vocab_size};
  d.Vl = {c.vocab_size / R + (c.vocab_size % R != 0 ? 1 : 0)};
  d.L = {c.n_layer};
  d.layernorm = c.norm == NormKind::LayerNorm;
  d.swiglu = c.mlp == MlpKind::SwiGlu;
  d.learned_positions = c.position == PositionKind::Learned;
  d.bias = c.bias;
  d.tied = c.tied_embeddings;
  TESSERA_CHECK(lay.tp_overlap_chunks >= 1, "model_memory: tp_overlap_chunks = ", lay.tp_overlap_chunks,
                " must be >= 1");
  TESSERA_CHECK(lay.cp >= 1, "model_memory: cp = ", lay.cp, " must be >= 1");
  if (lay.cp > 1) {
    // parallel/context_attention.cpp, T = this rank's positions: chunk-major copies of q and out
    // and of lse (forward: q and out whole, lse and a half-chunk block result; backward: q, out,
    // dout and dq, and lse), and the packed K/V (2 B T KVl D): the ring forward holds its own and
    // the next in flight, its backward those and the dK/dV partials and incoming, double-buffered
    // (6); all-gather forward its own and every rank's (1 + cp), backward the gathered K/V and
    // their gradients beside its own (2 + 2 cp).
    const N q = d.B * d.T * d.Hl * d.D, lse = d.B * d.Hl * d.T, kv = N{2} * d.B * d.T * d.KVl * d.D;
    const N cp{lay.cp};
    d.cp_forward = N{(N{5} * q).v / 2} + N{(N{3} * lse).v / 2} + (lay.cp_allgather ? N{1} + cp : N{2}) * kv;
    d.cp_backward = N{4} * q + lse + (lay.cp_allgather ? N{2} + N{2} * cp : N{6}) * kv;
  }
  if (d.sp && lay.tp_overlap_chunks > 1) {
    const SequenceChunks ch(R, lay.batch, lay.seq_len, lay.tp_overlap_chunks);
    for (int64_t i = 0; i < ch.count(); ++i) d.chunks.push_back(ch.length(i));
  }
  return d;
}

// Parameters of this rank's stage (model/layers.cpp, gpt.cpp constructors): column-parallel layers
// split their outputs (and biases), row-parallel ones their inputs (bias whole), norms are whole.
// A tied LM head on a later stage than the embedding holds its own copy of wte.
// One block's LoRA adapters (model/lora.h) on this rank: A (r, in) and B (out, r) for each targeted
// layer, split like the layer (column-parallel: B's rows; row-parallel: A's columns).
N lora_parameters(const ModelConfig& c, const Dims& d) {
  if (!c.lora.enabled()) return N{0};
  const N r{c.lora.rank}, C = d.C, Cl = d.Hl * d.D, kv_local = d.kv_replicated ? d.KVh * d.D : d.KVl * d.D;
  const auto adapted = [&](const char* layer, N in, N out) {
    return lora_targets_layer(c.lora, std::string("blocks.0.") + layer) ? r * in + out * r : N{0};
  };
  N total = adapted("attn.q", C, Cl) + adapted("attn.k", C, kv_local) + adapted("attn.v", C, kv_local) +
            adapted("attn.proj", Cl, C);
  if (d.swiglu) return total + adapted("mlp.gate", C, d.Fl) + adapted("mlp.up", C, d.Fl) + adapted("mlp.down", d.Fl, C);
  return total + adapted("mlp.fc", C, d.Fl) + adapted("mlp.proj", d.Fl, C);
}

N parameters(const ModelConfig& c, const Dims& d, const StageSpec& st) {
  const N one{1}, zero{0};
  const N b = d.bias ? one : zero;
  const N C = d.C, kv = d.KVh * d.D, Cl = d.Hl * d.D;
  const N norm = (d.bias ? N{2} : one) * C;
  const N kv_local = d.kv_replicated ? kv : d.KVl * d.D;
  const N attention = (Cl * C + b * Cl) + N{2} * (kv_local * C + b * kv_local) + (C * Cl + b * C);
  const N mlp = d.swiglu ? N{3} * (d.Fl * C) + b * (N{2} * d.Fl + C) : N{2} * (d.Fl * C) + b * (d.Fl + C);
  N total = N{st.layers()} * (norm + attention + norm + mlp + lora_parameters(c, d));  // blocks
  if (st.embedding) {
    total = total + d.Vl * C;                                            // wte (padded rows)
    if (d.learned_positions) total = total + N{c.max_seq_len} * C;      // wpe
  }
  if (st.head) {
    total = total + norm;                                                // ln_f
    if (!d.tied || !st.embedding) total = total + d.Vl * C;             // lm_head, or the tied copy of wte
  }
  return total;
}

// What each part's forward keeps (the *Ctx structs of gpt.h). block: under Recompute::None;
// block_selective: without the two norms' outputs and the activation function's (Block::forward).
struct Acts {
  N norm, block, block_selective, resid, head, loss;
};

// n bf16 values (2 bytes each) in fp32 elements, rounded up.
N bf16_elements(N n) { return {n.v / 2 + n.v % 2}; }

// The bf16 GEMMs' rounded operands (ModelMemoryLayout::bf16) at their highest within a block: the
// forward's largest Linear input, and the backward's largest output gradient and input together.
// Full-sequence rows: under sequence parallelism the Linears read the gathered input.
struct Bf16Scratch {
  N block_forward, block_backward, head_forward, head_backward;
};

Bf16Scratch bf16_scratch(const Dims& d) {
  const N rows = d.B * d.T, Cl = d.Hl * d.D, kv = (d.kv_replicated ? d.KVh : d.KVl) * d.D;
  Bf16Scratch s;
  // Inputs: q/k/v and the MLP's first layer(s) read (rows, C), the projection (rows, Cl), the MLP's
  // last layer (rows, Fl).
  s.block_forward = bf16_elements(rows * max(max(d.C, Cl), d.Fl));
  // (dy, x) of each Linear: q (Cl, C), k and v (kv, C), proj (C, Cl), fc/gate/up (Fl, C), fc2 (C, Fl).
  s.block_backward = bf16_elements(rows * max(max(Cl + d.C, kv + d.C), d.Fl + d.C));
  s.head_forward = bf16_elements(rows * d.C);
  s.head_backward = bf16_elements(rows * d.Vl) + bf16_elements(rows * d.C);
  return s;
}

Acts activations(const Dims& d) {
  const N rows = d.B * d.Tl;
  Acts a;
  a.norm = rows * d.C + rows * N{d.layernorm ? 2 : 1};  // y, (mean,) rstd
  const N q = d.B * d.T * d.Hl * d.D, kv = d.B * d.T * d.KVl * d.D;
  const N attention = q + N{2} * kv + q + d.B * d.Hl * d.T;  // q, k, v, out, lse
  const N mlp = N{d.swiglu ? 3 : 2} * (d.B * d.T * d.Fl);    // h, (up,) act
  a.block = a.norm + rows * d.C /* x1 */ + attention + a.norm + mlp;
  const N stats = rows * N{d.layernorm ? 2 : 1};  // (mean,) rstd
  a.block_selective = stats + rows * d.C /* x1 */ + attention + stats + N{d.swiglu ? 2 : 1} * (d.B * d.T * d.Fl);
  a.resid = (d.L + N{1}) * rows * d.C;  // the whole model's; a stage's is model_memory's
  a.head = a.norm /* ln_f */ + (d.sp ? d.B * d.T * d.C : N{}) /* head_in */ + d.B * d.T * d.Vl /* logits */;
  a.loss = N{2} * d.B * d.T;  // losses, lse
  return a;
}

// Workspace (temporaries) of one block's forward and backward, beyond its activations, at their
// highest. X = a full-sequence (B, T, C) tensor: under sequence parallelism the gathers and
// reduce-scatters stage one, without it the regions are views and cost nothing.
struct BlockWork {
  N forward, backward;
  // Its two branches: the MLP's with ln2's output and the activation's restored beside it, the
  // attention's with ln1's (a compressing block restores so); with `extra` (the bf16 rounding and
  // LoRA temporaries model_memory adds to each backward) not yet added.
  N mlp_branch, attention_branch, extra;
  // Each branch's backward workspace beyond dln and the tensors recomputed for it (LoRA's
  // temporaries included, `extra` not), and the bf16 rounding a recomputed Linear's forward adds.
  N mlp_backward, attention_backward, extra_forward;
};

// LoRA's temporaries (model/lora.h) at each adapted Linear of a block, 0 for a layer without an
// adapter: (B T, r) (A x in forward; s dy B, then A x in backward) and, under lora.dropout, the
// (B T, in_local) dropped input or input gradient beside it (the mask is recomputed, not kept).
struct LoraTemps {
  N q, k, v, proj, in, up, out;  // in: fc or gate; out: mlp.proj or down
  N largest() const;
};

N LoraTemps::largest() const { return max(max(max(q, k), max(v, proj)), max(max(in, up), out)); }

LoraTemps lora_temps(const ModelConfig& c, const Dims& d) {
  if (!c.lora.enabled()) return {};
  const bool dropout = c.lora.dropout > 0.0;
  const auto tmp = [&](const char* layer, N in_local) {
    if (!lora_targets_layer(c.lora, std::string("blocks.0.") + layer)) return N{};
    return d.B * d.T * (N{c.lora.rank} + (dropout ? in_local : N{}));
  };
  const N C = d.C, Cl = d.Hl * d.D;
  LoraTemps t{tmp("attn.q", C), tmp("attn.k", C), tmp("attn.v", C), tmp("attn.proj", Cl), {}, {}, {}};
  t.in = tmp(d.swiglu ? "mlp.gate" : "mlp.fc", C);
  t.up = d.swiglu ? tmp("mlp.up", C) : N{};
  t.out = tmp(d.swiglu ? "mlp.down" : "mlp.proj", d.Fl);
  return t;
}

// ---- The chunked region edges (ModelMemoryLayout::tp_overlap_chunks, parallel/tp_overlap.cpp) ----

// One GEMM of a chunked edge, per row of a chunk (R B n rows): the width of its output rows
// (gather_then_gemms) or of its packed input rows (gemms_then_reduce_scatter), and what it
// allocates itself per row (k or v with replicated KV heads: all heads' projection or gradient).
struct RowGemm {
  N width, temp;
};

// N nonnegative: a - b, or 0 when b is larger (a phase whose workspace is smaller than what of the
// block's context it runs without).
N minus_or_zero(N a, N b) { return {a.v > b.v ? a.v - b.v : 0}; }

// gather_then_gemms at its highest, for an input of `width` columns: chunk i + 1's send (B, n, width)
// and receive (R B, n, width) buffers are allocated before chunk i's GEMMs and every chunk's stays
// to the end; beside them one GEMM's output rows of chunk i (and its own temporaries) at a time.
N gather_peak(const Dims& d, N width, const std::vector<RowGemm>& gemms) {
  const N R{d.sp ? d.T.v / d.Tl.v : 1};
  const size_t k = d.chunks.size();
  N staged{}, peak{};
  const auto stage = [&](size_t i) { staged = staged + d.B * N{d.chunks[i]} * width * (N{1} + R); };
  stage(0);
  for (size_t i = 0; i < k; ++i) {
    if (i + 1 < k) stage(i + 1);
    const N rows = R * d.B * N{d.chunks[i]};
    for (const RowGemm& g : gemms) peak = max(peak, staged + rows * (g.width + g.temp));
  }
  return peak;
}

// gemms_then_reduce_scatter at its highest, for an output of C columns: chunk i's partial sums
// (R B, n, C) beside the chunks before it (their partial sums and received parts (B, n, C), kept to
// the end) and one input's packed rows (and its GEMM's temporaries) at a time; at the end all the
// chunks' buffers, X + Xl.
N scatter_peak(const Dims& d, const std::vector<RowGemm>& gemms) {
  const N R{d.T.v / d.Tl.v};
  N before{}, peak{};
  for (const int64_t n : d.chunks) {
    const N rows = R * d.B * N{n}, partial = rows * d.C;
    for (const RowGemm& g : gemms) peak = max(peak, before + partial + rows * (g.width + g.temp));
    before = before + partial + d.B * N{n} * d.C;
  }
  return max(peak, before);
}

// q's, k's and v's chunk GEMMs (forward, recomputation) or their input-gradient GEMMs (backward):
// with replicated KV heads, k's and v's all heads' rows beside their own.
std::vector<RowGemm> qkv_gemms_of(const Dims& d) {
  const N kv = d.KVl * d.D, all = d.kv_replicated ? d.KVh * d.D : N{};
  return {{d.Hl * d.D, {}}, {kv, all}, {kv, all}};
}

// The MLP's first layer(s): fc, or gate and up.
std::vector<RowGemm> mlp_in_gemms(const Dims& d) {
  std::vector<RowGemm> g{{d.Fl, {}}};
  if (d.swiglu) g.push_back({d.Fl, {}});
  return g;
}

// A block's workspace with chunked edges (model/gpt.cpp, the *_overlapped paths), beside the whole
// context as BlockWork counts it; the attention forward's phases run before the rest of the
// context is allocated, so they count beside less (minus_or_zero).
BlockWork overlapped_workspace(const Dims& d, const Acts& a, const LoraTemps& lora);

BlockWork block_workspace(const Dims& d, const Acts& a, const LoraTemps& lora = {}) {
  if (d.overlap()) return overlapped_workspace(d, a, lora);
  const N X = d.B * d.T * d.C;
  const N q = d.B * d.T * d.Hl * d.D, kv = d.B * d.T * d.KVl * d.D;
  const N kv_all = d.kv_replicated ? d.B * d.T * d.KVh * d.D : N{};  // all KV heads, before this rank's is picked
  BlockWork w;
  // Attention forward: gathered input, then the row-parallel partial sums and the reduce-scatter
  // staging (sequence parallel); the all-heads k/v projection (replicated KV).
  const N attn_fwd = d.sp ? max(N{3} * X, X + kv_all) : kv_all;
  const N mlp_fwd = d.sp ? N{3} * X : N{};
  w.forward = max(attn_fwd, mlp_fwd);
  // MLP backward: d(act) (and d(up), freed before the input gradient leaves); under sequence
  // parallelism the gathered dy and x and the full dx, then the reduce-scatter staging.
  const N F = d.B * d.T * d.Fl, mlp_grads = N{d.swiglu ? 2 : 1} * F;
  const N mlp_bwd = d.sp ? max(N{3} * X + mlp_grads, N{4} * X + F) : mlp_grads;
  // Attention backward: d(out), dq, dk, dv live together; then without d(out), the input-side
  // buffers (sequence parallel) or the all-heads k/v gradient (replicated KV).
  const N grads = q + N{2} * kv;
  const N attn_bwd = d.sp ? max(X + q + grads, N{3} * X + grads + max(X, kv_all)) : max(q + grads, grads + kv_all);
  // dln of the block, beside the larger branch.
  const N Xl = d.B * d.Tl * d.C;
  w.backward = Xl + max(mlp_bwd, attn_bwd);
  // Selective: ln2's output and the activation's recomputed beside the MLP branch, then ln1's
  // beside the attention branch (Block::backward).
  if (d.sp) {  // LoRA: the largest temporary beside the branch's peak, an upper bound
    w.forward = w.forward + lora.largest();
    w.backward = w.backward + lora.largest();
    w.mlp_backward = mlp_bwd + lora.largest();
    w.attention_backward = attn_bwd + lora.largest();
    w.mlp_branch = Xl + Xl + F + w.mlp_backward;
    w.attention_branch = Xl + Xl + w.attention_backward;
    return w;
  }
  // LoRA without sequence parallelism, at each adapted layer's call. Forward: nothing else is a
  // workspace there but k's and v's all-heads output (replicated KV). Backward: the MLP's second
  // layer beside d(act), its first (and up) beside d(act) (and d(up)); the projection beside
  // d(out), q, k and v beside dq, dk, dv (and k's or v's all-heads gradient).
  w.forward = max(w.forward, max(max(max(lora.q, lora.proj), max(max(lora.in, lora.up), lora.out)),
                                 kv_all + max(lora.k, lora.v)));
  const N mlp_lora = max(mlp_bwd, max(F + lora.out, mlp_grads + max(lora.in, lora.up)));
  const N attn_lora = max(attn_bwd, max(max(q + lora.proj, grads + lora.q), grads + kv_all + max(lora.k, lora.v)));
  w.backward = Xl + max(mlp_lora, attn_lora);
  w.mlp_backward = mlp_lora;
  w.attention_backward = attn_lora;
  w.mlp_branch = Xl + Xl + F + mlp_lora;
  w.attention_branch = Xl + Xl + attn_lora;
  return w;
}


BlockWork overlapped_workspace(const Dims& d, const Acts& a, const LoraTemps& lora) {
  const N X = d.B * d.T * d.C, Xl = d.B * d.Tl * d.C, F = d.B * d.T * d.Fl;
  const N q = d.B * d.T * d.Hl * d.D, kv = d.B * d.T * d.KVl * d.D, lse = d.B * d.Hl * d.T;
  const N kv_all = d.kv_replicated ? d.B * d.T * d.KVh * d.D : N{};
  const N mlp_ctx = N{d.swiglu ? 3 : 2} * F;  // h, (up,) act
  BlockWork w;
  // Forward. Attention: q, k, v allocated, then x gathered chunk by chunk into their GEMMs (ln2's
  // context, the MLP's, out and lse not yet allocated); out and lse, the kernel, then the projection
  // chunk by chunk into the reduce-scatters. MLP: h, act (and up) allocated, the whole context live.
  const N attn_in = minus_or_zero(gather_peak(d, d.C, qkv_gemms_of(d)), a.norm + mlp_ctx + q + lse);
  const N attn_out = minus_or_zero(scatter_peak(d, {{d.Hl * d.D, {}}}), a.norm + mlp_ctx);
  const N mlp_fwd = max(gather_peak(d, d.C, mlp_in_gemms(d)), scatter_peak(d, {{d.Fl, {}}}));
  w.forward = max(max(attn_in, attn_out), mlp_fwd);
  // MLP backward: d(act), the whole dy gathered beside dy's chunks and the down projection's
  // input-gradient rows; x gathered (its staging beside it), d(up); x released, the input-gradient
  // GEMMs of d(act) (and d(up)) chunk by chunk into the reduce-scatters.
  std::vector<RowGemm> mlp_back{{d.Fl, {}}};
  if (d.swiglu) mlp_back.push_back({d.Fl, {}});
  const N mlp_grads = N{d.swiglu ? 2 : 1} * F;
  const N mlp_bwd = max(max(F + X + gather_peak(d, d.C, {{d.Fl, {}}}), F + N{2} * X),
                        max(mlp_grads + X, mlp_grads + scatter_peak(d, mlp_back)));
  // Attention backward: d(out), the whole dy gathered beside its chunks and the projection's
  // input-gradient rows; d(out) beside dq, dk, dv; without d(out): x gathered (its staging, or all
  // KV heads' weight gradient beside it), then q's, k's and v's input-gradient GEMMs chunk by chunk.
  const N grads = q + N{2} * kv;
  const N attn_bwd = max(max(q + X + gather_peak(d, d.C, {{d.Hl * d.D, {}}}), q + grads),
                         max(grads + X + max(X, kv_all), grads + scatter_peak(d, qkv_gemms_of(d))));
  // LoRA: the largest temporary beside each peak, an upper bound (as block_workspace's).
  const N extra = lora.largest();
  w.forward = w.forward + extra;
  w.mlp_backward = mlp_bwd + extra;
  w.attention_backward = attn_bwd + extra;
  w.backward = Xl + max(w.mlp_backward, w.attention_backward);
  w.mlp_branch = Xl + Xl + F + w.mlp_backward;
  w.attention_branch = Xl + Xl + w.attention_backward;
  return w;
}


// Context parallelism (Dims::cp_forward, cp_backward): the context attention's temporaries where
// they are allocated. Forward: beside ln1's output and the attention's context (q, k, v, out, lse),
// before x1, ln2's output and the MLP's context (counted here beside the whole context, less those).
// Backward: beside dln (a branch's caller's), d(out), dq, dk and dv (and the gathered dy under
// sequence parallelism with whole edges); in the attention branch, beside what the branch
// recomputed (as w.attention_backward is), the bf16 rounding (`extra`) not meeting it.
void with_context_attention(const Dims& d, const Acts& a, BlockWork& w) {
  if (d.cp_forward.v == 0 && d.cp_backward.v == 0) return;
  const N Xl = d.B * d.Tl * d.C, X = d.B * d.T * d.C, F = d.B * d.T * d.Fl;
  const N q = d.B * d.T * d.Hl * d.D, kv = d.B * d.T * d.KVl * d.D;
  const N mlp_ctx = N{d.swiglu ? 3 : 2} * F;  // h, (up,) act
  w.forward = max(w.forward, minus_or_zero(d.cp_forward, Xl /* x1 */ + a.norm /* ln2 */ + mlp_ctx));
  const N kernel = (d.sp && !d.overlap() ? X : N{}) + q /* d(out) */ + q + N{2} * kv /* dq, dk, dv */ + d.cp_backward;
  w.backward = max(w.backward, Xl + kernel);
  w.attention_backward = max(w.attention_backward, minus_or_zero(kernel, w.extra));
  w.attention_branch = Xl + Xl + w.attention_backward;
}

// One block's share of the stage's memory under its policy: what its forward keeps, and its
// backward at its highest beside everything kept (its own context included), by phase.
struct BlockCost {
  N kept;
  N forward;  // its forward at its highest beside what the blocks before it kept (its context included)
  // The backward's phases: before either branch (a full recomputation's forward, a compressing
  // block's restores), the MLP branch, the attention branch. Under a split backward (B) the MLP's
  // copies for W exist from the MLP branch on, the attention's from the attention branch on.
  N before, mlp, attention;
};

// A compressing block (Recompute::None, Block::compress_inputs): in forward, after its whole
// context and temporaries, ln1's output, ln2's output and the activation are compressed one at a
// time (each: its compressed form and workspace beside it, then it is released). In backward
// (Block::backward) the MLP branch's two are restored (each allocated, then its compressed form
// released) beside dln, the branch runs as under selective recomputation with ln1's still
// compressed, then ln1's is restored for the attention branch.
BlockCost compressed_block(const ActivationCompression& c, const Dims& d, const Acts& a, const BlockWork& w) {
  const N Xl = d.B * d.Tl * d.C, F = d.B * d.T * d.Fl;
  const auto elements = [](int64_t bytes) { return N{bytes / 4}; };  // F32 elements (whole: see compressed_bytes)
  const N norm_c = elements(compressed_bytes(c, (d.B * d.Tl).v, d.C.v));
  const N norm_ws = elements(compression_workspace_bytes(c, (d.B * d.Tl).v, d.C.v));
  const N act_c = elements(compressed_bytes(c, (d.B * d.T).v, d.Fl.v));
  const N act_ws = elements(compression_workspace_bytes(c, (d.B * d.T).v, d.Fl.v));
  const N S = a.block_selective;  // the context without the three
  BlockCost b;
  b.kept = S + N{2} * norm_c + act_c;
  // Forward: S + 2 Xl + F = a.block is the whole context.
  b.forward = max(max(a.block + w.forward, a.block + norm_ws + norm_c),
                  max(S + Xl + F + norm_c + norm_ws + norm_c, S + F + N{2} * norm_c + act_ws + act_c));
  // Backward: dln, then ln2's restored (ln2's compressed still there), the activation's restored
  // (its compressed still there), the MLP branch beside ln1's compressed form, ln1's restored.
  const N kept_ln1 = S + norm_c;
  // Each phase beside its own kept context: the MLP branch's restores, the branch, then ln1's
  // restore and the attention branch.
  b.before = minus_or_zero(max(b.kept + Xl + Xl, kept_ln1 + Xl + Xl + F + act_c), b.kept);
  b.mlp = minus_or_zero(kept_ln1 + w.mlp_branch + w.extra, b.kept);
  b.attention = minus_or_zero(max(S + w.attention_branch + w.extra, kept_ln1 + Xl + Xl), b.kept);
  return b;
}

// What a block under per-op recomputation (model/recompute_ops.h; Block::drop_recomputed and
// Block::backward) drops of its context, per branch.
struct DroppedOps {
  N mlp, attention;
};

DroppedOps dropped_ops(const RecomputeOps& o, const Dims& d) {
  const N Xl = d.B * d.Tl * d.C, F = d.B * d.T * d.Fl;
  const N q = d.B * d.T * d.Hl * d.D, kv = d.B * d.T * d.KVl * d.D, lse = d.B * d.Hl * d.T;
  const N zero{};
  return {(o.norm ? Xl : zero) + (o.mlp_in ? N{d.swiglu ? 2 : 1} * F : zero) + (o.mlp_act ? F : zero),
          (o.norm ? Xl : zero) + (o.qkv ? q + N{2} * kv : zero) + (o.attn ? q + lse : zero)};
}

// A block under per-op recomputation: its forward allocates the whole context, then drops the ops'
// tensors. Its backward: dln; the MLP branch's dropped tensors recomputed in the forward's order
// (ln2's output; the region re-entered, X under sequence parallelism, beside h (and up) while the
// GEMMs run; the activation), the branch beside them, then released; likewise the attention
// branch's (ln1's output; X beside q, k, v and all KV heads' projection when they are replicated;
// out and lse). Selective is the set {norm, mlp_act}.
BlockCost ops_block_cost(const RecomputeOps& o, const Dims& d, const Acts& a, const BlockWork& w) {
  const DroppedOps drop = dropped_ops(o, d);
  const N Xl = d.B * d.Tl * d.C, X_sp = d.sp ? d.B * d.T * d.C : N{}, F = d.B * d.T * d.Fl, zero{};
  const N q = d.B * d.T * d.Hl * d.D, kv = d.B * d.T * d.KVl * d.D;
  const N kv_all = d.kv_replicated ? d.B * d.T * d.KVh * d.D : N{};
  const N norm = o.norm ? Xl : zero;
  // The region re-entered: whole (the gathered X beside the GEMMs), or chunk by chunk as the
  // forward does (tp_overlap_chunks > 1: the recomputed tensors allocated, then gather_then_gemms).
  const N mlp_in = N{d.swiglu ? 2 : 1} * F, qkv = q + N{2} * kv;
  const N mlp_gemms = !o.mlp_in ? zero
                      : d.overlap() ? norm + mlp_in + gather_peak(d, d.C, mlp_in_gemms(d)) + w.extra_forward
                                    : norm + X_sp + mlp_in + w.extra_forward;
  const N qkv_gemms = !o.qkv ? zero
                      : d.overlap() ? norm + qkv + gather_peak(d, d.C, qkv_gemms_of(d)) + w.extra_forward
                                    : norm + X_sp + qkv + kv_all + w.extra_forward;
  const N mlp = Xl + max(drop.mlp + w.mlp_backward + w.extra, mlp_gemms);
  const N attention = Xl + max(drop.attention + w.attention_backward + w.extra, qkv_gemms);
  return {N{a.block.v - drop.mlp.v - drop.attention.v}, a.block + w.forward, N{}, mlp, attention};
}

BlockCost block_cost(Recompute p, const Acts& a, const BlockWork& w, N Xl, const Dims& d,
                     const RecomputeOps& ops = {}) {
  switch (p) {
    case Recompute::None:
      if (ops.any()) return ops_block_cost(ops, d, a, w);
      // (w.backward = Xl + max(w.mlp_backward, w.attention_backward) + w.extra: block_workspace)
      return {a.block, a.block + w.forward, N{}, Xl + w.mlp_backward + w.extra, Xl + w.attention_backward + w.extra};
    case Recompute::Selective: return ops_block_cost(RecomputeOps::selective(), d, a, w);
    case Recompute::Full: break;
  }
  // Backward re-runs the forward (its output y a workspace), then runs beside what that re-created.
  return {N{}, a.block + w.forward, Xl + a.block + w.forward, a.block + Xl + w.mlp_backward + w.extra,
          a.block + Xl + w.attention_backward + w.extra};
}

// What a split backward (B) copies for its W (model/weight_grads.h): every Linear's input and
// output gradient over the full sequence (under sequence parallelism the gathered ones), an input
// read by several layers once. Per block: the attention projection's (out, dy), q/k/v's shared
// input and dq, dk, dv (all KV heads' when they are replicated: the padded gradient), the MLP's
// second layer's (act, dy), its first's input and d(act) (and d(up) under SwiGLU). The head: its
// input and the logits' gradient.
struct Deferred {
  N block, head;
  N mlp;  // of block: the MLP's (taken first, in the MLP branch)
};

Deferred deferred_copies(const Dims& d) {
  const N rows = d.B * d.T, Cl = d.Hl * d.D;
  const N kv = d.kv_replicated ? d.KVh * d.D : d.KVl * d.D;
  const N attention = (Cl + d.C) + (d.C + Cl + N{2} * kv);
  const N mlp = (d.Fl + d.C) + (d.C + N{d.swiglu ? 2 : 1} * d.Fl);
  return {rows * (attention + mlp), rows * (d.C + d.Vl), rows * mlp};
}

// The vision tower (kind = "vlm", model/vision.cpp) on the stage with the embedding, for n images of
// P patches: NPW = (n, P, W) and NPC = (n, P, C). Its blocks are gpt2 blocks over (n, P, W) under
// plain tp (never sequence parallel) with no recomputation.
struct VisionCost {
  N parameters;
  N kept;      // what its forward keeps until the backward: resid (Lv + 1) NPW, the blocks' contexts,
               // ln_f, the projector's h, act and out (3 NPC)
  N forward;   // its forward at its highest (what it keeps included)
  N backward;  // its backward at its highest beside nothing else (what its forward kept included)
};

VisionCost vision_cost(const ModelConfig& c, const ModelMemoryLayout& lay, int64_t images) {
  const ModelConfig vc = vision_block_config(c);
  // As the VisionTower's own checks word them.
  TESSERA_CHECK(vc.n_head % lay.tp == 0, "vision.n_head = ", vc.n_head, " is not divisible by parallel.tp = ", lay.tp);
  TESSERA_CHECK(vc.ffn_hidden % lay.tp == 0, "vision.ffn_hidden = ", vc.ffn_hidden,
                " is not divisible by parallel.tp = ", lay.tp);
  ModelMemoryLayout vl;
  vl.batch = std::max<int64_t>(images, 1);
  vl.seq_len = c.vision.num_patches();
  vl.tp = lay.tp;
  const Dims dv = dims_of(vc, vl);
  const N one{1};
  const N W = dv.C, C{c.n_embd}, K{c.vision.patch_dim()}, P{c.vision.num_patches()};
  VisionCost v;
  v.parameters = parameters(vc, dv, StageSpec{0, vc.n_layer, false, false}) /* blocks */ + (K * W + W) /* patch */ +
                 P * W /* pos */ + N{2} * W /* ln_f */ + (W * C + C) /* fc1 */ + (C * C + C) /* fc2 */;
  if (images == 0) return v;  // text only: the tower does not run
  const Acts a = activations(dv);
  BlockWork w = block_workspace(dv, a);
  if (lay.bf16) {  // its blocks' Linears round as the language model's do
    const Bf16Scratch bf = bf16_scratch(dv);
    w.forward = w.forward + bf.block_forward;
    w.backward = w.backward + bf.block_backward;
  }
  const N Lv = dv.L, NPW = dv.B * dv.T * W, NPC = dv.B * dv.T * C;
  // Forward: the residual stream, then each block (its context and temporaries), ln_f, fc1, GELU, fc2.
  const N resid = (Lv + one) * NPW;
  N kept = resid, forward = resid;
  for (int64_t l = 0; l < Lv.v; ++l) {
    forward = max(forward, kept + a.block + w.forward);
    kept = kept + a.block;
  }
  kept = kept + a.norm + N{3} * NPC;
  v.kept = kept;
  v.forward = max(forward, kept);
  // Backward: dout (the image rows' gradient) beside d(act) and d(ln) at fc1's backward; then d(ln)
  // and the stream's gradient dres at ln_f's; then each block from the last beside dres, its
  // context and output released after it.
  N backward = max(kept + NPC + NPC + NPW, kept + NPC + NPW + NPW);
  N live = kept;
  for (int64_t l = Lv.v - 1; l >= 0; --l) {
    backward = max(backward, live + NPC + NPW + w.backward);
    live = N{live.v - a.block.v - NPW.v};
  }
  v.backward = backward;
  return v;
}

}  // namespace

ModelMemory model_memory(const ModelConfig& cfg, const ModelMemoryLayout& lay) {
  const ModelConfig c = resolve(cfg);
  const Dims d = dims_of(c, lay);
  const StageSpec st = resolve_stage(lay.stage, c);
  TESSERA_CHECK(lay.full_layers >= 0, "model_memory: full_layers = ", lay.full_layers, " must be >= 0");
  const Acts a = activations(d);
  BlockWork w = block_workspace(d, a, lora_temps(c, d));
  const Bf16Scratch bf = lay.bf16 ? bf16_scratch(d) : Bf16Scratch{};
  w.forward = w.forward + bf.block_forward;
  w.backward = w.backward + bf.block_backward;
  w.extra = bf.block_backward;  // LoRA's temporaries are in the branches already (block_workspace)
  w.extra_forward = bf.block_forward;
  with_context_attention(d, a, w);
  const N X = d.B * d.T * d.C, Xl = d.B * d.Tl * d.C;
  // A fully recomputing block's kept replay words, both regions (ModelMemoryLayout::tp_compression).
  const N replay = N{2} * N{tp_replay_words(lay.tp_compression, d.B.v, d.T.v, d.C.v, lay.tp, d.sp)};
  const int64_t L = st.layers();
  std::vector<BlockCost> blocks;
  std::vector<bool> full;  // the blocks that recompute fully
  for (int64_t l = 0; l < L; ++l) {
    const Recompute p = l < lay.full_layers ? Recompute::Full : lay.recompute;
    const size_t layer = static_cast<size_t>(st.first_layer + l);
    const ActivationCompression comp = layer < lay.compression.size() ? lay.compression[layer] : ActivationCompression{};
    TESSERA_CHECK(!comp.active() || p == Recompute::None, "model_memory: layer ", layer,
                  " compresses its saved inputs but recomputes (model/compression_policy.h)");
    const RecomputeOps ops = p == Recompute::None && layer < lay.recompute_ops.size() ? lay.recompute_ops[layer]
                                                                                    : RecomputeOps{};
    TESSERA_CHECK(!comp.active() || !ops.any(), "model_memory: layer ", layer,
                  " compresses its saved inputs and recomputes ops (model/recompute_ops.h)");
    if (comp.active()) {
      blocks.push_back(compressed_block(comp, d, a, w));
    } else {
      BlockCost b = block_cost(p, a, w, Xl, d, ops);
      if (p == Recompute::Full) {  // the replay words, kept from the forward's peak on
        b.kept = b.kept + replay;
        b.forward = b.forward + replay;
      }
      blocks.push_back(b);
    }
    full.push_back(p == Recompute::Full);
  }
  // The stage's residual stream: its blocks' outputs and, with the embedding, the embedding's
  // (without it, the first block reads the caller's input), all allocated before the first block.
  const N resid = (N{L} + N{st.embedding ? 1 : 0}) * Xl;
  // kind = "vlm": the vision tower runs after the embedding (the residual stream allocated) and
  // keeps its context until the embedding's backward.
  TESSERA_CHECK(lay.images >= 0 && lay.images <= lay.batch, "model_memory: ", lay.images, " images for ", lay.batch,
                " sequences (at most one each)");
  const bool vlm = c.is_vlm() && st.embedding;
  const VisionCost vis = vlm ? vision_cost(c, lay, lay.images) : VisionCost{};
  const N base = resid + vis.kept;
  // Forward: every block allocates its whole context and its temporaries (a recomputing one then
  // drops what it does not keep), beside the residual stream and the earlier blocks' contexts.
  N kept_blocks{}, blocks_forward = resid + vis.forward;
  for (const BlockCost& b : blocks) {
    blocks_forward = max(blocks_forward, base + kept_blocks + b.forward);
    kept_blocks = kept_blocks + b.kept;
  }
  const N head_acts = st.head ? a.head + a.loss : N{};
  const N acts = base + kept_blocks + head_acts;
  ModelMemory m;
  m.parameters = (parameters(c, d, st) + vis.parameters).v;
  m.activations = acts.v;
  // Then the loss (vocabulary-parallel: each rank's lse and target logit, and all ranks' lse).
  const N R{lay.tp};
  const N ce = st.head && R.v > 1 ? (N{2} + R) * d.B * d.T : N{};
  // bf16: the LM head's rounded input beside the logits (the losses not yet allocated: an upper bound).
  // Sequence parallel: ln_f's output gathered into the head's input beside the gather's staging,
  // before the logits are allocated (the peak of the forward where the blocks' workspace is small,
  // as with chunked edges).
  const N head_gather = st.head && d.sp ? base + kept_blocks + a.norm + N{2} * X : N{};
  const N forward = st.head ? max(max(max(blocks_forward, acts + ce), acts + bf.head_forward), head_gather)
                            : blocks_forward;
  // Backward: the head (dln, and under sequence parallelism dln_local and the reduce-scatter
  // staging), then the blocks from the last, each beside the contexts of those before it (a
  // block's context and output are released when its backward ends) and dres. dres is a workspace only on the
  // stage with the embedding; any other writes it into the caller's input gradient.
  // Split (B alone): the head's copies are taken at its start; a block's MLP copies beside its MLP
  // branch, its attention's (and the MLP's) beside its attention branch (BlockCost's phases); all
  // of them stay (counted from their branch's start: an upper bound by the few buffers a copy
  // outlives within the branch).
  const N head = st.head ? X + (d.sp ? Xl + X : N{}) : N{};
  const N dres = st.embedding ? Xl : N{};
  const Deferred copies = deferred_copies(d);
  const N head_copies = st.head && lay.split_backward ? copies.head : N{};
  const N block_copies = lay.split_backward ? copies.block : N{};
  const N mlp_copies = lay.split_backward ? copies.mlp : N{};
  // bf16: the LM head's rounded output gradient and input beside dln.
  // Recomputation ahead (R, Gpt::recompute): each fully recomputing block, first to last, re-runs
  // its forward (its context, its temporaries and the output y, a workspace) beside what the
  // forward kept and the contexts recomputed before it; the backward then finds them all and runs
  // each such block as under None.
  N recompute_peak{}, recomputed{};
  if (lay.recompute_ahead) {
    recompute_peak = acts;
    for (int64_t l = 0; l < L; ++l) {
      if (!full[static_cast<size_t>(l)]) continue;
      recompute_peak = max(recompute_peak, acts + recomputed + Xl + a.block + w.forward);
      recomputed = recomputed + a.block;
      blocks[static_cast<size_t>(l)] = block_cost(Recompute::None, a, w, Xl, d);  // (its phases too)
      blocks[static_cast<size_t>(l)].kept = a.block + replay;  // the replay words go with its backward
    }
  }
  m.recompute_peak = lay.recompute_ahead ? recompute_peak.v : 0;
  m.recomputed = recomputed.v;
  N backward = acts + recomputed + head + head_copies + (st.head ? bf.head_backward : N{}),
    live = acts + recomputed + head_copies;
  for (int64_t l = L - 1; l >= 0; --l) {
    const BlockCost& b = blocks[static_cast<size_t>(l)];
    backward = max(backward, live + dres + max(max(b.before, b.mlp + mlp_copies), b.attention + block_copies));
    const bool output_kept = lay.output_kept && !st.head && l == L - 1;
    // Its context and output (Gpt::backward releases both); its copies stay.
    live = N{live.v - b.kept.v - (output_kept ? 0 : Xl.v)} + block_copies;
  }
  // The images' backward (Gpt::images_backward): the vision tower's, beside dres and what is left.
  if (vlm && lay.images > 0) backward = max(backward, N{live.v - vis.kept.v} + dres + vis.backward);
  m.weight_grads = (head_copies + N{L} * block_copies).v;
  m.forward_peak = forward.v;
  m.backward_peak = backward.v;
  m.training_peak = max(max(forward, backward), recompute_peak).v;
  // Without targets: no losses; the blocks as in training, then the head's kept tensors (the
  // block temporaries are gone before the head allocates).
  const N blocks_done = base + kept_blocks;
  const N head_kept = st.head ? a.head : N{};
  m.inference_peak = max(max(blocks_forward, blocks_done + head_kept + (st.head ? bf.head_forward : N{})), head_gather).v;
  m.inference_kept = (blocks_done + head_kept).v;
  return m;
}

RecomputeOpsCost recompute_ops_cost(const ModelConfig& cfg, const ModelMemoryLayout& lay, const RecomputeOps& o) {
  const ModelConfig c = resolve(cfg);
  const Dims d = dims_of(c, lay);
  const DroppedOps drop = dropped_ops(o, d);
  const N rows = d.B * d.T, kv_cols = (d.kv_replicated ? d.KVh : d.KVl) * d.D, q = rows * d.Hl * d.D;
  const auto flops = [](N n) { return 2.0 * static_cast<double>(n.v); };
  RecomputeOpsCost cost;
  cost.elements_saved = (drop.mlp + drop.attention).v;
  cost.bytes_saved = (N{4} * (drop.mlp + drop.attention)).v;
  if (o.qkv) cost.gemm_flops += flops(rows * d.C * (d.Hl * d.D + N{2} * kv_cols));
  if (o.mlp_in) cost.gemm_flops += flops(N{d.swiglu ? 2 : 1} * rows * d.C * d.Fl);
  if (o.attn) cost.attention_flops = 2.0 * flops(d.B * d.Hl * d.D * N{d.T.v * (d.T.v + 1) / 2});
  if (o.norm) cost.elementwise += (N{2} * d.B * d.Tl * d.C).v;
  if (o.mlp_act) cost.elementwise += (rows * d.Fl).v;
  if (o.qkv && !d.learned_positions) cost.elementwise += (q + rows * d.KVl * d.D).v;  // RoPE
  return cost;
}

ActivationParts activation_parts(const ModelConfig& cfg, const ModelMemoryLayout& lay) {
  const ModelConfig c = resolve(cfg);
  const Dims d = dims_of(c, lay);
  const Acts a = activations(d);
  const BlockWork w = block_workspace(d, a);
  const N Xl = d.B * d.Tl * d.C;
  const VisionCost vis = c.is_vlm() ? vision_cost(c, lay, lay.images) : VisionCost{};
  const N replay = lay.recompute == Recompute::Full
                       ? N{2} * N{tp_replay_words(lay.tp_compression, d.B.v, d.T.v, d.C.v, lay.tp, d.sp)}
                       : N{};
  return {Xl.v, (block_cost(lay.recompute, a, w, Xl, d).kept + Xl + replay).v, (a.head + a.loss).v, vis.kept.v};
}

}  // namespace tessera
