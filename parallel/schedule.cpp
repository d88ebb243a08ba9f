// The one-stage schedule and the executor (checks each action against those run before it).
#include "parallel/schedule.h"

#include <set>
#include <utility>

#include "kernels/check.h"

namespace tessera {

std::string to_string(const Action& a) {
  return (a.kind == ActionKind::Forward ? "F" : "B") + std::to_string(a.micro_batch);
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) s += (s.empty() ? "" : " ") + to_string(a);
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

void run_schedule(const std::vector<Action>& actions, const StepCallbacks& callbacks) {
  size_t last_backward = actions.size();
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == ActionKind::Backward) last_backward = i;
  std::set<int64_t> forwarded, backwarded;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int64_t m = a.micro_batch;
    if (a.kind == ActionKind::Forward) {
      TESSERA_CHECK(forwarded.insert(m).second, "run_schedule: action ", i, " (", to_string(a),
                    ") repeats micro-batch ", m, "'s forward");
      callbacks.forward(m);
    } else {
      TESSERA_CHECK(forwarded.count(m), "run_schedule: action ", i, " (", to_string(a), ") comes before micro-batch ",
                    m, "'s forward");
      TESSERA_CHECK(backwarded.insert(m).second, "run_schedule: action ", i, " (", to_string(a),
                    ") repeats micro-batch ", m, "'s backward");
      callbacks.backward(m, i == last_backward);
    }
  }
}

}  // namespace tessera
