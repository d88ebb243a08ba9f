// BPE merging of one word's symbols by the ranks of a vocab.bpe. Key decision: exactly encoder.py's
// bpe(): the lowest-ranked pair, all its occurrences in one left-to-right pass, repeat (a scan for
// short words, a heap for long ones; the same result).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera {

// (left id, right id) -> (rank, merged id), in an open-addressing hash table.
class BpeMerges {
 public:
  struct Merge {
    int32_t rank;    // position in vocab.bpe: lower merges first
    int32_t merged;  // the id of left + right
  };
  // Adds the next merge (rank = number added before); false if the pair is already there.
  bool add(int32_t left, int32_t right, int32_t merged);
  const Merge* find(int32_t left, int32_t right) const;
  int32_t size() const { return size_; }

 private:
  static uint64_t key(int32_t left, int32_t right);
  size_t slot(uint64_t k) const;
  void grow();

  struct Entry {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<Entry> table_;
  int32_t size_ = 0;
};

// Merges the symbol ids of one word in place. Words longer than kBpeHeapMinSymbols use the heap.
void bpe_merge(const BpeMerges& merges, std::vector<int32_t>* symbols);
constexpr size_t kBpeHeapMinSymbols = 64;

// The two algorithms, public for the test that holds them equal: O(n * merges applied) by scanning
// and O(n log n) with a heap of candidate pairs.
void bpe_merge_scan(const BpeMerges& merges, std::vector<int32_t>* symbols);
void bpe_merge_heap(const BpeMerges& merges, std::vector<int32_t>* symbols);

}  // namespace tessera
