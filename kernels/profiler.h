// Profiler: wall time and call counts per op family, for "where does a training step go" tables.
// No global state: the trainer owns one and passes a pointer; a null pointer disables timing.
//
//   Profiler prof;                                  // owned by the trainer
//   {
//     ProfileScope s(&prof, OpFamily::Matmul);      // or ProfileScope s(nullptr, ...): does nothing
//     linear_forward(...);
//   }
//   prof.end_step();                                // once per optimizer step
//   std::cout << prof.table();                      // family, ms/step, %, calls/step
//   prof.reset();                                   // start the next reporting window
//
// Scopes may nest; time is exclusive (self time): an attention scope that contains a matmul
// scope is charged only what the matmul did not take, so the families add up to the wall time
// of the outermost scopes. A Profiler is used from one thread (the training loop's); the OpenMP
// regions inside a scope are timed as part of it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

enum class OpFamily : uint8_t {
  Matmul,
  Attention,
  Norm,          // layernorm, rmsnorm
  Activation,    // gelu, swiglu
  Rope,
  Embedding,
  CrossEntropy,
  Elementwise,   // residual adds, scaling, copies
  AdamW,         // the optimizer step, gradient norm and clipping
  Communication, // MPI / NCCL calls and waits
  Other,
};
constexpr int kOpFamilyCount = static_cast<int>(OpFamily::Other) + 1;

// "matmul", "attention", "norm", "gelu/swiglu", "rope", "embedding", "cross_entropy",
// "elementwise", "adamw", "communication", "other".
const char* op_family_name(OpFamily f);

class Profiler {
 public:
  // Seconds from an arbitrary origin; steady_clock by default. Tests pass a fake clock.
  using ClockFn = double (*)();
  static double steady_seconds();

  explicit Profiler(ClockFn clock = &steady_seconds) : clock_(clock) {}

  // For a device that queues its ops (CUDA): called before every clock read of a scope, so that a
  // scope's time includes the device work it queued, not the work of the scopes before it (the
  // trainer passes the stream's synchronize under train.profile on a GPU: per-family times at
  // the price of a synchronization per scope). Empty (the default): no fence.
  void set_fence(std::function<void()> fence) { fence_ = std::move(fence); }

  struct Entry {
    double seconds = 0;  // exclusive wall time
    int64_t calls = 0;
  };

  // Charges time measured elsewhere (e.g. a wait timed by the caller) to a family.
  void add(OpFamily f, double seconds, int64_t calls = 1);
  // The clock's current reading (what scopes measure with), for callers timing spans themselves.
  double now() const { return clock_(); }
  // Communication hidden behind compute: of the time an asynchronous op was in flight (from its
  // start to the wait or test that saw it complete), what the host spent outside communication
  // (the caller charges its waits to OpFamily::Communication as exposed). Concurrent with the
  // families' time, so not part of total_seconds(); table() reports it in a row below the total.
  // An upper bound: an op may complete before the host looks.
  void add_hidden(double seconds) {
    hidden_seconds_ += seconds;
    ++hidden_calls_;
  }
  double hidden_seconds() const { return hidden_seconds_; }

  // What ProfileScope calls; open/close must pair up in LIFO order.
  void open(OpFamily f);
  void close();

  // Marks the end of an optimizer step: table() reports per-step averages over the steps since
  // the last reset().
  void end_step() { ++steps_; }
  // Zeroes every entry and the step count (open scopes must be closed first).
  void reset();

  const Entry& entry(OpFamily f) const { return entries_[static_cast<int>(f)]; }
  double total_seconds() const;
  int64_t total_calls() const;
  int64_t steps() const { return steps_; }
  int open_scopes() const { return static_cast<int>(stack_.size()); }

  // One row per family that was called, slowest first, then a total row:
  //   family           ms/step       %   calls/step
  //   matmul            812.40   71.3%          148
  // ms/step and calls/step divide by steps() (by 1 before the first end_step()). When any hidden
  // communication was added, a last row "comm hidden" (ms/step, its % of the total, ops/step)
  // follows the total: overlapped, so not counted in it.
  std::string table() const;

 private:
  struct Open {
    OpFamily family;
    double start;
    double child_seconds;  // time of scopes nested inside this one
  };
  ClockFn clock_;
  std::function<void()> fence_;
  std::array<Entry, kOpFamilyCount> entries_{};
  std::vector<Open> stack_;
  int64_t steps_ = 0;
  double hidden_seconds_ = 0;
  int64_t hidden_calls_ = 0;
};

// Times its lifetime into profiler's family; with a null profiler it does nothing (no clock read).
class ProfileScope {
 public:
  ProfileScope(Profiler* profiler, OpFamily family) : profiler_(profiler) {
    if (profiler_) profiler_->open(family);
  }
  ~ProfileScope() {
    if (profiler_) profiler_->close();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* profiler_;
};

}  // namespace tessera
