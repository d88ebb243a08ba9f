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

// The fastest of `repeats` forward + backward runs of row through model (after one warm-up), loss
// scale 0. The fastest, not the median: on a shared machine the noise only adds, and the ring below
// is timed the same way, so the two stay comparable.
double time_row(const Gpt& model, const Exec& ex, Allocator& alloc, const Batch& row, int repeats) {
  std::vector<double> t;
  const SequenceLayout seq = SequenceLayout::contiguous(row.T).with_documents(1, row.doc_start, row.doc_position);
  for (int i = 0; i <= repeats; ++i) {
    const Buffer tokens = upload(ex, alloc, Tensor(const_cast<int32_t*>(row.tokens.data()), DType::I32, {1, row.T}),
                                 MemCategory::Activations);
    const Buffer targets = upload(ex, alloc, Tensor(const_cast<int32_t*>(row.targets.data()), DType::I32, {1, row.T}),
                                  MemCategory::Activations);
    GptCtx ctx;
    synchronize(ex);
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(ex, ctx, alloc, tokens, targets, seq);
    model.backward(ex, ctx, alloc, 0.0);
    synchronize(ex);
    if (i > 0) t.push_back(seconds_since(t0));
  }
  return *std::min_element(t.begin(), t.end());
}

// The fastest of `repeats` ring exchanges of `floats` F32 values over cp (send to the next rank,
// receive from the previous), each right after an untimed exchange of one value that lines the
// ranks up.
double time_ring(Communicator& cp, int64_t floats, int repeats) {
  std::vector<float> out(static_cast<size_t>(floats), 1.0f), in(static_cast<size_t>(floats));
  const int next = (cp.rank() + 1) % cp.size(), prev = (cp.rank() + cp.size() - 1) % cp.size();
  const auto exchange = [&](int64_t n) {
    cp.batch_send_recv({P2POp::send(Tensor(out.data(), DType::F32, {n}), next, 7),
                        P2POp::recv(Tensor(in.data(), DType::F32, {n}), prev, 7)});
  };
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    exchange(1);
    const auto t0 = std::chrono::steady_clock::now();
    exchange(floats);
    t.push_back(seconds_since(t0));
  }
  return *std::min_element(t.begin(), t.end());
}

}  // namespace

std::string DynamicCp::calibrate(const Config& cfg, const Gpt& model, const Exec& ex, Allocator& alloc) {
  const int repeats = 3;
  const ModelConfig& mc = model.config();
  const int64_t L = length_;
  const bool measure = cost_from_.empty();
  if (measure) {
    // Whole rows: one document, and eight (the attention's pairs differ, the tokens do not).
    const std::vector<int64_t> one = {L};
    std::vector<int64_t> eight;
    for (int64_t left = L, d = std::max<int64_t>(1, L / 8); left > 0; left -= std::min(d, left))
      eight.push_back(std::min(d, left));
    const double ta = time_row(model, ex, alloc, calibration_row(one, L), repeats);
    const double tb = time_row(model, ex, alloc, calibration_row(eight, L), repeats);
    const double pa = static_cast<double>(cp_row_pairs(one, L, 1, 0)), pb = static_cast<double>(cp_row_pairs(eight, L, 1, 0));
    CpCostModel m;
    m.pair_s = pa > pb ? std::max(0.0, (ta - tb) / (pa - pb)) : 0.0;
    m.token_s = std::max(0.0, (tb - m.pair_s * pb) / static_cast<double>(L));
    // The ring: every layer exchanges K and V once forward and K, V and their gradients backward.
    const int64_t kv_floats_per_token = 2 * mc.kv_heads() * mc.head_dim();
    // (the large message: a whole row's K/V, twice the largest chunk a split sends, for a slope
    // well above the noise)
    const int64_t small = 16, big = std::max<int64_t>(small + 1, L * kv_floats_per_token);
    const double ts = time_ring(*cp_, small, 9), tl = time_ring(*cp_, big, 9);
    const double per_float = std::max(0.0, (tl - ts) / static_cast<double>(big - small));
    const double exchanges = 3.0 * static_cast<double>(mc.n_layer);
    m.ring_step_s = exchanges * ts;
    m.ring_token_s = exchanges * per_float * static_cast<double>(kv_floats_per_token);
    cost_ = m;
  }
  // Every rank plans with the same numbers: the cp group's mean of the measured ones, as its first
  // rank holds it (a file's or a checkpoint's are not averaged: the same values, kept exactly).
  std::vector<double> v = {cost_.token_s, cost_.pair_s, cost_.ring_step_s, cost_.ring_token_s};
  const Tensor t(v.data(), DType::F64, {4});
  if (measure) cp_->all_reduce(t, ReduceOp::Average);
  cp_->broadcast(t, 0);
  if (tp_) tp_->broadcast(t, 0);  // the tp group runs the same passes: its first rank's cp group's numbers
  cost_ = CpCostModel{v[0], v[1], v[2], v[3]};
  std::ostringstream o;
  o << "dynamic cp cost model (" << (measure ? "measured" + (resume_note_.empty() ? "" : ": " + resume_note_) : cost_from_)
    << "): " << cost_.str() << "; a whole row of " << L << " tokens, one document: "
    << (cost_.token_s * static_cast<double>(L) + cost_.pair_s * static_cast<double>(L * (L + 1) / 2)) * 1e3 << " ms";
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
  for (const CpPass& p : cp_passes(plan, cp_->rank())) {
    Batch sub = batch_rows(b, p.rows);
    if (p.group.split()) {
      const CpSubgroupScope scope(comm_.get(), p.group.first, p.group.ranks);
      sub = cp_share(sub, ContextParallel{comm_.get(), CpComm::Ring});
    }
    out.push_back({p.group, std::move(sub)});
  }
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
