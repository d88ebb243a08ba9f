// Evaluation during training: validation loss, and for the addition task the exact-match accuracy
// of greedy answers on held-out problems.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/addition.h"
#include "data/dataset.h"
#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "model/gpt.h"

namespace tessera {

// Mean loss over samples [0, batches * micro_batch) of the validation dataset (one device read).
double validation_loss(const Exec& ex, const Gpt& model, Allocator& alloc, const Dataset& val, int64_t batches,
                       int64_t micro_batch);

// Greedy continuation: for each prompt (all the same length), appends max_new tokens chosen by
// argmax of the last position's logits. Re-runs the full forward per token (no KV cache).
std::vector<std::vector<int32_t>> greedy_generate(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                  const std::vector<std::vector<int32_t>>& prompts, int64_t max_new);

struct AccuracyResult {
  int64_t correct = 0, total = 0;
  std::vector<std::string> examples;  // a few "prompt -> answer (expected)" lines
  double accuracy() const { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
};

// Exact match of greedy answers on the first `examples` validation problems.
AccuracyResult addition_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc, const AdditionTask& task,
                                 int64_t examples);

}  // namespace tessera
