// CUDA attention (kernels/cuda/attention.cu) against the CPU kernel's F64 reference path on the
// same inputs: forward and backward, F32 and BF16, odd T, head dims 64 and 128, GQA, position
// offsets (a ring-attention block pair, rows that see no key). CTest label `gpu`: without a visible
// GPU every test ends in GTEST_SKIP (reported as skipped, never passed).
//
// Tolerances (normwise: max |gpu - cpu| / max |cpu| over the tensor, tests/testing.h):
// * F32 1e-5: the GPU sums in f32 (dot products of D <= 128 terms, softmax sums over <= 300 keys,
//   gradient sums over <= 600 query rows) with exact expf/logf, against an f64 reference; f32's
//   unit roundoff is 6e-8, and sums of n terms lose about sqrt(n) of it: about 1e-6 here.
// * BF16 1e-2: inputs are rounded to bf16 before both runs, so the difference is the GPU's own
//   rounding: P (and dS) rounded to bf16 (unit roundoff 2^-8 = 3.9e-3 per element, averaging out
//   in the sums that follow) before the second tile product, and the forward's out rounded to
//   bf16 once more when stored (the backward adds into f32 dq, dk, dv): the tile model
//   (scripts/attention_tile_model.py) shows 2e-3 to 3e-3 for out and about 1e-3 for the
//   gradients; 1e-2 leaves a margin without hiding an indexing error (those are O(1)). The
//   backward is fed the CPU forward's out (rounded to bf16) and lse on both sides.
// Outputs of the forward are poisoned with NaN before each call; every output buffer has a guard
// tail that must come back untouched (a write past the tensor fails the test).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/check.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::HostTensor;

bool gpu_visible() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define REQUIRE_GPU() \
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA device visible"

void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// ---- bf16 on the host: round to nearest even, and back ----
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Device memory for one tensor plus a guard tail of kGuard bytes filled with 0x5a, checked later.
class DeviceTensor {
 public:
  static constexpr size_t kGuard = 256;
  DeviceTensor(DType dt, Shape shape) : dt_(dt), shape_(shape), bytes_(size_t(shape.numel()) * dtype_size(dt)) {
    EXPECT_EQ(cudaMalloc(&p_, bytes_ + kGuard), cudaSuccess);
    EXPECT_EQ(cudaMemset(static_cast<char*>(p_) + bytes_, 0x5a, kGuard), cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(p_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  Tensor t() const { return Tensor(p_, dt_, shape_, Device::cuda(0)); }
  void poison() { EXPECT_EQ(cudaMemset(p_, 0xff, bytes_), cudaSuccess); }  // NaN in f32 and bf16

  // Host values (as double) in, device dtype out: F32 as float, BF16 rounded.
  void upload(const std::vector<double>& v) {
    EXPECT_EQ(v.size() * dtype_size(dt_), bytes_);
    std::vector<char> host(bytes_);
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt_ == DType::F32) {
        const float f = static_cast<float>(v[i]);
        std::memcpy(host.data() + 4 * i, &f, 4);
      } else {
        const uint16_t h = to_bf16(static_cast<float>(v[i]));
        std::memcpy(host.data() + 2 * i, &h, 2);
      }
    }
    EXPECT_EQ(cudaMemcpy(p_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<double> download() const {
    std::vector<char> host(bytes_ + kGuard);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, bytes_ + kGuard, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < kGuard; ++i)
      if (static_cast<unsigned char>(host[bytes_ + i]) != 0x5a) {
        ADD_FAILURE() << "write past the end of a " << shape_.str() << " tensor (guard byte " << i << ")";
        break;
      }
    const size_t n = bytes_ / dtype_size(dt_);
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) {
      if (dt_ == DType::F32) {
        float f;
        std::memcpy(&f, host.data() + 4 * i, 4);
        v[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, host.data() + 2 * i, 2);
        v[i] = from_bf16(h);
      }
    }
    return v;
  }

 private:
  void* p_ = nullptr;
  DType dt_;
  Shape shape_;
  size_t bytes_;
};

struct Case {
  int64_t B, T, S, H, KV, D, q_offset, k_offset;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B" << c.B << " T" << c.T << " S" << c.S << " H" << c.H << " KV" << c.KV << " D" << c.D << " q_off"
            << c.q_offset << " k_off" << c.k_offset;
}

// Random values exactly representable in dt (bf16: rounded), so both sides read the same numbers.
std::vector<double> random_values(Shape shape, uint64_t seed, DType dt, double lo = -1, double hi = 1) {
  std::vector<double> v = HostTensor<double>::uniform(shape, seed, lo, hi).vec();
  for (double& x : v) x = dt == DType::BF16 ? from_bf16(to_bf16(static_cast<float>(x))) : static_cast<float>(x);
  return v;
}

// Normwise error of got against want (max |got - want| / max |want|), after checking that both
// have the same non-finite entries (-inf lse of rows that see no key; NaN nowhere).
void expect_close(const char* what, const Case& c, const std::vector<double>& got, const std::vector<double>& want,
                  double tol) {
  ASSERT_EQ(got.size(), want.size());
  std::vector<double> g, w;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      ADD_FAILURE() << what << " [" << c << "]: NaN at " << i << " (gpu " << got[i] << ", cpu " << want[i] << ")";
      return;
    }
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " [" << c << "] at " << i;
      continue;
    }
    g.push_back(got[i]);
    w.push_back(want[i]);
  }
  const double err = testing::max_rel_error(g.data(), w.data(), static_cast<int64_t>(g.size()));
  EXPECT_LE(err, tol) << what << " [" << c << "]";
}

struct Inputs {
  std::vector<double> q, k, v;
};

Inputs make_inputs(const Case& c, DType dt, uint64_t seed) {
  // q scaled up so the softmax is far from uniform (scores of a few units).
  return {random_values({c.B, c.T, c.H, c.D}, seed, dt, -2, 2), random_values({c.B, c.S, c.KV, c.D}, seed + 1, dt, -2, 2),
          random_values({c.B, c.S, c.KV, c.D}, seed + 2, dt)};
}

// The CPU reference forward (F64) on the given values.
void cpu_forward(const Case& c, const Inputs& in, std::vector<double>& out, std::vector<double>& lse) {
  out.assign(size_t(c.B * c.T * c.H * c.D), 0);
  lse.assign(size_t(c.B * c.H * c.T), 0);
  std::vector<double> q = in.q, k = in.k, v = in.v;
  attention_forward(testing::kCpu, Tensor(out.data(), DType::F64, {c.B, c.T, c.H, c.D}),
                    Tensor(lse.data(), DType::F64, {c.B, c.H, c.T}), Tensor(q.data(), DType::F64, {c.B, c.T, c.H, c.D}),
                    Tensor(k.data(), DType::F64, {c.B, c.S, c.KV, c.D}),
                    Tensor(v.data(), DType::F64, {c.B, c.S, c.KV, c.D}), c.q_offset, c.k_offset);
}

void run_forward(const Case& c, DType dt, double tol) {
  SCOPED_TRACE(::testing::Message() << c << (dt == DType::BF16 ? " bf16" : " f32"));
  const Inputs in = make_inputs(c, dt, 1000 + c.T + c.D);
  std::vector<double> want_out, want_lse;
  cpu_forward(c, in, want_out, want_lse);

  const DType lse_dt = DType::F32;
  DeviceTensor q(dt, {c.B, c.T, c.H, c.D}), k(dt, {c.B, c.S, c.KV, c.D}), v(dt, {c.B, c.S, c.KV, c.D});
  DeviceTensor out(dt, {c.B, c.T, c.H, c.D}), lse(lse_dt, {c.B, c.H, c.T});
  q.upload(in.q);
  k.upload(in.k);
  v.upload(in.v);
  out.poison();
  lse.poison();
  const Exec ex = Exec::cuda(0);
  attention_forward(ex, out.t(), lse.t(), q.t(), k.t(), v.t(), c.q_offset, c.k_offset);
  synchronize(ex);
  check(cudaGetLastError());
  expect_close("out", c, out.download(), want_out, tol);
  // lse is f32 on both paths: its values are O(1..10) and need f32's precision (tol 1e-5 relative).
  expect_close("lse", c, lse.download(), want_lse, dt == DType::BF16 ? tol : 1e-5);
}

void run_backward(const Case& c, DType dt, double tol) {
  SCOPED_TRACE(::testing::Message() << c << (dt == DType::BF16 ? " bf16" : " f32"));
  const Inputs in = make_inputs(c, dt, 2000 + c.T + c.D);
  std::vector<double> out, lse;
  cpu_forward(c, in, out, lse);
  // The same out and lse on both sides: out in dt, lse in f32 (the GPU's dtype for it).
  for (double& x : out) x = dt == DType::BF16 ? from_bf16(to_bf16(static_cast<float>(x))) : static_cast<float>(x);
  for (double& x : lse) x = static_cast<float>(x);
  const std::vector<double> dout = random_values({c.B, c.T, c.H, c.D}, 77, dt);
  // dq, dk, dv are accumulated (+=): start from random values, the same on both sides. They are
  // F32 on both paths (the bf16 path's f32 accumulators).
  const DType gt = DType::F32;
  std::vector<double> dq = random_values({c.B, c.T, c.H, c.D}, 78, gt), dk = random_values({c.B, c.S, c.KV, c.D}, 79, gt),
                      dv = random_values({c.B, c.S, c.KV, c.D}, 80, gt);

  DeviceTensor gq(dt, {c.B, c.T, c.H, c.D}), gk(dt, {c.B, c.S, c.KV, c.D}), gv(dt, {c.B, c.S, c.KV, c.D});
  DeviceTensor gout(dt, {c.B, c.T, c.H, c.D}), glse(DType::F32, {c.B, c.H, c.T}), gdout(dt, {c.B, c.T, c.H, c.D});
  DeviceTensor gdq(gt, {c.B, c.T, c.H, c.D}), gdk(gt, {c.B, c.S, c.KV, c.D}), gdv(gt, {c.B, c.S, c.KV, c.D});
  gq.upload(in.q);
  gk.upload(in.k);
  gv.upload(in.v);
  gout.upload(out);
  glse.upload(lse);
  gdout.upload(dout);
  gdq.upload(dq);
  gdk.upload(dk);
  gdv.upload(dv);
  const Exec ex = Exec::cuda(0);
  attention_backward(ex, gdq.t(), gdk.t(), gdv.t(), gdout.t(), gq.t(), gk.t(), gv.t(), gout.t(), glse.t(), c.q_offset,
                     c.k_offset);
  synchronize(ex);
  check(cudaGetLastError());

  std::vector<double> q = in.q, k = in.k, v = in.v;
  attention_backward(testing::kCpu, Tensor(dq.data(), DType::F64, {c.B, c.T, c.H, c.D}),
                     Tensor(dk.data(), DType::F64, {c.B, c.S, c.KV, c.D}),
                     Tensor(dv.data(), DType::F64, {c.B, c.S, c.KV, c.D}),
                     Tensor(const_cast<double*>(dout.data()), DType::F64, {c.B, c.T, c.H, c.D}),
                     Tensor(q.data(), DType::F64, {c.B, c.T, c.H, c.D}), Tensor(k.data(), DType::F64, {c.B, c.S, c.KV, c.D}),
                     Tensor(v.data(), DType::F64, {c.B, c.S, c.KV, c.D}), Tensor(out.data(), DType::F64, {c.B, c.T, c.H, c.D}),
                     Tensor(lse.data(), DType::F64, {c.B, c.H, c.T}), c.q_offset, c.k_offset);
  expect_close("dq", c, gdq.download(), dq, tol);
  expect_close("dk", c, gdk.download(), dk, tol);
  expect_close("dv", c, gdv.download(), dv, tol);
}

// Shapes: odd T (not a multiple of the 64-row tiles, nor of the 32-row backward tiles), D 64 and
// 128, GQA groups 1, 2, 4, key blocks before / overlapping / after the queries (q_offset, k_offset).
const std::vector<Case> kCases = {
    {2, 77, 77, 4, 2, 64, 0, 0},      // odd T, GQA 2
    {1, 64, 64, 2, 2, 64, 0, 0},      // exactly one tile, no GQA
    {1, 130, 130, 4, 1, 128, 0, 0},   // D 128, GQA 4 (multi-query), T = 2 tiles + 2
    {2, 200, 200, 2, 1, 128, 0, 0},   // D 128, longer: several tiles of both kinds
    {1, 50, 70, 2, 1, 64, 100, 60},   // ring-attention block: keys 60..129 for queries 100..149
    {1, 40, 40, 2, 2, 128, 0, 20},    // keys after the first queries: 20 rows see no key (lse -inf)
    {1, 33, 95, 4, 2, 64, 150, 0},    // every key before every query (no mask): a past block
    // Sequence lengths around the 64-row tiles (the SIMT emulator's edge list, docs/cuda.md):
    {3, 1, 1, 2, 1, 64, 0, 0},        // T = 1: one row, one key, B x H = 6 blocks
    {2, 63, 63, 4, 4, 128, 0, 0},     // one short of a tile, D 128
    {1, 65, 65, 6, 2, 64, 0, 0},      // one past a tile, GQA 3
    {2, 129, 129, 2, 2, 128, 0, 0},   // two tiles and one row
    {1, 65, 129, 2, 1, 64, 64, 0},    // a cp chunk pair: queries 64..128 over keys 0..128
};

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;

TEST(CudaAttention, ForwardF32MatchesCpu) {
  REQUIRE_GPU();
  for (const Case& c : kCases) run_forward(c, DType::F32, kTolF32);
  run_forward({1, 19, 19, 3, 1, 24, 0, 0}, DType::F32, kTolF32);  // D not a multiple of 8 (f32 path only)
}

TEST(CudaAttention, ForwardBf16MatchesCpu) {
  REQUIRE_GPU();
  for (const Case& c : kCases) run_forward(c, DType::BF16, kTolBf16);
}

TEST(CudaAttention, BackwardF32MatchesCpu) {
  REQUIRE_GPU();
  for (const Case& c : kCases) run_backward(c, DType::F32, kTolF32);
  run_backward({1, 19, 19, 3, 1, 24, 0, 0}, DType::F32, kTolF32);
}

TEST(CudaAttention, BackwardBf16MatchesCpu) {
  REQUIRE_GPU();
  for (const Case& c : kCases) run_backward(c, DType::BF16, kTolBf16);
}

// ---- Ring-style accumulation: 8 bf16 backward calls adding into the same f32 dq, dk, dv ----
//
// What context parallelism does to the gradients (parallel/context_attention.cpp): one
// attention_backward per key block, each adding into the same dq (and the key block's dk, dv
// receive every query chunk's share). Here: 80 queries at positions 448..527 (H 4, KV 2), 8 key
// blocks of 64 at k_offset 0, 64, ..., 448 (block 7 on the diagonal, masked in part), the merged
// out and lse of all 512 keys (the CPU forward in f64, rounded to bf16 and f32 as the ring hands
// them over), and all 8 calls adding into one dq (1, 80, 4, D) and one dk, dv (1, 64, 2, D). The
// reference is the CPU's f64 backward of each call from zero (its contribution c_s), summed in
// double. The gradients start at bf16 values of magnitude [4 R, 8 R), R = max |sum_s c_s| per
// tensor: gradients that already hold earlier contributions (the later steps of a longer ring).
//
// Error: max |got - (start + sum_s c_s)| / Mtot, Mtot = sum_s max |c_s|. Bound 5e-3: each call's
// error is its own rounding (P and dS to bf16 before the second products, unit roundoff
// 2^-8 = 3.9e-3 per element and averaging out in the sums: the single-call bound), at most
// 2^-8 max |c_s|; added over the calls, <= 3.9e-3 Mtot. The f32 accumulators add one rounding per
// call of at most 2^-24 |acc| <= 2^-24 (8 R + Mtot), 8 in all: < 1e-5 Mtot (R <= Mtot). The tile
// model (scripts/attention_tile_model.py, its last part) gives 3.5e-4 to 6e-4 here.
// The old scheme (bf16 dq, dk, dv; each call rounding the running sum to bf16) fails this: each
// call's store rounds a value of magnitude >= 4 R to bf16, an error uniform within half an ulp,
// which is 2^-8 to 2^-9 of the value, so R / 128 to R / 32 per call; 8 such roundings compound to
// R / 20 .. R / 8 in the worst of the ~10^4 elements, against Mtot of 2.5 R to 4.5 R here: 1e-2 to
// 5e-2, and the tile model measures 3.3e-2 to 4.7e-2 (7 to 9 times the bound; from a zero start
// the increments are large against the running sum and it measures 2e-3: compounding needs a
// total that has grown, as in a long ring).
void run_ring_accumulation(int64_t D) {
  SCOPED_TRACE(::testing::Message() << "ring accumulation D " << D);
  constexpr int64_t kBlocks = 8, kBlock = 64, T = 80, H = 4, KV = 2, q_offset = 448;
  constexpr double kTol = 5e-3;
  const Case all{1, T, kBlocks * kBlock, H, KV, D, q_offset, 0};  // every key: the merged forward
  const Inputs in = make_inputs(all, DType::BF16, 3000 + uint64_t(D));
  std::vector<double> out, lse;
  cpu_forward(all, in, out, lse);
  for (double& x : out) x = from_bf16(to_bf16(static_cast<float>(x)));
  for (double& x : lse) x = static_cast<float>(x);
  std::vector<double> dout = random_values({1, T, H, D}, 81, DType::BF16);
  const Shape qs{1, T, H, D}, ks{1, kBlock, KV, D};
  const size_t block_numel = size_t(kBlock * KV * D);

  // The reference: each call's contribution from zero (f64), summed; Mtot per tensor.
  std::vector<double> tot[3] = {std::vector<double>(size_t(qs.numel())), std::vector<double>(block_numel),
                                std::vector<double>(block_numel)};
  double mtot[3] = {0, 0, 0};
  std::vector<double> q = in.q;
  for (int64_t s = 0; s < kBlocks; ++s) {
    std::vector<double> k(in.k.begin() + s * block_numel, in.k.begin() + (s + 1) * block_numel);
    std::vector<double> v(in.v.begin() + s * block_numel, in.v.begin() + (s + 1) * block_numel);
    std::vector<double> c[3] = {std::vector<double>(size_t(qs.numel())), std::vector<double>(block_numel),
                                std::vector<double>(block_numel)};
    attention_backward(testing::kCpu, Tensor(c[0].data(), DType::F64, qs), Tensor(c[1].data(), DType::F64, ks),
                       Tensor(c[2].data(), DType::F64, ks), Tensor(dout.data(), DType::F64, qs),
                       Tensor(q.data(), DType::F64, qs), Tensor(k.data(), DType::F64, ks),
                       Tensor(v.data(), DType::F64, ks), Tensor(out.data(), DType::F64, qs),
                       Tensor(lse.data(), DType::F64, {1, H, T}), q_offset, s * kBlock);
    for (int x = 0; x < 3; ++x) {
      double m = 0;
      for (size_t i = 0; i < c[x].size(); ++i) {
        tot[x][i] += c[x][i];
        m = std::max(m, std::abs(c[x][i]));
      }
      mtot[x] += m;
    }
  }
  // The start: bf16 values of magnitude [4 R, 8 R), random signs.
  std::vector<double> start[3];
  for (int x = 0; x < 3; ++x) {
    double R = 0;
    for (double t : tot[x]) R = std::max(R, std::abs(t));
    start[x] = random_values({int64_t(tot[x].size())}, 90 + uint64_t(x), DType::F32);
    for (double& y : start[x]) y = from_bf16(to_bf16(static_cast<float>((y < 0 ? -4 : 4) * R * (1 + std::abs(y)))));
  }

  DeviceTensor gq(DType::BF16, qs), gk(DType::BF16, {1, kBlocks * kBlock, KV, D}),
      gv(DType::BF16, {1, kBlocks * kBlock, KV, D});
  DeviceTensor gout(DType::BF16, qs), glse(DType::F32, {1, H, T}), gdout(DType::BF16, qs);
  DeviceTensor gdq(DType::F32, qs), gdk(DType::F32, ks), gdv(DType::F32, ks);
  gq.upload(in.q);
  gk.upload(in.k);
  gv.upload(in.v);
  gout.upload(out);
  glse.upload(lse);
  gdout.upload(dout);
  gdq.upload(start[0]);
  gdk.upload(start[1]);
  gdv.upload(start[2]);
  const Exec ex = Exec::cuda(0);
  const auto block = [&](const DeviceTensor& t, int64_t s) {  // rows [64 s, 64 s + 64) of (1, 512, KV, D)
    return t.t().view({kBlocks * kBlock, KV * D}).slice_rows(s * kBlock, (s + 1) * kBlock).view(ks);
  };
  for (int64_t s = 0; s < kBlocks; ++s)
    attention_backward(ex, gdq.t(), gdk.t(), gdv.t(), gdout.t(), gq.t(), block(gk, s), block(gv, s), gout.t(),
                       glse.t(), q_offset, s * kBlock);
  synchronize(ex);
  check(cudaGetLastError());

  const char* names[3] = {"dq", "dk", "dv"};
  const std::vector<double> got[3] = {gdq.download(), gdk.download(), gdv.download()};
  for (int x = 0; x < 3; ++x) {
    ASSERT_EQ(got[x].size(), tot[x].size());
    double err = 0;
    for (size_t i = 0; i < got[x].size(); ++i) {
      const double d = std::abs(got[x][i] - (start[x][i] + tot[x][i]));
      err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(err, d);
    }
    EXPECT_LE(err / mtot[x], kTol) << names[x] << " (D " << D << "): error " << err << ", Mtot " << mtot[x];
  }
}

TEST(CudaAttention, Bf16BackwardAccumulatesRingStepsInF32) {
  REQUIRE_GPU();
  run_ring_accumulation(64);
  run_ring_accumulation(128);
}

// The bf16 backward's gradients are f32 accumulators: bf16 ones are refused, naming them.
TEST(CudaAttention, Bf16BackwardNeedsF32Gradients) {
  REQUIRE_GPU();
  const Shape s{1, 8, 1, 64};
  DeviceTensor q(DType::BF16, s), k(DType::BF16, s), v(DType::BF16, s), out(DType::BF16, s), dout(DType::BF16, s);
  DeviceTensor lse(DType::F32, {1, 1, 8}), dq(DType::BF16, s), dk(DType::F32, s), dv(DType::F32, s);
  try {
    attention_backward(Exec::cuda(0), dq.t(), dk.t(), dv.t(), dout.t(), q.t(), k.t(), v.t(), out.t(), lse.t(), 0, 0);
    FAIL() << "expected an Error for a bf16 dq";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dq"), std::string::npos) << e.what();
  }
}

// The bf16 kernels' limits are errors naming the op and the value, not wrong results.
TEST(CudaAttention, Bf16RefusesOtherHeadDims) {
  REQUIRE_GPU();
  const Case c{1, 8, 8, 1, 1, 32, 0, 0};
  DeviceTensor q(DType::BF16, {1, 8, 1, 32}), k(DType::BF16, {1, 8, 1, 32}), v(DType::BF16, {1, 8, 1, 32});
  DeviceTensor out(DType::BF16, {1, 8, 1, 32}), lse(DType::F32, {1, 1, 8});
  try {
    attention_forward(Exec::cuda(0), out.t(), lse.t(), q.t(), k.t(), v.t(), 0, 0);
    FAIL() << "expected an Error for D = 32 [" << c << "]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dims 64 and 128, got 32"), std::string::npos) << e.what();
  }
}

TEST(CudaAttention, Bf16NeedsF32Lse) {
  REQUIRE_GPU();
  DeviceTensor q(DType::BF16, {1, 8, 1, 64}), k(DType::BF16, {1, 8, 1, 64}), v(DType::BF16, {1, 8, 1, 64});
  DeviceTensor out(DType::BF16, {1, 8, 1, 64}), lse(DType::BF16, {1, 1, 8});
  EXPECT_THROW(attention_forward(Exec::cuda(0), out.t(), lse.t(), q.t(), k.t(), v.t(), 0, 0), Error);
}

}  // namespace
}  // namespace tessera
