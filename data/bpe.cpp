// BPE merge table and the two equivalent merge algorithms (scan for short words, heap for long).
#include "data/bpe.h"

#include <climits>
#include <queue>

#include "kernels/check.h"

namespace tessera {

uint64_t BpeMerges::key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

size_t BpeMerges::slot(uint64_t k) const {
  size_t mask = table_.size() - 1;
  size_t i = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  while (table_[i].key != kEmpty && table_[i].key != k) i = (i + 1) & mask;
  return i;
}

void BpeMerges::grow() {
  std::vector<Entry> old = std::move(table_);
  table_.assign(old.empty() ? 1024 : old.size() * 2, Entry{});
  for (const Entry& e : old)
    if (e.key != kEmpty) table_[slot(e.key)] = e;
}

bool BpeMerges::add(int32_t left, int32_t right, int32_t merged) {
  if (2 * (static_cast<size_t>(size_) + 1) > table_.size()) grow();  // load factor <= 1/2
  uint64_t k = key(left, right);
  Entry& e = table_[slot(k)];
  if (e.key == k) return false;
  e = Entry{k, Merge{size_++, merged}};
  return true;
}

const BpeMerges::Merge* BpeMerges::find(int32_t left, int32_t right) const {
  if (table_.empty()) return nullptr;
  const Entry& e = table_[slot(key(left, right))];
  return e.key == kEmpty ? nullptr : &e.merge;
}

void bpe_merge(const BpeMerges& merges, std::vector<int32_t>* symbols) {
  if (symbols->size() < kBpeHeapMinSymbols)
    bpe_merge_scan(merges, symbols);
  else
    bpe_merge_heap(merges, symbols);
}

void bpe_merge_scan(const BpeMerges& merges, std::vector<int32_t>* symbols) {
  std::vector<int32_t>& s = *symbols;
  while (s.size() > 1) {
    const BpeMerges::Merge* best = nullptr;
    int32_t left = 0, right = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const BpeMerges::Merge* m = merges.find(s[i], s[i + 1]);
      if (m && (!best || m->rank < best->rank)) best = m, left = s[i], right = s[i + 1];
    }
    if (!best) return;
    size_t w = 0;
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
        s[w++] = best->merged;
        i += 2;
      } else {
        s[w++] = s[i++];
      }
    }
    s.resize(w);
  }
}

namespace {

// A word as a doubly linked list of symbols; a merged symbol keeps its left position.
struct SymbolList {
  std::vector<int32_t> id, prev, next;  // prev/next: -1 at the ends; a removed position has id -1
  explicit SymbolList(const std::vector<int32_t>& s) : id(s), prev(s.size()), next(s.size()) {
    int32_t n = static_cast<int32_t>(s.size());
    for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  }
  void merge(int32_t pos, int32_t merged) {  // pos absorbs its right neighbour
    int32_t gone = next[pos];
    id[pos] = merged;
    next[pos] = next[gone];
    if (next[gone] >= 0) prev[next[gone]] = pos;
    id[gone] = -1;
  }
};

struct Candidate {
  int32_t rank, pos, left, right;  // the pair (left, right) at pos and next[pos] when pushed
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};
using CandidateHeap = std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>>;

void push_pair(const BpeMerges& merges, const SymbolList& w, int32_t pos, CandidateHeap* heap) {
  if (pos < 0 || w.next[pos] < 0) return;
  int32_t l = w.id[pos], r = w.id[w.next[pos]];
  if (const BpeMerges::Merge* m = merges.find(l, r)) heap->push({m->rank, pos, l, r});
}

bool still_there(const SymbolList& w, const Candidate& c) {
  return w.id[c.pos] == c.left && w.next[c.pos] >= 0 && w.id[w.next[c.pos]] == c.right;
}

}  // namespace

// One round per rank, as in the scan: every candidate of the lowest rank is applied left to right
// (heap order is (rank, position)), skipping those an earlier merge of the round consumed; only then
// are the pairs the round created pushed, so a new lower-ranked pair cannot cut in mid-round.
void bpe_merge_heap(const BpeMerges& merges, std::vector<int32_t>* symbols) {
  if (symbols->size() < 2) return;
  TESSERA_CHECK(symbols->size() < size_t{INT32_MAX}, "bpe: a piece of ", symbols->size(), " bytes is too long");
  SymbolList w(*symbols);
  CandidateHeap heap;
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols->size()); ++i) push_pair(merges, w, i, &heap);
  std::vector<int32_t> merged_at;
  while (!heap.empty()) {
    const int32_t rank = heap.top().rank;
    merged_at.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      Candidate c = heap.top();
      heap.pop();
      if (!still_there(w, c)) continue;
      w.merge(c.pos, merges.find(c.left, c.right)->merged);
      merged_at.push_back(c.pos);
    }
    for (int32_t pos : merged_at) {
      push_pair(merges, w, w.prev[pos], &heap);
      push_pair(merges, w, pos, &heap);
    }
  }
  symbols->clear();
  for (int32_t pos = 0; pos >= 0; pos = w.next[pos]) symbols->push_back(w.id[pos]);
}

}  // namespace tessera
