// `tessera plan` (app/plan_command.h): a layout as the Config train runs, the trainer's checks as the
// planner's, the table and the breakdown, the emitted config re-read by the trainer's loader.
#include "app/plan_command.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "app/device.h"
#include "app/launch.h"
#include "app/memory_check.h"
#include "app/pp_cut.h"
#include "app/trainer.h"
#include "app/training_data.h"
#include "kernels/allocator.h"
#include "kernels/backend_info.h"
#include "kernels/check.h"
#include "model/memory.h"
#include "model/recompute_ops.h"
#include "model/stage_cut.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "parallel/tp_compression.h"
#include "plan/calibrate.h"
#include "plan/recompute_choice.h"

namespace tessera {

using plan::Candidate;
using plan::ClusterSpec;
using plan::Layout;

Config apply_layout(const Config& base, const Layout& l, int64_t data_vocab) {
  Config c = base;
  ParallelConfig& p = c.parallel;
  p.dp = l.dp;
  p.tp = l.tp;
  p.pp = l.pp;
  p.vpp = l.vpp;
  p.pp_layers.clear();  // the stages cut by cost for this pp x vpp
  p.pp_schedule = std::string(pipeline_kind_name(l.schedule));
  p.cp = l.cp;
  p.cp_comm = l.cp_ring ? "ring" : "allgather";
  p.sequence_parallel = l.sp;
  p.zero = l.zero;
  c.train.micro_batch = l.micro_batch;
  c.train.dtype = l.bf16 ? "bf16" : "fp32";
  c.model.recompute = l.recompute_bubble && l.recompute == Recompute::Full ? "bubble" : plan::recompute_name(l.recompute);
  c.model.recompute_ahead = c.model.recompute == "bubble" ? l.recompute_ahead : 1;
  c.model.recompute_layers = l.recompute_layers;
  c.model.recompute_ops.clear();
  c.model.recompute_ops_layers.clear();
  if (!l.recompute_ops.empty()) {  // per layer of the stages train cuts for this pp x vpp
    const ModelConfig mc = to_model_config(c, data_vocab >= 0 ? data_vocab : data_vocab_size(c));
    const std::vector<StageSpec> cut =
        l.pp * l.vpp > 1 ? cut_stages(mc, c.train.seq_len, l.pp, l.vpp) : std::vector<StageSpec>{};
    c.model.recompute_ops_layers = plan::recompute_ops_layers(l, cut, mc.n_layer);
  }
  p.layout = "explicit";  // the layout is now given (an "auto" config would refuse its own keys)
  return c;
}

std::vector<RecomputeOps> recompute_op_sets_for(const Config& cfg) {
  const ModelSection& m = cfg.model;
  if (!m.recompute_ops.empty() || !m.recompute_ops_layers.empty()) return {};  // the user's choice stands
  for (const ActivationCompression& a : activation_compression_policy(cfg))
    if (a.active()) return {};
  const ParallelConfig& p = cfg.parallel;
  const TpCompressionModes modes =
      resolve_tp_compression(p.tp_comm_compression, p.tp_comm_compression_forward, p.tp_comm_compression_backward);
  const bool gemms = p.tp_overlap_chunks <= 1 && modes.forward != TpCompressionMode::Int8Ef && !cfg.lora.enabled();
  std::vector<RecomputeOps> sets;
  for (const RecomputeOps& o : plan::default_recompute_op_sets())
    if (gemms || !(o.qkv || o.mlp_in)) sets.push_back(o);
  return sets;
}

namespace {
// The layout's recompute_ops from model.recompute_ops{,_layers}: the op sets of the chunk with the
// most blocks, which every chunk must repeat from its first block (the planner's form; else an
// Error naming the keys). The blocks model.recompute_layers recomputes in full are not compared.
std::vector<RecomputeOps> chunk_ops_of(const Config& cfg, const Layout& l) {
  const ModelSection& m = cfg.model;
  if (m.recompute_ops.empty() && m.recompute_ops_layers.empty()) return {};
  const ModelConfig mc = to_model_config(cfg, data_vocab_size(cfg));
  const std::vector<RecomputeOps> per_layer = recompute_ops_policy(m.recompute_ops, m.recompute_ops_layers, mc.n_layer);
  std::vector<StageSpec> cut = l.pp * l.vpp > 1 ? cut_stages(mc, cfg.train.seq_len, l.pp, l.vpp)
                                                : std::vector<StageSpec>{StageSpec{0, mc.n_layer, true, true}};
  for (StageSpec& s : cut) s = resolve_stage(s, mc);
  const StageSpec largest = *std::max_element(cut.begin(), cut.end(), [](const StageSpec& a, const StageSpec& b) {
    return a.layers() < b.layers();
  });
  Layout x = l;
  x.recompute_ops.assign(per_layer.begin() + largest.first_layer, per_layer.begin() + largest.end_layer);
  while (!x.recompute_ops.empty() && !x.recompute_ops.back().any()) x.recompute_ops.pop_back();
  std::vector<std::string> asked;  // the config's, "none" where the layer recomputes in full
  for (const StageSpec& s : cut)
    for (int64_t i = 0; i < s.layers(); ++i)
      asked.push_back(i < l.recompute_layers ? "none" : recompute_ops_name(per_layer[size_t(s.first_layer + i)]));
  std::vector<std::string> again = plan::recompute_ops_layers(x, cut, mc.n_layer);
  if (again.empty()) again.assign(size_t(mc.n_layer), "none");
  TESSERA_CHECK(again == asked, "tessera plan --predict: model.recompute_ops / model.recompute_ops_layers differ "
                "between the pipeline chunks; the planner models op sets that every chunk repeats from its first block");
  return x.recompute_ops;
}
}  // namespace

plan::Layout layout_of(const Config& cfg, int64_t ranks) {
  const ParallelConfig& p = cfg.parallel;
  TESSERA_CHECK(cfg.train.micro_batch > 0, "tessera plan --predict: set train.micro_batch (0, automatic, is chosen "
                "at start from the node's memory)");
  TESSERA_CHECK(p.pp_layers.empty(), "tessera plan --predict: parallel.pp_layers is not modelled (the planner cuts "
                "the stages by cost); leave it []");
  const GridDegrees g = resolve_degrees(grid_degrees(p), ranks);
  Layout l;
  l.dp = g.dp, l.tp = g.tp, l.pp = g.pp, l.cp = g.cp, l.vpp = p.vpp;
  l.sp = p.sequence_parallel && g.tp > 1;
  l.zero = p.zero;
  l.schedule = parse_pipeline_kind(p.pp_schedule);
  l.cp_ring = p.cp_comm != "allgather";
  l.micro_batch = cfg.train.micro_batch;
  l.recompute = recompute_kind(cfg.model.recompute);
  l.recompute_layers = l.recompute == Recompute::Full ? 0 : cfg.model.recompute_layers;
  l.recompute_bubble = cfg.model.recompute == "bubble" && l.pp > 1;
  l.bf16 = cfg.train.dtype == "bf16";
  // model.recompute_ahead as train resolves it at start (0: as many as the schedule can use; under
  // train.max_memory_gib, the most that fit).
  if (l.recompute_bubble) {
    MemoryLayout m;
    m.tp = l.tp, m.dp = l.dp, m.pp_rank = -1;
    l.recompute_ahead = std::max<int64_t>(1, recompute_ahead_within_cap(cfg, data_vocab_size(cfg), m));
  }
  l.recompute_ops = chunk_ops_of(cfg, l);
  return l;
}

plan::Workload workload_of(const Config& cfg) {
  plan::Workload w;
  w.model = resolve(to_model_config(cfg, data_vocab_size(cfg)));
  w.seq_len = cfg.train.seq_len;
  w.global_batch = cfg.train.global_batch;
  const ParallelConfig& p = cfg.parallel;  // parallel.tp_comm_compression: the tp collectives' bytes
  const TpCompressionModes modes =
      resolve_tp_compression(p.tp_comm_compression, p.tp_comm_compression_forward, p.tp_comm_compression_backward);
  w.tp_bytes_forward = tp_bytes_factor(modes.forward, w.model.n_embd);
  w.tp_bytes_backward = tp_bytes_factor(modes.backward, w.model.n_embd);
  return w;
}

int64_t recompute_floor(const MemoryEstimate& e, const Layout& l, bool device) {
  // The estimate's items (app/memory_check.cpp estimate_for): the parameters, their bf16 copy, the
  // gradients, the moments and the tp error-feedback residuals, then the largest transient (the
  // last item the allocator counts), then host items. Recomputation changes the transient only.
  const auto transient = std::find_if(e.items.rbegin(), e.items.rend(), [](const MemoryItem& i) { return i.allocator; });
  if (transient == e.items.rend()) return 0;
  int64_t floor = (device ? e.allocator_bytes() : e.total()) - transient->bytes;
  // Under ZeRO-1 with checkpoints the transient is at least the moments gathered for a save:
  // this rank's shard of them times the shards.
  const int64_t shards = l.dp * l.cp;
  if (l.zero == 1 && shards > 1)
    for (const MemoryItem& i : e.items)
      if (i.allocator && i.what.rfind("AdamW moments (ZeRO-1", 0) == 0) floor += i.bytes * shards;
  return floor;
}

plan::PlanChecks trainer_checks(const Config& base, int64_t ranks, bool cache_schedules) {
  const int64_t vocab = data_vocab_size(base);
  const ModelConfig mc = resolve(to_model_config(base, vocab));
  plan::PlanChecks checks;
  checks.invalid = [base, mc, ranks, vocab](const Layout& l) -> std::string {
    const Config c = apply_layout(base, l, vocab);
    try {
      validate(c);           // what load_config checks (pipeline keys with dp, batch divisibility, sizes)
      check_supported(c);    // what train refuses before starting
      validate_layout(c, mc, ranks);  // the Trainer: the grid against the model and the world
      if (c.parallel.pp > 1) validate_pipeline(c, l.dp);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // The schedules the estimates walk, shared by every copy of the checks.
  const std::shared_ptr<plan::CostCache> schedules = cache_schedules ? std::make_shared<plan::CostCache>() : nullptr;
  if (schedules) checks.schedules = schedules->schedules();  // and the search's simulations
  checks.memory = [base, vocab, schedules](const Layout& l) {
    const Config c = apply_layout(base, l, vocab);
    MemoryLayout m;
    m.tp = l.tp;
    m.dp = l.dp;
    m.checkpoints = true;
    m.pp_rank = -1;  // the largest rank
    if (schedules)
      m.schedules = [schedules](int64_t pp, int64_t vpp, int64_t mb, PipelineKind kind, bool bubble,
                                int64_t ahead) -> const Schedule& {
        return schedules->schedule(pp, vpp, mb, kind, bubble, ahead);
      };
    const MemoryEstimate e = estimate_training_memory(c, vocab, m);
    return plan::MemoryUse{e.allocator_bytes(), e.total(), recompute_floor(e, l, true), recompute_floor(e, l, false)};
  };
  return checks;
}

namespace {

// "80GiB", "141 GB", "512MiB", "80" (GiB) -> bytes.
double parse_memory(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    detail::fail("--gpu-memory ", text, ": expected a size such as 80GiB or 141GB");
  }
  std::string unit = text.substr(pos);
  unit.erase(0, unit.find_first_not_of(' '));
  double scale = 0;
  if (unit.empty() || unit == "GiB" || unit == "G") scale = double(int64_t{1} << 30);
  else if (unit == "GB") scale = 1e9;
  else if (unit == "MiB") scale = double(int64_t{1} << 20);
  else if (unit == "MB") scale = 1e6;
  else if (unit == "TiB") scale = double(int64_t{1} << 40);
  else if (unit == "TB") scale = 1e12;
  TESSERA_CHECK(scale > 0 && v > 0 && std::isfinite(v), "--gpu-memory ", text,
                ": expected a positive size in GiB, GB, MiB, MB, TiB or TB (e.g. 80GiB)");
  return v * scale;
}

bool is_cluster_key(const std::string& assignment) { return assignment.rfind("cluster.", 0) == 0; }

std::string seconds_text(double s) {
  char b[32];
  if (s >= 1) std::snprintf(b, sizeof b, "%.3f s", s);
  else if (s >= 1e-3) std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  else std::snprintf(b, sizeof b, "%.1f us", s * 1e6);
  return b;
}

// 1234567 -> "1.23M".
std::string count_text(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// Bytes in binary units, compact for the table: "0", "512K", "23.4M", "1.20G".
std::string bytes_text(double v) {
  char b[32];
  if (v <= 0) return "0";
  if (v >= double(int64_t{1} << 30)) std::snprintf(b, sizeof b, "%.2fG", v / double(int64_t{1} << 30));
  else if (v >= double(1 << 20)) std::snprintf(b, sizeof b, "%.1fM", v / double(1 << 20));
  else std::snprintf(b, sizeof b, "%.0fK", std::max(1.0, v / 1024));
  return b;
}

double gib(double bytes) { return bytes / double(int64_t{1} << 30); }

// 989.4e12 -> "989 TFLOP/s", 52e9 -> "52.0 GFLOP/s".
std::string flops_text(double f) {
  char b[32];
  if (f >= 1e12) std::snprintf(b, sizeof b, "%.4g TFLOP/s", f / 1e12);
  else std::snprintf(b, sizeof b, "%.3g GFLOP/s", f / 1e9);
  return b;
}

const plan::GroupTraffic& group(const plan::StepCost& s, const std::string& name) {
  for (const plan::GroupTraffic& g : s.groups)
    if (g.group == name) return g;
  detail::fail("no group ", name);
}

}  // namespace

ClusterSpec cluster_of(const PlanArgs& args) {
  const AvailableMemory avail = available_host_memory();
  const plan::LocalMachine local = plan::this_machine(std::max<int64_t>(1, args.gpus), double(avail.bytes));
  ClusterSpec c = plan::load_cluster(args.cluster, local);
  if (!args.gpu_memory.empty()) c.device_memory = parse_memory(args.gpu_memory);
  for (const std::string& s : args.overrides)
    if (is_cluster_key(s)) plan::apply_cluster_override(c, s);
  return c;
}

std::string plan_report(const PlanArgs& args, const Config& cfg, const ClusterSpec& cluster,
                        const plan::PlanResult& result) {
  const plan::Workload w = workload_of(cfg);
  const int64_t params = model_memory(w.model, ModelMemoryLayout{}).parameters;
  std::ostringstream os;
  os << std::fixed;
  os << "tessera plan: " << args.config_path << " on " << args.gpus << " x " << cluster.name << " ("
     << cluster.devices_per_node << " per node, " << std::setprecision(1) << gib(cluster.usable_memory())
     << " GiB usable of " << gib(cluster.device_memory) << " GiB per device; peak bf16 "
     << flops_text(cluster.peak_flops_bf16) << ", fp32 " << flops_text(cluster.peak_flops_fp32) << "; cluster from "
     << cluster.source << ")\n";
  os << "model: " << w.model.preset << ", " << w.model.n_layer << " layers, n_embd " << w.model.n_embd << ", "
     << w.model.n_head << " heads (" << w.model.kv_heads() << " KV), vocab " << w.model.vocab_size << ", "
     << count_text(double(params)) << " parameters; global batch " << w.global_batch << " x " << w.seq_len
     << " tokens\n";
  const plan::SearchStats& st = result.stats;
  os << "search: " << st.degree_sets << " factorizations (" << st.degree_sets_invalid << " refused by the grid's rules, "
     << st.degree_sets_too_big << " too big for the device), " << st.layouts << " layouts, " << st.costed
     << " simulated, " << st.refused << " refused by train's checks, " << st.over_memory + st.over_memory_inferred
     << " over memory" << (st.recompute_chosen > 0 ? ", " + std::to_string(st.recompute_chosen) + " fitted by recomputing "
     "some blocks" : std::string()) << "; " << std::setprecision(2) << st.seconds << " s\n";
  if (result.top.empty()) {
    os << "\nno layout fits: every candidate was refused or over memory";
    if (!st.first_refusal.empty()) os << " (e.g. " << st.first_refusal << ")";
    os << ". More ranks, a device with more memory, or a smaller train.global_batch / seq_len may.\n";
    return os.str();
  }
  os << "\n  #  dp  tp  pp vpp  cp sp zero schedule    mb recompute dtype     step  tokens/s    MFU  mem/rank GiB "
        "bubble    tp/step  cp/step  pp/step  dp/step\n";
  for (size_t i = 0; i < result.top.size(); ++i) {
    const Candidate& c = result.top[i];
    const Layout& l = c.layout;
    char line[512];
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f/%.1f", gib(double(c.planned_bytes)), gib(cluster.usable_memory()));
    std::snprintf(line, sizeof line,
                  "%3zu %3lld %3lld %3lld %3lld %3lld %2s %4lld %-11s %3lld %-9s %-5s %10s %9s %5.1f%% %13s %5.1f%% "
                  "%9s %8s %8s %8s\n",
                  i + 1, (long long)l.dp, (long long)l.tp, (long long)l.pp, (long long)l.vpp, (long long)l.cp,
                  l.sp ? "y" : "-", (long long)l.zero,
                  (std::string(pipeline_kind_name(l.schedule)) + (l.cp > 1 && !l.cp_ring ? "/ag" : "")).c_str(),
                  (long long)l.micro_batch, plan::recompute_text(l).c_str(), l.bf16 ? "bf16" : "fp32",
                  seconds_text(c.cost.step).c_str(), count_text(c.cost.tokens_per_s).c_str(), 100 * c.cost.mfu, mem,
                  100 * c.cost.bubble_fraction, bytes_text(group(c.cost, "tp").bytes).c_str(),
                  bytes_text(group(c.cost, "cp").bytes).c_str(), bytes_text(group(c.cost, "pp").bytes).c_str(),
                  bytes_text(group(c.cost, "dp").bytes).c_str());
    os << line;
  }
  os << "\n(step: predicted seconds per optimizer step; mem/rank: the largest rank's estimate, as train's memory check "
        "counts it, against the usable device memory; bytes per step one rank sends over each group; schedule /ag: "
        "parallel.cp_comm = \"allgather\"; recompute none+2f+3nm: per chunk 2 blocks in full, 3 recomputing the ops "
        "n norm, q qkv, a attn, i mlp_in, m mlp_act, the rest none)\n";
  return os.str();
}

namespace {
// The layout's op sets per chunk block, by name: "; each chunk's blocks 1-3 norm+mlp_in+mlp_act,
// 4-5 norm (model.recompute_ops_layers)"; "" without.
std::string ops_text(const Layout& l) {
  std::string s;
  for (int64_t i = 0; i < int64_t(l.recompute_ops.size());) {
    const RecomputeOps o = plan::chunk_block_ops(l, i);
    int64_t j = i;
    while (j < int64_t(l.recompute_ops.size()) && plan::chunk_block_ops(l, j) == o) ++j;
    if (o.any())
      s += (s.empty() ? "" : ", ") + std::to_string(i + 1) + (j - i > 1 ? "-" + std::to_string(j) : "") + " " +
           recompute_ops_name(o);
    i = j;
  }
  return s.empty() ? "" : "; each chunk's blocks " + s + " (model.recompute_ops_layers)";
}
}  // namespace

std::string explain_report(const Config& cfg, const ClusterSpec& cluster, const Candidate& c, int64_t row) {
  const plan::StepCost& s = c.cost;
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  os << "\nlayout " << row << ": " << plan::describe(c.layout) << "\n";
  os << "  " << s.micro_batches << " micro-batches of " << c.layout.micro_batch << " x " << cfg.train.seq_len
     << " tokens per rank and step; predicted step " << seconds_text(s.step) << ", " << count_text(s.tokens_per_s)
     << " tokens/s, MFU " << 100 * s.mfu << "%\n";
  os << "  the step on the pipeline's busiest rank:\n";
  const auto line = [&](const char* what, double v, const std::string& note) {
    char b[640];
    std::snprintf(b, sizeof b, "    %-26s %12s %6.1f%%  %s\n", what, seconds_text(v).c_str(),
                  s.step > 0 ? 100 * v / s.step : 0.0, note.c_str());
    os << b;
  };
  line("compute", s.compute, "forward and backward: GEMMs, attention, elementwise ops");
  line("recomputation", s.recompute, std::string("model.recompute = \"") + plan::recompute_name(c.layout.recompute) +
       "\"" + (c.layout.recompute_layers > 0 ? ", recompute_layers = " + std::to_string(c.layout.recompute_layers) : "") +
       ops_text(c.layout));
  line("tp collectives (exposed)", s.tp_exposed, "blocking: every one is on the critical path");
  line("cp transfers (exposed)", s.cp_exposed,
       c.layout.cp > 1 ? (c.layout.cp_ring ? "the ring, less what attention hides" : "all-gather: nothing hidden") : "");
  char bub[96];
  std::snprintf(bub, sizeof bub, "the schedule's idle time and p2p waits (bubble %.1f%% of the pipeline)",
                100 * s.bubble_fraction);
  line("pipeline bubble", s.bubble, c.layout.pp > 1 ? bub : "");
  line("dp reduction (exposed)", s.dp_exposed,
       c.layout.zero == 1 ? "ZeRO-1: reduce-scatter and all-gather, after backward"
                          : "all-reduce in buckets, less what the last backward hides");
  line("embedding group", s.embedding_exposed, "the tied embedding's gradient over the first and last stage");
  line("optimizer", s.optimizer, "AdamW and the gradient norm (memory bandwidth)");
  os << "  per group (bytes one rank sends per step; link by the rank placement, tp innermost):\n";
  for (const plan::GroupTraffic& g : s.groups) {
    if (g.size <= 1) continue;
    char b[256];
    std::snprintf(b, sizeof b, "    %-10s %4lld ranks  %-12s %10s/step  transfers %10s  exposed %10s\n", g.group.c_str(),
                  (long long)g.size, g.across_nodes ? "across nodes" : "within node", bytes_text(g.bytes).c_str(),
                  seconds_text(g.seconds).c_str(), seconds_text(g.exposed).c_str());
    os << b;
  }
  // The memory estimate's items, as train's check prints them.
  const Config applied = apply_layout(cfg, c.layout);
  MemoryLayout m;
  m.tp = c.layout.tp;
  m.dp = c.layout.dp;
  m.checkpoints = true;
  const MemoryEstimate e = estimate_training_memory(applied, data_vocab_size(cfg), m);
  os << "  memory of the largest rank: " << format_bytes(size_t(e.allocator_bytes())) << " of tensors (device), "
     << format_bytes(size_t(e.total())) << " in all; " << (cluster.host_memory ? "all of it" : "the tensors")
     << " against " << format_bytes(size_t(cluster.usable_memory())) << " usable:\n";
  for (const MemoryItem& i : e.items)
    os << "    " << std::setw(12) << format_bytes(size_t(i.bytes)) << "  " << (i.allocator ? "" : "(host) ") << i.what
       << "\n";
  return os.str();
}

namespace {
// --predict: the config's own layout, costed and checked like a searched one, explained, and a
// last line of numbers for scripts (scripts/bench/plan_validate.py).
int predict_config_layout(const PlanArgs& args, const Config& cfg, const ClusterSpec& cluster, std::ostream& out) {
  const Layout l = layout_of(cfg, args.gpus);
  const plan::PlanChecks checks = trainer_checks(cfg, args.gpus);
  const std::string invalid = checks.invalid(l);
  TESSERA_CHECK(invalid.empty(), "tessera plan --predict: train would refuse this layout: ", invalid);
  Candidate c{l, plan::predict_step(workload_of(cfg), l, cluster), checks.memory(l), 0};
  c.planned_bytes = cluster.host_memory ? c.memory.total : c.memory.device;
  out << "tessera plan --predict: " << args.config_path << " on " << args.gpus << " x " << cluster.name
      << " (cluster from " << cluster.source << ")\n";
  out << explain_report(cfg, cluster, c, 1);
  if (double(c.planned_bytes) > cluster.usable_memory())
    out << "  warning: the largest rank needs more than the device's usable memory\n";
  char line[512];
  std::snprintf(line, sizeof line,
                "predicted: step_s=%.6g tokens_per_s=%.6g mfu=%.4g bubble=%.4g tp_bytes=%.6g cp_bytes=%.6g "
                "pp_bytes=%.6g dp_bytes=%.6g memory_bytes=%lld device_bytes=%lld\n",
                c.cost.step, c.cost.tokens_per_s, c.cost.mfu, c.cost.bubble_fraction, group(c.cost, "tp").bytes,
                group(c.cost, "cp").bytes, group(c.cost, "pp").bytes, group(c.cost, "dp").bytes,
                (long long)c.planned_bytes, (long long)c.memory.device);
  out << line;
  return 0;
}
}  // namespace

int run_plan_command(const PlanArgs& args, std::ostream& out) {
  TESSERA_CHECK(args.gpus >= 1, "tessera plan: --gpus N is required (the ranks to plan for), at least 1");
  std::vector<std::string> config_overrides;
  for (const std::string& s : args.overrides)
    if (!is_cluster_key(s)) config_overrides.push_back(s);
  const Config cfg = load_config(args.config_path, config_overrides);
  const ClusterSpec cluster = cluster_of(args);
  check_cluster_device(cfg, cluster, args.cluster);
  if (args.predict) return predict_config_layout(args, cfg, cluster, out);
  plan::SearchSpace space;
  TESSERA_CHECK(args.dtype == "any" || args.dtype == "fp32" || args.dtype == "bf16", "tessera plan: --dtype ",
                args.dtype, ": expected fp32, bf16 or any");
  if (args.dtype != "any") space.bf16 = {args.dtype == "bf16"};
  space.micro_batch = args.micro_batch;
  space.recompute_op_sets = recompute_op_sets_for(cfg);
  const plan::PlanResult result =
      plan::search_layouts(workload_of(cfg), cluster, args.gpus, space, trainer_checks(cfg, args.gpus), args.top);
  out << plan_report(args, cfg, cluster, result);
  if (args.explain > 0) {
    TESSERA_CHECK(args.explain <= int64_t(result.top.size()), "tessera plan: --explain ", args.explain,
                  ": the table has ", result.top.size(), " rows");
    out << explain_report(cfg, cluster, result.top[size_t(args.explain - 1)], args.explain);
  }
  if (!args.emit_config.empty()) {
    TESSERA_CHECK(!result.top.empty(), "tessera plan: --emit-config ", args.emit_config, ": no layout to write");
    const Candidate& best = result.top.front();
    std::string text = "# written by `tessera plan " + args.config_path + " --gpus " + std::to_string(args.gpus) +
                       " --cluster " + args.cluster + "`: " + plan::describe(best.layout) + "; predicted " +
                       seconds_text(best.cost.step) + " per step on " + cluster.name + "\n";
    text += to_toml(apply_layout(cfg, best.layout));
    {
      std::ofstream f(args.emit_config, std::ios::binary | std::ios::trunc);
      TESSERA_CHECK(f.good(), "tessera plan: cannot write ", args.emit_config);
      f << text;
      TESSERA_CHECK(f.good(), "tessera plan: writing ", args.emit_config, " failed");
    }
    // Read back with train's own loader: what train will run.
    const Config back = load_config(args.emit_config);
    TESSERA_CHECK(apply_layout(back, best.layout) == back, "tessera plan: ", args.emit_config,
                  " does not read back as the planned layout");
    out << "\nwrote " << args.emit_config << " (layout 1; `mpirun -n " << args.gpus << " tessera train "
        << args.emit_config << "`)\n";
  }
  return 0;
}

namespace {
// The CPU's model name from /proc/cpuinfo, "" when unknown.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "";
}

// The config the calibration times the whole model with: tp = pp = cp = 1, no ZeRO, no sequence
// parallelism, no tp overlap or compression, no recomputation (dp: what the world leaves).
Config whole_model_config(const Config& base) {
  Config cfg = base;
  ParallelConfig& p = cfg.parallel;
  p.dp = -1, p.tp = p.pp = p.vpp = p.cp = 1, p.zero = 0, p.sequence_parallel = false, p.pp_layers.clear();
  p.tp_overlap_chunks = 1, p.tp_comm_compression = "none";
  p.tp_comm_compression_forward = p.tp_comm_compression_backward = "";
  cfg.model.recompute = "none", cfg.model.recompute_layers = 0;
  cfg.model.recompute_ops.clear(), cfg.model.recompute_ops_layers.clear();
  return cfg;
}

// The model's forward + backward at cfg (app/pp_cut.h measure_stage_time, the median of 5), every
// rank at once after a barrier, tp and cp: its tensor- and context-parallel groups ({}: none); the
// mean over the ranks.
double whole_model_seconds(MPI_Comm world, const plan::CalibrationDevice& device, const Config& cfg,
                           const TensorParallel& tp = {}, const ContextParallel& cp = {}) {
  const ModelConfig mc = to_model_config(cfg, data_vocab_size(cfg));
  barrier(world, device.waits);
  const double mine = measure_stage_time(cfg, mc, device.ex, {resolve(mc).n_layer}, 0, 5, tp, cp);
  double sum = 0;
  check_mpi(MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, world), "MPI_Allreduce");
  return sum / double(comm_size(world));
}

// cluster.h chain_scales: the whole model forward and backward (app/pp_cut.h measure_stage_time:
// one stage of every block with the embedding and the head, tp = pp = cp = 1, no recomputation) at
// each micro-batch of 1, 2, 4, ... sequences up to 32 that divides the global batch, on every rank
// at once as training runs them, against the calibrated op times summed for the same work
// (plan/cost_model.h StepCost::compute). chain_scale_fp32 and _bf16 keep the largest micro-batch's
// up to 8 (what they meant before the sizes were measured).
void calibrate_chain_scale(MPI_Comm world, const Config& base, const plan::CalibrationDevice& device, plan::ClusterSpec& c,
                           std::ostream* out) {
  Config cfg = whole_model_config(base);
  std::vector<int64_t> sizes;
  for (int64_t mb = 1; mb <= std::min<int64_t>(32, cfg.train.global_batch); mb *= 2)
    if (cfg.train.global_batch % mb == 0) sizes.push_back(mb);
  c.chain_scales.clear();
  plan::ClusterSpec unscaled = c;  // the ops' calibrated times summed as they are
  unscaled.chain_scale_fp32 = unscaled.chain_scale_bf16 = 1;
  for (const int64_t mb : sizes) {
    cfg.train.micro_batch = mb;
    plan::ChainScale scale;
    scale.tokens = mb * cfg.train.seq_len;
    for (const bool bf16 : {false, true}) {
      cfg.train.dtype = bf16 ? "bf16" : "fp32";
      const double measured = whole_model_seconds(world, device, cfg);
      plan::Layout l;
      l.micro_batch = mb, l.bf16 = bf16;
      plan::Workload w = workload_of(cfg);
      w.global_batch = mb;
      const plan::StepCost s = plan::predict_step(w, l, unscaled);
      const double predicted = s.compute / double(s.micro_batches);
      (bf16 ? scale.bf16 : scale.fp32) = measured / predicted;
      if (mb <= 8) (bf16 ? c.chain_scale_bf16 : c.chain_scale_fp32) = measured / predicted;
      if (out) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "the model forward + backward (micro-batch %lld, %s, every rank at once): %.2f ms measured, "
                      "%.2f ms from its ops' times: chain scale %.3f\n",
                      (long long)mb, bf16 ? "bf16" : "fp32", 1e3 * measured, 1e3 * predicted, measured / predicted);
        *out << line << std::flush;
      }
    }
    c.chain_scales.push_back(scale);
  }
  const std::string doubts = plan::chain_scale_doubts(c.chain_scales);
  if (out && !doubts.empty())
    *out << "warning: the chain scales look disturbed (" << doubts << "): other processes running beside the "
         << "calibration make its op times or the model's run slow, and every plan made from this file inherits "
         << "that; calibrate again on a quiet machine\n";
}

// cluster.h tp_scales and cp_scales: the whole model forward and backward at tp (group "tp") or
// cp (group "cp", ring transfers) = 2, 4, ... (each degree that divides the ranks and that the model
// accepts; every group at once, its ranks running their shards or sequence chunks together through
// the trainer's communicators) at the chain scale's micro-batch (the largest measured up to 8
// sequences), against the prediction for the same work with the chain scales just measured: the
// computation and the group's collectives or transfers on the fitted link.
void calibrate_degree_scales(MPI_Comm world, const Config& base, const plan::CalibrationDevice& device,
                             plan::ClusterSpec& c, const std::string& group, std::ostream* out) {
  const bool tp_group = group == "tp";
  const int64_t ranks = comm_size(world);
  if (ranks < 2 || c.chain_scales.empty()) return;
  Config cfg = whole_model_config(base);
  cfg.parallel.cp_comm = "ring";
  int64_t mb = 1;
  for (const plan::ChainScale& s : c.chain_scales)
    if (s.tokens <= 8 * cfg.train.seq_len) mb = s.tokens / cfg.train.seq_len;
  cfg.train.micro_batch = mb;
  std::vector<plan::DegreeScale>& into = tp_group ? c.tp_scales : c.cp_scales;
  into.clear();  // predicted below without them
  std::vector<plan::DegreeScale> scales;  // into c at the end: degree 4's prediction must not take 2's scale
  for (int64_t degree = 2; degree <= ranks; degree *= 2) {
    if (ranks % degree != 0) continue;
    (tp_group ? cfg.parallel.tp : cfg.parallel.cp) = degree;
    const ModelConfig probe = to_model_config(cfg, data_vocab_size(cfg));
    try {
      validate_layout(cfg, probe, ranks);  // the same config on every rank: all skip together
    } catch (const Error&) {
      continue;  // a degree this model refuses (heads, vocabulary, the sequence's length)
    }
    const ProcessGrid grid(GridDegrees{cfg.parallel.tp, cfg.parallel.cp, 1, -1}, ranks, comm_rank(world));
    GridComms comms = make_grid_comms(grid, world, device.ex, device.comm, device.waits);
    const TensorParallel tp{tp_group ? comms.tp.get() : nullptr};
    const ContextParallel cp{tp_group ? nullptr : comms.cp.get(), CpComm::Ring};
    plan::DegreeScale scale;
    scale.degree = degree;
    for (const bool bf16 : {false, true}) {
      cfg.train.dtype = bf16 ? "bf16" : "fp32";
      const double measured = whole_model_seconds(world, device, cfg, tp, cp);
      plan::Layout l;
      l.tp = cfg.parallel.tp, l.cp = cfg.parallel.cp, l.cp_ring = true, l.micro_batch = mb, l.bf16 = bf16;
      plan::Workload w = workload_of(cfg);
      w.global_batch = mb;  // one micro-batch
      const plan::StepCost s = plan::predict_step(w, l, c);
      const double comm = tp_group ? s.tp_exposed : s.cp_exposed;
      const double predicted = (s.compute + comm) / double(s.micro_batches);
      (bf16 ? scale.bf16 : scale.fp32) = measured / predicted;
      if (out) {
        char line[320];
        std::snprintf(line, sizeof line,
                      "the model forward + backward at %s %lld (micro-batch %lld, %s, every group at once): %.2f ms "
                      "measured, %.2f ms predicted (ops %.2f, %s %.2f): %s scale %.3f\n",
                      group.c_str(), (long long)degree, (long long)mb, bf16 ? "bf16" : "fp32", 1e3 * measured,
                      1e3 * predicted, 1e3 * s.compute / double(s.micro_batches),
                      tp_group ? "tp collectives" : "cp ring transfers", 1e3 * comm / double(s.micro_batches),
                      group.c_str(), measured / predicted);
        *out << line << std::flush;
      }
    }
    scales.push_back(scale);
  }
  into = scales;
  const std::string doubts = plan::degree_scale_doubts(into, group);
  if (out && !doubts.empty())
    *out << "warning: the " << group << " scales look disturbed (" << doubts << "): other processes running beside "
         << "the calibration make the ranks wait for each other at every " << (tp_group ? "collective" : "transfer")
         << " of the group; calibrate again on a quiet machine\n";
}

bool is_calibrate_key(const std::string& assignment) { return assignment.rfind("calibrate.", 0) == 0; }

// One calibrate.KEY=VALUE's value: a number in [lo, hi] (an integer where `integer`).
double calibrate_value(const std::string& assignment, const std::string& key, const std::string& text, double lo,
                       double hi, bool integer) {
  size_t pos = 0;
  double v = NAN;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  const bool whole = pos == text.size() && !text.empty();
  TESSERA_CHECK(whole && std::isfinite(v) && v >= lo && v <= hi && (!integer || v == std::floor(v)), "--set ",
                assignment, ": calibrate.", key, " must be ", integer ? "an integer" : "a number", " from ", lo, " to ",
                hi);
  return v;
}
}  // namespace

plan::CalibrationOptions calibration_options(const std::vector<std::string>& overrides, int64_t ranks) {
  plan::CalibrationOptions o;
  for (const std::string& a : overrides) {
    if (!is_calibrate_key(a)) continue;
    const size_t eq = a.find('=');
    TESSERA_CHECK(eq != std::string::npos, "--set ", a, ": expected calibrate.key=value");
    std::string key = a.substr(10, eq - 10), value = a.substr(eq + 1);
    while (!key.empty() && key.back() == ' ') key.pop_back();
    value.erase(0, value.find_first_not_of(' '));
    while (!value.empty() && value.back() == ' ') value.pop_back();
    if (key == "min_seconds") o.min_seconds = calibrate_value(a, key, value, 1e-6, 60, false);
    else if (key == "repeats") o.repeats = int(calibrate_value(a, key, value, 1, 1000, true));
    else if (key == "gemm_size") o.gemm_size = int64_t(calibrate_value(a, key, value, 16, 16384, true));
    else if (key == "stream_elements") o.stream_elements = int64_t(calibrate_value(a, key, value, 64, 1 << 30, true));
    else if (key == "max_message_bytes")  // two sizes of each fit: 4096 x ranks and 4 x that
      o.max_message = int64_t(calibrate_value(a, key, value, double(16384 * std::max<int64_t>(1, ranks)), 1 << 30, true));
    else if (key == "group_links") {
      using GL = plan::CalibrationOptions::GroupLinks;
      std::string v = value;
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      TESSERA_CHECK(v == "auto" || v == "on" || v == "off", "--set ", a,
                    ": calibrate.group_links must be auto, on or off");
      o.group_links = v == "on" ? GL::On : v == "off" ? GL::Off : GL::Auto;
    } else
      detail::fail("--set ", a, ": unknown key calibrate.", key,
                   " (calibrate.min_seconds, repeats, gemm_size, stream_elements, max_message_bytes, group_links)");
  }
  return o;
}

void check_cluster_device(const Config& cfg, const plan::ClusterSpec& cluster, const std::string& cluster_arg) {
  if (cluster.device.empty() || cluster.device == cfg.train.device) return;
  detail::fail("tessera plan: --cluster ", cluster_arg, " was calibrated on cluster.device = \"", cluster.device, "\"",
               cluster.device_name.empty() ? std::string() : " (" + cluster.device_name + ")",
               ", but the config trains on train.device = \"", cfg.train.device, "\"; plan with a file calibrated on ",
               cfg.train.device, " (`tessera plan --calibrate CONFIG --device ", cfg.train.device,
               "`), or set train.device = \"", cluster.device, "\"");
}

int run_calibrate_command(const PlanArgs& args, std::ostream& out) {
  MPI_Comm world = MPI_COMM_WORLD;
  const bool lead = comm_rank(world) == 0;
  const int ranks = comm_size(world);
  std::string error;
  if (args.out.empty()) error = "tessera plan --calibrate: give --out FILE, the cluster file to write";
  if (args.gpus > 0)
    error = "tessera plan --calibrate measures this machine and takes no --gpus: run it under mpirun -n N for N "
            "ranks, then plan with --cluster FILE";
  if (!args.device.empty() && args.device != "cpu" && args.device != "cuda")
    error = "tessera plan --calibrate --device " + args.device + ": expected cpu or cuda (train.device's values)";
  // With a config: the GEMMs also at the shapes of its step (plan/calibrate.h model_gemm_shapes).
  plan::CalibrationOptions options;
  Config cfg;
  const bool with_config = !args.config_path.empty();
  if (error.empty()) {
    try {
      options = calibration_options(args.overrides, ranks);
      if (with_config) {
        std::vector<std::string> config_overrides;
        for (const std::string& s : args.overrides)
          if (!is_cluster_key(s) && !is_calibrate_key(s)) config_overrides.push_back(s);
        cfg = load_config(args.config_path, config_overrides);
        if (!args.device.empty()) cfg.train.device = args.device;
        const plan::Workload w = workload_of(cfg);
        options.shapes = plan::model_gemm_shapes(w, ranks);
        options.ops = plan::model_op_shapes(w, ranks);
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  throw_if_any_failed(world, error);
  // The device and communicator `tessera train` would use: train.device (or --device) and
  // parallel.comm; what a CUDA run refuses is refused here too.
  const std::string device_key = !args.device.empty() ? args.device : with_config ? cfg.train.device : "cpu";
  const Device device = resolve_train_device(device_key, world);  // collective: every rank throws together
  if (!device.is_cpu() && with_config) {
    const std::string why = unsupported_on_cuda(cfg);
    TESSERA_CHECK(why.empty(), why);  // the config decides: the same on every rank
  }
  const ComputeStream stream(device);
  plan::CalibrationDevice target;
  target.ex = device.is_cpu() ? Exec::cpu() : Exec::cuda(device.index, stream.stream());
  target.comm = with_config ? cfg.parallel.comm : "mpi";
  set_threads_per_rank(world);  // as train runs its ranks (app/launch.h)
  target.waits = resolve_mpi_wait(with_config ? cfg.parallel.mpi_wait : "auto", world, cpu_threads());  // as train's
  const AvailableMemory avail = available_host_memory();
  const plan::LocalMachine local = plan::this_machine(ranks, double(avail.bytes));
  const int64_t node_ranks = ranks_on_this_node(world);
  if (lead)
    out << "calibrating " << ranks << " rank" << (ranks > 1 ? "s" : "") << " on this machine"
        << (device.is_cpu() ? "" : " (train.device = \"cuda\", " + device.str() + " for rank 0, parallel.comm = \"" +
                                       target.comm + "\")")
        << "\n";
  plan::ClusterSpec c = plan::calibrate_local(world, local, options, lead ? &out : nullptr, target);
  if (with_config) {
    try {
      calibrate_chain_scale(world, cfg, target, c, lead ? &out : nullptr);
      calibrate_degree_scales(world, cfg, target, c, "tp", lead ? &out : nullptr);
      calibrate_degree_scales(world, cfg, target, c, "cp", lead ? &out : nullptr);
    } catch (const Error& e) {
      error = e.what();
    }
    throw_if_any_failed(world, error);
  }
  if (lead) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    char date[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&t));
    std::string what = cpu_model() + ", " + std::to_string(local.cores) + " cores";
    std::string memory = "MemAvailable / ranks";
    if (device.is_cpu()) {
      c.device_name = cpu_model();
    } else {
      // The device's memory, shared by the ranks of this node that train.device puts on one GPU.
      const plan::DeviceInfo info = plan::device_info(device);
      const int64_t visible = std::max(1, cuda_device_count());
      const int64_t sharing = std::max<int64_t>(1, (node_ranks + visible - 1) / visible);
      c.device_name = info.name;
      if (info.memory > 0) c.device_memory = info.memory / double(sharing);
      what = info.name + ", parallel.comm = \"" + target.comm + "\"";
      memory = info.memory > 0 ? "the device's / " + std::to_string(sharing) + " rank(s) per device" : "not known";
    }
    c.name = "local";
    c.description = "calibrated by `mpirun -n " + std::to_string(ranks) + " tessera plan --calibrate" +
                    (with_config ? " " + args.config_path : "") +
                    (args.device.empty() ? "" : " --device " + args.device) + "` on " + host + " (" + what + ") on " +
                    date + "; memory: " + memory;
    std::ofstream f(args.out, std::ios::binary | std::ios::trunc);
    if (!f.good()) error = "tessera plan --calibrate: cannot write " + args.out;
    f << "# " << c.description << "\n" << plan::cluster_to_toml(c);
    if (!f.good()) error = "tessera plan --calibrate: writing " + args.out + " failed";
    if (error.empty()) out << "wrote " << args.out << " (plan with --cluster " << args.out << ")\n";
  }
  throw_if_any_failed(world, error);
  return 0;
}

}  // namespace tessera
