// Cluster descriptions: the [cluster] keys as one table (key, unit, range, member), read from TOML with
// toml++ and written back; the presets from the vendors' data sheets (sources in docs/planning.md).
#include "plan/cluster.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <variant>

#include "kernels/backend_info.h"
#include "kernels/check.h"

namespace tessera::plan {

namespace {

constexpr double kGiB = double(int64_t{1} << 30);
constexpr double kGB = 1e9, kTera = 1e12, kMicro = 1e-6;

using Value = std::variant<int64_t, double, bool, std::string>;
enum class Kind { Int, Number, Bool, Text };

// One [cluster] key: its type, the factor from the file's unit to the spec's SI one, its range and
// the member it sets. `required`: a file without `base` must give it.
struct Field {
  std::string key, meaning;
  Kind kind;
  double scale = 1;
  double min = 0;
  bool min_exclusive = false;
  double max = 1e30;
  bool required = true;
  std::function<void(ClusterSpec&, const Value&)> set;
  std::function<Value(const ClusterSpec&)> get;
};

template <class M>
Field number(std::string key, std::string meaning, M ClusterSpec::*member, double scale, double min, bool excl,
             double max = 1e30, bool required = true) {
  Field f{std::move(key), std::move(meaning), Kind::Number, scale, min, excl, max, required, {}, {}};
  f.set = [member, scale](ClusterSpec& s, const Value& v) { s.*member = std::get<double>(v) * scale; };
  f.get = [member, scale](const ClusterSpec& s) { return Value(double(s.*member) / scale); };
  return f;
}

Field link_number(std::string key, std::string meaning, Link ClusterSpec::*link, double Link::*member, double scale,
                  bool excl) {
  Field f{std::move(key), std::move(meaning), Kind::Number, scale, 0, excl, 1e30, true, {}, {}};
  f.set = [link, member, scale](ClusterSpec& s, const Value& v) { (s.*link).*member = std::get<double>(v) * scale; };
  f.get = [link, member, scale](const ClusterSpec& s) { return Value((s.*link).*member / scale); };
  return f;
}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> t;
    Field name{"name", "the cluster's name (shown in the plan's header)", Kind::Text, 1, 0, false, 0, false, {}, {}};
    name.set = [](ClusterSpec& s, const Value& v) { s.name = std::get<std::string>(v); };
    name.get = [](const ClusterSpec& s) { return Value(s.name); };
    t.push_back(name);
    Field desc{"description", "where the numbers come from", Kind::Text, 1, 0, false, 0, false, {}, {}};
    desc.set = [](ClusterSpec& s, const Value& v) { s.description = std::get<std::string>(v); };
    desc.get = [](const ClusterSpec& s) { return Value(s.description); };
    t.push_back(desc);
    Field device{"device", "the kind of device calibrated: \"cpu\" or \"cuda\" (train.device); \"\": not said (presets, "
                 "older files). A plan for a config with another train.device refuses the file", Kind::Text, 1, 0,
                 false, 0, false, {}, {}};
    device.set = [](ClusterSpec& s, const Value& v) { s.device = std::get<std::string>(v); };
    device.get = [](const ClusterSpec& s) { return Value(s.device); };
    t.push_back(device);
    Field device_name{"device_name", "the calibrated device as its runtime names it (a GPU), or the CPU's model",
                      Kind::Text, 1, 0, false, 0, false, {}, {}};
    device_name.set = [](ClusterSpec& s, const Value& v) { s.device_name = std::get<std::string>(v); };
    device_name.get = [](const ClusterSpec& s) { return Value(s.device_name); };
    t.push_back(device_name);
    Field dpn{"devices_per_node", "devices (GPUs, or ranks of a CPU) per node; ranks fill nodes in order, tp "
              "innermost", Kind::Int, 1, 1, false, 1 << 20, true, {}, {}};
    dpn.set = [](ClusterSpec& s, const Value& v) { s.devices_per_node = std::get<int64_t>(v); };
    dpn.get = [](const ClusterSpec& s) { return Value(s.devices_per_node); };
    t.push_back(dpn);
    t.push_back(number("device_memory_gib", "memory per device, GiB", &ClusterSpec::device_memory, kGiB, 0, true));
    t.push_back(number("usable_memory_fraction", "the share of device memory a run may plan for (the rest: runtime, "
                       "communication buffers, fragmentation)", &ClusterSpec::usable_memory_fraction, 1, 0, true, 1,
                       false));
    Field host{"host_memory", "true: devices are CPU ranks sharing host memory, so the estimate's host items (token "
               "batches, checkpoint copies, runtime) count against it too; false: only the allocator's tensors "
               "(device memory)", Kind::Bool, 1, 0, false, 0, false, {}, {}};
    host.set = [](ClusterSpec& s, const Value& v) { s.host_memory = std::get<bool>(v); };
    host.get = [](const ClusterSpec& s) { return Value(s.host_memory); };
    t.push_back(host);
    t.push_back(number("peak_tflops_bf16", "dense bf16 peak per device, TFLOP/s (train.dtype = \"bf16\")",
                       &ClusterSpec::peak_flops_bf16, kTera, 0, true));
    t.push_back(number("peak_tflops_fp32", "fp32 peak per device, TFLOP/s (train.dtype = \"fp32\"; true fp32, not "
                       "TF32)", &ClusterSpec::peak_flops_fp32, kTera, 0, true));
    t.push_back(number("compute_efficiency", "the share of peak a large GEMM reaches (small ones are held to the "
                       "memory bandwidth too)", &ClusterSpec::compute_efficiency, 1, 0, true, 1, false));
    t.push_back(number("gemm_half_gflop", "the GFLOPs of one GEMM at which it runs at half its large-GEMM rate "
                       "(small GEMMs: f / (f + this)); 0 = every GEMM at the large rate", &ClusterSpec::gemm_half_flops,
                       1e9, 0, false, 1e30, false));
    t.push_back(number("memory_bandwidth_gbs", "device memory bandwidth, GB/s (elementwise ops, the optimizer, "
                       "small GEMMs)", &ClusterSpec::memory_bandwidth, kGB, 0, true));
    t.push_back(number("op_latency_us", "the least time one op (kernel) takes, microseconds",
                       &ClusterSpec::op_latency, kMicro, 0, false, 1e9, false));
    t.push_back(link_number("intra_node_bandwidth_gbs", "bandwidth between two devices of a node, GB/s per device "
                            "and direction", &ClusterSpec::intra, &Link::bandwidth, kGB, true));
    t.push_back(link_number("intra_node_latency_us", "latency of a message within a node, microseconds",
                            &ClusterSpec::intra, &Link::latency, kMicro, false));
    // Per collective within a node (calibration fits them; 0: the all-reduce's link above).
    for (const auto& [name, bw, lat] :
         {std::tuple{"all_gather", &Link::all_gather_bandwidth, &Link::all_gather_latency},
          std::tuple{"reduce_scatter", &Link::reduce_scatter_bandwidth, &Link::reduce_scatter_latency},
          std::tuple{"p2p", &Link::p2p_bandwidth, &Link::p2p_latency}}) {
      Field b = link_number(std::string("intra_node_") + name + "_bandwidth_gbs",
                            std::string("within a node, the ") + name + " fit's bandwidth, GB/s (0: the all-reduce's "
                            "link serves it)", &ClusterSpec::intra, bw, kGB, false);
      Field l = link_number(std::string("intra_node_") + name + "_latency_us",
                            std::string("within a node, the ") + name + " fit's latency per message, microseconds",
                            &ClusterSpec::intra, lat, kMicro, false);
      b.required = l.required = false;
      t.push_back(b);
      t.push_back(l);
    }
    t.push_back(link_number("inter_node_bandwidth_gbs", "bandwidth across nodes, GB/s per device and direction "
                            "(the node's network bandwidth / devices_per_node)", &ClusterSpec::inter, &Link::bandwidth,
                            kGB, true));
    t.push_back(link_number("inter_node_latency_us", "latency of a message across nodes, microseconds",
                            &ClusterSpec::inter, &Link::latency, kMicro, false));
    Field async{"async_progress", "collectives started asynchronously progress while the device computes (NCCL: "
                "true; MPICH on CPU ranks progresses only inside MPI calls: false), so data-parallel buckets and the "
                "context-parallel ring overlap compute", Kind::Bool, 1, 0, false, 0, false, {}, {}};
    async.set = [](ClusterSpec& s, const Value& v) { s.async_progress = std::get<bool>(v); };
    async.get = [](const ClusterSpec& s) { return Value(s.async_progress); };
    t.push_back(async);
    for (const auto& [key, member] : {std::pair{"chain_scale_fp32", &ClusterSpec::chain_scale_fp32},
                                      std::pair{"chain_scale_bf16", &ClusterSpec::chain_scale_bf16}})
      t.push_back(number(key, "the whole model's forward + backward measured over the sum of its ops' calibrated times "
                         "(ops in a chain lose the cache they were timed with); multiplies every computation; 1 = none",
                         member, 1, 0, true, 1e30, false));
    return t;
  }();
  return table;
}

const Field* find_field(const std::string& key) {
  for (const Field& f : fields())
    if (f.key == key) return &f;
  return nullptr;
}

// The closest key by edit distance, for "did you mean".
std::string closest_key(const std::string& key) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_d = 4;  // farther than 3 edits: no suggestion
  for (const Field& f : fields()) {
    const size_t d = distance(key, f.key);
    if (d < best_d) best = f.key, best_d = d;
  }
  return best;
}

std::string describe_range(const Field& f) {
  std::ostringstream os;
  os << (f.min_exclusive ? "> " : ">= ") << f.min;
  if (f.max < 1e29) os << " and <= " << f.max;
  return os.str();
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "an integer";
    case Kind::Number: return "a number";
    case Kind::Bool: return "true or false";
    case Kind::Text: return "a string";
  }
  return "";
}

// The node as the field's type; nothing when it has another.
std::optional<Value> convert(const Field& f, const toml::node& n) {
  switch (f.kind) {
    case Kind::Int:
      if (n.is_integer()) return Value(n.as_integer()->get());
      return std::nullopt;
    case Kind::Number:
      if (n.is_integer()) return Value(double(n.as_integer()->get()));
      if (n.is_floating_point()) return Value(n.as_floating_point()->get());
      return std::nullopt;
    case Kind::Bool:
      if (n.is_boolean()) return Value(n.as_boolean()->get());
      return std::nullopt;
    case Kind::Text:
      if (n.is_string()) return Value(n.as_string()->get());
      return std::nullopt;
  }
  return std::nullopt;
}

// Checks and sets one key; `where` names it in errors ("cluster.x (file.toml:3)").
void assign(ClusterSpec& s, const Field& f, const toml::node& n, const std::string& where) {
  const std::optional<Value> v = convert(f, n);
  TESSERA_CHECK(v.has_value(), where, " must be ", kind_name(f.kind), " (", f.meaning, ")");
  if (f.kind == Kind::Int || f.kind == Kind::Number) {
    const double x = f.kind == Kind::Int ? double(std::get<int64_t>(*v)) : std::get<double>(*v);
    const bool ok = std::isfinite(x) && (f.min_exclusive ? x > f.min : x >= f.min) && x <= f.max;
    TESSERA_CHECK(ok, where, " = ", x, " must be ", describe_range(f), " (", f.meaning, ")");
  }
  if (f.key == "device") {
    const std::string& d = std::get<std::string>(*v);
    TESSERA_CHECK(d.empty() || d == "cpu" || d == "cuda", where, " = \"", d, "\" must be \"cpu\", \"cuda\" or \"\" (",
                  f.meaning, ")");
  }
  f.set(s, *v);
}

std::string at(const std::string& source, const toml::node& n) {
  const auto line = n.source().begin.line;
  return line > 0 ? source + ":" + std::to_string(line) : source;
}

// The vendors' figures (docs/planning.md cites each): per-device dense peaks, HBM size and bandwidth,
// NVLink per direction (half the data sheets' bidirectional figure), the node's InfiniBand
// bandwidth shared by its 8 GPUs. The latencies, op latency, efficiency and usable fraction are
// the planner's assumptions, the same for every preset (docs/planning.md says why).
ClusterSpec gpu_node(std::string name, std::string description, double memory_gib, double bf16_tflops,
                     double fp32_tflops, double hbm_gbs, double nvlink_gbs_bidirectional, double ib_gbits_per_node) {
  ClusterSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.source = "preset";
  s.devices_per_node = 8;
  s.device_memory = memory_gib * kGiB;
  s.usable_memory_fraction = 0.9;
  s.host_memory = false;
  s.peak_flops_bf16 = bf16_tflops * kTera;
  s.peak_flops_fp32 = fp32_tflops * kTera;
  s.compute_efficiency = 0.6;
  s.memory_bandwidth = hbm_gbs * kGB;
  s.op_latency = 3 * kMicro;
  s.intra = {nvlink_gbs_bidirectional / 2 * kGB, 3 * kMicro};
  s.inter = {ib_gbits_per_node / 8 / 8 * kGB, 6 * kMicro};
  s.async_progress = true;
  return s;
}

}  // namespace

double measured_gemm_rate(const ClusterSpec& c, double m, double n, double k, bool bf16) {
  double best = INFINITY, rate = 0;
  for (const GemmRate& g : c.gemm_rates) {
    if (g.bf16 != bf16) continue;
    const double d = std::fabs(std::log(m / double(g.m))) + std::fabs(std::log(n / double(g.n))) +
                     std::fabs(std::log(k / double(g.k)));
    if (d < best) best = d, rate = g.flops;
  }
  return rate;
}

namespace {
struct OpInfo {
  const char* name;
  size_t dims;
};
constexpr OpInfo kOps[kOpKinds] = {
    {"attention_forward", 6}, {"attention_backward", 6}, {"layernorm_forward", 2}, {"layernorm_backward", 2},
    {"rmsnorm_forward", 2},   {"rmsnorm_backward", 2},   {"residual_forward", 1},  {"residual_backward", 1},
    {"gelu_forward", 1},      {"gelu_backward", 1},      {"swiglu_forward", 1},    {"swiglu_backward", 1},
    {"rope_forward", 1},      {"rope_backward", 1},      {"embedding_forward", 3}, {"embedding_backward", 3},
    {"cross_entropy_forward", 2}, {"cross_entropy_backward", 2}, {"adamw", 1}, {"grad_norm", 1},
    {"linear_forward", 4}, {"linear_backward_input", 4}, {"linear_backward_weight", 4},
};
}  // namespace

const char* op_name(OpKind op) { return kOps[int(op)].name; }
size_t op_shape_size(OpKind op) { return kOps[int(op)].dims; }

double op_work(OpKind op, const std::vector<double>& shape) {
  TESSERA_CHECK(shape.size() == op_shape_size(op), "op_work: ", op_name(op), " takes ", op_shape_size(op),
                " dims, not ", shape.size());
  if (op == OpKind::EmbeddingForward || op == OpKind::EmbeddingBackward) return shape[0] * shape[1];
  if (op == OpKind::AttentionForward || op == OpKind::AttentionBackward)
    return shape[0] * shape[1] * shape[2] * shape[3] * shape[5];
  if (is_linear(op)) return shape[0] * shape[1] * shape[2];  // the GEMM's multiply-adds; the bias is a flag
  double w = 1;
  for (double x : shape) w *= x;
  return w;
}

bool has_op_times(const ClusterSpec& c, OpKind op) {
  for (const OpTime& t : c.op_times)
    if (t.op == op) return true;
  return false;
}

double measured_op_seconds(const ClusterSpec& c, OpKind op, const std::vector<double>& shape, bool bf16) {
  const OpTime* nearest = nullptr;
  double best = INFINITY;
  bool best_dtype = false;
  for (const OpTime& t : c.op_times) {
    if (t.op != op || t.shape.size() != shape.size()) continue;
    const bool linear = is_linear(op);
    if (linear && (t.bf16 != bf16 || double(t.shape[3]) != shape[3])) continue;
    double d = 0;
    for (size_t i = 0; i < (linear ? 3 : shape.size()); ++i)
      d += std::fabs(std::log(std::max(shape[i], 1.0) / double(t.shape[i])));
    const bool dtype = t.bf16 == bf16;
    // The asked dtype first, then the nearest shape.
    if ((dtype && !best_dtype) || (dtype == best_dtype && d < best)) best = d, best_dtype = dtype, nearest = &t;
  }
  if (!nearest || (nearest->bf16 && !bf16)) return 0;  // bf16 measurements never stand for fp32
  std::vector<double> measured(nearest->shape.begin(), nearest->shape.end());
  return nearest->seconds * op_work(op, shape) / op_work(op, measured);
}

LocalMachine this_machine(int64_t ranks, double memory_available) {
  LocalMachine m;
  m.ranks = ranks;
  m.memory_available = memory_available;
  m.peak_flops_fp32 = cpu_peak_gflops() * 1e9;
  m.bf16_native = cpu_bf16_gemm_kernel().find("AVX512_BF16") != std::string::npos;
  m.cores = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  return m;
}

std::vector<std::string> preset_names() {
  return {"h100-sxm-80g", "h100-sxm-80g-ib4", "h200-141g", "h200-141g-ib4", "a100-80g", "local"};
}

ClusterSpec local_cluster(const LocalMachine& m) {
  TESSERA_CHECK(m.ranks >= 1, "the local cluster needs at least one rank, not ", m.ranks);
  const double ranks = double(m.ranks);
  ClusterSpec s;
  s.name = "local";
  s.description = "this machine's CPU shared by " + std::to_string(m.ranks) +
                  " MPI ranks: the fp32 peak of kernels/backend_info.h and MemAvailable split between them, the "
                  "rest documented defaults (docs/planning.md); `tessera plan --calibrate` measures them";
  s.source = "preset";
  s.devices_per_node = m.ranks;
  s.device_memory = m.memory_available > 0 ? m.memory_available / ranks : 8 * kGiB;
  s.usable_memory_fraction = 1.0;  // the trainer's own check lets the ranks use all of it
  s.host_memory = true;
  s.peak_flops_fp32 = (m.peak_flops_fp32 > 0 ? m.peak_flops_fp32 : 50e9) / ranks;
  // vdpbf16ps does twice the multiply-adds of an fp32 FMA; the portable fallback converts in software.
  s.peak_flops_bf16 = s.peak_flops_fp32 * (m.bf16_native ? 2.0 : 0.25);
  s.compute_efficiency = 0.7;
  // A core streams about 30 GB/s (measured here: 35 GB/s for a read-read-write loop on one AMD EPYC
  // core); the ranks share the cores.
  s.memory_bandwidth = 30 * kGB * double(std::max<int64_t>(1, m.cores)) / ranks;
  s.op_latency = 5 * kMicro;
  s.intra = {5 * kGB, 20 * kMicro};
  s.inter = s.intra;
  s.async_progress = false;
  return s;
}

ClusterSpec preset(const std::string& name, const LocalMachine& local) {
  if (name == "h100-sxm-80g" || name == "h100-sxm-80g-ib4")
    return gpu_node(name, "NVIDIA H100 SXM5 80GB, 8 per node (DGX H100), NVLink 4, " +
                              std::string(name == "h100-sxm-80g" ? "8" : "4") + "x 400 Gb/s InfiniBand per node",
                    80, 989.4, 67, 3350, 900, name == "h100-sxm-80g" ? 8 * 400 : 4 * 400);
  if (name == "h200-141g" || name == "h200-141g-ib4")
    return gpu_node(name, "NVIDIA H200 SXM 141GB, 8 per node (DGX H200), NVLink 4, " +
                              std::string(name == "h200-141g" ? "8" : "4") + "x 400 Gb/s InfiniBand per node",
                    141, 989.4, 67, 4800, 900, name == "h200-141g" ? 8 * 400 : 4 * 400);
  if (name == "a100-80g")
    return gpu_node(name, "NVIDIA A100 SXM4 80GB, 8 per node (DGX A100), NVLink 3, 8x 200 Gb/s HDR InfiniBand per "
                          "node", 80, 312, 19.5, 2039, 600, 8 * 200);
  if (name == "local") return local_cluster(local);
  std::string names;
  for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  detail::fail("no cluster preset named \"", name, "\" (presets: ", names, "; or give a [cluster] TOML file)");
}

namespace {
// Field i of a calibration table's entry (what: the table, for the message): "bf16" (true) or
// "fp32" (false).
bool dtype_field(const toml::array& r, size_t i, const std::string& what, size_t entry) {
  const toml::node* dtype = r.get(i);
  TESSERA_CHECK(dtype && dtype->is_string() &&
                    (dtype->as_string()->get() == "fp32" || dtype->as_string()->get() == "bf16"),
                what, ": entry ", entry, " field ", i, " must be \"fp32\" or \"bf16\"");
  return dtype->as_string()->get() == "bf16";
}

// Field i: a positive finite number (`must`: what it is, for the message).
double positive_field(const toml::array& r, size_t i, const std::string& what, size_t entry, const char* must) {
  const toml::node* x = r.get(i);
  const double v = x && x->is_number() ? x->value<double>().value_or(0) : 0;
  TESSERA_CHECK(v > 0 && std::isfinite(v), what, ": entry ", entry, " field ", i, " must be ", must);
  return v;
}

// cluster.gemm_rates = [[m, n, k, "fp32" | "bf16", GFLOP/s], ...]
std::vector<GemmRate> parse_gemm_rates(const toml::node& node, const std::string& source) {
  const std::string what = "cluster.gemm_rates (" + at(source, node) + ")";
  const toml::array* rows = node.as_array();
  TESSERA_CHECK(rows != nullptr, what, " must be an array of [m, n, k, \"fp32\" or \"bf16\", GFLOP/s]");
  std::vector<GemmRate> out;
  for (const toml::node& row : *rows) {
    const toml::array* r = row.as_array();
    const auto positive_int = [&](size_t i) {
      const toml::node* x = r->get(i);
      TESSERA_CHECK(x && x->is_integer() && x->as_integer()->get() > 0, what, ": entry ", out.size(), " field ", i,
                    " must be a positive integer (m, n, k)");
      return x->as_integer()->get();
    };
    TESSERA_CHECK(r && r->size() == 5, what, ": entry ", out.size(),
                  " must be [m, n, k, \"fp32\" or \"bf16\", GFLOP/s]");
    GemmRate g;
    g.m = positive_int(0), g.n = positive_int(1), g.k = positive_int(2);
    g.bf16 = dtype_field(*r, 3, what, out.size());
    g.flops = positive_field(*r, 4, what, out.size(), "a positive rate in GFLOP/s") * kGB;
    out.push_back(g);
  }
  return out;
}
// cluster.op_times = [[op, [dims...], "fp32" | "bf16", microseconds], ...]
std::vector<OpTime> parse_op_times(const toml::node& node, const std::string& source) {
  const std::string what = "cluster.op_times (" + at(source, node) + ")";
  const toml::array* rows = node.as_array();
  TESSERA_CHECK(rows != nullptr, what, " must be an array of [op, [dims...], \"fp32\" or \"bf16\", microseconds]");
  std::vector<OpTime> out;
  for (const toml::node& row : *rows) {
    const toml::array* r = row.as_array();
    TESSERA_CHECK(r && r->size() == 4, what, ": entry ", out.size(),
                  " must be [op, [dims...], \"fp32\" or \"bf16\", microseconds]");
    OpTime t;
    const toml::node* name = r->get(0);
    TESSERA_CHECK(name && name->is_string(), what, ": entry ", out.size(), " field 0 must be an op's name");
    bool found = false;
    std::string names;
    for (int k = 0; k < kOpKinds; ++k) {
      names += std::string(names.empty() ? "" : ", ") + op_name(OpKind(k));
      if (name->as_string()->get() == op_name(OpKind(k))) t.op = OpKind(k), found = true;
    }
    TESSERA_CHECK(found, what, ": entry ", out.size(), " names no op: \"", name->as_string()->get(),
                  "\" (ops: ", names, ")");
    const toml::array* dims = r->get(1) ? r->get(1)->as_array() : nullptr;
    TESSERA_CHECK(dims && dims->size() == op_shape_size(t.op), what, ": entry ", out.size(), " (", op_name(t.op),
                  ") field 1 must be its shape: ", op_shape_size(t.op), " positive integers");
    for (const toml::node& x : *dims) {
      if (is_linear(t.op) && t.shape.size() == 3) {  // the bias flag
        TESSERA_CHECK(x.is_integer() && (x.as_integer()->get() == 0 || x.as_integer()->get() == 1), what, ": entry ",
                      out.size(), " (", op_name(t.op), ") field 1 must be [rows, in, out, bias] with bias 0 or 1");
      } else {
        TESSERA_CHECK(x.is_integer() && x.as_integer()->get() > 0, what, ": entry ", out.size(), " (", op_name(t.op),
                      ") field 1 must be its shape: ", op_shape_size(t.op), " positive integers");
      }
      t.shape.push_back(x.as_integer()->get());
    }
    t.bf16 = dtype_field(*r, 2, what, out.size());
    t.seconds = positive_field(*r, 3, what, out.size(), "a positive time in microseconds") * 1e-6;
    out.push_back(t);
  }
  return out;
}
// The collectives of a group_links entry, in the order a file lists them, with the Link fields each sets.
struct GroupCollective {
  const char* name;
  double Link::*bandwidth;
  double Link::*latency;
};
constexpr GroupCollective kGroupCollectives[] = {
    {"all_reduce", &Link::bandwidth, &Link::latency},
    {"all_gather", &Link::all_gather_bandwidth, &Link::all_gather_latency},
    {"reduce_scatter", &Link::reduce_scatter_bandwidth, &Link::reduce_scatter_latency},
    {"p2p", &Link::p2p_bandwidth, &Link::p2p_latency},
};

// cluster.group_links = [[ranks, collective, GB/s, microseconds], ...]: each size named needs its
// all_reduce entry (the others default to it, as in a Link); a (size, collective) given twice is refused.
std::vector<SizedLink> parse_group_links(const toml::node& node, const std::string& source) {
  const std::string what = "cluster.group_links (" + at(source, node) + ")";
  const std::string form = " must be [ranks, \"all_reduce\" | \"all_gather\" | \"reduce_scatter\" | \"p2p\", GB/s, "
                           "microseconds]";
  const toml::array* rows = node.as_array();
  TESSERA_CHECK(rows != nullptr, what, form);
  std::vector<SizedLink> out;
  std::set<std::pair<int64_t, std::string>> seen;
  size_t entry = 0;
  for (const toml::node& row : *rows) {
    const toml::array* r = row.as_array();
    TESSERA_CHECK(r && r->size() == 4, what, ": entry ", entry, form);
    const toml::node* ranks = r->get(0);
    TESSERA_CHECK(ranks && ranks->is_integer() && ranks->as_integer()->get() >= 2, what, ": entry ", entry,
                  " field 0 must be the group's size: an integer of at least 2");
    const toml::node* name = r->get(1);
    const GroupCollective* c = nullptr;
    for (const GroupCollective& g : kGroupCollectives)
      if (name && name->is_string() && name->as_string()->get() == g.name) c = &g;
    TESSERA_CHECK(c != nullptr, what, ": entry ", entry,
                  " field 1 must be \"all_reduce\", \"all_gather\", \"reduce_scatter\" or \"p2p\"");
    const int64_t n = ranks->as_integer()->get();
    TESSERA_CHECK(seen.insert({n, c->name}).second, what, ": entry ", entry, " gives ", c->name, " over ", n,
                  " ranks a second time");
    auto it = std::find_if(out.begin(), out.end(), [&](const SizedLink& l) { return l.ranks == n; });
    if (it == out.end()) it = out.insert(out.end(), SizedLink{n, Link{}});
    it->link.*(c->bandwidth) = positive_field(*r, 2, what, entry, "a positive bandwidth in GB/s") * kGB;
    const toml::node* latency = r->get(3);
    const double us = latency && latency->is_number() ? latency->value<double>().value_or(-1) : -1;
    TESSERA_CHECK(us >= 0 && std::isfinite(us), what, ": entry ", entry,
                  " field 3 must be a latency in microseconds (0 or more)");
    it->link.*(c->latency) = us * kMicro;
    ++entry;
  }
  for (const SizedLink& l : out)
    TESSERA_CHECK(seen.count({l.ranks, "all_reduce"}), what, ": groups of ", l.ranks,
                  " ranks have no all_reduce entry (the link their other collectives default to)");
  std::sort(out.begin(), out.end(), [](const SizedLink& a, const SizedLink& b) { return a.ranks < b.ranks; });
  return out;
}

// A row of a table of scales by an integer key: [key, fp32 scale, bf16 scale].
struct ScaleRow {
  int64_t key = 0;
  double fp32 = 1, bf16 = 1;
};

// cluster.<name> = [[key, fp32, bf16], ...]: the key an integer of at least `least` (`key_says`
// describes it), each key once (`named` writes one in the error), positive scales; ascending.
std::vector<ScaleRow> parse_scale_rows(const toml::node& node, const std::string& source, const std::string& name,
                                       const std::string& form, const std::string& key_says, int64_t least,
                                       const std::function<std::string(int64_t)>& named) {
  const std::string what = "cluster." + name + " (" + at(source, node) + ")";
  const toml::array* rows = node.as_array();
  TESSERA_CHECK(rows != nullptr, what, form);
  std::vector<ScaleRow> out;
  size_t entry = 0;
  for (const toml::node& row : *rows) {
    const toml::array* r = row.as_array();
    TESSERA_CHECK(r && r->size() == 3, what, ": entry ", entry, form);
    const toml::node* key = r->get(0);
    TESSERA_CHECK(key && key->is_integer() && key->as_integer()->get() >= least, what, ": entry ", entry,
                  " field 0 must be ", key_says, ": an integer of at least ", least);
    ScaleRow s;
    s.key = key->as_integer()->get();
    for (const ScaleRow& seen : out)
      TESSERA_CHECK(seen.key != s.key, what, ": entry ", entry, " gives ", named(s.key), " a second time");
    s.fp32 = positive_field(*r, 1, what, entry, "a positive scale");
    s.bf16 = positive_field(*r, 2, what, entry, "a positive scale");
    out.push_back(s);
    ++entry;
  }
  std::sort(out.begin(), out.end(), [](const ScaleRow& a, const ScaleRow& b) { return a.key < b.key; });
  return out;
}

// cluster.chain_scales = [[tokens, fp32, bf16], ...]: positive scales, each size once; kept ascending.
std::vector<ChainScale> parse_chain_scales(const toml::node& node, const std::string& source) {
  std::vector<ChainScale> out;
  for (const ScaleRow& r : parse_scale_rows(node, source, "chain_scales",
                                            " must be [tokens per micro-batch, fp32 scale, bf16 scale]",
                                            "the positions per rank of a micro-batch", 1,
                                            [](int64_t k) { return std::to_string(k) + " tokens"; }))
    out.push_back({r.key, r.fp32, r.bf16});
  return out;
}

// cluster.tp_scales (cp_scales) = [[degree, fp32, bf16], ...]: a degree of at least 2, positive
// scales, each degree once; kept ascending. group: "tp" or "cp".
std::vector<DegreeScale> parse_degree_scales(const toml::node& node, const std::string& source, const std::string& group) {
  std::vector<DegreeScale> out;
  for (const ScaleRow& r : parse_scale_rows(node, source, group + "_scales",
                                            " must be [" + group + " degree, fp32 scale, bf16 scale]",
                                            "the " + group + " degree", 2,
                                            [&](int64_t k) { return group + " " + std::to_string(k); }))
    out.push_back({r.key, r.fp32, r.bf16});
  return out;
}

// The tables of scales by parallel degree: the group that names them (cluster.<group>_scales), the
// format_version that added them, and their field.
struct DegreeScaleTable {
  const char* group;
  int64_t since;
  std::vector<DegreeScale> ClusterSpec::*field;
};
constexpr DegreeScaleTable kDegreeScaleTables[] = {{"tp", 7, &ClusterSpec::tp_scales}, {"cp", 8, &ClusterSpec::cp_scales}};

// The entry of `degree` in scales (ascending), else of the nearest (in log(degree)); 1 for a degree
// of 1 or none measured.
double degree_scale(const std::vector<DegreeScale>& scales, int64_t degree, bool bf16) {
  if (degree <= 1 || scales.empty()) return 1;
  const DegreeScale* best = nullptr;
  double best_distance = 0;
  for (const DegreeScale& t : scales) {  // ascending: <= keeps the larger on a tie
    const double distance = std::abs(std::log(double(t.degree) / double(degree)));
    if (!best || distance <= best_distance) best = &t, best_distance = distance;
  }
  return bf16 ? best->bf16 : best->fp32;
}
}  // namespace

double ClusterSpec::tp_scale(int64_t tp, bool bf16) const { return degree_scale(tp_scales, tp, bf16); }
double ClusterSpec::cp_scale(int64_t cp, bool bf16) const { return degree_scale(cp_scales, cp, bf16); }

double ClusterSpec::chain_scale(bool bf16, double tokens) const {
  if (chain_scales.empty()) return chain_scale(bf16);
  const auto of = [bf16](const ChainScale& s) { return bf16 ? s.bf16 : s.fp32; };
  if (tokens <= double(chain_scales.front().tokens)) return of(chain_scales.front());
  if (tokens >= double(chain_scales.back().tokens)) return of(chain_scales.back());
  size_t i = 1;
  while (double(chain_scales[i].tokens) < tokens) ++i;
  const ChainScale& lo = chain_scales[i - 1];
  const ChainScale& hi = chain_scales[i];
  const double f = std::log(tokens / double(lo.tokens)) / std::log(double(hi.tokens) / double(lo.tokens));
  return of(lo) + f * (of(hi) - of(lo));
}

Link intra_link(const ClusterSpec& c, int64_t ranks) {
  const SizedLink* best = nullptr;
  double best_distance = 0;
  for (const SizedLink& l : c.group_links) {  // ascending sizes: >= keeps the larger on a tie
    const double distance = std::abs(std::log(double(l.ranks) / double(std::max<int64_t>(ranks, 1))));
    if (!best || distance <= best_distance) best = &l, best_distance = distance;
  }
  return best ? best->link : c.intra;
}

ClusterSpec parse_cluster(const std::string& text, const std::string& source, const LocalMachine& local) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    detail::fail("TOML syntax error in ", source, ":", e.source().begin.line, ":", e.source().begin.column, ": ",
                 e.description());
  }
  for (auto&& [k, node] : root)
    TESSERA_CHECK(k.str() == "cluster", "unknown table or key \"", k.str(), "\" in ", at(source, node),
                  ": a cluster file holds one [cluster] table");
  const toml::table* t = root["cluster"].as_table();
  TESSERA_CHECK(t != nullptr, source, " has no [cluster] table (docs/planning.md lists its keys)");
  ClusterSpec s;
  bool based = false;
  if (const toml::node* base = t->get("base")) {
    TESSERA_CHECK(base->is_string(), "cluster.base (", at(source, *base), ") must be a string: a preset's name");
    try {
      s = preset(base->as_string()->get(), local);
    } catch (const Error& e) {
      detail::fail("cluster.base (", at(source, *base), "): ", e.what());
    }
    based = true;
  }
  if (const toml::node* v = t->get("format_version")) {
    TESSERA_CHECK(v->is_integer() && v->as_integer()->get() >= 1, "cluster.format_version (", at(source, *v),
                  ") must be a positive integer");
    const int64_t version = v->as_integer()->get();
    TESSERA_CHECK(version <= kClusterFormatVersion, source, ": cluster.format_version = ", version, " (",
                  at(source, *v), ") was written by a newer tessera; this one reads versions 1 to ",
                  kClusterFormatVersion, ": calibrate again with this build, or plan with the newer one");
  }
  int64_t version = 1;
  if (const toml::node* v = t->get("format_version")) version = v->as_integer()->get();
  if (const toml::node* g = t->get("gemm_rates")) s.gemm_rates = parse_gemm_rates(*g, source);
  if (const toml::node* o = t->get("op_times")) {
    TESSERA_CHECK(version >= 3, "cluster.op_times (", at(source, *o), ") needs format_version = 3 or later; ", source,
                  " says ", version, t->get("format_version") ? "" : " (no format_version key)",
                  ": calibrate again with this build");
    s.op_times = parse_op_times(*o, source);
    for (const OpTime& op : s.op_times)
      TESSERA_CHECK(version >= 4 || !is_linear(op.op), "cluster.op_times (", at(source, *o), ") holds ", op_name(op.op),
                    ", which needs format_version = 4 or later; ", source, " says ", version,
                    ": calibrate again with this build");
  }
  if (const toml::node* g = t->get("group_links")) {
    TESSERA_CHECK(version >= 5, "cluster.group_links (", at(source, *g), ") needs format_version = 5 or later; ",
                  source, " says ", version, t->get("format_version") ? "" : " (no format_version key)",
                  ": calibrate again with this build");
    s.group_links = parse_group_links(*g, source);
  }
  if (const toml::node* g = t->get("chain_scales")) {
    TESSERA_CHECK(version >= 6, "cluster.chain_scales (", at(source, *g), ") needs format_version = 6 or later; ",
                  source, " says ", version, t->get("format_version") ? "" : " (no format_version key)",
                  ": calibrate again with this build");
    s.chain_scales = parse_chain_scales(*g, source);
  }
  for (const DegreeScaleTable& d : kDegreeScaleTables)
    if (const toml::node* g = t->get(std::string(d.group) + "_scales")) {
      TESSERA_CHECK(version >= d.since, "cluster.", d.group, "_scales (", at(source, *g), ") needs format_version = ",
                    d.since, " or later; ", source, " says ", version,
                    t->get("format_version") ? "" : " (no format_version key)", ": calibrate again with this build");
      s.*d.field = parse_degree_scales(*g, source, d.group);
    }
  std::set<std::string> given;
  for (auto&& [k, node] : *t) {
    const std::string key(k.str());
    if (key == "base" || key == "format_version" || key == "gemm_rates" || key == "op_times" || key == "group_links" ||
        key == "chain_scales" || key == "tp_scales" || key == "cp_scales")
      continue;
    const Field* f = find_field(key);
    if (!f) {
      const std::string near = closest_key(key);
      detail::fail("unknown key cluster.", key, " (", at(source, node), ")",
                   near.empty() ? std::string() : "; did you mean cluster." + near + "?");
    }
    assign(s, *f, node, "cluster." + key + " (" + at(source, node) + ")");
    given.insert(key);
  }
  if (!based)
    for (const Field& f : fields())
      TESSERA_CHECK(!f.required || given.count(f.key), source, ": cluster.", f.key, " is missing (", f.meaning,
                    "); give it, or start from a preset with base = \"h100-sxm-80g\"");
  s.source = source;
  return s;
}

ClusterSpec load_cluster(const std::string& file_or_preset, const LocalMachine& local) {
  std::error_code ec;
  if (!std::filesystem::exists(file_or_preset, ec)) {
    const auto names = preset_names();
    if (std::find(names.begin(), names.end(), file_or_preset) != names.end()) return preset(file_or_preset, local);
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    detail::fail("--cluster ", file_or_preset, ": no such file, and no preset of that name (presets: ", list, ")");
  }
  TESSERA_CHECK(std::filesystem::is_regular_file(file_or_preset, ec), "--cluster ", file_or_preset,
                " is not a regular file");
  std::ifstream in(file_or_preset, std::ios::binary);
  TESSERA_CHECK(in.good(), "cannot open the cluster file ", file_or_preset);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_cluster(text.str(), file_or_preset, local);
}

void apply_cluster_override(ClusterSpec& s, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  TESSERA_CHECK(eq != std::string::npos, "--set ", assignment, ": expected cluster.key=value");
  std::string key = assignment.substr(0, eq);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  if (key.rfind("cluster.", 0) == 0) key = key.substr(8);
  const Field* f = find_field(key);
  if (!f) {
    const std::string near = closest_key(key);
    detail::fail("--set ", assignment, ": unknown key cluster.", key,
                 near.empty() ? std::string() : "; did you mean cluster." + near + "?");
  }
  std::string raw = assignment.substr(eq + 1);
  toml::table t;
  try {
    t = toml::parse("value = " + raw);
  } catch (const toml::parse_error&) {
    if (f->kind != Kind::Text) detail::fail("--set ", assignment, ": cluster.", key, " must be ", kind_name(f->kind));
    t = toml::table{{"value", raw}};  // a string field takes the text verbatim
  }
  assign(s, *f, *t.get("value"), "cluster." + key + " (--set " + assignment + ")");
}

std::string cluster_to_toml(const ClusterSpec& s) {
  std::ostringstream os;
  os.precision(10);
  os << "[cluster]\n";
  for (const Field& f : fields()) {
    os << "# " << f.meaning << "\n" << f.key << " = ";
    const Value v = f.get(s);
    if (const auto* i = std::get_if<int64_t>(&v)) os << *i;
    if (const auto* d = std::get_if<double>(&v)) {
      std::ostringstream n;
      n.precision(10);
      n << *d;
      std::string txt = n.str();
      if (txt.find_first_of(".eE") == std::string::npos && txt.find("inf") == std::string::npos) txt += ".0";
      os << txt;
    }
    if (const auto* b = std::get_if<bool>(&v)) os << (*b ? "true" : "false");
    if (const auto* str = std::get_if<std::string>(&v)) {
      toml::table t{{"v", *str}};
      std::ostringstream q;
      q << t;
      os << q.str().substr(4);  // "v = \"...\"" -> the quoted value
    }
    os << "\n";
  }
  os << "# the file's format (1: no gemm_rates, 2: no op_times, 3: no linear_* ops, 4: no group_links, 5: no "
        "chain_scales, 6: no tp_scales, 7: no cp_scales)\nformat_version = " << kClusterFormatVersion << "\n";
  if (!s.chain_scales.empty()) {
    os << "# the chain scale by micro-batch size (replaces chain_scale_fp32 and _bf16; interpolated in\n"
          "# log(tokens)): [positions per rank of a micro-batch, fp32, bf16]\nchain_scales = [\n";
    for (const ChainScale& c : s.chain_scales) os << "  [" << c.tokens << ", " << c.fp32 << ", " << c.bf16 << "],\n";
    os << "]\n";
  }
  for (const DegreeScaleTable& d : kDegreeScaleTables) {
    if ((s.*d.field).empty()) continue;
    os << "# the model's forward + backward at each " << d.group << " degree measured over its prediction: ["
       << d.group << ", fp32, bf16]\n" << d.group << "_scales = [\n";
    for (const DegreeScale& t : s.*d.field) os << "  [" << t.degree << ", " << t.fp32 << ", " << t.bf16 << "],\n";
    os << "]\n";
  }
  if (!s.group_links.empty()) {
    os << "# links within a node by group size, fitted on groups of that many ranks (every group at once):\n"
          "# [ranks, collective, GB/s, microseconds per message]\ngroup_links = [\n";
    for (const SizedLink& l : s.group_links)
      for (const GroupCollective& c : kGroupCollectives) {
        if (l.link.*(c.bandwidth) <= 0) continue;  // not fitted: the all-reduce's serves it
        os << "  [" << l.ranks << ", \"" << c.name << "\", " << l.link.*(c.bandwidth) / kGB << ", "
           << l.link.*(c.latency) / kMicro << "],\n";
      }
    os << "]\n";
  }
  if (!s.gemm_rates.empty()) {
    os << "# measured GEMM rates at the model's shapes: [m, n, k, dtype, GFLOP/s] of (m, k) x (k, n)\ngemm_rates = [\n";
    for (const GemmRate& g : s.gemm_rates)
      os << "  [" << g.m << ", " << g.n << ", " << g.k << ", \"" << (g.bf16 ? "bf16" : "fp32") << "\", "
         << g.flops / kGB << "],\n";
    os << "]\n";
  }
  if (!s.op_times.empty()) {
    os << "# measured op times by shape: [op, [dims...], dtype, microseconds] (the mean over >= 50 ms of runs)\n"
          "op_times = [\n";
    for (const OpTime& t : s.op_times) {
      os << "  [\"" << op_name(t.op) << "\", [";
      for (size_t i = 0; i < t.shape.size(); ++i) os << (i ? ", " : "") << t.shape[i];
      std::ostringstream us;
      us.precision(9);
      us << t.seconds * 1e6;
      std::string txt = us.str();
      if (txt.find_first_of(".eE") == std::string::npos) txt += ".0";
      os << "], \"" << (t.bf16 ? "bf16" : "fp32") << "\", " << txt << "],\n";
    }
    os << "]\n";
  }
  return os.str();
}

std::vector<ClusterKey> cluster_keys() {
  std::vector<ClusterKey> keys{{"base", "a preset to start from (its keys are then all optional)"}};
  for (const Field& f : fields()) keys.push_back({f.key, f.meaning});
  keys.push_back({"format_version", "the file's format: 1 (no such key), 2 (gemm_rates), 3 (op_times), 4 (the "
                                    "linear_* ops in op_times), 5 (group_links), 6 (chain_scales), 7 "
                                    "(tp_scales) or 8 (cp_scales); later versions are refused"});
  keys.push_back({"chain_scales", "[[tokens, fp32, bf16], ...]: the chain scale measured at each micro-batch size "
                                  "(positions per rank of a micro-batch); a layout takes it interpolated in "
                                  "log(tokens), and it replaces chain_scale_fp32 and chain_scale_bf16 "
                                  "(format_version 6)"});
  keys.push_back({"tp_scales", "[[tp, fp32, bf16], ...]: the whole model's forward + backward at each tp degree "
                               "(every tp group at once) measured over its prediction; a tp layout's computation "
                               "and tp collectives take the scale of its tp, or of the nearest measured "
                               "(format_version 7)"});
  keys.push_back({"cp_scales", "[[cp, fp32, bf16], ...]: the same at each cp degree (every cp group at once, ring "
                               "transfers); a cp layout's computation and cp transfers take the scale of its cp, or "
                               "of the nearest measured (format_version 8)"});
  keys.push_back({"group_links", "[[ranks, \"all_reduce\" | \"all_gather\" | \"reduce_scatter\" | \"p2p\", GB/s, "
                                 "microseconds], ...]: links within a node fitted on groups of that many ranks "
                                 "(`tessera plan --calibrate` on 4 or more ranks); a group of another size takes the "
                                 "nearest (format_version 5)"});
  keys.push_back({"gemm_rates", "[[m, n, k, \"fp32\" or \"bf16\", GFLOP/s], ...]: GEMM rates measured at the "
                                "model's shapes (`tessera plan --calibrate CONFIG`)"});
  keys.push_back({"op_times", "[[op, [dims...], \"fp32\" or \"bf16\", microseconds], ...]: the other op families' "
                              "times at the model's shapes (attention, norms, residual, activation, RoPE, embedding, "
                              "cross-entropy, AdamW, gradient norm; format_version 3)"});
  return keys;
}

}  // namespace tessera::plan
