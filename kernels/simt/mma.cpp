// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on the CPU, from the fragment layouts the
// PTX ISA specifies (PTX ISA 8.x, "Warp Level Matrix Multiply-Accumulate Instructions", section
// "Matrix Fragments for mma.m16n8k16 with floating point type"): with groupID = lane / 4 and
// threadID_in_group = lane % 4, and each .b32 register holding two bf16 (the lower index in the
// low 16 bits),
//   A (16 x 16, .row): a_i (i = 0..7, two per register) at row groupID for i in {0,1,4,5}, else
//     groupID + 8; column 2 threadID_in_group + (i & 1), plus 8 for i >= 4.
//   B (16 x 8, .col): b_i (i = 0..3) at row (k) 2 threadID_in_group + (i & 1), plus 8 for i >= 2;
//     column (n) groupID.
//   C, D (16 x 8, .f32): c_i (i = 0..3) at row groupID for i < 2, else groupID + 8; column
//     2 threadID_in_group + (i & 1).
// D = A B + C in f32: the bf16 products are exact in f32 and are added to C in k order with f32
// rounding. The hardware's order and internal precision of that sum are not specified by PTX; a
// GPU's result can differ in the last bits, never in which elements meet.
#include <cstring>

#include "kernels/simt/executor.h"
#include "kernels/simt/host_bf16.h"

namespace tessera::simt {
namespace {

// Element i (0..7) of a lane's A registers, or of its B registers (0..3).
float half_of(const uint32_t* regs, int i) { return bf16_to_f32(static_cast<uint16_t>(regs[i / 2] >> (16 * (i & 1)))); }

}  // namespace

void mma_m16n8k16_bf16(const uint32_t (*a)[4], const uint32_t (*b)[2], const float (*c)[4], float (*d)[4]) {
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = half_of(a[lane], i);
    }
    for (int i = 0; i < 4; ++i) {
      const int k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      B[k][g] = half_of(b[lane], i);
    }
    for (int i = 0; i < 4; ++i) C[i < 2 ? g : g + 8][2 * t + (i & 1)] = c[lane][i];
  }
  float D[16][8];
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float acc = C[m][n];
      for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
      D[m][n] = acc;
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) d[lane][i] = D[i < 2 ? g : g + 8][2 * t + (i & 1)];
  }
}

}  // namespace tessera::simt
