// The SIMT executor (kernels/simt/executor.h): blocks in order, the threads of a block as fibers
// (default) or OS threads (TESSERA_SIMT_OS_THREADS, the ThreadSanitizer build), one rule set for
// when a barrier or warp collective completes and when a block is stuck.
#include "kernels/simt/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TESSERA_SIMT_ASAN 1
#endif

namespace tessera::simt {

thread_local ThreadCtx* tls_thread = nullptr;

namespace {

enum class St : uint8_t { Ready, Barrier, Warp, Exited };

// Thrown inside a blocked thread when its block is abandoned (another thread faulted, or the block
// is stuck): unwinds the thread's stack to its entry, which swallows it.
struct Abandoned {};

}  // namespace

// One static __shared__ array of a block: claimed by the first thread that reaches its
// declaration (key), which allocates it and publishes ptr. Lock-free on purpose: a mutex here would
// order every later thread after the first one's whole past, and ThreadSanitizer would then miss
// the races between them that a missing __syncthreads leaves; the atomics order the others after
// the allocation only.
struct SharedSlot {
  std::atomic<const void*> key{nullptr};
  std::atomic<void*> ptr{nullptr};
};
constexpr size_t kMaxStaticArrays = 16;

struct BlockState {
  const char* kernel = "";
  BlockView view;
  int nthreads = 0;
  std::vector<ThreadCtx> threads;
  std::vector<St> state;
  std::vector<uint64_t> released;  // per thread: how many times a wait of it completed (OS threads)
  bool abandoned = false;
  std::exception_ptr fault;  // the first error: a thread's exception or the stuck diagnosis
  // Shared memory: static arrays by declaration (static_shared), and the launch's dynamic block.
  std::array<SharedSlot, kMaxStaticArrays> statics;
  std::atomic<size_t> static_bytes{0};
  void* dynamic = nullptr;
  size_t dynamic_bytes = 0;
  std::mutex mu;  // OS threads: guards everything above once the block runs
  std::condition_variable cv;

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

// The warp collectives that can complete, completed (results in the lanes' mailboxes, the lanes
// Ready). Returns whether any did; throws KernelError for a collective that never can (a lane of
// its mask exited or does not exist, lanes disagree on the mask or the kind, a shuffle reads a
// lane outside the mask, an mma without the whole warp).
bool resolve_warps(BlockState& b) {
  bool any = false;
  const int warps = (b.nthreads + kWarpSize - 1) / kWarpSize;
  for (int w = 0; w < warps; ++w) {
    const int base = w * kWarpSize;
    int leader = -1;
    for (int l = 0; l < kWarpSize && base + l < b.nthreads; ++l)
      if (b.state[base + l] == St::Warp) {
        leader = base + l;
        break;
      }
    if (leader < 0) continue;
    const ThreadCtx& lt = b.threads[leader];
    const unsigned mask = lt.mask;
    bool complete = true;
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
      if (tt.mask != mask || tt.kind != lt.kind) {
        std::ostringstream os;
        os << where(b) << ": lanes of warp " << w << " meet at different warp collectives (thread " << leader
           << " mask 0x" << std::hex << mask << ", thread " << std::dec << t << " mask 0x" << std::hex << tt.mask
           << ")";
        throw KernelError(os.str());
      }
    }
    if (!complete) continue;
    if (lt.kind == Collective::Shuffle) {
      for (int l = 0; l < kWarpSize; ++l) {
        if (!(mask >> l & 1u)) continue;
        ThreadCtx& t = b.threads[base + l];
        if (!(mask >> t.src_lane & 1u)) {
          std::ostringstream os;
          os << where(b) << ": lane " << l << " of warp " << w << " shuffles from lane " << t.src_lane
             << ", outside the mask 0x" << std::hex << mask;
          throw KernelError(os.str());
        }
        t.out_bits = b.threads[base + t.src_lane].in_bits;
      }
    } else if (lt.kind == Collective::Mma) {
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
      if (mask >> l & 1u) {
        b.state[base + l] = St::Ready;
        ++b.released[base + l];
      }
    any = true;
  }
  return any;
}

// Completes the barrier when every thread of the block waits there. Throws when some wait there
// and others have exited (they can never arrive).
bool resolve_barrier(BlockState& b) {
  int at = 0, exited = 0;
  for (St s : b.state) {
    at += s == St::Barrier;
    exited += s == St::Exited;
  }
  if (at == 0) return false;
  if (exited > 0) {
    std::ostringstream os;
    os << where(b) << ": __syncthreads() reached by " << at << " of " << b.nthreads
       << " threads; the others exited before it (a barrier in divergent code): " << describe_states(b);
    throw KernelError(os.str());
  }
  if (at != b.nthreads) return false;
  for (int i = 0; i < b.nthreads; ++i) {
    b.state[i] = St::Ready;
    ++b.released[i];
  }
  return true;
}

// Every thread blocked or exited and nothing can complete.
[[noreturn]] void stuck(BlockState& b) {
  throw KernelError(where(b) + ": deadlock: no barrier or warp collective can complete: " + describe_states(b));
}

void init_block(BlockState& b, const char* kernel, const LaunchShape& s, const dim3& idx) {
  b.kernel = kernel;
  b.view = BlockView{idx, s.block, s.grid};
  b.nthreads = static_cast<int>(s.block.x * s.block.y * s.block.z);
  b.threads.assign(b.nthreads, ThreadCtx{});
  b.state.assign(b.nthreads, St::Ready);
  b.released.assign(b.nthreads, 0);
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

#if !defined(TESSERA_SIMT_OS_THREADS)
// ================================ fibers ================================

}  // namespace
}  // namespace tessera::simt

// The context switch (x86-64 System V): saves the callee-saved registers on the current stack, stores the stack pointer in *save, loads `next` and restores
// the same from it. A new fiber's stack is laid out so that the restore "returns" into the
// trampoline, which calls r13(r12).
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

#if defined(TESSERA_SIMT_ASAN)
constexpr size_t kStackBytes = 256 * 1024;  // AddressSanitizer's frames are larger
#else
constexpr size_t kStackBytes = 64 * 1024;
#endif

// One mmap'd stack with a guard page below it (an overflow faults instead of corrupting).
struct Stack {
  char* base = nullptr;  // the guard page
  size_t bytes = 0;
  Stack() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes = kStackBytes + page;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base = static_cast<char*>(p);
    mprotect(base, page, PROT_NONE);
  }
  ~Stack() { munmap(base, bytes); }
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

struct Fiber;
struct Scheduler {
  void* sp = nullptr;  // the scheduler's saved stack pointer while a fiber runs
#if defined(TESSERA_SIMT_ASAN)
  void* fake = nullptr;
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};

struct Fiber {
  void* sp = nullptr;
  Stack* stack = nullptr;
  Scheduler* sched = nullptr;
  ThreadCtx* ctx = nullptr;
  const std::function<void()>* body = nullptr;
  bool done = false;
#if defined(TESSERA_SIMT_ASAN)
  void* fake = nullptr;
#endif
};

thread_local Fiber* t_fiber = nullptr;

// Back to the scheduler; `final` when the fiber never runs again.
void yield_to_scheduler(Fiber& f, bool final) {
#if defined(TESSERA_SIMT_ASAN)
  __sanitizer_start_switch_fiber(final ? nullptr : &f.fake, f.sched->stack_bottom, f.sched->stack_size);
#endif
  tessera_simt_switch(&f.sp, f.sched->sp);
#if defined(TESSERA_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(f.fake, nullptr, nullptr);
#endif
}

extern "C" void fiber_entry(void* arg) {
  Fiber& f = *static_cast<Fiber*>(arg);
#if defined(TESSERA_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &f.sched->stack_bottom, &f.sched->stack_size);
#endif
  BlockState& b = *f.ctx->block;
  try {
    (*f.body)();
  } catch (const Abandoned&) {
  } catch (...) {
    if (!b.fault) b.fault = std::current_exception();
  }
  b.state[f.ctx->linear] = St::Exited;
  f.done = true;
  yield_to_scheduler(f, true);
  __builtin_trap();  // never resumed
}

void start_fiber(Fiber& f) {
  Stack& s = *f.stack;
#if defined(TESSERA_SIMT_ASAN)
  __asan_unpoison_memory_region(s.bottom(), kStackBytes);  // frames of an earlier block's fibers
#endif
  // Stacks are page-aligned, so their tops would all fall in the same cache sets and evict each
  // other at every switch; each fiber's top is offset by its own multiple of a cache line.
  const uintptr_t color = (static_cast<uintptr_t>(f.ctx->linear) * 17 % 128) * 64;
  auto top = (reinterpret_cast<uintptr_t>(s.top()) - color) & ~uintptr_t(15);
  // Popped by the switch: r15, r14, r13 (the function), r12 (its argument), rbx, rbp, then the
  // "return" into the trampoline, which leaves rsp 16-byte aligned for its call.
  auto* slots = reinterpret_cast<uint64_t*>(top - 16 - 56);
  slots[0] = slots[1] = 0;
  slots[2] = reinterpret_cast<uint64_t>(&fiber_entry);
  slots[3] = reinterpret_cast<uint64_t>(&f);
  slots[4] = slots[5] = 0;
  slots[6] = reinterpret_cast<uint64_t>(&tessera_simt_trampoline);
  f.sp = slots;
}

void resume(Scheduler& sched, Fiber& f) {
  t_fiber = &f;
  tls_thread = f.ctx;
#if defined(TESSERA_SIMT_ASAN)
  __sanitizer_start_switch_fiber(&sched.fake, f.stack->bottom(), kStackBytes);
#endif
  tessera_simt_switch(&sched.sp, f.sp);
#if defined(TESSERA_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(sched.fake, nullptr, nullptr);
#endif
  t_fiber = nullptr;
  tls_thread = nullptr;
}

// A blocked fiber: back to the scheduler until released; unwinds when the block is abandoned.
void block_on(St s) {
  Fiber& f = *t_fiber;
  BlockState& b = *f.ctx->block;
  b.state[f.ctx->linear] = s;
  yield_to_scheduler(f, false);
  if (b.abandoned) throw Abandoned{};
}

void run_block(BlockState& b, const std::function<void()>& body) {
  auto& pool = stack_pool(static_cast<size_t>(b.nthreads));
  Scheduler sched;
  std::vector<Fiber> fibers(b.nthreads);
  for (int i = 0; i < b.nthreads; ++i) {
    Fiber& f = fibers[i];
    f.stack = pool[i].get();
    f.sched = &sched;
    f.ctx = &b.threads[i];
    f.body = &body;
    start_fiber(f);
  }
  auto run_ready = [&] {
    for (int i = 0; i < b.nthreads; ++i)
      if (b.state[i] == St::Ready && !fibers[i].done) resume(sched, fibers[i]);
  };
  auto abandon = [&] {  // unwind every blocked fiber so its stack is left clean
    b.abandoned = true;
    for (int i = 0; i < b.nthreads; ++i)
      if (!fibers[i].done) resume(sched, fibers[i]);
  };
  for (;;) {
    run_ready();
    if (b.fault) break;
    bool all_exited = true;
    for (St s : b.state) all_exited = all_exited && s == St::Exited;
    if (all_exited) return;
    try {
      if (resolve_warps(b)) continue;
      if (resolve_barrier(b)) continue;
      stuck(b);
    } catch (...) {
      b.fault = std::current_exception();
      break;
    }
  }
  abandon();
  std::rethrow_exception(b.fault);
}

#else
// ================================ OS threads ================================

// Under the block's mutex, after a thread blocked or exited: completes what can complete, wakes
// the released threads; when nothing runs and nothing can complete, records the diagnosis.
void progress_locked(BlockState& b) {
  try {
    bool changed = true;
    while (changed) {
      changed = resolve_warps(b);
      if (!changed) changed = resolve_barrier(b);
    }
    bool running = false, all_exited = true;
    for (St s : b.state) {
      running = running || s == St::Ready;
      all_exited = all_exited && s == St::Exited;
    }
    if (!running && !all_exited) stuck(b);
  } catch (...) {
    if (!b.fault) b.fault = std::current_exception();
    b.abandoned = true;
  }
  b.cv.notify_all();
}

void block_on(St s) {
  ThreadCtx& t = *tls_thread;
  BlockState& b = *t.block;
  std::unique_lock<std::mutex> lock(b.mu);
  if (b.abandoned) throw Abandoned{};
  const uint64_t seen = b.released[t.linear];
  b.state[t.linear] = s;
  progress_locked(b);
  b.cv.wait(lock, [&] { return b.abandoned || b.released[t.linear] != seen; });
  if (b.abandoned) throw Abandoned{};
}

void run_block(BlockState& b, const std::function<void()>& body) {
  std::vector<std::thread> threads;
  threads.reserve(b.nthreads);
  for (int i = 0; i < b.nthreads; ++i) {
    threads.emplace_back([&b, &body, i] {
      tls_thread = &b.threads[i];
      try {
        body();
      } catch (const Abandoned&) {
      } catch (...) {
        std::lock_guard<std::mutex> lock(b.mu);
        if (!b.fault) b.fault = std::current_exception();
        b.abandoned = true;
      }
      std::lock_guard<std::mutex> lock(b.mu);
      b.state[i] = St::Exited;
      progress_locked(b);
      tls_thread = nullptr;
    });
  }
  for (auto& th : threads) th.join();
  if (b.fault) std::rethrow_exception(b.fault);
}
#endif

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
  for (unsigned z = 0; z < s.grid.z; ++z)
    for (unsigned y = 0; y < s.grid.y; ++y)
      for (unsigned x = 0; x < s.grid.x; ++x) {
        BlockState b;
        init_block(b, kernel, s, dim3(x, y, z));
        run_block(b, body);
      }
}


#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
ThreadCtx& current_thread() { return *tls_thread; }
const BlockView& current_block() { return *tls_thread->view; }
#endif

void barrier() { block_on(St::Barrier); }

void warp_collective(Collective kind, unsigned mask) {
  ThreadCtx& t = *tls_thread;
  const int lane = t.linear % kWarpSize;
  if (!(mask >> lane & 1u)) {
    std::ostringstream os;
    os << where(*t.block) << ": thread " << t.linear << " (lane " << lane << ") calls a warp collective with mask 0x"
       << std::hex << mask << ", which does not include its own lane";
    throw KernelError(os.str());
  }
  t.kind = kind;
  t.mask = mask;
  block_on(St::Warp);
}

void* static_shared(const void* key, size_t bytes, size_t align) {
  BlockState& b = *tls_thread->block;
  for (SharedSlot& slot : b.statics) {
    const void* k = slot.key.load(std::memory_order_acquire);
    if (k == nullptr && slot.key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
      // This thread claimed the slot: allocate at exactly the size, fill, publish. Over the
      // limits it is still published (the others must not wait for ever) and the block fails.
      const size_t total = b.static_bytes.fetch_add(bytes) + bytes;
      void* p = nullptr;
      if (posix_memalign(&p, std::max<size_t>(align, sizeof(void*)), bytes) != 0) throw std::bad_alloc();
      std::memset(p, 0xff, bytes);
      slot.ptr.store(p, std::memory_order_release);
      if (total > kMaxStaticSmem || total + b.dynamic_bytes > kMaxSmemPerBlock) {
        std::ostringstream os;
        os << where(b) << ": static shared memory of " << total << " bytes (with " << b.dynamic_bytes
           << " dynamic) exceeds the limits (48 KB static, 227 KB in all)";
        throw KernelError(os.str());
      }
      return p;
    }
    if (k == key) {  // claimed by this or another thread: wait until it is published
      void* p;
      while (!(p = slot.ptr.load(std::memory_order_acquire))) std::this_thread::yield();
      return p;
    }
  }
  throw KernelError(where(b) + ": more than " + std::to_string(kMaxStaticArrays) +
                    " static __shared__ arrays in one kernel (kernels/simt/executor.cpp's kMaxStaticArrays)");
}

void* dynamic_shared() { return tls_thread->block->dynamic; }

void record_launch(const char* kernel) { Coverage::get().add(kernel); }

}  // namespace tessera::simt
