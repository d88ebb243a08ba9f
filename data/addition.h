// The embedded synthetic task: integer addition written as text ("37+45=82\n"), with a character
// tokenizer. Needs no files. Problems are a pure function of (seed, index), so any sample can be
// produced on any rank; a fixed, hashed subset of operand pairs is held out for validation and
// never appears in training.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tessera {

// Characters "0123456789+=\n" map to ids 0..12.
class CharTokenizer {
 public:
  static constexpr const char* kAlphabet = "0123456789+=\n";
  int64_t vocab_size() const { return 13; }
  std::vector<int32_t> encode(const std::string& text) const;  // Error on a character outside the alphabet
  std::string decode(const std::vector<int32_t>& ids) const;
};

struct AdditionProblem {
  int64_t a = 0, b = 0;
  std::string prompt() const;  // "37+45="
  std::string answer() const;  // "82"
  std::string text() const;    // "37+45=82\n"
};

class AdditionTask {
 public:
  AdditionTask(int digits, uint64_t seed);
  // The index-th problem of a split (train: pairs not held out; validation: held-out pairs only).
  AdditionProblem problem(uint64_t index, bool validation) const;
  bool held_out(int64_t a, int64_t b) const;
  int digits() const { return digits_; }
  const CharTokenizer& tokenizer() const { return tok_; }

 private:
  int digits_;
  uint64_t seed_;
  int64_t max_operand_;  // 10^digits
  CharTokenizer tok_;
};

// Samples of seq_len + 1 ids, each a run of consecutive problems starting at a problem boundary.
// The loss mask keeps only the answers and their newlines: the operands are random, so predicting
// them teaches nothing and only adds noise to the gradient.
class AdditionDataset : public Dataset {
 public:
  AdditionDataset(const AdditionTask& task, bool validation, int64_t seq_len, int64_t num_samples);
  int64_t num_samples() const override { return num_samples_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return task_.tokenizer().vocab_size(); }
  void get(int64_t index, int32_t* out, uint8_t* loss_mask) const override;
  std::string describe() const override;

 private:
  const AdditionTask& task_;
  bool validation_;
  int64_t seq_len_;
  int64_t num_samples_;
};

}  // namespace tessera
