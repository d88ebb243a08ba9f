// The CPU's bf16 GEMM (mixed precision): bf16 inputs, fp32 accumulation, fp32 output. Either
// operand may be stored in fp32 (rounded to bf16, nearest-even, as it is packed: activations and
// gradients) or in bf16 (the weights' bf16 copy). Three kernels; Auto picks by cpuid at run time:
//   OneDnn      oneDNN's matmul (Debian's libdnnl-dev, found at build time), the fp32 operands
//               rounded to bf16 first: the fastest at the model's shapes, so Auto's choice on a CPU
//               with AVX512_BF16 (docs/performance.md, "bf16 GEMM: which kernel");
//   Avx512Bf16  tessera's own: packed panels and a 12 x 32 register tile of vdpbf16ps, rounding
//               while packing; Auto's choice with AVX512_BF16 in a build without oneDNN;
//   Portable    rounds both operands to bf16 values held in fp32 and calls the fp32 BLAS: the same
//               products (a bf16 x bf16 product is exact in fp32), fp32 sums; any x86-64 CPU, slower
//               than fp32. Auto's choice without AVX512_BF16.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/allocator.h"
#include "kernels/tensor.h"

namespace tessera::cpu {

// One operand as stored: row-major, `ld` its row stride in elements; trans as in cpu::sgemm.
struct GemmOperand {
  const void* data = nullptr;
  DType dtype = DType::F32;  // F32 or BF16
  int64_t ld = 0;
  bool trans = false;
};

enum class Bf16Kernel { Auto, OneDnn, Avx512Bf16, Portable };

// Whether this CPU (and its operating system) runs AVX512_BF16 instructions.
bool cpu_has_avx512_bf16();
// Whether this build has oneDNN (TESSERA_WITH_DNNL).
bool onednn_built();
// Auto -> the best kernel here; OneDnn or Avx512Bf16 on a CPU without AVX512_BF16, or OneDnn in a
// build without oneDNN, is an Error.
Bf16Kernel resolve_bf16_kernel(Bf16Kernel k);
const char* bf16_kernel_name(Bf16Kernel k);

// C (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B) (k, n), ldc C's row stride; beta == 0
// does not read C. Inputs are rounded to bf16 (round to nearest even; NaN stays NaN), products
// summed in fp32. From inside an active OpenMP parallel region it runs on the calling thread.
// workspace: where the oneDNN path rounds its F32 operands (Exec::workspace; null: the heap).
void gemm_bf16(const char* op, int64_t m, int64_t n, int64_t k, float alpha, const GemmOperand& a,
               const GemmOperand& b, float beta, float* c, int64_t ldc, Bf16Kernel kernel = Bf16Kernel::Auto,
               Allocator* workspace = nullptr);

// Round to nearest even (NaN -> a quiet NaN; subnormals rounded, where vcvtneps2bf16 treats them
// as zero), without a branch, so that a loop calling it vectorizes (AdamW rounds its update into
// the bf16 copy so).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
float bf16_to_f32(uint16_t h);
// dst[i] = f32_to_bf16(src[i]): AVX-512 where the CPU has it; threaded (OpenMP) above 2^17
// elements, on the calling thread below that or inside a parallel region.
void f32_to_bf16(uint16_t* dst, const float* src, int64_t n);

}  // namespace tessera::cpu
