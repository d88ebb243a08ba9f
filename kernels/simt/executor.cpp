// The SIMT executor (kernels/simt/executor.h): blocks in order, the threads of a block as fibers,
// one rule set for when a barrier or warp collective completes and when a block is stuck. Under
// ThreadSanitizer the fibers are TSan fibers with CUDA's synchronisation annotated (below).
#include "kernels/simt/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TESSERA_SIMT_ASAN 1
#endif
// Under ThreadSanitizer this file itself is compiled without instrumentation (kernels/CMakeLists.txt:
// -fno-sanitize=thread, TESSERA_SIMT_TSAN_FIBERS): the executor's bookkeeping is not the kernels'
// memory, and it calls the runtime's fiber and happens-before interface explicitly.
#if defined(__SANITIZE_THREAD__) || defined(TESSERA_SIMT_TSAN_FIBERS)
#include <sanitizer/tsan_interface.h>
#define TESSERA_SIMT_TSAN 1
// ThreadSanitizer's dynamic annotations (libtsan exports them; no header declares them).
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace tessera::simt {

thread_local ThreadCtx* tls_thread = nullptr;

namespace {

enum class St : uint8_t { Ready, Barrier, Warp, Exited };

// Thrown inside a blocked thread when its block is abandoned (another thread faulted, or the block
// is stuck): unwinds the thread's stack to its entry, which swallows it.
struct Abandoned {};

// ThreadSanitizer sees every emulated thread as a fiber of its own, switched without implied
// synchronisation, so that it checks the kernel's accesses against CUDA's rules only:
// * happens-before exactly where CUDA gives it: a barrier among the block's threads, a warp
//   collective among its lanes (release on arrival, acquire on release), the launch before every
//   thread, every thread before whatever follows the grid;
// * the executor's own bookkeeping (states, mailboxes, the current-thread pointer), which fibers of
//   one OS thread share by construction, is not checked: this file is not instrumented. (It was
//   once, with every bookkeeping access inside an ignore annotation: each annotation stores its
//   stack in TSan's depot, and the frames of fibers that never return piled up in their shadow
//   stacks, so that a grid of 1024 blocks took longer than half an hour.) What the runtime's
//   interceptors still see, the allocation and freeing of a block's bookkeeping, runs inside
//   IgnoreAccesses.
// Elsewhere all of this compiles to nothing.
#if defined(TESSERA_SIMT_TSAN)
struct IgnoreAccesses {
  IgnoreAccesses() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~IgnoreAccesses() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
  IgnoreAccesses(const IgnoreAccesses&) = delete;
  IgnoreAccesses& operator=(const IgnoreAccesses&) = delete;
};
inline void hb_release(void* sync) { __tsan_release(sync); }
inline void hb_acquire(void* sync) { __tsan_acquire(sync); }
#else
struct IgnoreAccesses {
  IgnoreAccesses() {}  // user-provided: a scope guard, not an unused variable
  ~IgnoreAccesses() {}
};
inline void hb_release(void*) {}
inline void hb_acquire(void*) {}
#endif

}  // namespace

// One static __shared__ array of a block: claimed by the first thread that reaches its
// declaration (key), which allocates it and publishes ptr before any other fiber runs. Atomics, not
// a mutex: ThreadSanitizer must see the allocation happen before the other threads' use of it, and
// nothing more (a mutex would order every later thread after the first one's whole past, hiding
// the races between them that a missing __syncthreads leaves).
struct SharedSlot {
  std::atomic<const void*> key{nullptr};
  std::atomic<void*> ptr{nullptr};
};
constexpr size_t kMaxStaticArrays = 16;

// The lanes of one warp waiting at a collective: while they all name one mask, `count` of them
// (the collective completes when count reaches the mask's population); `mixed` once lanes wait
// with different masks, which the general rule (resolve_warps) sorts out when nothing else runs.
struct WarpWait {
  unsigned mask = 0;
  int count = 0;
  bool mixed = false;
  char sync = 0;  // ThreadSanitizer: the address its release/acquire name
};

struct BlockState {
  const char* kernel = "";
  BlockView view;
  int nthreads = 0;
  std::vector<ThreadCtx> threads;
  std::vector<St> state;
  std::vector<WarpWait> warps;
  int at_barrier = 0;  // threads waiting at __syncthreads
  int exited = 0;
  char barrier_sync = 0;  // ThreadSanitizer: the address the barrier's release/acquire name
  bool abandoned = false;
  std::exception_ptr fault;  // the first error: a thread's exception or the stuck diagnosis
  // Shared memory: static arrays by declaration (static_shared), and the launch's dynamic block.
  std::array<SharedSlot, kMaxStaticArrays> statics;
  std::atomic<size_t> static_bytes{0};
  void* dynamic = nullptr;
  size_t dynamic_bytes = 0;

  ~BlockState() {
    for (SharedSlot& slot : statics) std::free(slot.ptr.load());
    std::free(dynamic);
  }
};

namespace {

std::string dim_str(const dim3& d) {
  std::ostringstream os;
  os << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return os.str();
}

std::string where(const BlockState& b) {
  return std::string("kernel ") + b.kernel + ", block " + dim_str(b.view.block_idx);
}

// "0-31 at __syncthreads, 32-63 exited": runs of threads in one state.
std::string describe_states(const BlockState& b) {
  auto name = [&](int i) -> std::string {
    switch (b.state[i]) {
      case St::Ready: return "running";
      case St::Barrier: return "waiting at __syncthreads";
      case St::Warp: {
        std::ostringstream os;
        const ThreadCtx& t = b.threads[i];
        os << "waiting at a warp "
           << (t.kind == Collective::Shuffle ? "shuffle" : t.kind == Collective::Mma ? "mma.sync" : "sync")
           << " (mask 0x" << std::hex << t.mask << ")";
        return os.str();
      }
      case St::Exited: return "exited";
    }
    return "?";
  };
  std::ostringstream os;
  int i = 0;
  while (i < b.nthreads) {
    const std::string s = name(i);
    int j = i;
    while (j + 1 < b.nthreads && name(j + 1) == s) ++j;
    if (i > 0) os << ", ";
    os << "threads " << i;
    if (j > i) os << "-" << j;
    os << " " << s;
    i = j + 1;
  }
  return os.str();
}

// Warp w's lanes waiting at a collective, counted again (after the general rule changed them).
void recount_warp(BlockState& b, int w) {
  WarpWait& ww = b.warps[w];
  ww = WarpWait{};
  const int base = w * kWarpSize;
  for (int l = 0; l < kWarpSize && base + l < b.nthreads; ++l) {
    if (b.state[base + l] != St::Warp) continue;
    const unsigned m = b.threads[base + l].mask;
    if (ww.count == 0) ww.mask = m;
    ww.mixed = ww.mixed || m != ww.mask;
    ++ww.count;
  }
}

// The collective of warp w named by `mask`, whose lanes have all arrived: checked (every lane of
// the mask waits with the same mask and kind; a shuffle reads a lane inside it; an mma has the
// whole warp), carried out (results in the lanes' mailboxes) and its lanes Ready. Returns false
// when some lane of the mask has not arrived; throws KernelError for a collective that never can
// complete (a lane of its mask exited or does not exist, lanes disagree on the mask or the kind).
bool complete_warp(BlockState& b, int w, unsigned mask) {
  const int base = w * kWarpSize;
  Collective kind = Collective::SyncWarp;
  bool first = true, complete = true;
  for (int l = 0; l < kWarpSize; ++l) {
    if (!(mask >> l & 1u)) continue;
    const int t = base + l;
    if (t >= b.nthreads) {
      std::ostringstream os;
      os << where(b) << ": a warp collective's mask 0x" << std::hex << mask << std::dec << " names lane " << l
         << " of warp " << w << ", which does not exist (the block has " << b.nthreads << " threads)";
      throw KernelError(os.str());
    }
    if (b.state[t] == St::Exited) {
      std::ostringstream os;
      os << where(b) << ": a warp collective's mask 0x" << std::hex << mask << std::dec << " names lane " << l
         << " of warp " << w << " (thread " << t << "), which has exited";
      throw KernelError(os.str());
    }
    if (b.state[t] != St::Warp) {
      complete = false;
      continue;
    }
    const ThreadCtx& tt = b.threads[t];
    if (first) kind = tt.kind;
    first = false;
    if (tt.mask != mask || tt.kind != kind) {
      std::ostringstream os;
      os << where(b) << ": lanes of warp " << w << " meet at different warp collectives (mask 0x" << std::hex << mask
         << ", thread " << std::dec << t << " mask 0x" << std::hex << tt.mask << ")";
      throw KernelError(os.str());
    }
  }
  if (!complete) return false;
  if (kind == Collective::Shuffle) {
    for (int l = 0; l < kWarpSize; ++l) {
      if (!(mask >> l & 1u)) continue;
      ThreadCtx& t = b.threads[base + l];
      if (!(mask >> t.src_lane & 1u)) {
        std::ostringstream os;
        os << where(b) << ": lane " << l << " of warp " << w << " shuffles from lane " << t.src_lane
           << ", outside the mask 0x" << std::hex << mask;
        throw KernelError(os.str());
      }
    }
    for (int l = 0; l < kWarpSize; ++l)
      if (mask >> l & 1u) b.threads[base + l].out_bits = b.threads[base + b.threads[base + l].src_lane].in_bits;
  } else if (kind == Collective::Mma) {
    if (mask != 0xffffffffu) {
      std::ostringstream os;
      os << where(b) << ": mma.sync.aligned needs all 32 lanes of warp " << w << ", the mask is 0x" << std::hex
         << mask;
      throw KernelError(os.str());
    }
    uint32_t a[kWarpSize][4], bb[kWarpSize][2];
    float c[kWarpSize][4], d[kWarpSize][4];
    for (int l = 0; l < kWarpSize; ++l) {
      const ThreadCtx& t = b.threads[base + l];
      std::memcpy(a[l], t.mma_a, sizeof a[l]);
      std::memcpy(bb[l], t.mma_b, sizeof bb[l]);
      std::memcpy(c[l], t.mma_c, sizeof c[l]);
    }
    mma_m16n8k16_bf16(a, bb, c, d);
    for (int l = 0; l < kWarpSize; ++l) std::memcpy(b.threads[base + l].mma_d, d[l], sizeof d[l]);
  }
  for (int l = 0; l < kWarpSize; ++l)
    if (mask >> l & 1u) b.state[base + l] = St::Ready;
  return true;
}

// The general rule, when no thread can run: every warp collective that can complete, completed.
// Returns whether any did; throws KernelError for one that never can.
bool resolve_warps(BlockState& b) {
  bool any = false;
  for (int w = 0; w < static_cast<int>(b.warps.size()); ++w) {
    const int base = w * kWarpSize;
    for (int l = 0; l < kWarpSize && base + l < b.nthreads; ++l)
      if (b.state[base + l] == St::Warp) {
        if (complete_warp(b, w, b.threads[base + l].mask)) {
          any = true;
          recount_warp(b, w);
        }
        break;
      }
  }
  return any;
}

// When no thread can run and some wait at the barrier: the others exited before it (a barrier in
// divergent code) is an error; otherwise they wait at warp collectives (a deadlock, said by stuck).
void check_barrier(BlockState& b) {
  if (b.at_barrier == 0 || b.exited == 0) return;
  std::ostringstream os;
  os << where(b) << ": __syncthreads() reached by " << b.at_barrier << " of " << b.nthreads
     << " threads; the others exited before it (a barrier in divergent code): " << describe_states(b);
  throw KernelError(os.str());
}

// Every thread blocked or exited and nothing can complete.
[[noreturn]] void stuck(BlockState& b) {
  throw KernelError(where(b) + ": deadlock: no barrier or warp collective can complete: " + describe_states(b));
}

// A thread arrives at the barrier: the last one releases them all.
void arrive_barrier(BlockState& b, int me) {
  b.state[me] = St::Barrier;
  if (++b.at_barrier < b.nthreads) return;
  IgnoreAccesses ignore;  // the fill is a call to memset, which ThreadSanitizer intercepts
  std::fill(b.state.begin(), b.state.end(), St::Ready);
  b.at_barrier = 0;
}

// A lane arrives at a warp collective (its mailbox filled): the last lane of the mask carries it
// out. Lanes waiting with different masks are left to resolve_warps.
void arrive_warp(BlockState& b, int me) {
  b.state[me] = St::Warp;
  const int w = me / kWarpSize;
  WarpWait& ww = b.warps[w];
  const unsigned mask = b.threads[me].mask;
  if (ww.count == 0) {
    ww.mask = mask;
    ww.mixed = false;
  } else if (ww.mask != mask) {
    ww.mixed = true;
  }
  ++ww.count;
  if (!ww.mixed && ww.count == std::popcount(mask) && complete_warp(b, w, mask)) ww.count = 0;
}

void init_block(BlockState& b, const char* kernel, const LaunchShape& s, const dim3& idx) {
  b.kernel = kernel;
  b.view = BlockView{idx, s.block, s.grid};
  b.nthreads = static_cast<int>(s.block.x * s.block.y * s.block.z);
  b.threads.assign(b.nthreads, ThreadCtx{});
  b.state.assign(b.nthreads, St::Ready);
  b.warps.assign((b.nthreads + kWarpSize - 1) / kWarpSize, WarpWait{});
  for (int i = 0; i < b.nthreads; ++i) {
    ThreadCtx& t = b.threads[i];
    t.linear = i;
    t.thread_idx = dim3(i % s.block.x, (i / s.block.x) % s.block.y, i / (s.block.x * s.block.y));
    t.block = &b;
    t.view = &b.view;
  }
  b.dynamic_bytes = s.dynamic_smem;
  if (s.dynamic_smem > 0) {
    // Exactly its size (AddressSanitizer sees one byte past it), 16-byte aligned as CUDA's.
    if (posix_memalign(&b.dynamic, 16, s.dynamic_smem) != 0) throw std::bad_alloc();
    std::memset(b.dynamic, 0xff, s.dynamic_smem);
  }
}

}  // namespace
}  // namespace tessera::simt

// The context switch (x86-64 System V): saves the callee-saved registers on the current stack,
// stores the stack pointer in *save, loads `next` and restores the same from it. A new fiber's
// stack is laid out so that the restore "returns" into the trampoline, which calls r13(r12).
extern "C" void tessera_simt_switch(void** save, void* next);
extern "C" void tessera_simt_trampoline();
asm(R"(
  .text
  .globl tessera_simt_switch
  .type tessera_simt_switch, @function
tessera_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tessera_simt_switch, .-tessera_simt_switch

  .globl tessera_simt_trampoline
  .type tessera_simt_trampoline, @function
tessera_simt_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size tessera_simt_trampoline, .-tessera_simt_trampoline
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace tessera::simt {
namespace {

#if defined(TESSERA_SIMT_ASAN) || defined(TESSERA_SIMT_TSAN)
constexpr size_t kStackBytes = 256 * 1024;  // the sanitizers' frames are larger
#else
constexpr size_t kStackBytes = 64 * 1024;
#endif

// One mmap'd stack with a guard page below it (an overflow faults instead of corrupting), and
// under ThreadSanitizer the TSan fiber that runs on it (one per stack: the stack's memory is then
// always touched by the same TSan fiber).
struct Stack {
  char* base = nullptr;  // the guard page
  size_t bytes = 0;
  void* tsan_fiber = nullptr;
  Stack() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes = kStackBytes + page;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base = static_cast<char*>(p);
    mprotect(base, page, PROT_NONE);
#if defined(TESSERA_SIMT_TSAN)
    tsan_fiber = __tsan_create_fiber(0);
#endif
  }
  ~Stack() {
#if defined(TESSERA_SIMT_TSAN)
    __tsan_destroy_fiber(tsan_fiber);
#endif
    munmap(base, bytes);
  }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* bottom() const { return base + (bytes - kStackBytes); }
  char* top() const { return base + bytes; }
};

// The stacks of the OS thread that runs grids (a stream's worker): made on first need, reused by
// every block after, released when the thread ends. A cache, not state a result depends on.
std::vector<std::unique_ptr<Stack>>& stack_pool(size_t n) {
  thread_local std::vector<std::unique_ptr<Stack>> pool;
  while (pool.size() < n) pool.push_back(std::make_unique<Stack>());
  return pool;
}

// A place execution can be switched to and from: the scheduler (the OS thread's own stack) or a
// fiber. The sanitizers' bookkeeping of the switch lives here too.
struct Context {
  void* sp = nullptr;
  const void* stack_bottom = nullptr;  // AddressSanitizer: the stack's extent
  size_t stack_size = 0;
  void* asan_fake = nullptr;
  void* tsan_fiber = nullptr;
};

// One block's run: its fibers and what they all share.
struct Fiber;
struct Scheduler {
  Context ctx;
  BlockState* block = nullptr;
  std::vector<Fiber>* fibers = nullptr;
  const std::function<void()>* body = nullptr;
  void* launch_sync = nullptr;  // ThreadSanitizer: released by the launch, acquired at start
  void* done_sync = nullptr;    // released at exit, acquired after the grid
};

// One emulated thread of the block (index = its ThreadCtx::linear); done when its state is Exited.
struct Fiber {
  Context ctx;
  int index = 0;
  Scheduler* sched = nullptr;
  ThreadCtx* thread = nullptr;
  bool started = false;
};

thread_local Fiber* t_fiber = nullptr;

// From `from` (the running context) to `to`; `from_final` when `from` never runs again. Returns
// when something switches back to `from`.
void switch_to(Context& from, Context& to, Fiber* to_fiber, [[maybe_unused]] bool from_final) {
  void* to_sp;
  [[maybe_unused]] void* to_tsan;
  {
    t_fiber = to_fiber;
    tls_thread = to_fiber ? to_fiber->thread : nullptr;
    to_sp = to.sp;
    to_tsan = to.tsan_fiber;
#if defined(TESSERA_SIMT_ASAN)
    __sanitizer_start_switch_fiber(from_final ? nullptr : &from.asan_fake, to.stack_bottom, to.stack_size);
#endif
  }
#if defined(TESSERA_SIMT_TSAN)
  __tsan_switch_to_fiber(to_tsan, __tsan_switch_to_fiber_no_sync);  // outside: ignores are per fiber
#endif
  tessera_simt_switch(&from.sp, to_sp);  // assembly: not instrumented
#if defined(TESSERA_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(from.asan_fake, nullptr, nullptr);
#endif
}

// The running fiber gives the OS thread away: to the next Ready fiber after it in this round (a
// switch from fiber to fiber, half the cost of going through the scheduler), else the scheduler.
void leave(Fiber& f, bool final) {
  Fiber* next = nullptr;
  Context* sched_ctx;
  {
    Scheduler& s = *f.sched;
    sched_ctx = &s.ctx;
    BlockState& b = *s.block;
    if (!b.abandoned && !b.fault)
      for (int i = f.index + 1; i < b.nthreads; ++i)
        if (b.state[i] == St::Ready) {
          next = &(*s.fibers)[i];
          break;
        }
  }
  if (next)
    switch_to(f.ctx, next->ctx, next, final);
  else
    switch_to(f.ctx, *sched_ctx, nullptr, final);
}

// A thread from its start to its exit (its fault, if any, recorded in the block). Returns before
// the fiber's last switch, so that what this frame owns (an exception the body threw) is freed.
void run_thread(Fiber& f) {
  const std::function<void()>* body;
  void *launch_sync, *done_sync;
  {
#if defined(TESSERA_SIMT_ASAN)
    // The first switch of a block comes from the scheduler: the extent of its stack.
    const void* from_bottom = nullptr;
    size_t from_size = 0;
    __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
    if (f.sched->ctx.stack_size == 0) {
      f.sched->ctx.stack_bottom = from_bottom;
      f.sched->ctx.stack_size = from_size;
    }
#endif
    f.started = true;
    body = f.sched->body;
    launch_sync = f.sched->launch_sync;
    done_sync = f.sched->done_sync;
  }
  hb_acquire(launch_sync);
  std::exception_ptr fault;
  try {
    (*body)();
  } catch (const Abandoned&) {
  } catch (...) {
    fault = std::current_exception();
  }
  hb_release(done_sync);
  {
    BlockState& b = *f.sched->block;
    if (fault && !b.fault) b.fault = fault;
    b.state[f.index] = St::Exited;
    ++b.exited;
  }
}

extern "C" void fiber_entry(void* arg) {
  Fiber& f = *static_cast<Fiber*>(arg);
  run_thread(f);
  leave(f, true);
  __builtin_trap();  // never resumed
}

void start_fiber(Fiber& f, Stack& s) {
#if defined(TESSERA_SIMT_ASAN)
  __asan_unpoison_memory_region(s.bottom(), kStackBytes);  // frames of an earlier block's fibers
#endif
  f.ctx.stack_bottom = s.bottom();
  f.ctx.stack_size = kStackBytes;
  f.ctx.tsan_fiber = s.tsan_fiber;
  // Stacks are page-aligned, so their tops would all fall in the same cache sets and evict each
  // other at every switch; each fiber's top is offset by its own multiple of a cache line.
  const uintptr_t color = (static_cast<uintptr_t>(f.index) * 17 % 128) * 64;
  auto top = (reinterpret_cast<uintptr_t>(s.top()) - color) & ~uintptr_t(15);
  // Popped by the switch: r15, r14, r13 (the function), r12 (its argument), rbx, rbp, then the
  // "return" into the trampoline, which leaves rsp 16-byte aligned for its call.
  auto* slots = reinterpret_cast<uint64_t*>(top - 16 - 56);
  slots[0] = slots[1] = 0;
  slots[2] = reinterpret_cast<uint64_t>(&fiber_entry);
  slots[3] = reinterpret_cast<uint64_t>(&f);
  slots[4] = slots[5] = 0;
  slots[6] = reinterpret_cast<uint64_t>(&tessera_simt_trampoline);
  f.ctx.sp = slots;
}

// Runs the block: rounds in thread order, each from the first Ready fiber, the fibers handing the
// OS thread on to each other; between rounds, the general rules when nothing can run.
void run_block(BlockState& b, const std::function<void()>& body, void* launch_sync, void* done_sync) {
  auto& pool = stack_pool(static_cast<size_t>(b.nthreads));
  Scheduler sched;
  sched.block = &b;
  sched.body = &body;
  sched.launch_sync = launch_sync;
  sched.done_sync = done_sync;
#if defined(TESSERA_SIMT_TSAN)
  sched.ctx.tsan_fiber = __tsan_get_current_fiber();
#endif
  std::vector<Fiber> fibers(b.nthreads);
  sched.fibers = &fibers;
  for (int i = 0; i < b.nthreads; ++i) {
    Fiber& f = fibers[i];
    f.index = i;
    f.sched = &sched;
    f.thread = &b.threads[i];
    start_fiber(f, *pool[i]);
  }
  auto first_ready = [&]() -> Fiber* {
    for (int i = 0; i < b.nthreads; ++i)
      if (b.state[i] == St::Ready) return &fibers[i];
    return nullptr;
  };
  for (;;) {
    if (Fiber* f = first_ready()) switch_to(sched.ctx, f->ctx, f, false);
    if (b.fault) break;
    if (b.exited == b.nthreads) return;
    if (first_ready()) continue;  // released behind the round's end
    try {
      if (resolve_warps(b)) continue;
      check_barrier(b);
      stuck(b);
    } catch (...) {
      b.fault = std::current_exception();
      break;
    }
  }
  // Abandoned: unwind every blocked fiber (each back to the scheduler) so its stack is left clean;
  // one that never started does not start.
  b.abandoned = true;
  for (Fiber& f : fibers)
    if (f.started && b.state[f.index] != St::Exited) switch_to(sched.ctx, f.ctx, &f, false);
  hb_acquire(done_sync);
  std::rethrow_exception(b.fault);
}

// The running thread arrives at a barrier or warp collective (`sync`, the address its
// happens-before names) and waits until it completes: the OS thread goes on to the next Ready
// fiber meanwhile. Unwinds when the block is abandoned.
void arrive_and_wait(Fiber& f, void* sync, void (*arrive)(BlockState&, int)) {
  hb_release(sync);
  bool ready;
  {
    BlockState& b = *f.sched->block;
    arrive(b, f.index);
    ready = b.state[f.index] == St::Ready;  // this arrival completed it
  }
  if (!ready) leave(f, false);
  bool abandoned;
  {
    abandoned = f.sched->block->abandoned;
  }
  if (abandoned) throw Abandoned{};
  hb_acquire(sync);
}

void block_at_barrier() {
  Fiber* f;
  void* sync;
  {
    f = t_fiber;
    sync = &f->sched->block->barrier_sync;
  }
  arrive_and_wait(*f, sync, arrive_barrier);
}

void block_at_warp(Collective kind, unsigned mask) {
  Fiber* f;
  void* sync;
  {
    f = t_fiber;
    BlockState& b = *f->sched->block;
    ThreadCtx& t = *f->thread;
    const int lane = t.linear % kWarpSize;
    if (!(mask >> lane & 1u)) {
      std::ostringstream os;
      os << where(b) << ": thread " << t.linear << " (lane " << lane << ") calls a warp collective with mask 0x"
         << std::hex << mask << ", which does not include its own lane";
      throw KernelError(os.str());
    }
    t.kind = kind;
    t.mask = mask;
    sync = &b.warps[t.linear / kWarpSize].sync;
  }
  arrive_and_wait(*f, sync, arrive_warp);
}

// The launched kernels' names, written at exit when $TESSERA_SIMT_COVERAGE names a file. The one
// process-wide record of the emulator: a launch anywhere in the process adds to it.
// Inert (one test of a flag per launch) unless the variable is set when the first launch comes.
class Coverage {
 public:
  static Coverage& get() {
    static Coverage c;
    return c;
  }
  void add(const char* kernel) {
    if (path_.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    names_.insert(kernel);
  }
  ~Coverage() {
    if (path_.empty()) return;
    std::ofstream out(path_, std::ios::app);
    for (const auto& n : names_) out << n << "\n";
  }

 private:
  Coverage() {
    if (const char* p = std::getenv("TESSERA_SIMT_COVERAGE")) path_ = p;
  }
  std::string path_;
  std::mutex mu_;
  std::set<std::string> names_;
};

}  // namespace

std::string launch_refusal(const LaunchShape& s) {
  std::ostringstream os;
  const uint64_t threads = uint64_t(s.block.x) * s.block.y * s.block.z;
  if (s.grid.x == 0 || s.grid.y == 0 || s.grid.z == 0)
    os << "an empty grid " << dim_str(s.grid);
  else if (s.block.x == 0 || s.block.y == 0 || s.block.z == 0)
    os << "an empty block " << dim_str(s.block);
  else if (threads > kMaxThreadsPerBlock)
    os << "a block of " << threads << " threads " << dim_str(s.block) << " exceeds " << kMaxThreadsPerBlock;
  else if (s.block.z > 64)
    os << "block z = " << s.block.z << " exceeds 64";
  else if (s.grid.x > kMaxGridX)
    os << "grid x = " << s.grid.x << " exceeds 2^31 - 1";
  else if (s.grid.y > kMaxGridYZ || s.grid.z > kMaxGridYZ)
    os << "grid " << dim_str(s.grid) << ": y and z must be at most " << kMaxGridYZ;
  else if (s.dynamic_smem > kMaxSmemPerBlock)
    os << s.dynamic_smem << " bytes of dynamic shared memory exceed the " << kMaxSmemPerBlock
       << " bytes (227 KB) a block may have on sm_90";
  else if (s.dynamic_smem > s.max_dynamic_smem)
    os << s.dynamic_smem << " bytes of dynamic shared memory exceed the kernel's limit of " << s.max_dynamic_smem
       << " bytes (above 48 KB, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) "
          "must allow it first)";
  return os.str();
}

void run_grid(const char* kernel, const LaunchShape& s, const std::function<void()>& body) {
  // ThreadSanitizer: the launch happens before every thread of the grid, every thread before what
  // follows it; between blocks of the grid (which a GPU runs concurrently) there is nothing.
  auto launch_sync = std::make_unique<char>(), done_sync = std::make_unique<char>();
  hb_release(launch_sync.get());
  for (unsigned z = 0; z < s.grid.z; ++z)
    for (unsigned y = 0; y < s.grid.y; ++y)
      for (unsigned x = 0; x < s.grid.x; ++x) {
        // The block's bookkeeping, on the heap: what ThreadSanitizer attached to its addresses
        // goes with it (a stack frame would be reused by the host code after the grid).
        IgnoreAccesses ignore;
        auto b = std::make_unique<BlockState>();
        init_block(*b, kernel, s, dim3(x, y, z));
        run_block(*b, body, launch_sync.get(), done_sync.get());
      }
  hb_acquire(done_sync.get());
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(TESSERA_SIMT_TSAN_FIBERS)
ThreadCtx& current_thread() { return *tls_thread; }
const BlockView& current_block() { return *tls_thread->view; }
#endif

void barrier() { block_at_barrier(); }

void warp_sync(unsigned mask) { block_at_warp(Collective::SyncWarp, mask); }

uint64_t warp_shuffle(unsigned mask, int src_lane, uint64_t bits) {
  {
    ThreadCtx& t = *tls_thread;
    t.in_bits = bits;
    t.src_lane = src_lane;
  }
  block_at_warp(Collective::Shuffle, mask);
  return tls_thread->out_bits;
}

void warp_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  {
    ThreadCtx& t = *tls_thread;
    std::memcpy(t.mma_a, a, sizeof t.mma_a);
    t.mma_b[0] = b0;
    t.mma_b[1] = b1;
    std::memcpy(t.mma_c, c, sizeof t.mma_c);
  }
  block_at_warp(Collective::Mma, 0xffffffffu);
  std::memcpy(c, tls_thread->mma_d, sizeof c);
}

void* static_shared(const void* key, size_t bytes, size_t align) {
  BlockState& b = *tls_thread->block;
  for (SharedSlot& slot : b.statics) {
    const void* k = slot.key.load(std::memory_order_acquire);
    if (k == nullptr && slot.key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
      // This thread claimed the slot: allocate at exactly the size, fill, publish. Over the
      // limits the block fails.
      const size_t total = b.static_bytes.fetch_add(bytes) + bytes;
      void* p = nullptr;
      if (posix_memalign(&p, std::max<size_t>(align, sizeof(void*)), bytes) != 0) throw std::bad_alloc();
      std::memset(p, 0xff, bytes);
      slot.ptr.store(p, std::memory_order_release);
      hb_release(&slot);  // the atomics are not instrumented here: the array exists before it is used
      if (total > kMaxStaticSmem || total + b.dynamic_bytes > kMaxSmemPerBlock) {
        std::ostringstream os;
        os << where(b) << ": static shared memory of " << total << " bytes (with " << b.dynamic_bytes
           << " dynamic) exceeds the limits (48 KB static, 227 KB in all)";
        throw KernelError(os.str());
      }
      return p;
    }
    if (k == key) {  // claimed and published
      void* p = slot.ptr.load(std::memory_order_acquire);
      hb_acquire(&slot);
      return p;
    }
  }
  throw KernelError(where(b) + ": more than " + std::to_string(kMaxStaticArrays) +
                    " static __shared__ arrays in one kernel (kernels/simt/executor.cpp's kMaxStaticArrays)");
}

void* dynamic_shared() { return tls_thread->block->dynamic; }

void record_launch(const char* kernel) { Coverage::get().add(kernel); }

}  // namespace tessera::simt
