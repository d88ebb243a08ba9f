// Signal flag and handler installation (sigaction).
#include "app/signals.h"

#include <atomic>
#include <csignal>

namespace tessera {

namespace {
std::atomic<int> g_stop_signal{0};  // written only by the handler, read by the loop
struct sigaction g_old_int, g_old_term, g_old_usr1;

void on_signal(int sig) { g_stop_signal.store(sig); }
}  // namespace

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
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
