// bf16 GEMM for the CPU (kernels/cpu/gemm_bf16.h). The AVX512_BF16 kernel follows the usual
// blocked scheme (Goto/BLIS): for each (KC x NC) block of op(B), packed once and shared by the
// threads, each thread packs (MC x KC) blocks of op(A) and runs the micro-kernel over MR x NR tiles.
// Packing converts to bf16 pairs: one 32-bit word holds two consecutive k of one row (A) or one
// column (B), the operand layout of vdpbf16ps, which adds a0*b0 + a1*b1 into each fp32 lane.
#include "kernels/cpu/gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#ifdef TESSERA_WITH_DNNL
#include <dnnl.hpp>
#endif

#include "kernels/check.h"
#include "kernels/cpu/blas.h"

namespace tessera::cpu {

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_epi32 results, PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// f32_to_bf16 over 16 floats at a time, in integer arithmetic so that every input (NaN, infinity,
// subnormal, ties) rounds to the same bits as the scalar function: vcvtneps2bf16 would be one
// instruction but treats subnormal inputs as zero.
__attribute__((target("avx512f,avx512bw"))) void round_avx512(uint16_t* dst, const float* src, int64_t n) {
  const __m512i round_bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(round_bias, lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i bits = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
#pragma GCC diagnostic pop

bool cpu_has_avx512bw() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

// dst[i] = f32_to_bf16(src[i]) on the calling thread.
void round_serial(uint16_t* dst, const float* src, int64_t n) {
  static const bool avx512 = cpu_has_avx512bw();
  if (avx512) return round_avx512(dst, src, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

}  // namespace

void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) {
  // Memory-bound: one thread converts a cache-sized block faster than the threads can be woken.
  constexpr int64_t kSerial = int64_t(1) << 17, kChunk = int64_t(1) << 14;
  if (n <= kSerial || omp_in_parallel()) return round_serial(dst, src, n);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
    const int64_t lo = c * kChunk;
    round_serial(dst + lo, src + lo, std::min(kChunk, n - lo));
  }
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

bool onednn_built() {
#ifdef TESSERA_WITH_DNNL
  return true;
#else
  return false;
#endif
}

Bf16Kernel resolve_bf16_kernel(Bf16Kernel k) {
  if (k == Bf16Kernel::Auto)
    return !cpu_has_avx512_bf16() ? Bf16Kernel::Portable : onednn_built() ? Bf16Kernel::OneDnn : Bf16Kernel::Avx512Bf16;
  TESSERA_CHECK(k == Bf16Kernel::Portable || cpu_has_avx512_bf16(), "the ", bf16_kernel_name(k),
                " GEMM kernel was asked for on a CPU without AVX512_BF16");
  TESSERA_CHECK(k != Bf16Kernel::OneDnn || onednn_built(),
                "the oneDNN bf16 GEMM was asked for, but this build has no oneDNN (libdnnl-dev, scripts/setup.sh)");
  return k;
}

const char* bf16_kernel_name(Bf16Kernel k) {
  switch (k) {
    case Bf16Kernel::Auto: return "auto";
    case Bf16Kernel::Avx512Bf16: return "AVX512_BF16 (tessera's vdpbf16ps kernel)";
    case Bf16Kernel::OneDnn: return "oneDNN matmul (AVX512_BF16)";
    case Bf16Kernel::Portable: return "portable (bf16-rounded fp32 BLAS)";
  }
  return "?";
}

namespace {

// 64-byte aligned scratch of 32-bit words.
struct Words {
  explicit Words(int64_t n) : p(static_cast<uint32_t*>(std::aligned_alloc(64, static_cast<size_t>((n * 4 + 63) / 64 * 64)))) {
    TESSERA_CHECK(p != nullptr, "gemm_bf16: out of memory for ", n * 4, " bytes of packing buffer");
  }
  ~Words() { std::free(p); }
  Words(const Words&) = delete;
  Words& operator=(const Words&) = delete;
  uint32_t* p;
};

inline uint16_t bits_of(float v) { return f32_to_bf16(v); }
inline uint16_t bits_of(uint16_t v) { return v; }
inline uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

constexpr int kMR = 12;      // rows of the register tile
constexpr int kNR = 32;      // columns: two zmm of 16 fp32
constexpr int64_t kKC = 384;  // k per block (even: a pair never straddles blocks)
constexpr int64_t kMC = 144;  // rows of A per packed block (a multiple of kMR)
constexpr int64_t kNC = 3072; // columns of B per packed block (a multiple of kNR)

// Packs op(A)[i0 : i0 + mc, p0 : p0 + kc] into panels of kMR rows: panel r holds, for each pair
// kp, kMR words (rows beyond mc and k beyond kc are zero).
template <typename S>
void pack_a(const GemmOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint32_t* out) {
  const S* s = static_cast<const S*>(a.data);
  const int64_t kp_n = (kc + 1) / 2, ld = a.ld;
  for (int64_t r = 0; r < mc; r += kMR) {
    uint32_t* panel = out + r * kp_n;
    const int64_t rows = std::min<int64_t>(kMR, mc - r);
    if (!a.trans) {  // a(i, p) = s[i ld + p]: a row's pairs are adjacent
      for (int64_t ii = 0; ii < rows; ++ii) {
        const S* row = s + (i0 + r + ii) * ld + p0;
        for (int64_t kp = 0; kp < kc / 2; ++kp) panel[kp * kMR + ii] = pair(bits_of(row[2 * kp]), bits_of(row[2 * kp + 1]));
        if (kc & 1) panel[(kp_n - 1) * kMR + ii] = pair(bits_of(row[kc - 1]), 0);
      }
    } else {  // a(i, p) = s[p ld + i]: a pair comes from two rows
      for (int64_t kp = 0; kp < kp_n; ++kp) {
        const S* r0 = s + (p0 + 2 * kp) * ld + i0 + r;
        const S* r1 = 2 * kp + 1 < kc ? r0 + ld : nullptr;
        for (int64_t ii = 0; ii < rows; ++ii) panel[kp * kMR + ii] = pair(bits_of(r0[ii]), r1 ? bits_of(r1[ii]) : 0);
      }
    }
    for (int64_t ii = rows; ii < kMR; ++ii)
      for (int64_t kp = 0; kp < kp_n; ++kp) panel[kp * kMR + ii] = 0;
  }
}

// Packs panels [q0, q1) of kNR columns of op(B)[p0 : p0 + kc, j0 : j0 + nc]: panel q holds, for
// each pair kp, kNR words (columns beyond nc and k beyond kc are zero).
template <typename S>
void pack_b(const GemmOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t q0, int64_t q1, uint32_t* out) {
  const S* s = static_cast<const S*>(b.data);
  const int64_t kp_n = (kc + 1) / 2, ld = b.ld;
  for (int64_t q = q0; q < q1; ++q) {
    uint32_t* panel = out + q * kNR * kp_n;
    const int64_t c0 = q * kNR, cols = std::min<int64_t>(kNR, nc - c0);
    if (!b.trans) {  // b(p, j) = s[p ld + j]: a pair comes from two rows
      for (int64_t kp = 0; kp < kp_n; ++kp) {
        const S* r0 = s + (p0 + 2 * kp) * ld + j0 + c0;
        uint32_t* dst = panel + kp * kNR;
        if (2 * kp + 1 < kc) {
          const S* r1 = r0 + ld;
          for (int64_t jj = 0; jj < cols; ++jj) dst[jj] = pair(bits_of(r0[jj]), bits_of(r1[jj]));
        } else {
          for (int64_t jj = 0; jj < cols; ++jj) dst[jj] = pair(bits_of(r0[jj]), 0);
        }
        for (int64_t jj = cols; jj < kNR; ++jj) dst[jj] = 0;
      }
    } else {  // b(p, j) = s[j ld + p]: a column's pairs are adjacent
      for (int64_t jj = 0; jj < cols; ++jj) {
        const S* col = s + (j0 + c0 + jj) * ld + p0;
        for (int64_t kp = 0; kp < kc / 2; ++kp) panel[kp * kNR + jj] = pair(bits_of(col[2 * kp]), bits_of(col[2 * kp + 1]));
        if (kc & 1) panel[(kp_n - 1) * kNR + jj] = pair(bits_of(col[kc - 1]), 0);
      }
      for (int64_t jj = cols; jj < kNR; ++jj)
        for (int64_t kp = 0; kp < kp_n; ++kp) panel[kp * kNR + jj] = 0;
    }
  }
}

void pack_a_any(const GemmOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint32_t* out) {
  if (a.dtype == DType::BF16)
    pack_a<uint16_t>(a, i0, mc, p0, kc, out);
  else
    pack_a<float>(a, i0, mc, p0, kc, out);
}
void pack_b_any(const GemmOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t q0, int64_t q1,
                uint32_t* out) {
  if (b.dtype == DType::BF16)
    pack_b<uint16_t>(b, p0, kc, j0, nc, q0, q1, out);
  else
    pack_b<float>(b, p0, kc, j0, nc, q0, q1, out);
}

// The register tile: C[0:mr, 0:nr] = alpha * sum_kp A(kp) B(kp) + beta * C (beta == 0: C not read).
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(int64_t kp_n, const uint32_t* ap, const uint32_t* bp,
                                                                 float* c, int64_t ldc, int mr, int nr, float alpha,
                                                                 float beta) {
  __m512 acc[kMR][2];
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(bp + kp * kNR);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(bp + kp * kNR + 16);
    const uint32_t* a = ap + kp * kMR;
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
  }
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xffff) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xffff) : nr > 16 ? __mmask16((1u << (nr - 16)) - 1) : __mmask16(0);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) {
    if (i >= mr) break;
    float* row = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
    if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), r0);
      r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), r1);
    }
    _mm512_mask_storeu_ps(row, m0, r0);
    _mm512_mask_storeu_ps(row + 16, m1, r1);
  }
}

void gemm_avx512_bf16(int64_t m, int64_t n, int64_t k, float alpha, const GemmOperand& a, const GemmOperand& b,
                      float beta, float* c, int64_t ldc) {
  const bool nested = omp_in_parallel();
  const int64_t nc_max = std::min<int64_t>(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t kc_max = std::min<int64_t>(kKC, k);
  Words bpack(nc_max * ((kc_max + 1) / 2));
  for (int64_t j0 = 0; j0 < n; j0 += kNC) {
    const int64_t nc = std::min<int64_t>(kNC, n - j0), panels = (nc + kNR - 1) / kNR;
    for (int64_t p0 = 0; p0 < k; p0 += kKC) {
      const int64_t kc = std::min<int64_t>(kKC, k - p0), kp_n = (kc + 1) / 2;
      const float beta_block = p0 == 0 ? beta : 1.0f;
      const int64_t m_blocks = (m + kMC - 1) / kMC;
#pragma omp parallel if (!nested)
      {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < panels; ++q) pack_b_any(b, p0, kc, j0, nc, q, q + 1, bpack.p);
        Words apack(kMC * kp_n);
#pragma omp for schedule(dynamic, 1)
        for (int64_t ib = 0; ib < m_blocks; ++ib) {
          const int64_t i0 = ib * kMC, mc = std::min<int64_t>(kMC, m - i0);
          pack_a_any(a, i0, mc, p0, kc, apack.p);
          for (int64_t q = 0; q < panels; ++q) {
            const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - q * kNR));
            for (int64_t r = 0; r < mc; r += kMR)
              micro_kernel(kp_n, apack.p + r * kp_n, bpack.p + q * kNR * kp_n, c + (i0 + r) * ldc + j0 + q * kNR, ldc,
                           static_cast<int>(std::min<int64_t>(kMR, mc - r)), nr, alpha, beta_block);
          }
        }
      }
    }
  }
}

// The operand op(X) (rows x cols as op'd) rounded to bf16 values held in fp32, in X's own layout.
std::vector<float> rounded_copy(const GemmOperand& x, int64_t rows, int64_t cols) {
  const int64_t srows = x.trans ? cols : rows, scols = x.trans ? rows : cols;
  std::vector<float> out(static_cast<size_t>(srows * scols));
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
  for (int64_t i = 0; i < srows; ++i)
    for (int64_t j = 0; j < scols; ++j) {
      const uint16_t h = x.dtype == DType::BF16 ? static_cast<const uint16_t*>(x.data)[i * x.ld + j]
                                                : f32_to_bf16(static_cast<const float*>(x.data)[i * x.ld + j]);
      out[static_cast<size_t>(i * scols + j)] = bf16_to_f32(h);
    }
  return out;
}

void gemm_portable(const char* op, int64_t m, int64_t n, int64_t k, float alpha, const GemmOperand& a,
                   const GemmOperand& b, float beta, float* c, int64_t ldc) {
  const std::vector<float> ar = rounded_copy(a, m, k), br = rounded_copy(b, k, n);
  sgemm(op, a.trans, b.trans, m, n, k, alpha, ar.data(), a.trans ? m : k, br.data(), b.trans ? k : n, beta, c, ldc);
}

#ifdef TESSERA_WITH_DNNL
// The operand as bf16 in its own layout: a BF16 operand as it is, an F32 one rounded into
// `scratch` (taken from `workspace`; row stride = its stored columns). Returns the data and its row
// stride.
std::pair<const uint16_t*, int64_t> bf16_operand(const GemmOperand& x, int64_t rows, int64_t cols,
                                                 Allocator* workspace, std::optional<Scratch>& scratch) {
  if (x.dtype == DType::BF16) return {static_cast<const uint16_t*>(x.data), x.ld};
  const int64_t srows = x.trans ? cols : rows, scols = x.trans ? rows : cols;
  uint16_t* dst = scratch.emplace(workspace, static_cast<size_t>(srows * scols) * sizeof(uint16_t)).as<uint16_t>();
  const float* src = static_cast<const float*>(x.data);
  if (x.ld == scols) {
    f32_to_bf16(dst, src, srows * scols);
  } else {
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
    for (int64_t i = 0; i < srows; ++i) f32_to_bf16(dst + i * scols, src + i * x.ld, scols);
  }
  return {dst, scols};
}

// oneDNN's matmul on bf16 operands with an f32 destination: alpha as the output scale, beta as a
// sum post-op. The primitive is looked up in oneDNN's own primitive cache after the first call of a
// shape.
void gemm_onednn(int64_t m, int64_t n, int64_t k, float alpha, const GemmOperand& a, const GemmOperand& b,
                 float beta, float* c, int64_t ldc, Allocator* workspace) {
  std::optional<Scratch> as, bs;
  const auto [ah, lda] = bf16_operand(a, m, k, workspace, as);
  const auto [bh, ldb] = bf16_operand(b, k, n, workspace, bs);
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc ad({m, k}, dt::bf16, a.trans ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc bd({k, n}, dt::bf16, b.trans ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc cd({m, n}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, eng));
  dnnl::memory am(ad, eng, const_cast<uint16_t*>(ah)), bm(bd, eng, const_cast<uint16_t*>(bh)), cm(cd, eng, c);
  mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  strm.wait();
}
#endif

}  // namespace

void gemm_bf16(const char* op, int64_t m, int64_t n, int64_t k, float alpha, const GemmOperand& a,
               const GemmOperand& b, float beta, float* c, int64_t ldc, Bf16Kernel kernel, Allocator* workspace) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  TESSERA_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX, op, ": GEMM dimension beyond 2^31");
  switch (resolve_bf16_kernel(kernel)) {
    case Bf16Kernel::Avx512Bf16: return gemm_avx512_bf16(m, n, k, alpha, a, b, beta, c, ldc);
#ifdef TESSERA_WITH_DNNL
    case Bf16Kernel::OneDnn: return gemm_onednn(m, n, k, alpha, a, b, beta, c, ldc, workspace);
#endif
    default: return gemm_portable(op, m, n, k, alpha, a, b, beta, c, ldc);
  }
}

}  // namespace tessera::cpu
