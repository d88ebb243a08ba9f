// CPU causal GQA attention: a templated two-pass reference per query row (F64, the test oracle) and
// a flash-style F32 path (query tiles x key tiles, online softmax, O(T) memory) under OpenMP, its
// tile products through the CPU BLAS.
// Document masking (doc_start) narrows each query row's visible keys to [first(i), visible(i)), a
// range; both paths visit only the key tiles that overlap a query tile's union of those ranges.
// The F32 backward is parallel over (b, kv head): a thread owns that head's dk/dv and the dq rows of
// its query heads, so there are no races and the result does not depend on the thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd_math.h"

namespace tessera {
namespace {

// Sizes, causal geometry and row offsets shared by both paths.
struct Dims {
  int64_t B, T, S, H, KV, D;
  int64_t q_offset, k_offset;
  const int32_t* doc_start = nullptr;  // (B, T) the queries' document starts; null: no document mask

  int64_t group() const { return H / KV; }
  // Keys visible to query row i are 0 .. visible(i) - 1: a prefix, since visibility is k_pos <= q_pos.
  int64_t visible(int64_t i) const { return std::clamp<int64_t>(q_offset + i - k_offset + 1, 0, S); }
  // ... from first(b, i) on: the key row of the row's document start (0 without a document mask).
  int64_t first(int64_t b, int64_t i) const {
    return doc_start ? std::clamp<int64_t>(doc_start[b * T + i] - k_offset, 0, S) : 0;
  }
  int64_t q_row(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }    // (B, T, H, D)
  int64_t kv_row(int64_t b, int64_t s, int64_t g) const { return ((b * S + s) * KV + g) * D; }  // (B, S, KV, D)
  int64_t lse_at(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * T + t; }         // (B, H, T)
};

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// A row whose lse is -inf saw no key (in any block): it has no probabilities, so no gradient.
template <typename T>
bool saw_no_key(T lse) {
  return lse == kNegInf<T>;
}

namespace reference {

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

template <typename T>
void axpy(T* y, T alpha, const T* x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// Per query row: scores of the visible keys, max, exp, sum, then the weighted sum of values.
template <typename T>
void forward(T* out, T* lse, const T* q, const T* k, const T* v, const Dims& m) {
  const T scale = T(1) / std::sqrt(T(m.D));
  std::vector<T> p(static_cast<size_t>(m.S));  // (S) one row of scores, then probabilities
  for (int64_t b = 0; b < m.B; ++b)
    for (int64_t h = 0; h < m.H; ++h)
      for (int64_t i = 0; i < m.T; ++i) {
        const int64_t g = h / m.group(), j0 = m.first(b, i), n = m.visible(i);
        const T* qi = q + m.q_row(b, i, h);
        T* oi = out + m.q_row(b, i, h);
        std::fill(oi, oi + m.D, T(0));
        T mx = kNegInf<T>, l = 0;
        for (int64_t j = j0; j < n; ++j) {
          p[j] = scale * dot(qi, k + m.kv_row(b, j, g), m.D);
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = j0; j < n; ++j) {
          p[j] = std::exp(p[j] - mx);
          l += p[j];
        }
        for (int64_t j = j0; j < n; ++j) axpy(oi, p[j] / l, v + m.kv_row(b, j, g), m.D);
        lse[m.lse_at(b, h, i)] = j0 >= n ? kNegInf<T> : mx + std::log(l);
      }
}

// The backward formulas term by term (see attention.h), one (query, key) pair at a time.
template <typename T>
void backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse,
              const Dims& m) {
  const T scale = T(1) / std::sqrt(T(m.D));
  for (int64_t b = 0; b < m.B; ++b)
    for (int64_t h = 0; h < m.H; ++h)
      for (int64_t i = 0; i < m.T; ++i) {
        const int64_t g = h / m.group(), row = m.q_row(b, i, h);
        const T lse_i = lse[m.lse_at(b, h, i)];
        if (saw_no_key(lse_i)) continue;
        const T delta = dot(dout + row, out + row, m.D);
        for (int64_t j = m.first(b, i); j < m.visible(i); ++j) {
          const int64_t kv = m.kv_row(b, j, g);
          const T p = std::exp(scale * dot(q + row, k + kv, m.D) - lse_i);
          const T ds = p * (dot(dout + row, v + kv, m.D) - delta);
          axpy(dv + kv, p, dout + row, m.D);
          axpy(dq + row, scale * ds, k + kv, m.D);
          axpy(dk + kv, scale * ds, q + row, m.D);
        }
      }
}

}  // namespace reference

namespace flash {

constexpr int64_t kBr = 32;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile

// e^x that vectorizes (kernels/cpu/simd_math.h); 0 for -inf, as masked scores need.
using cpu::exp_polynomial;

// C (m, n) = op(A) op(B) + beta C (kernels/cpu/blas.h), the product every step of the tile loop is
// made of: strides read a head's rows of (B, T, H, D) in place, transposes cost no copies, and
// inside the OpenMP region the BLAS runs on the calling thread.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cpu::sgemm("attention", trans_a, trans_b, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t D) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// Problems below this many flops (about 0.1 ms on one core) run on the calling thread: waking the
// OpenMP team would cost more than it saves.
constexpr int64_t kParallelMinFlops = int64_t(1) << 22;
bool worth_threads(const Dims& m) { return 4 * m.B * m.H * m.T * m.S * m.D >= kParallelMinFlops; }

// Per-thread scratch, sized once per parallel region.
struct Scratch {
  std::vector<float> s, dp;  // (kBr, kBc) scores, then probabilities; dout . v (backward)
  std::vector<float> acc;    // (kBr, D) unnormalized output rows (forward)
  explicit Scratch(int64_t D)
      : s(static_cast<size_t>(kBr * kBc)), dp(s.size()), acc(static_cast<size_t>(kBr * D)) {}
};

// Query tile [i0, i1) of one (b, h), the kv head g it reads, and the key tile [j0, j0 + nc).
struct Tile {
  int64_t b, h, g, i0, i1;
  int64_t j0 = 0, nc = 0;
  int64_t rows() const { return i1 - i0; }
};

// Keys of the current key tile visible to tile row r: lo .. n - 1 (empty when lo >= n).
struct TileRange {
  int64_t lo, n;
};
TileRange visible_in_tile(const Dims& m, const Tile& t, int64_t r) {
  return {std::clamp<int64_t>(m.first(t.b, t.i0 + r) - t.j0, 0, t.nc),
          std::clamp<int64_t>(m.visible(t.i0 + r) - t.j0, 0, t.nc)};
}

// The key rows the tile's query rows see at all: [begin, end). Without a document mask begin is 0;
// with one, the key tiles wholly before the rows' earliest document start are never visited.
struct KeySpan {
  int64_t begin, end;
};
KeySpan tile_keys(const Dims& m, const Tile& t) {
  int64_t begin = m.S;
  for (int64_t i = t.i0; i < t.i1; ++i) begin = std::min(begin, m.first(t.b, i));
  return {begin, m.visible(t.i1 - 1)};
}

// s (rows, kBc) = the tile's rows of q (or dout) times the key (or value) rows [j0, j0 + nc) of
// kv head g, transposed: kv points at row j0.
void tile_scores(float* s, const float* q, const Dims& m, const Tile& t, const float* kv) {
  gemm(false, true, t.rows(), t.nc, m.D, q + m.q_row(t.b, t.i0, t.h), m.H * m.D, kv, m.KV * m.D, 0.0f, s, kBc);
}

// Online softmax step for one row: folds its visible scaled scores s[lo, n) into the running max
// mx, sum l and unnormalized output acc (D), leaving in s the weights exp(s - mx) (0 where masked)
// by which the caller adds the value rows.
void online_softmax_row(float& mx, float& l, float* acc, float* s, TileRange vis, int64_t nc, float scale, int64_t D) {
  const int64_t lo = vis.lo, n = std::max(vis.lo, vis.n);
  float tile_max = kNegInf<float>;
  for (int64_t j = lo; j < n; ++j) {
    s[j] *= scale;
    tile_max = std::max(tile_max, s[j]);
  }
  if (tile_max > mx) {
    const float alpha = exp_polynomial(mx - tile_max);  // 0 on the row's first tile (mx = -inf)
    l *= alpha;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
    mx = tile_max;
  }
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = lo; j < n; ++j) {
    s[j] = exp_polynomial(s[j] - mx);
    sum += s[j];
  }
  l += sum;
  std::fill(s, s + lo, 0.0f);
  std::fill(s + n, s + nc, 0.0f);
}

// One query tile: visits the key tiles from its rows' earliest document start (0 without a document
// mask) up to the causal limit of its last row.
void forward_tile(float* out, float* lse, const float* q, const float* k, const float* v, const Dims& m, Tile t,
                  Scratch& sc) {
  const int64_t D = m.D, stride = m.KV * D;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  float mx[kBr], l[kBr];
  std::fill(mx, mx + t.rows(), kNegInf<float>);
  std::fill(l, l + t.rows(), 0.0f);
  std::fill(sc.acc.begin(), sc.acc.begin() + t.rows() * D, 0.0f);
  const KeySpan keys = tile_keys(m, t);
  for (t.j0 = keys.begin; t.j0 < keys.end; t.j0 += kBc) {
    t.nc = std::min(kBc, keys.end - t.j0);
    const int64_t kv0 = m.kv_row(t.b, t.j0, t.g);
    tile_scores(sc.s.data(), q, m, t, k + kv0);
    for (int64_t r = 0; r < t.rows(); ++r)
      online_softmax_row(mx[r], l[r], sc.acc.data() + r * D, sc.s.data() + r * kBc, visible_in_tile(m, t, r), t.nc,
                         scale, D);
    gemm(false, false, t.rows(), D, t.nc, sc.s.data(), kBc, v + kv0, stride, 1.0f, sc.acc.data(), D);  // acc += P V
  }
  for (int64_t r = 0; r < t.rows(); ++r) {
    float* o = out + m.q_row(t.b, t.i0 + r, t.h);
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < D; ++d) o[d] = sc.acc[r * D + d] * inv;
    lse[m.lse_at(t.b, t.h, t.i0 + r)] = l[r] > 0 ? mx[r] + std::log(l[r]) : kNegInf<float>;
  }
}

void forward(float* out, float* lse, const float* q, const float* k, const float* v, const Dims& m) {
  const int64_t n_tiles = (m.T + kBr - 1) / kBr;
#pragma omp parallel if (worth_threads(m))
  {
    Scratch sc(m.D);
    // Later tiles see more keys: dynamic scheduling balances the causal triangle.
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < m.B; ++b)
      for (int64_t h = 0; h < m.H; ++h)
        for (int64_t it = 0; it < n_tiles; ++it) {
          const int64_t i0 = it * kBr;
          forward_tile(out, lse, q, k, v, m, Tile{b, h, h / m.group(), i0, std::min(m.T, i0 + kBr)}, sc);
        }
  }
}

// Inputs and gradients of the backward, passed together.
struct Grads {
  float *dq, *dk, *dv;
  const float *dout, *q, *k, *v;
};

// Turns scores s into P = exp(scale s - lse) and dp into scale dS = scale P (dp - delta) for each
// row of the tile, zero where masked or where the row saw no key at all.
void probabilities_and_score_grads(float* s, float* dp, const float* lse, const float* delta, const Dims& m,
                                   const Tile& t, float scale) {
  for (int64_t r = 0; r < t.rows(); ++r) {
    float* p = s + r * kBc;
    float* ds = dp + r * kBc;
    const TileRange vis = visible_in_tile(m, t, r);
    const int64_t lo = vis.lo, n = saw_no_key(lse[r]) ? lo : std::max(lo, vis.n);
    const float lse_r = lse[r], delta_r = delta[r];
#pragma omp simd
    for (int64_t j = lo; j < n; ++j) {
      p[j] = exp_polynomial(scale * p[j] - lse_r);
      ds[j] = scale * p[j] * (ds[j] - delta_r);
    }
    std::fill(p, p + lo, 0.0f);
    std::fill(ds, ds + lo, 0.0f);
    std::fill(p + n, p + t.nc, 0.0f);
    std::fill(ds + n, ds + t.nc, 0.0f);
  }
}

// One query tile of one head against all its visible key tiles: dq rows of the tile, and the
// dk/dv rows of the key tiles (owned by the calling thread).
void backward_tile(const Grads& g, const float* out, const float* lse_all, const Dims& m, Tile t, Scratch& sc) {
  const int64_t D = m.D, stride = m.KV * D, q_stride = m.H * D;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  float lse[kBr], delta[kBr];
  for (int64_t r = 0; r < t.rows(); ++r) {
    const int64_t row = m.q_row(t.b, t.i0 + r, t.h);
    lse[r] = lse_all[m.lse_at(t.b, t.h, t.i0 + r)];
    delta[r] = dot(g.dout + row, out + row, D);
  }
  const int64_t q0 = m.q_row(t.b, t.i0, t.h);
  const KeySpan keys = tile_keys(m, t);
  for (t.j0 = keys.begin; t.j0 < keys.end; t.j0 += kBc) {
    t.nc = std::min(kBc, keys.end - t.j0);
    const int64_t kv0 = m.kv_row(t.b, t.j0, t.g);
    float* p = sc.s.data();
    float* ds = sc.dp.data();
    tile_scores(p, g.q, m, t, g.k + kv0);
    tile_scores(ds, g.dout, m, t, g.v + kv0);  // dout . v
    probabilities_and_score_grads(p, ds, lse, delta, m, t, scale);
    gemm(false, false, t.rows(), D, t.nc, ds, kBc, g.k + kv0, stride, 1.0f, g.dq + q0, q_stride);     // dq += dS K
    gemm(true, false, t.nc, D, t.rows(), ds, kBc, g.q + q0, q_stride, 1.0f, g.dk + kv0, stride);      // dk += dS^T q
    gemm(true, false, t.nc, D, t.rows(), p, kBc, g.dout + q0, q_stride, 1.0f, g.dv + kv0, stride);    // dv += P^T dout
  }
}

void backward(const Grads& g, const float* out, const float* lse, const Dims& m) {
  const int64_t n_tiles = (m.T + kBr - 1) / kBr;
#pragma omp parallel if (worth_threads(m))
  {
    Scratch sc(m.D);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < m.B; ++b)
      for (int64_t kvh = 0; kvh < m.KV; ++kvh)
        for (int64_t h = kvh * m.group(); h < (kvh + 1) * m.group(); ++h)
          for (int64_t it = 0; it < n_tiles; ++it) {
            const int64_t i0 = it * kBr;
            backward_tile(g, out, lse, m, Tile{b, h, kvh, i0, std::min(m.T, i0 + kBr)}, sc);
          }
  }
}

}  // namespace flash

// The sizes of a call from its (checked) q (B, T, H, D) and k (B, S, KV, D), and the queries'
// document starts (checked here: each at or before its query's position).
Dims dims_of(const Tensor& q, const Tensor& k, int64_t q_offset, int64_t k_offset, const Tensor& doc_start) {
  Dims m{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), q_offset, k_offset};
  if (doc_start.defined()) {
    m.doc_start = doc_start.ptr<int32_t>();
    for (int64_t b = 0; b < m.B; ++b)
      for (int64_t i = 0; i < m.T; ++i) {
        const int64_t s = m.doc_start[b * m.T + i];
        TESSERA_CHECK(s >= 0 && s <= q_offset + i, "attention: doc_start[", b, ", ", i, "] = ", s,
                      " must lie in [0, ", q_offset + i, "], the query's position");
      }
  }
  return m;
}

}  // namespace

void cpu::attention_forward(const Exec&, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, int64_t q_offset, int64_t k_offset, const Tensor& doc_start) {
  const Dims m = dims_of(q, k, q_offset, k_offset, doc_start);
  if (q.dtype == DType::F64)
    reference::forward(out.ptr<double>(), lse.ptr<double>(), q.ptr<double>(), k.ptr<double>(), v.ptr<double>(), m);
  else
    flash::forward(out.ptr<float>(), lse.ptr<float>(), q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), m);
}

void cpu::attention_backward(const Exec&, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             int64_t q_offset, int64_t k_offset, const Tensor& doc_start) {
  const Dims m = dims_of(q, k, q_offset, k_offset, doc_start);
  if (q.dtype == DType::F64) {
    reference::backward(dq.ptr<double>(), dk.ptr<double>(), dv.ptr<double>(), dout.ptr<double>(), q.ptr<double>(),
                        k.ptr<double>(), v.ptr<double>(), out.ptr<double>(), lse.ptr<double>(), m);
  } else {
    flash::Grads g{dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), dout.ptr<float>(),
                   q.ptr<float>(),  k.ptr<float>(),  v.ptr<float>()};
    flash::backward(g, out.ptr<float>(), lse.ptr<float>(), m);
  }
}

}  // namespace tessera
