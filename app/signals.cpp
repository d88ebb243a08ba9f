// Signal flag and handler installation (sigaction). The handler uses only async-signal-safe calls:
// a lock-free atomic, write(2) and _exit(2).
#include "app/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <ctime>

namespace tessera {

namespace {
std::atomic<int> g_stop_signal{0};       // written only by the handler, read by the loop
std::atomic<int64_t> g_first_signal_ns{0};  // when the first signal came (CLOCK_MONOTONIC)
struct sigaction g_old_int, g_old_term, g_old_usr1;

static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the signal flags must be lock-free to be set in a handler");

// A signal this soon after the first is the same request delivered twice (a scheduler signalling
// every process of a job while a launcher forwards it too), not a second one from a person.
constexpr int64_t kDuplicateWindowNs = 250'000'000;

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal";
  }
}

void write_stderr(const char* s) {
  // Nothing to do if stderr is gone; the exit below happens regardless.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, s, std::strlen(s));
}

// The first signal asks for a graceful stop (save, then exit); a second one, while that is under
// way or still pending, means "now": the previous checkpoint on disk stays intact (saves are
// written under a temporary name and renamed), only the one in progress is lost.
void on_signal(int sig) {
  const int64_t now = monotonic_ns();
  int64_t first = 0;  // the time is claimed first, so a duplicate on another thread sees it
  if (g_first_signal_ns.compare_exchange_strong(first, now)) {
    g_stop_signal.store(sig);
    return;
  }
  if (now - first < kDuplicateWindowNs) return;
  write_stderr("\ntessera: second signal (");
  write_stderr(signal_name(sig));
  write_stderr("): exiting now, without waiting for the checkpoint\n");
  ::_exit(128 + sig);
}
}  // namespace

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  g_first_signal_ns.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  // Interrupted system calls (file writes, reads) restart: the trainer polls the flag instead.
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
}

bool StopSignals::requested() const { return g_stop_signal.load() != 0; }
int StopSignals::signal_number() const { return g_stop_signal.load(); }

}  // namespace tessera
