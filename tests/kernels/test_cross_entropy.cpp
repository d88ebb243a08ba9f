// Tests kernels/cross_entropy.h: float vs double reference, finite differences, known values,
// ignored targets, in-place backward equal to out-of-place, and the argument errors.
#include <cmath>

#include "kernels/cross_entropy.h"
#include "op_testing.h"

namespace tessera {
using testing::expect_error;
using testing::float_rounded;
using testing::HostTensor;
using testing::kCpu;
namespace {

// Random targets in [0, V) with the rows in `ignored` set to kIgnoreIndex.
HostTensor<int32_t> make_targets(int64_t N, int32_t V, uint64_t seed, std::initializer_list<int64_t> ignored) {
  auto t = testing::random_ids({N}, V, seed);
  for (int64_t n : ignored) t[n] = kIgnoreIndex;
  return t;
}

// losses and lse of one forward in dtype T.
template <typename T>
struct Forward {
  HostTensor<T> losses, lse;
  explicit Forward(int64_t N) : losses({N}), lse({N}) {}
  void run(const HostTensor<T>& logits, const HostTensor<int32_t>& targets) {
    cross_entropy_forward(kCpu, losses.t(), lse.t(), logits.t(), targets.t());
  }
};

}  // namespace

TEST(CrossEntropy, FloatForwardMatchesReference) {
  const int64_t N = 11, V = 97;
  auto logits = float_rounded(HostTensor<double>::uniform({N, V}, 400, -4, 4));
  auto targets = make_targets(N, V, 401, {2, 7});
  Forward<double> ref(N);
  Forward<float> f32(N);
  ref.run(logits, targets);
  f32.run(logits.cast<float>(), targets);
  // Each float exp(x - max) errs by an ulp plus its argument's rounding, |x - max| <= 8 so
  // <= 8 eps / 2: ~6e-7 relative; the double sum keeps that, the log turns it into ~6e-7
  // absolute in lse (~7 here) and in the losses (up to ~10): 1e-6 normwise for both.
  EXPECT_LT(testing::max_rel_error(f32.lse, ref.lse), 1e-6);
  EXPECT_LT(testing::max_rel_error(f32.losses, ref.losses), 1e-6);
  EXPECT_EQ(f32.losses[2], 0.0f);
  EXPECT_EQ(ref.losses[7], 0.0);
}

TEST(CrossEntropy, KnownValues) {
  // Row 0: uniform logits give log V. Rows 1, 2: logits (1000, 0, ..., 0), whose exp overflows
  // without the max subtraction; target 0 costs 0, target 1 costs 1000. Row 3: all -1000, log V.
  const int64_t N = 4, V = 50;
  HostTensor<double> logits({N, V});
  for (int64_t v = 0; v < V; ++v) logits[0 * V + v] = 3.7, logits[3 * V + v] = -1000;
  logits[1 * V + 0] = logits[2 * V + 0] = 1000;
  HostTensor<int32_t> targets({N});
  targets[0] = 5, targets[1] = 0, targets[2] = 1, targets[3] = 9;
  Forward<double> ref(N);
  Forward<float> f32(N);
  ref.run(logits, targets);
  f32.run(logits.cast<float>(), targets);
  const double log_v = std::log(double(V));
  EXPECT_NEAR(ref.losses[0], log_v, 1e-14);
  EXPECT_NEAR(ref.lse[0], 3.7 + log_v, 1e-14);
  EXPECT_EQ(ref.losses[1], 0.0);  // exp(-1000) underflows to 0: the sum is exactly 1
  EXPECT_EQ(ref.losses[2], 1000.0);
  EXPECT_NEAR(ref.losses[3], log_v, 1e-12);
  // Float: lse = 3.7f + log V is rounded once to float (~6e-8 * 7.6) before the loss is formed.
  EXPECT_NEAR(f32.losses[0], log_v, 1e-6);
  EXPECT_EQ(f32.losses[1], 0.0f);
  EXPECT_EQ(f32.losses[2], 1000.0f);
  EXPECT_NEAR(f32.losses[3], log_v, 1e-4);  // 1000 + log V carries ~6e-5 of float rounding
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t N = 6, V = 13;
  const double scale = 0.37;
  auto logits = HostTensor<double>::uniform({N, V}, 410, -3, 3);
  auto targets = make_targets(N, V, 411, {4});
  Forward<double> f(N);
  f.run(logits, targets);
  HostTensor<double> dlogits({N, V});
  cross_entropy_backward(kCpu, dlogits.t(), logits.t(), f.lse.t(), targets.t(), scale);
  auto loss = [&] {
    Forward<double> probe(N);
    probe.run(logits, targets);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += probe.losses[n];
    return scale * s;
  };
  testing::expect_gradient_matches(loss, logits, dlogits, "logits", 1e-6, 1e-5, /*max_points=*/N * V);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[4 * V + v], 0.0) << "ignored row, v = " << v;
}

TEST(CrossEntropy, FloatBackwardMatchesReference) {
  const int64_t N = 11, V = 97;
  const double scale = 1.0 / 11;
  auto logits = float_rounded(HostTensor<double>::uniform({N, V}, 420, -4, 4));
  auto targets = make_targets(N, V, 421, {0, 10});
  Forward<double> ref(N);
  ref.run(logits, targets);
  HostTensor<double> d({N, V});
  cross_entropy_backward(kCpu, d.t(), logits.t(), ref.lse.t(), targets.t(), scale);
  auto lf = logits.cast<float>();
  Forward<float> f32(N);
  f32.run(lf, targets);
  HostTensor<float> df({N, V});
  cross_entropy_backward(kCpu, df.t(), lf.t(), f32.lse.t(), targets.t(), scale);
  // exp(x - lse) in float: lse is stored rounded (eps / 2 * |lse| ~ 5e-7) and x - lse rounds
  // again (~7e-7), so each probability errs by ~1.2e-6 relative, a few ulps more with exp's own:
  // 3e-6 normwise (the largest gradient, 1 - p at the target, is O(1) here).
  EXPECT_LT(testing::max_rel_error(df, d), 3e-6);
  // Each row of softmax - onehot sums to 0 (up to the same errors over V = 97 terms).
  for (int64_t n = 0; n < N; ++n) {
    double s = 0, sf = 0;
    for (int64_t v = 0; v < V; ++v) s += d[n * V + v], sf += df[n * V + v];
    EXPECT_NEAR(s, 0.0, 1e-15);
    EXPECT_NEAR(sf, 0.0, 1e-6 * scale);
  }
}

TEST(CrossEntropy, InPlaceBackwardEqualsOutOfPlace) {
  const int64_t N = 9, V = 70;
  auto logits = float_rounded(HostTensor<double>::uniform({N, V}, 430, -4, 4));
  auto targets = make_targets(N, V, 431, {3});
  auto check = [&](auto tag) {
    using T = decltype(tag);
    auto x = logits.cast<T>();
    Forward<T> f(N);
    f.run(x, targets);
    HostTensor<T> out_of_place({N, V});
    cross_entropy_backward(kCpu, out_of_place.t(), x.t(), f.lse.t(), targets.t(), 0.5);
    cross_entropy_backward(kCpu, x.t(), x.t(), f.lse.t(), targets.t(), 0.5);  // overwrites the logits
    EXPECT_EQ(x.vec(), out_of_place.vec());
  };
  check(double{});
  check(float{});
}

TEST(CrossEntropy, RejectsBadTargetsAndArguments) {
  const int64_t N = 5, V = 20;
  HostTensor<float> logits({N, V}), losses({N}), lse({N}), d({N, V}), lse_bad({N + 1});
  auto targets = make_targets(N, V, 440, {});
  targets[3] = V;
  expect_error([&] { cross_entropy_forward(kCpu, losses.t(), lse.t(), logits.t(), targets.t()); },
               {"cross_entropy_forward", "target 20 at row 3", "[0, 20)"});
  expect_error([&] { cross_entropy_backward(kCpu, d.t(), logits.t(), lse.t(), targets.t(), 1.0); },
               {"cross_entropy_backward", "target 20 at row 3"});
  targets[3] = -2;
  expect_error([&] { cross_entropy_forward(kCpu, losses.t(), lse.t(), logits.t(), targets.t()); },
               {"target -2 at row 3"});
  targets[3] = 0;
  HostTensor<float> targets_f({N});
  expect_error([&] { cross_entropy_forward(kCpu, losses.t(), lse.t(), logits.t(), targets_f.t()); },
               {"targets", "f32"});
  expect_error([&] { cross_entropy_forward(kCpu, losses.t(), lse_bad.t(), logits.t(), targets.t()); },
               {"lse", "5 elements"});
  // dlogits shifted one row from the logits: in place must be the very same buffer.
  HostTensor<float> buffer({N + 1, V});
  Tensor rows_lo = buffer.t().slice_rows(0, N), rows_hi = buffer.t().slice_rows(1, N + 1);
  expect_error([&] { cross_entropy_backward(kCpu, rows_hi, rows_lo, lse.t(), targets.t(), 1.0); },
               {"cross_entropy_backward", "partially overlaps"});
}

// Vocabulary-parallel: V = 11 over 3 shards of 4 columns (the last: 3 ids and a padding column
// holding a huge logit that must not count). Per-shard forwards combined give the whole loss and
// lse; each shard's backward is its slice of the whole gradient, padding columns 0.
template <typename T>
void check_vocab_shards(double tol) {
  const int64_t N = 6, V = 11, parts = 3, cols = VocabShard::rows_per_part(V, parts);
  auto logits = float_rounded(HostTensor<double>::uniform({N, V}, 800, -4, 4)).cast<T>();
  auto targets = make_targets(N, V, 801, {2});
  Forward<T> whole(N);
  cross_entropy_forward(kCpu, whole.losses.t(), whole.lse.t(), logits.t(), targets.t());
  HostTensor<T> dwhole({N, V});
  cross_entropy_backward(kCpu, dwhole.t(), logits.t(), whole.lse.t(), targets.t(), 0.25);
  HostTensor<T> parts_lse({parts, N}), target_logit({N});
  std::vector<HostTensor<T>> shard_logits;
  for (int64_t r = 0; r < parts; ++r) {
    const VocabShard s = VocabShard::of(V, parts, r);
    HostTensor<T> local({N, cols}, T(1e4));  // padding columns: huge, and ignored
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < s.valid; ++c) local[n * cols + c] = logits[n * V + s.start + c];
    HostTensor<T> lse_part({N}), tl({N});
    cross_entropy_shard_forward(kCpu, lse_part.t(), tl.t(), local.t(), targets.t(), s);
    for (int64_t n = 0; n < N; ++n) parts_lse[r * N + n] = lse_part[n], target_logit[n] += tl[n];
    shard_logits.push_back(local);
  }
  Forward<T> combined(N);
  cross_entropy_combine(kCpu, combined.losses.t(), combined.lse.t(), parts_lse.t(), target_logit.t(), targets.t());
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_NEAR(combined.lse[n], whole.lse[n], tol) << "row " << n;
    EXPECT_NEAR(combined.losses[n], whole.losses[n], tol) << "row " << n;
  }
  EXPECT_EQ(combined.losses[2], T(0));  // ignored
  for (int64_t r = 0; r < parts; ++r) {
    const VocabShard s = VocabShard::of(V, parts, r);
    HostTensor<T>& d = shard_logits[static_cast<size_t>(r)];
    cross_entropy_backward(kCpu, d.t(), d.t(), combined.lse.t(), targets.t(), 0.25, s);  // in place
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_NEAR(d[n * cols + c], c < s.valid ? dwhole[n * V + s.start + c] : T(0), tol) << r << " " << n << " " << c;
  }
}

TEST(CrossEntropy, VocabShardsCombineToTheWholeLossF64) { check_vocab_shards<double>(1e-12); }
TEST(CrossEntropy, VocabShardsCombineToTheWholeLossF32) { check_vocab_shards<float>(2e-6); }

TEST(CrossEntropy, VocabShardRejectsAShardThatDoesNotFit) {
  HostTensor<float> logits({2, 4}), a({2}), b({2});
  HostTensor<int32_t> targets({2});
  auto shard_forward = [&](VocabShard s) {
    cross_entropy_shard_forward(kCpu, a.t(), b.t(), logits.t(), targets.t(), s);
  };
  expect_error([&] { shard_forward(VocabShard{8, 5, 12}); }, {"cross_entropy_shard_forward", "[8, 13) of 12 ids"});
  expect_error([&] { shard_forward(VocabShard{0, 5, 12}); }, {"does not fit logits (2, 4)"});
}

}  // namespace tessera
