// Addition task: Philox-hashed operands, hashed hold-out, character tokenization.
#include "data/addition.h"

#include <cstring>

#include "kernels/check.h"
#include "kernels/philox.h"

namespace tessera {

std::vector<int32_t> CharTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) {
    const char* p = std::strchr(kAlphabet, c);
    TESSERA_CHECK(c != '\0' && p != nullptr, "character '", c, "' is not in the addition alphabet \"0-9+=\\n\"");
    ids.push_back(static_cast<int32_t>(p - kAlphabet));
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    TESSERA_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " outside the addition vocabulary (13)");
    s += kAlphabet[id];
  }
  return s;
}

std::string AdditionProblem::prompt() const { return std::to_string(a) + "+" + std::to_string(b) + "="; }
std::string AdditionProblem::answer() const { return std::to_string(a + b); }
std::string AdditionProblem::text() const { return prompt() + answer() + "\n"; }

AdditionTask::AdditionTask(int digits, uint64_t seed) : digits_(digits), seed_(seed), max_operand_(1) {
  TESSERA_CHECK(digits >= 1 && digits <= 9, "data.digits = ", digits, " must be in [1, 9]");
  for (int i = 0; i < digits; ++i) max_operand_ *= 10;
}

bool AdditionTask::held_out(int64_t a, int64_t b) const {
  // About 1 in 16 operand pairs is reserved for validation.
  const auto key = philox::make_key(seed_, "addition.holdout");
  const auto r = philox::philox4x32_10({static_cast<uint32_t>(a), static_cast<uint32_t>(b), 0u, 0u}, key);
  return r[0] % 16 == 0;
}

AdditionProblem AdditionTask::problem(uint64_t index, bool validation) const {
  const auto key = philox::make_key(seed_, validation ? "addition.validation" : "addition.train");
  // Rejection sampling over attempts: draw pairs until one is in the requested split.
  for (uint32_t attempt = 0;; ++attempt) {
    const auto r = philox::philox4x32_10(
        {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), attempt, 0u}, key);
    const int64_t a = static_cast<int64_t>(r[0] % static_cast<uint64_t>(max_operand_));
    const int64_t b = static_cast<int64_t>(r[1] % static_cast<uint64_t>(max_operand_));
    if (held_out(a, b) == validation) return {a, b};
  }
}

AdditionDataset::AdditionDataset(const AdditionTask& task, bool validation, int64_t seq_len, int64_t num_samples)
    : task_(task), validation_(validation), seq_len_(seq_len), num_samples_(num_samples) {
  TESSERA_CHECK(seq_len >= 2, "train.seq_len = ", seq_len, " is too short for the addition task");
  TESSERA_CHECK(num_samples > 0, "the addition dataset needs at least one sample");
}

void AdditionDataset::get(int64_t index, int32_t* out, uint8_t* loss_mask) const {
  // Sample i starts with problem i * stride of its split and continues with the following ones.
  const int64_t need = seq_len_ + 1;
  const uint64_t stride = static_cast<uint64_t>(need);  // more problems than a window can hold
  int64_t filled = 0;
  for (uint64_t j = 0; filled < need; ++j) {
    const AdditionProblem p = task_.problem(static_cast<uint64_t>(index) * stride + j, validation_);
    const std::vector<int32_t> ids = task_.tokenizer().encode(p.text());
    const size_t answer_start = p.prompt().size();
    for (size_t k = 0; k < ids.size() && filled < need; ++k, ++filled) {
      out[filled] = ids[k];
      if (loss_mask) loss_mask[filled] = k >= answer_start;
    }
  }
}

std::string AdditionDataset::describe() const {
  return std::string("addition task (") + std::to_string(task_.digits()) + " digits, " +
         (validation_ ? "validation" : "train") + ")";
}

}  // namespace tessera
