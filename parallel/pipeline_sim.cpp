// The schedule simulator: each rank's list becomes steps (post a batch, wait for a batch, compute),
// placed where run_schedule posts and waits; ranks advance in turn until all finish or none can
// (a deadlock). Times follow from the costs and the matching of sends and receives.
#include "parallel/pipeline_sim.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "kernels/check.h"

namespace tessera {

namespace {

using ActionKey = std::tuple<ActionKind, int64_t, int64_t>;
ActionKey key_of(const Action& a) { return {a.kind, a.micro_batch, a.chunk}; }

// The send that `recv` of rank `rank` expects (the inverse of receive_of).
Action send_expected(const Action& recv, int64_t rank, int64_t pp) {
  if (recv.kind == ActionKind::RecvActivation)
    return send_activation(recv.micro_batch, rank == 0 ? recv.chunk - 1 : recv.chunk);
  return send_grad(recv.micro_batch, rank == pp - 1 ? recv.chunk + 1 : recv.chunk);
}

struct Step {
  enum Kind : uint8_t { Post, Wait, Compute } kind;
  size_t index;  // the batch (Post, Wait) or the action (Compute)
};

struct Op {  // a posted send or receive
  int64_t rank;
  size_t action;
};

struct Channel {  // from one rank to another, in posting order
  std::vector<Op> sends, recvs;
};

struct RankState {
  int64_t index = 0;  // the rank
  const std::vector<Action>* actions = nullptr;
  std::vector<std::vector<size_t>> batches;  // action indices of each p2p batch
  std::vector<Step> steps;
  std::set<std::pair<int64_t, int64_t>> split;  // (m, chunk) whose backward is split into B and W
  std::set<std::pair<int64_t, int64_t>> recomputed;  // (m, chunk) with a Recompute action (R) of its own
  std::vector<std::optional<double>> posted;    // per action: when its batch was posted
  std::vector<size_t> slot;                     // per p2p action: its position in its channel
  size_t step = 0;
  double t = 0;
  int64_t in_flight = 0;
  int64_t held = 0;  // R run, its backward not yet
  SimRank out;
  bool done() const { return step == steps.size(); }
};

class Simulation {
 public:
  Simulation(const Schedule& s, const SimOptions& o) : s_(s), o_(o), pp_(s.num_stages()), ranks_(s.stages.size()) {
    for (size_t r = 0; r < ranks_.size(); ++r) plan(static_cast<int64_t>(r));
  }

  SimResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int64_t r = 0; r < pp_; ++r)
        while (!rank(r).done() && advance(r)) progress = true;
    }
    SimResult res;
    for (int64_t r = 0; r < pp_; ++r)
      if (!rank(r).done()) res.stuck.push_back(describe_stuck(r));
    res.deadlock = !res.stuck.empty();
    for (const RankState& st : ranks_) res.makespan = std::max(res.makespan, st.out.finish);
    double idle = 0;
    for (RankState& st : ranks_) {
      st.out.idle = res.makespan - st.out.busy;
      idle += st.out.idle;
      res.ranks.push_back(st.out);
    }
    res.bubble_fraction = res.makespan > 0 ? idle / (static_cast<double>(pp_) * res.makespan) : 0.0;
    res.spans = std::move(spans_);
    return res;
  }

 private:
  RankState& rank(int64_t r) { return ranks_[static_cast<size_t>(r)]; }

  // The rank's steps, where run_schedule posts and waits (checked by run_schedule itself first).
  void plan(int64_t r) {
    RankState& st = rank(r);
    const std::vector<Action>& actions = s_.stages[static_cast<size_t>(r)];
    st.index = r;
    st.actions = &actions;
    PipelineCallbacks dry;
    dry.forward = [](int64_t, int64_t) {};
    dry.backward = [](const BackwardCall&) {};
    dry.backward_weight = [](const BackwardCall&) {};
    dry.recompute = [](int64_t, int64_t) {};
    dry.p2p = [](const std::vector<Action>&) { return CommHandle(); };
    try {
      run_schedule(actions, dry);
    } catch (const Error& e) {
      detail::fail("simulate: rank ", r, ": ", e.what());
    }
    st.posted.resize(actions.size());
    st.slot.resize(actions.size());
    for (const Action& a : actions) {
      if (a.kind == ActionKind::BackwardWeight) st.split.insert({a.micro_batch, a.chunk});
      if (a.kind == ActionKind::Recompute) st.recomputed.insert({a.micro_batch, a.chunk});
    }
    std::map<ActionKey, size_t> batch_of;  // a receive -> its batch
    std::vector<bool> waited;
    for (size_t i = 0; i < actions.size();) {
      if (is_p2p(actions[i])) {
        const size_t b = st.batches.size();
        st.batches.emplace_back();
        for (; i < actions.size() && is_p2p(actions[i]); ++i) {
          st.batches[b].push_back(i);
          if (!is_send(actions[i])) batch_of[key_of(actions[i])] = b;
        }
        st.steps.push_back({Step::Post, b});
        waited.push_back(o_.wait == P2pWait::AtPost);
        if (o_.wait == P2pWait::AtPost) st.steps.push_back({Step::Wait, b});
        continue;
      }
      const Action& a = actions[i];
      const ActionKind input = a.kind == ActionKind::Forward ? ActionKind::RecvActivation : ActionKind::RecvGrad;
      if (a.kind != ActionKind::BackwardWeight && a.kind != ActionKind::Recompute) {  // R reads nothing received
        auto it = batch_of.find({input, a.micro_batch, a.chunk});
        if (it != batch_of.end() && !waited[it->second]) {
          st.steps.push_back({Step::Wait, it->second});
          waited[it->second] = true;
        }
      }
      st.steps.push_back({Step::Compute, i});
      ++i;
    }
    for (size_t b = 0; b < waited.size(); ++b)
      if (!waited[b]) st.steps.push_back({Step::Wait, b});
  }

  Channel& channel_of(int64_t r, const Action& a) {
    const int64_t peer = peer_of(a, r, pp_);
    return is_send(a) ? channels_[{r, peer}] : channels_[{peer, r}];
  }

  // The other end of rank r's action i, once posted.
  std::optional<Op> partner(int64_t r, size_t i) {
    const Action& a = (*rank(r).actions)[i];
    const Channel& ch = channel_of(r, a);
    const std::vector<Op>& other = is_send(a) ? ch.recvs : ch.sends;
    const size_t k = rank(r).slot[i];
    if (k < other.size()) return other[k];
    return std::nullopt;
  }

  void post(int64_t r, size_t b) {
    RankState& st = rank(r);
    for (size_t i : st.batches[b]) {
      const Action& a = (*st.actions)[i];
      Channel& ch = channel_of(r, a);
      std::vector<Op>& mine = is_send(a) ? ch.sends : ch.recvs;
      st.slot[i] = mine.size();
      mine.push_back({r, i});
      st.posted[i] = st.t;
      if (std::optional<Op> other = partner(r, i)) {
        const Op send = is_send(a) ? Op{r, i} : *other, recv = is_send(a) ? *other : Op{r, i};
        const Action& sa = (*rank(send.rank).actions)[send.action];
        const Action& ra = (*rank(recv.rank).actions)[recv.action];
        TESSERA_CHECK(receive_of(sa, send.rank, pp_) == ra, "simulate: rank ", recv.rank, "'s action ", recv.action,
                      " (", to_string(ra), ") would receive rank ", send.rank, "'s action ", send.action, " (",
                      to_string(sa), "): two ranks' messages match in the order they are posted");
      }
    }
  }

  // When batch b of rank r is complete, or nothing while a partner has not posted.
  std::optional<double> completion(int64_t r, size_t b) {
    double done = 0;
    for (size_t i : rank(r).batches[b]) {
      const std::optional<Op> other = partner(r, i);
      if (!other) return std::nullopt;
      done = std::max(done, std::max(*rank(r).posted[i], *rank(other->rank).posted[other->action]) + o_.latency);
    }
    return done;
  }

  double cost(const RankState& st, const Action& a) const {
    ChunkCost c{o_.forward / static_cast<double>(s_.vpp), o_.backward / static_cast<double>(s_.vpp),
                o_.weight / static_cast<double>(s_.vpp)};
    if (!o_.chunks.empty()) c = o_.chunks[static_cast<size_t>(a.chunk * pp_ + st.index)];
    switch (a.kind) {
      case ActionKind::Forward: return c.forward;
      case ActionKind::Backward: {
        const std::pair<int64_t, int64_t> k{a.micro_batch, a.chunk};
        // Full recomputation without an R of its own: the backward re-runs the forward first.
        const double redo = o_.full_recompute && !st.recomputed.count(k) ? c.forward : 0.0;
        return redo + c.backward + (st.split.count(k) ? 0.0 : c.weight);
      }
      case ActionKind::BackwardWeight: return c.weight;
      case ActionKind::Recompute: return c.recompute >= 0 ? c.recompute : c.forward;
      default: return 0;
    }
  }

  // Runs rank r's next step; false when it must wait for another rank.
  bool advance(int64_t r) {
    RankState& st = rank(r);
    const Step step = st.steps[st.step];
    if (step.kind == Step::Post) {
      post(r, step.index);
    } else if (step.kind == Step::Wait) {
      const std::optional<double> done = completion(r, step.index);
      if (!done) return false;
      st.t = std::max(st.t, *done);
    } else {
      const Action& a = (*st.actions)[step.index];
      const double c = cost(st, a);
      spans_.push_back({r, a, st.t, st.t + c});
      st.t += c;
      st.out.busy += c;
      const bool frees = a.kind == ActionKind::BackwardWeight ||
                         (a.kind == ActionKind::Backward && !st.split.count({a.micro_batch, a.chunk}));
      st.in_flight += a.kind == ActionKind::Forward ? 1 : frees ? -1 : 0;
      st.out.peak_in_flight = std::max(st.out.peak_in_flight, st.in_flight);
      if (a.kind == ActionKind::Recompute) ++st.held;
      if (a.kind == ActionKind::Backward && st.recomputed.count({a.micro_batch, a.chunk})) --st.held;
      st.out.peak_recomputed = std::max(st.out.peak_recomputed, st.held);
    }
    st.out.finish = st.t;
    ++st.step;
    return true;
  }

  std::string batch_text(int64_t r, size_t b) {
    std::vector<Action> batch;
    for (size_t i : rank(r).batches[b]) batch.push_back((*rank(r).actions)[i]);
    std::string text = "[";
    text += to_string(batch);
    text += ']';
    return text;
  }

  // "rank 1 waits for its batch [sendA1 recvG0] (actions 4-5): rank 2 has not posted recvA1 (it
  // waits for its batch [sendG0 recvA2])".
  std::string describe_stuck(int64_t r) {
    RankState& st = rank(r);
    const size_t b = st.steps[st.step].index;
    std::string text = "rank " + std::to_string(r) + " waits for its batch " + batch_text(r, b) + " (actions " +
                       std::to_string(st.batches[b].front()) + "-" + std::to_string(st.batches[b].back()) + ")";
    for (size_t i : st.batches[b]) {
      if (partner(r, i)) continue;
      const Action& a = (*st.actions)[i];
      const int64_t peer = peer_of(a, r, pp_);
      const Action expected = is_send(a) ? receive_of(a, r, pp_) : send_expected(a, r, pp_);
      text += ": rank " + std::to_string(peer) + " has not posted " + to_string(expected);
      const RankState& ps = rank(peer);
      text += ps.done() ? " (it has finished)"
                        : " (it waits for its batch " + batch_text(peer, ps.steps[ps.step].index) + ")";
      break;
    }
    return text;
  }

  const Schedule& s_;
  const SimOptions& o_;
  int64_t pp_;
  std::vector<RankState> ranks_;
  std::map<std::pair<int64_t, int64_t>, Channel> channels_;  // (from, to)
  std::vector<SimSpan> spans_;
};

// "none", "full" (recomputed inside each backward) or "bubble" (the schedule holds R actions).
const char* recompute_name(const Schedule& s, const SimOptions& o) {
  if (!o.full_recompute) return "none";
  for (const std::vector<Action>& list : s.stages)
    for (const Action& a : list)
      if (a.kind == ActionKind::Recompute) return "bubble";
  return "full";
}

const char* kind_letter(ActionKind k) {
  return k == ActionKind::Forward ? "F" : k == ActionKind::Backward ? "B" : k == ActionKind::Recompute ? "R" : "W";
}

}  // namespace

SimResult simulate(const Schedule& schedule, const SimOptions& options) {
  TESSERA_CHECK(schedule.num_stages() >= 1 && schedule.vpp >= 1, "simulate: a schedule of ", schedule.num_stages(),
                " stages and ", schedule.vpp, " chunks per stage");
  TESSERA_CHECK(options.forward >= 0 && options.backward >= 0 && options.weight >= 0 && options.latency >= 0,
                "simulate: costs must not be negative");
  TESSERA_CHECK(options.chunks.empty() ||
                    static_cast<int64_t>(options.chunks.size()) == schedule.num_stages() * schedule.vpp,
                "simulate: ", options.chunks.size(), " chunk costs for ", schedule.num_stages(), " x ", schedule.vpp,
                " chunks");
  for (const ChunkCost& c : options.chunks)
    TESSERA_CHECK(c.forward >= 0 && c.backward >= 0 && c.weight >= 0, "simulate: costs must not be negative");
  SimResult r = Simulation(schedule, options).run();
  std::stable_sort(r.spans.begin(), r.spans.end(),
                   [](const SimSpan& a, const SimSpan& b) { return a.rank < b.rank; });
  return r;
}

namespace {

// The simulator's duration of a computation (Simulation::cost) with every backward's R held: rank
// r's action a of the chunk's costs; split: the backward is B alone.
PlacementCosts placement_costs(const SimOptions& o, int64_t pp, int64_t vpp) {
  PlacementCosts costs;
  costs.latency = o.latency;
  costs.duration = [o, pp, vpp](int64_t r, const Action& a, bool split) {
    ChunkCost c{o.forward / static_cast<double>(vpp), o.backward / static_cast<double>(vpp),
                o.weight / static_cast<double>(vpp)};
    if (!o.chunks.empty()) c = o.chunks[static_cast<size_t>(a.chunk * pp + r)];
    switch (a.kind) {
      case ActionKind::Forward: return c.forward;
      case ActionKind::Backward: return c.backward + (split ? 0.0 : c.weight);
      case ActionKind::BackwardWeight: return c.weight;
      case ActionKind::Recompute: return c.recompute >= 0 ? c.recompute : c.forward;
      default: return 0.0;
    }
  };
  return costs;
}

int64_t most_recomputed(const SimResult& r) {
  int64_t most = 0;
  for (const SimRank& k : r.ranks) most = std::max(most, k.peak_recomputed);
  return most;
}

}  // namespace

Schedule bubble_schedule_for_costs(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind,
                                   int64_t recompute_ahead, const SimOptions& options) {
  SimOptions sim = options;
  sim.full_recompute = true;
  TESSERA_CHECK(sim.chunks.empty() || static_cast<int64_t>(sim.chunks.size()) == pp * vpp,
                "bubble_schedule_for_costs: ", sim.chunks.size(), " chunk costs for ", pp, " x ", vpp, " chunks");
  // Every R right before its B first: it wins ties.
  std::vector<Schedule> candidates{pipeline_schedule(pp, vpp, micro_batches, kind, true, 1)};
  if (recompute_ahead >= 2) {
    candidates.push_back(pipeline_schedule(pp, vpp, micro_batches, kind, true, recompute_ahead,
                                           placement_costs(sim, pp, vpp)));
    candidates.push_back(pipeline_schedule(pp, vpp, micro_batches, kind, true, recompute_ahead));
  }
  size_t best = 0;
  double best_step = 0;
  int64_t best_held = 0;
  SimOptions blocking = sim;
  blocking.wait = P2pWait::AtPost;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const SimResult r = simulate(candidates[i], sim);
    // A placement whose receives (placed by the unit timeline) would deadlock with every batch
    // blocking is dropped: the schedules run_schedule gets are deadlock-free both ways.
    const bool deadlock = r.deadlock || simulate(candidates[i], blocking).deadlock;
    TESSERA_CHECK(i > 0 || !deadlock, "bubble_schedule_for_costs: each R before its B deadlocks (a generator bug)");
    if (deadlock) continue;
    const int64_t held = most_recomputed(r);
    if (i == 0 || r.makespan < best_step || (r.makespan == best_step && held < best_held)) {
      best = i;
      best_step = r.makespan;
      best_held = held;
    }
  }
  return candidates[best];
}

std::string timeline_json(const Schedule& schedule, const SimResult& result, std::string_view name,
                          const SimOptions& options) {
  std::ostringstream os;
  os.precision(12);
  os << "{\"schedule\": \"" << name << "\", \"pp\": " << schedule.num_stages() << ", \"vpp\": " << schedule.vpp
     << ", \"micro_batches\": " << schedule.micro_batches << ",\n \"costs\": {\"forward\": " << options.forward
     << ", \"backward\": " << options.backward << ", \"weight\": " << options.weight
     << ", \"latency\": " << options.latency << "},\n \"recompute\": \"" << recompute_name(schedule, options)
     << "\", \"deadlock\": " << (result.deadlock ? "true" : "false")
     << ", \"makespan\": " << result.makespan << ", \"bubble_fraction\": " << result.bubble_fraction
     << ",\n \"ranks\": [";
  for (size_t r = 0; r < result.ranks.size(); ++r) {
    const SimRank& k = result.ranks[r];
    os << (r ? ", " : "") << "{\"busy\": " << k.busy << ", \"idle\": " << k.idle << ", \"finish\": " << k.finish
       << ", \"peak_in_flight\": " << k.peak_in_flight << ", \"peak_recomputed\": " << k.peak_recomputed << "}";
  }
  os << "],\n \"spans\": [";
  for (size_t i = 0; i < result.spans.size(); ++i) {
    const SimSpan& s = result.spans[i];
    os << (i ? ",\n  " : "\n  ") << "{\"rank\": " << s.rank << ", \"kind\": \"" << kind_letter(s.action.kind)
       << "\", \"micro_batch\": " << s.action.micro_batch << ", \"chunk\": " << s.action.chunk
       << ", \"start\": " << s.start << ", \"end\": " << s.end << "}";
  }
  os << "]}\n";
  return os.str();
}

}  // namespace tessera
