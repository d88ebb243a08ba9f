// Dynamic context parallelism in the trainer: calibration, passes, metrics (dynamic_cp.h).
#include "app/dynamic_cp.h"

#include <toml++/toml.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <type_traits>

#include "app/context_parallel.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"

namespace tessera {

std::vector<int64_t> row_documents(const Batch& b, int64_t r) {
  TESSERA_CHECK(!b.doc_start.empty(), "dynamic cp: a batch without documents (data.batching = \"tokens\" gives them)");
  std::vector<int64_t> docs;
  for (int64_t t = 0; t < b.T; ++t) {
    const bool starts = t == 0 || b.doc_start[static_cast<size_t>(r * b.T + t)] !=
                                      b.doc_start[static_cast<size_t>(r * b.T + t - 1)];
    if (starts) docs.push_back(0);
    ++docs.back();
  }
  return docs;
}

Batch batch_rows(const Batch& b, const std::vector<int64_t>& rows) {
  Batch out;
  out.B = static_cast<int64_t>(rows.size());
  out.T = b.T;
  const auto take = [&](const std::vector<int32_t>& from, std::vector<int32_t>& to) {
    if (from.empty()) return;
    for (int64_t r : rows) to.insert(to.end(), from.begin() + r * b.T, from.begin() + (r + 1) * b.T);
  };
  take(b.tokens, out.tokens);
  take(b.targets, out.targets);
  take(b.doc_start, out.doc_start);
  take(b.doc_position, out.doc_position);
  return out;
}

std::string cp_cost_toml(const CpCostModel& m) {
  std::ostringstream o;
  o.precision(17);
  o << "# dynamic cp's cost model (parallel.cp_calibration): seconds of one row's forward + backward\n"
    << "[cp_cost]\n"
    << "token_s = " << m.token_s << "       # per position (GEMMs, norms, embedding, head)\n"
    << "pair_s = " << m.pair_s << "        # per visible (query, key) pair (attention)\n"
    << "ring_step_s = " << m.ring_step_s << "   # per ring step of a split row (latency)\n"
    << "ring_token_s = " << m.ring_token_s << "  # per K/V position moved in a ring step\n";
  return o.str();
}

CpCostModel read_cp_cost(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    detail::fail("parallel.cp_calibration = \"", path, "\": ", e.description());
  }
  CpCostModel m;
  const auto get = [&](const char* key, double& out) {
    const std::optional<double> v = t["cp_cost"][key].value<double>();
    TESSERA_CHECK(v && *v >= 0, "parallel.cp_calibration = \"", path, "\": cp_cost.", key,
                  " must be a number >= 0 (seconds), ", v ? "got " + std::to_string(*v) : std::string("missing"));
    out = *v;
  };
  get("token_s", m.token_s);
  get("pair_s", m.pair_s);
  get("ring_step_s", m.ring_step_s);
  get("ring_token_s", m.ring_token_s);
  return m;
}

AttrMap cp_cost_record(const CpCostModel& m, int64_t seq_len, int64_t cp) {
  return {{"token_s", m.token_s},         {"pair_s", m.pair_s}, {"ring_step_s", m.ring_step_s},
          {"ring_token_s", m.ring_token_s}, {"seq_len", seq_len}, {"cp", cp}};
}

std::optional<CpCostModel> cp_cost_of(const GroupAttributes& groups, const std::string& path, int64_t seq_len,
                                      int64_t cp, std::string* why) {
  const auto it = groups.find(kDynamicCpGroup);
  if (it == groups.end()) {
    if (why) *why = path + " has no " + kDynamicCpGroup + " record (saved without dynamic cp)";
    return std::nullopt;
  }
  const auto get = [&](const char* key, auto& out) {
    using T = std::decay_t<decltype(out)>;
    const auto a = it->second.find(key);
    TESSERA_CHECK(a != it->second.end() && std::holds_alternative<T>(a->second), path, ": ", kDynamicCpGroup,
                  " has no ", std::is_same_v<T, double> ? "number" : "integer", " attribute ", key);
    out = std::get<T>(a->second);
  };
  int64_t at_len = 0, at_cp = 0;
  get("seq_len", at_len);
  get("cp", at_cp);
  if (at_len != seq_len || at_cp != cp) {
    if (why)
      *why = path + "'s cost model was measured for train.seq_len = " + std::to_string(at_len) +
             ", parallel.cp = " + std::to_string(at_cp) + ", not " + std::to_string(seq_len) + ", " +
             std::to_string(cp);
    return std::nullopt;
  }
  CpCostModel m;
  get("token_s", m.token_s);
  get("pair_s", m.pair_s);
  get("ring_step_s", m.ring_step_s);
  get("ring_token_s", m.ring_token_s);
  return m;
}

std::unique_ptr<DynamicCp> DynamicCp::open(const Config& cfg, Communicator* cp, Communicator* tp) {
  if (cfg.parallel.cp_mode != "dynamic") return nullptr;
  TESSERA_CHECK(cp && cp->size() >= 2, "parallel.cp_mode = \"dynamic\" needs a cp group of 2 or more ranks");
  auto d = std::make_unique<DynamicCp>();
  d->cp_ = cp;
  d->tp_ = tp && tp->size() > 1 ? tp : nullptr;
  d->comm_ = std::make_unique<CpSubgroupComm>(*cp);
  d->length_ = cfg.train.seq_len;
  if (!cfg.parallel.cp_calibration.empty()) {
    d->cost_ = read_cp_cost(cfg.parallel.cp_calibration);
    d->cost_from_ = cfg.parallel.cp_calibration;
  }
  return d;
}

void DynamicCp::resume_from(const GroupAttributes& groups, const std::string& path) {
  if (!cost_from_.empty()) return;  // parallel.cp_calibration, named by the user
  std::string why;
  if (const std::optional<CpCostModel> m = cp_cost_of(groups, path, length_, cp_->size(), &why)) {
    cost_ = *m;
    cost_from_ = "checkpoint " + path;
  } else {
    cost_from_.clear();
    resume_note_ = why + "; measured again";
  }
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One row of L positions holding documents `docs`, token ids 1, targets 1 (a real loss).
Batch calibration_row(const std::vector<int64_t>& docs, int64_t L) {
  Batch b;
  b.B = 1;
  b.T = L;
  b.tokens.assign(static_cast<size_t>(L), 1);
  b.targets.assign(static_cast<size_t>(L), 1);
  int64_t at = 0;
  for (int64_t d : docs) {
    for (int64_t i = 0; i < d; ++i) b.doc_start.push_back(static_cast<int32_t>(at));
    at += d;
  }
  b.doc_position.assign(static_cast<size_t>(L), 0);
  return b;
}

// This rank's pass of b's rows `p.rows` at placement p.group, as the trainer runs it: the rows whole,
// or (split) this member's load-balanced share of them (cp_share with the subgroup selected).
DynamicCp::Pass pass_of(CpSubgroupComm* comm, const Batch& b, const CpPass& p) {
  Batch sub = batch_rows(b, p.rows);
  if (p.group.split()) {
    const CpSubgroupScope scope(comm, p.group.first, p.group.ranks);
    sub = cp_share(sub, ContextParallel{comm, CpComm::Ring});
  }
  return {p.group, std::move(sub)};
}

// The median of `repeats` forward + backward runs (after one warm-up) of this rank's pass of `row`
// at placement g, as the trainer's step runs a pass: its subgroup selected, share_layout's positions,
// loss scale 0 (the gradients are unchanged). Each run starts after a one-value all-reduce over the
// cp group that lines the ranks up (untimed), so a split's time is its own ring's waits, not the
// previous run's stragglers. The median: on a shared machine one fast sample says little about
// what a pass costs in the step.
double time_pass(Communicator& cp, CpSubgroupComm* comm, const Gpt& model, const Exec& ex, Allocator& alloc,
                 const Batch& row, CpPlacement g, int64_t length, int repeats) {
  const DynamicCp::Pass pass = pass_of(comm, row, CpPass{g, {0}});
  const Batch& b = pass.batch;
  std::vector<double> t;
  double one = 0;
  for (int i = 0; i <= repeats; ++i) {
    cp.all_reduce(Tensor(&one, DType::F64, {1}), ReduceOp::Sum);
    const CpSubgroupScope scope(comm, g.first, g.ranks);
    const SequenceLayout seq = share_layout(b, ContextParallel{comm, CpComm::Ring}, length);
    const Buffer tokens = upload(ex, alloc, Tensor(const_cast<int32_t*>(b.tokens.data()), DType::I32, {b.B, b.T}),
                                 MemCategory::Activations);
    const Buffer targets = upload(ex, alloc, Tensor(const_cast<int32_t*>(b.targets.data()), DType::I32, {b.B, b.T}),
                                  MemCategory::Activations);
    GptCtx ctx;
    synchronize(ex);
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(ex, ctx, alloc, tokens, targets, seq);
    model.backward(ex, ctx, alloc, 0.0);
    synchronize(ex);
    if (i > 0) t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

std::string DynamicCp::calibrate(const Config& cfg, const Gpt& model, const Exec& ex, Allocator& alloc) {
  (void)cfg;
  const int repeats = 3;
  const int64_t L = length_, cp = cp_->size(), rank = cp_->rank();
  const bool measure = cost_from_.empty();
  CpTimings t;
  t.length = L;
  if (measure) {
    // Whole rows: one document, and eight (the attention's pairs differ, the tokens do not); then
    // the one-document row split over each subgroup size the planner may use, every aligned
    // subgroup of that size at once (as a step's split passes run beside each other).
    t.docs_a = {L};
    for (int64_t left = L, d = std::max<int64_t>(1, L / 8); left > 0; left -= std::min(d, left))
      t.docs_b.push_back(std::min(d, left));
    std::vector<double> v;  // (whole a, whole b, split per size), each this rank's median
    v.push_back(time_pass(*cp_, comm_.get(), model, ex, alloc, calibration_row(t.docs_a, L), {rank, 1}, L, repeats));
    v.push_back(time_pass(*cp_, comm_.get(), model, ex, alloc, calibration_row(t.docs_b, L), {rank, 1}, L, repeats));
    t.split_ranks = cp_split_sizes(cp, L);
    for (int64_t s : t.split_ranks)
      v.push_back(time_pass(*cp_, comm_.get(), model, ex, alloc, calibration_row(t.docs_a, L), {rank / s * s, s}, L,
                            repeats));
    // Every rank fits the cp group's mean timings.
    cp_->all_reduce(Tensor(v.data(), DType::F64, {static_cast<int64_t>(v.size())}), ReduceOp::Average);
    t.whole_a_s = v[0];
    t.whole_b_s = v[1];
    t.split_s.assign(v.begin() + 2, v.end());
    cost_ = fit_cp_cost(t);
  }
  // Every rank plans with the same numbers: the fit as the cp group's first rank holds it (a file's
  // or a checkpoint's are the same values on every rank, kept exactly).
  std::vector<double> v = {cost_.token_s, cost_.pair_s, cost_.ring_step_s, cost_.ring_token_s};
  const Tensor tv(v.data(), DType::F64, {4});
  cp_->broadcast(tv, 0);
  if (tp_) tp_->broadcast(tv, 0);  // the tp group runs the same passes: its first rank's cp group's numbers
  cost_ = CpCostModel{v[0], v[1], v[2], v[3]};
  std::ostringstream o;
  o << "dynamic cp cost model (" << (measure ? "measured" + (resume_note_.empty() ? "" : ": " + resume_note_) : cost_from_)
    << "): " << cost_.str() << "; a whole row of " << L << " tokens, one document: "
    << (cost_.token_s * static_cast<double>(L) + cost_.pair_s * static_cast<double>(L * (L + 1) / 2)) * 1e3 << " ms";
  for (size_t i = 0; i < t.split_ranks.size(); ++i) {  // measured: the fit beside what it was fitted to
    const std::vector<double> c = cp_row_cost(t.docs_a, L, t.split_ranks[i], cost_);
    o << (i == 0 ? "; split over " : ", over ") << t.split_ranks[i] << " ranks: measured " << t.split_s[i] * 1e3
      << " ms, predicted " << (*std::max_element(c.begin(), c.end()) + cp_pass_s(t.split_ranks[i], cost_)) * 1e3
      << " ms";
  }
  return o.str();
}

namespace {
// The cost model's seconds of the slowest cp rank when every row is split over the whole cp group
// (static cp); 0 when seq_len does not allow it.
double static_cp_seconds(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t cp,
                         const CpCostModel& m) {
  if (length % (2 * cp) != 0) return 0;
  const std::vector<CpPlacement> all(rows.size(), CpPlacement{0, cp});
  const std::vector<double> s = cp_rank_seconds(rows, length, cp, all, m);
  return *std::max_element(s.begin(), s.end());
}
}  // namespace

std::vector<DynamicCp::Pass> DynamicCp::passes(const Batch& b) {
  TESSERA_CHECK(b.T == length_, "dynamic cp: a micro-batch of rows of ", b.T, " positions, not train.seq_len = ", length_);
  std::vector<std::vector<int64_t>> rows;
  for (int64_t r = 0; r < b.B; ++r) rows.push_back(row_documents(b, r));
  const CpPlan plan = plan_dynamic_cp(rows, length_, cp_->size(), cost_);
  ++plans_;
  split_ += plan.split_rows();
  whole_ += b.B - plan.split_rows();
  imbalance_sum_ += plan.imbalance();
  predicted_s_ += plan.max_s();
  predicted_static_s_ += static_cp_seconds(rows, length_, cp_->size(), cost_);
  rows_total_ += b.B;
  split_total_ += plan.split_rows();
  std::vector<Pass> out;
  for (const CpPass& p : cp_passes(plan, cp_->rank())) out.push_back(pass_of(comm_.get(), b, p));
  return out;
}

DynamicCp::Pass DynamicCp::idle_pass(const Batch& b) const {
  Pass p{{cp_->rank(), 1}, batch_rows(b, {0})};
  std::fill(p.batch.targets.begin(), p.batch.targets.end(), kIgnoreTarget);
  return p;
}

DynamicCp::Window DynamicCp::take_window(int64_t steps) {
  Window w;
  const double n = static_cast<double>(std::max<int64_t>(1, steps));
  w.rows_split = static_cast<double>(split_) / n;
  w.rows_whole = static_cast<double>(whole_) / n;
  w.predicted_imbalance = plans_ > 0 ? imbalance_sum_ / static_cast<double>(plans_) : 0.0;
  w.predicted_s = predicted_s_ / n;
  w.predicted_static_s = predicted_static_s_ / n;
  w.busy_s = busy_s_ / n;
  std::vector<double> mine = {w.busy_s}, all(static_cast<size_t>(cp_->size()));
  cp_->all_gather(Tensor(mine.data(), DType::F64, {1}), Tensor(all.data(), DType::F64, {cp_->size()}));
  double sum = 0, max = 0;
  for (double x : all) sum += x, max = std::max(max, x);
  w.busy_imbalance = sum > 0 ? max / (sum / static_cast<double>(all.size())) - 1.0 : 0.0;
  w.busy_max_s = max;
  plans_ = split_ = whole_ = 0;
  imbalance_sum_ = busy_s_ = predicted_s_ = predicted_static_s_ = 0;
  return w;
}

}  // namespace tessera
