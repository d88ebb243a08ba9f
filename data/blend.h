// Weighted blending of several datasets into one: sample i of the blend is assigned to the
// component whose share is furthest behind its weight (greedy, deterministic, no randomness), so
// every prefix of the blend holds each component within one sample of its exact proportion.
// Components are read in order; the Sampler above shuffles the blend as a whole.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tessera {

class BlendedDataset : public Dataset {
 public:
  // weights > 0, one per dataset; all datasets share seq_len and vocab_size. The blend's size is
  // the largest N for which no component is asked for more samples than it has.
  BlendedDataset(std::vector<std::shared_ptr<const Dataset>> parts, std::vector<double> weights);

  int64_t num_samples() const override { return static_cast<int64_t>(which_.size()); }
  int64_t seq_len() const override { return parts_[0]->seq_len(); }
  int64_t vocab_size() const override { return parts_[0]->vocab_size(); }
  void get(int64_t index, int32_t* out, uint8_t* loss_mask) const override;
  std::string describe() const override;

  // How many of the blend's samples come from component d.
  int64_t count(size_t d) const { return counts_.at(d); }

 private:
  std::vector<std::shared_ptr<const Dataset>> parts_;
  std::vector<double> weights_;  // normalized to sum 1
  std::vector<uint8_t> which_;   // component of each blend sample
  std::vector<int64_t> offset_;  // index inside that component
  std::vector<int64_t> counts_;
};

}  // namespace tessera
