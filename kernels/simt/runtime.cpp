// The CPU twin of the CUDA runtime (kernels/simt/runtime_api.h, kernels/simt/stream.h): host
// memory stands in for device memory, and every stream is a queue run in order by its own worker
// thread, so that work really runs asynchronously to the host as on a GPU.
//
// Ordering between queues is by tickets: the n-th piece of work queued on a stream finishes after
// the (n-1)-th, so "ticket n of queue q has finished" is the one condition everything waits on
// (stream and device synchronisation, events, cudaStreamWaitEvent, the legacy default stream).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/simt/runtime_api.h"
#include "kernels/simt/stream.h"
#include "kernels/simt/twin.h"
#include "kernels/simt/types.h"

namespace tessera::simt {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kAlignment = 256;  // cudaMalloc's guarantee

class Queue;

// "Ticket n of queue q has finished": what a piece of work waits for before it starts.
struct Ticket {
  std::shared_ptr<Queue> queue;
  uint64_t n = 0;
};

struct Item {
  std::string what;
  std::function<void()> work;
  std::vector<Ticket> after;  // other queues' work that must finish first
  bool after_fault = false;   // runs even on a faulted device (a queued free: else a leak)
};

// The queue of one stream, shared with the tickets that refer to it (a stream may be destroyed
// while another stream's work still waits on one of its tickets).
class Queue {
 public:
  uint64_t push(Item item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(item));
    cv_.notify_all();
    return ++queued_;
  }
  // The worker's next item; false once stopped and drained.
  bool pop(Item& out) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !items_.empty() || stopping_; });
    if (items_.empty()) return false;
    out = std::move(items_.front());
    items_.pop_front();
    return true;
  }
  void finish_one() {
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    cv_.notify_all();
  }
  void wait_for(uint64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= n; });
  }
  bool finished(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ >= n;
  }
  // The ticket of the last work queued so far (0: none ever).
  uint64_t last() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_;
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ == queued_;
  }
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;  // an item queued, an item finished, or stop
  std::deque<Item> items_;
  uint64_t queued_ = 0, finished_ = 0;
  bool stopping_ = false;
};

// A ticket without a queue is work that ran inline (after shut_down): finished.
void wait(const Ticket& t) {
  if (t.queue) t.queue->wait_for(t.n);
}
bool finished(const Ticket& t) { return !t.queue || t.queue->finished(t.n); }

// The calling host thread's CUDA state: CUDA's current device and last error are per thread.
struct ThreadState {
  int device = 0;
  cudaError_t last_error = cudaSuccess;
};
thread_local ThreadState this_thread;

}  // namespace
}  // namespace tessera::simt

// A stream: its queue and the worker thread that runs it.
struct CUstream_st {
  int device = 0;
  bool legacy = false;    // the device's legacy default stream (the handle nullptr)
  bool blocking = true;   // created without cudaStreamNonBlocking: orders with the legacy stream
  std::shared_ptr<tessera::simt::Queue> queue = std::make_shared<tessera::simt::Queue>();
  std::thread worker;

  // Drains the queue and joins the worker (at cudaStreamDestroy, or at process exit).
  void stop_worker() {
    if (!worker.joinable()) return;
    queue->stop();
    worker.join();
  }
  ~CUstream_st() { stop_worker(); }
};

// An event: the marker of its latest cudaEventRecord.
struct CUevent_st {
  struct Marker {
    tessera::simt::Ticket done;
    tessera::simt::Clock::time_point at;  // written by the record's work before `done` finishes
  };
  unsigned flags = 0;
  std::mutex mu;
  std::shared_ptr<Marker> last;  // null until recorded
};

namespace tessera::simt {
namespace {

// One emulated device: its streams and its sticky error.
struct Device {
  int index = 0;
  std::mutex mu;  // guards the members below; held while queueing, so that the legacy stream's
                  // implicit dependencies are read and its work pushed as one step
  std::unique_ptr<CUstream_st> legacy;                // created on first use
  std::vector<std::unique_ptr<CUstream_st>> streams;  // cudaStreamCreate*'s
  std::atomic<bool> faulted{false};
  std::string fault;  // "<what>: <message>" of the first fault
};

struct Allocation {
  size_t bytes = 0;
  int device = 0;
};

std::string describe(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// The whole twin. The process's one instance (runtime(), below) is the one global mutable state of
// the SIMT emulator, as CUDA's runtime is process-wide: every host thread and every stream's worker
// reach the same devices, allocations and error messages through it.
class Runtime {
 public:
  Runtime() { configure(); }

  // ---- configuration ----
  int device_count() const { return static_cast<int>(devices_.size()); }
  const std::string& config_error() const { return config_error_; }
  size_t memory_limit() const { return memory_limit_; }

  // The device d, or null (with the error recorded) when there is none such.
  Device* device(int d, const char* call) {
    if (!config_error_.empty()) return fail_null(cudaErrorInitializationError, std::string(call) + ": " + config_error_);
    if (devices_.empty()) return fail_null(cudaErrorNoDevice, std::string(call) + ": TESSERA_SIMT_DEVICES=0");
    if (d < 0 || d >= device_count())
      return fail_null(cudaErrorInvalidDevice, std::string(call) + ": device " + std::to_string(d) + " of " +
                                                   std::to_string(device_count()) + " (TESSERA_SIMT_DEVICES)");
    return devices_[static_cast<size_t>(d)].get();
  }

  // ---- errors ----
  void set_last_error(cudaError_t e, const std::string& message) {
    this_thread.last_error = e;
    if (!message.empty()) set_message(e, message);
  }
  void set_message(cudaError_t e, const std::string& message) { set_message("cuda", e, message); }
  const char* message(cudaError_t e) { return message("cuda", e); }
  // The text of a library's status code (the runtime's own: "cuda").
  void set_message(const std::string& library, int code, const std::string& message) {
    std::lock_guard<std::mutex> lock(messages_mu_);
    // Interned: a pointer cudaGetErrorString returned stays valid after the next error.
    current_message_[{library, code}] = &*messages_.insert(message).first;
  }
  const char* message(const std::string& library, int code) {
    std::lock_guard<std::mutex> lock(messages_mu_);
    auto it = current_message_.find({library, code});
    return it == current_message_.end() ? nullptr : it->second->c_str();
  }
  cudaError_t fail(cudaError_t e, const std::string& message) {
    set_last_error(e, message);
    return e;
  }
  Device* fail_null(cudaError_t e, const std::string& message) {
    set_last_error(e, message);
    return nullptr;
  }
  // The device's sticky error, cudaSuccess when it has not faulted.
  static cudaError_t sticky(const Device& d) { return d.faulted ? cudaErrorLaunchFailure : cudaSuccess; }

  void fault(Device& d, const std::string& what, const std::string& message) {
    const std::string text = what + ": " + message;
    std::fprintf(stderr, "tessera simt: %s\n", text.c_str());
    {
      std::lock_guard<std::mutex> lock(d.mu);
      if (d.faulted) return;  // the first fault is the one reported
      d.fault = text;
      d.faulted = true;
    }
    set_message(cudaErrorLaunchFailure, text);
  }

  // ---- streams ----
  CUstream_st* create_stream(Device& d, bool blocking) {
    auto s = std::make_unique<CUstream_st>();
    s->device = d.index;
    s->blocking = blocking;
    start_worker(d, *s);
    std::lock_guard<std::mutex> lock(d.mu);
    d.streams.push_back(std::move(s));
    return d.streams.back().get();
  }

  // Waits for s's work, then joins its worker: nothing of a destroyed stream runs afterwards.
  bool destroy_stream(Device& d, CUstream_st* s) {
    s->queue->wait_for(s->queue->last());
    std::unique_ptr<CUstream_st> owned;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      for (auto it = d.streams.begin(); it != d.streams.end(); ++it)
        if (it->get() == s) {
          owned = std::move(*it);
          d.streams.erase(it);
          break;
        }
    }
    return owned != nullptr;  // its destructor joins the worker
  }

  // The stream a handle names: nullptr is the legacy default stream of the current device.
  CUstream_st* resolve(cudaStream_t s, const char* call) {
    if (s) return s;
    Device* d = device(this_thread.device, call);
    if (!d) return nullptr;
    std::lock_guard<std::mutex> lock(d->mu);
    if (!d->legacy) {
      d->legacy = std::make_unique<CUstream_st>();
      d->legacy->device = d->index;
      d->legacy->legacy = true;
      if (!shut_down_) start_worker(*d, *d->legacy);
    }
    return d->legacy.get();
  }

  // Queues work on s; its ticket. The legacy stream's work waits for every blocking stream's
  // earlier work, and a blocking stream's work for the legacy stream's earlier work (CUDA's
  // legacy default stream semantics).
  Ticket enqueue(CUstream_st& s, std::string what, std::function<void()> work, bool after_fault = false) {
    Device& d = *devices_[static_cast<size_t>(s.device)];
    Item item{std::move(what), std::move(work), {}, after_fault};
    if (shut_down_) {  // after main: run here and now (see ExitGuard)
      run(d, item);
      return {};
    }
    std::lock_guard<std::mutex> lock(d.mu);
    if (s.legacy) {
      for (const auto& other : d.streams)
        if (other->blocking && !other->queue->idle()) item.after.push_back({other->queue, other->queue->last()});
    } else if (s.blocking && d.legacy && !d.legacy->queue->idle()) {
      item.after.push_back({d.legacy->queue, d.legacy->queue->last()});
    }
    return {s.queue, s.queue->push(std::move(item))};
  }

  // What cudaStreamSynchronize(s) waits for: s's work; for the legacy stream also every blocking
  // stream's (an operation on the legacy stream waits for them).
  std::vector<Ticket> pending(Device& d, CUstream_st& s) {
    std::vector<Ticket> t{{s.queue, s.queue->last()}};
    if (s.legacy) {
      std::lock_guard<std::mutex> lock(d.mu);
      for (const auto& other : d.streams)
        if (other->blocking) t.push_back({other->queue, other->queue->last()});
    }
    return t;
  }

  // Every stream's work queued so far on d.
  std::vector<Ticket> all_pending(Device& d) {
    std::vector<Ticket> t;
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.legacy) t.push_back({d.legacy->queue, d.legacy->queue->last()});
    for (const auto& s : d.streams) t.push_back({s->queue, s->queue->last()});
    return t;
  }
  void synchronize(Device& d) {
    for (const Ticket& t : all_pending(d)) wait(t);
  }
  void synchronize_all() {
    for (auto& d : devices_) synchronize(*d);
  }

  // ---- memory ----
  cudaError_t allocate(Device& d, void** p, size_t bytes, const char* call) {
    if (!p) return fail(cudaErrorInvalidValue, std::string(call) + ": the pointer to the result is null");
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    {
      std::lock_guard<std::mutex> lock(memory_mu_);
      if (in_use_[d.index] + bytes > memory_limit_ || bytes > memory_limit_)
        return fail(cudaErrorMemoryAllocation,
                    std::string(call) + ": " + std::to_string(bytes) + " bytes on device " + std::to_string(d.index) +
                        " exceed its memory (" + std::to_string(memory_limit_) + " bytes, TESSERA_SIMT_DEVICE_MEMORY_GIB; " +
                        std::to_string(in_use_[d.index]) + " in use)");
      in_use_[d.index] += bytes;
    }
    // Exactly `bytes`, so that AddressSanitizer sees one element past the end.
    void* m = nullptr;
    if (posix_memalign(&m, kAlignment, bytes) != 0) {
      std::lock_guard<std::mutex> lock(memory_mu_);
      in_use_[d.index] -= bytes;
      return fail(cudaErrorMemoryAllocation, std::string(call) + ": the host is out of memory for " +
                                                 std::to_string(bytes) + " bytes");
    }
    std::lock_guard<std::mutex> lock(memory_mu_);
    allocations_[reinterpret_cast<uintptr_t>(m)] = Allocation{bytes, d.index};
    *p = m;
    return cudaSuccess;
  }

  // Takes p out of the device allocations (its bytes stay counted until release); false when p
  // is not the start of one.
  bool unregister(void* p, Allocation& a) {
    std::lock_guard<std::mutex> lock(memory_mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations_.end()) return false;
    a = it->second;
    allocations_.erase(it);
    return true;
  }
  void release(void* p, const Allocation& a) {
    std::free(p);
    std::lock_guard<std::mutex> lock(memory_mu_);
    in_use_[a.device] -= a.bytes;
  }

  // Whether [p, p + bytes) lies within one device allocation.
  bool is_device_range(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mu_);
    return within(allocations_, p, bytes, [](const Allocation& a) { return a.bytes; });
  }
  // Whether p lies within memory from cudaHostAlloc/cudaMallocHost.
  bool is_pinned(const void* p) {
    std::lock_guard<std::mutex> lock(memory_mu_);
    return within(pinned_, p, 1, [](size_t b) { return b; });
  }

  cudaError_t host_allocate(void** p, size_t bytes, const char* call) {
    if (!p) return fail(cudaErrorInvalidValue, std::string(call) + ": the pointer to the result is null");
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (posix_memalign(p, kAlignment, bytes) != 0)
      return fail(cudaErrorMemoryAllocation, std::string(call) + ": the host is out of memory for " +
                                                 std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> lock(memory_mu_);
    pinned_[reinterpret_cast<uintptr_t>(*p)] = bytes;
    return cudaSuccess;
  }
  bool host_release(void* p) {
    {
      std::lock_guard<std::mutex> lock(memory_mu_);
      if (pinned_.erase(reinterpret_cast<uintptr_t>(p)) == 0) return false;
    }
    std::free(p);
    return true;
  }

  uint64_t next_serial() { return ++serial_; }

  // ---- process exit ----
  // Joins every worker once their queues are drained. The Runtime itself stays: a static object
  // destroyed later may still call in (a device_free in a destructor); its work then runs inline.
  void shut_down() {
    for (auto& d : devices_) {
      std::vector<CUstream_st*> streams;
      {
        std::lock_guard<std::mutex> lock(d->mu);
        if (d->legacy) streams.push_back(d->legacy.get());
        for (auto& s : d->streams) streams.push_back(s.get());
      }
      for (CUstream_st* s : streams) s->stop_worker();
    }
    shut_down_ = true;
  }

 private:
  void configure();
  void start_worker(Device& d, CUstream_st& s) {
    s.worker = std::thread([this, &d, q = s.queue] { work_loop(d, *q); });
  }

  void work_loop(Device& d, Queue& q) {
    this_thread.device = d.index;  // work that calls the runtime acts on the stream's device
    Item item;
    while (q.pop(item)) {
      run(d, item);
      item = Item{};  // release the work's captures before the host may see it finished
      q.finish_one();
    }
  }

  // Runs one piece of work after its dependencies, unless the device has faulted: then, as on a
  // GPU whose context is lost, the work is dropped (but still counts as finished, so nothing hangs).
  void run(Device& d, Item& item) {
    for (const Ticket& t : item.after) wait(t);
    if (d.faulted && !item.after_fault) return;
    try {
      item.work();
    } catch (const std::exception& e) {
      fault(d, item.what, e.what());
    } catch (...) {
      fault(d, item.what, "an exception that is not a std::exception");
    }
  }

  std::vector<std::unique_ptr<Device>> devices_;
  std::string config_error_;
  size_t memory_limit_ = 0;
  std::atomic<bool> shut_down_{false};
  std::atomic<uint64_t> serial_{0};

  std::mutex memory_mu_;
  std::map<uintptr_t, Allocation> allocations_;  // device memory by start address
  std::map<int, size_t> in_use_;                 // device -> bytes allocated
  std::map<uintptr_t, size_t> pinned_;           // cudaHostAlloc's, by start address

  template <class Map, class Size>
  static bool within(const Map& m, const void* p, size_t bytes, Size size) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    auto it = m.upper_bound(at);
    if (it == m.begin()) return false;
    --it;
    return at - it->first + bytes <= size(it->second);
  }

  std::mutex messages_mu_;
  std::set<std::string> messages_;
  std::map<std::pair<std::string, int>, const std::string*> current_message_;
};

// TESSERA_SIMT_DEVICES (default 1) devices of TESSERA_SIMT_DEVICE_MEMORY_GIB (default 16) GiB.
void Runtime::configure() {
  long devices = 1;
  double gib = 16;
  if (const char* v = std::getenv("TESSERA_SIMT_DEVICES")) {
    char* end = nullptr;
    devices = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || devices < 0 || devices > 1024) {
      config_error_ = std::string("TESSERA_SIMT_DEVICES=\"") + v + "\" is not a device count (0 to 1024)";
      devices = 0;
    }
  }
  if (const char* v = std::getenv("TESSERA_SIMT_DEVICE_MEMORY_GIB")) {
    char* end = nullptr;
    gib = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(gib > 0) || gib > 1e6) {
      config_error_ = std::string("TESSERA_SIMT_DEVICE_MEMORY_GIB=\"") + v + "\" is not a positive number of GiB";
      devices = 0;
    }
  }
  memory_limit_ = static_cast<size_t>(gib * double(size_t(1) << 30));
  for (int i = 0; i < devices; ++i) {
    devices_.push_back(std::make_unique<Device>());
    devices_.back()->index = i;
    in_use_[i] = 0;
  }
}

// Joins the workers after main returns (static destructors run in reverse order of construction:
// this one, made at the first runtime call, before objects made earlier, e.g. MPI's holder whose
// MPI_Finalize ran already inside main).
struct ExitGuard {
  Runtime& rt;
  ~ExitGuard() { rt.shut_down(); }
};

Runtime& runtime() {
  static Runtime* const rt = new Runtime();  // never deleted: see Runtime::shut_down
  static ExitGuard guard{*rt};
  return *rt;
}

// The device of the calling thread, or null with the error recorded.
Device* current(const char* call) { return runtime().device(this_thread.device, call); }

const char* default_message(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

// ---- memcpy and memset ----

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// The checks of a copy of `span` bytes from src to dst (for a 2D copy: from the first byte to the
// last one's end): a side the kind says is on the device must lie in one device allocation. With
// cudaMemcpyDefault (unified addressing) either side may be either.
cudaError_t check_copy(const char* call, void* dst, const void* src, size_t dst_span, size_t src_span,
                       cudaMemcpyKind kind) {
  Runtime& rt = runtime();
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return rt.fail(cudaErrorInvalidMemcpyDirection, std::string(call) + ": kind " + std::to_string(int(kind)) +
                                                        " is not a cudaMemcpyKind");
  if (dst_span == 0 && src_span == 0) return cudaSuccess;
  if (!dst || !src) return rt.fail(cudaErrorInvalidValue, std::string(call) + ": a null pointer");
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device && !rt.is_device_range(dst, dst_span))
    return rt.fail(cudaErrorInvalidValue, std::string(call) + " (" + kind_name(kind) + "): the destination " +
                                              describe(dst) + " + " + std::to_string(dst_span) +
                                              " bytes is not within one device allocation");
  if (src_device && !rt.is_device_range(src, src_span))
    return rt.fail(cudaErrorInvalidValue, std::string(call) + " (" + kind_name(kind) + "): the source " + describe(src) +
                                              " + " + std::to_string(src_span) +
                                              " bytes is not within one device allocation");
  return cudaSuccess;
}

// Queues work on s (resolved), returning the sticky error of its device if it has one.
cudaError_t queue_on(cudaStream_t s, const char* call, std::string what, std::function<void()> work, Ticket* t = nullptr) {
  Runtime& rt = runtime();
  CUstream_st* st = rt.resolve(s, call);
  if (!st) return tessera::simt::this_thread.last_error;
  Device& d = *rt.device(st->device, call);
  if (const cudaError_t e = Runtime::sticky(d)) return rt.fail(e, "");
  const Ticket ticket = rt.enqueue(*st, std::move(what), std::move(work));
  if (t) *t = ticket;
  return cudaSuccess;
}

// A synchronous call: queued on the current device's legacy stream, then waited for.
cudaError_t queue_and_wait(const char* call, std::string what, std::function<void()> work) {
  Ticket t;
  if (const cudaError_t e = queue_on(nullptr, call, std::move(what), std::move(work), &t)) return e;
  wait(t);
  Device& d = *runtime().device(current_device(), call);
  return Runtime::sticky(d) ? runtime().fail(cudaErrorLaunchFailure, "") : cudaSuccess;
}

// An asynchronous copy of `height` rows of `width` bytes (pitches dpitch, spitch; src_span bytes
// from src in all) with CUDA's rules for pageable host memory (not from cudaHostAlloc): from
// pageable memory the source is staged before the call returns (the caller may reuse it at
// once); into pageable memory, and host to host, the call returns once the copy is done. Only a
// copy between device and pinned memory, or device and device, returns before it runs.
cudaError_t queue_copy(const char* call, cudaStream_t stream, void* dst, const void* src, size_t width,
                       cudaMemcpyKind kind, size_t src_span, size_t height, size_t dpitch, size_t spitch) {
  Runtime& rt = runtime();
  const bool src_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost ||
                        (kind == cudaMemcpyDefault && !rt.is_device_range(src, 1));
  const bool dst_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
                        (kind == cudaMemcpyDefault && !rt.is_device_range(dst, 1));
  const bool wait_for_it = (src_host && dst_host) || (dst_host && !rt.is_pinned(dst));
  std::shared_ptr<std::vector<char>> staged;
  if (src_host && !dst_host && !rt.is_pinned(src)) {
    staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + src_span);
    src = staged->data();
  }
  auto copy = [=, keep = staged] {
    for (size_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  };
  Ticket t;
  if (const cudaError_t e = queue_on(stream, call, call, copy, &t)) return e;
  if (!wait_for_it) return cudaSuccess;
  wait(t);
  Device& d = *rt.device(current_device(), call);
  return Runtime::sticky(d) ? rt.fail(cudaErrorLaunchFailure, "") : cudaSuccess;
}

cudaError_t wait_all(Device& d, const std::vector<Ticket>& tickets) {
  for (const Ticket& t : tickets) wait(t);
  if (const cudaError_t e = Runtime::sticky(d)) return runtime().fail(e, "");
  return cudaSuccess;
}

CUevent_st* checked(cudaEvent_t e, const char* call) {
  if (!e) runtime().fail(cudaErrorInvalidResourceHandle, std::string(call) + ": a null event");
  return e;
}

std::shared_ptr<CUevent_st::Marker> latest(CUevent_st& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  return e.last;
}

}  // namespace

// ---- kernels/simt/stream.h ----

void enqueue(cudaStream_t s, std::string what, std::function<void()> work) {
  queue_on(s, "kernel launch", std::move(what), std::move(work));
}

void set_last_error(cudaError_t e, const std::string& message) { runtime().set_last_error(e, message); }

int current_device() { return this_thread.device; }

// ---- kernels/simt/twin.h ----

bool is_device_range(const void* p, size_t bytes) { return runtime().is_device_range(p, bytes); }

void report(const char* library, int code, const std::string& message) {
  std::fprintf(stderr, "tessera simt: %s\n", message.c_str());
  runtime().set_message(library, code, message);
}

const char* reported(const char* library, int code) { return runtime().message(library, code); }

uint64_t next_serial() { return runtime().next_serial(); }

}  // namespace tessera::simt

using tessera::simt::Device;
using tessera::simt::runtime;
using tessera::simt::Runtime;
using tessera::simt::Ticket;

// ---- devices and versions ----

cudaError_t cudaGetDeviceCount(int* count) {
  Runtime& rt = runtime();
  if (!count) return rt.fail(cudaErrorInvalidValue, "cudaGetDeviceCount: count is null");
  *count = 0;
  if (!rt.config_error().empty()) return rt.fail(cudaErrorInitializationError, "tessera simt: " + rt.config_error());
  *count = rt.device_count();
  return *count == 0 ? rt.fail(cudaErrorNoDevice, "") : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!runtime().device(device, "cudaSetDevice")) return tessera::simt::this_thread.last_error;
  tessera::simt::this_thread.device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return runtime().fail(cudaErrorInvalidValue, "cudaGetDevice: device is null");
  *device = tessera::simt::this_thread.device;
  return cudaSuccess;
}

// An H100's numbers where the emulator has none of its own; the memory is the configured limit.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  Runtime& rt = runtime();
  if (!prop) return rt.fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: prop is null");
  if (!rt.device(device, "cudaGetDeviceProperties")) return tessera::simt::this_thread.last_error;
  cudaDeviceProp p{};
  std::snprintf(p.name, sizeof p.name, "tessera SIMT emulator (sm_90)");
  p.totalGlobalMem = rt.memory_limit();
  p.sharedMemPerBlock = 48 << 10;
  p.regsPerBlock = 65536;
  p.warpSize = 32;
  p.memPitch = size_t(1) << 31;
  p.maxThreadsPerBlock = 1024;
  p.maxThreadsDim[0] = 1024, p.maxThreadsDim[1] = 1024, p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 2147483647, p.maxGridSize[1] = 65535, p.maxGridSize[2] = 65535;
  p.totalConstMem = 64 << 10;
  p.major = 9;
  p.minor = 0;
  p.textureAlignment = 512;
  p.multiProcessorCount = 132;
  p.canMapHostMemory = 1;
  p.concurrentKernels = 1;
  p.pciBusID = device;
  p.asyncEngineCount = 2;
  p.unifiedAddressing = 1;
  p.memoryBusWidth = 5120;
  p.l2CacheSize = 50 << 20;
  p.maxThreadsPerMultiProcessor = 2048;
  p.sharedMemPerMultiprocessor = 228 << 10;
  p.regsPerMultiprocessor = 65536;
  p.managedMemory = 1;
  p.concurrentManagedAccess = 1;
  p.sharedMemPerBlockOptin = 232448;  // 227 KiB
  p.maxBlocksPerMultiProcessor = 32;
  *prop = p;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (!runtimeVersion) return runtime().fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: the pointer is null");
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Device* d = tessera::simt::current("cudaDeviceSynchronize");
  if (!d) return tessera::simt::this_thread.last_error;
  return tessera::simt::wait_all(*d, runtime().all_pending(*d));
}

cudaError_t cudaDeviceReset() {
  Device* d = tessera::simt::current("cudaDeviceReset");
  if (!d) return tessera::simt::this_thread.last_error;
  runtime().synchronize(*d);
  std::lock_guard<std::mutex> lock(d->mu);
  d->faulted = false;
  d->fault.clear();
  tessera::simt::this_thread.last_error = cudaSuccess;
  return cudaSuccess;
}

// ---- errors ----

// The sticky error of the current device comes first: it cannot be cleared.
cudaError_t cudaGetLastError() {
  const cudaError_t e = cudaPeekAtLastError();
  tessera::simt::this_thread.last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  Runtime& rt = runtime();
  const int d = tessera::simt::this_thread.device;
  if (rt.config_error().empty() && d >= 0 && d < rt.device_count()) {
    if (const cudaError_t e = Runtime::sticky(*rt.device(d, "cudaGetLastError"))) return e;
  }
  return tessera::simt::this_thread.last_error;
}

const char* cudaGetErrorString(cudaError_t error) {
  if (error == cudaSuccess) return "no error";
  const char* m = runtime().message(error);
  return m ? m : tessera::simt::default_message(error);
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

// ---- memory ----

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  Device* d = tessera::simt::current("cudaMalloc");
  if (!d) return tessera::simt::this_thread.last_error;
  if (const cudaError_t e = Runtime::sticky(*d)) return runtime().fail(e, "");
  return runtime().allocate(*d, devPtr, size, "cudaMalloc");
}

// As CUDA's, cudaFree first waits for the device's work (its implicit synchronisation).
cudaError_t cudaFree(void* devPtr) {
  Runtime& rt = runtime();
  if (!devPtr) return cudaSuccess;
  tessera::simt::Allocation a;
  if (!rt.unregister(devPtr, a))
    return rt.fail(cudaErrorInvalidValue, "cudaFree: " + tessera::simt::describe(devPtr) +
                                              " is not a device allocation (freed already, or never from cudaMalloc)");
  Device& d = *rt.device(a.device, "cudaFree");
  rt.synchronize(d);
  rt.release(devPtr, a);
  return Runtime::sticky(d) ? rt.fail(cudaErrorLaunchFailure, "") : cudaSuccess;
}

// Allocated at once (CUDA's pool may delay nothing a correct program could see); counted
// against the device where the stream is.
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  Runtime& rt = runtime();
  CUstream_st* st = rt.resolve(stream, "cudaMallocAsync");
  if (!st) return tessera::simt::this_thread.last_error;
  Device& d = *rt.device(st->device, "cudaMallocAsync");
  if (const cudaError_t e = Runtime::sticky(d)) return rt.fail(e, "");
  return rt.allocate(d, devPtr, size, "cudaMallocAsync");
}

// The free is queued on the stream: work queued before it still sees the memory.
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  Runtime& rt = runtime();
  if (!devPtr) return cudaSuccess;
  tessera::simt::Allocation a;
  if (!rt.unregister(devPtr, a))
    return rt.fail(cudaErrorInvalidValue, "cudaFreeAsync: " + tessera::simt::describe(devPtr) +
                                              " is not a device allocation (freed already, or never allocated)");
  CUstream_st* st = rt.resolve(stream, "cudaFreeAsync");
  if (!st) {  // no stream to free it on: free it now
    rt.release(devPtr, a);
    return tessera::simt::this_thread.last_error;
  }
  // Queued even on a faulted device, and run there: the host memory is released either way.
  rt.enqueue(*st, "cudaFreeAsync", [devPtr, a] { runtime().release(devPtr, a); }, true);
  return Runtime::sticky(*rt.device(st->device, "cudaFreeAsync")) ? rt.fail(cudaErrorLaunchFailure, "") : cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (flags & ~unsigned(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
    return runtime().fail(cudaErrorInvalidValue, "cudaHostAlloc: unknown flags " + std::to_string(flags));
  return runtime().host_allocate(pHost, size, "cudaHostAlloc");
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return runtime().host_allocate(ptr, size, "cudaMallocHost"); }

// Pinned memory may be the source or target of any device's queued copy: all devices are waited for.
cudaError_t cudaFreeHost(void* ptr) {
  Runtime& rt = runtime();
  if (!ptr) return cudaSuccess;
  rt.synchronize_all();
  if (!rt.host_release(ptr))
    return rt.fail(cudaErrorInvalidValue,
                   "cudaFreeHost: " + tessera::simt::describe(ptr) + " is not from cudaHostAlloc/cudaMallocHost");
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (const cudaError_t e = tessera::simt::check_copy("cudaMemcpyAsync", dst, src, count, count, kind)) return e;
  if (count == 0) return cudaSuccess;
  // memcpy, not memmove: overlapping ranges are undefined in CUDA, and AddressSanitizer says so.
  return tessera::simt::queue_copy("cudaMemcpyAsync", stream, dst, src, count, kind, count, 1, count, count);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = tessera::simt::check_copy("cudaMemcpy", dst, src, count, count, kind)) return e;
  if (count == 0) return cudaSuccess;
  return tessera::simt::queue_and_wait("cudaMemcpy", "cudaMemcpy", [dst, src, count] { std::memcpy(dst, src, count); });
}

// height rows of width bytes, rows dpitch and spitch bytes apart.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  Runtime& rt = runtime();
  if (width > dpitch || width > spitch)
    return rt.fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync: the width (" + std::to_string(width) +
                                              " bytes) exceeds a pitch (dpitch " + std::to_string(dpitch) +
                                              ", spitch " + std::to_string(spitch) + ")");
  if (width == 0 || height == 0) return tessera::simt::check_copy("cudaMemcpy2DAsync", dst, src, 0, 0, kind);
  const size_t dst_span = dpitch * (height - 1) + width, src_span = spitch * (height - 1) + width;
  if (const cudaError_t e = tessera::simt::check_copy("cudaMemcpy2DAsync", dst, src, dst_span, src_span, kind)) return e;
  return tessera::simt::queue_copy("cudaMemcpy2DAsync", stream, dst, src, width, kind, src_span, height, dpitch, spitch);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  Runtime& rt = runtime();
  if (count == 0) return cudaSuccess;
  if (!rt.is_device_range(devPtr, count))
    return rt.fail(cudaErrorInvalidValue, "cudaMemsetAsync: " + tessera::simt::describe(devPtr) + " + " +
                                              std::to_string(count) + " bytes is not within one device allocation");
  return tessera::simt::queue_on(stream, "cudaMemsetAsync", "cudaMemsetAsync",
                                 [devPtr, value, count] { std::memset(devPtr, value, count); });
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  Runtime& rt = runtime();
  if (count == 0) return cudaSuccess;
  if (!rt.is_device_range(devPtr, count))
    return rt.fail(cudaErrorInvalidValue, "cudaMemset: " + tessera::simt::describe(devPtr) + " + " +
                                              std::to_string(count) + " bytes is not within one device allocation");
  return tessera::simt::queue_and_wait("cudaMemset", "cudaMemset",
                                       [devPtr, value, count] { std::memset(devPtr, value, count); });
}

// ---- streams ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  Runtime& rt = runtime();
  if (!pStream) return rt.fail(cudaErrorInvalidValue, "cudaStreamCreate: pStream is null");
  if (flags & ~unsigned(cudaStreamNonBlocking))
    return rt.fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: unknown flags " + std::to_string(flags));
  Device* d = tessera::simt::current("cudaStreamCreate");
  if (!d) return tessera::simt::this_thread.last_error;
  if (const cudaError_t e = Runtime::sticky(*d)) return rt.fail(e, "");
  *pStream = rt.create_stream(*d, (flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithFlags(pStream, cudaStreamDefault); }

// Unlike CUDA, which returns at once and lets the work finish, this waits for the stream's work
// and joins its worker: nothing of the stream outlives the call (and MPI_Finalize after it is safe).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Runtime& rt = runtime();
  if (!stream) return rt.fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: the legacy default stream (null)");
  Device& d = *rt.device(stream->device, "cudaStreamDestroy");
  if (!rt.destroy_stream(d, stream))
    return rt.fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a live stream");
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Runtime& rt = runtime();
  CUstream_st* st = rt.resolve(stream, "cudaStreamSynchronize");
  if (!st) return tessera::simt::this_thread.last_error;
  Device& d = *rt.device(st->device, "cudaStreamSynchronize");
  return tessera::simt::wait_all(d, rt.pending(d, *st));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Runtime& rt = runtime();
  CUstream_st* st = rt.resolve(stream, "cudaStreamQuery");
  if (!st) return tessera::simt::this_thread.last_error;
  Device& d = *rt.device(st->device, "cudaStreamQuery");
  if (const cudaError_t e = Runtime::sticky(d)) return rt.fail(e, "");
  for (const Ticket& t : rt.pending(d, *st))
    if (!tessera::simt::finished(t)) return cudaErrorNotReady;
  return cudaSuccess;
}

// The stream's later work waits for the event's latest record (as of this call).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Runtime& rt = runtime();
  CUevent_st* e = tessera::simt::checked(event, "cudaStreamWaitEvent");
  if (!e) return cudaErrorInvalidResourceHandle;
  if (flags != 0) return rt.fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags " + std::to_string(flags));
  const auto marker = tessera::simt::latest(*e);
  if (!marker) return cudaSuccess;  // never recorded: nothing to wait for
  return tessera::simt::queue_on(stream, "cudaStreamWaitEvent", "cudaStreamWaitEvent",
                                 [done = marker->done] { tessera::simt::wait(done); });
}

// ---- events ----

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Runtime& rt = runtime();
  if (!event) return rt.fail(cudaErrorInvalidValue, "cudaEventCreate: event is null");
  if (flags & ~unsigned(cudaEventBlockingSync | cudaEventDisableTiming))
    return rt.fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: unsupported flags " + std::to_string(flags));
  auto* e = new CUevent_st();
  e->flags = flags;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// A marker queued on the stream: complete once the work queued before it is.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUevent_st* e = tessera::simt::checked(event, "cudaEventRecord");
  if (!e) return cudaErrorInvalidResourceHandle;
  auto marker = std::make_shared<CUevent_st::Marker>();
  Ticket t;
  const cudaError_t err = tessera::simt::queue_on(stream, "cudaEventRecord", "cudaEventRecord",
                                                  [marker] { marker->at = tessera::simt::Clock::now(); }, &t);
  if (err != cudaSuccess) return err;
  // The ticket is known only once queued; readers look at it only after this assignment.
  marker->done = t;
  std::lock_guard<std::mutex> lock(e->mu);
  e->last = std::move(marker);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  CUevent_st* e = tessera::simt::checked(event, "cudaEventSynchronize");
  if (!e) return cudaErrorInvalidResourceHandle;
  const auto marker = tessera::simt::latest(*e);
  if (!marker) return cudaSuccess;
  tessera::simt::wait(marker->done);
  Device* d = tessera::simt::current("cudaEventSynchronize");
  if (!d) return tessera::simt::this_thread.last_error;
  return Runtime::sticky(*d) ? runtime().fail(cudaErrorLaunchFailure, "") : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  CUevent_st* e = tessera::simt::checked(event, "cudaEventQuery");
  if (!e) return cudaErrorInvalidResourceHandle;
  Device* d = tessera::simt::current("cudaEventQuery");
  if (!d) return tessera::simt::this_thread.last_error;
  if (const cudaError_t err = Runtime::sticky(*d)) return runtime().fail(err, "");
  const auto marker = tessera::simt::latest(*e);
  if (!marker || tessera::simt::finished(marker->done)) return cudaSuccess;
  return cudaErrorNotReady;  // not an error: CUDA does not record it as the last error
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Runtime& rt = runtime();
  if (!ms) return rt.fail(cudaErrorInvalidValue, "cudaEventElapsedTime: ms is null");
  CUevent_st* a = tessera::simt::checked(start, "cudaEventElapsedTime");
  CUevent_st* b = tessera::simt::checked(end, "cudaEventElapsedTime");
  if (!a || !b) return cudaErrorInvalidResourceHandle;
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return rt.fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event created with cudaEventDisableTiming");
  const auto ma = tessera::simt::latest(*a), mb = tessera::simt::latest(*b);
  if (!ma || !mb) return rt.fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event never recorded");
  if (!tessera::simt::finished(ma->done) || !tessera::simt::finished(mb->done)) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(mb->at - ma->at).count();
  return cudaSuccess;
}

// Work still queued keeps the event's marker alive, as CUDA releases a pending event on completion.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  CUevent_st* e = tessera::simt::checked(event, "cudaEventDestroy");
  if (!e) return cudaErrorInvalidResourceHandle;
  delete e;
  return cudaSuccess;
}
