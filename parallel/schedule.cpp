// The one-stage schedule and the executor: it checks each action against those run before it,
// hands each run of adjacent Send/Recv actions to the p2p callback as one batch, and waits on a
// batch only when an action needs what it received (or at the end of the step).
#include "parallel/schedule.h"

#include <map>
#include <set>
#include <utility>

#include "kernels/check.h"

namespace tessera {

bool is_p2p(const Action& a) {
  return a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvActivation ||
         a.kind == ActionKind::SendGrad || a.kind == ActionKind::RecvGrad;
}

bool is_send(const Action& a) { return a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad; }

int64_t peer_of(const Action& a, int64_t rank, int64_t pp) {
  TESSERA_CHECK(is_p2p(a), "peer_of: ", to_string(a), " is not a send or receive");
  TESSERA_CHECK(pp >= 1 && rank >= 0 && rank < pp, "peer_of: rank ", rank, " of ", pp, " pipeline ranks");
  const bool to_next = a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvGrad;
  return (rank + (to_next ? 1 : pp - 1)) % pp;
}

Action receive_of(const Action& send, int64_t rank, int64_t pp) {
  TESSERA_CHECK(is_send(send), "receive_of: ", to_string(send), " is not a send");
  if (send.kind == ActionKind::SendActivation)
    return recv_activation(send.micro_batch, rank == pp - 1 ? send.chunk + 1 : send.chunk);
  return recv_grad(send.micro_batch, rank == 0 ? send.chunk - 1 : send.chunk);
}

std::string to_string(const Action& a) {
  const char* name = "";
  switch (a.kind) {
    case ActionKind::Forward: name = "F"; break;
    case ActionKind::Backward: name = "B"; break;
    case ActionKind::BackwardWeight: name = "W"; break;
    case ActionKind::Recompute: name = "R"; break;
    case ActionKind::SendActivation: name = "sendA"; break;
    case ActionKind::RecvActivation: name = "recvA"; break;
    case ActionKind::SendGrad: name = "sendG"; break;
    case ActionKind::RecvGrad: name = "recvG"; break;
  }
  std::string s = name;
  s += std::to_string(a.micro_batch);
  if (a.chunk != 0) s.append("c").append(std::to_string(a.chunk));
  return s;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += to_string(a);
  }
  return s;
}

const std::vector<Action>& Schedule::actions_of(int64_t stage) const {
  TESSERA_CHECK(stage >= 0 && stage < num_stages(), "Schedule: stage ", stage, " of a schedule of ", num_stages(),
                " stages");
  return stages[static_cast<size_t>(stage)];
}

Schedule one_stage_schedule(int64_t micro_batches) {
  TESSERA_CHECK(micro_batches >= 1, "one_stage_schedule: ", micro_batches, " micro-batches (at least 1)");
  Schedule s{micro_batches, {{}}};
  for (int64_t m = 0; m < micro_batches; ++m) {
    s.stages[0].push_back(forward_action(m));
    s.stages[0].push_back(backward_action(m));
  }
  return s;
}

namespace {

using Key = std::pair<int64_t, int64_t>;  // (micro-batch, chunk)

Key key_of(const Action& a) { return {a.micro_batch, a.chunk}; }

// "micro-batch 3", or "micro-batch 3 (chunk 1)" on a chunk other than 0.
std::string name_of(const Key& k) {
  return "micro-batch " + std::to_string(k.first) + (k.second != 0 ? " (chunk " + std::to_string(k.second) + ")" : "");
}

// The executor's state for one run: what has run, which batch received what, and the batches'
// handles (waited when something reads what they received, the rest when the step ends).
class Executor {
 public:
  Executor(const std::vector<Action>& actions, const PipelineCallbacks& cb) : actions_(actions), cb_(cb) {
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      if (a.kind == ActionKind::BackwardWeight) split_.insert(key_of(a));
      if (a.kind == ActionKind::RecvActivation) received_activations_.insert(key_of(a));
      if (a.kind == ActionKind::RecvGrad) received_grads_.insert(key_of(a));
    }
    // A chunk's last gradient-writing action: its last W, or its last B when that one is whole.
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      if (a.kind == ActionKind::BackwardWeight || (a.kind == ActionKind::Backward && !split_.count(key_of(a))))
        last_of_chunk_[a.chunk] = i;
    }
  }

  void run() {
    for (size_t i = 0; i < actions_.size();) {
      if (is_p2p(actions_[i])) {
        size_t end = i;
        while (end < actions_.size() && is_p2p(actions_[end])) ++end;
        start_batch(i, end);
        i = end;
      } else {
        compute(i);
        ++i;
      }
    }
    for (CommHandle& h : handles_) wait(h);
  }

 private:
  [[noreturn]] void refuse(size_t i, const std::string& why) const {
    detail::fail("run_schedule: action ", i, " (", to_string(actions_[i]), ") ", why);
  }

  void wait(CommHandle& h) const {
    if (cb_.exec)
      h.wait_on(*cb_.exec);
    else
      h.wait();
  }

  // Waits for the batch that received k's tensor, if one did: the action reading it comes next.
  void wait_for(const std::map<Key, size_t>& batch_of, const Key& k) {
    auto it = batch_of.find(k);
    if (it != batch_of.end()) wait(handles_[it->second]);
  }

  void start_batch(size_t begin, size_t end) {
    std::vector<Action> batch(actions_.begin() + static_cast<std::ptrdiff_t>(begin),
                              actions_.begin() + static_cast<std::ptrdiff_t>(end));
    for (size_t i = begin; i < end; ++i) {
      const Action& a = actions_[i];
      const Key k = key_of(a);
      switch (a.kind) {
        case ActionKind::SendActivation:
          if (!forwarded_.count(k)) refuse(i, "comes before " + name_of(k) + "'s forward");
          if (!sent_activations_.insert(k).second) refuse(i, "repeats " + name_of(k) + "'s activation send");
          break;
        case ActionKind::SendGrad:
          if (!backwarded_.count(k)) refuse(i, "comes before " + name_of(k) + "'s backward");
          if (!sent_grads_.insert(k).second) refuse(i, "repeats " + name_of(k) + "'s gradient send");
          break;
        case ActionKind::RecvActivation:
          if (activation_batch_.count(k)) refuse(i, "repeats " + name_of(k) + "'s activation receive");
          activation_batch_[k] = handles_.size();
          break;
        case ActionKind::RecvGrad:
          if (grad_batch_.count(k)) refuse(i, "repeats " + name_of(k) + "'s gradient receive");
          grad_batch_[k] = handles_.size();
          break;
        default: break;
      }
    }
    if (!cb_.p2p) refuse(begin, "needs a p2p callback");
    handles_.push_back(cb_.p2p(batch));
  }

  void compute(size_t i) {
    const Action& a = actions_[i];
    const Key k = key_of(a);
    const bool last = [&] {
      auto it = last_of_chunk_.find(a.chunk);
      return it != last_of_chunk_.end() && it->second == i;
    }();
    switch (a.kind) {
      case ActionKind::Forward:
        if (forwarded_.count(k)) refuse(i, "repeats " + name_of(k) + "'s forward");
        if (received_activations_.count(k) && !activation_batch_.count(k))
          refuse(i, "comes before the receive of " + name_of(k) + "'s activation");
        if (!cb_.forward) refuse(i, "needs a forward callback");
        wait_for(activation_batch_, k);
        forwarded_.insert(k);
        cb_.forward(a.micro_batch, a.chunk);
        break;
      case ActionKind::Backward:
        if (!forwarded_.count(k)) refuse(i, "comes before " + name_of(k) + "'s forward");
        if (backwarded_.count(k)) refuse(i, "repeats " + name_of(k) + "'s backward");
        if (received_grads_.count(k) && !grad_batch_.count(k))
          refuse(i, "comes before the receive of " + name_of(k) + "'s output gradient");
        if (!cb_.backward) refuse(i, "needs a backward callback");
        wait_for(grad_batch_, k);
        backwarded_.insert(k);
        cb_.backward({a.micro_batch, a.chunk, last, split_.count(k) > 0});
        break;
      case ActionKind::BackwardWeight:
        if (!backwarded_.count(k)) refuse(i, "comes before " + name_of(k) + "'s backward");
        if (!weighted_.insert(k).second) refuse(i, "repeats " + name_of(k) + "'s weight gradient");
        if (!cb_.backward_weight) refuse(i, "needs a backward_weight callback");
        cb_.backward_weight({a.micro_batch, a.chunk, last, false});
        break;
      case ActionKind::Recompute:
        if (!forwarded_.count(k)) refuse(i, "comes before " + name_of(k) + "'s forward");
        if (backwarded_.count(k)) refuse(i, "comes after " + name_of(k) + "'s backward");
        if (!recomputed_.insert(k).second) refuse(i, "repeats " + name_of(k) + "'s recomputation");
        if (!cb_.recompute) refuse(i, "needs a recompute callback");
        cb_.recompute(a.micro_batch, a.chunk);
        break;
      default: break;
    }
  }

  const std::vector<Action>& actions_;
  const PipelineCallbacks& cb_;
  std::set<Key> split_, received_activations_, received_grads_;
  std::map<int64_t, size_t> last_of_chunk_;  // chunk -> index of its last gradient-writing action
  std::set<Key> forwarded_, backwarded_, weighted_, recomputed_, sent_activations_, sent_grads_;
  std::map<Key, size_t> activation_batch_, grad_batch_;  // what a batch received -> its handle
  std::vector<CommHandle> handles_;
};

}  // namespace

void run_schedule(const std::vector<Action>& actions, const PipelineCallbacks& callbacks) {
  Executor(actions, callbacks).run();
}

void run_schedule(const std::vector<Action>& actions, const StepCallbacks& callbacks) {
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    TESSERA_CHECK((a.kind == ActionKind::Forward || a.kind == ActionKind::Backward) && a.chunk == 0,
                  "run_schedule: action ", i, " (", to_string(a),
                  ") needs PipelineCallbacks (StepCallbacks run forwards and backwards of chunk 0 only)");
  }
  PipelineCallbacks cb;
  cb.forward = [&](int64_t m, int64_t) { callbacks.forward(m); };
  cb.backward = [&](const BackwardCall& c) { callbacks.backward(c.micro_batch, c.last); };
  run_schedule(actions, cb);
}

}  // namespace tessera
