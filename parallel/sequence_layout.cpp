// SequenceLayout's arithmetic: chunk validation and merging, the splits, and the per-run views.
#include "parallel/sequence_layout.h"

#include <algorithm>
#include <sstream>

#include "kernels/check.h"

namespace tessera {

SequenceLayout::SequenceLayout(std::vector<SequenceChunk> chunks) {
  for (const SequenceChunk& c : chunks) {
    TESSERA_CHECK(c.start >= 0 && c.length > 0, "sequence layout: chunk [", c.start, ", ", c.end(),
                  ") must be non-empty and at positions >= 0");
    for (const SequenceChunk& held : chunks_)
      TESSERA_CHECK(c.end() <= held.start || c.start >= held.end(), "sequence layout: chunk [", c.start, ", ",
                    c.end(), ") overlaps [", held.start, ", ", held.end(), ")");
    if (!chunks_.empty() && chunks_.back().end() == c.start)
      chunks_.back().length += c.length;
    else
      chunks_.push_back(c);
    length_ += c.length;
  }
}

SequenceLayout SequenceLayout::contiguous(int64_t T, int64_t start) {
  TESSERA_CHECK(T >= 0, "sequence layout: length ", T, " is negative");
  return T == 0 ? SequenceLayout() : SequenceLayout(std::vector<SequenceChunk>{{start, T}});
}

SequenceLayout SequenceLayout::load_balanced(int64_t T, int64_t parts, int64_t index) {
  TESSERA_CHECK(parts >= 1 && index >= 0 && index < parts, "sequence layout: part ", index, " of ", parts);
  TESSERA_CHECK(T % (2 * parts) == 0, "sequence layout: a sequence of ", T, " does not cut into 2 x ", parts,
                " equal chunks (load-balanced context parallelism)");
  const int64_t n = T / (2 * parts);
  return SequenceLayout(std::vector<SequenceChunk>{{index * n, n}, {(2 * parts - 1 - index) * n, n}});
}

SequenceLayout SequenceLayout::split(int64_t parts, int64_t index) const {
  TESSERA_CHECK(parts >= 1 && index >= 0 && index < parts, "sequence layout: part ", index, " of ", parts);
  TESSERA_CHECK(length_ % parts == 0, "sequence layout: ", length_, " rows do not split into ", parts,
                " equal parts");
  const int64_t n = length_ / parts, first = index * n, last = first + n;  // local rows [first, last)
  std::vector<SequenceChunk> out;
  int64_t row = 0;  // the local row where chunk c begins
  for (const SequenceChunk& c : chunks_) {
    const int64_t begin = std::max(first, row), end = std::min(last, row + c.length);
    if (begin < end) out.push_back({c.start + (begin - row), end - begin});
    row += c.length;
  }
  SequenceLayout part(std::move(out));
  if (!docs_) return part;
  std::vector<int32_t> docs, positions;
  docs.reserve(static_cast<size_t>(doc_batch_ * n));
  for (int64_t b = 0; b < doc_batch_; ++b) {
    const int32_t* d = doc_starts(b, first);
    docs.insert(docs.end(), d, d + n);
    if (doc_pos_) {
      const int32_t* q = doc_pos_->data() + b * length_ + first;
      positions.insert(positions.end(), q, q + n);
    }
  }
  return part.with_documents(doc_batch_, std::move(docs), std::move(positions));
}

SequenceLayout SequenceLayout::with_documents(int64_t B, std::vector<int32_t> doc_start,
                                              std::vector<int32_t> doc_position) const {
  TESSERA_CHECK(B >= 1 && static_cast<int64_t>(doc_start.size()) == B * length_, "sequence layout: ",
                doc_start.size(), " document starts for ", B, " sequences of ", length_, " rows");
  const bool positioned = !doc_position.empty();
  TESSERA_CHECK(!positioned || doc_position.size() == doc_start.size(), "sequence layout: ", doc_position.size(),
                " document positions for ", B, " sequences of ", length_, " rows");
  for (int64_t b = 0; b < B; ++b) {
    int64_t row = 0;
    for (const SequenceChunk& c : chunks_)
      for (int64_t i = 0; i < c.length; ++i, ++row) {
        const int64_t pos = c.start + i, d = doc_start[static_cast<size_t>(b * length_ + row)];
        TESSERA_CHECK(d >= 0 && d <= pos, "sequence layout: sequence ", b, " row ", row, " (position ", pos,
                      ") has its document start at ", d, ", not in [0, ", pos, "]");
        TESSERA_CHECK(i == 0 || d == pos || d == doc_start[static_cast<size_t>(b * length_ + row - 1)],
                      "sequence layout: sequence ", b, " row ", row, " (position ", pos, ") has its document start at ",
                      d, ", neither its own position nor the previous row's document start");
        if (!positioned) continue;
        const int32_t q = doc_position[static_cast<size_t>(b * length_ + row)];
        TESSERA_CHECK(q >= 0 && (i == 0 || d == pos || q == doc_position[static_cast<size_t>(b * length_ + row - 1)]),
                      "sequence layout: sequence ", b, " row ", row, " (position ", pos, ") has document position ",
                      q, ": negative, or not its document's");
      }
  }
  SequenceLayout out = *this;
  out.doc_batch_ = B;
  out.docs_ = std::make_shared<const std::vector<int32_t>>(std::move(doc_start));
  out.doc_pos_ = positioned ? std::make_shared<const std::vector<int32_t>>(std::move(doc_position)) : nullptr;
  return out;
}

Tensor SequenceLayout::doc_starts() const {
  if (!docs_) return Tensor();
  return Tensor(const_cast<int32_t*>(docs_->data()), DType::I32, {doc_batch_, length_});
}

const int32_t* SequenceLayout::doc_starts(int64_t b, int64_t row) const {
  if (!docs_) return nullptr;
  TESSERA_CHECK(b >= 0 && b < doc_batch_ && row >= 0 && row <= length_, "sequence layout: sequence ", b, " row ",
                row, " outside the documents of ", doc_batch_, " x ", length_);
  return docs_->data() + b * length_ + row;
}

bool SequenceLayout::operator==(const SequenceLayout& o) const {
  if (chunks_ != o.chunks_ || has_documents() != o.has_documents()) return false;
  if (!docs_) return true;
  if (doc_batch_ != o.doc_batch_ || *docs_ != *o.docs_) return false;
  for (int64_t b = 0; b < doc_batch_; ++b)
    for (int64_t row = 0; row < length_; ++row)
      if (doc_position(b, row) != o.doc_position(b, row)) return false;
  return true;
}

int64_t SequenceLayout::end_position() const {
  int64_t e = 0;
  for (const SequenceChunk& c : chunks_) e = std::max(e, c.end());
  if (!doc_pos_) return e;  // positions within documents are at most the chunks'
  for (const SequenceRun& r : runs(doc_batch_)) e = std::max(e, r.position + r.length);
  return e;
}

int64_t SequenceLayout::position(int64_t row) const {
  TESSERA_CHECK(row >= 0 && row < length_, "sequence layout: row ", row, " outside [0, ", length_, ")");
  for (const SequenceChunk& c : chunks_) {
    if (row < c.length) return c.start + row;
    row -= c.length;
  }
  return -1;  // unreachable
}

std::vector<SequenceRun> SequenceLayout::runs(int64_t B) const {
  std::vector<SequenceRun> r;
  if (docs_) {
    TESSERA_CHECK(B == doc_batch_, "sequence layout: ", B, " sequences, but documents are marked for ", doc_batch_);
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* d = doc_starts(b, 0);
      int64_t row = 0;
      for (const SequenceChunk& c : chunks_) {
        // A new run where the chunk begins and at each document start inside it.
        for (int64_t i = 0; i < c.length;) {
          int64_t n = 1;
          while (i + n < c.length && d[row + i + n] == d[row + i]) ++n;
          r.push_back({b, b + 1, row + i, n, c.start + i - d[row + i] + doc_position(b, row + i)});
          i += n;
        }
        row += c.length;
      }
    }
    return r;
  }
  if (chunks_.size() == 1) {
    r.push_back({0, B, 0, length_, chunks_[0].start});
    return r;
  }
  for (int64_t b = 0; b < B; ++b) {
    int64_t row = 0;
    for (const SequenceChunk& c : chunks_) {
      r.push_back({b, b + 1, row, c.length, c.start});
      row += c.length;
    }
  }
  return r;
}

std::string SequenceLayout::str() const {
  if (chunks_.empty()) return "(empty)";
  std::ostringstream s;
  for (size_t i = 0; i < chunks_.size(); ++i) s << (i ? " [" : "[") << chunks_[i].start << ", " << chunks_[i].end() << ")";
  if (docs_) s << " with documents";
  return s.str();
}

Tensor run_view(const Tensor& t, const SequenceRun& run) {
  TESSERA_CHECK(t.ndim() >= 2, "run_view: expected a (B, T, ...) tensor, got ", t.shape.str());
  const int64_t B = t.dim(0), T = t.dim(1), nb = run.b_end - run.b_begin;
  TESSERA_CHECK(run.b_begin >= 0 && run.b_end <= B && nb > 0 && run.row >= 0 && run.length > 0 &&
                    run.row + run.length <= T && (nb == 1 || run.length == T),
                "run_view: rows [", run.row, ", ", run.row + run.length, ") of sequences [", run.b_begin, ", ",
                run.b_end, ") do not fit ", t.shape.str(), " as one view");
  Shape s = t.shape;
  s[0] = nb;
  s[1] = run.length;
  const int64_t inner = t.numel() / (B * T);  // elements per row
  return t.view({B * T, inner}).slice_rows(run.b_begin * T + run.row, run.b_begin * T + run.row + nb * run.length).view(s);
}

}  // namespace tessera
