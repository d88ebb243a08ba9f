// Clean stop on Ctrl-C (SIGINT), and preemption on SIGTERM or SIGUSR1 (what Slurm sends before a
// time limit): the handler only sets a flag, which the training loop reads at step boundaries. The flag is the one process-wide variable: a signal handler can reach
// nothing else.
#pragma once

namespace tessera {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  bool requested() const;
  int signal_number() const;  // which signal asked, 0 if none
};

}  // namespace tessera
