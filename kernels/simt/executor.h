// The SIMT emulator's executor: runs a kernel's grid on the CPU, one block after another, every
// CUDA thread of a block as a fiber of its own (its own stack and registers) on the calling OS
// thread, and gives the block barrier, the warp collectives (shuffles, __syncwarp, mma.sync) and
// shared memory their documented semantics. Built only with -DTESSERA_SIMT=ON (docs/cuda.md, "The
// SIMT emulator").
//
// Fibers are switched only at a barrier, a warp collective or a thread's exit, in thread order:
// deterministic and fast (a switch is a few instructions; a blocked fiber hands the OS thread
// straight to the next one that can run). The sanitizers follow the switches: AddressSanitizer
// through its fiber annotations; ThreadSanitizer sees every emulated thread as a fiber of its own
// with happens-before only where CUDA has it (the barrier, the collectives, the launch and the
// grid's end), so two threads that touch the same shared or global memory between two barriers,
// one writing, are a data race it reports: a missing __syncthreads shows.
// A barrier that some threads of the block never reach (they exited, or wait at a different
// barrier or collective) is an error naming the kernel, the block and the threads, not a hang; so
// is a warp collective whose mask names a lane that exited or does not exist.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "kernels/simt/types.h"

namespace tessera::simt {

constexpr int kWarpSize = 32;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned kMaxGridX = 2147483647u;
constexpr size_t kDefaultDynamicSmem = 48 * 1024;  // above it a kernel needs its attribute set
constexpr size_t kMaxSmemPerBlock = 232448;        // sm_90: 227 KB per block (opt-in)
constexpr size_t kMaxStaticSmem = 48 * 1024;       // static __shared__ per block

// A kernel's fault found by the emulator (divergent barrier, bad shuffle mask, a launch the GPU
// would refuse): the message names the kernel and, where there is one, the block and threads.
class KernelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a kernel launch asks for.
struct LaunchShape {
  dim3 grid, block;
  size_t dynamic_smem = 0;
  size_t max_dynamic_smem = kDefaultDynamicSmem;  // the kernel's attribute (cudaFuncSetAttribute)
};

// Why a launch of this shape would be refused by an sm_90 GPU ("" when it would not).
std::string launch_refusal(const LaunchShape& s);

// Runs `body` once for every thread of every block of the grid, on the calling OS thread, blocks
// in order x, then y, then z. Returns when the grid is done; throws KernelError naming `kernel`
// when a thread faults. Does not check the shape (launch_refusal does, before a launch is queued).
void run_grid(const char* kernel, const LaunchShape& s, const std::function<void()>& body);

// The kinds of warp collective (all lanes of the mask meet, then each gets its result).
enum class Collective : uint8_t { SyncWarp, Shuffle, Mma };

// One emulated CUDA thread's view of where it is, and its mailbox for collectives.
struct BlockState;
struct BlockView {
  dim3 block_idx, block_dim, grid_dim;
};
struct ThreadCtx {
  dim3 thread_idx;
  const BlockView* view = nullptr;
  int linear = 0;  // x + y X + z X Y: the thread's rank in the block, warp = linear / 32
  BlockState* block = nullptr;
  // A collective's arguments in (written by the lane before it waits) and its result out: the
  // executor's own (warp_shuffle, warp_mma fill and read them).
  Collective kind = Collective::SyncWarp;
  unsigned mask = 0;
  int src_lane = 0;   // Shuffle: the lane this one reads (already resolved by the caller)
  uint64_t in_bits = 0, out_bits = 0;  // Shuffle: the value, as bits
  uint32_t mma_a[4] = {}, mma_b[2] = {};
  float mma_c[4] = {}, mma_d[4] = {};
};

// The emulated thread running on this OS thread (valid only inside a kernel body): set by the
// executor whenever it switches threads, read by every threadIdx and blockIdx (inline: hot).
// Under the sanitizers they are out of line: GCC 12's -O2 code for the inline thread_local read
// inside a fiber was reported by UBSan as a null load in the ASan/UBSan build (not seen in the
// plain build, nor at -O1); the out-of-line read is what the sanitizer stages run.
extern thread_local ThreadCtx* tls_thread;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(TESSERA_SIMT_TSAN_FIBERS)
ThreadCtx& current_thread();
const BlockView& current_block();
#else
inline ThreadCtx& current_thread() { return *tls_thread; }
inline const BlockView& current_block() { return *tls_thread->view; }
#endif

// The block barrier (__syncthreads).
void barrier();
// The warp collectives: each returns when every lane of the mask has arrived. __syncwarp; a
// shuffle (this lane offers `bits`, gets lane src_lane's: a lane index 0..31 of its warp); the
// mma.sync m16n8k16 bf16 of the whole warp (c += a b, this lane's fragments, kernels/simt/mma.cpp).
void warp_sync(unsigned mask);
uint64_t warp_shuffle(unsigned mask, int src_lane, uint64_t bits);
void warp_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// Shared memory of the current block: a static __shared__ array (one per `key`, the address of a
// static object at the declaration) of `bytes`, allocated at exactly that size at its first use in
// the block and filled with 0xff bytes (a float NaN: a read before any write shows); the dynamic
// shared memory of the launch (exactly its size, 16-byte aligned; nullptr when the launch has none).
void* static_shared(const void* key, size_t bytes, size_t align);
void* dynamic_shared();

// Names of the kernels launched in this process, for the coverage check ("kernels exercised: X of
// Y", scripts/simt_check.sh): written one per line to $TESSERA_SIMT_COVERAGE (appended) at exit.
void record_launch(const char* kernel);

// The mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 of one warp, all 32 lanes' fragments
// given: d[lane][i] from a[lane][4], b[lane][2], c[lane][4] (kernels/simt/mma.cpp).
void mma_m16n8k16_bf16(const uint32_t (*a)[4], const uint32_t (*b)[2], const float (*c)[4], float (*d)[4]);

}  // namespace tessera::simt
