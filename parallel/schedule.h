// A step's schedule as data: per rank (pipeline stage), the list of actions it runs in order, and
// one executor that runs any schedule through model-agnostic callbacks (parallel/ knows no model:
// the trainer's callbacks run the forward or backward of micro-batch m). Today's gradient
// accumulation is the one-stage schedule F0 B0 F1 B1 ...; the pipeline schedules (GPipe, 1F1B,
// interleaved) add their generators and Send/Recv actions here, without touching the trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

enum class ActionKind : uint8_t { Forward, Backward };

// One step of a rank's schedule: run the forward or backward of micro-batch m (0-based).
struct Action {
  ActionKind kind = ActionKind::Forward;
  int64_t micro_batch = 0;
  bool operator==(const Action&) const = default;
};
inline Action forward_action(int64_t m) { return {ActionKind::Forward, m}; }
inline Action backward_action(int64_t m) { return {ActionKind::Backward, m}; }

// "F3", "B0".
std::string to_string(const Action& a);
// "F0 B0 F1 B1".
std::string to_string(const std::vector<Action>& actions);

// Every stage's actions for one optimizer step of `micro_batches` micro-batches.
struct Schedule {
  int64_t micro_batches = 0;
  std::vector<std::vector<Action>> stages;  // stages[s]: pipeline stage s's actions, in order
  int64_t num_stages() const { return static_cast<int64_t>(stages.size()); }
  const std::vector<Action>& actions_of(int64_t stage) const;
};

// Gradient accumulation on a single stage: each micro-batch's forward, then its backward, so only
// one micro-batch's activations are alive at a time: F0 B0 F1 B1 ... F(n-1) B(n-1).
Schedule one_stage_schedule(int64_t micro_batches);

// What a rank does for each action; the executor knows nothing else of the model.
struct StepCallbacks {
  std::function<void(int64_t m)> forward;
  // last: this is the rank's last backward of the step, the one whose gradients are final (its
  // hook starts the data-parallel buckets); false for every earlier one.
  std::function<void(int64_t m, bool last)> backward;
};

// Runs `actions` in order through the callbacks. Throws tessera::Error naming the action (before
// running it) when a micro-batch's backward comes before its forward, or an action repeats.
void run_schedule(const std::vector<Action>& actions, const StepCallbacks& callbacks);

}  // namespace tessera
