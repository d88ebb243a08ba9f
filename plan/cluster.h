// A cluster description for the planner: what one device computes, holds and moves, and the links
// between devices within a node and across nodes. Read from a [cluster] TOML table, or a named
// preset (H100/H200/A100 nodes of 8, the vendors' published figures: docs/planning.md), or `local`
// (this machine's MPI ranks: documented defaults, or what `tessera plan --calibrate` measured).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::plan {

// One kind of link: a message of b bytes takes latency + b / bandwidth (the alpha-beta model).
struct Link {
  double bandwidth = 1e9;  // bytes/s per device, one direction
  double latency = 1e-5;   // seconds per message (per step of a ring)
  // Fitted per collective by calibration; bandwidth 0: the two above (the all-reduce's) serve it too.
  double all_gather_bandwidth = 0, all_gather_latency = 0;
  double reduce_scatter_bandwidth = 0, reduce_scatter_latency = 0;
  double p2p_bandwidth = 0, p2p_latency = 0;
  bool operator==(const Link&) const = default;
};

// The links of a group of `ranks` devices within a node, fitted by calibration on groups of that
// size (consecutive ranks, as tensor-parallel groups are; every group of the node at once, as a
// layout runs them): a collective over a group of that size takes its time from these instead of the
// node's link (which calibration fits over all its ranks).
struct SizedLink {
  int64_t ranks = 2;
  Link link;
  bool operator==(const SizedLink&) const = default;
};

// A GEMM's measured rate at one shape, (m, k) x (k, n) -> (m, n), with fp32 inputs or a bf16 weight
// (train.dtype = "bf16"): what `tessera plan --calibrate CONFIG` times at the model's shapes.
struct GemmRate {
  int64_t m = 0, n = 0, k = 0;
  bool bf16 = false;
  double flops = 0;  // FLOP/s per device
  bool operator==(const GemmRate&) const = default;
};

// The op families of a training step besides the GEMMs, each timed by shape by `tessera plan
// --calibrate CONFIG` (plan/calibrate.h) as the trainer's kernels run them. Each has a fixed shape:
//   attention_forward, attention_backward   [b, t, s, h, kv, d]  (t queries over s keys, causal)
//   layernorm_*, rmsnorm_*                  [rows, c]
//   residual_*, gelu_*, swiglu_*, rope_*    [elements]           (swiglu: of its output; rope: of q or k)
//   embedding_*                             [rows, c, vocab]
//   cross_entropy_*                         [rows, vocab]
//   adamw, grad_norm                        [elements]           (adamw "bf16": with the bf16 compute copy)
//   linear_forward, linear_backward_input,  [rows, in, out, bias] (bias 1 with one, 0 without; "bf16": the
//   linear_backward_weight                                        weight's bf16 copy, as train.dtype = "bf16")
// A Linear's three GEMMs as model/layers.cpp runs them: y = x W^T (+ bias), dx = dy W, and
// dW += dy^T x (+ the bias gradient; under bf16 the rounding of dy), each with its operands' layout
// and dtypes, which the square GEMM of gemm_rates does not have.
enum class OpKind : uint8_t {
  AttentionForward, AttentionBackward, LayerNormForward, LayerNormBackward, RmsNormForward, RmsNormBackward,
  ResidualForward, ResidualBackward, GeluForward, GeluBackward, SwigluForward, SwigluBackward, RopeForward,
  RopeBackward, EmbeddingForward, EmbeddingBackward, CrossEntropyForward, CrossEntropyBackward, AdamW, GradNorm,
  LinearForward, LinearBackwardInput, LinearBackwardWeight,
};
inline constexpr int kOpKinds = int(OpKind::LinearBackwardWeight) + 1;
inline bool is_linear(OpKind op) { return op >= OpKind::LinearForward; }
const char* op_name(OpKind op);           // "attention_forward", ... (the file's spelling)
size_t op_shape_size(OpKind op);          // the length of its shape (above)
double op_work(OpKind op, const std::vector<double>& shape);  // what its time scales with (the product of its
                                                              // dims; embedding: rows x c; attention: b t s h d)

// One op's measured time at one shape: the mean of its repetitions over at least ~50 ms, every
// calibrated rank running it at the same time.
struct OpTime {
  OpKind op = OpKind::ResidualForward;
  std::vector<int64_t> shape;
  bool bf16 = false;
  double seconds = 0;
  bool operator==(const OpTime&) const = default;
};

// The chain scale (ClusterSpec::chain_scales) measured at one micro-batch size: `tokens` positions
// per rank per micro-batch (sequences x seq_len / cp), by dtype.
struct ChainScale {
  int64_t tokens = 1;
  double fp32 = 1, bf16 = 1;
  bool operator==(const ChainScale&) const = default;
};

// The scale of one tensor- or context-parallel degree (ClusterSpec::tp_scales, cp_scales): the
// whole model's forward + backward at tp (or cp) = `degree`, every group at once, measured over its
// prediction (its ops' times, the chain scale, and the group's collectives or ring transfers on the
// fitted link), by dtype.
struct DegreeScale {
  int64_t degree = 2;
  double fp32 = 1, bf16 = 1;
  bool operator==(const DegreeScale&) const = default;
};

// The version of the cluster file that cluster_to_toml writes: 1 had no format_version key (and is
// read as before), 2 adds gemm_rates, 3 adds op_times, 4 the linear_* ops in op_times. A file of a
// later version is refused, op_times in a file that says it is of version 1 or 2, and linear_* ops
// in one of version 3. 5 adds group_links (links by group size), 6 chain_scales (by micro-batch), 7
// tp_scales (by tp degree), 8 cp_scales (by cp degree).
inline constexpr int64_t kClusterFormatVersion = 8;

struct ClusterSpec {
  std::string name = "custom";
  std::string description;  // where the numbers come from
  std::string source;       // the file (and line), "preset", "--set ..." of the last value read
  // The kind of device a calibration measured: "cpu" (the CPU's ranks) or "cuda" (each rank's GPU,
  // train.device = "cuda"); "" (presets, files written before the key): not said. A plan for a
  // config whose train.device differs refuses a file that says (app/plan_command.h).
  std::string device;
  std::string device_name;  // the calibrated device as its runtime names it, or the CPU's model
  int64_t devices_per_node = 8;
  double device_memory = 80.0 * (int64_t{1} << 30);  // bytes per device
  double usable_memory_fraction = 0.9;   // of device_memory a run may plan for (runtime, buffers, fragments)
  bool host_memory = false;              // true: devices are CPU ranks, the estimate's host items count too
  double peak_flops_bf16 = 0;            // FLOP/s per device, dense
  double peak_flops_fp32 = 0;
  double compute_efficiency = 0.6;       // the share of peak a large GEMM reaches
  // A GEMM of f FLOPs runs at peak x efficiency x f / (f + gemm_half_flops): the FLOPs at which a
  // GEMM reaches half its rate (calibrated); 0: every GEMM at peak x efficiency.
  double gemm_half_flops = 0;
  double memory_bandwidth = 1e12;        // bytes/s per device (elementwise ops, the optimizer)
  double op_latency = 0;                 // seconds: the least time any one op (kernel) takes
  Link intra, inter;                     // within a node, across nodes
  // Within a node, by group size (calibration on groups of 2, 4, ... ranks); empty: intra serves
  // every group (intra_link).
  std::vector<SizedLink> group_links;
  bool async_progress = true;            // collectives started asynchronously progress while the device computes
  // The whole model's forward + backward measured (one micro-batch, every rank at once) over the sum
  // of its calibrated op times, by dtype: ops that run in a chain find the inputs evicted that their
  // calibration ran with in cache. Multiplies every computation; 1 = the ops' times as measured alone.
  double chain_scale_fp32 = 1, chain_scale_bf16 = 1;
  // The same measured at each micro-batch size (calibration; ascending tokens): a small micro-batch
  // runs its ops at the shapes they were timed at but pays more per op in a chain (on the 4-rank
  // GPT-2 here, bf16: 1.51 at one sequence, 1.23 at four). Non-empty: it replaces the two above.
  std::vector<ChainScale> chain_scales;
  // The model's forward + backward at each tp degree measured over its prediction (calibration on
  // 2 or more ranks; ascending tp): what a tp layout's ranks pay beyond its ops and the link's
  // collectives, e.g. a collective's partner waiting to be scheduled where ranks share cores.
  // Multiplies a tp layout's computation and tp collectives; empty, or tp = 1: 1.
  std::vector<DegreeScale> tp_scales;
  // The same at each cp degree (ring transfers, ascending cp): multiplies a cp layout's computation
  // and cp transfers; empty, or cp = 1: 1.
  std::vector<DegreeScale> cp_scales;
  // Measured GEMM rates by shape (calibration): when it holds the GEMM's dtype, a GEMM takes the rate
  // of the nearest measured shape instead of the roofline's peak x efficiency; empty: the roofline.
  std::vector<GemmRate> gemm_rates;
  // Measured times of the other op families by shape (calibration): when it holds an op, the cost
  // model times that op from the nearest measured shape (measured_op_seconds) instead of the roofline.
  std::vector<OpTime> op_times;

  double peak_flops(bool bf16) const { return bf16 ? peak_flops_bf16 : peak_flops_fp32; }
  double chain_scale(bool bf16) const { return bf16 ? chain_scale_bf16 : chain_scale_fp32; }
  // At `tokens` positions per rank per micro-batch: chain_scales interpolated linearly in
  // log(tokens) between the sizes measured, the nearest end's outside them; chain_scale(bf16) when
  // none were measured.
  double chain_scale(bool bf16, double tokens) const;
  // tp_scales (cp_scales) at this degree: the entry of that degree, else of the nearest measured (in
  // log(degree)); 1 for a degree of 1 or when none was measured.
  double tp_scale(int64_t tp, bool bf16) const;
  double cp_scale(int64_t cp, bool bf16) const;
  double usable_memory() const { return device_memory * usable_memory_fraction; }
};

// The link a group of `ranks` devices within a node runs its collectives on: group_links' entry of
// that size, else the nearest calibrated size (|log| ratio; the larger on a tie), else intra.
Link intra_link(const ClusterSpec& c, int64_t ranks);

// The rate of the measured shape nearest to (m, n, k) of that dtype (distance: the sum of the
// |log| ratios of m, n and k); 0 when none of that dtype was measured.
double measured_gemm_rate(const ClusterSpec& c, double m, double n, double k, bool bf16);

// The time of op at shape from the measured shape of that op nearest to it (the sum of the |log|
// ratios of the dims), scaled by op_work(shape) / op_work(measured): exactly the measured time at a
// measured shape. Entries of the asked dtype first; a bf16 op with only fp32 entries takes those (on
// the CPU the trainer keeps activations in fp32 under both dtypes), except the linear_* ops (a bf16
// GEMM is another kernel), which take only their dtype and their bias flag (the distance over rows,
// in and out). 0 when the op was not measured.
double measured_op_seconds(const ClusterSpec& c, OpKind op, const std::vector<double>& shape, bool bf16);
bool has_op_times(const ClusterSpec& c, OpKind op);

// What the `local` cluster is made of: this machine, shared by the planned ranks.
struct LocalMachine {
  int64_t ranks = 1;              // the ranks planned for (--gpus): one node of that many devices
  double memory_available = -1;   // bytes the ranks share (the trainer's MemAvailable / cgroup figure); < 0: unknown
  double peak_flops_fp32 = 0;     // FLOP/s of the whole CPU, all cores (kernels/backend_info.h cpu_peak_gflops)
  int64_t cores = 1;              // the CPUs this process may run on
  bool bf16_native = false;       // the bf16 GEMM runs on AVX512_BF16 (else the portable fallback)
};
// This CPU's peak, cores and bf16 kernel; ranks and memory as given.
LocalMachine this_machine(int64_t ranks, double memory_available);

// Names of the presets: "h100-sxm-80g", "h100-sxm-80g-ib4", "h200-141g", "h200-141g-ib4", "a100-80g",
// and "local".
std::vector<std::string> preset_names();

// A preset by name ("local": local_cluster(local)); throws tessera::Error listing the names when
// there is none.
ClusterSpec preset(const std::string& name, const LocalMachine& local = {});

// `local`: one node of local.ranks devices, each the ranks' share of the CPU's fp32 peak and of the
// available memory, with documented defaults for the rest (docs/planning.md); `tessera plan
// --calibrate` measures them instead.
ClusterSpec local_cluster(const LocalMachine& local);

// The [cluster] table of a TOML text; `base = "PRESET"` starts from a preset, otherwise every key
// without a default is required. Unknown keys, wrong types and values out of range are errors
// naming the key and source:line.
ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source, const LocalMachine& local = {});

// A file, or a preset when `file_or_preset` names one and no such file exists.
ClusterSpec load_cluster(const std::string& file_or_preset, const LocalMachine& local = {});

// "key=value" (key without or with the "cluster." prefix) applied to spec, checked as in a file.
void apply_cluster_override(ClusterSpec& spec, const std::string& assignment);

// The spec as a [cluster] table that parse_cluster reads back equal (every key, with its unit in the
// name and a comment).
std::string cluster_to_toml(const ClusterSpec& spec);

// The keys of [cluster], for docs and did-you-mean: name, unit and meaning.
struct ClusterKey {
  std::string key, meaning;
};
std::vector<ClusterKey> cluster_keys();

}  // namespace tessera::plan
