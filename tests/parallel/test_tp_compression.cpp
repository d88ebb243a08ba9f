// Tests parallel/tp_compression.h: the codec's error bounds (bf16: half an ulp of 8 bits; int8:
// max |row| / 254 an element), error feedback bounding the error of a sum over steps, the
// compressed collectives against the exact ones on 1, 2 and 4 ranks (within the bounds the codec
// gives, and identical on every rank where the exact one is), "none" bit-equal to the uncompressed
// region edges, the bytes they count, the residuals' size, the replay of a recomputed forward's
// collective (bit-equal, no bytes, the residuals untouched), and the validation messages.
#include "parallel/tp_compression.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "error_testing.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "parallel/tensor_parallel.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
using testing::test_world;
namespace {

// Values like a trained model's activations: mostly small, a few large outliers per row.
std::vector<float> activations(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen) < 0.02f ? 20.0f * normal(gen) : 0.3f * normal(gen);
  return v;
}

float row_max(const float* x, int64_t cols) {
  float m = 0;
  for (int64_t j = 0; j < cols; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}

std::vector<float> round_trip(TpCompressionMode mode, const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<int32_t> wire(static_cast<size_t>(tp_wire_words(mode, rows, cols)));
  tp_encode(mode, x.data(), rows, cols, wire.data());
  std::vector<float> y(x.size());
  tp_decode(mode, wire.data(), rows, cols, y.data());
  return y;
}

TEST(TpCompression, Int8ErrorIsAtMostHalfAStepOfTheRowScale) {
  const int64_t rows = 37, cols = 61;
  const std::vector<float> x = activations(rows * cols, 1);
  const std::vector<float> y = round_trip(TpCompressionMode::Int8, x, rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    // s / 2 with s = max / 127, plus the fp32 rounding of s q (relative 2^-24 of at most max).
    const float bound = row_max(&x[i * cols], cols) * (0.5f / 127.0f + 1e-6f);
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_LE(std::fabs(y[i * cols + j] - x[i * cols + j]), bound) << i << " " << j;
  }
  // Each row's largest value survives exactly up to fp32 rounding; a zero row decodes to zeros.
  std::vector<float> zero(static_cast<size_t>(cols), 0.0f);
  for (float v : round_trip(TpCompressionMode::Int8, zero, 1, cols)) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(tp_wire_words(TpCompressionMode::Int8, rows, cols), rows + (rows * cols + 3) / 4);
  EXPECT_EQ(tp_wire_words(TpCompressionMode::Int8Ef, rows, cols), tp_wire_words(TpCompressionMode::Int8, rows, cols));
}

TEST(TpCompression, Bf16ErrorIsHalfAnUlpOfEightBits) {
  const int64_t rows = 5, cols = 33;
  const std::vector<float> x = activations(rows * cols, 2);
  const std::vector<float> y = round_trip(TpCompressionMode::Bf16, x, rows, cols);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) * std::ldexp(1.0f, -8)) << i;
  EXPECT_EQ(tp_wire_words(TpCompressionMode::Bf16, rows, cols), (rows * cols + 1) / 2);
  EXPECT_THROW(tp_wire_words(TpCompressionMode::None, rows, cols), Error);
}

// A fixed input sent every step: without feedback each step makes the same error, so the sum of
// what arrived drifts by N errors; with it, the residual carries the error into the next step and
// the sum stays within one step's error of N x.
TEST(TpCompression, ErrorFeedbackBoundsTheErrorOfASumOverSteps) {
  const int64_t rows = 4, cols = 50, n = rows * cols, steps = 200;
  const std::vector<float> x = activations(n, 3);
  std::vector<int32_t> wire(static_cast<size_t>(tp_wire_words(TpCompressionMode::Int8, rows, cols)));
  std::vector<double> sum_plain(static_cast<size_t>(n)), sum_ef(static_cast<size_t>(n));
  std::vector<float> e(static_cast<size_t>(n), 0.0f), y(static_cast<size_t>(n));
  for (int64_t s = 0; s < steps; ++s) {
    tp_encode(TpCompressionMode::Int8, x.data(), rows, cols, wire.data());
    tp_decode(TpCompressionMode::Int8, wire.data(), rows, cols, y.data());
    for (int64_t i = 0; i < n; ++i) sum_plain[static_cast<size_t>(i)] += y[static_cast<size_t>(i)];
    tp_encode_with_feedback(TpCompressionMode::Int8Ef, x.data(), e.data(), rows, cols, wire.data());
    tp_decode(TpCompressionMode::Int8Ef, wire.data(), rows, cols, y.data());
    for (int64_t i = 0; i < n; ++i) sum_ef[static_cast<size_t>(i)] += y[static_cast<size_t>(i)];
  }
  double err_plain = 0, err_ef = 0, one_step = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = static_cast<double>(steps) * x[static_cast<size_t>(i)];
    err_plain = std::max(err_plain, std::fabs(sum_plain[static_cast<size_t>(i)] - want));
    err_ef = std::max(err_ef, std::fabs(sum_ef[static_cast<size_t>(i)] - want));
  }
  for (int64_t i = 0; i < rows; ++i) one_step = std::max<double>(one_step, row_max(&x[i * cols], cols) / 127.0);
  EXPECT_GT(err_plain, 10 * one_step);  // the drift is real on this input
  EXPECT_LE(err_ef, 1.01 * one_step);   // |sum - N x| = |e_N| <= one quantization step (the row scale)
}

// ---- Collectives on the ranks of the test world --------------------------------------------

struct World {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  int p = comm.size(), r = comm.rank();
};

// Every rank's tensor equals rank 0's, bit for bit.
void expect_identical_on_every_rank(Communicator& comm, const std::vector<float>& v) {
  std::vector<float> all(v.size() * static_cast<size_t>(comm.size()));
  comm.all_gather(Tensor(const_cast<float*>(v.data()), DType::F32, {static_cast<int64_t>(v.size())}),
                  Tensor(all.data(), DType::F32, {static_cast<int64_t>(all.size())}));
  for (int q = 1; q < comm.size(); ++q)
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(all[q * v.size() + i], all[i]) << "rank " << q << " element " << i;
}

TEST(TpCompression, AllGatherMatchesTheExactGatherWithinTheBound) {
  World w;
  Allocator alloc;
  const int64_t rows = 6, cols = 40, n = rows * cols;
  for (TpCompressionMode mode : {TpCompressionMode::Bf16, TpCompressionMode::Int8}) {
    TpCompression c({mode, mode}, alloc);
    std::vector<float> local = activations(n, 10 + static_cast<uint32_t>(w.r)), full(static_cast<size_t>(w.p * n));
    w.comm.reset_counters();
    compressed_all_gather(w.comm, c, {0, false, TpDirection::Forward, 0}, Tensor(local.data(), DType::F32, {rows, cols}),
                          Tensor(full.data(), DType::F32, {w.p * rows, cols}));
    // The bytes moved are the wire's: (p - 1) / p of p shards.
    const int64_t words = tp_wire_words(mode, rows, cols);
    EXPECT_EQ(w.comm.counters().all_gather, (w.p - 1) * words * 4);
    EXPECT_EQ(words * 4, std::llround(tp_bytes_factor(mode, cols) * n * 4));  // 1/2, or (C + 4) / 4C
    for (int q = 0; q < w.p; ++q) {
      const std::vector<float> want = activations(n, 10 + static_cast<uint32_t>(q));
      for (int64_t i = 0; i < rows; ++i) {
        const float bound = mode == TpCompressionMode::Int8 ? row_max(&want[i * cols], cols) * (0.5f / 127.0f + 1e-6f)
                                                            : row_max(&want[i * cols], cols) * std::ldexp(1.0f, -8);
        for (int64_t j = 0; j < cols; ++j)
          ASSERT_LE(std::fabs(full[q * n + i * cols + j] - want[i * cols + j]), bound) << q << " " << i << " " << j;
      }
    }
    expect_identical_on_every_rank(w.comm, full);
  }
}

TEST(TpCompression, ReduceScatterMatchesTheExactSumWithinTheBound) {
  World w;
  Allocator alloc;
  const int64_t rows = 5, cols = 32, n = rows * cols;
  TpCompression c({TpCompressionMode::Int8, TpCompressionMode::Int8}, alloc);
  std::vector<float> full = activations(w.p * n, 20 + static_cast<uint32_t>(w.r)), local(static_cast<size_t>(n));
  w.comm.reset_counters();
  compressed_reduce_scatter(w.comm, c, {0, true, TpDirection::Forward, 0}, Tensor(full.data(), DType::F32, {w.p * rows, cols}),
                            Tensor(local.data(), DType::F32, {rows, cols}));
  // The all-to-all sends p - 1 encoded chunks, the ring reduce-scatter's (p - 1) / p of the input.
  EXPECT_EQ(w.comm.bytes_sent(), (w.p - 1) * tp_wire_words(TpCompressionMode::Int8, rows, cols) * 4);
  for (int64_t i = 0; i < rows; ++i) {
    float bound = 0;
    std::vector<double> want(static_cast<size_t>(cols), 0.0);
    for (int q = 0; q < w.p; ++q) {
      const std::vector<float> theirs = activations(w.p * n, 20 + static_cast<uint32_t>(q));
      const float* row = &theirs[static_cast<size_t>((w.r * rows + i) * cols)];
      for (int64_t j = 0; j < cols; ++j) want[static_cast<size_t>(j)] += row[j];
      if (q != w.r) bound += row_max(row, cols) * (0.5f / 127.0f + 1e-6f);  // own chunk exact
    }
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_LE(std::fabs(local[i * cols + j] - want[static_cast<size_t>(j)]), bound + 1e-5f) << i << " " << j;
  }
}

TEST(TpCompression, AllReduceMatchesTheExactSumAndIsIdenticalOnEveryRank) {
  World w;
  Allocator alloc;
  const int64_t rows = 7, cols = 24, n = rows * cols;  // 7 rows: ranges of unequal length on 2 and 4 ranks
  for (TpCompressionMode mode : {TpCompressionMode::Bf16, TpCompressionMode::Int8, TpCompressionMode::Int8Ef}) {
    TpCompression c({mode, mode}, alloc);
    std::vector<float> t = activations(n, 30 + static_cast<uint32_t>(w.r));
    compressed_all_reduce(w.comm, c, {0, true, TpDirection::Forward, 0}, Tensor(t.data(), DType::F32, {rows, cols}));
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<double> want(static_cast<size_t>(cols), 0.0);
      float bound1 = 0;  // phase 1: every rank's contribution quantized once (the range owner's is exact)
      for (int q = 0; q < w.p; ++q) {
        const std::vector<float> theirs = activations(n, 30 + static_cast<uint32_t>(q));
        for (int64_t j = 0; j < cols; ++j) want[static_cast<size_t>(j)] += theirs[static_cast<size_t>(i * cols + j)];
        bound1 += row_max(&theirs[static_cast<size_t>(i * cols)], cols);
      }
      float sum_max = 0;
      for (double v : want) sum_max = std::max(sum_max, static_cast<float>(std::fabs(v)));
      // Phase 2 quantizes the sum (whose row max is within bound1's error of sum_max) once more.
      const float rel = mode == TpCompressionMode::Bf16 ? std::ldexp(1.0f, -8) : 0.5f / 127.0f + 1e-6f;
      const float bound = rel * bound1 + rel * (sum_max + rel * bound1) + 1e-5f;
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_LE(std::fabs(t[i * cols + j] - want[static_cast<size_t>(j)]), bound) << tp_compression_name(mode) << " " << i << " " << j;
    }
    expect_identical_on_every_rank(w.comm, t);
  }
}

// ---- Through the region edges (parallel/tensor_parallel.h) ----------------------------------

constexpr int64_t kB = 2, kTl = 3, kC = 16;

// Runs the four edges of one region (enter / leave, forward / backward) on fixed inputs.
std::vector<float> run_edges(const TensorParallel& tp, Allocator& alloc, int r) {
  const int64_t p = tp.size(), T = kTl * p, Tl = tp.sequence_sharded() ? kTl : T;
  std::vector<float> out;
  std::vector<float> x = activations(kB * Tl * kC, 40 + static_cast<uint32_t>(r));
  std::vector<float> partial = activations(kB * T * kC, 50 + static_cast<uint32_t>(r));
  Buffer gathered, dy_gathered;
  const Tensor xf = enter_region(kCpu, tp, alloc, gathered, Tensor(x.data(), DType::F32, {kB, Tl, kC}), T);
  out.insert(out.end(), xf.ptr<float>(), xf.ptr<float>() + xf.numel());
  std::vector<float> y(static_cast<size_t>(kB * Tl * kC));
  const Tensor yl(y.data(), DType::F32, {kB, Tl, kC}), pf(partial.data(), DType::F32, {kB, T, kC});
  leave_region(kCpu, tp, alloc, tp.sequence_sharded() ? yl : pf, pf);
  out.insert(out.end(), (tp.sequence_sharded() ? y : partial).begin(), (tp.sequence_sharded() ? y : partial).end());
  const Tensor dyf = leave_region_backward(kCpu, tp, alloc, dy_gathered, Tensor(x.data(), DType::F32, {kB, Tl, kC}), T);
  out.insert(out.end(), dyf.ptr<float>(), dyf.ptr<float>() + dyf.numel());
  std::vector<float> dpartial = activations(kB * T * kC, 60 + static_cast<uint32_t>(r));
  const Tensor df(dpartial.data(), DType::F32, {kB, T, kC});
  enter_region_backward(kCpu, tp, alloc, tp.sequence_sharded() ? yl : df, df);
  out.insert(out.end(), (tp.sequence_sharded() ? y : dpartial).begin(), (tp.sequence_sharded() ? y : dpartial).end());
  return out;
}

TEST(TpCompression, NoneIsBitEqualToTheUncompressedEdges) {
  World w;
  Allocator alloc;
  TpCompression none({TpCompressionMode::None, TpCompressionMode::None}, alloc);
  for (bool sp : {false, true}) {
    const std::vector<float> exact = run_edges(TensorParallel{&w.comm, sp}, alloc, w.r);
    const std::vector<float> with = run_edges(TensorParallel{&w.comm, sp, 1, &none, 3}, alloc, w.r);
    ASSERT_EQ(exact.size(), with.size());
    for (size_t i = 0; i < exact.size(); ++i) ASSERT_EQ(exact[i], with[i]) << "sp " << sp << " element " << i;
  }
}

TEST(TpCompression, EdgesCompressOnlyAtASiteAndInTheChosenDirection) {
  World w;
  if (w.p == 1) GTEST_SKIP() << "one rank: the edges move nothing";
  Allocator alloc;
  for (bool sp : {false, true}) {
    const std::vector<float> exact = run_edges(TensorParallel{&w.comm, sp}, alloc, w.r);
    TpCompression fwd({TpCompressionMode::Int8, TpCompressionMode::None}, alloc);
    // Site -1 (the embedding, the LM head): exact even with compression on.
    const std::vector<float> unsited = run_edges(TensorParallel{&w.comm, sp, 1, &fwd, -1}, alloc, w.r);
    for (size_t i = 0; i < exact.size(); ++i) ASSERT_EQ(exact[i], unsited[i]) << i;
    // Forward only: the first two edges' results move, the backward ones stay bit-equal.
    const std::vector<float> sited = run_edges(TensorParallel{&w.comm, sp, 1, &fwd, 0}, alloc, w.r);
    const size_t half = exact.size() / 2;  // each edge's result is as large as its twin's
    double diff_fwd = 0;
    for (size_t i = 0; i < half; ++i) diff_fwd = std::max(diff_fwd, std::fabs(static_cast<double>(sited[i]) - exact[i]));
    for (size_t i = half; i < exact.size(); ++i) ASSERT_EQ(exact[i], sited[i]) << "backward element " << i;
    EXPECT_GT(diff_fwd, 0.0) << "sp " << sp;
    EXPECT_LT(diff_fwd, 1.0) << "sp " << sp;  // |x| <~ 80: int8 steps of <= 0.4 per term
  }
}

TEST(TpCompression, ResidualsHoldWhatTheMemoryModelCounts) {
  World w;
  if (w.p == 1) GTEST_SKIP() << "one rank: the edges move nothing";
  Allocator alloc;
  for (bool sp : {false, true})
    for (const TpCompressionModes modes : {TpCompressionModes{TpCompressionMode::Int8Ef, TpCompressionMode::Int8Ef},
                                           TpCompressionModes{TpCompressionMode::Bf16, TpCompressionMode::Int8Ef}}) {
      TpCompression c(modes, alloc);
      run_edges(TensorParallel{&w.comm, sp, 1, &c, 0}, alloc, w.r);  // one region of one layer
      EXPECT_EQ(c.residual_bytes() / 4, tp_feedback_elements(modes, kB, kTl * w.p, kC, w.p, sp) / 2) << "sp " << sp;
      EXPECT_EQ(alloc.counter(MemCategory::Communication).current, static_cast<size_t>(c.residual_bytes()));
      // Paused (evaluation): plain int8, the residuals untouched.
      const int64_t before = c.residual_bytes();
      TpCompression::Paused paused(&c);
      EXPECT_EQ(c.residual({7, false, TpDirection::Backward, 0}, 10), nullptr);
      EXPECT_EQ(c.residual_bytes(), before);
    }
}

// A recomputed forward under forward error feedback (model.recompute = "full"): the first leave
// that asks keeps what it received (tp_replay_words of it, as activations); the replay gives the
// first result bit for bit, sends nothing and leaves the residuals as the first call left them.
// Communicating again instead (what the replay must not do) moves the residuals and the result.
TEST(TpCompression, ARecomputedLeaveReplaysWhatTheForwardReceived) {
  World w;
  if (w.p == 1) GTEST_SKIP() << "one rank: the edges move nothing";
  for (bool sp : {false, true}) {
    Allocator alloc;
    const TpCompressionModes modes{TpCompressionMode::Int8Ef, TpCompressionMode::None};
    TpCompression c(modes, alloc);
    const TensorParallel tp{&w.comm, sp, 1, &c, 0};
    const int64_t T = kTl * w.p, Tl = sp ? kTl : T, n = kB * T * kC;
    const std::vector<float> partial = activations(n, 70 + static_cast<uint32_t>(w.r));
    const auto leave = [&](TpReceived* received) {  // one forward's leave of the same partial output
      std::vector<float> pf = partial, y(static_cast<size_t>(kB * Tl * kC));
      const Tensor pt(pf.data(), DType::F32, {kB, T, kC}), yl(y.data(), DType::F32, {kB, Tl, kC});
      leave_region(kCpu, tp, alloc, sp ? yl : pt, pt, received);
      return sp ? y : pf;
    };
    // The residuals: the reduction's (p x the local result under sp, the whole tensor under plain
    // tp) and plain tp's second phase (this rank's range of the rows).
    const int64_t rows = kB * T, mine = (rows * (w.r + 1) / w.p - rows * w.r / w.p) * kC;
    const auto residuals = [&] {
      std::vector<float> e(c.residual({0, true, TpDirection::Forward, 0}, n),
                           c.residual({0, true, TpDirection::Forward, 0}, n) + n);
      if (!sp) {
        const float* e1 = c.residual({0, true, TpDirection::Forward, 1}, mine);
        e.insert(e.end(), e1, e1 + mine);
      }
      return e;
    };
    leave(nullptr);  // an earlier step: the residuals are not zero
    TpReceived received;
    received.keep = true;
    const std::vector<float> first = leave(&received);
    ASSERT_TRUE(received.recorded()) << "sp " << sp;
    const int64_t words = tp_replay_words(modes, kB, T, kC, w.p, sp);
    EXPECT_EQ(received.wire.tensor().numel(), words) << "sp " << sp;
    EXPECT_EQ(alloc.counter(MemCategory::Activations).current, static_cast<size_t>(words * 4)) << "sp " << sp;
    const std::vector<float> after_first = residuals();
    w.comm.reset_counters();
    const std::vector<float> replayed = leave(&received);
    EXPECT_EQ(w.comm.bytes_sent(), 0) << "sp " << sp;
    ASSERT_EQ(replayed.size(), first.size());
    EXPECT_EQ(std::memcmp(replayed.data(), first.data(), first.size() * sizeof(float)), 0) << "sp " << sp;
    const std::vector<float> after_replay = residuals();
    EXPECT_EQ(std::memcmp(after_replay.data(), after_first.data(), after_first.size() * sizeof(float)), 0)
        << "sp " << sp;
    // Communicating again: a new quantization of partial + the residual.
    TpReceived not_kept;
    const std::vector<float> again = leave(&not_kept);
    EXPECT_FALSE(not_kept.recorded());
    EXPECT_GT(w.comm.bytes_sent(), 0);
    EXPECT_NE(std::memcmp(residuals().data(), after_first.data(), after_first.size() * sizeof(float)), 0);
    EXPECT_NE(std::memcmp(again.data(), first.data(), first.size() * sizeof(float)), 0) << "sp " << sp;
    // Paused (evaluation): no feedback, nothing kept.
    TpCompression::Paused paused(&c);
    TpReceived in_eval;
    in_eval.keep = true;
    leave(&in_eval);
    EXPECT_FALSE(in_eval.recorded());
  }
}

TEST(TpCompression, ValidationNamesTheKeyAndTheValue) {
  EXPECT_TRUE(testing::throws_with([] { resolve_tp_compression("int4", "", ""); },
                        {"parallel.tp_comm_compression = \"int4\"", "\"int8-ef\""}));
  EXPECT_TRUE(testing::throws_with([] { resolve_tp_compression("none", "", "fp8"); },
                        {"parallel.tp_comm_compression_backward = \"fp8\""}));
  const TpCompressionModes m = resolve_tp_compression("int8", "", "bf16");
  EXPECT_EQ(m.forward, TpCompressionMode::Int8);
  EXPECT_EQ(m.backward, TpCompressionMode::Bf16);
  EXPECT_EQ(resolve_tp_compression("bf16", "int8-ef", "").forward, TpCompressionMode::Int8Ef);
  EXPECT_TRUE(testing::throws_with([&] { check_tp_compression(m, "cuda"); },
                        {"runs on the CPU only", "train.device = \"cpu\""}));
  check_tp_compression({}, "cuda");  // "none" runs anywhere
  check_tp_compression(m, "cpu");
  check_tp_compression({TpCompressionMode::Int8Ef, TpCompressionMode::Int8Ef}, "cpu");
}

TEST(TpCompression, BytesFactorsOfTheModes) {
  EXPECT_EQ(tp_bytes_factor(TpCompressionMode::None, 768), 1.0);
  EXPECT_EQ(tp_bytes_factor(TpCompressionMode::Bf16, 768), 0.5);
  EXPECT_DOUBLE_EQ(tp_bytes_factor(TpCompressionMode::Int8, 768), 772.0 / 3072.0);
  // The factor is the wire's: of a (rows, C) F32 tensor, up to the last word's padding.
  EXPECT_EQ(tp_wire_words(TpCompressionMode::Int8, 10, 768) * 4,
            std::llround(tp_bytes_factor(TpCompressionMode::Int8, 768) * 10 * 768 * 4));
}

}  // namespace
}  // namespace tessera
