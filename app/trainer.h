// `tessera train`: builds data, model and optimizer from a Config and runs the training loop with
// evaluation, progress output, metrics.jsonl, non-finite step skipping and a clean Ctrl-C stop.
#pragma once

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include <optional>
#include <set>
#include <utility>

#include "app/checkpoint/checkpointing.h"
#include "app/config.h"
#include "app/dynamic_cp.h"
#include "app/metrics.h"
#include "app/signals.h"
#include "app/token_batching.h"
#include "app/training_data.h"
#include "data/addition.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "optim/schedule.h"
#include "parallel/dp_optimizer.h"
#include "parallel/finalize_grads.h"
#include "parallel/flat_params.h"
#include "parallel/grid_comms.h"
#include "parallel/pipeline_timing.h"
#include "parallel/process_grid.h"
#include "parallel/tp_compression.h"
#include "parallel/watchdog.h"

namespace tessera {

// Exit codes of `tessera train` (docs/training.md).
// 75 (EX_TEMPFAIL): preempted (SIGTERM/SIGUSR1), a checkpoint was saved; requeue to resume.
// 124 (as timeout(1)): a rank waited past parallel.timeout_s for a peer and aborted the job.
enum TrainExit : int {
  kExitOk = 0,
  kExitError = 1,
  kExitDiverged = 3,
  kExitPreempted = 75,
  kExitCollectiveTimeout = 124,
  kExitInterrupted = 130
};

// parallel.timeout_s times this: waits that include work, not only peers (the setup, which may read
// a checkpoint; waiting for the checkpoint writer, which writes one).
inline constexpr double kRegionTimeoutFactor = 4.0;

// Reading training or validation data failed (a file truncated mid-run, a bad token id); thrown on
// every rank together, after a vote, before the step's parameters change.
class DataError : public Error {
 public:
  using Error::Error;
};

struct TrainSummary {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;
  double last_loss = std::numeric_limits<double>::quiet_NaN();  // NaN until a step completes
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
  // whether the run continues one. watchdog (null: none): every wait on a communicator is allowed
  // parallel.timeout_s, every wait for the checkpoint writer kRegionTimeoutFactor x that; it must
  // outlive the trainer.
  Trainer(const Config& cfg, const std::string& run_dir, MPI_Comm comm, Watchdog* watchdog = nullptr);
  TrainSummary run();

  struct StepResult {
    double loss = 0, grad_norm = 0, lr = 0;
    bool skipped = false;
    bool abandoned = false;  // a rank was asked to stop before the batches were read: nothing changed
    std::string problem;  // what went non-finite, when skipped
  };
  // One optimizer step (0-based s) over the global batch: accumulate micro-batches, clip, update.
  // Throws DataError (every rank) when a batch cannot be read.
  StepResult step(int64_t s);
  const ParameterStore& params() const { return *params_; }
  // parallel.cp_mode = "dynamic": its planner's counts and cost model (null for static cp).
  const DynamicCp* dynamic_cp() const { return dynamic_cp_.get(); }
  // The optimizer, for its moments (gather_state(): collective over dp under ZeRO-1); tests.
  DataParallelOptimizer& optimizer() { return *opt_; }
  int64_t start_step() const { return start_step_; }
  const std::string& resumed_from() const { return resumed_from_; }  // "" when it started fresh
  const Allocator& allocator() const { return alloc_; }
  int64_t grad_accum_steps() const { return accum_; }

 private:
  // The steps, evaluations and saves of run(); a stop (signal, exit_after_*, divergence) ends it early.
  void train_loop(const StopSignals& stop, TrainSummary& summary, std::chrono::steady_clock::time_point t_start);
  // The step's global mean loss and gradient norm, from forward_backward.
  struct Reduced {
    double loss = 0, grad_norm = 0;
  };
  std::optional<Reduced> forward_backward(int64_t s);
  // Under parallel.pp > 1: this stage's part of the step's micro-batches, by the pipeline schedule.
  void run_pipeline(int64_t s, const std::vector<Batch>& batches, double loss_scale, const Tensor& step_sums);
  Reduced finish_step(const Tensor& step_reads, double targets, bool has_loss);
  // Throws on every rank when the pipeline's copies of the tied embedding differ (`when`: where).
  void check_tied_copies(const std::string& when);
  std::string nonfinite_report(double loss, double norm);
  // False when abandoned (a rank was asked to stop): nothing is recorded.
  bool evaluate(int64_t s, TrainSummary& summary);
  void log_step(int64_t s, const StepResult& r, double step_seconds, double elapsed, bool record);
  void print_header();
  void save_checkpoint(int64_t steps_done);
  void wait_for_checkpoint();  // the pending save, watched
  // Saves the state after `done` steps unless it is on disk already, and says where it is.
  void save_after_stop(const std::string& why, int64_t done, const std::string& advice);
  std::optional<std::pair<std::string, int>> stop_reason(const StopSignals& stop, int64_t done, double minutes);
  // Collective over every rank, before each step's forwards and each evaluation forward: true when
  // any rank was asked to stop; DataError on every rank when any rank's read_error is not empty.
  bool vote_stop(const std::string& read_error);
  bool stop_requested() const { return signals_ && signals_->requested(); }
  std::vector<ParamSegment> segments() const;
  // The memory check (app/memory_check.h) of this run's model (mc: its config before any in-run
  // growth; frozen: train.freeze resolved for the model the run builds now), or with an [upscale]
  // section that grows it in this run (grows_later) of the larger of the model before the growth
  // and the grown one, train.freeze resolved for each; its header line.
  std::string check_memory(const std::string& ckpt_dir, const ModelConfig& mc, const std::set<std::string>& frozen,
                           bool grows_later, MPI_Comm comm) const;
  void build_model(const ModelConfig& mc, const std::set<std::string>& frozen);
  Gpt::GradsReady grads_hook();
  void apply_rewarm();
  // checkpoint.init_from: the fresh run's parameters from that file (collective over comm, or this
  // process alone when null); the line run() prints.
  void init_weights(const ModelConfig& model, MPI_Comm comm);
  // [upscale]: grows the model after `done` steps, in place (collective over every rank), onto
  // the layout of [upscale] tp, pp, dp when they change it.
  void grow(int64_t done);
  bool settle_growth(int64_t layers);
  void switch_layout(const ParallelConfig& next);
  std::string layout_text() const;

  Profiler* prof() { return profiling_ ? &profiler_ : nullptr; }
  // The gradient-reduction group, dp x cp (null on one rank); see the definition.
  Communicator* dp_cp_group();

  Config cfg_;
  std::string run_dir_;
  MPI_Comm world_ = MPI_COMM_NULL;
  Watchdog* watchdog_ = nullptr;  // null: none; every communicator is watched by it
  const StopSignals* signals_ = nullptr;  // while run() runs
  ProcessGrid grid_;                  // tp x dp: the tp ranks of a replica share the model
  std::unique_ptr<GridComms> comms_;
  ContextParallel cp_;                // parallel.cp: the cp group the model's attention spans
  bool lead_ = true;                  // rank 0: prints, writes metrics
  bool auto_micro_batch_ = false;     // train.micro_batch = 0: cfg_ holds the one chosen (header)
  int64_t accum_ = 1;
  TrainingData data_;
  Sampler sampler_;
  BatchLayout layout_;
  std::unique_ptr<DataLoader> loader_;  // created at the first step, positioned at it
  std::unique_ptr<TokenBatching> tokens_;  // data.batching = "tokens" (app/token_batching.h); null for windows
  std::unique_ptr<DynamicCp> dynamic_cp_;  // parallel.cp_mode = "dynamic" (app/dynamic_cp.h); null for static
  std::string dynamic_cp_line_;            // its cost model, for the header
  Device device_;          // train.device, resolved and agreed by every rank at start
  ComputeStream stream_;   // CUDA: the stream every op of the step and alloc_ use; CPU: none
  Allocator alloc_;        // on device_: the model, its gradients, the optimizer state, activations
  // Where the model and optimizer run: alloc_'s device and stream; on the CPU, alloc_ also serves
  // the ops' short-lived buffers (Exec::workspace).
  Exec ex_;
  // parallel.tp_comm_compression (null: exact): its error-feedback residuals live in alloc_ and
  // outlive the model chunks that point at it.
  std::unique_ptr<TpCompression> tp_compression_;
  std::unique_ptr<ParameterStore> params_;
  std::vector<std::unique_ptr<Gpt>> chunks_;  // this rank's model chunks: one, or vpp (interleaved)
  const Gpt* model_ = nullptr;                // chunks_.front(): the model's config, evaluation
  ModelConfig mc_;     // the model's config (resolved): its depth changes at an in-run growth
  TensorParallel tp_;  // the tp group the model's layers span (none when tp = 1)
  std::vector<std::string> frozen_;     // train.freeze resolved: global names, sorted
  std::vector<int> trainable_prefix_;   // trainable parameters among store ids [0, i)
  AttrMap upscale_record_;              // the /upscale record this run carries on (empty: none)
  std::string freeze_where_;            // where "original" looks, for messages
  int64_t growth_step_ = -1;            // the step the model grew at (rewarm_steps), -1: none
  FlatParams flat_;    // params_'s trainable flat buffers as parallel/ sees them
  GradGroups groups_;  // the groups finalize_grads sums over (all null on one rank)
  std::unique_ptr<DataParallelOptimizer> opt_;  // gradient reduction over dp x cp, AdamW (parallel.zero)
  LrSchedule schedule_;
  MetricsWriter metrics_;
  Profiler profiler_;        // train.profile: where the step time goes, printed at log steps
  bool profiling_ = false;
  ProgressPrinter progress_;
  std::unique_ptr<CheckpointWriter> ckpt_;
  WaitSlot* ckpt_wait_ = nullptr;  // the main thread waiting for the writer; null: not watched
  std::string resumed_from_;
  AttrMap lora_record_;           // [lora]: the /lora record its checkpoints carry (app/lora.h)
  std::string initialized_from_;  // checkpoint.init_from's report: what was loaded and what was kept
  std::string memory_line_;                   // the memory estimate, for the header
  std::string pp_cut_line_;                   // parallel.pp_cut = "measured": the cut and its times, for the header
  std::vector<std::string> resume_warnings_;  // keys changed since the checkpoint that change the data order
  int64_t start_step_ = 0, consumed_at_start_ = 0;
  int64_t saved_step_ = -1;  // the step of this run's last save
  // communication accounting per record
  int64_t dp_bytes_at_record_ = 0, tp_bytes_at_record_ = 0, pp_bytes_at_record_ = 0, step_at_record_ = 0;
  PipelineTimer pipeline_timer_;  // under pp: busy and idle time per step, since the last record
  int64_t cp_bytes_at_record_ = 0;
  double flops_per_token_ = 0;
  double peak_flops_ = 0;
};

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string run_dir;  // empty: <log.dir>/<train.name>
  bool print_config = false;
};

// The layout against the model (parallel/process_grid.h validate_grid): heads, KV heads, layers, MLP
// and sequence over tp, cp; the degrees against the world. The trainer runs it before building the
// model (tessera plan, on every layout it proposes).
void validate_layout(const Config& c, const ModelConfig& m, int64_t world);

// Keys that parse but whose features are not built yet (cp > 1) are refused rather than ignored: a
// tessera::Error naming them.
void check_supported(const Config& cfg);

// The whole command: load and validate the config, then train. Returns the exit code.
int run_train_command(const TrainArgs& args);

}  // namespace tessera
