// make_batch: windows of T + 1 ids split into inputs and next-token targets.
#include "data/dataset.h"

#include <algorithm>

#include "kernels/check.h"

namespace tessera {

namespace {
// Fills b from the samples; false when *cancel was set before a sample was read.
bool fill_batch(const Dataset& ds, const std::vector<int64_t>& indices, const std::atomic<bool>* cancel, Batch& b) {
  b.B = static_cast<int64_t>(indices.size());
  b.T = ds.seq_len();
  b.tokens.resize(static_cast<size_t>(b.B * b.T));
  b.targets.resize(static_cast<size_t>(b.B * b.T));
  std::vector<int32_t> window(static_cast<size_t>(b.T + 1));
  std::vector<uint8_t> mask(static_cast<size_t>(b.T + 1));
  for (int64_t r = 0; r < b.B; ++r) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    TESSERA_CHECK(indices[r] >= 0 && indices[r] < ds.num_samples(), "sample index ", indices[r], " outside ",
                  ds.describe(), " (", ds.num_samples(), " samples)");
    ds.get(indices[r], window.data(), mask.data());
    std::copy(window.begin(), window.end() - 1, b.tokens.begin() + r * b.T);
    for (int64_t t = 0; t < b.T; ++t) b.targets[r * b.T + t] = mask[t + 1] ? window[t + 1] : kIgnoreTarget;
  }
  return true;
}
}  // namespace

std::vector<int32_t> document_starts(const int32_t* tokens, int64_t T, int32_t eot) {
  std::vector<int32_t> starts(static_cast<size_t>(T));
  int32_t start = 0;
  for (int64_t t = 0; t < T; ++t) {
    starts[static_cast<size_t>(t)] = start;
    if (tokens[t] == eot) start = static_cast<int32_t>(t + 1);
  }
  return starts;
}

void mark_documents(Batch& b, int32_t eot) {
  TESSERA_CHECK(static_cast<int64_t>(b.tokens.size()) == b.B * b.T, "mark_documents: ", b.tokens.size(),
                " token ids for a batch of ", b.B, " x ", b.T);
  b.doc_start.clear();
  b.doc_start.reserve(b.tokens.size());
  for (int64_t r = 0; r < b.B; ++r) {
    const std::vector<int32_t> s = document_starts(b.tokens.data() + r * b.T, b.T, eot);
    b.doc_start.insert(b.doc_start.end(), s.begin(), s.end());
  }
}

Batch make_batch(const Dataset& ds, const std::vector<int64_t>& indices) {
  Batch b;
  fill_batch(ds, indices, nullptr, b);
  return b;
}

std::optional<Batch> make_batch(const Dataset& ds, const std::vector<int64_t>& indices,
                                const std::atomic<bool>& cancel) {
  Batch b;
  if (!fill_batch(ds, indices, &cancel, b)) return std::nullopt;
  return b;
}

}  // namespace tessera
