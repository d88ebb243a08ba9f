// Profiler: exclusive wall time per op family via a stack of open scopes, and its table.
#include "kernels/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "kernels/check.h"

namespace tessera {

const char* op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::Matmul: return "matmul";
    case OpFamily::Attention: return "attention";
    case OpFamily::Norm: return "norm";
    case OpFamily::Activation: return "gelu/swiglu";
    case OpFamily::Rope: return "rope";
    case OpFamily::Embedding: return "embedding";
    case OpFamily::CrossEntropy: return "cross_entropy";
    case OpFamily::Elementwise: return "elementwise";
    case OpFamily::AdamW: return "adamw";
    case OpFamily::Communication: return "communication";
    case OpFamily::Other: return "other";
  }
  return "?";
}

double Profiler::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Profiler::add(OpFamily f, double seconds, int64_t calls) {
  Entry& e = entries_[static_cast<int>(f)];
  e.seconds += seconds;
  e.calls += calls;
}

void Profiler::open(OpFamily f) {
  if (fence_) fence_();  // what was queued before this scope is charged to the scopes around it
  stack_.push_back({f, clock_(), 0.0});
}

void Profiler::close() {
  TESSERA_CHECK(!stack_.empty(), "Profiler::close() without a matching open()");
  if (fence_) fence_();  // the work this scope queued
  const double elapsed = clock_() - stack_.back().start;
  const Open top = stack_.back();
  stack_.pop_back();
  add(top.family, elapsed - top.child_seconds);  // self time: nested scopes charged their own
  if (!stack_.empty()) stack_.back().child_seconds += elapsed;
}

void Profiler::reset() {
  TESSERA_CHECK(stack_.empty(), "Profiler::reset() with ", stack_.size(), " scope(s) still open");
  entries_ = {};
  steps_ = 0;
  hidden_seconds_ = 0;
  hidden_calls_ = 0;
}

double Profiler::total_seconds() const {
  double s = 0;
  for (const Entry& e : entries_) s += e.seconds;
  return s;
}

int64_t Profiler::total_calls() const {
  int64_t n = 0;
  for (const Entry& e : entries_) n += e.calls;
  return n;
}

std::string Profiler::table() const {
  std::vector<int> rows;
  for (int i = 0; i < kOpFamilyCount; ++i)
    if (entries_[i].calls > 0) rows.push_back(i);
  // Slowest first; equal times keep the enum order.
  std::stable_sort(rows.begin(), rows.end(), [&](int a, int b) { return entries_[a].seconds > entries_[b].seconds; });

  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  const double total = total_seconds();
  std::string out;
  char line[128];
  auto row = [&](const char* name, double seconds, int64_t calls) {
    const double pct = total > 0 ? 100.0 * seconds / total : 0.0;
    std::snprintf(line, sizeof line, "%-14s %10.2f %6.1f%% %12.1f\n", name, 1e3 * seconds / steps, pct,
                  static_cast<double>(calls) / steps);
    out += line;
  };
  std::snprintf(line, sizeof line, "%-14s %10s %7s %12s\n", "op family", "ms/step", "%", "calls/step");
  out += line;
  for (int i : rows) row(op_family_name(static_cast<OpFamily>(i)), entries_[i].seconds, entries_[i].calls);
  row("total", total, total_calls());
  if (hidden_calls_ > 0) row("comm hidden", hidden_seconds_, hidden_calls_);
  return out;
}

}  // namespace tessera
