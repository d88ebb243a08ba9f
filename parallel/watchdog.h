// Watchdog: a thread that watches the run's blocking waits (collectives, point-to-point transfers,
// whole regions such as waiting for a checkpoint save) and, when one has lasted past its allowance,
// hands its owner a report naming the wait, its group's world ranks and this rank (the owner then
// ends the job). It knows nothing of MPI: any backend's wait registers through a WaitSlot, at the
// cost of one clock read and a few atomic stores per wait.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

// One place that waits: a communicator, or a region of the run. Used by one thread at a time
// (begin/end never nest on one slot); the watchdog thread reads it concurrently, without locks.
class WaitSlot {
 public:
  // group: what the report calls it ("dp group"); world_ranks: its members; allowance_s > 0
  // (beyond 1e9 s, including infinity: never).
  WaitSlot(std::string group, std::vector<int64_t> world_ranks, double allowance_s);
  WaitSlot(const WaitSlot&) = delete;
  WaitSlot& operator=(const WaitSlot&) = delete;

  // what: a string literal ("all_reduce"), kept by pointer; bytes: the payload (0: none);
  // peer: the other rank's position in the group for point-to-point ops, -1 for collectives.
  void begin(const char* what, int64_t bytes, int peer = -1) noexcept;
  void end() noexcept { since_ns_.store(0, std::memory_order_release); }

  const std::string& group() const { return group_; }
  const std::vector<int64_t>& world_ranks() const { return world_ranks_; }
  double allowance_s() const { return static_cast<double>(allowance_ns_) * 1e-9; }

 private:
  friend class Watchdog;
  const std::string group_;
  const std::vector<int64_t> world_ranks_;
  const int64_t allowance_ns_;
  std::atomic<int64_t> since_ns_{0};  // steady clock at begin(); 0 = not waiting
  std::atomic<const char*> what_{""};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int> peer_{-1};
  int64_t reported_ns_ = 0;  // watchdog thread only: since_ns_ of the wait last reported
};

// RAII: a wait on `slot` for its scope. A null slot (nothing watches) costs one branch.
class WatchedWait {
 public:
  WatchedWait(WaitSlot* slot, const char* what, int64_t bytes = 0, int peer = -1) noexcept : slot_(slot) {
    if (slot_) slot_->begin(what, bytes, peer);
  }
  ~WatchedWait() {
    if (slot_) slot_->end();
  }
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

 private:
  WaitSlot* slot_;
};

// Owns the slots and the thread that checks them: every allowance / 10 (between 10 ms and 1 s) it
// looks for a wait older than its slot's allowance and calls on_timeout(report) for it, once per
// wait, on the watchdog thread. on_timeout normally ends the job and does not return (the app
// calls MPI_Abort); a test's records the report, and the watch goes on.
class Watchdog {
 public:
  using OnTimeout = std::function<void(const std::string& report)>;
  Watchdog(int64_t world_rank, OnTimeout on_timeout);
  ~Watchdog();  // stops and joins the thread; slots die with it, so it outlives their users
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A new slot owned by the watchdog (its address is stable).
  WaitSlot& add_slot(std::string group, std::vector<int64_t> world_ranks, double allowance_s);

 private:
  void run();
  std::vector<std::string> late_reports(int64_t now_ns);  // under mutex_
  std::string describe(const WaitSlot& s, const char* what, int64_t bytes, int peer, int64_t since_ns,
                       int64_t now_ns) const;
  int64_t poll_ns() const;  // under mutex_

  const int64_t world_rank_;
  const OnTimeout on_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<WaitSlot>> slots_;
  std::thread thread_;  // last: started once everything it reads exists
};

}  // namespace tessera
