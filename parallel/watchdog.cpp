// Watchdog: lock-free wait slots (a clock read and atomic stores per wait) and the thread that
// looks for a wait past its allowance and reports it once.
#include "parallel/watchdog.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <sstream>

#include "kernels/allocator.h"
#include "kernels/check.h"

namespace tessera {

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "12:00:01", local wall-clock time of a steady-clock instant in the past.
std::string wall_clock_at(int64_t then_ns, int64_t now_ns) {
  const auto then = std::chrono::system_clock::now() - std::chrono::nanoseconds(now_ns - then_ns);
  const std::time_t t = std::chrono::system_clock::to_time_t(then);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

// A measured duration: "2.1 s" (always one decimal, so that 2.0 reads as measured).
std::string seconds(double s) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << s << " s";
  return os.str();
}

// Seconds to nanoseconds; 0 for a value that is not positive (or NaN); at most 1e9 s (31 years:
// never), so that a huge or infinite allowance cannot overflow.
int64_t allowance_ns(double s) {
  if (!(s > 0)) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::min(s, 1e9) * 1e9));
}

std::string join(const std::vector<int64_t>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

WaitSlot::WaitSlot(std::string group, std::vector<int64_t> world_ranks, double allowance_s)
    : group_(std::move(group)), world_ranks_(std::move(world_ranks)), allowance_ns_(allowance_ns(allowance_s)) {
  TESSERA_CHECK(allowance_ns_ > 0, "WaitSlot ", group_, ": the allowance must be a positive number of seconds, got ",
                allowance_s);
}

void WaitSlot::begin(const char* what, int64_t bytes, int peer) noexcept {
  // What the wait is, then when it began: a watchdog that sees since_ns_ (acquire) sees the rest.
  what_.store(what, std::memory_order_relaxed);
  bytes_.store(bytes, std::memory_order_relaxed);
  peer_.store(peer, std::memory_order_relaxed);
  since_ns_.store(std::max<int64_t>(1, steady_ns()), std::memory_order_release);
}

Watchdog::Watchdog(int64_t world_rank, OnTimeout on_timeout)
    : world_rank_(world_rank), on_timeout_(std::move(on_timeout)), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

WaitSlot& Watchdog::add_slot(std::string group, std::vector<int64_t> world_ranks, double allowance_s) {
  auto slot = std::make_unique<WaitSlot>(std::move(group), std::move(world_ranks), allowance_s);
  std::lock_guard lock(mutex_);
  slots_.push_back(std::move(slot));
  wake_.notify_all();  // a shorter allowance may shorten the poll interval
  return *slots_.back();
}

// A tenth of the shortest allowance (a wait is reported at most 10% late), between 10 ms (no busy
// thread) and 1 s (a production timeout of minutes needs no finer look).
int64_t Watchdog::poll_ns() const {
  int64_t shortest = INT64_MAX;
  for (const auto& s : slots_) shortest = std::min(shortest, s->allowance_ns_);
  return std::clamp<int64_t>(shortest / 10, 10'000'000, 1'000'000'000);
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::nanoseconds(poll_ns()));
    if (stopping_) break;
    std::vector<std::string> reports = late_reports(steady_ns());
    if (reports.empty()) continue;
    lock.unlock();  // on_timeout may block (the app waits for its message to get out) or return
    for (const std::string& r : reports) on_timeout_(r);
    lock.lock();
  }
}

std::vector<std::string> Watchdog::late_reports(int64_t now_ns) {
  std::vector<std::string> reports;
  for (const auto& late : slots_) {
    const int64_t since = late->since_ns_.load(std::memory_order_acquire);
    if (since == 0 || since == late->reported_ns_ || now_ns - since < late->allowance_ns_) continue;
    const char* what = late->what_.load(std::memory_order_relaxed);
    const int64_t bytes = late->bytes_.load(std::memory_order_relaxed);
    const int peer = late->peer_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (late->since_ns_.load(std::memory_order_relaxed) != since) continue;  // it just ended: not stuck
    late->reported_ns_ = since;
    std::string report = describe(*late, what, bytes, peer, since, now_ns);
    // Anything else this rank waits for (e.g. the checkpoint writer while training waits on a peer).
    for (const auto& other : slots_) {
      const int64_t other_since = other->since_ns_.load(std::memory_order_acquire);
      if (other.get() == late.get() || other_since == 0) continue;
      report += "; also waiting " + seconds(static_cast<double>(now_ns - other_since) * 1e-9) + " in " +
                other->what_.load(std::memory_order_relaxed) + " on the " + other->group_;
    }
    reports.push_back(std::move(report));
  }
  return reports;
}

// "world rank 0 waited 2.1 s (allowed 2 s, since 12:00:01) in all_reduce of 24 B on the dp group
// (world ranks 0, 1) for world rank 1: ..."
std::string Watchdog::describe(const WaitSlot& s, const char* what, int64_t bytes, int peer, int64_t since_ns,
                               int64_t now_ns) const {
  std::ostringstream os;
  os << "world rank " << world_rank_ << " waited " << seconds(static_cast<double>(now_ns - since_ns) * 1e-9)
     << " (allowed " << s.allowance_s() << " s, since " << wall_clock_at(since_ns, now_ns) << ") in " << what;
  if (bytes > 0) os << " of " << format_bytes(static_cast<size_t>(bytes));
  os << " on the " << s.group_ << " (world ranks " << join(s.world_ranks_) << ")";
  const bool p2p = peer >= 0 && static_cast<size_t>(peer) < s.world_ranks_.size();
  if (p2p) {
    os << " for world rank " << s.world_ranks_[static_cast<size_t>(peer)]
       << ", which has not come (stopped, hung or dead)";
    return os.str();
  }
  std::vector<int64_t> peers;
  for (int64_t r : s.world_ranks_)
    if (r != world_rank_) peers.push_back(r);
  os << " for world rank" << (peers.size() > 1 ? "s " : " ") << join(peers)
     << (peers.size() > 1 ? ", one of which has" : ", which has")
     << " not come (stopped, hung or dead); every rank still waiting reports itself like this, so one that "
        "does not is the likely culprit";
  return os.str();
}

}  // namespace tessera
