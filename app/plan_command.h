// `tessera plan`: the planner (plan/) wired to the trainer's config, validation and memory estimate.
// The planner knows layouts and costs; here a layout becomes the Config `tessera train` would run,
// judged by the trainer's own checks (app/config.h validate, validate_layout, validate_pipeline) and
// memory estimate (app/memory_check.h), and written back as TOML.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/memory_check.h"
#include "plan/calibrate.h"
#include "plan/search.h"

namespace tessera {

struct PlanArgs {
  std::string config_path;
  std::vector<std::string> overrides;  // --set: section.key=value for the config, cluster.key=value for the cluster
  int64_t gpus = 0;
  std::string cluster = "h100-sxm-80g";  // a [cluster] TOML file or a preset name
  std::string gpu_memory;                // "80GiB", "141GB": replaces the cluster's device memory
  int64_t top = 10;
  int64_t explain = 0;                   // 1-based row of the table; 0: none
  std::string emit_config;               // write the best layout's config here
  std::string dtype = "any";             // fp32, bf16 or any
  int64_t micro_batch = 0;               // 0: search it
  bool predict = false;                  // predict the config's own layout instead of searching
  bool calibrate = false;                // measure this machine instead (writes --out)
  std::string out;                       // --calibrate: the cluster file to write
  std::string device;                    // --calibrate --device: "cpu" or "cuda" (default: the config's train.device, else cpu)
};

// The config with the layout applied: parallel.{dp, tp, pp, vpp, pp_schedule, pp_layers = [], cp,
// cp_comm, sequence_parallel, zero}, train.micro_batch, train.dtype, model.recompute (recompute_layers
// from the layout), model.recompute_ops = [] and model.recompute_ops_layers (the layout's op sets per
// layer of the trainer's stage cut; [] without), parallel.layout = "explicit". Everything else as it
// was. data_vocab: data_vocab_size(base) (-1: read when the layout has op sets).
Config apply_layout(const Config& base, const plan::Layout& l, int64_t data_vocab = -1);

// The op sets the search may give a block under this config (plan/search.h
// default_recompute_op_sets), less what train refuses whatever the layout: none with
// model.activation_compression or model.recompute_ops set by the user; none that reruns a GEMM
// (qkv, mlp_in) with parallel.tp_overlap_chunks > 1, tp_comm_compression_forward = "int8-ef" or
// LoRA. (cp > 1 is per layout: the search leaves those out there.)
std::vector<RecomputeOps> recompute_op_sets_for(const Config& cfg);

// The layout a config asks for on `ranks` ranks (parallel.dp = -1: the rest), the inverse of
// apply_layout. Throws tessera::Error naming what the planner does not model: train.micro_batch = 0
// (automatic) or parallel.pp_layers given.
plan::Layout layout_of(const Config& cfg, int64_t ranks);

// What the planner plans for: the resolved model (the data's vocabulary filled in), seq_len, global batch.
plan::Workload workload_of(const Config& cfg);

// The trainer's checks for `ranks` ranks: validation (as load_config, check_supported and the
// Trainer's layout and pipeline checks) and the memory estimate of the largest rank, with
// checkpoints on (a host copy while one is written).
// The least memory any recomputation of the layout needs by the trainer's estimate `e` of it
// (plan/search.h MemoryUse::floor_device, device true, and floor_total): the estimate less its
// largest transient, plus under ZeRO-1 the moments gathered for a checkpoint (a transient whatever
// the activations). Checked against every recomputation: PlanCommand.RecomputeFloorIsBelowEveryRecomputation.
int64_t recompute_floor(const MemoryEstimate& e, const plan::Layout& l, bool device);

// cache_schedules: the estimates walk pipeline schedules generated once per (pp, vpp, micro-batches,
// kind, bubble, ahead) and kept with the checks (MemoryLayout::schedules); false: each estimate
// generates its own (the same numbers; the tests compare).
plan::PlanChecks trainer_checks(const Config& base, int64_t ranks, bool cache_schedules = true);

// The cluster: --cluster (file or preset; `local` from this machine), --gpu-memory and --set
// cluster.* applied.
plan::ClusterSpec cluster_of(const PlanArgs& args);

// The report: header, table, stats; --explain's breakdown of row `explain`.
std::string plan_report(const PlanArgs& args, const Config& cfg, const plan::ClusterSpec& cluster,
                        const plan::PlanResult& result);
std::string explain_report(const Config& cfg, const plan::ClusterSpec& cluster, const plan::Candidate& c, int64_t row);

// The whole command; returns the exit code. Prints to out.
int run_plan_command(const PlanArgs& args, std::ostream& out);

// `tessera plan --calibrate --out FILE`, collective over the world (mpirun -n N: the ranks a run
// would have): measures them (plan/calibrate.h) and rank 0 writes the [cluster] file that
// `--cluster FILE` reads. Returns the exit code. The device is --device, else the config's
// train.device, else the CPU; on "cuda" each rank measures its GPU as `tessera train` would pick
// and use it (app/device.h; the collectives through the config's parallel.comm, "mpi" without a
// config), and the file says cluster.device = "cuda" and the runtime's device name.
// `--set calibrate.KEY=VALUE` sets plan/calibrate.h CalibrationOptions: min_seconds, repeats,
// gemm_size, stream_elements, max_message_bytes (small ones: a quick check, rough numbers).
int run_calibrate_command(const PlanArgs& args, std::ostream& out);

// CalibrationOptions with `--set calibrate.KEY=VALUE` applied (assignments without that prefix
// are skipped); an unknown key or a value out of range is an Error naming it. ranks: the
// all-gather's smallest message is 4096 x ranks bytes, and each fit needs two sizes.
plan::CalibrationOptions calibration_options(const std::vector<std::string>& overrides, int64_t ranks);

// A calibrated cluster file describes one kind of device (cluster.device): a plan for a config
// whose train.device is the other kind is refused, naming the file, the key and both values.
// Clusters that do not say (presets, files of older builds) plan for any config.
void check_cluster_device(const Config& cfg, const plan::ClusterSpec& cluster, const std::string& cluster_arg);

}  // namespace tessera
