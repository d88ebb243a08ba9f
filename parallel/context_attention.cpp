// Context-parallel attention: the blocks of this rank's queries against every rank's keys, by ring
// transfers or one all-gather (context_attention.h). Tensors are rearranged chunk-major first
// ("packed"), so that each chunk is a contiguous (B, n, ...) tensor the attention kernel takes.
#include "parallel/context_attention.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"

namespace tessera {

CpComm parse_cp_comm(const std::string& s) {
  if (s == "ring") return CpComm::Ring;
  if (s == "allgather") return CpComm::AllGather;
  detail::fail("parallel.cp_comm = \"", s, "\": expected \"ring\" or \"allgather\"");
}

const char* cp_comm_name(CpComm c) { return c == CpComm::Ring ? "ring" : "allgather"; }

int64_t causal_pairs(const SequenceChunk& q, const SequenceChunk& k, const int32_t* doc_start) {
  int64_t n = 0;
  for (int64_t p = q.start; p < q.end(); ++p) {
    const int64_t first = doc_start ? std::max<int64_t>(k.start, doc_start[p - q.start]) : k.start;
    n += std::max<int64_t>(std::min(p, k.end() - 1) - first + 1, 0);
  }
  return n;
}

namespace {

constexpr int kKvTag = 31, kGradTag = 32;  // the two streams of ring transfers (NCCL: order alone)

// The rows of a (outer, L, inner) tensor cut along L by a layout's chunks: chunk j's rows as the
// contiguous block (outer, n_j, inner) of the packed tensor, at element offset outer row_j inner.
struct Packing {
  int64_t outer = 0, inner = 0;
  std::vector<int64_t> rows;  // the local row where each chunk starts

  Packing(const SequenceLayout& seq, int64_t outer_, int64_t inner_) : outer(outer_), inner(inner_) {
    int64_t row = 0;
    for (const SequenceChunk& c : seq.chunks()) {
      rows.push_back(row);
      row += c.length;
    }
  }
  // Chunk j (of length n) of the packed tensor, viewed as shape.
  Tensor block(const Tensor& packed, size_t j, int64_t n, const Shape& shape) const {
    return packed.view({packed.numel()}).slice_rows(outer * rows[j] * inner, outer * (rows[j] + n) * inner).view(shape);
  }
  // dst (packed) from src (outer, L, inner); or back.
  void pack(const Exec& ex, const SequenceLayout& seq, const Tensor& dst, const Tensor& src) const {
    const Tensor s2 = src.view({outer, src.numel() / outer});
    for (size_t j = 0; j < rows.size(); ++j) {
      const int64_t n = seq.chunks()[j].length;
      copy_columns(ex, block(dst, j, n, {outer, n * inner}), s2, rows[j] * inner);
    }
  }
  void unpack(const Exec& ex, const SequenceLayout& seq, const Tensor& dst, const Tensor& src) const {
    const Tensor d2 = dst.view({outer, dst.numel() / outer});
    for (size_t j = 0; j < rows.size(); ++j) {
      const int64_t n = seq.chunks()[j].length;
      paste_columns(ex, d2, block(src, j, n, {outer, n * inner}), rows[j] * inner);
    }
  }
};

// q (B, L, H, D) and k, v (B, L, KV, D): checked before anything reads their dimensions.
void check_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  TESSERA_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.shape == k.shape && k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) &&
                    k.dim(3) == q.dim(3),
                "context attention: q ", q.shape.str(), ", k ", k.shape.str(), " and v ", v.shape.str(),
                " must be (B, L, H, D), (B, L, KV, D) and (B, L, KV, D)");
}

// The document starts of the queries of each of a layout's chunks, packed (B, n) per chunk, and
// the earliest of each chunk: a key chunk ending before it is masked for all of the chunk's
// queries. Empty without documents.
struct ChunkDocs {
  std::vector<std::vector<int32_t>> starts;  // per chunk (B, n)
  std::vector<int64_t> earliest;             // per chunk

  ChunkDocs(const SequenceLayout& seq, int64_t B) {
    if (!seq.has_documents()) return;
    int64_t row = 0;
    for (const SequenceChunk& c : seq.chunks()) {
      std::vector<int32_t> d;
      d.reserve(static_cast<size_t>(B * c.length));
      for (int64_t b = 0; b < B; ++b) {
        const int32_t* src = seq.doc_starts(b, row);
        d.insert(d.end(), src, src + c.length);
      }
      earliest.push_back(*std::min_element(d.begin(), d.end()));
      starts.push_back(std::move(d));
      row += c.length;
    }
  }
  bool any() const { return !starts.empty(); }
  // Chunk i's (B, n) starts as a tensor, or undefined without documents.
  Tensor tensor(size_t i, int64_t B, int64_t n) const {
    return any() ? Tensor(const_cast<int32_t*>(starts[i].data()), DType::I32, {B, n}) : Tensor();
  }
  // Visible pairs of chunk i's queries (over the batch) with key chunk k.
  int64_t pairs(size_t i, const SequenceChunk& q, const SequenceChunk& k, int64_t B) const {
    if (!any()) return causal_pairs(q, k) * B;
    int64_t n = 0;
    for (int64_t b = 0; b < B; ++b) n += causal_pairs(q, k, starts[i].data() + b * q.length);
    return n;
  }
};

// One call's geometry and this rank's packed queries.
struct Problem {
  int64_t B, L, H, KV, D, T;
  int64_t P, r;
  SequenceLayout seq;  // this rank's chunks
  DType dtype;
  ChunkDocs docs;  // packed document starts of the queries (none without documents)

  Problem(const ContextParallel& cp, const Tensor& q, const Tensor& k, const SequenceLayout& s)
      : B(q.dim(0)), L(q.dim(1)), H(q.dim(2)), KV(k.dim(2)), D(q.dim(3)), P(cp.size()), r(cp.rank()), seq(s),
        dtype(q.dtype), docs(s, q.dim(0)) {
    T = L * P;
    TESSERA_CHECK(seq.length() == L, "context attention: ", L, " rows for the layout ", seq.str());
    const SequenceLayout want = cp.layout(T);
    TESSERA_CHECK(seq.same_chunks(want), "context attention on cp rank ", r, " of ", P, ": the rows hold ", seq.str(),
                  ", expected the load-balanced chunks ", want.str(), " of a sequence of ", T);
  }
  Packing q_pack() const { return Packing(seq, B, H * D); }
  Packing kv_pack(const SequenceLayout& s) const { return Packing(s, B, KV * D); }
  Packing lse_pack() const { return Packing(seq, B * H, 1); }
  int64_t kv_numel() const { return B * L * KV * D; }  // one of K or V
  // K (slot 0) or V (slot 1) of chunk j of a packed (2, B, L, KV, D) buffer held by rank src.
  Tensor kv_block(const Tensor& kv, int slot, const ContextParallel& cp, int64_t src, size_t j) const {
    const SequenceLayout s = cp.layout_of(T, src);
    const int64_t n = s.chunks()[j].length;
    const Tensor half = kv.view({2, kv_numel()}).slice_rows(slot, slot + 1).view({kv_numel()});
    return kv_pack(s).block(half, j, n, {B, n, KV, D});
  }
};

Buffer comm_buffer(Allocator& alloc, DType dt, Shape s) { return Buffer(alloc, dt, s, MemCategory::Communication); }
Buffer workspace(Allocator& alloc, DType dt, Shape s) { return Buffer(alloc, dt, s, MemCategory::Workspace); }

// K and V of this rank, packed into one (2, B, L, KV, D) buffer: what travels.
Buffer pack_kv(const Exec& ex, const Problem& pb, Allocator& alloc, const Tensor& k, const Tensor& v) {
  Buffer kv = comm_buffer(alloc, pb.dtype, {2, pb.kv_numel()});
  const Packing pk = pb.kv_pack(pb.seq);
  pk.pack(ex, pb.seq, kv.tensor().slice_rows(0, 1).view({pb.kv_numel()}), k);
  pk.pack(ex, pb.seq, kv.tensor().slice_rows(1, 2).view({pb.kv_numel()}), v);
  return kv;
}

// Calls fn(i, j, q_chunk, k_chunk) for each pair of this rank's query chunk i and rank src's key
// chunk j that the causal mask (and the document mask) leaves some visible pair in, and counts them
// into stats.
template <class F>
void for_visible_blocks(const ContextParallel& cp, const Problem& pb, int64_t src, ContextAttentionStats* stats,
                        F&& fn) {
  const SequenceLayout ks = cp.layout_of(pb.T, src);
  for (size_t i = 0; i < pb.seq.chunks().size(); ++i)
    for (size_t j = 0; j < ks.chunks().size(); ++j) {
      const SequenceChunk& qc = pb.seq.chunks()[i];
      const SequenceChunk& kc = ks.chunks()[j];
      if (kc.start > qc.end() - 1) continue;  // every key after every query: hidden
      if (pb.docs.any() && kc.end() <= pb.docs.earliest[i]) continue;  // before every query's document
      if (stats) {
        stats->visible_pairs += pb.docs.pairs(i, qc, kc, pb.B) * pb.H;
        stats->blocks += 1;
      }
      fn(i, j, qc, kc);
    }
}

// Forward blocks of this rank's packed queries against rank src's packed K/V, merged into the
// running packed out/lse (a chunk's first block writes them directly).
void forward_blocks(const Exec& ex, const ContextParallel& cp, const Problem& pb, Allocator& alloc, const Tensor& kv,
                    int64_t src, const Tensor& qp, const Tensor& outp, const Tensor& lsep, std::vector<bool>& started,
                    ContextAttentionStats* stats) {
  const Packing qk = pb.q_pack(), lk = pb.lse_pack();
  for_visible_blocks(cp, pb, src, stats, [&](size_t i, size_t j, const SequenceChunk& qc, const SequenceChunk& kc) {
    const int64_t n = qc.length;
    const Tensor q = qk.block(qp, i, n, {pb.B, n, pb.H, pb.D});
    const Tensor o = qk.block(outp, i, n, {pb.B, n, pb.H, pb.D});
    const Tensor l = lk.block(lsep, i, n, {pb.B, pb.H, n});
    const Tensor k = pb.kv_block(kv, 0, cp, src, j), v = pb.kv_block(kv, 1, cp, src, j);
    const Tensor docs = pb.docs.tensor(i, pb.B, n);
    if (!started[i]) {
      attention_forward(ex, o, l, q, k, v, qc.start, kc.start, docs);
      started[i] = true;
      return;
    }
    Buffer bo = workspace(alloc, pb.dtype, {pb.B, n, pb.H, pb.D});
    Buffer bl = workspace(alloc, pb.dtype, {pb.B, pb.H, n});
    attention_forward(ex, bo, bl, q, k, v, qc.start, kc.start, docs);
    attention_merge(ex, o, l, bo, bl);
  });
}

// Backward blocks against rank src's packed K/V: dq accumulated into the packed dqp, dK/dV of
// src's rows accumulated into the packed (2, B, L, KV, D) dkv.
void backward_blocks(const Exec& ex, const ContextParallel& cp, const Problem& pb, const Tensor& kv, const Tensor& dkv,
                     int64_t src, const Tensor& qp, const Tensor& outp, const Tensor& lsep, const Tensor& doutp,
                     const Tensor& dqp, ContextAttentionStats* stats) {
  const Packing qk = pb.q_pack(), lk = pb.lse_pack();
  for_visible_blocks(cp, pb, src, stats, [&](size_t i, size_t j, const SequenceChunk& qc, const SequenceChunk& kc) {
    const int64_t n = qc.length;
    const Shape qs{pb.B, n, pb.H, pb.D};
    attention_backward(ex, qk.block(dqp, i, n, qs), pb.kv_block(dkv, 0, cp, src, j), pb.kv_block(dkv, 1, cp, src, j),
                       qk.block(doutp, i, n, qs), qk.block(qp, i, n, qs), pb.kv_block(kv, 0, cp, src, j),
                       pb.kv_block(kv, 1, cp, src, j), qk.block(outp, i, n, qs),
                       lk.block(lsep, i, n, {pb.B, pb.H, n}), qc.start, kc.start, pb.docs.tensor(i, pb.B, n));
  });
}

// h.wait_on(ex), its blocked host time added to stats->ring_wait_s.
void timed_wait(CommHandle& h, const Exec& ex, ContextAttentionStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  h.wait_on(ex);
  if (stats) stats->ring_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t next_rank(const Problem& pb) { return (pb.r + 1) % pb.P; }
int64_t prev_rank(const Problem& pb) { return (pb.r + pb.P - 1) % pb.P; }
int64_t source_at(const Problem& pb, int64_t step) { return (pb.r - step % pb.P + pb.P) % pb.P; }

// Every rank's packed K/V, (P, 2, B, L, KV, D), and rank src's part of it.
Buffer gather_kv(const Exec& ex, const ContextParallel& cp, const Problem& pb, Allocator& alloc, const Tensor& kv) {
  Buffer all = comm_buffer(alloc, pb.dtype, {pb.P, 2 * pb.kv_numel()});
  cp.comm->all_gather(kv.view({2 * pb.kv_numel()}), all.tensor().view({pb.P * 2 * pb.kv_numel()}));
  return all;
}
Tensor rank_part(const Tensor& all, int64_t src) { return all.slice_rows(src, src + 1).view({2, all.dim(1) / 2}); }

}  // namespace

void context_attention_forward(const Exec& ex, const ContextParallel& cp, Allocator& alloc, const Tensor& out,
                               const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               const SequenceLayout& seq, ContextAttentionStats* stats) {
  check_shapes(q, k, v);
  if (!cp.active()) {  // one rank: the whole sequence, one kernel call
    TESSERA_CHECK(seq.chunks().size() == 1, "context attention without cp takes one chunk, got ", seq.str());
    const int64_t start = seq.chunks()[0].start;
    if (stats) {
      stats->visible_pairs += ChunkDocs(seq, q.dim(0)).pairs(0, seq.chunks()[0], seq.chunks()[0], q.dim(0)) * q.dim(2);
      stats->blocks += 1;
    }
    attention_forward(ex, out, lse, q, k, v, start, start, seq.doc_starts());
    return;
  }
  const Problem pb(cp, q, k, seq);
  Buffer qp = workspace(alloc, pb.dtype, q.shape), outp = workspace(alloc, pb.dtype, q.shape);
  Buffer lsep = workspace(alloc, pb.dtype, lse.shape);
  pb.q_pack().pack(ex, seq, qp, q);
  Buffer kv = pack_kv(ex, pb, alloc, k, v);
  std::vector<bool> started(seq.chunks().size(), false);
  if (cp.mode == CpComm::AllGather) {
    Buffer all = gather_kv(ex, cp, pb, alloc, kv);
    for (int64_t step = 0; step < pb.P; ++step) {
      const int64_t src = source_at(pb, step);
      forward_blocks(ex, cp, pb, alloc, rank_part(all, src), src, qp, outp, lsep, started, stats);
    }
  } else {
    Buffer next = comm_buffer(alloc, pb.dtype, kv.tensor().shape);
    for (int64_t step = 0; step < pb.P; ++step) {
      CommHandle transfer;  // the next block's K/V, in flight while this block computes
      if (step + 1 < pb.P)
        transfer = cp.comm->batch_send_recv_async({P2POp::send(kv, static_cast<int>(next_rank(pb)), kKvTag),
                                                   P2POp::recv(next, static_cast<int>(prev_rank(pb)), kKvTag)});
      forward_blocks(ex, cp, pb, alloc, kv, source_at(pb, step), qp, outp, lsep, started, stats);
      timed_wait(transfer, ex, stats);
      std::swap(kv, next);
    }
  }
  pb.q_pack().unpack(ex, seq, out, outp);
  pb.lse_pack().unpack(ex, seq, lse, lsep);
}

void context_attention_backward(const Exec& ex, const ContextParallel& cp, Allocator& alloc, const Tensor& dq,
                                const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                const SequenceLayout& seq, ContextAttentionStats* stats) {
  check_shapes(q, k, v);
  if (!cp.active()) {
    TESSERA_CHECK(seq.chunks().size() == 1, "context attention without cp takes one chunk, got ", seq.str());
    const int64_t start = seq.chunks()[0].start;
    if (stats) {
      stats->visible_pairs += ChunkDocs(seq, q.dim(0)).pairs(0, seq.chunks()[0], seq.chunks()[0], q.dim(0)) * q.dim(2);
      stats->blocks += 1;
    }
    attention_backward(ex, dq, dk, dv, dout, q, k, v, out, lse, start, start, seq.doc_starts());
    return;
  }
  const Problem pb(cp, q, k, seq);
  const Packing qk = pb.q_pack();
  Buffer qp = workspace(alloc, pb.dtype, q.shape), outp = workspace(alloc, pb.dtype, q.shape);
  Buffer doutp = workspace(alloc, pb.dtype, q.shape), dqp = workspace(alloc, pb.dtype, q.shape);
  Buffer lsep = workspace(alloc, pb.dtype, lse.shape);
  qk.pack(ex, seq, qp, q);
  qk.pack(ex, seq, outp, out);
  qk.pack(ex, seq, doutp, dout);
  pb.lse_pack().pack(ex, seq, lsep, lse);
  fill_zero(ex, dqp);
  Buffer kv = pack_kv(ex, pb, alloc, k, v);
  Buffer dkv_mine;  // this rank's total dK/dV, packed
  if (cp.mode == CpComm::AllGather) {
    dkv_mine = comm_buffer(alloc, pb.dtype, kv.tensor().shape);
    Buffer all = gather_kv(ex, cp, pb, alloc, kv);
    Buffer dall = comm_buffer(alloc, pb.dtype, all.tensor().shape);
    fill_zero(ex, dall);
    for (int64_t step = 0; step < pb.P; ++step) {
      const int64_t src = source_at(pb, step);
      backward_blocks(ex, cp, pb, rank_part(all, src), rank_part(dall, src), src, qp, outp, lsep, doutp, dqp, stats);
    }
      cp.comm->reduce_scatter(dall.tensor().view({dall.tensor().numel()}), dkv_mine.tensor().view({dkv_mine.tensor().numel()}));
  } else {
    // Step s: K/V of rank (r - s) arrive for the next step while this one computes; the dK/dV this
    // rank computes for them are added to what the earlier ranks of the ring accumulated (arriving
    // meanwhile from prev) and passed on to next. After cp steps each rank has received its own.
    Buffer next = comm_buffer(alloc, pb.dtype, kv.tensor().shape);
    // Double-buffered: a send (or receive) of step s is complete once `grads` is waited on at s + 1.
    const Shape shape = kv.tensor().shape;
    Buffer partial[2] = {comm_buffer(alloc, pb.dtype, shape), comm_buffer(alloc, pb.dtype, shape)};
    Buffer incoming[2] = {comm_buffer(alloc, pb.dtype, shape), comm_buffer(alloc, pb.dtype, shape)};
    CommHandle grads;  // the accumulated dK/dV of this step's source, from prev
    for (int64_t step = 0; step < pb.P; ++step) {
      CommHandle transfer;
      if (step + 1 < pb.P)
        transfer = cp.comm->batch_send_recv_async({P2POp::send(kv, static_cast<int>(next_rank(pb)), kKvTag),
                                                   P2POp::recv(next, static_cast<int>(prev_rank(pb)), kKvTag)});
      const Tensor mine = partial[step % 2];
      fill_zero(ex, mine);
      backward_blocks(ex, cp, pb, kv, mine, source_at(pb, step), qp, outp, lsep, doutp, dqp, stats);
      if (step > 0) {
        timed_wait(grads, ex, stats);
        accumulate(ex, mine, incoming[(step - 1) % 2]);
      }
      grads = cp.comm->batch_send_recv_async({P2POp::send(mine, static_cast<int>(next_rank(pb)), kGradTag),
                                              P2POp::recv(incoming[step % 2], static_cast<int>(prev_rank(pb)), kGradTag)});
      timed_wait(transfer, ex, stats);
      std::swap(kv, next);
    }
    timed_wait(grads, ex, stats);
    dkv_mine = std::move(incoming[(pb.P - 1) % 2]);
  }
  // Back to the caller's row order, accumulated; the packed q and K/V (no longer needed) hold
  // the unpacked gradients on their way.
  const Tensor tmp_q = qp.tensor();
  qk.unpack(ex, seq, tmp_q, dqp);
  accumulate(ex, dq, tmp_q);
  const Tensor tmp_kv = kv.tensor().slice_rows(0, 1).view(k.shape);
  const Packing kp = pb.kv_pack(seq);
  for (int slot = 0; slot < 2; ++slot) {
    kp.unpack(ex, seq, tmp_kv, dkv_mine.tensor().slice_rows(slot, slot + 1).view({pb.kv_numel()}));
    accumulate(ex, slot == 0 ? dk : dv, tmp_kv);
  }
}

}  // namespace tessera
