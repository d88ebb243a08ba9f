// make_batch: windows of T + 1 ids split into inputs and next-token targets.
#include "data/dataset.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "kernels/check.h"

namespace tessera {

namespace {
// Where sample `index`'s placeholders (ids == placeholder among tokens[0, T)) lie: nothing when it
// has none, else its run's start and length; an Error when they are not one run.
std::optional<std::pair<int64_t, int64_t>> placeholder_run(const Dataset& ds, int64_t index, const int32_t* tokens,
                                                           int64_t T, int32_t placeholder) {
  int64_t first = -1, count = 0;
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] == placeholder) {
      if (first < 0) first = t;
      ++count;
      TESSERA_CHECK(t == first + count - 1, ds.describe(), ": sample ", index, "'s image placeholder tokens (id ",
                    placeholder, ") are not one run: positions ", first, " and ", t);
    }
  if (first < 0) return std::nullopt;
  return std::make_pair(first, count);
}

void add_image(const Dataset& ds, int64_t index, int64_t row, const int32_t* tokens, std::vector<uint8_t>& image,
               Batch& b) {
  const bool has = ds.get_image(index, image.data());
  const auto run = placeholder_run(ds, index, tokens, b.T, ds.placeholder_id());
  if (!has) {
    TESSERA_CHECK(!run, ds.describe(), ": sample ", index, " has no image but ", run ? run->second : 0,
                  " image placeholder tokens (id ", ds.placeholder_id(), ") at position ", run ? run->first : 0);
    return;
  }
  TESSERA_CHECK(run.has_value(), ds.describe(), ": sample ", index, " has an image but no placeholder token (id ",
                ds.placeholder_id(), ") in its first ", b.T, " positions");
  TESSERA_CHECK(b.image_tokens == 0 || run->second == b.image_tokens, ds.describe(), ": sample ", index, " has ",
                run->second, " image placeholder tokens, another sample of the batch ", b.image_tokens,
                " (the window may cut the run: a sample's text must fit train.seq_len)");
  b.image_tokens = run->second;
  b.image_sample.push_back(row);
  b.image_start.push_back(run->first);
  b.images.insert(b.images.end(), image.begin(), image.end());
}

// Fills b from the samples; false when *cancel was set before a sample was read.
bool fill_batch(const Dataset& ds, const std::vector<int64_t>& indices, const std::atomic<bool>* cancel, Batch& b) {
  b.B = static_cast<int64_t>(indices.size());
  b.T = ds.seq_len();
  b.tokens.resize(static_cast<size_t>(b.B * b.T));
  b.targets.resize(static_cast<size_t>(b.B * b.T));
  std::vector<int32_t> window(static_cast<size_t>(b.T + 1));
  std::vector<uint8_t> mask(static_cast<size_t>(b.T + 1));
  b.image_shape = ds.image_shape();
  const bool with_images = b.image_shape.numel() > 0;
  std::vector<uint8_t> image(static_cast<size_t>(b.image_shape.numel()));
  for (int64_t r = 0; r < b.B; ++r) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    TESSERA_CHECK(indices[r] >= 0 && indices[r] < ds.num_samples(), "sample index ", indices[r], " outside ",
                  ds.describe(), " (", ds.num_samples(), " samples)");
    ds.get(indices[r], window.data(), mask.data());
    std::copy(window.begin(), window.end() - 1, b.tokens.begin() + r * b.T);
    for (int64_t t = 0; t < b.T; ++t) b.targets[r * b.T + t] = mask[t + 1] ? window[t + 1] : kIgnoreTarget;
    if (!with_images) continue;
    add_image(ds, indices[r], r, b.tokens.data() + r * b.T, image, b);
    for (int64_t t = 0; t < b.T; ++t)
      if (b.targets[r * b.T + t] == ds.placeholder_id()) b.targets[r * b.T + t] = kIgnoreTarget;
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
