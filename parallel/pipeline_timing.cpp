// The pipeline timer: run_schedule with timed callbacks and timed p2p handles.
#include "parallel/pipeline_timing.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "kernels/check.h"
#include "parallel/host_sums.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Adds the time spent in f() to *total.
template <class F>
void timed(double* total, F&& f) {
  const auto t0 = Clock::now();
  f();
  *total += seconds_since(t0);
}

// A p2p batch's handle whose waits add to *wait. The inner handle keeps its watch (the watchdog
// still sees the wait) and completes the op.
class TimedRequest : public CommRequest {
 public:
  TimedRequest(CommHandle inner, double* wait) : inner_(std::move(inner)), wait_(wait) {}
  void wait() override {
    timed(wait_, [&] { inner_.wait(); });
  }
  bool test() override { return inner_.test(); }
  void wait_on(const Exec& ex) override {
    timed(wait_, [&] { inner_.wait_on(ex); });
  }

 private:
  CommHandle inner_;
  double* wait_;
};
}  // namespace

void PipelineTimer::run(const std::vector<Action>& actions, const PipelineCallbacks& callbacks) {
  PipelineStepTimes step;
  step.steps = 1;
  PipelineCallbacks timed_cb = callbacks;
  if (callbacks.forward)
    timed_cb.forward = [&](int64_t m, int64_t c) { timed(&step.busy, [&] { callbacks.forward(m, c); }); };
  if (callbacks.backward)
    timed_cb.backward = [&](const BackwardCall& b) { timed(&step.busy, [&] { callbacks.backward(b); }); };
  if (callbacks.backward_weight)
    timed_cb.backward_weight = [&](const BackwardCall& b) { timed(&step.busy, [&] { callbacks.backward_weight(b); }); };
  if (callbacks.recompute)
    timed_cb.recompute = [&](int64_t m, int64_t c) { timed(&step.busy, [&] { callbacks.recompute(m, c); }); };
  if (callbacks.p2p)
    timed_cb.p2p = [&](const std::vector<Action>& batch) {
      return CommHandle(std::make_unique<TimedRequest>(callbacks.p2p(batch), &step.wait));
    };
  timed(&step.window, [&] { run_schedule(actions, timed_cb); });
  totals_.window += step.window;
  totals_.busy += step.busy;
  totals_.wait += step.wait;
  totals_.steps += 1;
}

PipelineStepTimes PipelineTimer::take() { return std::exchange(totals_, PipelineStepTimes{}); }

PipelineBubble reduce_pipeline_times(const PipelineStepTimes& mine, Communicator* pp) {
  const int64_t n = pp ? pp->size() : 1, rank = pp ? pp->rank() : 0;
  // Every rank's four numbers in its own slots, the rest zero: the sum is a gather.
  constexpr int64_t kFields = 4;
  std::vector<double> all(static_cast<size_t>(kFields * n), 0.0);
  double* slot = all.data() + kFields * rank;
  slot[0] = mine.window;
  slot[1] = mine.busy;
  slot[2] = mine.wait;
  slot[3] = static_cast<double>(mine.steps);
  sum_over_group(all, pp);
  PipelineBubble r;
  const double steps = all[3];
  for (int64_t q = 1; q < n; ++q)
    TESSERA_CHECK(all[static_cast<size_t>(kFields * q + 3)] == steps, "pipeline timing: pipeline rank ", q, " timed ",
                  all[static_cast<size_t>(kFields * q + 3)], " steps, rank 0 ", steps, "; every rank times the same steps");
  if (steps <= 0) {
    r.busy.assign(static_cast<size_t>(n), 0.0);
    r.wait = r.idle = r.busy;
    return r;
  }
  double busy_sum = 0;
  for (int64_t q = 0; q < n; ++q) {
    const double* s = all.data() + kFields * q;
    r.makespan = std::max(r.makespan, s[0] / steps);
    r.busy.push_back(s[1] / steps);
    r.wait.push_back(s[2] / steps);
    busy_sum += s[1] / steps;
  }
  for (double b : r.busy) r.idle.push_back(r.makespan - b);
  r.bubble_fraction = r.makespan > 0 ? 1.0 - busy_sum / (static_cast<double>(n) * r.makespan) : 0.0;
  return r;
}

}  // namespace tessera
