// The pipeline schedule generators: each kind orders a rank's forwards and backwards by phase, then
// add_transfers places the sends and receives between neighbouring ranks the same way for all.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/check.h"

namespace tessera {

namespace {

// The micro-batches per step are train.global_batch's accumulation steps; the message says so.
std::string micro_batches_text(int64_t m) {
  return std::to_string(m) + " micro-batches per step (train.global_batch / (train.micro_batch x dp))";
}

std::string kind_text(PipelineKind kind) {
  return "parallel.pp_schedule = \"" + std::string(pipeline_kind_name(kind)) + "\"";
}

// ---- each kind's order of computations on rank r (no transfers yet) ----

// GPipe: all forwards (the pipeline fills), then all backwards (it drains); every micro-batch's
// activations are alive at the turn.
std::vector<Action> gpipe_order(int64_t n) {
  std::vector<Action> order;
  for (int64_t m = 0; m < n; ++m) order.push_back(forward_action(m));
  for (int64_t m = 0; m < n; ++m) order.push_back(backward_action(m));
  return order;
}

// 1F1B (PipeDream-Flush, Megatron's default): rank r runs pp - r - 1 forwards to fill the
// pipeline, then alternates one forward with one backward, then drains the remaining backwards. At
// most pp - r micro-batches are alive on rank r.
std::vector<Action> one_f_one_b_order(int64_t pp, int64_t r, int64_t n) {
  const int64_t warmup = std::min(pp - r - 1, n);
  std::vector<Action> order;
  for (int64_t m = 0; m < warmup; ++m) order.push_back(forward_action(m));  // warm-up
  for (int64_t i = 0; i < n - warmup; ++i) {                                // steady 1F1B
    order.push_back(forward_action(warmup + i));
    order.push_back(backward_action(i));
  }
  for (int64_t m = n - warmup; m < n; ++m) order.push_back(backward_action(m));  // cool-down
  return order;
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B's order with each backward split
// into B (the input gradient, on the critical path to the previous rank) and W (the weight
// gradient, which nothing waits for). Rank r runs W(j) after B(j + r): the later ranks, whose
// backwards reach rank 0 first, hold their W back to fill the cool-down, where 1F1B idles waiting
// for gradients. Micro-batch j's activations live until W(j), so rank r holds at most
// (pp - r) + r = pp: the peak of 1F1B's first rank. The bubble shrinks from (pp - 1)(f + b + w) to
// (pp - 1)(f + b - w).
std::vector<Action> zb_h1_order(int64_t pp, int64_t r, int64_t n) {
  std::vector<Action> order;
  int64_t next_w = 0;
  for (const Action& a : one_f_one_b_order(pp, r, n)) {
    order.push_back(a);
    if (a.kind == ActionKind::Backward && a.micro_batch - r >= 0) order.push_back(weight_action(next_w++));
  }
  while (next_w < n) order.push_back(weight_action(next_w++));  // the held-back Ws, last of all
  return order;
}

// Megatron-LM's interleaved 1F1B: rank r holds vpp chunks (chunk c is virtual stage c pp + r) and
// runs the micro-batches in groups of pp: chunk 0 of micro-batches 0..pp-1, chunk 1 of the same
// group, ..., then the next group. Its k-th forward is:
Action interleaved_forward(int64_t pp, int64_t vpp, int64_t k) {
  const int64_t in_group = k % (pp * vpp);
  return forward_action((k / (pp * vpp)) * pp + in_group % pp, in_group / pp);
}
// and its k-th backward the same micro-batch order, chunks from the last down.
Action interleaved_backward(int64_t pp, int64_t vpp, int64_t k) {
  const int64_t in_group = k % (pp * vpp);
  return backward_action((k / (pp * vpp)) * pp + in_group % pp, vpp - 1 - in_group / pp);
}
// The warm-up runs (vpp - 1) pp forwards (every chunk but the last of the first group) plus twice
// the distance to the last rank, so that the steady phase never waits for an input; then 1F1B over
// the (micro-batch, chunk) pairs; then the cool-down's backwards. The pipeline's fill and drain
// take chunk-sized steps, 1/vpp of a stage: the bubble is about 1/vpp of 1F1B's.
std::vector<Action> interleaved_order(int64_t pp, int64_t vpp, int64_t r, int64_t n) {
  const int64_t total = n * vpp;
  const int64_t warmup = std::min(2 * (pp - r - 1) + (vpp - 1) * pp, total);
  std::vector<Action> order;
  for (int64_t k = 0; k < warmup; ++k) order.push_back(interleaved_forward(pp, vpp, k));  // warm-up
  for (int64_t i = 0; i < total - warmup; ++i) {                                          // steady
    order.push_back(interleaved_forward(pp, vpp, warmup + i));
    order.push_back(interleaved_backward(pp, vpp, i));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.push_back(interleaved_backward(pp, vpp, k));  // cool-down
  return order;
}

// ---- the transfers ----

// A tensor one computation sends to the neighbouring rank: what the sender and the receiver run.
struct Transfer {
  int64_t from = 0, to = 0;  // pipeline ranks
  Action send, recv;
  Action consumer;  // the receiver's computation that reads it
};

// What the computation `a` of rank r sends, if anything: a forward's output to the next virtual
// stage, a backward's input gradient to the previous one (the first and last virtual stages have
// no such neighbour).
std::optional<Transfer> transfer_of(const Action& a, int64_t r, int64_t pp, int64_t vpp) {
  const int64_t stage = a.chunk * pp + r;  // the virtual stage
  Action send;
  if (a.kind == ActionKind::Forward && stage < pp * vpp - 1)
    send = send_activation(a.micro_batch, a.chunk);
  else if (a.kind == ActionKind::Backward && stage > 0)
    send = send_grad(a.micro_batch, a.chunk);
  else
    return std::nullopt;
  const Action recv = receive_of(send, r, pp);
  return Transfer{r, peer_of(send, r, pp), send, recv, Action{a.kind, recv.micro_batch, recv.chunk}};
}

using ActionKey = std::tuple<ActionKind, int64_t, int64_t>;
ActionKey key_of(const Action& a) { return {a.kind, a.micro_batch, a.chunk}; }

// Whether computation a of rank r reads a tensor another rank sends: a forward's input from the
// previous virtual stage, a backward's output gradient from the next one.
bool reads_a_transfer(const Action& a, int64_t r, int64_t pp, int64_t vpp) {
  const int64_t stage = a.chunk * pp + r;  // the virtual stage
  return (a.kind == ActionKind::Forward && stage > 0) || (a.kind == ActionKind::Backward && stage < pp * vpp - 1);
}

// The neighbour's computation whose output computation a of rank r reads (reads_a_transfer): the
// previous virtual stage's forward, the next one's backward; (its rank, its key).
std::pair<int64_t, ActionKey> producer_of(const Action& a, int64_t r, int64_t pp) {
  const bool fwd = a.kind == ActionKind::Forward;
  const int64_t from = (r + (fwd ? pp - 1 : 1)) % pp;
  const int64_t chunk = fwd ? (r == 0 ? a.chunk - 1 : a.chunk) : (r == pp - 1 ? a.chunk + 1 : a.chunk);
  return {from, {a.kind, a.micro_batch, chunk}};
}

// The backwards of a rank's order whose W is a separate action (zb-h1).
std::set<ActionKey> split_backwards(const std::vector<Action>& order) {
  std::set<ActionKey> split;
  for (const Action& a : order)
    if (a.kind == ActionKind::BackwardWeight) split.insert(key_of(backward_action(a.micro_batch, a.chunk)));
  return split;
}

// The unit costs the schedules are designed for: a forward, an R, a B and a W 1 each, a whole
// backward (B and W together) 2.
double unit_cost(const Action& a, const std::set<ActionKey>& split) {
  return a.kind == ActionKind::Backward && !split.count(key_of(a)) ? 2.0 : 1.0;
}

// When each computation starts and ends if transfers were free and never waited for their
// receiver, with unit costs (a forward 1, a whole backward 2, B and W 1 each): the timeline the
// schedule is designed for, by which the receives are placed below.
struct IdealTimeline {
  std::vector<std::vector<double>> start, end;  // [rank][computation]
};

IdealTimeline ideal_timeline(const std::vector<std::vector<Action>>& order, int64_t vpp) {
  const int64_t pp = static_cast<int64_t>(order.size());
  std::vector<std::map<ActionKey, double>> done(order.size());  // rank -> computation -> end
  IdealTimeline t{std::vector<std::vector<double>>(order.size()), std::vector<std::vector<double>>(order.size())};
  std::vector<double> now(order.size(), 0.0);
  std::vector<std::set<ActionKey>> split(order.size());  // backwards whose W is separate
  for (size_t r = 0; r < order.size(); ++r) split[r] = split_backwards(order[r]);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      const std::vector<Action>& o = order[static_cast<size_t>(r)];
      std::vector<double>& e = t.end[static_cast<size_t>(r)];
      while (e.size() < o.size()) {
        const Action& a = o[e.size()];
        double ready = now[static_cast<size_t>(r)];
        if (reads_a_transfer(a, r, pp, vpp)) {  // wait for the neighbour's computation that feeds a
          const auto [from, key] = producer_of(a, r, pp);
          const auto& d = done[static_cast<size_t>(from)];
          const auto it = d.find(key);
          if (it == d.end()) break;  // not computed yet
          ready = std::max(ready, it->second);
        }
        const double cost = unit_cost(a, split[static_cast<size_t>(r)]);
        now[static_cast<size_t>(r)] = ready + cost;
        done[static_cast<size_t>(r)][key_of(a)] = ready + cost;
        t.start[static_cast<size_t>(r)].push_back(ready);
        e.push_back(ready + cost);
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < order.size(); ++r)
    TESSERA_CHECK(t.end[r].size() == order[r].size(), "pipeline_schedule: rank ", r, "'s computations wait for ",
                  "each other before ", to_string(order[r][t.end[r].size()]), " (a generator bug)");
  return t;
}

// model.recompute = "bubble": where each R(m, c) goes in the ranks' computations (pipeline_schedule.h).
// The ranks' orders are walked together in the ideal timeline (unit costs, free transfers, as
// ideal_timeline), each rank deciding as it reaches its next computation X, once X's input is
// computed (so the time X's input arrives, `ready`, is known and final):
// - ahead >= 2: while the rank would wait before X (now + an R's cost <= ready), fewer than
//   `ahead` recomputed contexts are held, and the next backward without its R (backwards get their
//   R in their own order) has had its forward, that R runs now, in the wait;
// - X a backward whose R has not run: its R runs right before it (ahead = 1: every R; the
//   gradient's receive is posted before R, so R fills the wait for the gradient, add_transfers).
// An R placed in a wait ends no later than X could start, so it delays nothing in that timeline;
// every R moved out from before its backward makes the rank's later computations earlier or equal.
struct RankPlacement {
  std::vector<Action> plain;      // the rank's computations without R
  std::vector<Action> backwards;  // its backwards, in order: their R's go in this order
  std::set<ActionKey> split;      // backwards whose W is separate
  std::set<ActionKey> forwarded;  // forwards run so far
  std::vector<Action> out;        // the computations with R
  size_t next = 0;                // plain[next]: the next computation
  size_t next_r = 0;              // backwards[next_r]: the next backward whose R has not run
  int64_t held = 0;               // R run, its backward not yet
  double now = 0;
};

// A computation's duration in the placement's timeline: the unit one, or costs.duration's.
double placement_cost(const PlacementCosts& costs, int64_t r, const Action& a, const std::set<ActionKey>& split) {
  if (!costs.duration) return unit_cost(a, split);
  return costs.duration(r, a, split.count(key_of(a)) > 0);
}

// The next backward's R (the rank's next R to place).
Action next_recompute(const RankPlacement& p) {
  const Action& b = p.backwards[p.next_r];
  return recompute_action(b.micro_batch, b.chunk);
}

void place_next_recompute(RankPlacement& p, int64_t r, const PlacementCosts& costs) {
  const Action R = next_recompute(p);
  ++p.next_r;
  p.out.push_back(R);
  p.now += placement_cost(costs, r, R, p.split);
  ++p.held;
}

bool can_recompute_ahead(const RankPlacement& p, int64_t ahead) {
  if (p.next_r >= p.backwards.size() || p.held >= ahead) return false;
  const Action& b = p.backwards[p.next_r];
  return p.forwarded.count(key_of(forward_action(b.micro_batch, b.chunk))) > 0;
}

std::vector<std::vector<Action>> with_recompute(const std::vector<std::vector<Action>>& order, int64_t vpp,
                                                int64_t ahead, const PlacementCosts& costs) {
  const int64_t pp = static_cast<int64_t>(order.size());
  std::vector<RankPlacement> ranks(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    ranks[r].plain = order[r];
    ranks[r].split = split_backwards(order[r]);
    for (const Action& a : order[r])
      if (a.kind == ActionKind::Backward) ranks[r].backwards.push_back(a);
  }
  std::vector<std::map<ActionKey, double>> done(order.size());  // rank -> computation -> end
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      RankPlacement& p = ranks[static_cast<size_t>(r)];
      while (p.next < p.plain.size()) {
        const Action a = p.plain[p.next];
        double ready = p.now;
        if (reads_a_transfer(a, r, pp, vpp)) {
          const auto [from, key] = producer_of(a, r, pp);
          const auto it = done[static_cast<size_t>(from)].find(key);
          if (it == done[static_cast<size_t>(from)].end()) break;  // not computed yet
          ready = std::max(ready, it->second + costs.latency);
        }
        if (ahead >= 2)
          while (can_recompute_ahead(p, ahead) && p.now + placement_cost(costs, r, next_recompute(p), p.split) <= ready)
            place_next_recompute(p, r, costs);
        if (a.kind == ActionKind::Backward && p.next_r < p.backwards.size() &&
            key_of(p.backwards[p.next_r]) == key_of(a))
          place_next_recompute(p, r, costs);
        p.now = std::max(p.now, ready) + placement_cost(costs, r, a, p.split);
        done[static_cast<size_t>(r)][key_of(a)] = p.now;
        if (a.kind == ActionKind::Forward) p.forwarded.insert(key_of(a));
        if (a.kind == ActionKind::Backward) --p.held;
        p.out.push_back(a);
        ++p.next;
        progress = true;
      }
    }
  }
  std::vector<std::vector<Action>> out(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    TESSERA_CHECK(ranks[r].next == order[r].size(), "pipeline_schedule: rank ", r, "'s computations wait for ",
                  "each other before ", to_string(order[r][ranks[r].next]), " (a generator bug)");
    out[r] = std::move(ranks[r].out);
  }
  return out;
}

// Puts each send right after the computation that produces its tensor, and each receive as late as
// possible before the computation that reads it, but, in the ideal timeline, no later than the
// sender could wait for the send: the start of the sender's next computation that reads a received
// tensor (the executor waits on a batch before that). So a rank never waits for a tensor it does
// not need yet (a batch's receives are read right after it, whatever the costs), and a sender does
// not wait for a receiver that is still busy (which, with interleaving, would chain the ranks into
// a circle). A send and the receives posted after it with no computation between form one batch
// for the executor (Megatron's send_forward_recv_backward and its kin). Two ranks' messages match
// in posting order (NCCL has no tags; with pp = 2 and interleaving, activations and gradients share
// one pair of ranks), so a receiver posts its receives from one sender in that sender's order (a
// receive moves earlier when a later one must).
Schedule add_transfers(const std::vector<std::vector<Action>>& order, int64_t vpp, int64_t n) {
  const int64_t pp = static_cast<int64_t>(order.size());
  std::vector<std::map<ActionKey, size_t>> index(order.size());  // rank -> computation -> position
  for (size_t r = 0; r < order.size(); ++r)
    for (size_t i = 0; i < order[r].size(); ++i) index[r][key_of(order[r][i])] = i;
  const IdealTimeline ideal = ideal_timeline(order, vpp);

  // before[r][i]: the receives rank r posts before its computation i.
  std::vector<std::vector<std::vector<Action>>> before(order.size());
  for (size_t r = 0; r < order.size(); ++r) before[r].resize(order[r].size() + 1);
  for (int64_t to = 0; to < pp; ++to) {
    const std::vector<double>& to_ends = ideal.end[static_cast<size_t>(to)];
    std::vector<int64_t> senders = {(to + pp - 1) % pp, (to + 1) % pp};
    if (senders[0] == senders[1] || pp == 1) senders.resize(pp == 1 ? 0 : 1);
    for (int64_t from : senders) {
      std::vector<Transfer> in_order;  // from -> to, in the sender's order
      std::vector<double> deadline;    // in the ideal timeline
      const std::vector<Action>& from_order = order[static_cast<size_t>(from)];
      for (size_t i = 0; i < from_order.size(); ++i) {
        std::optional<Transfer> t = transfer_of(from_order[i], from, pp, vpp);
        if (!t || t->to != to) continue;
        in_order.push_back(*t);
        // The sender's batch with this send is waited, at the latest, before its next computation
        // that reads a received tensor.
        size_t next = i + 1;
        while (next < from_order.size() && !reads_a_transfer(from_order[next], from, pp, vpp)) ++next;
        deadline.push_back(next < from_order.size() ? ideal.start[static_cast<size_t>(from)][next]
                                                   : std::numeric_limits<double>::infinity());
      }
      std::vector<size_t> slot(in_order.size());
      for (size_t j = 0; j < in_order.size(); ++j) {
        const auto it = index[static_cast<size_t>(to)].find(key_of(in_order[j].consumer));
        TESSERA_CHECK(it != index[static_cast<size_t>(to)].end(), "pipeline_schedule: rank ", to, " never runs ",
                      to_string(in_order[j].consumer), ", which rank ", from, "'s ", to_string(in_order[j].send),
                      " feeds");
        // A tensor is received before the R's right before its reader, if any: they then run while
        // it travels (bubble recomputation; with recompute_ahead = 1 that is a backward's own R).
        size_t reader = it->second;
        const std::vector<Action>& to_order = order[static_cast<size_t>(to)];
        while (reader > 0 && to_order[reader - 1].kind == ActionKind::Recompute) --reader;
        // The last pause before the reader that comes no later than the deadline (the pause before
        // computation k comes when computation k - 1 ends).
        const auto after = std::upper_bound(to_ends.begin(), to_ends.end(), deadline[j]);
        slot[j] = std::min(static_cast<size_t>(after - to_ends.begin()), reader);
      }
      for (size_t j = in_order.size(); j-- > 1;) slot[j - 1] = std::min(slot[j - 1], slot[j]);
      for (size_t j = 0; j < in_order.size(); ++j)
        before[static_cast<size_t>(to)][slot[j]].push_back(in_order[j].recv);
    }
  }

  Schedule s{n, std::vector<std::vector<Action>>(order.size()), vpp};
  for (size_t r = 0; r < order.size(); ++r) {
    std::vector<Action>& out = s.stages[r];
    for (size_t i = 0; i < order[r].size(); ++i) {
      out.insert(out.end(), before[r][i].begin(), before[r][i].end());
      out.push_back(order[r][i]);
      const std::optional<Transfer> t = transfer_of(order[r][i], static_cast<int64_t>(r), pp, vpp);
      if (t) out.push_back(t->send);
    }
  }
  return s;
}

}  // namespace

std::string_view pipeline_kind_name(PipelineKind kind) {
  switch (kind) {
    case PipelineKind::GPipe: return "gpipe";
    case PipelineKind::OneFOneB: return "1f1b";
    case PipelineKind::Interleaved: return "interleaved";
    case PipelineKind::ZeroBubbleH1: return "zb-h1";
  }
  return "?";
}

PipelineKind parse_pipeline_kind(std::string_view name) {
  for (PipelineKind k : {PipelineKind::GPipe, PipelineKind::OneFOneB, PipelineKind::Interleaved,
                         PipelineKind::ZeroBubbleH1})
    if (name == pipeline_kind_name(k)) return k;
  detail::fail("parallel.pp_schedule = \"", name, "\" is not a pipeline schedule; expected \"gpipe\", \"1f1b\", ",
               "\"interleaved\" or \"zb-h1\"");
}

void check_pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind) {
  TESSERA_CHECK(pp >= 1, "parallel.pp = ", pp, ": at least 1 pipeline stage");
  TESSERA_CHECK(vpp >= 1, "parallel.vpp = ", vpp, ": at least 1 model chunk per pipeline rank");
  TESSERA_CHECK(micro_batches >= 1, "a pipeline step needs at least 1 micro-batch; got ",
                micro_batches_text(micro_batches));
  if (kind != PipelineKind::Interleaved) {
    TESSERA_CHECK(vpp == 1, "parallel.vpp = ", vpp, " model chunks per rank needs parallel.pp_schedule = ",
                  "\"interleaved\"; ", kind_text(kind), " runs one chunk per rank (parallel.vpp = 1)");
  } else {
    TESSERA_CHECK(pp >= 2, kind_text(kind), " needs parallel.pp >= 2 pipeline stages; got parallel.pp = ", pp);
    TESSERA_CHECK(vpp >= 2, kind_text(kind), " needs parallel.vpp >= 2 model chunks per rank; got parallel.vpp = ",
                  vpp, " (with one chunk per rank, use \"1f1b\")");
    TESSERA_CHECK(micro_batches % pp == 0, kind_text(kind), " runs micro-batches in groups of parallel.pp = ", pp,
                  " (as Megatron-LM's interleaved schedule), so it needs a multiple of ", pp, "; got ",
                  micro_batches_text(micro_batches));
  }
  if (kind == PipelineKind::OneFOneB || kind == PipelineKind::ZeroBubbleH1)
    TESSERA_CHECK(micro_batches >= pp, kind_text(kind), " needs at least parallel.pp = ", pp,
                  " micro-batches per step (fewer never reach its steady phase); got ",
                  micro_batches_text(micro_batches),
                  "; raise train.global_batch or lower train.micro_batch, or use parallel.pp_schedule = \"gpipe\"");
}

Schedule pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind, bool bubble_recompute,
                           int64_t recompute_ahead) {
  return pipeline_schedule(pp, vpp, micro_batches, kind, bubble_recompute, recompute_ahead, PlacementCosts{});
}

Schedule pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind, bool bubble_recompute,
                           int64_t recompute_ahead, const PlacementCosts& costs) {
  TESSERA_CHECK(costs.latency >= 0, "pipeline_schedule: a negative latency ", costs.latency);
  check_pipeline_schedule(pp, vpp, micro_batches, kind);
  TESSERA_CHECK(recompute_ahead >= 1, "model.recompute_ahead = ", recompute_ahead,
                ": at least 1 recomputed micro-batch held at once (1: R right before its backward)");
  std::vector<std::vector<Action>> order(static_cast<size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    std::vector<Action>& o = order[static_cast<size_t>(r)];
    switch (kind) {
      case PipelineKind::GPipe: o = gpipe_order(micro_batches); break;
      case PipelineKind::OneFOneB: o = one_f_one_b_order(pp, r, micro_batches); break;
      case PipelineKind::Interleaved: o = interleaved_order(pp, vpp, r, micro_batches); break;
      case PipelineKind::ZeroBubbleH1: o = zb_h1_order(pp, r, micro_batches); break;
    }
  }
  if (bubble_recompute) order = with_recompute(order, vpp, recompute_ahead, costs);
  return add_transfers(order, vpp, micro_batches);
}

}  // namespace tessera
