// Variable-length batches: documents found at end-of-text ids, a step's pieces packed into rows
// (first-fit decreasing) and the rows balanced over dp (fullest first into the least-loaded rank),
// and the packed micro-batches read from the stream.
#include "data/token_batching.h"

#include <algorithm>
#include <numeric>

#include "kernels/check.h"

namespace tessera {

std::vector<DocumentSpan> find_documents(const int32_t* tokens, int64_t n, int32_t eot) {
  std::vector<DocumentSpan> docs;
  int64_t begin = 0;  // the current document's first input
  for (int64_t i = 1; i < n; ++i)  // token i is a target of the document that begins at `begin`
    if (tokens[i] == eot) {
      docs.push_back({begin, i - begin});
      begin = i;
    }
  if (n - 1 > begin) docs.push_back({begin, n - 1 - begin});
  return docs;
}

std::vector<DocumentSpan> find_documents(const TokenWindowDataset& ds, int32_t eot) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t n = ds.num_tokens();
  std::vector<DocumentSpan> docs;
  std::vector<int32_t> buf(static_cast<size_t>(std::min(n, kChunk)));
  int64_t begin = 0;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t count = std::min(kChunk, n - at);
    ds.read(at, count, buf.data(), nullptr);
    for (int64_t i = (at == 0 ? 1 : 0); i < count; ++i)
      if (buf[static_cast<size_t>(i)] == eot) {
        docs.push_back({begin, at + i - begin});
        begin = at + i;
      }
  }
  if (n - 1 > begin) docs.push_back({begin, n - 1 - begin});
  TESSERA_CHECK(!docs.empty(), ds.describe(), " holds no document to train on (fewer than 2 tokens)");
  return docs;
}

int64_t MicroBatchPlan::tokens() const {
  int64_t n = 0;
  for (const auto& row : rows)
    for (const DocumentPiece& p : row) n += p.length;
  return n;
}

int64_t StepPlan::tokens() const { return std::accumulate(rank_tokens.begin(), rank_tokens.end(), int64_t{0}); }

double StepPlan::imbalance() const {
  if (rank_tokens.empty() || tokens() == 0) return 0.0;
  const double mean = static_cast<double>(tokens()) / static_cast<double>(rank_tokens.size());
  return static_cast<double>(*std::max_element(rank_tokens.begin(), rank_tokens.end())) / mean - 1.0;
}

TokenPacker::TokenPacker(std::vector<DocumentSpan> documents, uint64_t seed, bool shuffle, PackingShape shape)
    : documents_(std::move(documents)),
      order_(static_cast<int64_t>(std::max<size_t>(documents_.size(), 1)), seed, shuffle),
      shape_(shape) {
  TESSERA_CHECK(!documents_.empty(), "variable-length batches: no documents");
  TESSERA_CHECK(shape.seq_len >= 1 && shape.rows >= 1 && shape.micro_batches >= 1 && shape.dp_size >= 1,
                "variable-length batches: row length, rows, micro-batches and dp must be positive");
  TESSERA_CHECK(shape.position_period >= shape.seq_len && shape.position_period % shape.seq_len == 0,
                "variable-length batches: the position period ", shape.position_period, " is not a multiple of ",
                shape.seq_len);
  for (const DocumentSpan& d : documents_)
    TESSERA_CHECK(d.length >= 1, "variable-length batches: empty document at stream position ", d.begin);
}

std::vector<DocumentPiece> TokenPacker::pieces_at(int64_t q) const {
  const int64_t doc = order_.sample_at(q);
  const DocumentSpan& d = documents_[static_cast<size_t>(doc)];
  const int64_t L = shape_.seq_len;
  std::vector<DocumentPiece> out;
  for (int64_t j = 0, off = 0; off < d.length; ++j, off += L)
    out.push_back({doc, d.begin + off, std::min(L, d.length - off), (j * L) % shape_.position_period});
  return out;
}

// Step 2: first-fit decreasing of the pieces into the step's dp x M x R rows; false when a piece
// fits no row.
bool TokenPacker::pack_rows(std::vector<DocumentPiece> pieces, std::vector<std::vector<DocumentPiece>>& rows) const {
  const auto n = static_cast<size_t>(shape_.dp_size * shape_.micro_batches * shape_.rows);
  rows.assign(n, {});
  std::vector<int64_t> room(n, shape_.seq_len);
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const DocumentPiece& a, const DocumentPiece& b) { return a.length > b.length; });
  for (const DocumentPiece& p : pieces) {
    const auto row = std::find_if(room.begin(), room.end(), [&](int64_t free) { return free >= p.length; });
    if (row == room.end()) return false;
    *row -= p.length;
    rows[static_cast<size_t>(row - room.begin())].push_back(p);
  }
  return true;
}

// Step 3: the rows, fullest first (ties: row order), each to the dp rank with the fewest tokens that
// still has a free row (ties: the lower rank), in its next free row (micro-batch by micro-batch).
void TokenPacker::balance(const std::vector<std::vector<DocumentPiece>>& rows, StepPlan& plan) const {
  const auto dp = static_cast<size_t>(shape_.dp_size), M = static_cast<size_t>(shape_.micro_batches),
             R = static_cast<size_t>(shape_.rows);
  plan.ranks.assign(dp, std::vector<MicroBatchPlan>(M, MicroBatchPlan{std::vector<std::vector<DocumentPiece>>(R)}));
  plan.rank_tokens.assign(dp, 0);
  std::vector<int64_t> tokens(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i)
    for (const DocumentPiece& p : rows[i]) tokens[i] += p.length;
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tokens[a] > tokens[b]; });
  std::vector<size_t> used(dp, 0);  // rows given to each rank
  for (size_t i : order) {
    size_t best = dp;
    for (size_t r = 0; r < dp; ++r)
      if (used[r] < M * R && (best == dp || plan.rank_tokens[r] < plan.rank_tokens[best])) best = r;
    const size_t slot = used[best]++;
    plan.ranks[best][slot / R].rows[slot % R] = rows[i];
    plan.rank_tokens[best] += tokens[i];
  }
}

StepPlan TokenPacker::plan_step(PackCursor at) const {
  TESSERA_CHECK(at.document >= 0 && at.piece >= 0, "variable-length batches: bad cursor (document ", at.document,
                ", piece ", at.piece, ")");
  // Step 1: the pieces that follow the cursor while their tokens fit the capacity, and the cursor after each.
  std::vector<DocumentPiece> taken;
  std::vector<PackCursor> after;
  int64_t tokens = 0;
  for (PackCursor c = at;;) {
    const std::vector<DocumentPiece> pieces = pieces_at(c.document);
    TESSERA_CHECK(c.piece < static_cast<int64_t>(pieces.size()), "variable-length batches: the cursor's piece ",
                  c.piece, " is past document position ", c.document, "'s ", pieces.size(), " pieces");
    const DocumentPiece& p = pieces[static_cast<size_t>(c.piece)];
    const bool new_epoch = c.piece == 0 && c.document % num_documents() == 0 && !(c == at);
    if (new_epoch || tokens + p.length > shape_.step_capacity()) break;
    tokens += p.length;
    taken.push_back(p);
    c = c.piece + 1 < static_cast<int64_t>(pieces.size()) ? PackCursor{c.document, c.piece + 1}
                                                          : PackCursor{c.document + 1, 0};
    after.push_back(c);
  }
  StepPlan plan;
  std::vector<std::vector<DocumentPiece>> rows;
  for (size_t n = taken.size(); n >= 1; --n) {
    if (!pack_rows(std::vector<DocumentPiece>(taken.begin(), taken.begin() + static_cast<std::ptrdiff_t>(n)), rows))
      continue;
    balance(rows, plan);
    plan.next = after[n - 1];
    return plan;
  }
  TESSERA_CHECK(false, "variable-length batches: internal: the first piece did not fit an empty step");
  return plan;
}

Batch make_packed_batch(const TokenWindowDataset& ds, const MicroBatchPlan& plan, int64_t seq_len, int32_t pad) {
  const int64_t R = static_cast<int64_t>(plan.rows.size()), L = seq_len;
  Batch b;
  b.B = R;
  b.T = L;
  b.tokens.assign(static_cast<size_t>(R * L), pad);
  b.targets.assign(static_cast<size_t>(R * L), kIgnoreTarget);
  b.doc_start.assign(static_cast<size_t>(R * L), 0);
  b.doc_position.assign(static_cast<size_t>(R * L), 0);
  std::vector<int32_t> ids(static_cast<size_t>(L + 1));
  std::vector<uint8_t> mask(static_cast<size_t>(L + 1));
  for (int64_t r = 0; r < R; ++r) {
    int64_t at = 0;  // the row's next free position
    for (const DocumentPiece& p : plan.rows[static_cast<size_t>(r)]) {
      TESSERA_CHECK(at + p.length <= L, "variable-length batches: row ", r, " overflows ", L, " positions");
      ds.read(p.begin, p.length + 1, ids.data(), mask.data());
      for (int64_t i = 0; i < p.length; ++i) {
        const auto k = static_cast<size_t>(r * L + at + i);
        b.tokens[k] = ids[static_cast<size_t>(i)];
        b.targets[k] = mask[static_cast<size_t>(i + 1)] ? ids[static_cast<size_t>(i + 1)] : kIgnoreTarget;
        b.doc_start[k] = static_cast<int32_t>(at);
        b.doc_position[k] = static_cast<int32_t>(p.position);
      }
      at += p.length;
    }
    for (int64_t i = at; i < L; ++i) b.doc_start[static_cast<size_t>(r * L + i)] = static_cast<int32_t>(at);
  }
  return b;
}

std::function<std::optional<Batch>(const std::atomic<bool>&)> packed_batches(
    std::shared_ptr<const TokenWindowDataset> ds, std::shared_ptr<const TokenPacker> packer, PackCursor from,
    int64_t dp_rank, int32_t pad) {
  TESSERA_CHECK(dp_rank >= 0 && dp_rank < packer->shape().dp_size, "variable-length batches: dp rank ", dp_rank,
                " outside [0, ", packer->shape().dp_size, ")");
  struct State {
    PackCursor next;
    StepPlan step;
    int64_t micro = 0;  // the next micro-batch of `step`; M: plan the next step first
  };
  auto st = std::make_shared<State>(State{from, {}, packer->shape().micro_batches});
  return [=](const std::atomic<bool>& cancel) -> std::optional<Batch> {
    if (cancel) return std::nullopt;
    if (st->micro == packer->shape().micro_batches) {
      st->step = packer->plan_step(st->next);
      st->next = st->step.next;
      st->micro = 0;
    }
    const MicroBatchPlan& mb = st->step.ranks[static_cast<size_t>(dp_rank)][static_cast<size_t>(st->micro++)];
    return make_packed_batch(*ds, mb, packer->shape().seq_len, pad);
  };
}

}  // namespace tessera
