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
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "app/auto_layout.h"
#include "app/build_info.h"
#include "app/context_parallel.h"
#include "app/device.h"
#include "app/checkpoint/hf_export.h"
#include "app/evaluate.h"
#include "app/freeze.h"
#include "app/checkpoint/adapter_checkpoint.h"
#include "app/lora.h"
#include "app/upscale.h"
#include "app/launch.h"
#include "app/memory_check.h"
#include "app/pp_cut.h"
#include "app/preflight.h"
#include "app/run_lock.h"
#include "kernels/backend_info.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "parallel/host_sums.h"
#include "parallel/mpi.h"
#include "model/stage_cut.h"
#include "parallel/mpi_communicator.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/schedule.h"
#include "parallel/tp_compression.h"

namespace tessera {

static_assert(kIgnoreTarget == kIgnoreIndex, "data and kernels must agree on the ignored-target id");

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TpCompressionModes tp_compression_modes(const ParallelConfig& p) {
  return resolve_tp_compression(p.tp_comm_compression, p.tp_comm_compression_forward, p.tp_comm_compression_backward);
}
// parallel.tp_comm_compression: the run's compression and its residuals; null when exact.
std::unique_ptr<TpCompression> make_tp_compression(const ParallelConfig& p, Allocator& alloc) {
  const TpCompressionModes modes = tp_compression_modes(p);
  if (!modes.any()) return nullptr;
  auto c = std::make_unique<TpCompression>(modes, alloc);
  c->set_probe(p.tp_comm_compression_probe);
  return c;
}
}  // namespace

void validate_layout(const Config& c, const ModelConfig& m, int64_t world) {
  GridLimits l;
  l.n_head = m.n_head;
  l.n_kv_head = m.kv_heads();
  l.n_layer = m.n_layer;
  l.seq_len = c.train.seq_len;
  l.vocab_size = m.vocab_size;
  l.ffn_hidden = m.ffn_hidden;
  l.sequence_parallel = c.parallel.sequence_parallel;
  validate_grid(grid_degrees(c.parallel), world, l);
}

namespace {
// The whole model's global parameter names (every pipeline stage's), for train.freeze.
std::vector<std::string> global_parameter_names(const ModelConfig& mc) {
  std::vector<std::string> names;
  for (const auto& [path, shape] : model_tensor_shapes(mc)) names.push_back(path.substr(std::strlen("/model/")));
  return names;
}
int64_t int_attr_or(const AttrMap& attrs, const std::string& key, int64_t fallback) {
  auto it = attrs.find(key);
  return it != attrs.end() && std::holds_alternative<int64_t>(it->second) ? std::get<int64_t>(it->second) : fallback;
}
int64_t world_size_of(MPI_Comm comm) { return comm == MPI_COMM_NULL ? 1 : comm_size(comm); }
int64_t world_rank_of(MPI_Comm comm) { return comm == MPI_COMM_NULL ? 0 : comm_rank(comm); }
std::vector<int64_t> all_ranks(int64_t world) {
  std::vector<int64_t> ranks(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

// train.device for this rank (resolve_train_device: collective), and on CUDA what the trainer does
// not run there yet, refused naming the key (the same verdict on every rank: the config decides).
Device train_device(const Config& cfg, MPI_Comm comm) {
  const Device device = resolve_train_device(cfg.train.device, comm);
  if (!device.is_cpu()) {
    const std::string why = unsupported_on_cuda(cfg);
    TESSERA_CHECK(why.empty(), why);
  }
  return device;
}

// The trainer's communicators (parallel.comm) for its layout, on its device. Test hook
// (tests/app/test_staged_comms.cpp): TESSERA_TEST_STAGE_COMMS set makes every MPI communicator stage
// host tensors through host copies too, the path device tensors take with train.device = "cuda",
// so that the CPU suite trains through it.
std::unique_ptr<GridComms> grid_comms_of(const ProcessGrid& grid, MPI_Comm world, const Exec& ex, const ParallelConfig& p) {
  const MpiWait waits = resolve_mpi_wait(p.mpi_wait, world, cpu_threads());
  auto comms = std::make_unique<GridComms>(make_grid_comms(grid, world, ex, p.comm, waits));
  if (std::getenv("TESSERA_TEST_STAGE_COMMS"))
    for (Communicator* c : comms->all())
      if (auto* m = dynamic_cast<MpiCommunicator*>(c)) m->stage_through_host(ex, /*always=*/true);
  return comms;
}

// train.micro_batch = 0 (automatic) chosen for this layout and this node's memory, before anything
// reads it (app/memory_check.h); a config that sets it is returned as it is.
// model.recompute_ahead is resolved after it (under train.max_memory_gib, app/memory_check.h).
Config resolve_micro_batch(const Config& given, const std::string& run_dir, MPI_Comm comm) {
  const Config cfg = with_token_micro_batch(given);  // data.batching = "tokens": the budget's rows
  if (cfg.train.micro_batch > 0 && !recompute_in_bubbles(cfg)) return cfg;
  const ProcessGrid grid(grid_degrees(cfg.parallel), world_size_of(comm), world_rank_of(comm));
  const bool checkpoints = !checkpoint_dir(cfg, run_dir).empty() && comm != MPI_COMM_NULL;
  const MemoryLayout layout{grid.tp_size(), grid.dp_size(), checkpoints};
  const Config sized = cfg.train.micro_batch > 0 ? cfg : with_auto_micro_batch(cfg, data_vocab_size(cfg), layout, comm);
  return with_recompute_ahead(sized, data_vocab_size(sized), layout);
}

// The model chunks this rank holds: the whole model, or its pipeline stage's vpp chunks of the cut
// (model/stage_cut.h: by cost, or parallel.pp_layers), its virtual chunk 0 first.
std::vector<StageSpec> chunks_of(const Config& c, const ModelConfig& mc, const ProcessGrid& grid) {
  if (grid.pp_size() == 1) return {StageSpec{}};
  const std::vector<StageSpec> cut = cut_stages(mc, c.train.seq_len, grid.pp_size(), c.parallel.vpp, c.parallel.pp_layers);
  return rank_chunks(cut, grid.pp_size(), grid.pp_rank());
}

// [upscale] tp, pp, dp: the layout after an in-run growth, on the same world_size ranks; unchanged
// when none is given. dp 0 is what the world size leaves. Throws naming the keys when the degrees
// do not multiply to the world size.
ParallelConfig parallel_after_growth(const Config& c, int64_t world_size) {
  const UpscaleConfig& u = c.upscale;
  ParallelConfig p = c.parallel;
  if (u.tp == 0 && u.pp == 0 && u.dp == 0) return p;
  p.tp = u.tp > 0 ? u.tp : p.tp;
  p.pp = u.pp > 0 ? u.pp : p.pp;
  p.dp = u.dp > 0 ? u.dp : -1;
  p.pp_layers.clear();  // cut again for the grown depth
  const int64_t others = p.tp * p.pp * p.cp;
  const auto key = [](const char* k, int64_t given, const char* fallback, int64_t value) {
    return std::string(k) + " = " + std::to_string(value) + (given > 0 ? "" : std::string(" (") + fallback + ")");
  };
  const std::string sizes = key("upscale.tp", u.tp, "parallel.tp", p.tp) + " x " + key("upscale.pp", u.pp, "parallel.pp", p.pp) +
                            " x parallel.cp = " + std::to_string(p.cp);
  TESSERA_CHECK(world_size % others == 0 && (u.dp == 0 || others * u.dp == world_size), "the layout after the growth (",
                sizes, u.dp > 0 ? " x upscale.dp = " + std::to_string(u.dp) : std::string(), ") needs ",
                u.dp > 0 ? std::to_string(others * u.dp) : "a multiple of " + std::to_string(others),
                " ranks, but the run has ", world_size, ": a growth keeps the ranks it has (only their layout changes)");
  return p;
}

// Whether `next` lays the world's ranks out otherwise than `grid` (tp, pp or dp).
bool another_layout(const ProcessGrid& grid, const ParallelConfig& next) {
  const ProcessGrid g(grid_degrees(next), grid.world_size(), grid.rank());
  return g.tp_size() != grid.tp_size() || g.pp_size() != grid.pp_size() || g.dp_size() != grid.dp_size();
}

DpOptimizerOptions dp_optimizer_options(const ParallelConfig& p) {
  return {p.zero == 1, p.bucket_mb, p.overlap_grad_reduce};
}

// The ParameterStore's flat buffers as parallel/ sees them. embedding_group: the tied token
// embedding a pipeline's first and last stage both hold (ParamSpec::sum_grad_over_embedding_group;
// none with pp = 1).
// Only the trainable region: frozen parameters are neither reduced nor stepped, nor in the norm.
FlatParams flat_params_of(const ParameterStore& ps) {
  FlatParams f{ps.trainable_flat_params(), ps.trainable_flat_grads(), ps.padded_trainable_flat_params(),
               ps.padded_trainable_flat_grads(), {}, ps.trainable_flat_compute()};
  for (const ParamEntry& e : ps.entries())
    if (!e.frozen)
      f.entries.push_back({e.offset - ps.frozen_numel(), e.local_shape.numel(), e.sharded(), e.spec.sum_grad_over_tp,
                           e.spec.sum_grad_over_embedding_group});
  return f;
}
}  // namespace

Trainer::Trainer(const Config& cfg, const std::string& run_dir, MPI_Comm comm, Watchdog* watchdog)
    : cfg_(resolve_micro_batch(cfg, run_dir, comm)),
      run_dir_(run_dir),
      world_(comm),
      grid_(grid_degrees(cfg.parallel), world_size_of(comm), world_rank_of(comm)),
      lead_(grid_.rank() == 0),
      auto_micro_batch_(cfg.train.micro_batch == 0),
      accum_(tessera::grad_accum_steps(cfg_, grid_.dp_size())),
      data_(open_training_data(cfg_)),
      sampler_(data_.train->num_samples(), static_cast<uint64_t>(cfg_.train.seed)),
      layout_{cfg_.train.global_batch, cfg_.train.micro_batch, grid_.dp_size(), grid_.dp_rank()},
      // train.device, agreed by every rank before anything is allocated (collective); what a CUDA
      // run cannot do yet is refused before its stream exists.
      device_(train_device(cfg_, comm)),
      stream_(device_),
      alloc_(device_, stream_.stream()),
      ex_{device_, stream_.stream(), device_.is_cpu() ? &alloc_ : nullptr},
      progress_(cfg.log.progress, grid_.rank() == 0) {
  const ModelConfig mc = resolve(to_model_config(cfg_, data_.vocab_size));
  TESSERA_CHECK(!mc.is_vlm() || mc.vision.placeholder_id == data_.train->placeholder_id(),
                "vision.placeholder_id = ", mc.vision.placeholder_id, " but the data marks images with token id ",
                data_.train->placeholder_id(), "; set vision.placeholder_id = ", data_.train->placeholder_id());
  validate_layout(cfg_, mc, grid_.world_size());
  if (grid_.pp_size() > 1) validate_pipeline(cfg_, grid_.dp_size());  // micro-batches per step against pp
  const std::string ckpt_dir = checkpoint_dir(cfg_, run_dir_);
  if (comm != MPI_COMM_NULL && grid_.world_size() > 1) comms_ = grid_comms_of(grid_, comm, ex_, cfg_.parallel);
  watchdog_ = watchdog;
  if (watchdog && comms_) comms_->watch(*watchdog, grid_, cfg_.parallel.timeout_s);
  cp_ = context_parallel_of(cfg_.parallel, comms_.get());
  // parallel.cp_mode = "dynamic": the model's attention rings over the subgroup each pass selects.
  dynamic_cp_ = DynamicCp::open(cfg_, cp_.comm, grid_.tp_size() > 1 ? comms_->tp.get() : nullptr);
  if (dynamic_cp_) cp_.comm = dynamic_cp_->comm();
  // The tp ranks of a dp replica hold one model between them and read the same batches.
  tp_compression_ = make_tp_compression(cfg_.parallel, alloc_);  // parallel.tp_comm_compression
  if (grid_.tp_size() > 1) tp_ = TensorParallel{comms_->tp.get(), cfg_.parallel.sequence_parallel,
                                              cfg_.parallel.tp_overlap_chunks, tp_compression_.get()};
  // Which checkpoint to continue, and whose: a fresh start over another run's files is refused here,
  // before metrics.jsonl is opened (and truncated). Known before the model is built: train.freeze =
  // "original" reads the file's up-scaling record.
  tokens_ = TokenBatching::open(cfg_, data_, grid_.dp_size(), accum_);  // null for data.batching = "windows"
  std::optional<RunStart> start;
  int64_t resume_step = -1;
  if (!ckpt_dir.empty() && comm != MPI_COMM_NULL) {
    start = start_run(ckpt_dir, cfg_.checkpoint.resume, cfg_.checkpoint.overwrite, comm);
    if (start->resume_from) {
      const CheckpointReader reader(*start->resume_from, comm);
      const GroupAttributes& groups = reader.group_attributes();
      if (auto it = groups.find(kUpscaleGroup); it != groups.end()) upscale_record_ = it->second;
      if (auto it = groups.find(kLoraGroup); it != groups.end()) lora_record_ = it->second;
      if (tokens_) tokens_->set_cursor(TokenBatching::cursor_of(groups, *start->resume_from));
      if (dynamic_cp_) dynamic_cp_->resume_from(groups, *start->resume_from);  // its cost model: the same plans
      resume_step = reader.meta().step;
    }
  }
  freeze_where_ = start && start->resume_from ? "checkpoint " + *start->resume_from
                                              : std::string("this run (it resumes no checkpoint)");
  if (!upscale_record_.empty()) growth_step_ = int_attr_or(upscale_record_, "source_step", -1);
  // An in-run growth ([upscale] method, at_step): still to come, "original" waits for it; done
  // already (the checkpoint resumed is past it), the model is the grown one.
  ModelConfig model = mc;
  const bool in_run_growth = !cfg_.upscale.method.empty();
  const bool grows_later = in_run_growth && resume_step < cfg_.upscale.at_step;
  if (in_run_growth) {
    ModelConfig grown = mc;
    grown.n_layer = static_cast<int64_t>(layer_mapping(mc.n_layer, upscale_options(cfg_.upscale)).size());
    // The grown model must fit the layout after the growth too ([upscale] tp, pp, dp, or this one).
    Config after = cfg_;
    after.model.n_layer = grown.n_layer;
    after.parallel = parallel_after_growth(cfg_, grid_.world_size());
    try {
      validate_layout(after, grown, grid_.world_size());
      const int64_t dp_after = ProcessGrid(grid_degrees(after.parallel), grid_.world_size(), 0).dp_size();
      tessera::grad_accum_steps(after, dp_after);  // the global batch over the new dp: refused now, not mid-run
      if (after.parallel.pp > 1) validate_pipeline(after, dp_after);
    } catch (const Error& e) {
      if (after.parallel == cfg_.parallel) throw;
      throw Error("the layout after the growth (upscale.tp = " + std::to_string(cfg_.upscale.tp) + ", upscale.pp = " +
                  std::to_string(cfg_.upscale.pp) + ", upscale.dp = " + std::to_string(cfg_.upscale.dp) +
                  "; 0 = as before) does not fit the grown model (" + std::to_string(grown.n_layer) + " layers): " +
                  e.what());
    }
    if (!grows_later) {  // resumed past the growth: the grown model, on the layout after it
      model = grown;
      settle_growth(grown.n_layer);
    }
  }
  std::set<std::string> frozen = frozen_parameters(cfg_.train.freeze, global_parameter_names(model), model.n_layer,
                                                   {upscale_record_, freeze_where_}, !grows_later);
  if (model.lora.enabled()) frozen.merge(lora_frozen_base(global_parameter_names(model)));  // app/lora.h
  // Before anything is allocated: a run that cannot fit is refused now, on every rank, its frozen
  // parameters counted without moments. With an in-run growth the model before it and the grown
  // one are both estimated, and the larger checked.
  // parallel.pp_cut = "measured": the stages cut by a timing pass on rank 0, written into
  // parallel.pp_layers before anything reads the cut (app/pp_cut.h; collective).
  MemoryLayout cut_layout{grid_.tp_size(), grid_.dp_size(), !ckpt_dir.empty() && comm != MPI_COMM_NULL};
  cut_layout.frozen = frozen;
  pp_cut_line_ = apply_measured_cut(cfg_, model, data_.vocab_size, cut_layout, ex_, comm);
  memory_line_ = check_memory(ckpt_dir, mc, frozen, grows_later, comm);
  build_model(model, frozen);
  schedule_ = LrSchedule{cfg_.optim.lr, cfg_.optim.min_lr, cfg_.optim.warmup_steps, cfg_.train.steps,
                         parse_lr_decay(cfg_.optim.decay)};
  flops_per_token_ = flops_per_token(model, cfg_.train.seq_len);
  if (start) {
    ckpt_ = std::make_unique<CheckpointWriter>(ckpt_dir, cfg_.checkpoint.keep_last, comm, start->run);
    // The writer's collective HDF5 I/O runs on its own thread, out of any communicator's sight; the
    // main thread's waits for it are watched as one region.
    if (watchdog)
      ckpt_wait_ = &watchdog->add_slot("world group", all_ranks(grid_.world_size()),
                                       kRegionTimeoutFactor * cfg_.parallel.timeout_s);
    if (const auto& path = start->resume_from) {
      const FullOptimizerState moments = opt_->state_buffers();
      const RestoredState st = restore_training_state(*path, *params_, moments.state, comm, ex_);
      // A diverged run's checkpoint would "train" on NaN and report a loss of 0 (collective).
      throw_if_any_failed(comm, nonfinite_tensor_in(ex_, alloc_, *path, *params_, moments.state));
      if (lead_) resume_warnings_ = data_order_changes(st.config_toml, cfg_);
      if (lead_ && !st.fresh_moments.empty())
        resume_warnings_.push_back(std::to_string(st.fresh_moments.size()) + " parameters frozen when " + *path +
                                   " was saved are trained now: their AdamW moments start at zero (first: " +
                                   st.fresh_moments.front() + ")");
      opt_->load_state(ex_, moments.state, st.optimizer_steps);
      check_tied_copies("after resuming " + *path);
      resumed_from_ = *path;
      start_step_ = st.step;
      consumed_at_start_ = st.consumed_samples;
    }
  }
  if (!cfg_.checkpoint.init_from.empty() && !(start && start->resume_from)) init_weights(model, comm);
  if (model.lora.enabled()) {  // app/lora.h: the /lora record ties the checkpoints to their base
    const MPI_Comm c = comm == MPI_COMM_NULL ? MPI_COMM_SELF : comm;
    // (An adapters-only checkpoint's base was checked when the resume read its base tensors.)
    if (start && start->resume_from && !is_adapters_only(lora_record_))
      lora_check_base(*start->resume_from, lora_record_, c);
    else lora_record_ = lora_record(cfg_.checkpoint.init_from, model.lora, c);
    set_lora_checkpoint_mode(lora_record_, cfg_.lora.checkpoint, start && start->resume_from ? *start->resume_from : "");
  }
  apply_rewarm();
  params_->refresh_compute_copy(ex_);  // from the initialized or resumed masters (bf16 only)
  if (dynamic_cp_) {  // the cost model, timed on this model (collective over cp) or read from its file
    dynamic_cp_line_ = dynamic_cp_->calibrate(cfg_, *model_, ex_, alloc_);
    if (lead_ && !run_dir_.empty()) {
      std::ofstream out(run_dir_ + "/" + kCpCalibrationFile);
      out << cp_cost_toml(dynamic_cp_->cost());
    }
  }
  if (cfg_.train.profile) {
    profiling_ = true;
    // A GPU queues its ops: each scope waits for its own (per-family times, slower steps).
    if (!device_.is_cpu()) profiler_.set_fence([this] { synchronize(ex_); });
    for (const auto& chunk : chunks_) chunk->set_profiler(&profiler_);
    if (comms_)
      for (Communicator* c : comms_->all()) c->set_profiler(&profiler_);
  }
  step_at_record_ = start_step_;
  if (!run_dir_.empty() && lead_) metrics_ = MetricsWriter(run_dir_ + "/metrics.jsonl", /*append=*/start_step_ > 0);
}

namespace {
// What makes a file's tensors mean something else in this model although their shapes agree: the
// architecture family and the head split (n_embd too, for a clearer message than the shapes').
// One line per difference; none when the file carries no config.
std::vector<std::string> model_differences(const std::string& file_toml, const Config& now) {
  std::vector<std::string> out;
  if (file_toml.empty()) return out;
  Config was;
  try {
    was = parse_config_string(file_toml, "the checkpoint's config");
  } catch (const Error&) {
    return out;  // a config this build cannot read: the shapes are still checked one by one
  }
  auto differ = [&](const std::string& key, const auto& a, const auto& b) {
    std::ostringstream os;
    if (a == b) return;
    os << key << " = " << a << " in the file, " << b << " in this run";
    out.push_back(os.str());
  };
  auto kv = [](const ModelSection& m) { return m.n_kv_head > 0 ? m.n_kv_head : m.n_head; };
  differ("model.preset", was.model.preset, now.model.preset);
  differ("model.n_embd", was.model.n_embd, now.model.n_embd);
  differ("model.n_head", was.model.n_head, now.model.n_head);
  differ("model.n_kv_head (0 = n_head)", kv(was.model), kv(now.model));
  // A tied file's wte.weight would load while an untied run's lm_head kept its initialization.
  auto head = [](const ModelSection& m) { return resolve_lm_head(m.preset, m.lm_head); };
  differ("model.lm_head", head(was.model), head(now.model));
  if (was.model.kind == "vlm" && now.model.kind == "vlm") {
    differ("vision.n_embd", was.vision.n_embd, now.vision.n_embd);
    differ("vision.n_head", was.vision.n_head, now.vision.n_head);
    differ("vision.patch_size", was.vision.patch_size, now.vision.patch_size);
  }
  return out;
}
}  // namespace

void Trainer::init_weights(const ModelConfig& model, MPI_Comm comm) {
  const std::string& path = cfg_.checkpoint.init_from;
  const MPI_Comm c = comm == MPI_COMM_NULL ? MPI_COMM_SELF : comm;
  {
    const CheckpointReader r(path, c);
    const std::vector<std::string> diff = model_differences(r.meta().config_toml, cfg_);
    if (!diff.empty()) {
      std::string m = "checkpoint.init_from = \"" + path + "\" holds another model's weights:";
      for (const std::string& d : diff) m += "\n  " + d;
      throw Error(m + "\n(its tensors would mean something else here; start from a checkpoint of this model's "
                      "preset and width)");
    }
  }
  const InitFromResult got =
      init_weights_from(path, *params_, model_tensor_shapes(model), cfg_.checkpoint.init_prefixes, c, ex_);
  throw_if_any_failed(c, nonfinite_tensor_in(ex_, alloc_, path, *params_, opt_->state_buffers().state));
  check_tied_copies("after checkpoint.init_from " + path);
  std::ostringstream os;
  os << "initialized from " << path << " (weights only, step 0): " << got.loaded.size() << " tensors loaded";
  if (!got.kept.empty()) {
    os << ", " << got.kept.size() << " kept their initialization (";
    for (size_t i = 0; i < got.kept.size() && i < 3; ++i) os << (i ? ", " : "") << got.kept[i];
    os << (got.kept.size() > 3 ? ", ...)" : ")");
  }
  initialized_from_ = os.str();
}

std::string Trainer::check_memory(const std::string& ckpt_dir, const ModelConfig& mc, const std::set<std::string>& frozen,
                                  bool grows_later, MPI_Comm comm) const {
  MemoryLayout layout{grid_.tp_size(), grid_.dp_size(), !ckpt_dir.empty() && comm != MPI_COMM_NULL};
  layout.frozen = frozen;
  if (cfg_.upscale.method.empty()) return check_training_memory(cfg_, data_.vocab_size, layout, comm);
  const std::vector<LayerSource> mapping = layer_mapping(mc.n_layer, upscale_options(cfg_.upscale));
  Config grown = cfg_;
  grown.model.n_layer = static_cast<int64_t>(mapping.size());
  grown.parallel.pp_layers.clear();  // the stages are re-cut for the grown depth
  MemoryLayout after = layout;
  if (grows_later) {  // on the layout after the growth ([upscale] tp, pp, dp)
    grown.parallel = parallel_after_growth(cfg_, grid_.world_size());
    const ProcessGrid g(grid_degrees(grown.parallel), grid_.world_size(), grid_.rank());
    after.tp = g.tp_size();
    after.dp = g.dp_size();
    // train.freeze again after the growth: "original" then means what it carried over.
    ModelConfig grown_model = mc;
    grown_model.n_layer = grown.model.n_layer;
    after.frozen = frozen_parameters(cfg_.train.freeze, global_parameter_names(grown_model), grown_model.n_layer,
                                     {AttrMap{{"mapping", describe_mapping(mapping)}}, "this run's growth"});
    // The model before the growth holds more when freezing after it saves more than the new layers
    // add (the embeddings frozen by "original"): then that one is checked.
    try {
      if (estimate_training_memory(cfg_, data_.vocab_size, layout).total() >
          estimate_training_memory(grown, data_.vocab_size, after).total())
        return check_training_memory(cfg_, data_.vocab_size, layout, comm);
    } catch (const Error&) {  // sizes beyond 64 bits: the checks below say so, on every rank together
    }
  }
  const std::string growth = "the model grown in this run ([upscale] method = \"" + cfg_.upscale.method + "\" at step " +
                             std::to_string(cfg_.upscale.at_step) + ": " + std::to_string(mc.n_layer) + " -> " +
                             std::to_string(grown.model.n_layer) + " layers)";
  try {
    return check_training_memory(grown, data_.vocab_size, after, comm) + ", for " + growth;
  } catch (const Error& e) {  // thrown on every rank together
    throw Error("does not fit: " + growth + ": " + e.what());
  }
}

// The model of config mc on this rank's layout: its chunks, their parameters in one store (the
// frozen ones first: ParameterStore::finalize), initialized from train.seed, and the optimizer over
// the trainable ones.
void Trainer::build_model(const ModelConfig& mc, const std::set<std::string>& frozen) {
  opt_.reset();
  chunks_.clear();
  model_ = nullptr;
  params_ = std::make_unique<ParameterStore>(alloc_, DType::F32, ShardLayout{static_cast<int>(grid_.tp_size()),
                                                                             static_cast<int>(grid_.tp_rank())});
  // One Gpt per chunk (interleaved: vpp of them), their parameters in one store: one flat buffer
  // for the optimizer, the reduction and the checkpoint.
  const std::vector<StageSpec> chunks = chunks_of(cfg_, mc, grid_);
  const std::vector<Recompute> recompute = recompute_policy(cfg_, chunks);
  const std::vector<ActivationCompression> compression = activation_compression_policy(cfg_);
  const std::vector<RecomputeOps> recompute_ops = recompute_ops_policy(cfg_, chunks);
  for (const StageSpec& chunk : chunks)
    chunks_.push_back(std::make_unique<Gpt>(mc, *params_, recompute, tp_, chunk, cp_, compression, recompute_ops));
  model_ = chunks_.front().get();
  mc_ = mc;
  frozen_.assign(frozen.begin(), frozen.end());
  for (int id = 0; id < params_->size(); ++id)
    if (frozen.count(params_->entry(id).spec.name)) params_->freeze(id);
  trainable_prefix_.assign(1, 0);
  for (const ParamEntry& e : params_->entries()) trainable_prefix_.push_back(trainable_prefix_.back() + (e.frozen ? 0 : 1));
  const DpOptimizerOptions dp_opts = dp_optimizer_options(cfg_.parallel);
  params_->finalize(DataParallelOptimizer::pad_multiple(dp_opts, grid_.dp_size() * grid_.cp_size()));
  if (cfg_.train.dtype == "bf16") params_->enable_compute_copy(DType::BF16);  // the GEMMs' weights
  params_->initialize(ex_, static_cast<uint64_t>(cfg_.train.seed));
  flat_ = flat_params_of(*params_);
  check_tied_copies("after initialization");
  if (comms_)  // the embedding group comes with pipeline parallelism (none with pp = 1)
    groups_ = GradGroups{comms_->tp.get(), dp_cp_group(), comms_->pp.get(), comms_->embedding.get()};
  opt_ = std::make_unique<DataParallelOptimizer>(
      flat_, segments(), AdamWOptions{cfg_.optim.beta1, cfg_.optim.beta2, cfg_.optim.eps, cfg_.optim.weight_decay},
      dp_opts, dp_cp_group(), alloc_);
}

// The optimizer's hook for the last backward, on store ids: frozen parameters are not the
// optimizer's (their gradients are never reduced), the others are renumbered in its order.
Gpt::GradsReady Trainer::grads_hook() {
  Gpt::GradsReady inner = opt_->grads_ready_hook();
  if (!inner || !params_->any_frozen()) return inner;
  return [this, inner](int first, int end) {
    const int a = trainable_prefix_[static_cast<size_t>(first)], b = trainable_prefix_[static_cast<size_t>(end)];
    if (a < b) inner(a, b);
  };
}

// The in-run growth: the global tensors are gathered from every rank's shards (one replica sends),
// mapped by the offline code (LayerUpscaler, model/upscale.h) exactly as `tessera upscale` maps a
// file's, and the grown model is built on the same layout (the pipeline stages cut again for the
// new depth), each rank keeping its shard. Moments start fresh with AdamW's step count at 0, or
// follow their parameters (upscale.carry_optimizer), as in the offline path.
void Trainer::grow(int64_t done) {
  const UpscaleOptions options = upscale_options(cfg_.upscale);
  LayerUpscaler up(mc_, options);
  const bool send = grid_.dp_rank() == 0 && grid_.cp_rank() == 0, whole = grid_.tp_rank() == 0;
  const MPI_Comm comm = comms_ ? world_ : MPI_COMM_NULL;
  const float* base = params_->flat_params().ptr<float>();
  const GlobalTensors params = gather_global_tensors(
      *params_, [&](const ParamEntry& e) { return base + e.offset; }, send, whole, comm);
  const bool carry = cfg_.upscale.carry_optimizer;
  GlobalTensors moments[2];
  int64_t steps = 0;
  if (carry) {
    const FullOptimizerState st = opt_->gather_state();  // ZeRO-1: gathered over dp (collective)
    steps = st.state.steps;
    const float* m[2] = {st.state.exp_avg.ptr<float>(), st.state.exp_avg_sq.ptr<float>()};
    for (int k = 0; k < 2; ++k)
      moments[k] = gather_global_tensors(
          *params_, [&](const ParamEntry& e) { return e.frozen ? nullptr : m[k] + e.offset - params_->frozen_numel(); },
          send, whole, comm);
  }
  const TensorFetch source_params = [&params](const std::string& name) {
    auto it = params.find(name);
    TESSERA_CHECK(it != params.end(), "upscale at upscale.at_step: the source model's ", name, " was not gathered");
    return it->second;
  };
  // A parameter frozen before the growth has no moments: zero, as a fresh one's.
  const auto source_moment = [&](int k) -> TensorFetch {
    return [&, k](const std::string& name) {
      auto it = moments[k].find(name);
      return it != moments[k].end() ? it->second : std::vector<float>(source_params(name).size(), 0.0f);
    };
  };
  // ot with align_data: the units compared by their activations on the offline path's batches
  // (alignment_batches: the validation data from the start, a loader of their own), every rank
  // running the whole source model on them, so that every rank aligns alike.
  if (cfg_.upscale.align_data > 0) {
    int64_t B = 0, T = 0;
    const auto batches = alignment_batches(cfg_, data_, cfg_.upscale.align_data, B, T);
    up.set_features(activation_features(mc_, source_params, up.mapping(), batches, B, T));
  }
  const int64_t before = mc_.n_layer;
  const std::string mapping = describe_mapping(up.mapping());
  // The record a grown checkpoint carries (app/upscale.h), so that a save after this step resumes
  // as the grown model and train.freeze = "original" knows the new layers.
  upscale_record_.clear();
  upscale_record_["method"] = options.method;
  upscale_record_["source_file"] = std::string("(in-run growth)");
  upscale_record_["source_step"] = done;
  upscale_record_["source_layers"] = before;
  upscale_record_["layers"] = up.target().n_layer;
  upscale_record_["mapping"] = mapping;
  const std::string layout_before = layout_text();
  const bool relayout = settle_growth(up.target().n_layer);
  const std::set<std::string> frozen =
      frozen_parameters(cfg_.train.freeze, global_parameter_names(up.target()), up.target().n_layer,
                        {upscale_record_, "this run's growth at step " + std::to_string(done)});
  build_model(up.target(), frozen);
  for (const ParamEntry& e : params_->entries())
    copy_local_part(e, up.parameter(e.spec.name, source_params),
                    params_->flat_params().ptr<float>() + e.offset);
  const FullOptimizerState st = opt_->state_buffers();
  float* m[2] = {st.state.exp_avg.ptr<float>(), st.state.exp_avg_sq.ptr<float>()};
  for (int k = 0; k < 2; ++k) {
    std::fill(m[k], m[k] + st.state.exp_avg.numel(), 0.0f);
    if (!carry) continue;
    for (const ParamEntry& e : params_->entries())
      if (!e.frozen)
        copy_local_part(e, up.moment(e.spec.name, source_params, source_moment(k)),
                        m[k] + e.offset - params_->frozen_numel());
  }
  opt_->load_state(ex_, st.state, steps);
  params_->refresh_compute_copy(ex_);
  check_tied_copies("after the growth at step " + std::to_string(done));
  if (profiling_)
    for (const auto& chunk : chunks_) chunk->set_profiler(&profiler_);
  flops_per_token_ = flops_per_token(up.target(), cfg_.train.seq_len);
  growth_step_ = done;
  apply_rewarm();
  progress_.message("upscale at step " + std::to_string(done) + ": " + options.method + " grew " +
                    std::to_string(before) + " layers to " + std::to_string(up.target().n_layer) + " (" + mapping +
                    "), optimizer moments " + (carry ? "carried" : "fresh") +
                    (relayout ? ", layout " + layout_before + " -> " + layout_text() : "") +
                    (frozen.empty() ? "" : ", " + std::to_string(frozen.size()) + " parameters frozen"));
  JsonRecord rec;
  rec.add("step", done)
      .add("event", std::string("upscale"))
      .add("method", options.method)
      .add("layers_before", before)
      .add("layers", up.target().n_layer)
      .add("mapping", mapping);
  if (relayout) rec.add("layout_before", layout_before).add("layout", layout_text());
  metrics_.write(rec);
}

// The config from a growth on: the grown depth, the stages cut again (pp_layers cleared), no growth
// pending (the config a save stores is the grown model's, and it validates: align_data is ot's
// alone), and the layout of [upscale] tp, pp, dp, switched to when it is another. True when it was.
bool Trainer::settle_growth(int64_t layers) {
  const ParallelConfig next = parallel_after_growth(cfg_, grid_.world_size());
  cfg_.model.n_layer = layers;
  cfg_.parallel.pp_layers.clear();
  UpscaleConfig& u = cfg_.upscale;
  u.method.clear();
  u.at_step = u.align_data = u.tp = u.pp = u.dp = 0;
  if (!another_layout(grid_, next)) return false;
  switch_layout(next);
  return true;
}

// "tp 2 x dp 1 x pp 1" (and cp when > 1): the layout, for the growth's messages and metrics.
std::string Trainer::layout_text() const {
  return "tp " + std::to_string(grid_.tp_size()) + " x dp " + std::to_string(grid_.dp_size()) + " x pp " +
         std::to_string(grid_.pp_size()) + (grid_.cp_size() > 1 ? " x cp " + std::to_string(grid_.cp_size()) : "");
}

// [upscale] tp, pp, dp: the same ranks laid out again (collective over every rank). The model and
// the optimizer, which hold the old communicators, go first; then the grid, its communicators
// (watched as at the start), the tp and cp groups, the batch layout and accumulation for the new
// dp, and a data loader re-positioned at the next step for this rank's new dp shard. The caller
// builds the model on it.
void Trainer::switch_layout(const ParallelConfig& next) {
  opt_.reset();
  chunks_.clear();
  model_ = nullptr;
  groups_ = GradGroups{};
  loader_.reset();  // made again at the next step, at its position, for the new dp rank
  tp_ = TensorParallel{};
  tp_compression_.reset();
  cp_ = ContextParallel{};
  comms_.reset();
  cfg_.parallel = next;
  const int64_t world = grid_.world_size();
  grid_ = ProcessGrid(grid_degrees(cfg_.parallel), world, world_rank_of(world_));
  if (world_ != MPI_COMM_NULL && world > 1) comms_ = grid_comms_of(grid_, world_, ex_, cfg_.parallel);
  if (watchdog_ && comms_) comms_->watch(*watchdog_, grid_, cfg_.parallel.timeout_s);
  cp_ = context_parallel_of(cfg_.parallel, comms_.get());
  tp_compression_ = make_tp_compression(cfg_.parallel, alloc_);  // parallel.tp_comm_compression
  if (grid_.tp_size() > 1) tp_ = TensorParallel{comms_->tp.get(), cfg_.parallel.sequence_parallel,
                                              cfg_.parallel.tp_overlap_chunks, tp_compression_.get()};
  accum_ = tessera::grad_accum_steps(cfg_, grid_.dp_size());
  layout_ = BatchLayout{cfg_.train.global_batch, cfg_.train.micro_batch, grid_.dp_size(), grid_.dp_rank()};
  dp_bytes_at_record_ = tp_bytes_at_record_ = pp_bytes_at_record_ = cp_bytes_at_record_ = 0;  // new counters
  pipeline_timer_ = PipelineTimer{};
  if (profiling_ && comms_)
    for (Communicator* c : comms_->all()) c->set_profiler(&profiler_);
}

// [upscale] rewarm_steps after a growth at growth_step_ (the resumed file's, or this run's).
void Trainer::apply_rewarm() {
  if (cfg_.upscale.rewarm_steps > 0 && growth_step_ >= 0)
    schedule_.restart(growth_step_, cfg_.upscale.rewarm_steps);
}

std::vector<ParamSegment> Trainer::segments() const {
  std::vector<ParamSegment> segs;
  for (const ParamEntry& e : params_->entries()) {
    if (e.frozen) continue;  // not the optimizer's: segments tile the trainable region
    bool decay = false;
    switch (e.spec.kind) {
      case ParamKind::Matrix: decay = true; break;
      case ParamKind::Norm: decay = cfg_.optim.decay_norms; break;
      case ParamKind::Bias: decay = cfg_.optim.decay_biases; break;
      case ParamKind::Embedding: decay = cfg_.optim.decay_embeddings; break;
    }
    segs.push_back({e.offset - params_->frozen_numel(), e.local_shape.numel(), decay});
  }
  return segs;
}

// The ranks that hold the same parameters and different tokens: the optimizer reduces the
// gradients over them, and the step's loss and target counts are summed over them. While cp = 1
// the dp x cp group has the dp group's ranks, and the dp communicator itself is used: its byte
// counter (dp_bytes_per_step) and its watchdog name ("dp group") stay what they were.
Communicator* Trainer::dp_cp_group() {
  if (!comms_) return nullptr;
  return grid_.cp_size() == 1 ? comms_->dp.get() : comms_->dp_cp.get();
}

// Runs this rank's micro-batches of step s (the one-stage schedule: gradient accumulation) and
// leaves in the gradients the gradient of the mean loss over the whole global batch (every rank's
// tokens): each rank scales its losses by 1 / (targets in the global batch), and finalize_grads
// sums the ranks' gradients (buckets started during the last micro-batch's backward, or ZeRO-1's
// reduce-scatter after it) and computes the global gradient norm. Returns that global mean loss
// and the norm, or nothing when the ranks voted to stop before the forwards (nothing has changed
// then).
std::optional<Trainer::Reduced> Trainer::forward_backward(int64_t s) {
  std::vector<Batch> batches;  // the micro-batches; parallel.cp_mode = "dynamic": this cp rank's passes
  std::vector<CpPlacement> groups;  // dynamic: each pass's cp subgroup (DynamicCp::passes)
  double my_targets = 0;  // counted on the host, where the batches are: no device read
  // The batches are read (or fail to be read) before anything changes, and the ranks agree on
  // the outcome before the first collective of the step: a rank stopped by a signal while it waits
  // for data, or failing to read it, takes every rank out of the step together.
  std::string read_error;
  try {
    if (!loader_)
      loader_ = tokens_ ? tokens_->loader(grid_.dp_rank())
                        : std::make_unique<DataLoader>(*data_.train, sampler_, layout_,
                                                       consumed_at_start_ + (s - start_step_) * cfg_.train.global_batch);
    for (int64_t m = 0; m < accum_; ++m) {
      std::optional<Batch> next = loader_->next([this] { return stop_requested(); });
      if (!next) break;  // a stop signal: the vote below sees it
      if (data_.document_eot >= 0 && next->doc_start.empty())  // (packed batches come with their documents)
        mark_documents(*next, data_.document_eot);  // on the whole window
      if (dynamic_cp_) {  // this cp rank's passes: its whole rows, its share of each split subgroup's
        for (DynamicCp::Pass& p : dynamic_cp_->passes(*next)) {
          groups.push_back(p.group);
          batches.push_back(std::move(p.batch));
        }
        if (m + 1 == accum_ && batches.empty()) {  // nothing planned here this step: a pass of no targets
          DynamicCp::Pass idle = dynamic_cp_->idle_pass(*next);
          groups.push_back(idle.group);
          batches.push_back(std::move(idle.batch));
        }
      } else {
        batches.push_back(cp_share(*next, cp_));  // this cp rank's positions of each sequence
      }
    }
    for (const Batch& b : batches)
      my_targets += static_cast<double>(
          std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t != kIgnoreTarget; }));
  } catch (const std::exception& e) {
    read_error = e.what();
  }
  if (vote_stop(read_error)) return std::nullopt;
  if (tokens_) tokens_->advance();  // the step's batches are read: its cursor is the next step's
  std::vector<double> targets = {my_targets};
  sum_over_group(targets, dp_cp_group());
  const double loss_scale = targets[0] > 0 ? 1.0 / targets[0] : 0.0;
  // What the step reads back to the host, once, after the backward: the micro-batches' loss sums
  // (loss, targets; added up on the model's device) and the squared gradient norm.
  const Buffer step_reads(alloc_, DType::F64, {3}, MemCategory::Workspace);
  const Tensor step_sums = step_reads.tensor().slice_rows(0, 2);
  if (grid_.pp_size() > 1) {
    run_pipeline(s, batches, loss_scale, step_sums);
    return finish_step(step_reads, targets[0], chunks_.back()->stage().head);
  }
  // What a micro-batch's forward keeps for its backward: its ids on the model's device (uploaded
  // through the allocator; backward reads the tokens again) and the model's context.
  struct InFlight {
    Buffer tokens, targets;
    DeviceImages images;  // model.kind = "vlm": the patches, kept until the backward
    GptCtx ctx;
  };
  std::map<int64_t, InFlight> in_flight;
  StepCallbacks run;
  // Dynamic cp: each pass runs with its subgroup selected (the attention's ring, or none), timed.
  const auto pass_group = [&](int64_t m) {
    return dynamic_cp_ ? groups.at(static_cast<size_t>(m)) : CpPlacement{};
  };
  CpSubgroupComm* const subgroups = dynamic_cp_ ? dynamic_cp_->comm() : nullptr;
  const auto busy = [&](std::chrono::steady_clock::time_point t0) {
    if (dynamic_cp_)
      dynamic_cp_->add_busy(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  run.forward = [&](int64_t m) {
    const auto t0 = std::chrono::steady_clock::now();
    const CpSubgroupScope scope(subgroups, pass_group(m).first, pass_group(m).ranks);
    const Batch& b = batches.at(static_cast<size_t>(m));
    InFlight& f = in_flight[m];
    f.tokens = upload(ex_, alloc_, Tensor(const_cast<int32_t*>(b.tokens.data()), DType::I32, {b.B, b.T}),
                      MemCategory::Activations);
    f.targets = upload(ex_, alloc_, Tensor(const_cast<int32_t*>(b.targets.data()), DType::I32, {b.B, b.T}),
                       MemCategory::Activations);
    if (b.num_images() > 0) f.images = upload_images(ex_, alloc_, b, model_->config(), model_->dtype());
    const std::optional<LoraDropout> drop = lora_dropout_at(cfg_.lora, cfg_.train.seed, s, layout_, m);
    model_->forward(ex_, f.ctx, alloc_, f.tokens, f.targets, share_layout(b, cp_, cfg_.train.seq_len), f.images.get(),
                    drop ? &*drop : nullptr);
    accumulate(ex_, step_sums, f.ctx.loss_sums);
    busy(t0);
  };
  run.backward = [&](int64_t m, bool last) {
    const auto t0 = std::chrono::steady_clock::now();
    const CpSubgroupScope scope(subgroups, pass_group(m).first, pass_group(m).ranks);
    // Only the last backward communicates: earlier ones only accumulate locally.
    model_->backward(ex_, in_flight.at(m).ctx, alloc_, loss_scale, last ? grads_hook() : Gpt::GradsReady{});
    in_flight.erase(m);
    busy(t0);
  };
  run_schedule(one_stage_schedule(static_cast<int64_t>(batches.size())).actions_of(grid_.pp_rank()), run);
  return finish_step(step_reads, targets[0], true);
}

// After the step's backwards: finalize_grads (the sums over the groups and the global norm), and
// the step's mean loss from the loss sums of the stage with the head (has_loss; summed over the
// pipeline so that every stage reports it) and of every data-parallel replica.
// step_reads: (loss sum, target count, squared gradient norm), read to the host at once (the step's
// one device synchronization for numbers).
Trainer::Reduced Trainer::finish_step(const Tensor& step_reads, double targets, bool has_loss) {
  {
    ProfileScope scope(prof(), OpFamily::Communication);  // the dp reduction's waits
    finalize_grads(ex_, flat_, *opt_, groups_, alloc_, step_reads.slice_rows(2, 3));
  }
  const std::vector<double> read = read_values(ex_, step_reads);  // the step's loss and norm read
  std::vector<double> loss = {has_loss ? read[0] : 0.0};
  if (grid_.pp_size() > 1) sum_over_group(loss, comms_->pp.get());
  sum_over_group(loss, dp_cp_group());
  return Reduced{targets > 0 ? loss[0] / targets : 0.0, std::sqrt(read[2])};
}

// The pipeline's first and last stage each hold the tied token embedding (the last a copy for the
// LM head); finalize_grads keeps them equal by summing their gradients, which only works when they
// start equal. Both are initialized from the same name's seed and read from the same stored tensor,
// so a difference here is a bug: checked bit for bit (the first stage's broadcast over the embedding
// group), and refused on every rank.
void Trainer::check_tied_copies(const std::string& when) {
  if (!comms_ || grid_.pp_size() == 1) return;
  std::string error;
  Communicator& group = *comms_->embedding;
  for (const ParamEntry& e : params_->entries()) {
    if (!e.spec.sum_grad_over_embedding_group || group.size() < 2) continue;
    const Tensor mine = params_->param(params_->find(e.spec.name));
    const Buffer first(alloc_, mine.dtype, mine.shape, MemCategory::Workspace);
    copy(ex_, first, mine);
    group.broadcast(first, 0);
    // first - mine is exactly zero where the two floats are equal (NaN makes the norm NaN: differs).
    scale(ex_, first, -1.0);
    accumulate(ex_, first, mine);
    const Buffer diff(alloc_, DType::F64, {1}, MemCategory::Workspace);
    squared_norm(ex_, diff, first);
    if (!(read_scalar(ex_, diff) == 0.0))
      error = "the pipeline's copies of the tied " + e.spec.name + " differ between the first and the last stage " +
              when + " (pipeline rank " + std::to_string(grid_.pp_rank()) + ")";
  }
  if (world_ != MPI_COMM_NULL) throw_if_any_failed(world_, error);
}

// The forwards and backwards of step s's micro-batches through this rank's pipeline chunks, in the
// order of parallel.pp_schedule (parallel/pipeline_schedule.h, run by run_schedule): the chunk with
// the embedding uploads the token ids, the one with the head the targets and adds each micro-batch's
// loss sums into step_sums; activations go to the next virtual stage and their gradients back over
// comms_->pp (pp group rank = stage; chunk c of rank r is virtual stage c pp + r). Every tensor sent
// (a forward's output, a backward's input gradient) is kept until run_schedule returns, as the
// executor requires; a micro-batch's context and received input go with its backward.
void Trainer::run_pipeline(int64_t s, const std::vector<Batch>& batches, double loss_scale, const Tensor& step_sums) {
  const int64_t pp = grid_.pp_size(), rank = grid_.pp_rank(), vpp = static_cast<int64_t>(chunks_.size());
  const int64_t T = cfg_.train.seq_len, C = model_->config().n_embd;
  const bool sp = grid_.tp_size() > 1 && cfg_.parallel.sequence_parallel;
  const SequenceLayout seq = cp_.layout(T);  // this cp rank's positions (all of them when cp = 1)
  const int64_t T_local = sp ? seq.length() / grid_.tp_size() : seq.length();
  struct InFlight {
    Buffer tokens, targets;  // ids on the model's device: tokens for the embedding, targets for the head
    DeviceImages images;     // model.kind = "vlm", the chunk with the embedding: the patches, kept until its backward
    Buffer input;            // the received activations (B, T_local, C) of a chunk without the embedding
    Buffer grad;             // received output gradient (and, written in place, the input gradient sent)
    Tensor output;           // the forward's output, owned by ctx until its backward
    GptCtx ctx;
  };
  using Key = std::pair<int64_t, int64_t>;  // (micro-batch, chunk)
  std::map<Key, InFlight> in_flight;
  // zb-h1: what a backward split in two (B, input_only) left for its W: its linear layers' saved
  // inputs and output gradients, from B until W (model/weight_grads.h).
  std::map<Key, WeightGrads> deferred;
  std::map<Key, Buffer> sent_grads;
  std::vector<Buffer> sent_outputs;
  const auto chunk = [&](int64_t c) -> const Gpt& { return *chunks_.at(static_cast<size_t>(c)); };
  const auto ids = [&](const std::vector<int32_t>& v, const Batch& b) {
    return upload(ex_, alloc_, Tensor(const_cast<int32_t*>(v.data()), DType::I32, {b.B, b.T}), MemCategory::Activations);
  };  // b: this cp rank's share (T = its positions)
  const auto act_shape = [&](int64_t m) { return Shape{batches.at(static_cast<size_t>(m)).B, T_local, C}; };
  PipelineCallbacks run;
  run.exec = &ex_;
  run.forward = [&](int64_t m, int64_t c) {
    const Batch& b = batches.at(static_cast<size_t>(m));
    const StageSpec& stage = chunk(c).stage();
    InFlight& f = in_flight[{m, c}];
    if (stage.embedding) f.tokens = ids(b.tokens, b);
    if (stage.embedding && b.num_images() > 0) f.images = upload_images(ex_, alloc_, b, chunk(c).config(), chunk(c).dtype());
    if (stage.head) f.targets = ids(b.targets, b);
    const std::optional<LoraDropout> drop = lora_dropout_at(cfg_.lora, cfg_.train.seed, s, layout_, m);
    // A chunk without the embedding gets activations, not ids: it is told the positions they hold.
    f.output = chunk(c).forward(ex_, f.ctx, alloc_, stage.embedding ? f.tokens.tensor() : f.input.tensor(),
                                stage.head ? f.targets.tensor() : Tensor(), share_layout(b, cp_, T), f.images.get(),
                                drop ? &*drop : nullptr);
    if (stage.head) accumulate(ex_, step_sums, f.ctx.loss_sums);
  };
  run.backward = [&](const BackwardCall& call) {
    const Key key{call.micro_batch, call.chunk};
    const StageSpec& stage = chunk(call.chunk).stage();
    InFlight& f = in_flight.at(key);
    // The output was sent: backward releases the context, so the output's storage moves out first
    // (backward reads a block's input, never the chunk's output).
    if (!stage.head) sent_outputs.push_back(std::move(f.ctx.resid.back()));
    if (!stage.embedding && !f.grad.defined())
      f.grad = Buffer(alloc_, DType::F32, act_shape(call.micro_batch), MemCategory::Activations);
    const Gpt::OutputGrad from = stage.head ? Gpt::OutputGrad::loss(loss_scale) : Gpt::OutputGrad::output(f.grad);
    // B alone defers its weight gradients: the chunk's gradients are final only after its last W.
    WeightGrads* split = call.input_only ? &deferred.emplace(key, WeightGrads(alloc_)).first->second : nullptr;
    chunk(call.chunk).backward(ex_, f.ctx, alloc_, from, stage.embedding ? Tensor() : f.grad.tensor(),
                               call.last && !split ? grads_hook() : Gpt::GradsReady{}, split);
    // The input gradient is sent: kept until run_schedule returns. The first chunk's received output
    // gradient is not sent on: freed with the rest of the micro-batch.
    if (f.grad.defined() && !stage.embedding) sent_grads[key] = std::move(f.grad);
    in_flight.erase(key);
  };
  run.backward_weight = [&](const BackwardCall& call) {
    const Key key{call.micro_batch, call.chunk};
    chunk(call.chunk).backward_weight(ex_, deferred.at(key), call.last ? grads_hook() : Gpt::GradsReady{});
    deferred.erase(key);
  };
  run.recompute = [&](int64_t m, int64_t c) {  // model.recompute = "bubble": the R action
    chunk(c).recompute(ex_, in_flight.at({m, c}).ctx, alloc_);
  };
  run.p2p = [&](const std::vector<Action>& batch) {
    std::vector<P2POp> ops;
    for (const Action& a : batch) {
      const Key key{a.micro_batch, a.chunk};
      const int peer = static_cast<int>(peer_of(a, rank, pp));
      // Tags name the boundary between virtual stages v and v + 1 the tensor crosses, and its kind.
      const int64_t v = a.chunk * pp + rank;
      const bool activation = a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvActivation;
      const bool outgoing = a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvGrad;
      const int64_t boundary = outgoing ? v : v - 1;
      const int tag = static_cast<int>(2 * (a.micro_batch * pp * vpp + boundary) + (activation ? 0 : 1));
      switch (a.kind) {
        case ActionKind::SendActivation: ops.push_back(P2POp::send(in_flight.at(key).output, peer, tag)); break;
        case ActionKind::SendGrad: ops.push_back(P2POp::send(sent_grads.at(key), peer, tag)); break;
        case ActionKind::RecvActivation: {
          InFlight& f = in_flight[key];
          f.input = Buffer(alloc_, DType::F32, act_shape(a.micro_batch), MemCategory::Activations);
          ops.push_back(P2POp::recv(f.input, peer, tag));
          break;
        }
        case ActionKind::RecvGrad: {
          InFlight& f = in_flight.at(key);
          f.grad = Buffer(alloc_, DType::F32, act_shape(a.micro_batch), MemCategory::Activations);
          ops.push_back(P2POp::recv(f.grad, peer, tag));
          break;
        }
        default: TESSERA_CHECK(false, "pipeline p2p: ", to_string(a), " is not a transfer");
      }
    }
    return comms_->pp->batch_send_recv_async(ops);
  };
  const Schedule schedule = pipeline_schedule(pp, vpp, static_cast<int64_t>(batches.size()),
                                              parse_pipeline_kind(cfg_.parallel.pp_schedule),
                                              recompute_in_bubbles(cfg_), std::max<int64_t>(1, cfg_.model.recompute_ahead));
  pipeline_timer_.run(schedule.actions_of(rank), run);  // run_schedule, timed (pp_bubble_fraction)
}

bool Trainer::vote_stop(const std::string& read_error) {
  std::vector<double> votes = {stop_requested() ? 1.0 : 0.0, read_error.empty() ? 0.0 : 1.0};
  sum_over_grid(votes, comms_.get());
  if (votes[1] > 0) {
    if (!comms_) throw DataError(read_error);
    try {
      throw_if_any_failed(world_, read_error);  // the lowest failed rank's message, on every rank
    } catch (const CollectiveError& e) {
      throw DataError(e.what());
    }
  }
  return votes[0] > 0;
}

std::string Trainer::nonfinite_report(double loss, double norm) {
  if (!std::isfinite(loss)) return "loss is " + std::to_string(loss);
  // Only on a skipped step: every gradient's sum of squares, read at once.
  const Buffer sq(alloc_, DType::F64, {params_->size()}, MemCategory::Workspace);
  fill_zero(ex_, sq);
  for (int id = 0; id < params_->size(); ++id)
    if (params_->entry(id).has_grad()) squared_norm(ex_, sq.tensor().slice_rows(id, id + 1), params_->grad(id));
  const std::vector<double> sqs = read_values(ex_, sq);
  for (int id = 0; id < params_->size(); ++id)
    if (!std::isfinite(sqs[static_cast<size_t>(id)]))
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
    params_->zero_grads(ex_);
  }
  const std::optional<Reduced> reduced = forward_backward(s);
  if (!reduced) {
    r.abandoned = true;
    return r;
  }
  r.loss = reduced->loss;
  r.grad_norm = reduced->grad_norm;
  ProfileScope scope(prof(), OpFamily::AdamW);  // clipping and the update
  r.lr = schedule_.at(s);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;
    r.problem = nonfinite_report(r.loss, r.grad_norm);
    return r;
  }
  opt_->step(ex_, r.lr, clip_factor(r.grad_norm, cfg_.optim.grad_clip));
  // bf16: the replicated optimizer rounds the trainable masters into the copy in its own pass (the
  // frozen ones never change); ZeRO-1's shards are converted after their all-gather.
  if (!opt_->refreshes_compute_copy()) params_->refresh_compute_copy(ex_);
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
  if (dynamic_cp_) {  // the plans' rows split and whole per step, and the cp ranks' busy time (collective over cp)
    const DynamicCp::Window w = dynamic_cp_->take_window(std::max<int64_t>(1, done - step_at_record_));
    rec.add("cp_rows_split", w.rows_split)
        .add("cp_rows_whole", w.rows_whole)
        .add("cp_predicted_imbalance", w.predicted_imbalance)
        .add("cp_predicted_s", w.predicted_s)
        .add("cp_predicted_static_s", w.predicted_static_s)
        .add("cp_busy_s", w.busy_s)
        .add("cp_busy_max_s", w.busy_max_s)
        .add("cp_busy_imbalance", w.busy_imbalance);
  }
  if (tokens_) {  // variable-length batches: real tokens per step, their rate and dp imbalance since the last record
    const TokenBatching::Window w = tokens_->take_window();
    rec.add("real_tokens", w.tokens_per_step)
        .add("real_tokens_per_s", step_seconds > 0 ? w.tokens_per_step / step_seconds : 0.0)
        .add("dp_token_imbalance", w.imbalance_mean)
        .add("dp_token_imbalance_max", w.imbalance_max);
  }
  add_memory_peaks(rec, alloc_, comms_ && grid_.pp_size() > 1 ? comms_->pp.get() : nullptr);  // collective over pp
  if (comms_) {
    // Bytes this rank sent over the data-parallel group per step since the last record (ring
    // volumes, parallel/communicator.h): 2 (p-1)/p of the gradients (ZeRO-1: a reduce-scatter and an
    // all-gather of (p-1)/p each), plus a few scalars; and over the tp group (tensor_parallel.h edges).
    const int64_t steps = std::max<int64_t>(1, done - step_at_record_);
    // (under cp the dp x cp group's, which carries the gradient reduction then)
    const int64_t sent = dp_cp_group()->bytes_sent(), pp_sent = comms_->pp->bytes_sent();
    // (less the exact twins parallel.tp_comm_compression_probe runs beside the compressed collectives)
    const int64_t tp_sent = comms_->tp->bytes_sent() - (tp_compression_ ? tp_compression_->probe_bytes() : 0);
    if (tp_compression_ && tp_compression_->probing()) add_tp_compression_probe(rec, *tp_compression_);
    rec.add("dp_bytes_per_step", (sent - dp_bytes_at_record_) / steps);
    if (grid_.tp_size() > 1) rec.add("tp_bytes_per_step", (tp_sent - tp_bytes_at_record_) / steps);
    dp_bytes_at_record_ = sent;
    tp_bytes_at_record_ = tp_sent;
    // Over the pipeline group: the activations and their gradients, plus the loss and norm sums.
    if (grid_.pp_size() > 1) {
      rec.add("pp_bytes_per_step", (pp_sent - pp_bytes_at_record_) / steps);
      add_pipeline_times(rec, reduce_pipeline_times(pipeline_timer_.take(), comms_->pp.get()));  // collective over pp
    }
    pp_bytes_at_record_ = pp_sent;
    // Over the context-parallel group: K/V (and their gradients) of every layer, ring or all-gather.
    const int64_t cp_sent = comms_->cp->bytes_sent();
    if (grid_.cp_size() > 1) rec.add("cp_bytes_per_step", (cp_sent - cp_bytes_at_record_) / steps);
    cp_bytes_at_record_ = cp_sent;
    step_at_record_ = done;
  }
  metrics_.write(rec);
}

bool Trainer::evaluate(int64_t s, TrainSummary& summary) {
  if (!data_.valid && !data_.task && !data_.scenes && !data_.captions) return true;
  const TpCompression::Paused no_feedback(tp_compression_.get());  // evaluation is no step of the residuals
  const auto t0 = Clock::now();
  // Every rank asks before each forward: a stop anywhere abandons the evaluation on all ranks at
  // the same batch (tensor-parallel forwards are collective), and the stop vote that follows
  // saves and exits.
  const EvalGate gate = [this](const std::string& read_error) { return !vote_stop(read_error); };
  std::ostringstream os;
  os << std::fixed << "eval  step " << s << ":";
  JsonRecord record;
  record.add("step", s);
  std::optional<double> val_loss;
  std::optional<AccuracyResult> acc;
  // Under pp every stage runs its part of each forward; the one with the head gives the result.
  PipelineLink link;
  if (grid_.pp_size() > 1) {
    link.pp = comms_->pp.get();
    for (const auto& chunk : chunks_) link.chunks.push_back(chunk.get());
    link.sequence_shards = grid_.tp_size() > 1 && cfg_.parallel.sequence_parallel ? grid_.tp_size() : 1;
  }
  link.cp = cp_;  // the validation batches are cut over cp; greedy answers run whole on every cp rank
  if (data_.valid) {
    val_loss = validation_loss(ex_, *model_, alloc_, *data_.valid, cfg_.train.eval_batches, cfg_.train.micro_batch,
                               gate, link, data_.document_eot);
    if (!val_loss) return false;
    os.precision(4);
    os << " val_loss " << *val_loss;
    record.add("val_loss", *val_loss);
  }
  // An accuracy's part of the progress line and of the metrics record.
  const auto report = [&](const char* label, const AccuracyResult& a) {
    os.precision(1);
    os << ", " << label << " " << 100.0 * a.accuracy() << "% (" << a.correct << "/" << a.total << ")";
    for (const auto& e : a.examples) os << " | " << e;
    record.add("val_accuracy", a.accuracy());
  };
  if (data_.task) {
    acc = addition_accuracy(ex_, *model_, alloc_, *data_.task, cfg_.data.val_examples, gate, link);
    if (!acc) return false;
    report("accuracy", *acc);
  }
  if (data_.scenes) {
    acc = caption_accuracy(ex_, *model_, alloc_, *data_.scenes, cfg_.data.val_examples, cfg_.train.micro_batch, gate,
                           link);
    if (!acc) return false;
    report("caption accuracy", *acc);
  }
  if (data_.captions) {
    acc = image_text_caption_accuracy(
        ex_, *model_, alloc_, *data_.captions, cfg_.data.val_examples, cfg_.train.micro_batch,
        data_.caption_tokenizer ? known_ids_decoder(*data_.caption_tokenizer) : CaptionDecoder{}, gate);
    if (!acc) return false;
    report("caption accuracy", *acc);
  }
  if (val_loss) summary.val_loss = *val_loss;
  if (acc) summary.val_accuracy = acc->accuracy();
  os.precision(1);
  os << " [" << seconds_since(t0) << "s]";
  progress_.message(os.str());
  metrics_.write(record);
  return true;
}

void Trainer::print_header() {
  // Every rank runs on its own cores: the job's peak is the world's. On a GPU only log.peak_gflops
  // gives one (this build knows no GPU's peak): without it MFU is not reported (0).
  const double rank_peak = cfg_.log.peak_gflops > 0 ? cfg_.log.peak_gflops : device_.is_cpu() ? cpu_peak_gflops() : 0.0;
  peak_flops_ = rank_peak * 1e9 * static_cast<double>(grid_.world_size());
  // The model's parameters: under pp each stage counts its own (the tied copy not), summed (collective).
  std::vector<double> numel = {static_cast<double>(params_->global_numel())};
  if (grid_.pp_size() > 1) sum_over_group(numel, comms_->pp.get());
  std::ostringstream os;
  os << "model " << (model_->config().is_vlm() ? "vlm " : "") << model_->config().preset << ": " << static_cast<int64_t>(numel[0]) << " parameters, "
     << model_->config().n_layer << " layers, C=" << model_->config().n_embd << " | batch "
     << cfg_.train.global_batch << " x " << cfg_.train.seq_len << " tokens (micro "
     << (auto_micro_batch_ ? "auto = " : "") << cfg_.train.micro_batch
     << ", accumulation " << accum_ << ") | " << cfg_.train.steps << " steps | MFU vs "
     << (cfg_.log.peak_gflops > 0 ? "log.peak_gflops " : device_.is_cpu() ? "CPU peak " : "no peak ") << static_cast<int64_t>(peak_flops_ / 1e9)
     << " GFLOP/s";
  if (!device_.is_cpu())
    os << "\ndevice: " << device_.str() << " per rank (train.device = \"cuda\")"
       << (cfg_.log.peak_gflops > 0 ? "" : "; MFU not reported: set log.peak_gflops to the GPU's peak");
  if (grid_.world_size() > 1)
    os << "\nlayout: " << grid_.world_size() << " ranks = tp " << grid_.tp_size() << " x dp " << grid_.dp_size()
       << (grid_.cp_size() > 1 ? " x cp " + std::to_string(grid_.cp_size()) + " (" + cfg_.parallel.cp_comm + ")" : "")
       << (grid_.pp_size() > 1 ? " x pp " + std::to_string(grid_.pp_size()) + " (" + cfg_.parallel.pp_schedule + ")" : "")
       << (grid_.tp_size() > 1 && cfg_.parallel.sequence_parallel ? " (sequence parallel)" : "") << "; "
       << params_->numel() << " parameters per rank";
  if (comms_)
    if (const auto* mpi = dynamic_cast<const MpiCommunicator*>(comms_->world.get()))
      os << "; MPI waits " << to_string(mpi->waits()) << " (parallel.mpi_wait = " << cfg_.parallel.mpi_wait << ")";
  if (recompute_in_bubbles(cfg_))
    os << "\nbubble recomputation: at most " << cfg_.model.recompute_ahead
       << " recomputed micro-batches held (model.recompute_ahead"
       << (cfg_.train.max_memory_gib > 0 ? ", the most whose estimate fits train.max_memory_gib" : "") << ")";
  if (tp_compression_ && grid_.tp_size() > 1)
    os << "\ntp communication: compressed, forward " << tp_compression_name(tp_compression_->mode(TpDirection::Forward))
       << ", backward " << tp_compression_name(tp_compression_->mode(TpDirection::Backward))
       << " (lossy; parallel.tp_comm_compression)";
  if (cfg_.train.dtype == "bf16")
    os << "\nprecision: bf16 GEMM inputs (weights' bf16 copy), fp32 accumulation, master weights, optimizer and "
          "loss; CPU kernel "
       << cpu_bf16_gemm_kernel();
  if (ckpt_) os << "\nrun id " << ckpt_->run_id();
  os << "\n" << memory_line_;
  if (!pp_cut_line_.empty()) os << "\n" << pp_cut_line_;
  if (!dynamic_cp_line_.empty()) os << "\n" << dynamic_cp_line_;
  progress_.message(os.str());
  if (!resumed_from_.empty())
    progress_.message("resumed from " + resumed_from_ + " at step " + std::to_string(start_step_));
  for (const std::string& w : resume_warnings_) progress_.message("warning: " + w);
  if (!initialized_from_.empty()) progress_.message(initialized_from_);
}

void Trainer::save_checkpoint(int64_t steps_done) {
  if (!ckpt_) return;  // no run directory and no checkpoint.dir: nothing is written
  TrainingState st;
  st.exec = ex_;  // downloaded through it: the file is the same from any device
  st.params = params_.get();
  const FullOptimizerState optimizer = opt_->gather_state();  // ZeRO-1: gathered over dp (collective)
  st.optimizer = optimizer.state;
  st.frozen = frozen_;
  if (!upscale_record_.empty()) st.extra_groups[kUpscaleGroup] = upscale_record_;  // carried on: "original", rewarm
  if (!lora_record_.empty()) st.extra_groups[kLoraGroup] = lora_record_;             // the base (app/lora.h)
  st.writes_frozen_model = !is_adapters_only(lora_record_);  // lora.checkpoint (app/checkpoint/adapter_checkpoint.h)
  if (tokens_) st.extra_groups[kTokenBatchingGroup] = tokens_->record();            // where the next step starts
  if (dynamic_cp_) st.extra_groups[kDynamicCpGroup] = dynamic_cp_->record();      // the cost model planned with
  st.step = steps_done;
  st.consumed_samples = consumed_at_start_ + (steps_done - start_step_) * cfg_.train.global_batch;
  st.tokens_seen = st.consumed_samples * cfg_.train.seq_len;
  st.config_toml = to_toml(cfg_);
  st.seeds = {{"train_seed", cfg_.train.seed}, {"data_seed", cfg_.data.seed}};
  st.writes_tensors = grid_.dp_rank() == 0 && grid_.cp_rank() == 0;  // replicas and cp ranks hold the same values
  st.writes_replicated = grid_.tp_rank() == 0;  // as do tp ranks, for what they hold whole
  WatchedWait watched(ckpt_wait_, "checkpoint save (waiting for the previous one, copying the state)");
  ckpt_->save(st);
  saved_step_ = steps_done;
}

void Trainer::save_after_stop(const std::string& why, int64_t done, const std::string& advice) {
  const std::string after = " after step " + std::to_string(done);
  if (!ckpt_) {
    progress_.message(why + after);
    return;
  }
  if (done > start_step_ && done != saved_step_) save_checkpoint(done);
  wait_for_checkpoint();
  if (done == saved_step_)
    progress_.message(why + ": saved " + ckpt_->last_path() + after + "; " + advice);
  else if (!resumed_from_.empty())  // no step completed since the resume: that file holds this state
    progress_.message(why + after + ", before this run completed a step: nothing new to save (" + resumed_from_ +
                      " holds step " + std::to_string(done) + "); " + advice);
  else
    progress_.message(why + " before the first step completed: nothing to save");
}

void Trainer::wait_for_checkpoint() {
  WatchedWait watched(ckpt_wait_, "checkpoint save (waiting for the writer thread)");
  ckpt_->wait();
}

// Why the loop should stop after this step, if it should (and with which exit code). Every rank
// must stop at the same step: signals and clocks are local, so the ranks agree on them first.
std::optional<std::pair<std::string, int>> Trainer::stop_reason(const StopSignals& stop, int64_t done,
                                                                double minutes) {
  const int sig = stop.signal_number();
  const bool time_up = cfg_.train.exit_after_minutes > 0 && minutes >= cfg_.train.exit_after_minutes;
  const bool save_failed = ckpt_ && ckpt_->failed();
  std::vector<double> votes = {sig == SIGINT ? 1.0 : 0.0, sig == SIGTERM || sig == SIGUSR1 ? 1.0 : 0.0,
                               time_up ? 1.0 : 0.0, save_failed ? 1.0 : 0.0};
  sum_over_grid(votes, comms_.get());
  // A background save failed (a full disk): every rank's writer fails at the same collective step,
  // so waiting rethrows the same error on every rank and the run ends now with one message,
  // instead of training on until the next save.
  if (votes[3] > 0) wait_for_checkpoint();
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
  signals_ = &stop;
  struct Forget {  // the handlers go when run() returns: so does the pointer to them
    const StopSignals*& p;
    ~Forget() { p = nullptr; }
  } forget{signals_};
  TrainSummary summary;
  summary.steps_done = start_step_;
  print_header();
  const auto t_start = Clock::now();
  try {
    train_loop(stop, summary, t_start);
  } catch (const DataError& e) {
    // Every rank is here together (the failure was voted), before the failed step changed anything.
    progress_.message(std::string("error: ") + e.what());
    save_after_stop("stopped by a data error", summary.steps_done,
                    "restore the data file and run the same command to resume");
    summary.exit_code = kExitError;
  }
  if (ckpt_) wait_for_checkpoint();
  summary.elapsed_s = seconds_since(t_start);
  progress_.finish();
  return summary;
}

void Trainer::train_loop(const StopSignals& stop, TrainSummary& summary, std::chrono::steady_clock::time_point t_start) {
  const auto minutes = [&] { return seconds_since(t_start) / 60.0; };
  // A stop the ranks voted for: save the state after `done` steps and leave with the signal's code.
  const auto stop_after = [&](int64_t done) {
    const auto why = stop_reason(stop, done, minutes());
    const auto [text, code] = why.value_or(std::make_pair(std::string("stopped by signal"), int(kExitInterrupted)));
    save_after_stop(text, done, "run the same command to resume");
    summary.exit_code = code;
  };
  double train_seconds = 0;
  int64_t consecutive_bad = 0;
  double window_seconds = 0;  // step time since the last record, for its tokens/s
  int64_t window_steps = 0;
  bool stopped_early = false;
  for (int64_t s = start_step_; s < cfg_.train.steps; ++s) {
    const auto t0 = Clock::now();
    const StepResult r = step(s);
    if (r.abandoned) {  // stopped while reading the step's data: the state is still that after s steps
      stop_after(s);
      return;
    }
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
    // [upscale]: the model grows after step at_step, before that step's evaluation and save.
    if (!cfg_.upscale.method.empty() && done == cfg_.upscale.at_step) grow(done);
    const bool last = done == cfg_.train.steps;
    // An evaluation abandoned for a signal records nothing; the vote below then stops the run.
    if (!last && cfg_.train.eval_every > 0 && done % cfg_.train.eval_every == 0) evaluate(done, summary);
    if (auto why = stop_reason(stop, done, minutes())) {
      save_after_stop(why->first, done, "run the same command to resume");
      summary.exit_code = why->second;
      stopped_early = true;
      break;
    }
    // The last step's save is the end-of-run one, unless checkpoint.at_end = false.
    const bool periodic = cfg_.checkpoint.every > 0 && done % cfg_.checkpoint.every == 0;
    if (periodic && !(last && cfg_.checkpoint.at_end)) save_checkpoint(done);
  }
  if (!stopped_early) {
    if (!evaluate(summary.steps_done, summary))
      stop_after(summary.steps_done);  // a signal during the final evaluation: saved; a resume evaluates
    else if (summary.steps_done > start_step_ && cfg_.checkpoint.at_end)
      save_checkpoint(summary.steps_done);
  }
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
  grid_degrees(p);
  TESSERA_CHECK(p.zero == 0 || p.zero == 1, "parallel.zero = ", p.zero,
                " is not supported: 0 (replicated optimizer state) or 1 (ZeRO-1, sharded over dp)");
  // model.kind = "vlm" trains on every layout: the vision tower runs on the stage with the
  // embedding (under pp chunk 0 of the first stage), its blocks split over tp; under sequence and
  // context parallelism each rank writes the image rows it holds (docs/multimodal.md).
  if (cfg.model.kind == "vlm")
    TESSERA_CHECK(cfg.upscale.pp <= 1, "model.kind = \"vlm\": growing onto pipeline stages in the run is not "
                  "built for a vision-language model; upscale.pp = ", cfg.upscale.pp,
                  ": leave upscale.pp at 0 or 1 (or grow through a checkpoint and resume under parallel.pp)");
}

namespace {
// parallel.timeout_s > 0 on more than one rank: a watchdog whose report ends the whole job (exit
// kExitCollectiveTimeout) instead of leaving it waiting forever on a stopped or dead rank.
std::unique_ptr<Watchdog> collective_watchdog(double timeout_s, MPI_Comm world) {
  if (timeout_s <= 0 || comm_size(world) < 2) return nullptr;
  return std::make_unique<Watchdog>(comm_rank(world), [timeout_s, world](const std::string& report) {
    std::fprintf(stderr, "tessera: error: collective timeout (parallel.timeout_s = %g): %s; aborting every rank\n",
                 timeout_s, report.c_str());
    std::fflush(nullptr);
    // As in main(): MPICH's launcher can drop output it has not forwarded when the abort arrives.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(world, kExitCollectiveTimeout);
  });
}
}  // namespace

int run_train_command(const TrainArgs& args) {
  MPI_Comm world = MPI_COMM_WORLD;  // the entry point: the one place the world is named
  const bool lead = comm_rank(world) == 0;
  set_threads_per_rank(world);  // app/launch.h: OMP_NUM_THREADS, else Slurm's CPUs per task, else a share
  // Setup problems (config, data, checkpoint) are usually the same on every rank; collected and
  // raised together so that one message is printed and every rank exits.
  Config cfg;
  std::string dir, error;
  std::vector<RunLock> locks;  // rank 0's, held until return; the kernel drops them if the process dies
  try {
    cfg = load_config(args.config_path, args.overrides);
    if (!args.print_config) {
      check_supported(cfg);
      dir = args.run_dir.empty() ? run_dir(cfg) : args.run_dir;
      if (lead) {
        check_writable_directories(dir, cfg, !args.run_dir.empty());
        // One job per run directory, before anything in it is written: a second one would
        // overwrite config.toml, interleave metrics.jsonl and race on `latest`.
        locks = lock_run_directories(dir, checkpoint_dir(cfg, dir));
        for (const RunLock& l : locks)
          if (!l.warning().empty()) std::cerr << l.warning() << "\n";
      }
    }
  } catch (const Error& e) {
    error = e.what();
  }
  throw_if_any_failed(world, error);  // a held lock stops every rank with one message
  if (args.print_config) {
    if (lead) std::cout << to_toml(cfg);
    return kExitOk;
  }
  std::string auto_line;  // parallel.layout = "auto": planned for these ranks (collective), in the header
  if (cfg.parallel.layout == "auto") {
    const AutoLayoutChoice choice = choose_auto_layout(cfg, world);
    cfg = apply_auto_layout(cfg, choice);
    auto_line = describe_choice(choice);
  }
  const std::string launch = launch_summary(world, {args.config_path, args.overrides});  // collective
  if (lead) std::cout << build_info() << launch << auto_line;
  // Declared before the trainer, which reports to it: destroyed after it.
  const std::unique_ptr<Watchdog> watchdog = collective_watchdog(cfg.parallel.timeout_s, world);
  std::unique_ptr<Trainer> trainer;
  {
    WaitSlot* setup = watchdog ? &watchdog->add_slot("world group", all_ranks(comm_size(world)),
                                                     kRegionTimeoutFactor * cfg.parallel.timeout_s)
                               : nullptr;
    WatchedWait watched(setup, "setup (communicators, checkpoint resume)");
    try {
      trainer = std::make_unique<Trainer>(cfg, dir, world, watchdog.get());
      // Written once the Trainer has accepted the directory (a refused fresh start leaves the old
      // run's config.toml as it was).
      if (lead) {
        std::ofstream out(dir + "/config.toml");
        TESSERA_CHECK(out.is_open(), "cannot write ", dir, "/config.toml");
        out << to_toml(cfg);
      }
    } catch (const Error& e) {
      error = e.what();
    }
    throw_if_any_failed(world, error);
  }
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
