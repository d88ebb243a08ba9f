// BlendedDataset: the greedy proportional assignment, precomputed once.
#include "data/blend.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "kernels/check.h"

namespace tessera {

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const Dataset>> parts, std::vector<double> weights)
    : parts_(std::move(parts)), weights_(std::move(weights)) {
  TESSERA_CHECK(!parts_.empty(), "a blend needs at least one dataset");
  TESSERA_CHECK(parts_.size() == weights_.size(), "a blend has ", parts_.size(), " datasets but ", weights_.size(),
                " weights");
  TESSERA_CHECK(parts_.size() <= 255, "a blend holds at most 255 datasets");
  double total = 0;
  for (size_t d = 0; d < parts_.size(); ++d) {
    TESSERA_CHECK(weights_[d] > 0 && std::isfinite(weights_[d]), "data.train weight of ", parts_[d]->describe(),
                  " must be positive, got ", weights_[d]);
    TESSERA_CHECK(parts_[d]->seq_len() == parts_[0]->seq_len() && parts_[d]->vocab_size() == parts_[0]->vocab_size(),
                  "blended datasets must share seq_len and vocabulary: ", parts_[d]->describe(), " vs ",
                  parts_[0]->describe());
    total += weights_[d];
  }
  int64_t n = std::numeric_limits<int64_t>::max();
  for (size_t d = 0; d < parts_.size(); ++d) {
    weights_[d] /= total;
    n = std::min(n, static_cast<int64_t>(std::floor(static_cast<double>(parts_[d]->num_samples()) / weights_[d])));
  }
  TESSERA_CHECK(n > 0, "the blend is empty: a dataset has no samples");
  counts_.assign(parts_.size(), 0);
  which_.resize(static_cast<size_t>(n));
  offset_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    size_t best = 0;
    double best_gap = -std::numeric_limits<double>::infinity();
    for (size_t d = 0; d < parts_.size(); ++d) {
      const double gap = weights_[d] * static_cast<double>(i + 1) - static_cast<double>(counts_[d]);
      if (gap > best_gap && counts_[d] < parts_[d]->num_samples()) best = d, best_gap = gap;
    }
    which_[i] = static_cast<uint8_t>(best);
    offset_[i] = counts_[best]++;
  }
}

void BlendedDataset::get(int64_t index, int32_t* out, uint8_t* loss_mask) const {
  TESSERA_CHECK(index >= 0 && index < num_samples(), "blend sample ", index, " outside [0, ", num_samples(), ")");
  parts_[which_[index]]->get(offset_[index], out, loss_mask);
}

std::string BlendedDataset::describe() const {
  std::ostringstream os;
  os << "blend of";
  for (size_t d = 0; d < parts_.size(); ++d) os << (d ? "," : "") << " " << parts_[d]->describe() << " (" << weights_[d] << ")";
  return os.str();
}

}  // namespace tessera
