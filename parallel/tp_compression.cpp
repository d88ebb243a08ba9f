// Compressed tensor-parallel collectives: the codec (bf16, per-row int8), error feedback, and the
// all-gather / all-to-all reduce-scatter / two-phase all-reduce built on them (see the header).
#include "parallel/tp_compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/int8_rows.h"

namespace tessera {

TpCompressionMode parse_tp_compression(const std::string& value, const std::string& key) {
  if (value == "none") return TpCompressionMode::None;
  if (value == "bf16") return TpCompressionMode::Bf16;
  if (value == "int8") return TpCompressionMode::Int8;
  if (value == "int8-ef") return TpCompressionMode::Int8Ef;
  ::tessera::detail::fail(key, " = \"", value, "\": expected one of \"none\", \"bf16\", \"int8\", \"int8-ef\"");
}

const char* tp_compression_name(TpCompressionMode m) {
  switch (m) {
    case TpCompressionMode::None: return "none";
    case TpCompressionMode::Bf16: return "bf16";
    case TpCompressionMode::Int8: return "int8";
    case TpCompressionMode::Int8Ef: return "int8-ef";
  }
  return "?";
}

TpCompressionModes resolve_tp_compression(const std::string& both, const std::string& forward,
                                          const std::string& backward) {
  const TpCompressionMode all = parse_tp_compression(both, "parallel.tp_comm_compression");
  TpCompressionModes m{all, all};
  if (!forward.empty()) m.forward = parse_tp_compression(forward, "parallel.tp_comm_compression_forward");
  if (!backward.empty()) m.backward = parse_tp_compression(backward, "parallel.tp_comm_compression_backward");
  return m;
}

void check_tp_compression(const TpCompressionModes& modes, const std::string& device) {
  if (!modes.any()) return;
  TESSERA_CHECK(device != "cuda", "parallel.tp_comm_compression (forward \"", tp_compression_name(modes.forward),
                "\", backward \"", tp_compression_name(modes.backward), "\") runs on the CPU only: its codecs have no "
                "CUDA kernels yet; set train.device = \"cpu\" or parallel.tp_comm_compression = \"none\"");
}

// ---- Codec ---------------------------------------------------------------------------------

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t tp_wire_words(TpCompressionMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case TpCompressionMode::Bf16: return ceil_div(rows * cols, 2);
    case TpCompressionMode::Int8:
    case TpCompressionMode::Int8Ef: return rows + ceil_div(rows * cols, 4);
    case TpCompressionMode::None: break;
  }
  ::tessera::detail::fail("tp_wire_words: mode \"none\" has no wire format");
}

void tp_encode(TpCompressionMode mode, const float* x, int64_t rows, int64_t cols, int32_t* wire) {
  tp_encode_with_feedback(mode, x, nullptr, rows, cols, wire);
}

void tp_encode_with_feedback(TpCompressionMode mode, const float* x, float* e, int64_t rows, int64_t cols,
                             int32_t* wire) {
  const int64_t words = tp_wire_words(mode, rows, cols);
  wire[words - 1] = 0;  // the padding of the last word
  std::vector<float> row(static_cast<size_t>(cols));
  if (mode == TpCompressionMode::Bf16) {
    auto* h = reinterpret_cast<uint16_t*>(wire);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = e ? x[i] + e[i] : x[i];
      h[i] = cpu::f32_to_bf16(v);
      if (e) e[i] = v - cpu::bf16_to_f32(h[i]);
    }
    return;
  }
  auto* scales = reinterpret_cast<float*>(wire);
  auto* q = reinterpret_cast<int8_t*>(wire + rows);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * cols;
    float* ei = e ? e + i * cols : nullptr;
    for (int64_t j = 0; j < cols; ++j) row[static_cast<size_t>(j)] = ei ? xi[j] + ei[j] : xi[j];
    const float s = quantize_row_int8(row.data(), cols, q + i * cols);
    scales[i] = s;
    if (ei)
      for (int64_t j = 0; j < cols; ++j) ei[j] = row[static_cast<size_t>(j)] - s * static_cast<float>(q[i * cols + j]);
  }
}

void tp_decode(TpCompressionMode mode, const int32_t* wire, int64_t rows, int64_t cols, float* x, bool accumulate) {
  if (mode == TpCompressionMode::Bf16) {
    const auto* h = reinterpret_cast<const uint16_t*>(wire);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = cpu::bf16_to_f32(h[i]);
      x[i] = accumulate ? x[i] + v : v;
    }
    return;
  }
  TESSERA_CHECK(mode != TpCompressionMode::None, "tp_decode: mode \"none\" has no wire format");
  const auto* scales = reinterpret_cast<const float*>(wire);
  const auto* q = reinterpret_cast<const int8_t*>(wire + rows);
  for (int64_t i = 0; i < rows; ++i) dequantize_row_int8(q + i * cols, cols, scales[i], x + i * cols, accumulate);
}

// ---- Error-feedback state --------------------------------------------------------------------

float* TpCompression::residual(const TpSlot& slot, int64_t n) {
  if (paused_ || modes_.of(slot.direction) != TpCompressionMode::Int8Ef) return nullptr;
  // The forward's entering gather (sequence parallel) stays plain int8: the backward gathers the
  // region's input again for the weight gradients and must get the values the forward used.
  if (slot.direction == TpDirection::Forward && !slot.leave) return nullptr;
  Buffer& b = residuals_[slot];
  if (!b.defined() || b.tensor().numel() != n) {
    b = Buffer(*alloc_, DType::F32, {n}, MemCategory::Communication);
    std::fill_n(b.ptr<float>(), n, 0.0f);
  }
  return b.ptr<float>();
}

void TpCompression::add_probe(const TpSlot& slot, const float* got, const float* exact, int64_t n) {
  ProbeError& e = probe_errors_[slot];
  if (static_cast<int64_t>(e.sum_got.size()) != n) {  // a new shape starts the sums again
    e.sum_got.assign(static_cast<size_t>(n), 0.0);
    e.sum_exact.assign(static_cast<size_t>(n), 0.0);
  }
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - exact[i];
    e.error2 += d * d;
    e.exact2 += static_cast<double>(exact[i]) * exact[i];
    e.sum_got[static_cast<size_t>(i)] += got[i];
    e.sum_exact[static_cast<size_t>(i)] += exact[i];
  }
  ++e.calls;
}

double TpCompression::ProbeError::summed_relative_error() const {
  double d2 = 0, x2 = 0;
  for (size_t i = 0; i < sum_got.size(); ++i) {
    d2 += (sum_got[i] - sum_exact[i]) * (sum_got[i] - sum_exact[i]);
    x2 += sum_exact[i] * sum_exact[i];
  }
  return x2 > 0 ? std::sqrt(d2 / x2) : 0.0;
}

void TpCompression::add_probe_values(const float* x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const float m = row_absmax(x + i * cols, cols);
    if (m == 0.0f) continue;
    for (int64_t j = 0; j < cols; ++j) {
      const int bin = static_cast<int>((x[i * cols + j] / m + 1.0f) * 0.5f * kProbeBins);
      ++probe_histogram_[static_cast<size_t>(std::clamp(bin, 0, kProbeBins - 1))];
    }
  }
}

int64_t TpCompression::residual_bytes() const {
  int64_t bytes = 0;
  for (const auto& [slot, b] : residuals_) bytes += b.tensor().numel() * 4;
  return bytes;
}

int64_t tp_feedback_elements(const TpCompressionModes& modes, int64_t B, int64_t T, int64_t C, int64_t tp,
                             bool sequence_parallel) {
  if (tp <= 1) return 0;
  const int64_t full = B * T * C;
  // One region's residuals: the reduction's (sequence parallel: reduce-scatter of the full partial;
  // plain tp: all-reduce of it, then of the rank's summed range) in each direction with feedback,
  // and backward's gather of the output gradient's shard (the forward's gather keeps none).
  const int64_t reduce = sequence_parallel ? full : full + ceil_div(B * T, tp) * C;
  int64_t region = 0;
  if (modes.forward == TpCompressionMode::Int8Ef) region += reduce;
  if (modes.backward == TpCompressionMode::Int8Ef) region += reduce + (sequence_parallel ? full / tp : 0);
  return 2 * region;
}

int64_t tp_replay_words(const TpCompressionModes& modes, int64_t B, int64_t T, int64_t C, int64_t tp,
                        bool sequence_parallel) {
  if (tp <= 1 || modes.forward != TpCompressionMode::Int8Ef) return 0;
  const TpCompressionMode m = modes.forward;
  if (sequence_parallel) return (tp - 1) * tp_wire_words(m, B * T / tp, C);
  int64_t words = 0;  // the all-reduce's ranges: rows [q R / p, (q + 1) R / p) of R = B T
  for (int64_t q = 0; q < tp; ++q) {
    const int64_t rows = B * T * (q + 1) / tp - B * T * q / tp;
    if (rows > 0) words += tp_wire_words(m, rows, C);
  }
  return words;
}

double tp_bytes_factor(TpCompressionMode mode, int64_t C) {
  switch (mode) {
    case TpCompressionMode::None: return 1.0;
    case TpCompressionMode::Bf16: return 0.5;
    case TpCompressionMode::Int8:
    case TpCompressionMode::Int8Ef: return static_cast<double>(C + 4) / static_cast<double>(4 * C);
  }
  return 1.0;
}

// ---- Collectives ---------------------------------------------------------------------------

namespace {
void check_f32(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.dtype == DType::F32 && t.device.is_cpu(), op, ": compressed tp communication takes F32 host "
                "tensors, got ", dtype_name(t.dtype));
}

int64_t cols_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.dim(t.ndim() - 1); }

// Rows [first, end) of `rows` split into p near-equal ranges: range q.
struct RowRange {
  int64_t first = 0, end = 0;
  int64_t count() const { return end - first; }
};
RowRange row_range(int64_t rows, int p, int q) { return {rows * q / p, rows * (q + 1) / p}; }

void copy_values(const Tensor& in, const Tensor& out) {
  std::copy_n(in.ptr<float>(), in.numel(), out.ptr<float>());
}

// The probe: the exact collective `op` of input into a fresh tensor of n elements (its bytes set
// aside), and the forward input's values into the histogram.
template <class Op>
std::vector<float> probe_exact(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& input, Op&& op,
                               int64_t n) {
  if (slot.direction == TpDirection::Forward)
    c.add_probe_values(input.ptr<float>(), input.numel() / cols_of(input), cols_of(input));
  std::vector<float> exact(static_cast<size_t>(n));
  const int64_t before = comm.bytes_sent();
  op(input, Tensor(exact.data(), DType::F32, {n}));
  c.add_probe_bytes(comm.bytes_sent() - before);
  return exact;
}

// Sends wire[q] to rank q and receives recv[q] from rank q for every q != rank (one batch).
void exchange(Communicator& comm, std::vector<std::vector<int32_t>>& send, std::vector<std::vector<int32_t>>& recv,
              int tag) {
  std::vector<P2POp> ops;
  for (int q = 0; q < comm.size(); ++q) {
    if (q == comm.rank()) continue;
    auto& s = send[static_cast<size_t>(q)];
    auto& r = recv[static_cast<size_t>(q)];
    if (!s.empty()) ops.push_back(P2POp::send(Tensor(s.data(), DType::I32, {static_cast<int64_t>(s.size())}), q, tag));
    if (!r.empty()) ops.push_back(P2POp::recv(Tensor(r.data(), DType::I32, {static_cast<int64_t>(r.size())}), q, tag));
  }
  if (!ops.empty()) comm.batch_send_recv(ops);
}

// Phase 1 of a reduce, the exchange: every rank q != rank() gets this rank's encoding of x's rows
// ranges[q] (x: this rank's partial (rows, cols); e: its residual, or null). Returns what this rank
// received: recv[q], rank q's encoding of the rows ranges[rank()].
std::vector<std::vector<int32_t>> exchange_ranges(Communicator& comm, TpCompressionMode mode, const float* x, float* e,
                                                  int64_t cols, const std::vector<RowRange>& ranges) {
  const int p = comm.size(), r = comm.rank();
  std::vector<std::vector<int32_t>> send(static_cast<size_t>(p)), recv(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    const RowRange g = ranges[static_cast<size_t>(q)];
    if (g.count() == 0) continue;
    send[static_cast<size_t>(q)].resize(static_cast<size_t>(tp_wire_words(mode, g.count(), cols)));
    tp_encode_with_feedback(mode, x + g.first * cols, e ? e + g.first * cols : nullptr, g.count(), cols,
                            send[static_cast<size_t>(q)].data());
  }
  const RowRange mine = ranges[static_cast<size_t>(r)];
  for (int q = 0; q < p; ++q)
    if (q != r && mine.count() > 0)
      recv[static_cast<size_t>(q)].resize(static_cast<size_t>(tp_wire_words(mode, mine.count(), cols)));
  exchange(comm, send, recv, /*tag=*/7101);
  return recv;
}

// Phase 1 of a reduce, the sum: out (mine's rows) = x's own rows exact + the other ranks' decoded
// (wire_of(q): rank q's encoding of them), in rank order whatever the rank.
template <class WireOf>
void sum_ranges(TpCompressionMode mode, const float* x, int64_t cols, RowRange mine, int r, int p, WireOf&& wire_of,
                float* out) {
  const int64_t n = mine.count() * cols;
  std::fill_n(out, n, 0.0f);
  if (n == 0) return;
  for (int q = 0; q < p; ++q) {
    if (q == r) {
      for (int64_t i = 0; i < n; ++i) out[i] += x[mine.first * cols + i];
    } else {
      tp_decode(mode, wire_of(q), mine.count(), cols, out, /*accumulate=*/true);
    }
  }
}

// received->wire = the words of `parts` (in order), when it asks for them.
void keep_received(TpCompression& c, TpReceived* received, const std::vector<const std::vector<int32_t>*>& parts) {
  if (!received || !received->keep) return;
  int64_t words = 0;
  for (const auto* w : parts) words += static_cast<int64_t>(w->size());
  received->wire = Buffer(c.allocator(), DType::I32, {words}, MemCategory::Activations);
  int32_t* out = received->wire.ptr<int32_t>();
  for (const auto* w : parts) out = std::copy(w->begin(), w->end(), out);
}
}  // namespace

void compressed_all_gather(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& local,
                           const Tensor& full) {
  check_f32("compressed_all_gather", local);
  check_f32("compressed_all_gather", full);
  const int64_t n = local.numel(), cols = cols_of(local), rows = n / cols, p = comm.size();
  TESSERA_CHECK(full.numel() == p * n, "compressed_all_gather: full holds ", full.numel(), " elements, not ", p,
                " x ", n);
  const TpCompressionMode mode = c.mode(slot.direction);
  const int64_t words = tp_wire_words(mode, rows, cols);
  std::vector<float> exact;
  if (c.probing()) exact = probe_exact(comm, c, slot, local, [&](const Tensor& in, const Tensor& out) {
      comm.all_gather(in, out);
    }, p * n);
  std::vector<int32_t> mine(static_cast<size_t>(words)), all(static_cast<size_t>(p * words));
  tp_encode_with_feedback(mode, local.ptr<float>(), c.residual(slot, n), rows, cols, mine.data());
  comm.all_gather(Tensor(mine.data(), DType::I32, {words}), Tensor(all.data(), DType::I32, {p * words}));
  for (int64_t q = 0; q < p; ++q) tp_decode(mode, all.data() + q * words, rows, cols, full.ptr<float>() + q * n);
  if (c.probing()) c.add_probe(slot, full.ptr<float>(), exact.data(), p * n);
}

void compressed_reduce_scatter(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& full,
                               const Tensor& local, TpReceived* received) {
  check_f32("compressed_reduce_scatter", local);
  check_f32("compressed_reduce_scatter", full);
  const int64_t n = local.numel(), cols = cols_of(local), rows = n / cols;
  const int p = comm.size(), r = comm.rank();
  TESSERA_CHECK(full.numel() == p * n, "compressed_reduce_scatter: full holds ", full.numel(), " elements, not ", p,
                " x ", n);
  const TpCompressionMode mode = c.mode(slot.direction);
  // Chunk q of full is rows [q rows, (q + 1) rows) of full viewed as (p rows, cols).
  std::vector<RowRange> ranges;
  for (int q = 0; q < p; ++q) ranges.push_back({q * rows, (q + 1) * rows});
  const RowRange mine = ranges[static_cast<size_t>(r)];
  if (received && received->recorded()) {  // the replay: the other ranks' chunks as the first call got them
    const int64_t words = tp_wire_words(mode, rows, cols);
    TESSERA_CHECK(received->wire.tensor().numel() == (p - 1) * words, "compressed_reduce_scatter: the kept chunks hold ",
                  received->wire.tensor().numel(), " words, not ", p - 1, " x ", words);
    const int32_t* kept = received->wire.ptr<int32_t>();
    sum_ranges(mode, full.ptr<float>(), cols, mine, r, p, [&](int q) { return kept + (q < r ? q : q - 1) * words; },
               local.ptr<float>());
    return;
  }
  std::vector<float> exact;
  if (c.probing()) exact = probe_exact(comm, c, slot, full, [&](const Tensor& in, const Tensor& out) {
      comm.reduce_scatter(in, out, ReduceOp::Sum);
    }, n);
  float* e = c.residual(slot, p * n);
  const auto recv = exchange_ranges(comm, mode, full.ptr<float>(), e, cols, ranges);
  sum_ranges(mode, full.ptr<float>(), cols, mine, r, p, [&](int q) { return recv[static_cast<size_t>(q)].data(); },
             local.ptr<float>());
  if (e) {
    std::vector<const std::vector<int32_t>*> parts;
    for (int q = 0; q < p; ++q)
      if (q != r) parts.push_back(&recv[static_cast<size_t>(q)]);
    keep_received(c, received, parts);
  }
  if (c.probing()) c.add_probe(slot, local.ptr<float>(), exact.data(), n);
}

void compressed_all_reduce(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& t,
                           TpReceived* received) {
  check_f32("compressed_all_reduce", t);
  const int64_t n = t.numel(), cols = cols_of(t), rows = n / cols;
  const int p = comm.size(), r = comm.rank();
  const TpCompressionMode mode = c.mode(slot.direction);
  std::vector<RowRange> ranges;
  for (int q = 0; q < p; ++q) ranges.push_back(row_range(rows, p, q));
  const RowRange mine = ranges[static_cast<size_t>(r)];
  float* x = t.ptr<float>();
  if (received && received->recorded()) {  // the replay: every range of the sum as the first call decoded it
    const int32_t* w = received->wire.ptr<int32_t>();
    for (int q = 0; q < p; ++q) {
      const RowRange g = ranges[static_cast<size_t>(q)];
      if (g.count() == 0) continue;
      tp_decode(mode, w, g.count(), cols, x + g.first * cols);
      w += tp_wire_words(mode, g.count(), cols);
    }
    TESSERA_CHECK(w == received->wire.ptr<int32_t>() + received->wire.tensor().numel(),
                  "compressed_all_reduce: the kept ranges do not match the tensor's ", rows, " rows");
    return;
  }
  std::vector<float> exact;
  if (c.probing()) exact = probe_exact(comm, c, slot, t, [&](const Tensor& in, const Tensor& out) {
      copy_values(in, out);
      comm.all_reduce(out, ReduceOp::Sum);
    }, n);
  // Phase 1: this rank's range of the sum.
  std::vector<float> sum(static_cast<size_t>(mine.count() * cols));
  float* e = c.residual(slot, n);
  const auto recv1 = exchange_ranges(comm, mode, x, e, cols, ranges);
  sum_ranges(mode, x, cols, mine, r, p, [&](int q) { return recv1[static_cast<size_t>(q)].data(); }, sum.data());
  // Phase 2: every range of the sum, encoded once by its owner and decoded by everyone.
  TpSlot second = slot;
  second.phase = 1;
  std::vector<std::vector<int32_t>> send(static_cast<size_t>(p)), recv(static_cast<size_t>(p));
  std::vector<int32_t> wire(static_cast<size_t>(mine.count() > 0 ? tp_wire_words(mode, mine.count(), cols) : 0));
  if (mine.count() > 0)
    tp_encode_with_feedback(mode, sum.data(), c.residual(second, mine.count() * cols), mine.count(), cols,
                            wire.data());
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    send[static_cast<size_t>(q)] = wire;
    const RowRange g = ranges[static_cast<size_t>(q)];
    if (g.count() > 0) recv[static_cast<size_t>(q)].resize(static_cast<size_t>(tp_wire_words(mode, g.count(), cols)));
  }
  exchange(comm, send, recv, /*tag=*/7102);
  std::vector<const std::vector<int32_t>*> parts;
  for (int q = 0; q < p; ++q) {
    const RowRange g = ranges[static_cast<size_t>(q)];
    if (g.count() == 0) continue;
    const std::vector<int32_t>& w = q == r ? wire : recv[static_cast<size_t>(q)];
    tp_decode(mode, w.data(), g.count(), cols, x + g.first * cols);
    parts.push_back(&w);
  }
  if (e) keep_received(c, received, parts);
  if (c.probing()) c.add_probe(slot, x, exact.data(), n);
}

}  // namespace tessera
