// `tessera train`: builds data, model and optimizer from a Config and runs the training loop with
// evaluation, progress output, metrics.jsonl, non-finite step skipping and a clean Ctrl-C stop.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include <optional>
#include <utility>

#include "app/checkpointing.h"
#include "app/config.h"
#include "app/dp_optimizer.h"
#include "app/metrics.h"
#include "app/signals.h"
#include "app/training_data.h"
#include "data/addition.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "kernels/allocator.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "optim/schedule.h"
#include "parallel/grid_comms.h"
#include "parallel/process_grid.h"

namespace tessera {

// Exit codes of `tessera train` (docs/training.md).
// 75 (EX_TEMPFAIL): preempted (SIGTERM/SIGUSR1), a checkpoint was saved; requeue to resume.
enum TrainExit : int { kExitOk = 0, kExitError = 1, kExitDiverged = 3, kExitPreempted = 75, kExitInterrupted = 130 };

struct TrainSummary {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;
  double last_loss = 0;
  double val_loss = -1;      // -1 when there is no validation data
  double val_accuracy = -1;  // -1 when the task has no accuracy
  double elapsed_s = 0;
  int exit_code = kExitOk;
};

class Trainer {
 public:
  // comm: the ranks training together (data parallel over all of them); MPI_COMM_NULL = one
  // process without MPI and without checkpoints (tests). run_dir "" writes no files;
  // checkpoints go to checkpoint.dir or <run_dir>/checkpoints, and checkpoint.resume decides
  // whether the run continues one.
  Trainer(const Config& cfg, const std::string& run_dir, MPI_Comm comm);
  TrainSummary run();

  struct StepResult {
    double loss = 0, grad_norm = 0, lr = 0;
    bool skipped = false;
    std::string problem;  // what went non-finite, when skipped
  };
  // One optimizer step (0-based s) over the global batch: accumulate micro-batches, clip, update.
  StepResult step(int64_t s);
  const ParameterStore& params() const { return *params_; }
  // The optimizer, for its moments (gather_state(): collective over dp under ZeRO-1); tests.
  DataParallelOptimizer& optimizer() { return *opt_; }
  int64_t start_step() const { return start_step_; }
  int64_t grad_accum_steps() const { return accum_; }

 private:
  double forward_backward(int64_t s);
  std::string nonfinite_report(double loss, double norm) const;
  void evaluate(int64_t s, TrainSummary& summary);
  void log_step(int64_t s, const StepResult& r, double step_seconds, double elapsed, bool record);
  void print_header();
  void save_checkpoint(int64_t steps_done);
  std::optional<std::pair<std::string, int>> stop_reason(const StopSignals& stop, int64_t done, double minutes);
  std::vector<ParamSegment> segments() const;

  Profiler* prof() { return profiling_ ? &profiler_ : nullptr; }
  void sum_partial_grads_over_tp();
  double global_grad_norm();
  // Sums a few scalars (loss, target counts) over the data-parallel group; no-op on one rank.
  void sum_over_dp(std::vector<double>& values);
  // Sums over every rank (signal and clock votes: all ranks must stop at the same step).
  void sum_over_world(std::vector<double>& values);

  Config cfg_;
  std::string run_dir_;
  ProcessGrid grid_;                  // tp x dp: the tp ranks of a replica share the model
  std::unique_ptr<GridComms> comms_;
  bool lead_ = true;                  // rank 0: prints, writes metrics
  int64_t accum_ = 1;
  TrainingData data_;
  Sampler sampler_;
  BatchLayout layout_;
  std::unique_ptr<DataLoader> loader_;  // created at the first step, positioned at it
  Allocator alloc_;
  std::unique_ptr<ParameterStore> params_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<DataParallelOptimizer> opt_;  // gradient reduction over dp, AdamW (parallel.zero)
  LrSchedule schedule_;
  MetricsWriter metrics_;
  Profiler profiler_;        // train.profile: where the step time goes, printed at log steps
  bool profiling_ = false;
  ProgressPrinter progress_;
  std::unique_ptr<CheckpointWriter> ckpt_;
  std::string resumed_from_;
  int64_t start_step_ = 0, consumed_at_start_ = 0;
  int64_t dp_bytes_at_record_ = 0, tp_bytes_at_record_ = 0, step_at_record_ = 0;  // communication accounting per record
  double flops_per_token_ = 0;
  double peak_flops_ = 0;
};

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string run_dir;  // empty: <log.dir>/<train.name>
  bool print_config = false;
};

// The whole command: load and validate the config, then train. Returns the exit code.
int run_train_command(const TrainArgs& args);

}  // namespace tessera
