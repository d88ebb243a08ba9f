// Tests kernels/embedding.h: known lookups, float vs double reference, finite differences, +=
// accumulation over repeated tokens, thread-count independence and the out-of-range errors.
#include <omp.h>

#include "kernels/embedding.h"
#include "op_testing.h"

namespace tessera {
using testing::expect_error;
using testing::float_rounded;
using testing::HostTensor;
using testing::kCpu;
namespace {

// B = 3, T = 5 over a vocabulary of V = 7: 15 tokens, so ids repeat and the scatter must add.
constexpr int64_t kB = 3, kT = 5, kV = 7, kP = 9;

// The tables of one case in dtype T.
template <typename T>
struct Tables {
  HostTensor<T> wte, wpe;
  Tables(int64_t C, uint64_t seed)
      : wte(float_rounded(HostTensor<double>::uniform({kV, C}, seed)).cast<T>()),
        wpe(float_rounded(HostTensor<double>::uniform({kP, C}, seed + 1)).cast<T>()) {}
};

}  // namespace

TEST(Embedding, ForwardLooksUpTokenAndPosition) {
  const int64_t C = 10, offset = 3;
  auto tokens = testing::random_ids({kB, kT}, kV, 300);
  Tables<double> tab(C, 301);
  HostTensor<double> out({kB, kT, C}), out_nopos({kB, kT, C});
  embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), tab.wpe.t(), offset);
  embedding_forward(kCpu, out_nopos.t(), tokens.t(), tab.wte.t(), Tensor(), offset);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t c = 0; c < C; ++c) {
        int64_t i = (b * kT + t) * C + c;
        double e = tab.wte[tokens[b * kT + t] * C + c];
        EXPECT_EQ(out[i], e + tab.wpe[(offset + t) * C + c]);
        EXPECT_EQ(out_nopos[i], e);
      }
}

TEST(Embedding, FloatForwardMatchesReference) {
  const int64_t C = 70;  // a SIMD tail
  auto tokens = testing::random_ids({kB, kT}, kV, 310);
  Tables<double> ref(C, 311);
  Tables<float> f32(C, 311);
  HostTensor<double> out({kB, kT, C});
  HostTensor<float> outf({kB, kT, C});
  embedding_forward(kCpu, out.t(), tokens.t(), ref.wte.t(), ref.wpe.t(), 4);
  embedding_forward(kCpu, outf.t(), tokens.t(), f32.wte.t(), f32.wpe.t(), 4);
  // One float addition of equal inputs: at most half an ulp, eps / 2 = 6e-8 relative.
  EXPECT_LT(testing::max_rel_error(outf, out), 1e-7);
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t C = 6, offset = 2;
  auto tokens = testing::random_ids({kB, kT}, kV, 320);
  Tables<double> tab(C, 321);
  auto r = HostTensor<double>::uniform({kB, kT, C}, 322);  // the loss weights: dout = r
  HostTensor<double> out({kB, kT, C}), dwte({kV, C}), dwpe({kP, C});
  embedding_backward(kCpu, dwte.t(), dwpe.t(), r.t(), tokens.t(), offset);
  auto loss = [&] {
    embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), tab.wpe.t(), offset);
    return testing::weighted_sum(out, r);
  };
  testing::expect_gradient_matches(loss, tab.wte, dwte, "wte");
  testing::expect_gradient_matches(loss, tab.wpe, dwpe, "wpe");
}

TEST(Embedding, FloatBackwardMatchesReferenceAndAccumulates) {
  const int64_t C = 150, offset = 1;  // three column blocks in the dwte scatter, the last partial
  auto tokens = testing::random_ids({kB, kT}, kV, 330);
  auto dout = float_rounded(HostTensor<double>::uniform({kB, kT, C}, 331));
  auto dwte0 = float_rounded(HostTensor<double>::uniform({kV, C}, 332));
  auto dwpe0 = float_rounded(HostTensor<double>::uniform({kP, C}, 333));
  // Double: the accumulated result is the old content plus the fresh gradient.
  HostTensor<double> dwte({kV, C}), dwpe({kP, C});
  embedding_backward(kCpu, dwte.t(), dwpe.t(), dout.t(), tokens.t(), offset);
  auto dwte_acc = dwte0, dwpe_acc = dwpe0;
  embedding_backward(kCpu, dwte_acc.t(), dwpe_acc.t(), dout.t(), tokens.t(), offset);
  for (int64_t i = 0; i < dwte.numel(); ++i) dwte[i] += dwte0[i];
  for (int64_t i = 0; i < dwpe.numel(); ++i) dwpe[i] += dwpe0[i];
  EXPECT_LT(testing::max_rel_error(dwte_acc, dwte), 1e-15);
  EXPECT_LT(testing::max_rel_error(dwpe_acc, dwpe), 1e-15);
  // Float, accumulating onto the same old content: each element adds at most B T = 15 floats, one
  // rounding each (<= 15 eps / 2 = 9e-7 relative to the summands, which are O(1) like the result).
  auto dwtef = dwte0.cast<float>(), dwpef = dwpe0.cast<float>();
  auto doutf = dout.cast<float>();
  embedding_backward(kCpu, dwtef.t(), dwpef.t(), doutf.t(), tokens.t(), offset);
  EXPECT_LT(testing::max_rel_error(dwtef, dwte_acc), 1e-6);
  EXPECT_LT(testing::max_rel_error(dwpef, dwpe_acc), 1e-6);
  // Row 0 of wpe lies before pos_offset = 1: it keeps its old content exactly.
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwpef[c], float(dwpe0[c]));
}

TEST(Embedding, BackwardWithoutPositionTable) {
  const int64_t C = 8;
  auto tokens = testing::random_ids({kB, kT}, kV, 340);
  auto dout = HostTensor<double>::uniform({kB, kT, C}, 341).cast<float>();
  HostTensor<float> a({kV, C}), b({kV, C}), dwpe({kP, C});
  embedding_backward(kCpu, a.t(), dwpe.t(), dout.t(), tokens.t(), 0);
  embedding_backward(kCpu, b.t(), Tensor(), dout.t(), tokens.t(), 1000);  // no wpe: pos_offset is unused
  EXPECT_EQ(a.vec(), b.vec());
}

TEST(Embedding, FloatBackwardIndependentOfThreadCount) {
  const int64_t C = 200;
  auto tokens = testing::random_ids({kB, kT}, kV, 350);
  auto dout = HostTensor<double>::uniform({kB, kT, C}, 351).cast<float>();
  auto grads = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    HostTensor<float> dwte({kV, C}), dwpe({kP, C});
    embedding_backward(kCpu, dwte.t(), dwpe.t(), dout.t(), tokens.t(), 2);
    omp_set_num_threads(saved);
    std::vector<float> all = dwte.vec();
    all.insert(all.end(), dwpe.vec().begin(), dwpe.vec().end());
    return all;
  };
  auto one = grads(1);
  EXPECT_EQ(one, grads(2));
  EXPECT_EQ(one, grads(3));
}

TEST(Embedding, RejectsOutOfRangeTokensAndPositions) {
  const int64_t C = 4;
  Tables<float> tab(C, 360);
  HostTensor<float> out({kB, kT, C});
  auto tokens = testing::random_ids({kB, kT}, kV, 361);
  tokens[1 * kT + 2] = kV;  // (b=1, t=2)
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), tab.wpe.t(), 0); },
               {"embedding_forward", "token id 7", "(b=1, t=2)", "[0, 7)"});
  expect_error([&] { embedding_backward(kCpu, tab.wte.t(), tab.wpe.t(), out.t(), tokens.t(), 0); },
               {"embedding_backward", "token id 7", "[0, 7)"});
  tokens[1 * kT + 2] = -3;
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), Tensor(), 0); },
               {"token id -3", "[0, 7)"});
  tokens[1 * kT + 2] = 0;
  // Positions 5 .. 9 with P = 9: position 9 is the first beyond the table.
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), tab.wpe.t(), kP - kT + 1); },
               {"embedding_forward", "position 9", "9 positions"});
  expect_error([&] { embedding_backward(kCpu, tab.wte.t(), tab.wpe.t(), out.t(), tokens.t(), kP - kT + 1); },
               {"embedding_backward", "position 9"});
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), tab.wpe.t(), -1); },
               {"pos_offset -1 is negative"});
  embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), tab.wpe.t(), kP - kT);  // the last valid offset
}

TEST(Embedding, RejectsBadShapesAndDtypes) {
  const int64_t C = 4;
  Tables<float> tab(C, 370);
  auto tokens = testing::random_ids({kB, kT}, kV, 371);
  HostTensor<float> out({kB, kT, C}), out_bad({kB * kT, C}), wpe_bad({kP, C + 1});
  HostTensor<float> tokens_f({kB, kT});
  HostTensor<double> out64({kB, kT, C});
  expect_error([&] { embedding_forward(kCpu, out_bad.t(), tokens.t(), tab.wte.t(), Tensor(), 0); },
               {"embedding_forward", "out", "(15, 4)", "(3, 5, 4)"});
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens_f.t(), tab.wte.t(), Tensor(), 0); }, {"tokens", "f32"});
  expect_error([&] { embedding_forward(kCpu, out64.t(), tokens.t(), tab.wte.t(), Tensor(), 0); }, {"out", "f64"});
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens.t(), tab.wte.t(), wpe_bad.t(), 0); }, {"wpe", "(9, 5)"});
  expect_error([&] { embedding_backward(kCpu, tab.wte.t(), wpe_bad.t(), out.t(), tokens.t(), 0); }, {"dwpe", "(9, 5)"});
}

// Vocabulary-parallel: V = 7 over 3 shards of ceil(7 / 3) = 3 rows (the last holds 1 id and 2
// padding rows). Shard outputs (positions added by shard 0 only) sum to the whole lookup; each
// shard's dwte is the slice of the whole dwte, its padding rows untouched.
TEST(Embedding, VocabShardsSumToTheWholeLookup) {
  const int64_t C = 6, parts = 3, rows = VocabShard::rows_per_part(kV, parts);
  Tables<double> whole(C, 700);
  auto tokens = testing::random_ids({kB, kT}, kV, 701);
  HostTensor<double> want({kB, kT, C}), sum({kB, kT, C});
  embedding_forward(kCpu, want.t(), tokens.t(), whole.wte.t(), whole.wpe.t(), 2);
  auto dout = HostTensor<double>::uniform({kB, kT, C}, 702);
  HostTensor<double> dwte({kV, C}), dwpe({kP, C});
  embedding_backward(kCpu, dwte.t(), dwpe.t(), dout.t(), tokens.t(), 2);
  for (int64_t r = 0; r < parts; ++r) {
    const VocabShard shard = VocabShard::of(kV, parts, r);
    HostTensor<double> table({rows, C}), out({kB, kT, C}), dtable({rows, C}, 5.0), dpos({kP, C});
    for (int64_t i = 0; i < shard.valid * C; ++i) table[i] = whole.wte[shard.start * C + i];
    embedding_forward(kCpu, out.t(), tokens.t(), table.t(), r == 0 ? whole.wpe.t() : Tensor(), 2, shard);
    for (int64_t i = 0; i < out.numel(); ++i) sum[i] += out[i];
    embedding_backward(kCpu, dtable.t(), dpos.t(), dout.t(), tokens.t(), 2, shard);
    for (int64_t i = 0; i < rows * C; ++i)
      EXPECT_DOUBLE_EQ(dtable[i], 5.0 + (i < shard.valid * C ? dwte[shard.start * C + i] : 0.0)) << "shard " << r;
    for (int64_t i = 0; i < dpos.numel(); ++i) EXPECT_DOUBLE_EQ(dpos[i], dwpe[i]);
  }
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(sum[i], want[i], 1e-15);
  // The float path agrees with the double one on a shard.
  const VocabShard shard = VocabShard::of(kV, parts, 1);
  HostTensor<float> table({rows, C}), out({kB, kT, C});
  HostTensor<double> ref({kB, kT, C});
  HostTensor<double> table64({rows, C});
  for (int64_t i = 0; i < shard.valid * C; ++i) table64[i] = whole.wte[shard.start * C + i];
  table = table64.cast<float>();
  embedding_forward(kCpu, out.t(), tokens.t(), table.t(), Tensor(), 0, shard);
  embedding_forward(kCpu, ref.t(), tokens.t(), table64.t(), Tensor(), 0, shard);
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_FLOAT_EQ(out[i], static_cast<float>(ref[i]));
  // Ids are checked against the whole vocabulary, not the shard.
  tokens[4] = static_cast<int32_t>(kV);
  expect_error([&] { embedding_forward(kCpu, out.t(), tokens.t(), table.t(), Tensor(), 0, shard); },
               {"embedding_forward", "token id 7", "[0, 7)"});
}

}  // namespace tessera
