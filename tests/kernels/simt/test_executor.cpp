// The SIMT emulator itself (kernels/simt/executor.h, device.h, mma.cpp, cuda_bf16.h): the mma
// against a plain 16x8x16 product, shuffles and reductions against their definitions, the block
// barrier, the errors a GPU would hang or corrupt on (a barrier in divergent code, a shuffle mask
// naming a lane outside it or an exited one, a deadlock), the launch limits, and bf16 rounding.
// Kernels here are lambdas run by run_grid directly (no stream): the emulator's own behaviour.
#include <cuda_bf16.h>  // the stand-in: brings kernels/simt/device.h
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace tessera::simt {
namespace {

LaunchShape shape(dim3 grid, dim3 block, size_t smem = 0) { return LaunchShape{grid, block, smem, kDefaultDynamicSmem}; }

// The message of the KernelError that running body throws ("" when none).
std::string error_of(const char* kernel, const LaunchShape& s, const std::function<void()>& body) {
  try {
    run_grid(kernel, s, body);
  } catch (const KernelError& e) {
    return e.what();
  }
  return "";
}

uint16_t bits_of(__nv_bfloat16 h) { return h.__x; }

TEST(SimtExecutor, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const dim3 grid(3, 2, 2), block(5, 4, 3);
  std::vector<int> seen(3 * 2 * 2 * 5 * 4 * 3, 0);
  run_grid("indices", shape(grid, block), [&] {
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    ++seen[b * 60 + t];
  });
  for (int v : seen) EXPECT_EQ(v, 1);
}

TEST(SimtExecutor, BarrierOrdersSharedMemoryAcrossTheBlock) {
  std::vector<float> out(256);
  run_grid("reverse", shape(2, 128), [&] {
    static const char key = 0;
    float(&s)[128] = shared_array<float[128]>(&key);
    const int i = threadIdx.x;
    s[i] = float(blockIdx.x * 1000 + i);
    __syncthreads();
    out[blockIdx.x * 128 + i] = s[127 - i];
  });
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 128; ++i) EXPECT_EQ(out[b * 128 + i], float(b * 1000 + 127 - i));
}

TEST(SimtExecutor, SharedMemoryIsPerBlockAndStartsAsGarbage) {
  std::vector<uint32_t> first(3);
  run_grid("fresh", shape(3, 32), [&] {
    static const char key = 0;
    uint32_t(&s)[4] = shared_array<uint32_t[4]>(&key);
    if (threadIdx.x == 0) {
      first[blockIdx.x] = s[0];  // never written in this block: the fill, not the previous block's
      s[0] = 7;
    }
  });
  for (uint32_t v : first) EXPECT_EQ(v, 0xffffffffu);
}

TEST(SimtExecutor, ShufflesFollowTheirDefinitions) {
  std::vector<int> x(64), down(64), up(64), idx(64), w8(64);
  run_grid("shuffles", shape(1, 64), [&] {
    const int i = threadIdx.x, v = i * i + 3;
    x[i] = __shfl_xor_sync(0xffffffffu, v, 5);
    down[i] = __shfl_down_sync(0xffffffffu, v, 3);
    up[i] = __shfl_up_sync(0xffffffffu, v, 2);
    idx[i] = __shfl_sync(0xffffffffu, v, 7);
    w8[i] = __shfl_xor_sync(0xffffffffu, v, 9, 8);  // width 8: 9 leaves the section, reads itself
  });
  auto val = [](int i) { return i * i + 3; };
  for (int i = 0; i < 64; ++i) {
    const int lane = i % 32, base = i - lane;
    EXPECT_EQ(x[i], val(base + (lane ^ 5))) << i;
    EXPECT_EQ(down[i], val(lane + 3 < 32 ? i + 3 : i)) << i;
    EXPECT_EQ(up[i], val(lane >= 2 ? i - 2 : i)) << i;
    EXPECT_EQ(idx[i], val(base + 7)) << i;
    const int src = lane ^ 9;
    EXPECT_EQ(w8[i], val(src >= (lane & ~7) + 8 ? i : base + src)) << i;
  }
}

TEST(SimtExecutor, WarpAndBlockReductionsEqualTheSum) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> in(256);
  for (double& v : in) v = u(rng);
  std::vector<double> warp_sums(256), block_sum(256);
  run_grid("reduce", shape(1, 256), [&] {
    const int i = threadIdx.x;
    double v = in[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    warp_sums[i] = v;
    static const char key = 0;
    double(&s)[8] = shared_array<double[8]>(&key);
    if (i % 32 == 0) s[i / 32] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < 8; ++w) t += s[w];
    block_sum[i] = t;
  });
  double total = 0;
  for (int w = 0; w < 8; ++w) {
    double ws = 0;
    for (int l = 0; l < 32; ++l) ws += in[w * 32 + l];
    total += ws;
    for (int l = 0; l < 32; ++l) EXPECT_NEAR(warp_sums[w * 32 + l], ws, 1e-12);
  }
  for (double v : block_sum) EXPECT_NEAR(v, total, 1e-12);
}

// A plain 16x8x16 product, in double, of bf16 values given by matrices, against the emulated
// mma.sync fed the fragments the PTX ISA tables describe (built here from the tables directly:
// lane 4 g + t holds A rows g and g + 8, columns 2t, 2t + 1 and those + 8; B columns g, rows 2t,
// 2t + 1 and those + 8; C and D rows g and g + 8, columns 2t, 2t + 1).
TEST(SimtMma, MatchesAPlainMatrixProductOnRandomFragments) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int trial = 0; trial < 20; ++trial) {
    float A[16][16], B[16][8], C[16][8];
    for (auto& r : A)
      for (float& v : r) v = static_cast<float>(__nv_bfloat16(u(rng)));
    for (auto& r : B)
      for (float& v : r) v = static_cast<float>(__nv_bfloat16(u(rng)));
    for (auto& r : C)
      for (float& v : r) v = u(rng);
    float D[16][8];
    auto pack = [](float lo, float hi) {
      return uint32_t(bits_of(__nv_bfloat16(lo))) | uint32_t(bits_of(__nv_bfloat16(hi))) << 16;
    };
    run_grid("mma", shape(1, 32), [&] {
      const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
      const uint32_t a[4] = {pack(A[g][2 * t], A[g][2 * t + 1]), pack(A[g + 8][2 * t], A[g + 8][2 * t + 1]),
                             pack(A[g][2 * t + 8], A[g][2 * t + 9]), pack(A[g + 8][2 * t + 8], A[g + 8][2 * t + 9])};
      const uint32_t b0 = pack(B[2 * t][g], B[2 * t + 1][g]), b1 = pack(B[2 * t + 8][g], B[2 * t + 9][g]);
      float c[4] = {C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]};
      mma_sync_m16n8k16_bf16(c, a, b0, b1);
      D[g][2 * t] = c[0];
      D[g][2 * t + 1] = c[1];
      D[g + 8][2 * t] = c[2];
      D[g + 8][2 * t + 1] = c[3];
    });
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double ref = C[m][n], mag = std::fabs(C[m][n]);
        for (int k = 0; k < 16; ++k) {
          ref += double(A[m][k]) * B[k][n];
          mag += std::fabs(double(A[m][k]) * B[k][n]);
        }
        // 16 f32 additions: at most 16 half-ulps of the running magnitude.
        EXPECT_NEAR(D[m][n], ref, 16 * mag * 6e-8 + 1e-30) << "trial " << trial << " (" << m << ", " << n << ")";
      }
  }
}

TEST(SimtErrors, ABarrierInDivergentCodeIsReportedNotAHang) {
  const std::string e = error_of("early_exit_kernel", shape(dim3(2, 3), 64), [] {
    if (threadIdx.x >= 40) return;
    __syncthreads();
  });
  EXPECT_NE(e.find("early_exit_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("block (0, 0, 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("__syncthreads() reached by 40 of 64"), std::string::npos) << e;
  EXPECT_NE(e.find(" exited"), std::string::npos) << e;
}

TEST(SimtErrors, AShuffleMaskWithoutTheLanesItReadsIsReported) {
  const std::string e = error_of("short_mask_kernel", shape(1, 32), [] {
    (void)__shfl_xor_sync(0x0000ffffu, 1.0f, 16);  // lanes 0-15 read lanes 16-31
  });
  EXPECT_NE(e.find("short_mask_kernel"), std::string::npos) << e;
  EXPECT_TRUE(e.find("outside the mask") != std::string::npos || e.find("does not include its own lane") != std::string::npos)
      << e;
  const std::string own = error_of("own_lane_kernel", shape(1, 32), [] {
    if (threadIdx.x == 31) (void)__shfl_xor_sync(0x1u, 1, 1);
  });
  EXPECT_NE(own.find("does not include its own lane"), std::string::npos) << own;
}

TEST(SimtErrors, AShuffleNamingAnExitedOrMissingLaneIsReported) {
  const std::string exited = error_of("exited_lane_kernel", shape(1, 32), [] {
    if (threadIdx.x == 3) return;
    (void)__shfl_xor_sync(0xffffffffu, 2, 1);
  });
  EXPECT_NE(exited.find("lane 3"), std::string::npos) << exited;
  EXPECT_NE(exited.find("exited"), std::string::npos) << exited;
  const std::string missing = error_of("partial_warp_kernel", shape(1, 48), [] {
    (void)__shfl_xor_sync(0xffffffffu, 2, 1);  // the second warp has only 16 lanes
  });
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
}

TEST(SimtErrors, ADeadlockBetweenABarrierAndAShuffleIsReported) {
  const std::string e = error_of("deadlock_kernel", shape(1, 64), [] {
    if (threadIdx.x < 32) {
      __syncthreads();
    } else if (threadIdx.x != 40) {
      (void)__shfl_xor_sync(0xffffffffu, 1, 1);  // lane 8 of warp 1 waits at the barrier
    } else {
      __syncthreads();
    }
  });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("deadlock_kernel"), std::string::npos) << e;
}

TEST(SimtErrors, AnExceptionInOneThreadAbandonsTheBlockCleanly) {
  int after = 0;
  const std::string e = error_of("throwing_kernel", shape(1, 64), [&] {
    if (threadIdx.x == 5) throw KernelError("thread 5 failed");
    __syncthreads();
    ++after;
  });
  EXPECT_EQ(e, "thread 5 failed");
  EXPECT_EQ(after, 0);
  // The executor is usable again at once (stacks reset).
  int ran = 0;
  run_grid("after", shape(1, 64), [&] {
    __syncthreads();
    __atomic_fetch_add(&ran, 1, __ATOMIC_RELAXED);  // threads of a block are concurrent
  });
  EXPECT_EQ(ran, 64);
}

TEST(SimtLaunch, RefusesWhatAnSm90GpuRefuses) {
  EXPECT_EQ(launch_refusal(shape(1, 1024)), "");
  EXPECT_NE(launch_refusal(shape(1, 1025)).find("exceeds 1024"), std::string::npos);
  EXPECT_NE(launch_refusal(shape(1, dim3(32, 32, 2))).find("exceeds 1024"), std::string::npos);
  EXPECT_EQ(launch_refusal(shape(dim3(1u << 31 >> 1, 65535, 65535), 32)), "");
  EXPECT_NE(launch_refusal(shape(dim3(1, 65536), 32)).find("65535"), std::string::npos);
  EXPECT_NE(launch_refusal(shape(dim3(1, 1, 65536), 32)).find("65535"), std::string::npos);
  EXPECT_NE(launch_refusal(shape(0, 32)).find("empty grid"), std::string::npos);
  EXPECT_EQ(launch_refusal(shape(1, 128, 48 * 1024)), "");
  EXPECT_NE(launch_refusal(shape(1, 128, 48 * 1024 + 1)).find("cudaFuncSetAttribute"), std::string::npos);
  LaunchShape allowed = shape(1, 128, 100 * 1024);
  allowed.max_dynamic_smem = 100 * 1024;
  EXPECT_EQ(launch_refusal(allowed), "");
  allowed.dynamic_smem = allowed.max_dynamic_smem = 228 * 1024;
  EXPECT_NE(launch_refusal(allowed).find("227 KB"), std::string::npos);
}

TEST(SimtLaunch, DynamicSharedMemoryHasExactlyTheLaunchSizeAndAlignment) {
  uintptr_t addr = 0;
  run_grid("dyn", shape(1, 32, 1000), [&] {
    unsigned char* p = dynamic_shared_as<unsigned char>();
    if (threadIdx.x == 0) {
      p[999] = 1;  // the last byte is there
      addr = reinterpret_cast<uintptr_t>(p);
    }
  });
  EXPECT_EQ(addr % 16, 0u);
}

#if defined(__SANITIZE_ADDRESS__)
// One element past a shared array is caught (AddressSanitizer build only): shared memory is
// allocated at exactly its size per block. A static array's overflow is UBSan's bounds report
// first (the array keeps its type through the rewrite), AddressSanitizer's where the index is not
// checked; either stops the kernel.
TEST(SimtAsanDeathTest, OnePastASharedArrayIsCaught) {
  EXPECT_DEATH(run_grid("overflow_kernel", shape(1, 32),
                        [] {
                          static const char key = 0;
                          float(&s)[32] = shared_array<float[32]>(&key);
                          volatile int i = threadIdx.x + 1;  // thread 31 writes s[32]
                          s[i] = 1.f;
                        }),
               "heap-buffer-overflow|index 32 out of bounds for type 'float \\[32\\]'");
}
TEST(SimtAsanDeathTest, OnePastDynamicSharedMemoryIsCaught) {
  EXPECT_DEATH(run_grid("dyn_overflow_kernel", shape(1, 32, 128),
                        [] {
                          volatile int i = 128;
                          dynamic_shared_as<unsigned char>()[i] = 1;
                        }),
               "heap-buffer-overflow");
}
#endif

// A missing __syncthreads: every thread writes its slot, then (without a barrier) reads its
// neighbour's. Run only when asked (TESSERA_SIMT_RACE_DEMO=1): under ThreadSanitizer it must be
// reported as a data race (scripts/simt_check.sh checks that it is); elsewhere it is merely wrong.
TEST(SimtRaceDemo, MissingBarrier) {
  if (!std::getenv("TESSERA_SIMT_RACE_DEMO")) GTEST_SKIP() << "set TESSERA_SIMT_RACE_DEMO=1 to run the race on purpose";
  std::vector<float> out(64);
  run_grid("missing_barrier_kernel", shape(1, 64), [&] {
    static const char key = 0;
    float(&s)[64] = shared_array<float[64]>(&key);
    s[threadIdx.x] = float(threadIdx.x);
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];  // no __syncthreads() before this read
  });
}

// Two blocks of one grid write one word without an atomic (thread 0 of block 0, thread 1 of block
// 1): a GPU runs them concurrently, so ThreadSanitizer must report it though the emulator runs the
// blocks one after the other. Run only when asked, as above.
TEST(SimtRaceDemo, TwoBlocksWriteOneWord) {
  if (!std::getenv("TESSERA_SIMT_RACE_DEMO")) GTEST_SKIP() << "set TESSERA_SIMT_RACE_DEMO=1 to run the race on purpose";
  int word = 0;
  run_grid("blocks_race_kernel", shape(2, 2), [&] {
    if (threadIdx.x == blockIdx.x) word = int(blockIdx.x) + 1;
  });
}

TEST(SimtBf16, RoundsToNearestEvenAsFloat2Bfloat16Rn) {
  auto f = [](uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  EXPECT_EQ(bits_of(__float2bfloat16_rn(f(0x3f808000u))), 0x3f80);  // tie, even below: stays
  EXPECT_EQ(bits_of(__float2bfloat16_rn(f(0x3f818000u))), 0x3f82);  // tie, odd below: up
  EXPECT_EQ(bits_of(__float2bfloat16_rn(f(0x3f808001u))), 0x3f81);  // above the tie
  EXPECT_EQ(bits_of(__float2bfloat16_rn(f(0x7f7fffffu))), 0x7f80);  // the largest float: inf
  EXPECT_EQ(bits_of(__float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN())), 0x7fff);
  EXPECT_EQ(bits_of(__float2bfloat16_rn(f(0xffc01234u))), 0x7fff);  // any NaN: canonical
  EXPECT_EQ(bits_of(__float2bfloat16_rn(f(0x00008000u))), 0x0000);  // subnormal tie: even
  // Random floats: the result is the nearer of the two bf16 around x (ties to even mantissa).
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const float x = f(rng() & 0xff7fffffu);  // finite
    const uint16_t r = bits_of(__float2bfloat16_rn(x));
    uint32_t lo_bits;
    std::memcpy(&lo_bits, &x, 4);
    const uint16_t down = static_cast<uint16_t>(lo_bits >> 16), up = static_cast<uint16_t>(down + 1);
    const double dx = x, dd = f(uint32_t(down) << 16);
    // Above the largest finite bf16 the next step up is 2^128 (rounding there gives infinity).
    const double du = (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), dx) : f(uint32_t(up) << 16);
    const double ed = std::fabs(dx - dd), eu = std::fabs(du - dx);
    const uint16_t want = ed < eu ? down : eu < ed ? up : (down % 2 == 0 ? down : up);
    ASSERT_EQ(r, want) << std::hex << lo_bits;
  }
  const __nv_bfloat162 two = __floats2bfloat162_rn(1.5f, -2.25f);
  EXPECT_EQ(__low2float(two), 1.5f);
  EXPECT_EQ(__high2float(two), -2.25f);
  uint32_t word;
  std::memcpy(&word, &two, 4);
  EXPECT_EQ(word & 0xffffu, bits_of(__nv_bfloat16(1.5f)));  // .x in the low half
}

TEST(SimtAtomics, AtomicMinFindsTheSmallest) {
  unsigned long long first = ~0ull;
  run_grid("atomic_min", shape(4, 64), [&] {
    const unsigned long long i = blockIdx.x * 64 + threadIdx.x;
    if (i % 7 == 3) atomicMin(&first, i);
  });
  EXPECT_EQ(first, 3ull);
}

}  // namespace
}  // namespace tessera::simt
