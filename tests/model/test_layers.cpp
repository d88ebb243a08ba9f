// Tests model/layers.h's positions through a sequence layout: the learned position embedding
// (Embedding) and RoPE (Rope) applied through a two-chunk layout (context parallelism's
// load-balanced chunks [0, 4) and [12, 16) of 16) give exactly the rows of the full-sequence
// result at those positions, forward and backward: the same kernels on the same rows.
#include "model/layers.h"

#include <gtest/gtest.h>

#include <vector>

#include "error_testing.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;
namespace {

constexpr int64_t kB = 2, kT = 16, kC = 8;

const SequenceLayout& two_chunks() {
  static const SequenceLayout s = SequenceLayout::load_balanced(kT, 2, 0);  // [0, 4) [12, 16)
  return s;
}

// local (B, T_local, ...) = the rows of full (B, T, ...) at the layout's positions.
template <typename E>
HostTensor<E> gather_rows(const HostTensor<E>& full, const SequenceLayout& seq) {
  Shape s = full.shape();
  const int64_t B = s[0], T = s[1], inner = full.numel() / (B * T);
  s[1] = seq.length();
  HostTensor<E> local(s);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < seq.length(); ++r)
      for (int64_t i = 0; i < inner; ++i)
        local[(b * seq.length() + r) * inner + i] = full[(b * T + seq.position(r)) * inner + i];
  return local;
}

// The inverse: full rows at the layout's positions from local, zero elsewhere.
HostTensor<float> scatter_rows(const HostTensor<float>& local, const SequenceLayout& seq, int64_t T) {
  Shape s = local.shape();
  const int64_t B = s[0], Tl = s[1], inner = local.numel() / (B * Tl);
  s[1] = T;
  HostTensor<float> full(s);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < Tl; ++r)
      for (int64_t i = 0; i < inner; ++i) full[(b * T + seq.position(r)) * inner + i] = local[(b * Tl + r) * inner + i];
  return full;
}

std::vector<float> values(const Tensor& t) { return {t.ptr<float>(), t.ptr<float>() + t.numel()}; }

TEST(Positions, LearnedEmbeddingThroughTwoChunksEqualsTheFullSequenceRows) {
  ModelConfig raw;
  raw.preset = "gpt2";
  raw.vocab_size = 13;
  raw.n_layer = 1;
  raw.n_head = 2;
  raw.n_embd = kC;
  raw.max_seq_len = kT;
  const ModelConfig cfg = resolve(raw);
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  const Embedding emb(ps, cfg, TensorParallel{});
  ps.finalize();
  ps.initialize(kCpu, 5);

  const SequenceLayout& seq = two_chunks();
  const SequenceLayout whole = SequenceLayout::contiguous(kT);
  const auto tokens = testing::random_ids({kB, kT}, 13, 3);
  const auto local_tokens = gather_rows(tokens, seq);
  HostTensor<float> full_out({kB, kT, kC}), local_out({kB, seq.length(), kC});
  emb.forward(kCpu, alloc, full_out.t(), tokens.t(), whole);
  emb.forward(kCpu, alloc, local_out.t(), local_tokens.t(), seq);
  EXPECT_EQ(local_out.vec(), gather_rows(full_out, seq).vec());

  // Backward: the gradient of the held rows only equals the full sequence's with zero elsewhere.
  const auto dlocal = HostTensor<float>::uniform({kB, seq.length(), kC}, 4);
  ps.zero_grads(kCpu);
  emb.backward(kCpu, alloc, dlocal.t(), local_tokens.t(), seq);
  const std::vector<float> through_layout = values(ps.flat_grads());
  ps.zero_grads(kCpu);
  emb.backward(kCpu, alloc, scatter_rows(dlocal, seq, kT).t(), tokens.t(), whole);
  EXPECT_EQ(through_layout, values(ps.flat_grads()));
  // Rows of wpe at positions the layout does not hold got no gradient.
  const Tensor dwpe = ps.grad(ps.find("wpe.weight"));
  for (int64_t p = 4; p < 12; ++p)
    for (int64_t c = 0; c < kC; ++c) ASSERT_EQ(dwpe.ptr<float>()[p * kC + c], 0.0f) << "position " << p;

  EXPECT_TRUE(testing::throws_with([&] { emb.forward(kCpu, alloc, local_out.t(), tokens.t(), seq); },
                                   {"Embedding::forward", "(2, 16)", "[0, 4) [12, 16)"}));
}

TEST(Positions, RopeThroughTwoChunksEqualsTheFullSequenceRows) {
  const Rope rope(10000.0);
  const SequenceLayout& seq = two_chunks();
  const SequenceLayout whole = SequenceLayout::contiguous(kT);
  const auto x = HostTensor<float>::uniform({kB, kT, 2, 4}, 6);  // (B, T, H, D)
  HostTensor<float> full_y({kB, kT, 2, 4});
  rope.forward(kCpu, full_y.t(), x.t(), whole);
  HostTensor<float> local_y = gather_rows(x, seq);
  rope.forward(kCpu, local_y.t(), local_y.t(), seq);  // in place
  EXPECT_EQ(local_y.vec(), gather_rows(full_y, seq).vec());

  const auto dy = HostTensor<float>::uniform({kB, kT, 2, 4}, 7);
  HostTensor<float> full_dx({kB, kT, 2, 4});
  rope.backward(kCpu, full_dx.t(), dy.t(), whole);
  HostTensor<float> local_dx(local_y.shape());
  rope.backward(kCpu, local_dx.t(), gather_rows(dy, seq).t(), seq);
  EXPECT_EQ(local_dx.vec(), gather_rows(full_dx, seq).vec());
  // Not the positions [0, 8): the second chunk's rows really are rotated as positions 12..15.
  HostTensor<float> shifted = gather_rows(x, seq);
  rope.forward(kCpu, shifted.t(), shifted.t(), SequenceLayout::contiguous(seq.length()));
  EXPECT_NE(shifted.vec(), local_y.vec());
}

}  // namespace
}  // namespace tessera
