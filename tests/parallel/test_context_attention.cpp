// Tests parallel/context_attention.h under 1, 2 and 4 ranks (the world is one cp group): ring and
// all-gather attention, forward and backward, against the whole-sequence attention kernel on the
// same f64 inputs (the oracle: one attention_forward / attention_backward over [0, T), whose rows
// at this rank's positions must come out), for odd chunk lengths and grouped-query attention; the
// causal work of every rank is equal (load balance); the ring's bytes are what it sends. Packed
// documents: the same against the whole-sequence kernel with the document mask, and key chunks
// wholly before the local queries' documents are skipped.
#include "parallel/context_attention.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "error_testing.h"
#include "kernels/attention.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;
namespace {

using testing::test_world;

struct Case {
  int64_t B, n, H, KV, D;  // n: chunk length (the sequence is 2 cp n)
};

// Rows of a (B, T, X...) or (B, H, T) tensor at a layout's positions.
template <typename T>
HostTensor<T> rows_of(const HostTensor<T>& full, const SequenceLayout& seq, bool lse_layout) {
  const Shape& s = full.shape();
  const int64_t B = s[0], L = seq.length();
  if (lse_layout) {  // (B, H, T)
    const int64_t H = s[1], Tg = s[2];
    HostTensor<T> out({B, H, L});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i) out[(b * H + h) * L + i] = full[(b * H + h) * Tg + seq.position(i)];
    return out;
  }
  const int64_t Tg = s[1], row = full.numel() / (B * Tg);
  Shape o = s;
  o[1] = L;
  HostTensor<T> out(o);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t e = 0; e < row; ++e) out[(b * L + i) * row + e] = full[(b * Tg + seq.position(i)) * row + e];
  return out;
}

// Every rank's value of x, gathered.
std::vector<int64_t> all_ranks(int64_t x) {
  int n = 0;
  MPI_Comm_size(test_world(), &n);
  std::vector<int64_t> v(static_cast<size_t>(n));
  MPI_Allgather(&x, 1, MPI_INT64_T, v.data(), 1, MPI_INT64_T, test_world());
  return v;
}

void expect_matches_whole_sequence(const Case& c, CpComm mode) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const ContextParallel cp{&comm, mode};
  const int64_t P = comm.size(), T = 2 * P * c.n;
  SCOPED_TRACE(::testing::Message() << cp_comm_name(mode) << " cp " << P << " B " << c.B << " n " << c.n << " H "
                                    << c.H << " KV " << c.KV << " D " << c.D);
  // The oracle: the whole sequence on every rank, the same inputs everywhere (seeded).
  auto q = HostTensor<double>::uniform({c.B, T, c.H, c.D}, 11), dout = HostTensor<double>::uniform(q.shape(), 14);
  auto k = HostTensor<double>::uniform({c.B, T, c.KV, c.D}, 12), v = HostTensor<double>::uniform(k.shape(), 13);
  HostTensor<double> out(q.shape()), lse({c.B, c.H, T}), dq(q.shape()), dk(k.shape()), dv(k.shape());
  attention_forward(kCpu, out.t(), lse.t(), q.t(), k.t(), v.t(), 0, 0);
  attention_backward(kCpu, dq.t(), dk.t(), dv.t(), dout.t(), q.t(), k.t(), v.t(), out.t(), lse.t(), 0, 0);

  const SequenceLayout seq = cp.layout(T);
  auto lq = rows_of(q, seq, false), lk = rows_of(k, seq, false), lv = rows_of(v, seq, false);
  auto ldout = rows_of(dout, seq, false);
  HostTensor<double> lout(lq.shape()), llse({c.B, c.H, seq.length()});
  Allocator alloc;
  ContextAttentionStats fwd;
  comm.reset_counters();
  context_attention_forward(kCpu, cp, alloc, lout.t(), llse.t(), lq.t(), lk.t(), lv.t(), seq, &fwd);
  const int64_t forward_bytes = comm.bytes_sent();
  EXPECT_LT(testing::max_rel_error(lout, rows_of(out, seq, false)), 1e-12);
  EXPECT_LT(testing::max_rel_error(llse, rows_of(lse, seq, true)), 1e-12);

  // Backward accumulates: start from ones and subtract them.
  HostTensor<double> ldq(lq.shape(), 1.0), ldk(lk.shape(), 1.0), ldv(lk.shape(), 1.0);
  context_attention_backward(kCpu, cp, alloc, ldq.t(), ldk.t(), ldv.t(), ldout.t(), lq.t(), lk.t(), lv.t(), lout.t(),
                             llse.t(), seq);
  for (auto* g : {&ldq, &ldk, &ldv})
    for (auto& x : g->vec()) x -= 1.0;
  EXPECT_LT(testing::max_rel_error(ldq, rows_of(dq, seq, false)), 1e-12) << "dq";
  EXPECT_LT(testing::max_rel_error(ldk, rows_of(dk, seq, false)), 1e-12) << "dk";
  EXPECT_LT(testing::max_rel_error(ldv, rows_of(dv, seq, false)), 1e-12) << "dv";
  EXPECT_EQ(alloc.counter(MemCategory::Workspace).current, 0u);
  EXPECT_EQ(alloc.counter(MemCategory::Communication).current, 0u);

  // Load balance: every rank computed the same number of visible (query, key) pairs, and together
  // all of the causal triangle, once.
  const std::vector<int64_t> pairs = all_ranks(fwd.visible_pairs);
  for (int64_t p : pairs) EXPECT_EQ(p, pairs[0]) << "visible pairs per rank differ";
  int64_t total = 0;
  for (int64_t p : pairs) total += p;
  EXPECT_EQ(total, c.B * c.H * T * (T + 1) / 2);
  // Bytes: the ring sends its K and V on P - 1 times; the all-gather counts (P - 1) / P of all ranks'
  // K and V, the same.
  const int64_t kv_bytes = 2 * c.B * seq.length() * c.KV * c.D * 8;
  EXPECT_EQ(forward_bytes, (P - 1) * kv_bytes);
}

const std::vector<Case> kCases = {
    {1, 3, 4, 2, 5},  // odd chunks, GQA (2 query heads per KV head)
    {2, 5, 4, 1, 3},  // two sequences, one KV head for all
    {2, 1, 2, 2, 4},  // chunks of one position, MHA
    {1, 20, 4, 2, 8},  // longer chunks
};

TEST(ContextAttention, RingMatchesWholeSequence) {
  for (const Case& c : kCases) expect_matches_whole_sequence(c, CpComm::Ring);
}

TEST(ContextAttention, AllGatherMatchesWholeSequence) {
  for (const Case& c : kCases) expect_matches_whole_sequence(c, CpComm::AllGather);
}

// f32 takes the flash path in every block: the same results within f32 rounding.
TEST(ContextAttention, FloatRingMatchesWholeSequence) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const ContextParallel cp{&comm, CpComm::Ring};
  const int64_t B = 1, n = 37, H = 4, KV = 2, D = 8, T = 2 * comm.size() * n;
  auto q = HostTensor<double>::uniform({B, T, H, D}, 21).cast<float>();
  auto k = HostTensor<double>::uniform({B, T, KV, D}, 22).cast<float>();
  auto v = HostTensor<double>::uniform({B, T, KV, D}, 23).cast<float>();
  HostTensor<float> out(q.shape()), lse({B, H, T});
  attention_forward(kCpu, out.t(), lse.t(), q.t(), k.t(), v.t(), 0, 0);
  const SequenceLayout seq = cp.layout(T);
  auto lq = rows_of(q, seq, false), lk = rows_of(k, seq, false), lv = rows_of(v, seq, false);
  HostTensor<float> lout(lq.shape()), llse({B, H, seq.length()});
  Allocator alloc;
  context_attention_forward(kCpu, cp, alloc, lout.t(), llse.t(), lq.t(), lk.t(), lv.t(), seq);
  EXPECT_LT(testing::max_rel_error(lout, rows_of(out, seq, false)), 1e-5);
  EXPECT_LT(testing::max_rel_error(llse, rows_of(lse, seq, true)), 1e-5);
}

// Document starts (B, T) of a sequence cut into documents of the given lengths (cycled; sequence b
// starts b entries into the cycle).
std::vector<int32_t> document_starts_of(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> d;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0, k = b;
    while (start < T) {
      const int64_t n = std::min(lengths[static_cast<size_t>(k++) % lengths.size()], T - start);
      d.insert(d.end(), static_cast<size_t>(n), static_cast<int32_t>(start));
      start += n;
    }
  }
  return d;
}

// Forward and backward under the document mask against the whole-sequence kernel with it; returns
// this rank's forward stats.
ContextAttentionStats expect_documents_match(const Case& c, CpComm mode, const std::vector<int64_t>& lengths) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const ContextParallel cp{&comm, mode};
  const int64_t P = comm.size(), T = 2 * P * c.n;
  SCOPED_TRACE(::testing::Message() << cp_comm_name(mode) << " cp " << P << " B " << c.B << " n " << c.n
                                    << " documents of " << ::testing::PrintToString(lengths));
  auto q = HostTensor<double>::uniform({c.B, T, c.H, c.D}, 31), dout = HostTensor<double>::uniform(q.shape(), 34);
  auto k = HostTensor<double>::uniform({c.B, T, c.KV, c.D}, 32), v = HostTensor<double>::uniform(k.shape(), 33);
  std::vector<int32_t> docs = document_starts_of(c.B, T, lengths);
  const Tensor whole_docs(docs.data(), DType::I32, {c.B, T});
  HostTensor<double> out(q.shape()), lse({c.B, c.H, T}), dq(q.shape()), dk(k.shape()), dv(k.shape());
  attention_forward(kCpu, out.t(), lse.t(), q.t(), k.t(), v.t(), 0, 0, whole_docs);
  attention_backward(kCpu, dq.t(), dk.t(), dv.t(), dout.t(), q.t(), k.t(), v.t(), out.t(), lse.t(), 0, 0, whole_docs);

  const SequenceLayout chunks = cp.layout(T);
  std::vector<int32_t> local_docs;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < chunks.length(); ++i) local_docs.push_back(docs[static_cast<size_t>(b * T + chunks.position(i))]);
  const SequenceLayout seq = chunks.with_documents(c.B, local_docs);
  auto lq = rows_of(q, seq, false), lk = rows_of(k, seq, false), lv = rows_of(v, seq, false);
  auto ldout = rows_of(dout, seq, false);
  HostTensor<double> lout(lq.shape()), llse({c.B, c.H, seq.length()});
  Allocator alloc;
  ContextAttentionStats fwd;
  context_attention_forward(kCpu, cp, alloc, lout.t(), llse.t(), lq.t(), lk.t(), lv.t(), seq, &fwd);
  EXPECT_LT(testing::max_rel_error(lout, rows_of(out, seq, false)), 1e-12);
  EXPECT_LT(testing::max_rel_error(llse, rows_of(lse, seq, true)), 1e-12);
  HostTensor<double> ldq(lq.shape()), ldk(lk.shape()), ldv(lk.shape());
  context_attention_backward(kCpu, cp, alloc, ldq.t(), ldk.t(), ldv.t(), ldout.t(), lq.t(), lk.t(), lv.t(), lout.t(),
                             llse.t(), seq);
  EXPECT_LT(testing::max_rel_error(ldq, rows_of(dq, seq, false)), 1e-12) << "dq";
  EXPECT_LT(testing::max_rel_error(ldk, rows_of(dk, seq, false)), 1e-12) << "dk";
  EXPECT_LT(testing::max_rel_error(ldv, rows_of(dv, seq, false)), 1e-12) << "dv";
  // Together the ranks counted every visible pair once: position p sees p - doc_start + 1 keys.
  int64_t want = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t p = 0; p < T; ++p) want += (p - docs[static_cast<size_t>(b * T + p)] + 1) * c.H;
  int64_t total = 0;
  for (int64_t x : all_ranks(fwd.visible_pairs)) total += x;
  EXPECT_EQ(total, want);
  return fwd;
}

TEST(ContextAttention, DocumentMaskMatchesWholeSequence) {
  for (CpComm mode : {CpComm::Ring, CpComm::AllGather}) {
    expect_documents_match({1, 3, 4, 2, 5}, mode, {5, 2, 9});  // odd chunks, GQA, documents across chunks
    expect_documents_match({2, 5, 4, 1, 3}, mode, {1, 7, 4});  // two sequences with different documents
    expect_documents_match({1, 20, 4, 2, 8}, mode, {33, 50});  // documents spanning ranks
  }
}

// Every chunk its own document: each query chunk sees only its own keys, so a rank computes its
// diagonal blocks and skips every other chunk (causal or not) instead of masking it.
TEST(ContextAttention, DocumentMaskSkipsMaskedChunks) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const int64_t n = 4;
  for (CpComm mode : {CpComm::Ring, CpComm::AllGather}) {
    const ContextAttentionStats s = expect_documents_match({2, n, 2, 1, 4}, mode, {n});
    // Its chunks' diagonal blocks: two, or one where the rank's chunks are adjacent (the last rank's
    // P - 1 and P form one chunk).
    const int64_t chunks = static_cast<int64_t>(
        SequenceLayout::load_balanced(2 * comm.size() * n, comm.size(), comm.rank()).chunks().size());
    EXPECT_EQ(s.blocks, comm.size() > 1 ? chunks : 1) << cp_comm_name(mode) << " on rank " << comm.rank();
    if (comm.size() > 1 && comm.rank() < comm.size() - 1) {
      EXPECT_EQ(chunks, 2);
    }
  }
}

TEST(ContextAttention, PairsOfTheLoadBalancedLayoutAreEqual) {
  // Without running anything: the arithmetic for cp up to 8 and odd chunks.
  for (int64_t P : {2, 3, 4, 8})
    for (int64_t n : {1, 3, 7}) {
      const int64_t T = 2 * P * n;
      std::vector<int64_t> per_rank;
      for (int64_t r = 0; r < P; ++r) {
        const SequenceLayout mine = SequenceLayout::load_balanced(T, P, r);
        int64_t pairs = 0;
        for (int64_t s = 0; s < P; ++s) {
          const SequenceLayout theirs = SequenceLayout::load_balanced(T, P, s);
          for (const SequenceChunk& qc : mine.chunks())
            for (const SequenceChunk& kc : theirs.chunks()) pairs += causal_pairs(qc, kc);
        }
        per_rank.push_back(pairs);
      }
      for (int64_t p : per_rank) EXPECT_EQ(p, per_rank[0]) << "cp " << P << " n " << n;
      EXPECT_EQ(per_rank[0] * P, T * (T + 1) / 2);
    }
}

TEST(ContextAttention, RefusesAnotherLayout) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  if (comm.size() < 2) GTEST_SKIP() << "needs cp > 1";
  const ContextParallel cp{&comm, CpComm::Ring};
  const int64_t L = 4, T = L * comm.size();
  HostTensor<double> q({1, L, 2, 4}), k({1, L, 1, 4}), out(q.shape()), lse({1, 2, L});
  Allocator alloc;
  const SequenceLayout seq = SequenceLayout::contiguous(L, comm.rank() * L);
  EXPECT_TRUE(testing::throws_with(
      [&] { context_attention_forward(kCpu, cp, alloc, out.t(), lse.t(), q.t(), k.t(), k.t(), seq); },
      {"expected the load-balanced chunks"}))
      << T;
}

TEST(ContextAttention, RefusesBadShapes) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const ContextParallel cp{&comm, CpComm::Ring};
  HostTensor<double> q({1, 4, 2}), k({1, 4, 1, 4}), out({1, 4, 2}), lse({1, 2, 4});
  Allocator alloc;
  EXPECT_TRUE(testing::throws_with(
      [&] { context_attention_forward(kCpu, cp, alloc, out.t(), lse.t(), q.t(), k.t(), k.t(), cp.layout(4 * comm.size())); },
      {"context attention: q (1, 4, 2)", "must be (B, L, H, D)"}));
}

TEST(ContextAttention, ParsesTheCommMode) {
  EXPECT_EQ(parse_cp_comm("ring"), CpComm::Ring);
  EXPECT_EQ(parse_cp_comm("allgather"), CpComm::AllGather);
  EXPECT_TRUE(testing::throws_with([] { parse_cp_comm("a2a"); }, {"parallel.cp_comm = \"a2a\""}));
}

}  // namespace
}  // namespace tessera
