// Sampler: a keyed Feistel network over a power-of-four domain with cycle-walking gives a
// bijection of [0, N) in O(1) memory; Philox is the round function.
#include "data/sampler.h"

#include "kernels/check.h"
#include "kernels/philox.h"

namespace tessera {

namespace {
constexpr int kRounds = 6;

// One bijection of [0, 4^half_bits) for a given (seed, epoch).
uint64_t feistel(uint64_t x, int half_bits, uint64_t seed, uint64_t epoch) {
  const uint64_t mask = (uint64_t(1) << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  const philox::Key key = {static_cast<uint32_t>(seed ^ (epoch * 0x9E3779B97F4A7C15ull)),
                           static_cast<uint32_t>((seed >> 32) ^ epoch)};
  for (uint32_t round = 0; round < kRounds; ++round) {
    const auto r = philox::philox4x32_10(
        {static_cast<uint32_t>(right), static_cast<uint32_t>(right >> 32), round, 0x5a3b1e0du}, key);
    const uint64_t f = ((static_cast<uint64_t>(r[1]) << 32) | r[0]) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}
}  // namespace

Sampler::Sampler(int64_t num_samples, uint64_t seed, bool shuffle) : n_(num_samples), seed_(seed), shuffle_(shuffle) {
  TESSERA_CHECK(num_samples > 0, "the sampler needs at least one sample");
  half_bits_ = 1;
  while ((uint64_t(1) << (2 * half_bits_)) < static_cast<uint64_t>(num_samples)) ++half_bits_;
}

int64_t Sampler::sample_at(int64_t q) const {
  TESSERA_CHECK(q >= 0, "negative sample position ", q);
  const int64_t i = q % n_;
  if (!shuffle_) return i;
  const uint64_t epoch = static_cast<uint64_t>(q / n_);
  uint64_t x = static_cast<uint64_t>(i);
  do {  // cycle-walk: the domain is < 4N, so on average fewer than 4 passes
    x = feistel(x, half_bits_, seed_, epoch);
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

void validate(const BatchLayout& l) {
  TESSERA_CHECK(l.global_batch > 0 && l.micro_batch > 0 && l.dp_size > 0, "batch sizes must be positive");
  TESSERA_CHECK(l.global_batch % (l.micro_batch * l.dp_size) == 0, "train.global_batch = ", l.global_batch,
                " is not a multiple of train.micro_batch x data-parallel size = ", l.micro_batch, " x ", l.dp_size);
  TESSERA_CHECK(l.dp_rank >= 0 && l.dp_rank < l.dp_size, "data-parallel rank ", l.dp_rank, " outside [0, ",
                l.dp_size, ")");
}

std::vector<int64_t> Sampler::micro_batch(int64_t step_start, int64_t micro, const BatchLayout& l) const {
  const int64_t share = l.global_batch / l.dp_size;
  const int64_t first = step_start + l.dp_rank * share + micro * l.micro_batch;
  std::vector<int64_t> out(static_cast<size_t>(l.micro_batch));
  for (int64_t r = 0; r < l.micro_batch; ++r) out[r] = sample_at(first + r);
  return out;
}

}  // namespace tessera
