// CUDA causal grouped-query attention (kernels/attention.h), two paths chosen by dtype:
//
// * BF16 (q, k, v, out, dout bf16; lse f32; dq, dk, dv f32): FlashAttention-2's scheme written by
//   hand. The gradients are f32 accumulators: each call adds its f32 result to them, so repeated
//   calls (the ring's key blocks) round once per addition in f32, never in bf16.
//   Forward: a block of 4 warps owns 64 query rows of one (b, h); each warp 16 rows. Key tiles of
//   64 pass through shared memory; S = Q K^T and O += P V run on the tensor cores with
//   mma.sync.m16n8k16 (bf16 in, f32 accumulate), the online softmax in registers (base 2).
//   Backward: two kernels without atomics (deterministic, no f32 dq scratch): dk/dv per key tile
//   (looping over the group's query heads and the query tiles that see it), dq per query tile
//   (looping over key tiles), both recomputing P from the saved lse; delta = rowsum(dout * out)
//   first. The recomputation costs 7 tile products where FA2's atomic dq costs 5.
// * F32: simple kernels, one warp per query row (forward, dq) or key row (dk, dv), keys visited
//   one at a time with exact expf/logf: the path that checks against the CPU at 1e-5.
// * attention_merge (F32; ring attention's merge of two key blocks' results): one warp per row,
//   the CPU's formula in double.
// Offsets into the tensors are 64-bit throughout (Geo's q_at, kv_at, lse_at; the row strides are
// long long), so tensors of 2^31 elements and more are fine; the launch limits that remain are
// the grids' (kernels/cuda/attention_limits.h).
//
// Why mma.sync and not WMMA: the FA2 scheme needs to know which thread holds which accumulator
// element (row max and sum of the softmax, the causal mask, and reusing S's accumulator registers
// directly as P's A operand). mma.sync's fragment layout is specified by PTX; WMMA's is opaque, so
// a WMMA kernel would round-trip S through shared memory. wgmma (Hopper-only, async, warpgroup)
// would be faster on an H100/H200 but needs sm_90a and a descriptor-based shared-memory layout;
// mma.sync runs on sm_80 and sm_90 alike (CMAKE_CUDA_ARCHITECTURES 80;90).
//
// Fragment layouts of mma.m16n8k16 (lane = 4 g + t, g = lane / 4, t = lane % 4; each .b32 register
// holds two bf16, the lower column in the low half):
//   A (16 x 16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 x 8, "col": B[k][n]): b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
//   C (16 x 8, f32): c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
// So an A operand is read from a row-major tile X[row][k] and a B operand from a tile stored as
// Y[n][k] (B transposed, row-major): both as 32-bit words at (row g, word t). Tiles in shared memory
// have rows padded by 8 bf16 (16 bytes): a row is then 4 words (mod 32 banks) past the previous
// one, so the 8 rows x 4 words a warp reads hit 32 distinct banks, and rows stay 16-byte aligned
// for the vector stores that fill them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/check.h"
#include "kernels/cuda/attention_limits.h"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

using bf16 = __nv_bfloat16;

void check_cuda_call(const char* op, cudaError_t e) { TESSERA_CHECK(e == cudaSuccess, op, ": ", cudaGetErrorString(e)); }

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Sizes, positions and the scale, by value into every kernel.
struct Geo {
  int B, T, S, H, KV, D, group;
  long long q_offset, k_offset;
  float scale;       // 1 / sqrt(D)
  float scale_log2;  // scale * log2(e): scores in base 2 for exp2f

  // Element offsets of row (b, i, h) of q/out (B, T, H, D) and row (b, j, g) of k/v (B, S, KV, D).
  __host__ __device__ long long q_at(int b, int i, int h) const { return ((long long)(b * (long long)T + i) * H + h) * D; }
  __host__ __device__ long long kv_at(int b, int j, int g) const { return ((long long)(b * (long long)S + j) * KV + g) * D; }
  __host__ __device__ long long lse_at(int b, int h, int i) const { return ((long long)b * H + h) * T + i; }
  // Key j is visible to query i (both local indices).
  __host__ __device__ bool visible(int i, int j) const { return k_offset + j <= q_offset + i; }
};

Geo geometry(const Tensor& q, const Tensor& k, int64_t q_offset, int64_t k_offset) {
  Geo g{};
  g.B = static_cast<int>(q.dim(0));
  g.T = static_cast<int>(q.dim(1));
  g.H = static_cast<int>(q.dim(2));
  g.D = static_cast<int>(q.dim(3));
  g.S = static_cast<int>(k.dim(1));
  g.KV = static_cast<int>(k.dim(2));
  g.group = g.H / g.KV;
  g.q_offset = q_offset;
  g.k_offset = k_offset;
  g.scale = 1.0f / std::sqrt(static_cast<float>(g.D));
  g.scale_log2 = g.scale * kLog2e;
  return g;
}

// ================================ F32: one warp per row ================================

constexpr int kMaxDPerLane = 8;  // F32 path: D <= 256, lane l holds elements l, l + 32, ...
constexpr int kRowWarps = 4;     // rows (warps) per block of the F32 kernels

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Dot product of two D-vectors held lane-strided in registers, summed over the warp.
__device__ inline float warp_dot(const float (&a)[kMaxDPerLane], const float* b, int D, int lane) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < D) s += a[r] * b[d];
  }
  return warp_sum(s);
}

__device__ inline void load_row(float (&dst)[kMaxDPerLane], const float* src, int D, int lane) {
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) {
    const int d = lane + 32 * r;
    dst[r] = d < D ? src[d] : 0.f;
  }
}

// Number of keys query i sees: 0 .. n - 1 (a prefix, as on the CPU).
__device__ inline int visible_keys(const Geo& g, int i) {
  long long n = g.q_offset + i - g.k_offset + 1;
  return n < 0 ? 0 : (n > g.S ? g.S : static_cast<int>(n));
}

// out, lse: grid (ceil(T / 4), B H), one warp per query row, online softmax over the keys.
__global__ void fwd_f32_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Geo g) {
  const int lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowWarps + threadIdx.x / 32;
  const int b = blockIdx.y / g.H, h = blockIdx.y % g.H, kvh = h / g.group;
  if (i >= g.T) return;
  float qi[kMaxDPerLane], acc[kMaxDPerLane];
  load_row(qi, q + g.q_at(b, i, h), g.D, lane);
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) acc[r] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int n = visible_keys(g, i);
  for (int j = 0; j < n; ++j) {
    const float s = g.scale * warp_dot(qi, k + g.kv_at(b, j, kvh), g.D, lane);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // m = -inf at the first key: 0
    const float p = expf(s - m_new);
    l = l * corr + p;
    const float* vj = v + g.kv_at(b, j, kvh);
#pragma unroll
    for (int r = 0; r < kMaxDPerLane; ++r) {
      const int d = lane + 32 * r;
      acc[r] = acc[r] * corr + (d < g.D ? p * vj[d] : 0.f);
    }
    m = m_new;
  }
  float* oi = out + g.q_at(b, i, h);
  const float inv = n > 0 ? 1.f / l : 0.f;
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < g.D) oi[d] = acc[r] * inv;
  }
  if (lane == 0) lse[g.lse_at(b, h, i)] = n > 0 ? m + logf(l) : -INFINITY;
}

// delta (B, H, T) f32 = rowsum(dout * out), in f32 whatever the input dtype. One warp per row.
template <typename T>
__global__ void delta_kernel(float* delta, const T* dout, const T* out, Geo g) {
  const int lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowWarps + threadIdx.x / 32;
  const int b = blockIdx.y / g.H, h = blockIdx.y % g.H;
  if (i >= g.T) return;
  const long long row = g.q_at(b, i, h);
  float s = 0.f;
  for (int d = lane; d < g.D; d += 32) s += static_cast<float>(dout[row + d]) * static_cast<float>(out[row + d]);
  s = warp_sum(s);
  if (lane == 0) delta[g.lse_at(b, h, i)] = s;
}

// dq += scale sum_j ds_ij k_j over the visible keys. One warp per query row.
__global__ void dq_f32_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                              const float* lse, const float* delta, Geo g) {
  const int lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowWarps + threadIdx.x / 32;
  const int b = blockIdx.y / g.H, h = blockIdx.y % g.H, kvh = h / g.group;
  if (i >= g.T) return;
  const float lse_i = lse[g.lse_at(b, h, i)];
  if (lse_i == -INFINITY) return;  // saw no key in any block: no gradient (as on the CPU)
  const float delta_i = delta[g.lse_at(b, h, i)];
  float qi[kMaxDPerLane], doi[kMaxDPerLane], acc[kMaxDPerLane];
  load_row(qi, q + g.q_at(b, i, h), g.D, lane);
  load_row(doi, dout + g.q_at(b, i, h), g.D, lane);
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) acc[r] = 0.f;
  const int n = visible_keys(g, i);
  for (int j = 0; j < n; ++j) {
    const float* kj = k + g.kv_at(b, j, kvh);
    const float p = expf(g.scale * warp_dot(qi, kj, g.D, lane) - lse_i);
    const float ds = p * (warp_dot(doi, v + g.kv_at(b, j, kvh), g.D, lane) - delta_i);
#pragma unroll
    for (int r = 0; r < kMaxDPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < g.D) acc[r] += g.scale * ds * kj[d];
    }
  }
  float* dqi = dq + g.q_at(b, i, h);
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < g.D) dqi[d] += acc[r];
  }
}

// dk, dv of key row j of kv head kvh: sums over the group's query heads and the queries that see j.
// Grid (ceil(S / 4), B KV), one warp per key row; each row is owned by one warp (no atomics).
__global__ void dkdv_f32_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                const float* v, const float* lse, const float* delta, Geo g) {
  const int lane = threadIdx.x % 32;
  const int j = blockIdx.x * kRowWarps + threadIdx.x / 32;
  const int b = blockIdx.y / g.KV, kvh = blockIdx.y % g.KV;
  if (j >= g.S) return;
  float kj[kMaxDPerLane], vj[kMaxDPerLane], dk_acc[kMaxDPerLane], dv_acc[kMaxDPerLane];
  load_row(kj, k + g.kv_at(b, j, kvh), g.D, lane);
  load_row(vj, v + g.kv_at(b, j, kvh), g.D, lane);
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) dk_acc[r] = dv_acc[r] = 0.f;
  // First query that sees key j: q_offset + i >= k_offset + j.
  const long long first = g.k_offset + j - g.q_offset;
  const int i0 = first < 0 ? 0 : (first > g.T ? g.T : static_cast<int>(first));
  for (int hh = 0; hh < g.group; ++hh) {
    const int h = kvh * g.group + hh;
    for (int i = i0; i < g.T; ++i) {
      const float lse_i = lse[g.lse_at(b, h, i)];
      if (lse_i == -INFINITY) continue;
      const float* qi = q + g.q_at(b, i, h);
      const float* doi = dout + g.q_at(b, i, h);
      const float p = expf(g.scale * warp_dot(kj, qi, g.D, lane) - lse_i);
      const float ds = p * (warp_dot(vj, doi, g.D, lane) - delta[g.lse_at(b, h, i)]);
#pragma unroll
      for (int r = 0; r < kMaxDPerLane; ++r) {
        const int d = lane + 32 * r;
        if (d < g.D) {
          dv_acc[r] += p * doi[d];
          dk_acc[r] += g.scale * ds * qi[d];
        }
      }
    }
  }
  float* dkj = dk + g.kv_at(b, j, kvh);
  float* dvj = dv + g.kv_at(b, j, kvh);
#pragma unroll
  for (int r = 0; r < kMaxDPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < g.D) {
      dkj[d] += dk_acc[r];
      dvj[d] += dv_acc[r];
    }
  }
}

// ======================== merge of two key blocks (ring attention) ========================

// out, lse (B, T, H, D), (B, H, T) f32 merged with block_out, block_lse: the CPU's formula and
// order (kernels/cpu/attention_merge.cpp), in double. One warp per (b, t, h) row, 4 per block, on
// grid dimension x; lane 0 reads the row's two lse values and hands them to the others (every
// lane has read them before lane 0 writes the merged one).
__global__ void merge_f32_kernel(float* out, float* lse, const float* block_out, const float* block_lse, int T, int H,
                                 int D, long long rows) {
  const long long row = (long long)blockIdx.x * kRowWarps + threadIdx.x / 32;  // ((b T) + t) H + h
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp: rows are per warp
  const int h = static_cast<int>(row % H);
  const long long bt = row / H;
  const long long l = (bt / T * H + h) * T + bt % T;  // (B, H, T)
  double a = 0, c = 0;
  if (lane == 0) {
    a = lse[l];
    c = block_lse[l];
  }
  a = __shfl_sync(0xffffffffu, a, 0);
  c = __shfl_sync(0xffffffffu, c, 0);
  if (c == -INFINITY) return;  // the block saw no key: nothing changes
  const double m = a < c ? c : a;  // std::max(a, c)
  const double merged = m + log(exp(a - m) + exp(c - m));
  const double wa = exp(a - merged), wc = exp(c - merged);  // wa = 0 when a = -inf
  float* o = out + row * D;
  const float* bo = block_out + row * D;
  for (int i = lane; i < D; i += 32) o[i] = static_cast<float>(wa * o[i] + wc * bo[i]);
  if (lane == 0) lse[l] = static_cast<float>(merged);
}

// ============================ BF16: tensor cores (mma.sync) ============================

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPad = 8;  // bf16 elements of padding per shared-memory row (16 bytes)

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two consecutive bf16 of a shared-memory tile (col even) as one 32-bit word.
__device__ inline uint32_t ld32(const bf16* tile, int stride, int row, int col) {
  return *reinterpret_cast<const uint32_t*>(tile + row * stride + col);
}

// c (16 x 8 f32) += a (16 x 16 bf16) b (16 x 8 bf16).
// Under the SIMT emulator (-DTESSERA_SIMT=ON) the instruction is emulated from the PTX ISA's
// fragment layouts (kernels/simt/mma.cpp); the CUDA build compiles the inline PTX as before.
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef TESSERA_SIMT
  ::tessera::simt::mma_sync_m16n8k16_bf16(c, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// A fragment of rows r0 .. r0 + 15, columns k0 .. k0 + 15 of a row-major tile.
__device__ inline void load_a(uint32_t (&a)[4], const bf16* tile, int stride, int r0, int k0, int g, int t) {
  a[0] = ld32(tile, stride, r0 + g, k0 + 2 * t);
  a[1] = ld32(tile, stride, r0 + g + 8, k0 + 2 * t);
  a[2] = ld32(tile, stride, r0 + g, k0 + 2 * t + 8);
  a[3] = ld32(tile, stride, r0 + g + 8, k0 + 2 * t + 8);
}

// C fragments of columns 16 kk .. 16 kk + 15 (n-tiles 2 kk and 2 kk + 1) as an A fragment in bf16:
// the accumulator of a product is the next product's left operand without leaving registers.
__device__ inline void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// rows [r0, r0 + R) of a (rows, ld)-strided bf16 matrix (a row: D contiguous elements) into a
// row-major shared tile [R][D + kPad]; rows at or past `rows` are zero (so masked products stay
// finite: 0 x garbage could be NaN). 16-byte vectors, consecutive threads along a row (coalesced).
template <int R, int D>
__device__ inline void load_rows(bf16* tile, const bf16* src, long long ld, int r0, int rows) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r0 + r < rows) val = *reinterpret_cast<const uint4*>(src + (r0 + r) * ld + c);
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + c) = val;
  }
}

// The same rows transposed: tile [D][R + kPad], tile[d][r] = src[r0 + r][d]. Consecutive threads
// take consecutive rows, so a warp's 16-bit stores fill consecutive addresses (no bank conflict).
template <int R, int D>
__device__ inline void load_rows_t(bf16* tile, const bf16* src, long long ld, int r0, int rows) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += kThreads) {
    const int r = idx % R, c = (idx / R) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r0 + r < rows) val = *reinterpret_cast<const uint4*>(src + (r0 + r) * ld + c);
    const bf16* e = reinterpret_cast<const bf16*>(&val);
#pragma unroll
    for (int x = 0; x < 8; ++x) tile[(c + x) * (R + kPad) + r] = e[x];
  }
}

// The number of keys any query of rows [i0, i1) sees (keys 0 .. n - 1), for the causal tile bound.
__device__ inline int keys_for_rows(const Geo& g, int i1) {
  long long n = g.q_offset + (long long)i1 - 1 - g.k_offset + 1;
  return n < 0 ? 0 : (n > g.S ? g.S : static_cast<int>(n));
}

template <int D>
struct FwdTiles {
  static constexpr int Br = 16 * kWarps, Bc = 64;
  static constexpr int kLd = D + kPad, kLdT = Bc + kPad;
  static constexpr size_t kSmem = sizeof(bf16) * (size_t(Br) * kLd + size_t(Bc) * kLd + size_t(D) * kLdT);
};

// out (B, T, H, D), lse (B, H, T) f32. Grid (B H, ceil(T / Br)); the longest query tiles (the last)
// are launched first. Shared: Q [Br][D + 8], K [Bc][D + 8], V^T [D][Bc + 8].
template <int D>
__global__ void __launch_bounds__(kThreads) fwd_bf16_kernel(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                            const bf16* v, Geo geo) {
  using F = FwdTiles<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + F::Br * F::kLd;
  bf16* Vt = Ks + F::Bc * F::kLd;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.x / geo.H, h = blockIdx.x % geo.H, kvh = h / geo.group;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * F::Br;
  const int i_end = min(i0 + F::Br, geo.T);
  const long long q_ld = (long long)geo.H * D, kv_ld = (long long)geo.KV * D;
  const bf16* q_bh = q + geo.q_at(b, 0, h);
  const bf16* k_bh = k + geo.kv_at(b, 0, kvh);
  const bf16* v_bh = v + geo.kv_at(b, 0, kvh);

  load_rows<F::Br, D>(Qs, q_bh, q_ld, i0, geo.T);
  __syncthreads();
  const int r0 = warp * 16;  // this warp's rows of the tile
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qf[kk], Qs, F::kLd, r0, kk * 16, g, t);

  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g + 8: max (base 2), partial sum
  const int row_i[2] = {i0 + r0 + g, i0 + r0 + g + 8};

  const int n_keys = keys_for_rows(geo, i_end);
  for (int j0 = 0; j0 < n_keys; j0 += F::Bc) {
    __syncthreads();  // every warp is done with the previous K and V^T tiles
    load_rows<F::Bc, D>(Ks, k_bh, kv_ld, j0, geo.S);
    load_rows_t<F::Bc, D>(Vt, v_bh, kv_ld, j0, geo.S);
    __syncthreads();

    float s[F::Bc / 8][4];
#pragma unroll
    for (int nt = 0; nt < F::Bc / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int nt = 0; nt < F::Bc / 8; ++nt)
        mma(s[nt], qf[kk], ld32(Ks, F::kLd, nt * 8 + g, kk * 16 + 2 * t), ld32(Ks, F::kLd, nt * 8 + g, kk * 16 + 2 * t + 8));

    // Mask (causal, and keys past S) and scale to base 2; the tile needs the mask only where its
    // last key may be past S or after the tile's first query.
    const bool full = j0 + F::Bc <= geo.S && geo.visible(i0, j0 + F::Bc - 1);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < F::Bc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = full || (j < geo.S && geo.visible(row_i[e / 2], j));
        s[nt][e] = ok ? s[nt][e] * geo.scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));  // the 4 threads of a row agree
      const float m_new = fmaxf(m[r], mx[r]);
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: exp2 of -inf = 0
      corr[r] = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < F::Bc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m_use[e / 2]);
        l[e / 2] += s[nt][e];
      }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= corr[0];
      o[dt][1] *= corr[0];
      o[dt][2] *= corr[1];
      o[dt][3] *= corr[1];
    }
    // O += P V: P from S's registers, V^T rows as the B operand.
#pragma unroll
    for (int kk = 0; kk < F::Bc / 16; ++kk) {
      uint32_t pa[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        mma(o[dt], pa, ld32(Vt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t), ld32(Vt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t + 8));
    }
  }

  // Finish: the row sums over the 4 threads, normalize, store out and lse.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_i[r];
    if (i >= geo.T) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    bf16* oi = out + geo.q_at(b, i, h);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(oi + dt * 8 + 2 * t) = pack_bf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (t == 0) lse[geo.lse_at(b, h, i)] = l[r] > 0.f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
  }
}

// Per-row data of a query tile the backward kernels keep in shared memory or registers: lse in
// base 2 (+inf for rows past T or rows that saw no key, so exp2(s - lse) = 0 there) and delta.
__device__ inline float lse2_of(const float* lse, const Geo& geo, int b, int h, int i) {
  if (i >= geo.T) return INFINITY;
  const float x = lse[geo.lse_at(b, h, i)];
  return x == -INFINITY ? INFINITY : x * kLog2e;
}

template <int D>
struct DqTiles {
  static constexpr int Br = 16 * kWarps, Bc = 64;
  static constexpr int kLd = D + kPad, kLdT = Bc + kPad;
  // Q, dO [Br][D + 8]; K, V [Bc][D + 8]; K^T [D][Bc + 8]
  static constexpr size_t kSmem = sizeof(bf16) * (2 * size_t(Br) * kLd + 2 * size_t(Bc) * kLd + size_t(D) * kLdT);
};

// dq (B, T, H, D) f32 += scale dS K over the visible keys. Grid (B H, ceil(T / Br)), longest first.
template <int D>
__global__ void __launch_bounds__(kThreads) dq_bf16_kernel(float* dq, const bf16* dout, const bf16* q, const bf16* k,
                                                           const bf16* v, const float* lse, const float* delta,
                                                           Geo geo) {
  using F = DqTiles<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dOs = Qs + F::Br * F::kLd;
  bf16* Ks = dOs + F::Br * F::kLd;
  bf16* Vs = Ks + F::Bc * F::kLd;
  bf16* Kt = Vs + F::Bc * F::kLd;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.x / geo.H, h = blockIdx.x % geo.H, kvh = h / geo.group;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * F::Br;
  const int i_end = min(i0 + F::Br, geo.T);
  const long long q_ld = (long long)geo.H * D, kv_ld = (long long)geo.KV * D;
  const bf16* k_bh = k + geo.kv_at(b, 0, kvh);
  const bf16* v_bh = v + geo.kv_at(b, 0, kvh);

  load_rows<F::Br, D>(Qs, q + geo.q_at(b, 0, h), q_ld, i0, geo.T);
  load_rows<F::Br, D>(dOs, dout + geo.q_at(b, 0, h), q_ld, i0, geo.T);
  const int r0 = warp * 16;
  const int row_i[2] = {i0 + r0 + g, i0 + r0 + g + 8};
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = lse2_of(lse, geo, b, h, row_i[r]);
    dlt[r] = row_i[r] < geo.T ? delta[geo.lse_at(b, h, row_i[r])] : 0.f;
  }

  float acc[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;

  const int n_keys = keys_for_rows(geo, i_end);
  for (int j0 = 0; j0 < n_keys; j0 += F::Bc) {
    __syncthreads();  // previous K, V, K^T tiles consumed (and, the first time, Q and dO stored)
    load_rows<F::Bc, D>(Ks, k_bh, kv_ld, j0, geo.S);
    load_rows<F::Bc, D>(Vs, v_bh, kv_ld, j0, geo.S);
    load_rows_t<F::Bc, D>(Kt, k_bh, kv_ld, j0, geo.S);
    __syncthreads();

    float s[F::Bc / 8][4], dp[F::Bc / 8][4];
#pragma unroll
    for (int nt = 0; nt < F::Bc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], da[4];
      load_a(qa, Qs, F::kLd, r0, kk * 16, g, t);
      load_a(da, dOs, F::kLd, r0, kk * 16, g, t);
#pragma unroll
      for (int nt = 0; nt < F::Bc / 8; ++nt) {
        // S = Q K^T and dP = dO V^T: K and V rows are B's columns.
        mma(s[nt], qa, ld32(Ks, F::kLd, nt * 8 + g, kk * 16 + 2 * t), ld32(Ks, F::kLd, nt * 8 + g, kk * 16 + 2 * t + 8));
        mma(dp[nt], da, ld32(Vs, F::kLd, nt * 8 + g, kk * 16 + 2 * t), ld32(Vs, F::kLd, nt * 8 + g, kk * 16 + 2 * t + 8));
      }
    }
    // dS = P (dP - delta), P = exp2(s scale_log2 - lse2) where visible, else 0. Kept in s.
#pragma unroll
    for (int nt = 0; nt < F::Bc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + nt * 8 + 2 * t + (e & 1);
        const int r = e / 2;
        const bool ok = j < geo.S && geo.visible(row_i[r], j);
        const float p = ok ? exp2f(s[nt][e] * geo.scale_log2 - lse2[r]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - dlt[r]);
      }
    // dQ += dS K: K^T rows (d) as B's columns.
#pragma unroll
    for (int kk = 0; kk < F::Bc / 16; ++kk) {
      uint32_t sa[4];
      c_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        mma(acc[dt], sa, ld32(Kt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t), ld32(Kt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t + 8));
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_i[r];
    if (i >= geo.T) continue;
    float* dqi = dq + geo.q_at(b, i, h);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      float2* p = reinterpret_cast<float2*>(dqi + dt * 8 + 2 * t);  // 8-byte aligned: even column
      float2 old = *p;
      old.x += geo.scale * acc[dt][2 * r];
      old.y += geo.scale * acc[dt][2 * r + 1];
      *p = old;
    }
  }
}

template <int D>
struct DkvTiles {
  static constexpr int Bc = 16 * kWarps;       // keys per block (16 per warp)
  static constexpr int Br = D >= 128 ? 32 : 64;  // queries per step: fewer at D = 128 (registers)
  static constexpr int kLd = D + kPad, kLdT = Br + kPad;
  // K, V [Bc][D + 8]; Q, dO [Br][D + 8]; Q^T, dO^T [D][Br + 8]; lse2, delta [Br] f32
  static constexpr size_t kSmem = sizeof(bf16) * (2 * size_t(Bc) * kLd + 2 * size_t(Br) * kLd + 2 * size_t(D) * kLdT) +
                                  2 * sizeof(float) * Br;
};

// dk, dv (B, S, KV, D) f32 += the key tile's gradients, summed over the group's query heads and every
// query tile that sees the key tile. Grid (B KV, ceil(S / Bc)); each block owns its dk/dv rows.
template <int D>
__global__ void __launch_bounds__(kThreads) dkdv_bf16_kernel(float* dk, float* dv, const bf16* dout, const bf16* q,
                                                             const bf16* k, const bf16* v, const float* lse,
                                                             const float* delta, Geo geo) {
  using F = DkvTiles<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + F::Bc * F::kLd;
  bf16* Qs = Vs + F::Bc * F::kLd;
  bf16* dOs = Qs + F::Br * F::kLd;
  bf16* Qt = dOs + F::Br * F::kLd;
  bf16* dOt = Qt + D * F::kLdT;
  float* lse_s = reinterpret_cast<float*>(dOt + D * F::kLdT);
  float* delta_s = lse_s + F::Br;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.x / geo.KV, kvh = blockIdx.x % geo.KV;
  const int j0 = blockIdx.y * F::Bc;
  const long long q_ld = (long long)geo.H * D, kv_ld = (long long)geo.KV * D;

  load_rows<F::Bc, D>(Ks, k + geo.kv_at(b, 0, kvh), kv_ld, j0, geo.S);
  load_rows<F::Bc, D>(Vs, v + geo.kv_at(b, 0, kvh), kv_ld, j0, geo.S);
  const int r0 = warp * 16;  // this warp's keys within the tile
  const int row_j[2] = {j0 + r0 + g, j0 + r0 + g + 8};

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[dt][e] = dv_acc[dt][e] = 0.f;

  // The first query that sees key j0 (later keys are seen by later queries only).
  const long long first = geo.k_offset + j0 - geo.q_offset;
  const int i_first = first < 0 ? 0 : (first > geo.T ? geo.T : static_cast<int>(first));
  const bool tile_full = j0 + F::Bc <= geo.S;
  for (int hh = 0; hh < geo.group; ++hh) {
    const int h = kvh * geo.group + hh;
    const bf16* q_bh = q + geo.q_at(b, 0, h);
    const bf16* do_bh = dout + geo.q_at(b, 0, h);
    for (int i0 = (i_first / F::Br) * F::Br; i0 < geo.T; i0 += F::Br) {
      __syncthreads();  // previous query tile consumed (and, the first time, K and V stored)
      load_rows<F::Br, D>(Qs, q_bh, q_ld, i0, geo.T);
      load_rows<F::Br, D>(dOs, do_bh, q_ld, i0, geo.T);
      load_rows_t<F::Br, D>(Qt, q_bh, q_ld, i0, geo.T);
      load_rows_t<F::Br, D>(dOt, do_bh, q_ld, i0, geo.T);
      for (int r = threadIdx.x; r < F::Br; r += kThreads) {
        const int i = i0 + r;
        lse_s[r] = lse2_of(lse, geo, b, h, i);
        delta_s[r] = i < geo.T ? delta[geo.lse_at(b, h, i)] : 0.f;
      }
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T (keys x queries).
      float s[F::Br / 8][4], dp[F::Br / 8][4];
#pragma unroll
      for (int nt = 0; nt < F::Br / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[4], va[4];
        load_a(ka, Ks, F::kLd, r0, kk * 16, g, t);
        load_a(va, Vs, F::kLd, r0, kk * 16, g, t);
#pragma unroll
        for (int nt = 0; nt < F::Br / 8; ++nt) {
          mma(s[nt], ka, ld32(Qs, F::kLd, nt * 8 + g, kk * 16 + 2 * t), ld32(Qs, F::kLd, nt * 8 + g, kk * 16 + 2 * t + 8));
          mma(dp[nt], va, ld32(dOs, F::kLd, nt * 8 + g, kk * 16 + 2 * t),
              ld32(dOs, F::kLd, nt * 8 + g, kk * 16 + 2 * t + 8));
        }
      }
      // P^T where visible (rows past T have lse2 = +inf: p = 0), dS^T = P^T (dP^T - delta).
      const bool full = tile_full && geo.visible(i0, j0 + F::Bc - 1);
#pragma unroll
      for (int nt = 0; nt < F::Br / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + 2 * t + (e & 1);  // query within the tile
          const int j = row_j[e / 2];
          const bool ok = full || (j < geo.S && geo.visible(i0 + c, j));
          const float p = ok ? exp2f(s[nt][e] * geo.scale_log2 - lse_s[c]) : 0.f;
          s[nt][e] = p;
          dp[nt][e] = p * (dp[nt][e] - delta_s[c]);
        }
      // dV += P^T dO and dK += dS^T Q: dO^T and Q^T rows (d) as B's columns.
#pragma unroll
      for (int kk = 0; kk < F::Br / 16; ++kk) {
        uint32_t pa[4], da[4];
        c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
        c_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          mma(dv_acc[dt], pa, ld32(dOt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t),
              ld32(dOt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t + 8));
          mma(dk_acc[dt], da, ld32(Qt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t),
              ld32(Qt, F::kLdT, dt * 8 + g, kk * 16 + 2 * t + 8));
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = row_j[r];
    if (j >= geo.S) continue;
    float* dkj = dk + geo.kv_at(b, j, kvh);
    float* dvj = dv + geo.kv_at(b, j, kvh);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      float2* pk = reinterpret_cast<float2*>(dkj + dt * 8 + 2 * t);  // 8-byte aligned: even column
      float2* pv = reinterpret_cast<float2*>(dvj + dt * 8 + 2 * t);
      float2 ok = *pk, ov = *pv;
      ok.x += geo.scale * dk_acc[dt][2 * r];
      ok.y += geo.scale * dk_acc[dt][2 * r + 1];
      ov.x += dv_acc[dt][2 * r];
      ov.y += dv_acc[dt][2 * r + 1];
      *pk = ok;
      *pv = ov;
    }
  }
}

// ==================================== launchers ====================================

void use_device(const char* op, const Exec& ex) { check_cuda_call(op, cudaSetDevice(ex.device.index)); }
void check_launch(const char* op) { check_cuda_call(op, cudaGetLastError()); }

unsigned ceil_div(long long n, long long d) { return static_cast<unsigned>((n + d - 1) / d); }

// The launch limits (kernels/cuda/attention_limits.h) of q (B, T, H, D), k (B, S, KV, D), on the
// tensors' 64-bit sizes, before geometry() narrows them to int.
void check_sizes(const char* op, const Tensor& q, const Tensor& k, bool backward) {
  const std::string e = attention_launch_error({q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)},
                                               q.dtype == DType::BF16, backward);
  TESSERA_CHECK(e.empty(), op, ": ", e);
}

// The bf16 kernels' requirements beyond the front's checks.
void check_bf16(const char* op, const Geo& g, std::initializer_list<const Tensor*> ts) {
  TESSERA_CHECK(g.D == 64 || g.D == 128, op, ": the CUDA bf16 kernel supports head dims 64 and 128, got ", g.D);
  for (const Tensor* x : ts)
    TESSERA_CHECK(reinterpret_cast<uintptr_t>(x->data) % 16 == 0, op,
                  ": bf16 tensors must be 16-byte aligned (vector loads), got ", x->data);
}

void check_f32(const char* op, const Geo& g) {
  TESSERA_CHECK(g.D <= 32 * kMaxDPerLane, op, ": the CUDA f32 kernel supports head dims up to ", 32 * kMaxDPerLane,
                ", got ", g.D);
}

template <typename T>
T* as(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// Dynamic shared memory above 48 KB must be allowed per kernel before the launch.
template <typename Kernel>
void allow_smem(const char* op, Kernel kernel, size_t bytes) {
  check_cuda_call(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int D>
void forward_bf16(const char* op, cudaStream_t st, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Geo& g) {
  using F = FwdTiles<D>;
  allow_smem(op, fwd_bf16_kernel<D>, F::kSmem);
  fwd_bf16_kernel<D><<<dim3(g.B * g.H, ceil_div(g.T, F::Br)), kThreads, F::kSmem, st>>>(
      as<bf16>(out), as<float>(lse), as<bf16>(q), as<bf16>(k), as<bf16>(v), g);
  check_launch(op);
}

template <int D>
void backward_bf16(const char* op, cudaStream_t st, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                   const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                   const float* delta, const Geo& g) {
  using Q = DqTiles<D>;
  using KV = DkvTiles<D>;
  allow_smem(op, dq_bf16_kernel<D>, Q::kSmem);
  allow_smem(op, dkdv_bf16_kernel<D>, KV::kSmem);
  dq_bf16_kernel<D><<<dim3(g.B * g.H, ceil_div(g.T, Q::Br)), kThreads, Q::kSmem, st>>>(
      as<float>(dq), as<bf16>(dout), as<bf16>(q), as<bf16>(k), as<bf16>(v), as<float>(lse), delta, g);
  check_launch(op);
  dkdv_bf16_kernel<D><<<dim3(g.B * g.KV, ceil_div(g.S, KV::Bc)), kThreads, KV::kSmem, st>>>(
      as<float>(dk), as<float>(dv), as<bf16>(dout), as<bf16>(q), as<bf16>(k), as<bf16>(v), as<float>(lse), delta, g);
  check_launch(op);
}

// Stream-ordered scratch for delta (B, H, T) f32, freed after the kernels queued before it.
class DeltaScratch {
 public:
  DeltaScratch(const char* op, cudaStream_t st, size_t bytes) : st_(st) {
    check_cuda_call(op, cudaMallocAsync(&p_, bytes, st));
  }
  ~DeltaScratch() { cudaFreeAsync(p_, st_); }
  DeltaScratch(const DeltaScratch&) = delete;
  DeltaScratch& operator=(const DeltaScratch&) = delete;
  float* get() const { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t st_;
};

}  // namespace

void attention_forward(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, int64_t q_offset, int64_t k_offset) {
  const char* op = "attention_forward";
  if (q.dim(0) * q.dim(1) * q.dim(2) == 0) return;
  check_sizes(op, q, k, false);
  const Geo g = geometry(q, k, q_offset, k_offset);
  use_device(op, ex);
  cudaStream_t st = ex.stream;
  if (q.dtype == DType::BF16) {
    check_bf16(op, g, {&out, &q, &k, &v});
    if (g.D == 64) return forward_bf16<64>(op, st, out, lse, q, k, v, g);
    return forward_bf16<128>(op, st, out, lse, q, k, v, g);
  }
  TESSERA_CHECK(q.dtype == DType::F32, op, ": the CUDA backend computes in f32 or bf16, got ", dtype_name(q.dtype),
                " (f64 is the CPU's reference path)");
  check_f32(op, g);
  fwd_f32_kernel<<<dim3(ceil_div(g.T, kRowWarps), g.B * g.H), 32 * kRowWarps, 0, st>>>(
      as<float>(out), as<float>(lse), as<float>(q), as<float>(k), as<float>(v), g);
  check_launch(op);
}

void attention_backward(const Exec& ex, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t q_offset, int64_t k_offset) {
  const char* op = "attention_backward";
  if (q.dim(0) * q.dim(1) * q.dim(2) == 0 || k.dim(1) == 0) return;
  check_sizes(op, q, k, true);
  const Geo g = geometry(q, k, q_offset, k_offset);
  use_device(op, ex);
  cudaStream_t st = ex.stream;
  const bool bf = q.dtype == DType::BF16;
  if (bf) {
    check_bf16(op, g, {&dq, &dk, &dv, &dout, &q, &k, &v});
  } else {
    TESSERA_CHECK(q.dtype == DType::F32, op, ": the CUDA backend computes in f32 or bf16, got ", dtype_name(q.dtype),
                  " (f64 is the CPU's reference path)");
    check_f32(op, g);
  }
  DeltaScratch delta(op, st, sizeof(float) * size_t(g.B) * g.H * g.T);
  const dim3 rows_grid(ceil_div(g.T, kRowWarps), g.B * g.H);
  if (bf) {
    delta_kernel<bf16><<<rows_grid, 32 * kRowWarps, 0, st>>>(delta.get(), as<bf16>(dout), as<bf16>(out), g);
    check_launch(op);
    if (g.D == 64) return backward_bf16<64>(op, st, dq, dk, dv, dout, q, k, v, lse, delta.get(), g);
    return backward_bf16<128>(op, st, dq, dk, dv, dout, q, k, v, lse, delta.get(), g);
  }
  delta_kernel<float><<<rows_grid, 32 * kRowWarps, 0, st>>>(delta.get(), as<float>(dout), as<float>(out), g);
  check_launch(op);
  dq_f32_kernel<<<rows_grid, 32 * kRowWarps, 0, st>>>(as<float>(dq), as<float>(dout), as<float>(q), as<float>(k),
                                                      as<float>(v), as<float>(lse), delta.get(), g);
  check_launch(op);
  dkdv_f32_kernel<<<dim3(ceil_div(g.S, kRowWarps), g.B * g.KV), 32 * kRowWarps, 0, st>>>(
      as<float>(dk), as<float>(dv), as<float>(dout), as<float>(q), as<float>(k), as<float>(v), as<float>(lse),
      delta.get(), g);
  check_launch(op);
}

void attention_merge(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse) {
  const char* op = "attention_merge";
  TESSERA_CHECK(out.dtype == DType::F32, op, ": the CUDA backend merges in f32, got ", dtype_name(out.dtype),
                " (f64 is the CPU's reference path)");
  const long long rows = out.dim(0) * out.dim(1) * out.dim(2);
  if (rows == 0) return;
  const std::string e = attention_merge_launch_error(out.dim(0), out.dim(1), out.dim(2), out.dim(3));
  TESSERA_CHECK(e.empty(), op, ": ", e);
  use_device(op, ex);
  merge_f32_kernel<<<ceil_div(rows, kRowWarps), 32 * kRowWarps, 0, ex.stream>>>(
      as<float>(out), as<float>(lse), as<float>(block_out), as<float>(block_lse), static_cast<int>(out.dim(1)),
      static_cast<int>(out.dim(2)), static_cast<int>(out.dim(3)), rows);
  check_launch(op);
}

}  // namespace tessera::cuda
