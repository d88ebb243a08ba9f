// parallel.layout = "auto" (app/auto_layout.h): the planner run by `tessera train` at start.
#include "app/auto_layout.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "app/plan_command.h"
#include "kernels/check.h"
#include "model/recompute_ops.h"
#include "parallel/mpi.h"
#include "parallel/pipeline_schedule.h"
#include "plan/search.h"

namespace tessera {

namespace {

// A double written exactly ("%a") and read back.
std::string exact(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", v);
  return b;
}

double read_exact(std::istringstream& in, const std::string& text) {
  std::string tok;
  in >> tok;
  char* end = nullptr;
  const double v = std::strtod(tok.c_str(), &end);
  TESSERA_CHECK(!tok.empty() && end && *end == '\0', "parallel.layout = \"auto\": malformed choice \"", text, "\"");
  return v;
}

// A chunk's op sets per block (plan/layout.h Layout::recompute_ops): "-" for none, else each
// block's ops ("norm+mlp_act", "none") joined by ','.
std::string ops_text(const std::vector<RecomputeOps>& ops) {
  std::string s;
  for (const RecomputeOps& o : ops) s += (s.empty() ? "" : ",") + recompute_ops_name(o);
  return s.empty() ? "-" : s;
}

std::vector<RecomputeOps> ops_of(const std::string& text) {
  std::vector<RecomputeOps> ops;
  if (text == "-") return ops;
  std::istringstream in(text);
  for (std::string name; std::getline(in, name, ',');) ops.push_back(recompute_ops_of(name, "the choice's op sets"));
  return ops;
}

}  // namespace

const std::vector<std::string>& auto_layout_keys() {
  static const std::vector<std::string> keys = {
      "parallel.dp",       "parallel.tp",          "parallel.pp",
      "parallel.pp_layers", "parallel.vpp",        "parallel.pp_schedule",
      "parallel.cp",       "parallel.cp_comm",     "parallel.sequence_parallel",
      "parallel.zero",     "model.recompute",      "model.recompute_layers"};
  return keys;
}

void check_auto_layout_keys(const Config& c,
                            const std::function<std::optional<std::string>(const std::string&)>& origin_of) {
  if (c.parallel.layout != "auto") return;
  // A key at its default asks for nothing the planner would override (and a fully written config,
  // to_toml's, reads back); one set to another value is a layout the user chose by hand.
  for (const ConfigChange& ch : config_changes(Config{}, c)) {
    if (std::find(auto_layout_keys().begin(), auto_layout_keys().end(), ch.key) == auto_layout_keys().end()) continue;
    const std::optional<std::string> where = origin_of(ch.key);
    if (!where) continue;
    throw Error(ch.key + " = " + ch.after + " (" + *where + ") is set, but parallel.layout = \"auto\" (" +
                origin_of("parallel.layout").value_or("default") + ") plans it: remove " + ch.key +
                " or set parallel.layout = \"explicit\"");
  }
}

std::string encode_choice(const AutoLayoutChoice& c) {
  const plan::Layout& l = c.layout;
  std::ostringstream os;
  os << l.dp << ' ' << l.tp << ' ' << l.pp << ' ' << l.vpp << ' ' << l.cp << ' ' << int(l.sp) << ' ' << l.zero << ' '
     << pipeline_kind_name(l.schedule) << ' ' << int(l.cp_ring) << ' ' << l.micro_batch << ' '
     << (l.recompute_bubble ? "bubble" + (l.recompute_ahead > 1 ? std::to_string(l.recompute_ahead) : std::string())
                            : std::string(plan::recompute_name(l.recompute)))
     << ' ' << l.recompute_layers << ' '
     << ops_text(l.recompute_ops) << ' ' << int(l.bf16) << ' ' << c.ranks << ' ' << exact(c.step_seconds)
     << ' ' << exact(c.tokens_per_s) << ' ' << exact(c.memory_bytes) << ' ' << exact(c.usable_bytes) << ' '
     << c.cluster;
  return os.str();
}

AutoLayoutChoice decode_choice(const std::string& text) {
  std::istringstream in(text);
  AutoLayoutChoice c;
  plan::Layout& l = c.layout;
  int sp = 0, ring = 0, bf16 = 0;
  std::string schedule, recompute, ops;
  in >> l.dp >> l.tp >> l.pp >> l.vpp >> l.cp >> sp >> l.zero >> schedule >> ring >> l.micro_batch >> recompute >>
      l.recompute_layers >> ops >> bf16 >> c.ranks;
  TESSERA_CHECK(!in.fail(), "parallel.layout = \"auto\": malformed choice \"", text, "\"");
  try {
    l.recompute_ops = ops_of(ops);
  } catch (const Error&) {
    detail::fail("parallel.layout = \"auto\": malformed choice \"", text, "\"");
  }
  l.sp = sp != 0, l.cp_ring = ring != 0, l.bf16 = bf16 != 0;
  l.schedule = parse_pipeline_kind(schedule);
  // "bubble" (R right before B) or "bubble2" (model.recompute_ahead = 2); a choice written before
  // recompute_ahead existed says "bubble".
  l.recompute_bubble = recompute.rfind("bubble", 0) == 0;
  if (l.recompute_bubble && recompute.size() > 6) {
    try {
      l.recompute_ahead = std::stoll(recompute.substr(6));
    } catch (const std::exception&) {
      detail::fail("parallel.layout = \"auto\": malformed choice \"", text, "\"");
    }
    recompute = "bubble";
  }
  l.recompute = recompute_kind(recompute);
  c.step_seconds = read_exact(in, text);
  c.tokens_per_s = read_exact(in, text);
  c.memory_bytes = read_exact(in, text);
  c.usable_bytes = read_exact(in, text);
  in >> std::ws;
  std::getline(in, c.cluster);
  return c;
}

plan::ClusterSpec auto_layout_cluster(const Config& cfg, int64_t ranks) {
  PlanArgs args;
  args.gpus = ranks;
  args.cluster = cfg.parallel.cluster;
  try {
    return cluster_of(args);
  } catch (const Error& e) {
    throw Error("parallel.cluster = \"" + cfg.parallel.cluster + "\" (parallel.layout = \"auto\"): " + e.what());
  }
}

AutoLayoutChoice plan_auto_layout(const Config& cfg, int64_t ranks, const plan::ClusterSpec& cluster) {
  plan::SearchSpace space;
  space.bf16 = {cfg.train.dtype == "bf16"};  // the user's numerics; the planner chooses the rest
  space.micro_batch = cfg.train.micro_batch;  // 0: every one
  space.recompute_op_sets = recompute_op_sets_for(cfg);  // per block, as `tessera plan` chooses them
  const plan::PlanResult result = plan::search_layouts(workload_of(cfg), cluster, ranks, space,
                                                       trainer_checks(cfg, ranks), /*top_k=*/1);
  if (result.top.empty()) {
    const std::string example = result.stats.first_refusal.empty() ? "" : " (e.g. " + result.stats.first_refusal + ")";
    throw Error("parallel.layout = \"auto\": no layout of " + std::to_string(ranks) + " ranks fits " + cluster.name +
                " (parallel.cluster = \"" + cfg.parallel.cluster + "\"): " + std::to_string(result.stats.layouts) +
                " layouts, every one refused or over memory" + example +
                "; more ranks, a smaller train.global_batch or train.seq_len, or an explicit layout may run");
  }
  const plan::Candidate& best = result.top.front();
  AutoLayoutChoice c;
  c.layout = best.layout;
  c.ranks = ranks;
  c.cluster = cluster.name + " (" + cluster.source + ")";
  c.step_seconds = best.cost.step;
  c.tokens_per_s = best.cost.tokens_per_s;
  c.memory_bytes = double(best.planned_bytes);
  c.usable_bytes = cluster.usable_memory();
  return c;
}

AutoLayoutChoice choose_auto_layout(const Config& cfg, MPI_Comm comm) {
  const int ranks = comm_size(comm);
  std::string message;  // rank 0: "ok CHOICE" or "error MESSAGE"
  if (comm_rank(comm) == 0) {
    try {
      message = "ok " + encode_choice(plan_auto_layout(cfg, ranks, auto_layout_cluster(cfg, ranks)));
    } catch (const Error& e) {
      message = std::string("error ") + e.what();
    }
  }
  message = broadcast_bytes(comm, message, 0);
  if (message.rfind("error ", 0) == 0) throw CollectiveError(message.substr(6));
  TESSERA_CHECK(message.rfind("ok ", 0) == 0, "parallel.layout = \"auto\": rank 0 sent \"", message, "\"");
  return decode_choice(message.substr(3));
}

Config apply_auto_layout(const Config& cfg, const AutoLayoutChoice& c) {
  return apply_layout(cfg, c.layout);  // parallel.layout = "explicit" there
}

std::string describe_choice(const AutoLayoutChoice& c) {
  char b[256];
  std::snprintf(b, sizeof b, "predicted %.4g ms/step, %.4g tokens/s, %.2f GiB of %.2f GiB on the largest rank",
                c.step_seconds * 1e3, c.tokens_per_s, c.memory_bytes / double(int64_t{1} << 30),
                c.usable_bytes / double(int64_t{1} << 30));
  return "auto layout (parallel.layout = \"auto\"): " + plan::describe(c.layout) + " on " + std::to_string(c.ranks) +
         " x " + c.cluster + "; " + b + "\n";
}

}  // namespace tessera
