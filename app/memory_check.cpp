// The memory estimate of a training run and the check against /proc/meminfo and the cgroup limit.
// What the trainer allocates and when (app/trainer.cpp, parallel/dp_optimizer.cpp, checkpointing.cpp):
// parameters and gradients in flat buffers (padded to a multiple of dp under ZeRO-1), AdamW's two
// moments (whole, or this rank's 1/dp under ZeRO-1, which also keeps a gradient shard), then per
// step one micro-batch's activations and temporaries at a time; evaluation runs a forward without
// targets; a checkpoint save gathers the ZeRO-1 moments (between steps) and keeps a host copy of
// parameters and moments while a background thread writes it (beside the next steps).
#include "app/memory_check.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels/allocator.h"
#include "model/memory.h"
#include "parallel/mpi.h"

namespace tessera {

namespace {

constexpr int64_t kFloatBytes = 4;   // the trainer's parameters and activations are f32
constexpr int64_t kIdBytes = 4;      // token and target ids (int32)
constexpr int64_t kLoaderDepth = 4;  // DataLoader's default prefetch depth (data/loader.h), as the trainer uses it
// What the process holds besides: code, MPI, HDF5 and BLAS buffers, thread stacks. Measured: the peak
// RSS of a 20-step run of a 27k-parameter model (tests' tiny config) is 37 MiB; rounded up.
constexpr int64_t kRuntimeBytes = int64_t{64} << 20;

int64_t mul(int64_t a, int64_t b) { return checked_mul(a, b); }
int64_t add(int64_t a, int64_t b) { return checked_add(a, b); }

const char* kModelKeys = "model.n_layer, model.n_embd, model.vocab_size; parallel.tp";

std::string plural(int64_t n, const std::string& word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

}  // namespace

int64_t MemoryEstimate::total() const {
  int64_t t = 0;
  for (const auto& i : items) t = add(t, i.bytes);
  return t;
}

int64_t MemoryEstimate::allocator_bytes() const {
  int64_t t = 0;
  for (const auto& i : items)
    if (i.allocator) t = add(t, i.bytes);
  return t;
}

MemoryEstimate estimate_training_memory(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout) {
  const ModelConfig mc = resolve(to_model_config(cfg, data_vocab_size));
  const TrainConfig& t = cfg.train;
  const int64_t tp = layout.tp, dp = layout.dp;
  const bool sp = cfg.parallel.sequence_parallel && tp > 1;
  const bool full = cfg.model.recompute == "full";
  const bool zero = cfg.parallel.zero == 1 && dp > 1;
  const ModelMemory step = model_memory(mc, {t.micro_batch, t.seq_len, tp, sp, full});

  const int64_t P = step.parameters, pad = zero ? dp : 1;
  const int64_t padded = mul(P / pad + (P % pad != 0 ? 1 : 0), pad);
  const int64_t shard = padded / pad;  // ZeRO-1: this rank's part of the optimizer state
  MemoryEstimate e;
  auto item = [&](std::string what, int64_t elements, bool allocator, std::string keys, int64_t bytes_each) {
    e.items.push_back({std::move(what), mul(elements, bytes_each), allocator, std::move(keys)});
  };
  item("parameters (" + std::to_string(P) + " on this rank)", padded, true, kModelKeys, kFloatBytes);
  item("gradients", zero ? add(padded, shard) : padded, true, kModelKeys, kFloatBytes);
  item(zero ? "AdamW moments (ZeRO-1: 1/" + std::to_string(dp) + " of them)" : "AdamW moments", mul(2, zero ? shard : P),
       true, std::string(kModelKeys) + ", parallel.zero = 1", kFloatBytes);

  // The largest transient: a training micro-batch, the evaluation forward, or the ZeRO-1 gather.
  MemoryItem transient{"activations and temporaries of one micro-batch (" + std::to_string(t.micro_batch) + " x " +
                           std::to_string(t.seq_len) + " tokens)",
                       // the model's peak, its loss sums, the step's sum of them, and the
                       // micro-batch's token and target ids uploaded through the allocator
                       add(add(mul(step.training_peak, kFloatBytes), 2 * ModelMemory::kLossSumsBytes),
                           mul(mul(2, mul(t.micro_batch, t.seq_len)), kIdBytes)),
                       true,
                       "train.micro_batch, train.seq_len, model.recompute = \"full\", parallel.tp"};
  if (cfg.data.task == "addition") {
    // Greedy answers of data.val_examples problems at once (at most: they go by prompt length),
    // the longest forward being the prompt "a+b=" and all but the last answer character.
    const int64_t digits = cfg.data.digits, B = cfg.data.val_examples;
    int64_t T = std::min(3 * digits + 3, mc.max_seq_len);
    if (sp) T = (T + tp - 1) / tp * tp;
    const ModelMemory eval = model_memory(mc, {B, T, tp, sp, full});
    const int64_t V = mc.vocab_size, Vl = V / tp + (V % tp != 0 ? 1 : 0);
    const int64_t logits_at = add(mul(B, V), mul(mul(B, Vl), tp > 1 ? tp + 2 : 1));  // (B, V) gathered from shards
    // The last position's logits are copied out after the forward, beside everything it kept.
    // Plus the prompts' ids, uploaded through the allocator for the forward.
    const int64_t bytes = add(mul(std::max(eval.inference_peak, add(eval.inference_kept, logits_at)), kFloatBytes),
                              mul(mul(B, T), kIdBytes));
    if (bytes > transient.bytes)
      transient = {"evaluation forward (" + std::to_string(B) + " problems x " + std::to_string(T) + " tokens)", bytes, true,
                   "data.val_examples"};
  }
  if (zero && layout.checkpoints && mul(mul(2, padded), kFloatBytes) > transient.bytes)
    transient = {"AdamW moments gathered for a checkpoint (ZeRO-1)", mul(mul(2, padded), kFloatBytes), true, kModelKeys};
  e.items.push_back(transient);

  // Host memory the allocator does not see.
  const int64_t accum = std::max<int64_t>(1, t.global_batch / std::max<int64_t>(1, mul(t.micro_batch, dp)));
  item("token batches (" + plural(accum, "micro-batch") + " of a step + " + std::to_string(kLoaderDepth + 1) +
           " prefetched)",
       mul(mul(add(accum, kLoaderDepth + 1), mul(t.micro_batch, t.seq_len)), 2), false,
       "train.global_batch, train.micro_batch, train.seq_len", 4 /* int32 tokens and targets */);
  if (layout.checkpoints)
    item("host copy of a checkpoint while it is written (parameters and moments)", add(P, mul(2, zero ? padded : P)),
         false, kModelKeys, kFloatBytes);
  e.items.push_back({"runtime (code, MPI, HDF5, BLAS, threads)", kRuntimeBytes, false, ""});
  return e;
}

namespace {

// The first integer on the line of `path` that starts with `key` (or the file's first integer
// when key is empty); -1 when absent or "max".
int64_t read_number(const std::string& path, const std::string& key = "") {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!key.empty() && line.rfind(key, 0) != 0) continue;
    std::istringstream s(key.empty() ? line : line.substr(key.size()));
    long long v = -1;
    if (s >> v) return v;
    return -1;
  }
  return -1;
}

// This process's cgroup directory for a controller: from /proc/self/cgroup ("0::/path" for v2,
// "N:memory:/path" for v1) when it exists under mount, else the mount itself (a container's
// namespaced view).
std::string cgroup_dir(const std::string& mount, bool v2) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (v2 ? !controllers.empty() : controllers.find("memory") == std::string::npos) continue;
    const std::string dir = mount + line.substr(b + 1);
    if (std::ifstream(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"))) return dir;
  }
  return mount;
}

}  // namespace

AvailableMemory available_host_memory() {
  AvailableMemory a;
  if (const char* test = std::getenv("TESSERA_TEST_MEMORY_AVAILABLE")) {
    a.bytes = std::atoll(test);
    a.source = "TESSERA_TEST_MEMORY_AVAILABLE";
    return a;
  }
  const int64_t kb = read_number("/proc/meminfo", "MemAvailable:");
  if (kb >= 0) a = {kb * 1024, "MemAvailable in /proc/meminfo"};
  // A cgroup limit (a container, a Slurm job) that is lower than what the node has free.
  struct Files {
    std::string limit, usage;
  };
  const std::string v2 = cgroup_dir("/sys/fs/cgroup", true), v1 = cgroup_dir("/sys/fs/cgroup/memory", false);
  for (const Files& f : {Files{v2 + "/memory.max", v2 + "/memory.current"},
                         Files{v1 + "/memory.limit_in_bytes", v1 + "/memory.usage_in_bytes"}}) {
    const int64_t limit = read_number(f.limit), usage = read_number(f.usage);
    if (limit <= 0 || usage < 0 || limit >= (int64_t{1} << 60)) continue;  // absent, or "no limit"
    const int64_t room = std::max<int64_t>(0, limit - usage);
    if (a.bytes < 0 || room < a.bytes)
      a = {room, "the cgroup limit " + format_bytes(static_cast<size_t>(limit)) + " minus " +
                     format_bytes(static_cast<size_t>(usage)) + " in use (" + f.limit + ")"};
    break;
  }
  return a;
}

std::string memory_problem(const MemoryEstimate& e, int64_t ranks_on_node, const AvailableMemory& available) {
  if (available.bytes < 0) return "";
  const int64_t per_rank = e.total(), needed = mul(per_rank, std::max<int64_t>(1, ranks_on_node));
  if (needed <= available.bytes) return "";
  std::vector<MemoryItem> items = e.items;
  std::stable_sort(items.begin(), items.end(), [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
  std::ostringstream os;
  os << "not enough memory for this run: it needs about " << format_bytes(static_cast<size_t>(per_rank)) << " per rank";
  if (ranks_on_node > 1)
    os << " x " << ranks_on_node << " ranks on this node = " << format_bytes(static_cast<size_t>(needed));
  os << ", and " << format_bytes(static_cast<size_t>(available.bytes)) << " is available (" << available.source
     << "). The estimate for one rank, largest first:";
  for (const MemoryItem& i : items) {
    os << "\n  " << format_bytes(static_cast<size_t>(i.bytes)) << "  " << i.what;
    if (!i.keys.empty()) os << "  <- " << i.keys;
  }
  os << "\nShrink the largest items with the keys named (or run on more ranks with parallel.tp / parallel.zero), "
        "or set train.memory_check = false to start anyway (docs/training.md, \"Memory\").";
  return os.str();
}

std::string check_training_memory(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout,
                                  MPI_Comm comm) {
  const int64_t local = comm == MPI_COMM_NULL ? 1 : ranks_on_this_node(comm);
  std::string error, line;
  try {
    const MemoryEstimate e = estimate_training_memory(cfg, data_vocab_size, layout);
    const AvailableMemory available = available_host_memory();
    std::ostringstream os;
    os << "memory estimate: " << format_bytes(static_cast<size_t>(e.total())) << " per rank (tensors "
       << format_bytes(static_cast<size_t>(e.allocator_bytes())) << ", the progress line's mem)";
    if (local > 1) os << " x " << local << " ranks on this node";
    if (available.bytes >= 0)
      os << " of " << format_bytes(static_cast<size_t>(available.bytes)) << " available (" << available.source << ")";
    else
      os << " (available memory unknown: not checked)";
    line = os.str();
    const std::string problem = memory_problem(e, local, available);
    if (!problem.empty() && cfg.train.memory_check) error = problem;
    if (!problem.empty() && !cfg.train.memory_check)
      line += "\nwarning: train.memory_check = false: starting anyway. " + problem;
  } catch (const Error& ex) {
    error = ex.what();
  }
  if (comm != MPI_COMM_NULL) throw_if_any_failed(comm, error);
  if (!error.empty()) throw Error(error);
  return line;
}

Config with_auto_micro_batch(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout, MPI_Comm comm) {
  if (cfg.train.micro_batch > 0) return cfg;
  const int64_t local = comm == MPI_COMM_NULL ? 1 : ranks_on_this_node(comm);
  // The automatic choice takes at most half of what is available: the rest for the estimate's
  // error, the OS and whatever else runs beside the job (a CPU gains nothing from a micro-batch
  // that fills the machine; an explicit train.micro_batch may still use it all).
  AvailableMemory available = available_host_memory();
  if (available.bytes > 0) available.bytes = static_cast<int64_t>(kAutoMicroBatchMemoryShare * static_cast<double>(available.bytes));
  Config c = cfg;
  std::string error;
  int64_t mine = 1;
  try {
    mine = auto_micro_batch(cfg.train.global_batch, layout.dp, [&](int64_t micro_batch) {
      c.train.micro_batch = micro_batch;
      try {
        return memory_problem(estimate_training_memory(c, data_vocab_size, layout), local, available).empty();
      } catch (const SizeOverflow&) {
        return false;  // sizes beyond 64 bits: a smaller micro-batch, or the check's message
      }
    });
  } catch (const Error& e) {
    error = e.what();
  }
  if (comm != MPI_COMM_NULL) {
    throw_if_any_failed(comm, error);
    long long all = mine;  // nodes may have different memory available: the smallest choice fits everywhere
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_LONG_LONG, MPI_MIN, comm), "MPI_Allreduce (micro-batch)");
    mine = all;
  }
  if (!error.empty()) throw Error(error);
  c.train.micro_batch = mine;
  return c;
}

}  // namespace tessera
