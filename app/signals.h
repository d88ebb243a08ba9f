// Clean stop on Ctrl-C (SIGINT), and preemption on SIGTERM or SIGUSR1 (what Slurm sends before a
// time limit): the first signal only sets a flag, which the trainer polls at step boundaries,
// between evaluation batches and while it waits for data, then saves and exits. A second signal
// (over 0.25 s after the first: closer ones are one signal delivered twice) exits at once, code
// 128 + signal, waiting for nothing. The flags are the process-wide variables: a signal handler
// can reach nothing else.
#pragma once

namespace tessera {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  bool requested() const;
  int signal_number() const;  // which signal asked first, 0 if none
};

}  // namespace tessera
