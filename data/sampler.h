// Which samples each data-parallel rank reads at each step: a deterministic, shuffled, sharded
// order with no state beyond one counter. Global sample position q (counted from the start of
// training) is sample perm_e(q mod N) of epoch e = q / N, where perm_e is a pseudo-random
// bijection of [0, N) keyed by (seed, e). Step s reads positions [s G, (s + 1) G) of a global
// batch G; rank r of dp takes the contiguous share [r G/dp, (r + 1) G/dp), and its micro-batch m
// the rows [m mb, (m + 1) mb) of that share. So ranks never overlap, leave no gap, and a resumed
// run needs only the number of samples consumed.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

struct BatchLayout {
  int64_t global_batch = 1;  // sequences per optimizer step, all ranks together
  int64_t micro_batch = 1;   // sequences per forward on one rank
  int64_t dp_size = 1;
  int64_t dp_rank = 0;
  int64_t micro_batches() const { return global_batch / (micro_batch * dp_size); }
};

class Sampler {
 public:
  // shuffle = false reads samples in order (epoch after epoch).
  Sampler(int64_t num_samples, uint64_t seed, bool shuffle = true);

  int64_t num_samples() const { return n_; }
  // The dataset index at global position q, and its epoch.
  int64_t sample_at(int64_t q) const;
  int64_t epoch_of(int64_t q) const { return q / n_; }

  // Dataset indices of micro-batch `micro` of this rank, in the step that starts at global
  // position `step_start` (= samples consumed before the step).
  std::vector<int64_t> micro_batch(int64_t step_start, int64_t micro, const BatchLayout& layout) const;

 private:
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  int half_bits_;  // the Feistel network permutes [0, 4^half_bits) >= n, cycle-walking into [0, n)
};

// Checks that layout divides: global_batch = micro_batch x dp_size x k; error names the numbers.
void validate(const BatchLayout& layout);

}  // namespace tessera
