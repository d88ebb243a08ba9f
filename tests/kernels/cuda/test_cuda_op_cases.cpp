// Every op test case (tests/kernels/op_cases.h) on the CUDA backend against the CPU's double
// reference, with the case's tolerance (each justified where the case is defined: float
// arithmetic, which the CUDA kernels share; cuBLASLt runs true fp32, no TF32), plus cases with the
// odd and larger shapes that reach the kernels' block and grid boundaries. Written outputs are
// NaN-filled before each call (OpRunner::out), so an unwritten element fails its comparison.
// Skipped (reported so by CTest) where no GPU is visible.
#include <string>

#include "gpu_testing.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "op_cases.h"

namespace tessera::testing {
namespace {

HostTensor<double> uniform(Shape s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return HostTensor<double>::uniform(s, seed, lo, hi);
}

// Shapes past the CUDA kernels' boundaries: rows longer than a block (256 threads), more rows
// than one chunk of the column sums (64) and than a block of the elementwise grid, a vocabulary
// of GPT-2's size, reductions over more than one grid's worth of elements, embeddings with long
// runs of one id (the sorted backward), GEMMs with no dimension a multiple of a tile, attention's
// merge over rows longer than a warp.
std::vector<OpCase> large_cases() {
  std::vector<OpCase> cases;
  // K = 519 products per element: ~sqrt(K) eps = 1.4e-6 typically, K eps = 3e-5 at worst; 2e-5
  // normwise, where an indexing bug is O(1).
  cases.push_back({"matmul_odd_large", 2e-5, [](OpRunner& r) {
    const int64_t M = 257, N = 131, K = 519;
    std::vector<OpOutput> outs;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = r.in(uniform(ta ? Shape{K, M} : Shape{M, K}, 101));
        const Tensor b = r.in(uniform(tb ? Shape{N, K} : Shape{K, N}, 102));
        const Tensor c = r.in(uniform({M, N}, 103));
        matmul(r.ex(), c, a, b, ta, tb, 1.0, 0.5);
        outs.push_back({std::string("c_") + (ta ? "t" : "n") + (tb ? "t" : "n"), r.read(c)});
      }
    return outs;
  }});
  // As matmul_odd_large: In = 389 products (plus the bias; dw sums N = 300 rows, dbias in double).
  cases.push_back({"linear_odd_large", 2e-5, [](OpRunner& r) {
    const Tensor x = r.in(uniform({3, 100, 389}, 104)), w = r.in(uniform({195, 389}, 105));
    const Tensor b = r.in(uniform({195}, 106)), y = r.out({3, 100, 195});
    linear_forward(r.ex(), y, x, w, b);
    const Tensor dy = r.in(uniform({3, 100, 195}, 107)), dx = r.out({3, 100, 389});
    const Tensor dw = r.in(uniform({195, 389}, 108)), db = r.in(uniform({195}, 109));
    linear_backward(r.ex(), dx, dw, db, dy, x, w);
    return std::vector<OpOutput>{{"y", r.read(y)}, {"dx", r.read(dx)}, {"dw", r.read(dw)}, {"dbias", r.read(db)}};
  }});
  // C = 1029 (four strides of a 256-thread block plus a tail), N = 200 rows (four column-sum
  // chunks): row sums of ~1000 floats, ~sqrt(C) eps = 2e-6 each, through the backward's
  // cancellations; 1e-5 (the small cases' 5e-6 scaled by sqrt(1029 / 130) ~ 2.8).
  cases.push_back({"layernorm_large", 1e-5, [](OpRunner& r) {
    const Tensor x = r.in(uniform({200, 1029}, 110, -2, 2)), w = r.in(uniform({1029}, 111, 0.5, 1.5));
    const Tensor b = r.in(uniform({1029}, 112)), dy = r.in(uniform({200, 1029}, 113));
    const Tensor y = r.out({200, 1029}), mean = r.out({200}), rstd = r.out({200});
    layernorm_forward(r.ex(), y, mean, rstd, x, w, b, 1e-5);
    const Tensor dx = r.in(uniform({200, 1029}, 114)), dw = r.in(uniform({1029}, 115)), db = r.in(uniform({1029}, 116));
    layernorm_backward(r.ex(), dx, dw, db, dy, x, w, mean, rstd);
    return std::vector<OpOutput>{{"y", r.read(y)}, {"mean", r.read(mean)}, {"rstd", r.read(rstd)},
                                 {"dx", r.read(dx)}, {"dw", r.read(dw)}, {"db", r.read(db)}};
  }});
  // As layernorm_large.
  cases.push_back({"rmsnorm_large", 1e-5, [](OpRunner& r) {
    const Tensor x = r.in(uniform({200, 1029}, 117, -2, 2)), w = r.in(uniform({1029}, 118, 0.5, 1.5));
    const Tensor dy = r.in(uniform({200, 1029}, 119));
    const Tensor y = r.out({200, 1029}), rstd = r.out({200});
    rmsnorm_forward(r.ex(), y, rstd, x, w, 1e-5);
    const Tensor dx = r.in(uniform({200, 1029}, 120)), dw = r.in(uniform({1029}, 121));
    rmsnorm_backward(r.ex(), dx, dw, dy, x, w, rstd);
    return std::vector<OpOutput>{{"y", r.read(y)}, {"rstd", r.read(rstd)}, {"dx", r.read(dx)}, {"dw", r.read(dw)}};
  }});
  // Elementwise, as the small cases (2e-6 and 5e-6), over an odd number of elements.
  cases.push_back({"activations_large", 5e-6, [](OpRunner& r) {
    const int64_t n = 400009;  // 1563 blocks of 256 threads, the last one partly filled
    const Tensor x = r.in(uniform({n}, 122, -6, 6)), u = r.in(uniform({n}, 123, -2, 2)), dy = r.in(uniform({n}, 124));
    const Tensor y = r.out({n}), dx = r.out({n}), s = r.out({n}), dg = r.out({n}), du = r.out({n});
    gelu_forward(r.ex(), y, x);
    gelu_backward(r.ex(), dx, dy, x);
    swiglu_forward(r.ex(), s, x, u);
    swiglu_backward(r.ex(), dg, du, dy, x, u);
    return std::vector<OpOutput>{{"gelu", r.read(y)}, {"dgelu", r.read(dx)}, {"swiglu", r.read(s)},
                                 {"dgate", r.read(dg)}, {"dup", r.read(du)}};
  }});
  // Head dims 64 and 128, positions far into a sequence (angles in double): as rope_forward, 5e-7;
  // in place (y aliases x) for the backward.
  cases.push_back({"rope_head_dims", 5e-7, [](OpRunner& r) {
    std::vector<OpOutput> outs;
    for (int64_t D : {64, 128}) {
      const Tensor x = r.in(uniform({2, 37, 3, D}, 125 + uint64_t(D))), y = r.out({2, 37, 3, D});
      rope_forward(r.ex(), y, x, 4000, 10000.0);
      rope_backward(r.ex(), x, x, 4000, 500000.0);
      outs.push_back({"y_d" + std::to_string(D), r.read(y)});
      outs.push_back({"dx_d" + std::to_string(D), r.read(x)});
    }
    return outs;
  }});
  // GPT-2's vocabulary (50257 columns, 196 per thread) over 9 rows: the forward's double sums as
  // the small case (1e-6); the gradient (in place) as cross_entropy_backward (3e-6).
  cases.push_back({"cross_entropy_gpt2_vocab", 3e-6, [](OpRunner& r) {
    const int64_t N = 9, V = 50257;
    const Tensor logits = r.in(uniform({N, V}, 130, -4, 4));
    HostTensor<int32_t> t = random_ids({N}, static_cast<int32_t>(V), 131);
    t[4] = kIgnoreIndex;
    t[0] = static_cast<int32_t>(V - 1);
    const Tensor targets = r.ids(t);
    const Tensor losses = r.out({N}), lse = r.out({N});
    cross_entropy_forward(r.ex(), losses, lse, logits, targets);
    cross_entropy_backward(r.ex(), logits, logits, lse, targets, 1.0 / 8);
    return std::vector<OpOutput>{{"losses", r.read(losses)}, {"lse", r.read(lse)}, {"dlogits", r.read(logits)}};
  }});
  // B T = 900 positions over 13 ids (runs of ~70 of one id in the sorted backward), C = 300 (more
  // columns than threads): each gradient element adds ~70 floats, ~70 eps / 2 = 4e-6 at worst.
  // 5e-6; the forward is one addition (1e-7 would do; the case's bound covers both).
  cases.push_back({"embedding_long_runs", 5e-6, [](OpRunner& r) {
    const Tensor tokens = r.ids(random_ids({3, 300}, 13, 132));
    const Tensor wte = r.in(uniform({13, 300}, 133)), wpe = r.in(uniform({310, 300}, 134));
    const Tensor out = r.out({3, 300, 300});
    embedding_forward(r.ex(), out, tokens, wte, wpe, 7);
    const Tensor dout = r.in(uniform({3, 300, 300}, 135));
    const Tensor dwte = r.in(uniform({13, 300}, 136)), dwpe = r.in(uniform({310, 300}, 137));
    embedding_backward(r.ex(), dwte, dwpe, dout, tokens, 7);
    return std::vector<OpOutput>{{"out", r.read(out)}, {"dwte", r.read(dwte)}, {"dwpe", r.read(dwpe)}};
  }});
  // attention_merge over 2 x 301 x 3 rows (451.5 blocks of 4: the last one partly filled) of
  // D = 128 (each lane 4 elements), -inf rows as the small case: its tolerance (1e-7).
  cases.push_back(attention_merge_case("attention_merge_large", {2, 301, 3, 128}, 141));
  // 1,000,003 float-rounded values summed in double over 1024 partials: reassociation only,
  // ~n 1e-16 = 1e-10 at worst. 1e-9. The count is exact.
  cases.push_back({"reductions_large", 1e-9, [](OpRunner& r) {
    const int64_t n = 1000003;
    const Tensor t = r.in(uniform({n}, 138));
    const Tensor out = r.f64_out({3});
    sum(r.ex(), out.slice_rows(0, 1), t);
    squared_norm(r.ex(), out.slice_rows(1, 2), t);
    HostTensor<int32_t> ids = random_ids({n}, 5, 139);
    count_not_equal(r.ex(), out.slice_rows(2, 3), r.ids(ids), 3);
    return std::vector<OpOutput>{{"sum", r.read(out.slice_rows(0, 1))},
                                 {"squared_norm", r.read(out.slice_rows(1, 2))},
                                 {"count_not_equal", r.read(out.slice_rows(2, 3))}};
  }});
  return cases;
}

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> c = op_cases();
    for (OpCase& l : large_cases()) c.push_back(std::move(l));
    return c;
  }();
  return cases;
}

class OnCuda : public ::testing::TestWithParam<size_t> {};

// The case on the CUDA backend; skips, naming the op, where an op of the case has no CUDA kernel,
// so such a case never reads as passed.
#define RUN_ON_CUDA_OR_SKIP(outs, c)                                                        \
  std::vector<OpOutput> outs;                                                               \
  try {                                                                                     \
    outs = run_case(c, cuda_backend());                                                     \
  } catch (const Error& e) {                                                                \
    if (std::string(e.what()).find("no CUDA implementation") == std::string::npos) throw; \
    GTEST_SKIP() << e.what();                                                               \
  }

// Within the case's tolerance of the reference, and deterministic: a second run gives the same
// bits (no float atomics anywhere).
TEST_P(OnCuda, MatchesTheCpuReferenceDeterministically) {
  TESSERA_REQUIRE_GPU();
  const OpCase& c = all_cases()[GetParam()];
  RUN_ON_CUDA_OR_SKIP(got, c);
  const std::vector<OpOutput> want = run_case(c, reference_backend());
  const std::vector<OpOutput> again = run_case(c, cuda_backend());
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(again.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_LE(max_rel_error(got[i].values, want[i].values), c.tolerance) << c.name << ": output " << got[i].name;
    EXPECT_EQ(again[i].values.vec(), got[i].values.vec()) << c.name << ": output " << got[i].name << " differs between runs";
  }
}

INSTANTIATE_TEST_SUITE_P(CudaOpCases, OnCuda, ::testing::Range<size_t>(0, all_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return all_cases()[info.param].name; });

}  // namespace
}  // namespace tessera::testing
