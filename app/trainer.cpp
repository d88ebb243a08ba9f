// The training loop. Batch semantics follow Megatron: global_batch sequences per optimizer step,
// micro_batch sequences per forward, accumulation = global_batch / (micro_batch x dp).
#include "app/trainer.h"

#include <omp.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "app/build_info.h"
#include "app/evaluate.h"
#include "app/memory_check.h"
#include "app/preflight.h"
#include "kernels/backend_info.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "parallel/mpi.h"

namespace tessera {

static_assert(kIgnoreTarget == kIgnoreIndex, "data and kernels must agree on the ignored-target id");

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

namespace {
GridDegrees grid_degrees(const Config& c) { return GridDegrees{c.parallel.tp, 1, 1, c.parallel.dp}; }

// The layout against the model: heads, MLP, sequence (under sequence parallelism) over tp.
void validate_layout(const Config& c, const ModelConfig& m, int64_t world) {
  GridLimits l;
  l.n_head = m.n_head;
  l.n_kv_head = m.kv_heads();
  l.n_layer = m.n_layer;
  l.seq_len = c.train.seq_len;
  l.vocab_size = m.vocab_size;
  l.ffn_hidden = m.ffn_hidden;
  l.sequence_parallel = c.parallel.sequence_parallel;
  validate_grid(grid_degrees(c), world, l);
}
int64_t world_size_of(MPI_Comm comm) { return comm == MPI_COMM_NULL ? 1 : comm_size(comm); }
int64_t world_rank_of(MPI_Comm comm) { return comm == MPI_COMM_NULL ? 0 : comm_rank(comm); }
}  // namespace

Trainer::Trainer(const Config& cfg, const std::string& run_dir, MPI_Comm comm)
    : cfg_(cfg),
      run_dir_(run_dir),
      grid_(grid_degrees(cfg), world_size_of(comm), world_rank_of(comm)),
      lead_(grid_.rank() == 0),
      accum_(tessera::grad_accum_steps(cfg, grid_.dp_size())),
      data_(open_training_data(cfg)),
      sampler_(data_.train->num_samples(), static_cast<uint64_t>(cfg.train.seed)),
      layout_{cfg.train.global_batch, cfg.train.micro_batch, grid_.dp_size(), grid_.dp_rank()},
      progress_(cfg.log.progress, grid_.rank() == 0) {
  const ModelConfig mc = resolve(to_model_config(cfg_, data_.vocab_size));
  validate_layout(cfg_, mc, grid_.world_size());
  const std::string ckpt_dir = checkpoint_dir(cfg_, run_dir_);
  // Before anything is allocated: a run that cannot fit is refused now, on every rank.
  memory_line_ = check_training_memory(
      cfg_, data_.vocab_size, {grid_.tp_size(), grid_.dp_size(), !ckpt_dir.empty() && comm != MPI_COMM_NULL}, comm);
  if (comm != MPI_COMM_NULL && grid_.world_size() > 1) comms_ = std::make_unique<GridComms>(grid_, comm);
  // The tp ranks of a dp replica hold one model between them and read the same batches.
  TensorParallel tp;
  if (grid_.tp_size() > 1) tp = TensorParallel{&comms_->tp, cfg_.parallel.sequence_parallel};
  params_ = std::make_unique<ParameterStore>(alloc_, DType::F32, ShardLayout{static_cast<int>(grid_.tp_size()),
                                                                             static_cast<int>(grid_.tp_rank())});
  model_ = std::make_unique<Gpt>(mc, *params_, recompute_policy(cfg_), tp);
  params_->finalize(DataParallelOptimizer::pad_multiple(cfg_.parallel, grid_.dp_size()));
  params_->initialize(static_cast<uint64_t>(cfg_.train.seed));
  opt_ = std::make_unique<DataParallelOptimizer>(
      *params_, segments(), AdamWOptions{cfg_.optim.beta1, cfg_.optim.beta2, cfg_.optim.eps, cfg_.optim.weight_decay},
      cfg_.parallel, comms_ ? &comms_->dp : nullptr, alloc_);
  schedule_ = LrSchedule{cfg_.optim.lr, cfg_.optim.min_lr, cfg_.optim.warmup_steps, cfg_.train.steps,
                         parse_lr_decay(cfg_.optim.decay)};
  flops_per_token_ = flops_per_token(mc, cfg_.train.seq_len);
  if (!ckpt_dir.empty() && comm != MPI_COMM_NULL) {
    ckpt_ = std::make_unique<CheckpointWriter>(ckpt_dir, cfg_.checkpoint.keep_last, comm);
    if (auto path = find_resume_checkpoint(ckpt_dir, cfg_.checkpoint.resume, comm)) {
      const FullOptimizerState moments = opt_->state_buffers();
      const RestoredState st = restore_training_state(*path, *params_, moments.state, comm);
      // A diverged run's checkpoint would "train" on NaN and report a loss of 0 (collective).
      throw_if_any_failed(comm, nonfinite_tensor_in(*path, *params_, moments.state));
      if (lead_) resume_warnings_ = data_order_changes(st.config_toml, cfg_);
      opt_->load_state(moments.state, st.optimizer_steps);
      resumed_from_ = *path;
      start_step_ = st.step;
      consumed_at_start_ = st.consumed_samples;
    }
  }
  if (cfg_.train.profile) {
    profiling_ = true;
    model_->set_profiler(&profiler_);
    if (comms_)
      for (MpiCommunicator* c : {&comms_->tp, &comms_->cp, &comms_->dp, &comms_->pp, &comms_->dp_cp})
        c->set_profiler(&profiler_);
  }
  step_at_record_ = start_step_;
  if (!run_dir_.empty() && lead_) metrics_ = MetricsWriter(run_dir_ + "/metrics.jsonl", /*append=*/start_step_ > 0);
}

std::vector<ParamSegment> Trainer::segments() const {
  std::vector<ParamSegment> segs;
  for (const ParamEntry& e : params_->entries()) {
    bool decay = false;
    switch (e.spec.kind) {
      case ParamKind::Matrix: decay = true; break;
      case ParamKind::Norm: decay = cfg_.optim.decay_norms; break;
      case ParamKind::Bias: decay = cfg_.optim.decay_biases; break;
      case ParamKind::Embedding: decay = cfg_.optim.decay_embeddings; break;
    }
    segs.push_back({e.offset, e.local_shape.numel(), decay});
  }
  return segs;
}

// Sums values element-wise over every rank of the grid (each group in turn), in place.
void Trainer::sum_over_world(std::vector<double>& values) {
  if (!comms_) return;
  const Tensor t(values.data(), DType::F64, {static_cast<int64_t>(values.size())});
  for (MpiCommunicator* c : {&comms_->tp, &comms_->cp, &comms_->dp, &comms_->pp}) c->all_reduce(t, ReduceOp::Sum);
}

void Trainer::sum_over_dp(std::vector<double>& values) {
  if (!comms_) return;
  comms_->dp.all_reduce(Tensor(values.data(), DType::F64, {static_cast<int64_t>(values.size())}), ReduceOp::Sum);
}

// Runs this rank's micro-batches of step s and leaves in the gradients the gradient of the mean
// loss over the whole global batch (every rank's tokens): each rank scales its losses by
// 1 / (targets in the global batch), and opt_ sums the ranks' gradients (buckets started during
// the last micro-batch's backward, or ZeRO-1's reduce-scatter after it). Returns that global mean
// loss.
double Trainer::forward_backward(int64_t s) {
  if (!loader_)
    loader_ = std::make_unique<DataLoader>(*data_.train, sampler_, layout_,
                                           consumed_at_start_ + (s - start_step_) * cfg_.train.global_batch);
  std::vector<Batch> batches;
  std::vector<double> sums = {0.0, 0.0};  // loss sum, targets
  for (int64_t m = 0; m < accum_; ++m) {
    batches.push_back(loader_->next());
    const Batch& b = batches.back();
    sums[1] += static_cast<double>(
        count_not_equal(Tensor(const_cast<int32_t*>(b.targets.data()), DType::I32, {b.B, b.T}), kIgnoreIndex));
  }
  std::vector<double> targets = {sums[1]};
  sum_over_dp(targets);
  const double loss_scale = targets[0] > 0 ? 1.0 / targets[0] : 0.0;
  for (size_t m = 0; m < batches.size(); ++m) {
    Batch& b = batches[m];
    GptCtx ctx;
    const double loss = model_->forward(ctx, alloc_, Tensor(b.tokens.data(), DType::I32, {b.B, b.T}),
                                        Tensor(b.targets.data(), DType::I32, {b.B, b.T}));
    sums[0] += loss * static_cast<double>(ctx.n_targets);
    // Only the last micro-batch communicates: earlier ones only accumulate locally.
    const bool last = m + 1 == batches.size();
    model_->backward(ctx, alloc_, loss_scale, last ? opt_->grads_ready_hook() : Gpt::GradsReady{});
  }
  // The tp-partial gradients (ParamSpec::sum_grad_over_tp) are summed over tp where the dp
  // reduction reads them: before ZeRO-1's reduce-scatter, after the replicated all-reduce (whose
  // buckets may still be in flight until reduce_grads returns). Sums commute; races do not.
  {
    ProfileScope scope(prof(), OpFamily::Communication);  // the dp reduction's waits
    if (opt_->sharded()) sum_partial_grads_over_tp();
    opt_->reduce_grads();
    if (!opt_->sharded()) sum_partial_grads_over_tp();
  }
  std::vector<double> loss = {sums[0]};
  sum_over_dp(loss);
  return targets[0] > 0 ? loss[0] / targets[0] : 0.0;
}

// Parameters every tp rank holds whole but computes only part of the gradient of (ParamSpec::
// sum_grad_over_tp) are summed over the tp group; one all-reduce for all of them.
void Trainer::sum_partial_grads_over_tp() {
  if (grid_.tp_size() == 1) return;
  std::vector<int> ids;
  int64_t n = 0;
  for (int id = 0; id < params_->size(); ++id)
    if (params_->entry(id).spec.sum_grad_over_tp) ids.push_back(id), n += params_->entry(id).local_shape.numel();
  if (ids.empty()) return;
  Buffer packed(alloc_, DType::F32, {n}, MemCategory::Workspace);
  int64_t at = 0;
  for (int id : ids) {
    const Tensor g = params_->grad(id);
    copy(packed.tensor().view({n}).slice_rows(at, at + g.numel()), g.view({g.numel()}));
    at += g.numel();
  }
  comms_->tp.all_reduce(packed, ReduceOp::Sum);
  at = 0;
  for (int id : ids) {
    const Tensor g = params_->grad(id);
    copy(g.view({g.numel()}), packed.tensor().slice_rows(at, at + g.numel()));
    at += g.numel();
  }
}

// The L2 norm of the whole model's gradient: tp shards each count once, tensors every tp rank
// holds whole count on tp rank 0 only; the optimizer sums its part over dp (ZeRO-1 shards).
double Trainer::global_grad_norm() {
  const bool count_replicated = grid_.tp_rank() == 0;
  double sq = opt_->grad_sq_norm([&](const ParamEntry& e) { return e.sharded() || count_replicated; });
  if (grid_.tp_size() > 1) comms_->tp.all_reduce(Tensor(&sq, DType::F64, {1}), ReduceOp::Sum);
  return std::sqrt(sq);
}

std::string Trainer::nonfinite_report(double loss, double norm) const {
  if (!std::isfinite(loss)) return "loss is " + std::to_string(loss);
  for (int id = 0; id < params_->size(); ++id)
    if (!std::isfinite(squared_norm(params_->grad(id))))
      return "gradient of " + params_->entry(id).spec.name + " is not finite";
  return "gradient norm is " + std::to_string(norm);
}

namespace {
// Test hook (tests/app/test_tensor_parallel_training.cpp): TESSERA_TEST_FAIL_AT_STEP = "rank:step"
// makes that world rank throw at the start of that 0-based step, alone, as a real fault would
// (a bad disk, an out-of-memory), to check that the job ends instead of hanging.
void fail_here_if_asked(int64_t world_rank, int64_t s) {
  const char* hook = std::getenv("TESSERA_TEST_FAIL_AT_STEP");
  if (!hook) return;
  long rank = -1, step = -1;
  if (std::sscanf(hook, "%ld:%ld", &rank, &step) == 2 && rank == world_rank && step == s)
    TESSERA_CHECK(false, "TESSERA_TEST_FAIL_AT_STEP: rank ", rank, " fails at step ", step);
}
}  // namespace

Trainer::StepResult Trainer::step(int64_t s) {
  fail_here_if_asked(grid_.rank(), s);
  StepResult r;
  {
    ProfileScope scope(prof(), OpFamily::Elementwise);
    params_->zero_grads();
  }
  r.loss = forward_backward(s);
  ProfileScope scope(prof(), OpFamily::AdamW);  // the norm, clipping and the update
  r.grad_norm = global_grad_norm();
  r.lr = schedule_.at(s);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;
    r.problem = nonfinite_report(r.loss, r.grad_norm);
    return r;
  }
  opt_->step(r.lr, clip_factor(r.grad_norm, cfg_.optim.grad_clip));
  return r;
}

void Trainer::log_step(int64_t s, const StepResult& r, double step_seconds, double elapsed, bool record) {
  const double tokens = static_cast<double>(cfg_.train.global_batch * cfg_.train.seq_len);
  const double tps = step_seconds > 0 ? tokens / step_seconds : 0.0;
  const double mfu = peak_flops_ > 0 ? tps * flops_per_token_ / peak_flops_ : 0.0;
  const int64_t done = s + 1;
  StepStats st;
  st.step = done;
  st.total_steps = cfg_.train.steps;
  st.loss = r.loss;
  st.lr = r.lr;
  st.grad_norm = r.grad_norm;
  st.tokens_per_s = tps;
  st.mfu = mfu;
  st.elapsed_s = elapsed;
  st.eta_s = elapsed / static_cast<double>(done) * static_cast<double>(cfg_.train.steps - done);
  st.memory = format_bytes(alloc_.total_peak());
  progress_.step(st, record);
  if (!record) return;
  JsonRecord rec;
  rec.add("step", done)
      .add("loss", r.loss)
      .add("lr", r.lr)
      .add("grad_norm", r.grad_norm)
      .add("tokens_per_s", tps)
      .add("mfu", mfu)
      .add("elapsed_s", elapsed)
      .add("tokens", static_cast<int64_t>(done) * cfg_.train.global_batch * cfg_.train.seq_len)
      .add("memory_peak_bytes", static_cast<int64_t>(alloc_.total_peak()));
  if (comms_) {
    // Bytes this rank sent over the data-parallel group per step since the last record (ring
    // volumes, parallel/communicator.h): 2 (p-1)/p of the gradients (ZeRO-1: a reduce-scatter and an
    // all-gather of (p-1)/p each), plus a few scalars; and over the tp group (tensor_parallel.h edges).
    const int64_t steps = std::max<int64_t>(1, done - step_at_record_);
    const int64_t sent = comms_->dp.bytes_sent(), tp_sent = comms_->tp.bytes_sent();
    rec.add("dp_bytes_per_step", (sent - dp_bytes_at_record_) / steps);
    if (grid_.tp_size() > 1) rec.add("tp_bytes_per_step", (tp_sent - tp_bytes_at_record_) / steps);
    dp_bytes_at_record_ = sent;
    tp_bytes_at_record_ = tp_sent;
    step_at_record_ = done;
  }
  metrics_.write(rec);
}

void Trainer::evaluate(int64_t s, TrainSummary& summary) {
  if (!data_.valid && !data_.task) return;
  const auto t0 = Clock::now();
  std::ostringstream os;
  os << std::fixed << "eval  step " << s << ":";
  JsonRecord record;
  record.add("step", s);
  if (data_.valid) {
    summary.val_loss = validation_loss(*model_, alloc_, *data_.valid, cfg_.train.eval_batches, cfg_.train.micro_batch);
    os.precision(4);
    os << " val_loss " << summary.val_loss;
    record.add("val_loss", summary.val_loss);
  }
  if (data_.task) {
    const AccuracyResult acc = addition_accuracy(*model_, alloc_, *data_.task, cfg_.data.val_examples);
    summary.val_accuracy = acc.accuracy();
    os.precision(1);
    os << ", accuracy " << 100.0 * acc.accuracy() << "% (" << acc.correct << "/" << acc.total << ")";
    for (const auto& e : acc.examples) os << " | " << e;
    record.add("val_accuracy", acc.accuracy());
  }
  os.precision(1);
  os << " [" << seconds_since(t0) << "s]";
  progress_.message(os.str());
  metrics_.write(record);
}

void Trainer::print_header() {
  // Every rank runs on its own cores: the job's peak is the world's.
  peak_flops_ = (cfg_.log.peak_gflops > 0 ? cfg_.log.peak_gflops : cpu_peak_gflops()) * 1e9 *
                static_cast<double>(grid_.world_size());
  std::ostringstream os;
  os << "model " << model_->config().preset << ": " << params_->global_numel() << " parameters, "
     << model_->config().n_layer << " layers, C=" << model_->config().n_embd << " | batch "
     << cfg_.train.global_batch << " x " << cfg_.train.seq_len << " tokens (micro " << cfg_.train.micro_batch
     << ", accumulation " << accum_ << ") | " << cfg_.train.steps << " steps | MFU vs "
     << (cfg_.log.peak_gflops > 0 ? "log.peak_gflops " : "CPU peak ") << static_cast<int64_t>(peak_flops_ / 1e9)
     << " GFLOP/s";
  if (grid_.world_size() > 1)
    os << "\nlayout: " << grid_.world_size() << " ranks = tp " << grid_.tp_size() << " x dp " << grid_.dp_size()
       << (grid_.tp_size() > 1 && cfg_.parallel.sequence_parallel ? " (sequence parallel)" : "") << "; "
       << params_->numel() << " parameters per rank";
  os << "\n" << memory_line_;
  progress_.message(os.str());
  if (!resumed_from_.empty())
    progress_.message("resumed from " + resumed_from_ + " at step " + std::to_string(start_step_));
  for (const std::string& w : resume_warnings_) progress_.message("warning: " + w);
}

void Trainer::save_checkpoint(int64_t steps_done) {
  if (!ckpt_) return;  // no run directory and no checkpoint.dir: nothing is written
  TrainingState st;
  st.params = params_.get();
  const FullOptimizerState optimizer = opt_->gather_state();  // ZeRO-1: gathered over dp (collective)
  st.optimizer = optimizer.state;
  st.step = steps_done;
  st.consumed_samples = consumed_at_start_ + (steps_done - start_step_) * cfg_.train.global_batch;
  st.tokens_seen = st.consumed_samples * cfg_.train.seq_len;
  st.config_toml = to_toml(cfg_);
  st.seeds = {{"train_seed", cfg_.train.seed}, {"data_seed", cfg_.data.seed}};
  st.writes_tensors = grid_.dp_rank() == 0;     // replicas hold the same values
  st.writes_replicated = grid_.tp_rank() == 0;  // as do tp ranks, for what they hold whole
  ckpt_->save(st);
}

// Why the loop should stop after this step, if it should (and with which exit code). Every rank
// must stop at the same step: signals and clocks are local, so the ranks agree on them first.
std::optional<std::pair<std::string, int>> Trainer::stop_reason(const StopSignals& stop, int64_t done,
                                                                double minutes) {
  const int sig = stop.signal_number();
  const bool time_up = cfg_.train.exit_after_minutes > 0 && minutes >= cfg_.train.exit_after_minutes;
  std::vector<double> votes = {sig == SIGINT ? 1.0 : 0.0, sig == SIGTERM || sig == SIGUSR1 ? 1.0 : 0.0,
                               time_up ? 1.0 : 0.0};
  sum_over_world(votes);
  if (votes[1] > 0) return std::make_pair(std::string("preempted by signal"), static_cast<int>(kExitPreempted));
  if (votes[0] > 0) return std::make_pair(std::string("stopped by signal"), static_cast<int>(kExitInterrupted));
  if (done == cfg_.train.steps) return std::nullopt;
  if (cfg_.train.exit_after_steps > 0 && done - start_step_ >= cfg_.train.exit_after_steps)
    return std::make_pair("train.exit_after_steps = " + std::to_string(cfg_.train.exit_after_steps) + " reached",
                          static_cast<int>(kExitOk));
  if (votes[2] > 0) return std::make_pair(std::string("train.exit_after_minutes reached"), static_cast<int>(kExitOk));
  return std::nullopt;
}

TrainSummary Trainer::run() {
  StopSignals stop;
  TrainSummary summary;
  summary.steps_done = start_step_;
  print_header();
  const auto t_start = Clock::now();
  double train_seconds = 0;
  int64_t consecutive_bad = 0;
  double window_seconds = 0;  // step time since the last record, for its tokens/s
  int64_t window_steps = 0;
  bool stopped_early = false;
  for (int64_t s = start_step_; s < cfg_.train.steps; ++s) {
    const auto t0 = Clock::now();
    const StepResult r = step(s);
    const double dt = seconds_since(t0);
    train_seconds += dt;
    const int64_t done = s + 1;
    summary.steps_done = done;
    if (r.skipped) {
      ++summary.skipped_steps;
      ++consecutive_bad;
      progress_.message("warning: step " + std::to_string(done) + " skipped: " + r.problem);
      if (consecutive_bad >= cfg_.train.max_bad_steps) {
        progress_.message("error: " + std::to_string(consecutive_bad) + " consecutive non-finite steps (train.max_bad_steps = " +
                          std::to_string(cfg_.train.max_bad_steps) + "); stopping. Lower optim.lr or check the data.");
        summary.exit_code = kExitDiverged;
        stopped_early = true;
        break;
      }
    } else {
      consecutive_bad = 0;
      summary.last_loss = r.loss;
    }
    window_seconds += dt;
    ++window_steps;
    const bool record = done % cfg_.log.every == 0 || done == cfg_.train.steps;
    if (record || progress_.live()) {
      log_step(s, r, window_seconds / static_cast<double>(window_steps), train_seconds, record);
      if (record) window_seconds = 0, window_steps = 0;
    }
    if (profiling_) {
      profiler_.end_step();
      if (record) {
        progress_.message("profile of steps " + std::to_string(done - profiler_.steps() + 1) + "-" +
                          std::to_string(done) + " (rank 0):\n" + profiler_.table());
        profiler_.reset();
      }
    }
    const bool last = done == cfg_.train.steps;
    if (!last && cfg_.train.eval_every > 0 && done % cfg_.train.eval_every == 0) evaluate(done, summary);
    if (auto why = stop_reason(stop, done, seconds_since(t_start) / 60.0)) {
      save_checkpoint(done);
      if (ckpt_) {
        ckpt_->wait();
        progress_.message(why->first + ": saved " + ckpt_->last_path() + " after step " + std::to_string(done) +
                          "; run the same command to resume");
      } else {
        progress_.message(why->first + " after step " + std::to_string(done));
      }
      summary.exit_code = why->second;
      stopped_early = true;
      break;
    }
    // The last step's save is the end-of-run one, unless checkpoint.at_end = false.
    const bool periodic = cfg_.checkpoint.every > 0 && done % cfg_.checkpoint.every == 0;
    if (periodic && !(last && cfg_.checkpoint.at_end)) save_checkpoint(done);
  }
  if (!stopped_early) {
    evaluate(summary.steps_done, summary);
    if (summary.steps_done > start_step_ && cfg_.checkpoint.at_end) save_checkpoint(summary.steps_done);
  }
  if (ckpt_) ckpt_->wait();
  summary.elapsed_s = seconds_since(t_start);
  progress_.finish();
  return summary;
}

namespace {
void print_summary(const TrainSummary& s, const std::string& run_dir) {
  std::printf("done: %ld steps (%ld skipped) in %s", static_cast<long>(s.steps_done),
              static_cast<long>(s.skipped_steps), format_duration(s.elapsed_s).c_str());
  // No completed step this invocation (all skipped as non-finite): no loss to show, not a 0.
  if (std::isfinite(s.last_loss)) std::printf(" | final loss %.4f", s.last_loss);
  else std::printf(" | no step completed");
  if (s.val_loss >= 0) std::printf(" | val_loss %.4f", s.val_loss);
  if (s.val_accuracy >= 0) std::printf(" | accuracy %.1f%%", 100.0 * s.val_accuracy);
  std::printf("\nrun directory: %s (config.toml, metrics.jsonl)\n", run_dir.c_str());
}
}  // namespace

// Keys that parse but whose features are not built yet are refused rather than ignored.
void check_supported(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  TESSERA_CHECK(p.pp == 1 && p.cp == 1, "[parallel] asks for pp=", p.pp, ", cp=", p.cp,
                ", but this build parallelizes over data and tensors only (parallel.dp, parallel.zero, "
                "parallel.tp, parallel.sequence_parallel); leave the others at their defaults");
  TESSERA_CHECK(p.zero == 0 || p.zero == 1, "parallel.zero = ", p.zero,
                " is not supported: 0 (replicated optimizer state) or 1 (ZeRO-1, sharded over dp)");
}

// Ranks sharing a node split its cores between them unless OMP_NUM_THREADS says otherwise:
// two ranks of two threads each on two cores stall at every parallel region.
void share_cores_between_ranks(MPI_Comm world) {
  const int local = ranks_on_this_node(world);
  if (local > 1 && std::getenv("OMP_NUM_THREADS") == nullptr)
    omp_set_num_threads(std::max(1, omp_get_num_procs() / local));
}

int run_train_command(const TrainArgs& args) {
  MPI_Comm world = MPI_COMM_WORLD;  // the entry point: the one place the world is named
  const bool lead = comm_rank(world) == 0;
  share_cores_between_ranks(world);
  // Setup problems (config, data, checkpoint) are usually the same on every rank; collected and
  // raised together so that one message is printed and every rank exits.
  Config cfg;
  std::string dir, error;
  try {
    cfg = load_config(args.config_path, args.overrides);
    if (!args.print_config) {
      check_supported(cfg);
      dir = args.run_dir.empty() ? run_dir(cfg) : args.run_dir;
      if (lead) check_writable_directories(dir, cfg, !args.run_dir.empty());
    }
  } catch (const Error& e) {
    error = e.what();
  }
  throw_if_any_failed(world, error);
  if (args.print_config) {
    if (lead) std::cout << to_toml(cfg);
    return kExitOk;
  }
  if (lead) {
    std::ofstream out(dir + "/config.toml");
    TESSERA_CHECK(out.is_open(), "cannot write ", dir, "/config.toml");
    out << to_toml(cfg);
    std::cout << build_info();
  }
  std::unique_ptr<Trainer> trainer;
  try {
    trainer = std::make_unique<Trainer>(cfg, dir, world);
  } catch (const Error& e) {
    error = e.what();
  }
  throw_if_any_failed(world, error);
  if (trainer->start_step() >= cfg.train.steps) {
    if (lead)
      std::cout << "nothing to do: checkpoint " << trainer->resumed_from() << " is at step " << trainer->start_step()
                << " >= train.steps = " << cfg.train.steps << "; raise train.steps to continue\n";
    return kExitOk;
  }
  const TrainSummary summary = trainer->run();
  if (lead) print_summary(summary, dir);
  return summary.exit_code;
}

}  // namespace tessera
