// A step's schedule as data: per rank (pipeline stage), the list of actions it runs in order, and
// one executor that runs any schedule through model-agnostic callbacks (parallel/ knows no model:
// the trainer's callbacks run the forward or backward of micro-batch m on one of its model chunks,
// and move activations and their gradients to and from the neighbouring stages). Gradient
// accumulation is the one-stage schedule F0 B0 F1 B1 ...; the pipeline schedules (GPipe, 1F1B,
// interleaved, ZB-H1) are generated in parallel/pipeline_schedule.h, and nothing in the executor
// knows which one runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/exec.h"
#include "parallel/communicator.h"

namespace tessera {

// Forward / Backward / BackwardWeight run a model chunk on a micro-batch; the other four move a
// tensor between neighbouring pipeline ranks: an activation goes to the next rank (rank + 1, the
// last rank's to rank 0 with interleaving), its gradient to the previous one.
enum class ActionKind : uint8_t {
  Forward,
  Backward,        // the whole backward; under zero-bubble only the input gradient ("B") when the
                   // schedule also has the chunk's BackwardWeight for this micro-batch
  BackwardWeight,  // the weight gradient ("W") of a backward split in two (zb-h1 only)
  Recompute,       // "R": re-run the forward of a chunk that recomputes fully, keeping what it
                   // computes until the micro-batch's Backward (model.recompute = "bubble": the
                   // schedule puts it where the rank would wait; that Backward then recomputes nothing)
  SendActivation,  // the output of Forward(m, chunk), to the next rank
  RecvActivation,  // the input of Forward(m, chunk), from the previous rank
  SendGrad,        // the input gradient of Backward(m, chunk), to the previous rank
  RecvGrad,        // the output gradient Backward(m, chunk) needs, from the next rank
};

// One step of a rank's schedule, for micro-batch m (0-based) of the step and model chunk `chunk`
// of this rank (0 .. vpp - 1; chunk c of rank r is virtual stage c x pp + r, Megatron-LM's
// interleaved layout). A Send/Recv names the micro-batch and chunk of this rank that produced or
// will consume the tensor, so the executor's callbacks can find the buffer.
struct Action {
  ActionKind kind = ActionKind::Forward;
  int64_t micro_batch = 0;
  int64_t chunk = 0;
  bool operator==(const Action&) const = default;
};
inline Action forward_action(int64_t m, int64_t chunk = 0) { return {ActionKind::Forward, m, chunk}; }
inline Action backward_action(int64_t m, int64_t chunk = 0) { return {ActionKind::Backward, m, chunk}; }
inline Action weight_action(int64_t m, int64_t chunk = 0) { return {ActionKind::BackwardWeight, m, chunk}; }
inline Action recompute_action(int64_t m, int64_t chunk = 0) { return {ActionKind::Recompute, m, chunk}; }
inline Action send_activation(int64_t m, int64_t chunk = 0) { return {ActionKind::SendActivation, m, chunk}; }
inline Action recv_activation(int64_t m, int64_t chunk = 0) { return {ActionKind::RecvActivation, m, chunk}; }
inline Action send_grad(int64_t m, int64_t chunk = 0) { return {ActionKind::SendGrad, m, chunk}; }
inline Action recv_grad(int64_t m, int64_t chunk = 0) { return {ActionKind::RecvGrad, m, chunk}; }

// A Send or Recv (point-to-point) action.
bool is_p2p(const Action& a);
bool is_send(const Action& a);
// The pipeline rank a Send/Recv of rank `rank` talks to: the next rank for activations sent and
// gradients received, the previous one otherwise (wrapping around: with interleaving the last
// rank's chunk c feeds rank 0's chunk c + 1).
int64_t peer_of(const Action& a, int64_t rank, int64_t pp);
// The receive on peer_of(send, rank, pp) that matches `send` of rank `rank`: the same micro-batch,
// on the chunk there that reads the tensor (the next chunk when an activation wraps from the last
// rank to rank 0, the previous one when a gradient wraps back).
Action receive_of(const Action& send, int64_t rank, int64_t pp);

// "F3", "B0", "W2", "R1", "sendA3", "recvG0"; a chunk other than 0 follows as "F3c1".
std::string to_string(const Action& a);
// "F0 B0 F1 B1".
std::string to_string(const std::vector<Action>& actions);

// Every stage's actions for one optimizer step of `micro_batches` micro-batches.
struct Schedule {
  int64_t micro_batches = 0;
  std::vector<std::vector<Action>> stages;  // stages[s]: pipeline rank s's actions, in order
  int64_t vpp = 1;                          // model chunks per rank (virtual pipeline stages)
  int64_t num_stages() const { return static_cast<int64_t>(stages.size()); }
  const std::vector<Action>& actions_of(int64_t stage) const;
};

// Gradient accumulation on a single stage: each micro-batch's forward, then its backward, so only
// one micro-batch's activations are alive at a time: F0 B0 F1 B1 ... F(n-1) B(n-1).
Schedule one_stage_schedule(int64_t micro_batches);

// What the executor tells a backward or weight-gradient callback besides the micro-batch and chunk.
struct BackwardCall {
  int64_t micro_batch = 0;
  int64_t chunk = 0;
  // The chunk's weight gradients on this rank are final after this call (no later backward or
  // weight action of this chunk follows): its hook starts the data-parallel buckets. Per chunk, so
  // an interleaved rank reduces chunk 1's gradients while chunk 0 still runs backward.
  bool last = false;
  // Backward only: compute the input gradient alone; the schedule's BackwardWeight(m, chunk)
  // computes the weight gradient later (zb-h1). False: the whole backward now.
  bool input_only = false;
};

// What a rank does for each action; the executor knows nothing else of the model or the wire.
struct PipelineCallbacks {
  std::function<void(int64_t m, int64_t chunk)> forward;
  std::function<void(const BackwardCall&)> backward;
  std::function<void(const BackwardCall&)> backward_weight;  // needed only by schedules with W
  // Recompute(m, chunk): re-runs the forward of micro-batch m on the chunk (reading nothing
  // received: the executor does not wait for the output gradient first). Needed only by schedules
  // with R (model.recompute = "bubble").
  std::function<void(int64_t m, int64_t chunk)> recompute;
  // Starts a run of adjacent Send/Recv actions as one batch (Communicator::batch_send_recv_async,
  // so that a send and a receive with the same neighbour cannot wait for each other, as Megatron's
  // send_forward_recv_backward) and returns its handle. The executor waits on it before the first
  // action that reads a tensor it receives, and at the end of run_schedule; so a tensor sent must
  // stay alive (and unchanged) until run_schedule returns. Needed only by schedules with Send/Recv.
  std::function<CommHandle(const std::vector<Action>& batch)> p2p;
  // Where handles are waited: with an Exec, CommHandle::wait_on(*exec) (a stream backend then only
  // orders the stream); without, CommHandle::wait() on the host.
  const Exec* exec = nullptr;
};

// Runs `actions` in order through the callbacks, each run of adjacent Send/Recv actions as one p2p
// batch. Throws tessera::Error naming the action (before running it) when a micro-batch's backward
// comes before its forward, a recompute before its forward or after its backward, a weight action
// before its backward, a send before the computation of
// what it sends, a forward or backward before the receive of its input, an action repeats, or the
// callback an action needs is missing.
void run_schedule(const std::vector<Action>& actions, const PipelineCallbacks& callbacks);

// The one-stage form (gradient accumulation without a pipeline): callbacks on micro-batch numbers.
struct StepCallbacks {
  std::function<void(int64_t m)> forward;
  // last: this is the rank's last backward of the step, the one whose gradients are final (its
  // hook starts the data-parallel buckets); false for every earlier one.
  std::function<void(int64_t m, bool last)> backward;
};

// run_schedule for a schedule of Forward and Backward actions on chunk 0 (any other action is
// refused with an Error naming it).
void run_schedule(const std::vector<Action>& actions, const StepCallbacks& callbacks);

}  // namespace tessera
