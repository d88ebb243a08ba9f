// Tests kernels/attention.h: the double reference against a naive full-matrix attention written
// here, the float flash path against the reference, the backward against finite differences, the
// += semantics, the ring property (key blocks merged by log-sum-exp equal one call), and document
// masking (against the naive oracle with the document mask, documents run one by one, finite
// differences, and masked key tiles never read).
#include "kernels/attention.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One attention problem: sizes and the causal offsets.
struct Case {
  int64_t B, T, S, H, KV, D, q_offset, k_offset;
};

// Shapes that cover MHA, GQA (H/KV = 2 and 4), D not a multiple of 8, T != S with offsets both
// ways (a later chunk over earlier keys; rows with no visible key), and, for the flash path, lengths
// that are not multiples of its tiles (32 queries x 64 keys) or of its 4 x 16 register blocks.
const std::vector<Case> kCases = {
    {2, 5, 5, 2, 2, 4, 0, 0},   {1, 7, 7, 4, 2, 5, 0, 0},     {2, 6, 6, 4, 1, 3, 0, 0},
    {1, 8, 16, 4, 2, 6, 8, 0},  {1, 16, 16, 2, 1, 4, 0, 8},   {1, 70, 70, 2, 1, 7, 0, 0},
    {2, 45, 130, 4, 2, 9, 90, 3}, {1, 33, 65, 4, 4, 16, 40, 10}, {1, 40, 20, 2, 1, 11, 0, 10},
    {2, 37, 37, 2, 2, 40, 0, 0},  {2, 100, 100, 4, 2, 32, 0, 0},  // the last is big enough for threads
};

// Random q, k, v for a case, in double.
struct Inputs {
  HostTensor<double> q, k, v;
  Inputs(const Case& c, uint64_t seed)
      : q(HostTensor<double>::uniform({c.B, c.T, c.H, c.D}, seed)),
        k(HostTensor<double>::uniform({c.B, c.S, c.KV, c.D}, seed + 1)),
        v(HostTensor<double>::uniform({c.B, c.S, c.KV, c.D}, seed + 2)) {}
};

template <typename T>
struct Result {
  HostTensor<T> out, lse;  // (B, T, H, D), (B, H, T)
};

// The document starts as a (B, T) tensor over docs' storage, or undefined when docs is empty.
Tensor doc_tensor(const Case& c, const std::vector<int32_t>& docs) {
  return docs.empty() ? Tensor() : Tensor(const_cast<int32_t*>(docs.data()), DType::I32, {c.B, c.T});
}

template <typename T>
Result<T> run_forward(const Case& c, const HostTensor<T>& q, const HostTensor<T>& k, const HostTensor<T>& v,
                      const std::vector<int32_t>& docs = {}) {
  Result<T> r{HostTensor<T>({c.B, c.T, c.H, c.D}), HostTensor<T>({c.B, c.H, c.T})};
  attention_forward(kCpu, r.out.t(), r.lse.t(), q.t(), k.t(), v.t(), c.q_offset, c.k_offset, doc_tensor(c, docs));
  return r;
}

// Independent oracle: the full (T, S) score matrix of each (b, h) with an explicit mask, softmax,
// then probabilities times values. doc_start (B, T), when not empty, adds the document mask: key
// position >= the query's document start.
Result<double> naive_attention(const Case& c, const Inputs& in, const std::vector<int32_t>& doc_start = {}) {
  Result<double> r{HostTensor<double>({c.B, c.T, c.H, c.D}), HostTensor<double>({c.B, c.H, c.T})};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  std::vector<double> score(c.T * c.S);
  std::vector<bool> mask(c.T * c.S);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h * c.KV / c.H;
      for (int64_t i = 0; i < c.T; ++i)
        for (int64_t j = 0; j < c.S; ++j) {
          double s = 0;
          for (int64_t d = 0; d < c.D; ++d)
            s += in.q[((b * c.T + i) * c.H + h) * c.D + d] * in.k[((b * c.S + j) * c.KV + g) * c.D + d];
          score[i * c.S + j] = scale * s;
          mask[i * c.S + j] = c.k_offset + j <= c.q_offset + i &&
                              (doc_start.empty() || doc_start[b * c.T + i] <= c.k_offset + j);
        }
      for (int64_t i = 0; i < c.T; ++i) {
        double mx = -kInf, l = 0;
        for (int64_t j = 0; j < c.S; ++j)
          if (mask[i * c.S + j]) mx = std::max(mx, score[i * c.S + j]);
        for (int64_t j = 0; j < c.S; ++j) l += mask[i * c.S + j] ? std::exp(score[i * c.S + j] - mx) : 0.0;
        r.lse[(b * c.H + h) * c.T + i] = l > 0 ? mx + std::log(l) : -kInf;
        for (int64_t j = 0; j < c.S; ++j) {
          if (!mask[i * c.S + j]) continue;
          const double p = std::exp(score[i * c.S + j] - mx) / l;
          for (int64_t d = 0; d < c.D; ++d)
            r.out[((b * c.T + i) * c.H + h) * c.D + d] += p * in.v[((b * c.S + j) * c.KV + g) * c.D + d];
        }
      }
    }
  return r;
}

// Normwise relative error of lse over its finite entries; the -inf entries must match exactly
// (returns infinity otherwise).
template <typename A>
double lse_error(const HostTensor<A>& a, const HostTensor<double>& ref) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double x = static_cast<double>(a[i]), y = ref[i];
    if (std::isinf(y) || std::isinf(x)) {
      if (x != y) return kInf;
      continue;
    }
    diff = std::max(diff, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return diff / std::max(scale, 1e-30);
}

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "B=" << c.B << " T=" << c.T << " S=" << c.S << " H=" << c.H << " KV=" << c.KV << " D=" << c.D
     << " q_offset=" << c.q_offset << " k_offset=" << c.k_offset;
  return os.str();
}

template <typename T>
struct Grads {
  HostTensor<T> dq, dk, dv;
};

// Zero gradients, then one backward call with the given dout.
template <typename T>
Grads<T> run_backward(const Case& c, const HostTensor<T>& dout, const HostTensor<T>& q, const HostTensor<T>& k,
                      const HostTensor<T>& v, const Result<T>& fwd, const std::vector<int32_t>& docs = {}) {
  Grads<T> g{HostTensor<T>(q.shape()), HostTensor<T>(k.shape()), HostTensor<T>(k.shape())};
  attention_backward(kCpu, g.dq.t(), g.dk.t(), g.dv.t(), dout.t(), q.t(), k.t(), v.t(), fwd.out.t(), fwd.lse.t(),
                     c.q_offset, c.k_offset, doc_tensor(c, docs));
  return g;
}

// Document starts (B, T) for the queries of a case: each batch row's positions q_offset .. are cut
// into documents at the given lengths (cycled, shifted per row), the first document starting at
// `first` (<= q_offset: a document that began before the queries' chunk).
std::vector<int32_t> make_docs(const Case& c, const std::vector<int64_t>& lengths, int64_t first) {
  std::vector<int32_t> docs(static_cast<size_t>(c.B * c.T));
  for (int64_t b = 0; b < c.B; ++b) {
    int64_t start = first, end = c.q_offset + lengths[b % lengths.size()], n = static_cast<int64_t>(b);
    for (int64_t i = 0; i < c.T; ++i) {
      const int64_t pos = c.q_offset + i;
      if (pos >= end) {
        start = pos;
        end = pos + lengths[static_cast<size_t>(++n) % lengths.size()];
      }
      docs[static_cast<size_t>(b * c.T + i)] = static_cast<int32_t>(start);
    }
  }
  return docs;
}

}  // namespace

TEST(Attention, ReferenceMatchesNaive) {
  for (const Case& c : kCases) {
    Inputs in(c, 10);
    auto ref = run_forward(c, in.q, in.k, in.v);
    auto naive = naive_attention(c, in);
    // Same math in double, different summation order: rounding only.
    EXPECT_LT(testing::max_rel_error(ref.out, naive.out), 1e-13) << describe(c);
    EXPECT_LT(lse_error(ref.lse, naive.lse), 1e-13) << describe(c);
  }
}

TEST(Attention, RowsWithoutVisibleKeysAreZero) {
  // Queries at positions 0..15, keys at 8..23: rows 0..7 see nothing.
  const Case c{1, 16, 16, 2, 1, 4, 0, 8};
  Inputs in(c, 20);
  auto ref = run_forward(c, in.q, in.k, in.v);
  auto flt = run_forward(c, in.q.cast<float>(), in.k.cast<float>(), in.v.cast<float>());
  for (int64_t h = 0; h < c.H; ++h)
    for (int64_t i = 0; i < c.T; ++i) {
      const bool empty = i < 8;
      EXPECT_EQ(std::isinf(ref.lse[h * c.T + i]) && ref.lse[h * c.T + i] < 0, empty) << "h=" << h << " i=" << i;
      EXPECT_EQ(std::isinf(flt.lse[h * c.T + i]) && flt.lse[h * c.T + i] < 0, empty) << "h=" << h << " i=" << i;
      for (int64_t d = 0; empty && d < c.D; ++d) {
        EXPECT_EQ(ref.out[(i * c.H + h) * c.D + d], 0.0);
        EXPECT_EQ(flt.out[(i * c.H + h) * c.D + d], 0.0f);
      }
    }
}

// The float path differs from the reference by float rounding of inputs and arithmetic. Scores are
// O(1) (uniform inputs, scale 1/sqrt(D)) and each is a D-term dot product; out is a convex
// combination of at most S = 130 rows, and each gradient a sum of at most G T = 90 terms. The
// worst-case relative bound n eps with n <= 260 and eps = 6e-8 is ~1.6e-5; we allow 3e-5.
constexpr double kFloatTol = 3e-5;

TEST(Attention, FloatMatchesReference) {
  for (const Case& c : kCases) {
    Inputs in(c, 30);
    auto ref = run_forward(c, in.q, in.k, in.v);
    auto qf = in.q.cast<float>(), kf = in.k.cast<float>(), vf = in.v.cast<float>();
    auto flt = run_forward(c, qf, kf, vf);
    EXPECT_LT(testing::max_rel_error(flt.out, ref.out), kFloatTol) << describe(c);
    EXPECT_LT(lse_error(flt.lse, ref.lse), kFloatTol) << describe(c);

    auto dout = HostTensor<double>::uniform(in.q.shape(), 31);
    auto g = run_backward(c, dout, in.q, in.k, in.v, ref);
    auto gf = run_backward(c, dout.cast<float>(), qf, kf, vf, flt);
    EXPECT_LT(testing::max_rel_error(gf.dq, g.dq), kFloatTol) << "dq " << describe(c);
    EXPECT_LT(testing::max_rel_error(gf.dk, g.dk), kFloatTol) << "dk " << describe(c);
    EXPECT_LT(testing::max_rel_error(gf.dv, g.dv), kFloatTol) << "dv " << describe(c);
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // GQA, a later chunk over earlier keys, and rows with no visible key.
  for (const Case& c : {Case{1, 6, 9, 4, 2, 5, 3, 0}, Case{2, 7, 5, 2, 1, 3, 0, 3}}) {
    Inputs in(c, 40);
    auto w = HostTensor<double>::uniform({c.B, c.T, c.H, c.D}, 41);
    auto loss = [&] { return testing::weighted_sum(run_forward(c, in.q, in.k, in.v).out, w); };
    auto g = run_backward(c, w, in.q, in.k, in.v, run_forward(c, in.q, in.k, in.v));
    testing::expect_gradient_matches(loss, in.q, g.dq, "q", 1e-6, 1e-5, 1000);
    testing::expect_gradient_matches(loss, in.k, g.dk, "k", 1e-6, 1e-5, 1000);
    testing::expect_gradient_matches(loss, in.v, g.dv, "v", 1e-6, 1e-5, 1000);
  }
}

// dq, dk, dv are accumulated: starting from g0 gives g0 + the gradient.
template <typename T>
void expect_accumulates(double tol) {
  const Case c{2, 37, 70, 4, 2, 6, 33, 0};
  Inputs in(c, 50);
  auto q = in.q.template cast<T>(), k = in.k.template cast<T>(), v = in.v.template cast<T>();
  auto dout = HostTensor<double>::uniform(q.shape(), 51).template cast<T>();
  auto fwd = run_forward(c, q, k, v);
  auto fresh = run_backward(c, dout, q, k, v, fwd);
  Grads<T> g{HostTensor<T>::uniform(q.shape(), 52), HostTensor<T>::uniform(k.shape(), 53),
             HostTensor<T>::uniform(k.shape(), 54)};
  Grads<T> start = g;
  attention_backward(kCpu, g.dq.t(), g.dk.t(), g.dv.t(), dout.t(), q.t(), k.t(), v.t(), fwd.out.t(), fwd.lse.t(),
                     c.q_offset, c.k_offset);
  for (int64_t i = 0; i < start.dq.numel(); ++i) start.dq[i] += fresh.dq[i];
  for (int64_t i = 0; i < start.dk.numel(); ++i) start.dk[i] += fresh.dk[i];
  for (int64_t i = 0; i < start.dv.numel(); ++i) start.dv[i] += fresh.dv[i];
  EXPECT_LT(testing::max_rel_error(g.dq, start.dq), tol);
  EXPECT_LT(testing::max_rel_error(g.dk, start.dk), tol);
  EXPECT_LT(testing::max_rel_error(g.dv, start.dv), tol);
}

TEST(Attention, BackwardAccumulates) {
  // Only the order of the sums differs (the start value is added first instead of last).
  expect_accumulates<double>(1e-13);
  expect_accumulates<float>(kFloatTol);
}

TEST(Attention, FloatBackwardIsDeterministicAcrossThreadCounts) {
  const Case c{2, 100, 100, 4, 2, 32, 0, 0};  // big enough to run threaded
  Inputs in(c, 60);
  auto q = in.q.cast<float>(), k = in.k.cast<float>(), v = in.v.cast<float>();
  auto dout = HostTensor<double>::uniform(q.shape(), 61).cast<float>();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto f1 = run_forward(c, q, k, v);
  auto g1 = run_backward(c, dout, q, k, v, f1);
  omp_set_num_threads(3);
  auto f3 = run_forward(c, q, k, v);
  auto g3 = run_backward(c, dout, q, k, v, f3);
  omp_set_num_threads(saved);
  EXPECT_EQ(f1.out.vec(), f3.out.vec());
  EXPECT_EQ(g1.dq.vec(), g3.dq.vec());
  EXPECT_EQ(g1.dk.vec(), g3.dk.vec());
  EXPECT_EQ(g1.dv.vec(), g3.dv.vec());
}

namespace {

// Rows [begin, end) of dimension 1 (the sequence) of a (B, S, KV, D) tensor, and the way back.
template <typename T>
HostTensor<T> seq_slice(const HostTensor<T>& x, int64_t begin, int64_t end) {
  const Shape& s = x.shape();
  const int64_t row = s[2] * s[3], n = end - begin;
  HostTensor<T> y({s[0], n, s[2], s[3]});
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t i = 0; i < n * row; ++i) y[b * n * row + i] = x[(b * s[1] + begin) * row + i];
  return y;
}
template <typename T>
void seq_unslice(HostTensor<T>& x, const HostTensor<T>& y, int64_t begin) {
  const Shape& s = x.shape();
  const int64_t row = s[2] * s[3], n = y.shape()[1];
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t i = 0; i < n * row; ++i) x[(b * s[1] + begin) * row + i] = y[b * n * row + i];
}

// Log-sum-exp merge of two partial results over disjoint key blocks (what ring attention does).
template <typename T>
Result<T> merge(const Result<T>& a, const Result<T>& b, int64_t D) {
  Result<T> r{HostTensor<T>(a.out.shape()), HostTensor<T>(a.lse.shape())};
  const Shape& s = a.out.shape();  // (B, T, H, D)
  for (int64_t bi = 0; bi < s[0]; ++bi)
    for (int64_t t = 0; t < s[1]; ++t)
      for (int64_t h = 0; h < s[2]; ++h) {
        const int64_t li = (bi * s[2] + h) * s[1] + t, oi = ((bi * s[1] + t) * s[2] + h) * D;
        const T la = a.lse[li], lb = b.lse[li], mx = std::max(la, lb);
        if (std::isinf(mx)) {  // neither block has a visible key
          r.lse[li] = mx;
          continue;
        }
        const T lse = mx + std::log(std::exp(la - mx) + std::exp(lb - mx));
        r.lse[li] = lse;
        for (int64_t d = 0; d < D; ++d)
          r.out[oi + d] = std::exp(la - lse) * a.out[oi + d] + std::exp(lb - lse) * b.out[oi + d];
      }
  return r;
}

// Keys split at `split` into two blocks: merged forward equals one call, and the per-block backward
// with the merged out/lse, summed over blocks, equals the single-call backward.
template <typename T>
void expect_ring_property(const Case& c, int64_t split, double tol) {
  Inputs in(c, 70);
  auto q = in.q.template cast<T>(), k = in.k.template cast<T>(), v = in.v.template cast<T>();
  auto dout = HostTensor<double>::uniform(q.shape(), 71).template cast<T>();
  auto whole = run_forward(c, q, k, v);
  auto g_whole = run_backward(c, dout, q, k, v, whole);

  Case c1 = c, c2 = c;
  c1.S = split;
  c2.S = c.S - split;
  c2.k_offset = c.k_offset + split;
  auto k1 = seq_slice(k, 0, split), v1 = seq_slice(v, 0, split);
  auto k2 = seq_slice(k, split, c.S), v2 = seq_slice(v, split, c.S);
  auto merged = merge(run_forward(c1, q, k1, v1), run_forward(c2, q, k2, v2), c.D);
  EXPECT_LT(testing::max_rel_error(merged.out, whole.out), tol) << describe(c);
  EXPECT_LT(lse_error(merged.lse, whole.lse.template cast<double>()), tol) << describe(c);
  // The kernel's merge (kernels/attention.h), both orders: a running result that saw no key yet
  // (lse = -inf) takes the block's, and a block that saw none leaves the running one unchanged.
  for (bool reversed : {false, true}) {
    auto first = reversed ? run_forward(c2, q, k2, v2) : run_forward(c1, q, k1, v1);
    auto second = reversed ? run_forward(c1, q, k1, v1) : run_forward(c2, q, k2, v2);
    attention_merge(kCpu, first.out.t(), first.lse.t(), second.out.t(), second.lse.t());
    EXPECT_LT(testing::max_rel_error(first.out, whole.out), tol) << "attention_merge " << describe(c);
    EXPECT_LT(lse_error(first.lse, whole.lse.template cast<double>()), tol) << "attention_merge " << describe(c);
  }

  Grads<T> g{HostTensor<T>(q.shape()), HostTensor<T>(k.shape()), HostTensor<T>(k.shape())};
  HostTensor<T> dk1(k1.shape()), dv1(k1.shape()), dk2(k2.shape()), dv2(k2.shape());
  attention_backward(kCpu, g.dq.t(), dk1.t(), dv1.t(), dout.t(), q.t(), k1.t(), v1.t(), merged.out.t(), merged.lse.t(),
                     c1.q_offset, c1.k_offset);
  attention_backward(kCpu, g.dq.t(), dk2.t(), dv2.t(), dout.t(), q.t(), k2.t(), v2.t(), merged.out.t(), merged.lse.t(),
                     c2.q_offset, c2.k_offset);
  seq_unslice(g.dk, dk1, 0);
  seq_unslice(g.dk, dk2, split);
  seq_unslice(g.dv, dv1, 0);
  seq_unslice(g.dv, dv2, split);
  EXPECT_LT(testing::max_rel_error(g.dq, g_whole.dq), tol) << "dq " << describe(c);
  EXPECT_LT(testing::max_rel_error(g.dk, g_whole.dk), tol) << "dk " << describe(c);
  EXPECT_LT(testing::max_rel_error(g.dv, g_whole.dv), tol) << "dv " << describe(c);
}

}  // namespace

TEST(Attention, RingMergeEqualsSingleCall) {
  // Diagonal chunk (rows 0..4 see only the first block), a later chunk over earlier keys, and a
  // chunk with rows that see no key at all; the last crosses the flash path's tile sizes.
  const std::vector<std::pair<Case, int64_t>> splits = {
      {{2, 12, 12, 4, 2, 5, 0, 0}, 5},
      {{1, 8, 16, 4, 1, 6, 8, 0}, 8},
      {{1, 16, 16, 2, 2, 4, 0, 4}, 6},
      {{1, 70, 150, 4, 2, 9, 80, 0}, 67},
  };
  for (const auto& [c, split] : splits) {
    expect_ring_property<double>(c, split, 1e-12);  // rounding of the merge in double
    expect_ring_property<float>(c, split, kFloatTol);
  }
}

namespace {

// Document-masked cases: documents of a few lengths (some longer than a tile, some of one token),
// a document running in from before the queries' chunk, chunks at offsets (context parallel), GQA.
struct DocCase {
  Case c;
  std::vector<int64_t> lengths;
  int64_t first;
};
const std::vector<DocCase> kDocCases = {
    {{2, 12, 12, 2, 1, 4, 0, 0}, {5, 1, 4}, 0},
    {{1, 9, 9, 4, 2, 5, 0, 0}, {3}, 0},
    {{2, 20, 30, 4, 2, 6, 10, 0}, {7, 2, 9}, 3},
    {{1, 16, 16, 2, 2, 3, 0, 8}, {4, 6}, 0},
    {{2, 150, 150, 4, 2, 8, 0, 0}, {70, 1, 40, 33}, 0},
    {{1, 70, 200, 2, 1, 9, 130, 0}, {100, 3, 65}, 90},
};

std::string describe(const DocCase& d) {
  std::ostringstream os;
  os << describe(d.c) << " docs";
  for (int64_t n : d.lengths) os << " " << n;
  os << " first " << d.first;
  return os.str();
}

}  // namespace

TEST(Attention, DocumentMaskMatchesNaive) {
  for (const DocCase& dc : kDocCases) {
    const Case& c = dc.c;
    const std::vector<int32_t> docs = make_docs(c, dc.lengths, dc.first);
    Inputs in(c, 80);
    auto naive = naive_attention(c, in, docs);
    auto ref = run_forward(c, in.q, in.k, in.v, docs);
    EXPECT_LT(testing::max_rel_error(ref.out, naive.out), 1e-13) << describe(dc);
    EXPECT_LT(lse_error(ref.lse, naive.lse), 1e-13) << describe(dc);
    auto qf = in.q.cast<float>(), kf = in.k.cast<float>(), vf = in.v.cast<float>();
    auto flt = run_forward(c, qf, kf, vf, docs);
    EXPECT_LT(testing::max_rel_error(flt.out, naive.out), kFloatTol) << describe(dc);
    EXPECT_LT(lse_error(flt.lse, naive.lse), kFloatTol) << describe(dc);

    auto dout = HostTensor<double>::uniform(in.q.shape(), 81);
    auto g = run_backward(c, dout, in.q, in.k, in.v, ref, docs);
    auto gf = run_backward(c, dout.cast<float>(), qf, kf, vf, flt, docs);
    EXPECT_LT(testing::max_rel_error(gf.dq, g.dq), kFloatTol) << "dq " << describe(dc);
    EXPECT_LT(testing::max_rel_error(gf.dk, g.dk), kFloatTol) << "dk " << describe(dc);
    EXPECT_LT(testing::max_rel_error(gf.dv, g.dv), kFloatTol) << "dv " << describe(dc);
  }
}

// A window of three documents equals the three run one by one (each a whole causal sequence of
// its own), forward and backward, in both paths.
template <typename T>
void expect_documents_run_alone(double tol) {
  const int64_t lengths[] = {37, 70, 21};
  const Case c{1, 128, 128, 4, 2, 8, 0, 0};
  std::vector<int32_t> docs;
  int64_t start = 0;
  for (int64_t n : lengths) {
    docs.insert(docs.end(), static_cast<size_t>(n), static_cast<int32_t>(start));
    start += n;
  }
  Inputs in(c, 90);
  auto q = in.q.template cast<T>(), k = in.k.template cast<T>(), v = in.v.template cast<T>();
  auto dout = HostTensor<double>::uniform(q.shape(), 91).template cast<T>();
  auto window = run_forward(c, q, k, v, docs);
  auto gw = run_backward(c, dout, q, k, v, window, docs);
  start = 0;
  for (int64_t n : lengths) {
    const Case one{1, n, n, c.H, c.KV, c.D, 0, 0};
    auto qd = seq_slice(q, start, start + n), kd = seq_slice(k, start, start + n), vd = seq_slice(v, start, start + n);
    auto fd = run_forward(one, qd, kd, vd);
    auto gd = run_backward(one, seq_slice(dout, start, start + n), qd, kd, vd, fd);
    const std::string what = "document at " + std::to_string(start) + " of length " + std::to_string(n);
    EXPECT_LT(testing::max_rel_error(seq_slice(window.out, start, start + n), fd.out), tol) << what;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(window.lse[h * c.T + start + i], fd.lse[h * n + i], tol) << what;
    EXPECT_LT(testing::max_rel_error(seq_slice(gw.dq, start, start + n), gd.dq), tol) << "dq " << what;
    EXPECT_LT(testing::max_rel_error(seq_slice(gw.dk, start, start + n), gd.dk), tol) << "dk " << what;
    EXPECT_LT(testing::max_rel_error(seq_slice(gw.dv, start, start + n), gd.dv), tol) << "dv " << what;
    start += n;
  }
}

TEST(Attention, DocumentMaskEqualsDocumentsRunAlone) {
  expect_documents_run_alone<double>(1e-12);
  expect_documents_run_alone<float>(kFloatTol);
}

TEST(Attention, DocumentMaskBackwardMatchesFiniteDifferences) {
  for (const DocCase& dc : {DocCase{{1, 9, 9, 4, 2, 3, 0, 0}, {4, 2, 3}, 0},
                            DocCase{{2, 7, 10, 2, 1, 3, 5, 0}, {3, 1}, 2}}) {
    const Case& c = dc.c;
    const std::vector<int32_t> docs = make_docs(c, dc.lengths, dc.first);
    Inputs in(c, 100);
    auto w = HostTensor<double>::uniform({c.B, c.T, c.H, c.D}, 101);
    auto loss = [&] { return testing::weighted_sum(run_forward(c, in.q, in.k, in.v, docs).out, w); };
    auto g = run_backward(c, w, in.q, in.k, in.v, run_forward(c, in.q, in.k, in.v, docs), docs);
    testing::expect_gradient_matches(loss, in.q, g.dq, "q", 1e-6, 1e-5, 1000);
    testing::expect_gradient_matches(loss, in.k, g.dk, "k", 1e-6, 1e-5, 1000);
    testing::expect_gradient_matches(loss, in.v, g.dv, "v", 1e-6, 1e-5, 1000);
  }
}

// The float path skips the key tiles wholly before a query tile's earliest document start instead
// of computing and discarding them: keys there that are NaN (a tile computed and masked would
// spread them, 0 x NaN = NaN) leave every output and gradient finite, equal to the attention over
// the document's own keys, and their dk, dv untouched (zero).
TEST(Attention, DocumentMaskSkipsMaskedKeyTiles) {
  const int64_t before = 192, n = 100;  // queries: one document at [192, 292); keys [0, 292)
  const Case c{1, n, before + n, 2, 1, 8, before, 0};
  const std::vector<int32_t> docs(static_cast<size_t>(n), static_cast<int32_t>(before));
  Inputs in(c, 110);
  auto q = in.q.cast<float>(), k = in.k.cast<float>(), v = in.v.cast<float>();
  for (int64_t i = 0; i < before * c.KV * c.D; ++i) k[i] = v[i] = std::numeric_limits<float>::quiet_NaN();
  auto dout = HostTensor<double>::uniform(q.shape(), 111).cast<float>();
  auto masked = run_forward(c, q, k, v, docs);
  auto g = run_backward(c, dout, q, k, v, masked, docs);
  const Case own{1, n, n, c.H, c.KV, c.D, 0, 0};
  auto ko = seq_slice(k, before, before + n), vo = seq_slice(v, before, before + n);
  auto alone = run_forward(own, q, ko, vo);
  auto ga = run_backward(own, dout, q, ko, vo, alone);
  EXPECT_LT(testing::max_rel_error(masked.out, alone.out), kFloatTol);
  EXPECT_LT(testing::max_rel_error(g.dq, ga.dq), kFloatTol);
  EXPECT_LT(testing::max_rel_error(seq_slice(g.dk, before, before + n), ga.dk), kFloatTol);
  EXPECT_LT(testing::max_rel_error(seq_slice(g.dv, before, before + n), ga.dv), kFloatTol);
  for (int64_t i = 0; i < before * c.KV * c.D; ++i) {
    ASSERT_EQ(g.dk[i], 0.0f) << i;
    ASSERT_EQ(g.dv[i], 0.0f) << i;
  }
}

TEST(Attention, RejectsBadDocumentStarts) {
  const Case c{1, 4, 4, 2, 1, 8, 0, 0};
  Inputs in(c, 120);
  auto q = in.q.cast<float>(), k = in.k.cast<float>();
  EXPECT_THROW(run_forward(c, q, k, k, std::vector<int32_t>{0, 0, 3, 2}), Error);  // row 2 starts after itself
  std::vector<int32_t> wrong(3, 0);
  HostTensor<float> out({1, 4, 2, 8}), lse({1, 2, 4});
  EXPECT_THROW(attention_forward(kCpu, out.t(), lse.t(), q.t(), k.t(), k.t(), 0, 0,
                                 Tensor(wrong.data(), DType::I32, {1, 3})),
               Error);
}

TEST(Attention, RejectsBadArguments) {
  HostTensor<float> q({1, 4, 3, 8}), k({1, 4, 2, 8}), out({1, 4, 3, 8}), lse({1, 3, 4});
  EXPECT_THROW(attention_forward(kCpu, out.t(), lse.t(), q.t(), k.t(), k.t(), 0, 0), Error);  // 3 % 2 != 0
  HostTensor<float> q2({1, 4, 2, 8}), out2({1, 4, 2, 8}), bad_lse({1, 4, 2});
  EXPECT_THROW(attention_forward(kCpu, out2.t(), bad_lse.t(), q2.t(), k.t(), k.t(), 0, 0), Error);
  HostTensor<double> kd({1, 4, 2, 8});
  HostTensor<float> lse2({1, 2, 4});
  EXPECT_THROW(attention_forward(kCpu, out2.t(), lse2.t(), q2.t(), kd.t(), kd.t(), 0, 0), Error);
}

// BF16 is the CUDA path's (tests/kernels/cuda/test_attention.cpp): on host tensors it is refused
// with a message saying so, not computed.
TEST(Attention, RefusesBf16OnTheCpu) {
  std::vector<uint16_t> q(4 * 2 * 64), out(q.size());
  std::vector<float> lse(2 * 4);
  const Tensor tq(q.data(), DType::BF16, {1, 4, 2, 64}), tout(out.data(), DType::BF16, {1, 4, 2, 64});
  const Tensor tlse(lse.data(), DType::F32, {1, 2, 4});
  try {
    attention_forward(kCpu, tout, tlse, tq, tq, tq, 0, 0);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward: bf16 attention runs on CUDA only"), std::string::npos)
        << e.what();
  }
}

}  // namespace tessera
