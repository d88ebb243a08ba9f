// The op test cases of every family (op_cases.h), each with its tolerance for a float backend
// against the double reference, justified by the rounding it does (eps = 2^-24 ~ 6e-8, the
// float unit roundoff; inputs are float-rounded, so only arithmetic differs).
#include "op_cases.h"

#include <limits>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace tessera::testing {

// ---- OpRunner ----

namespace {
template <typename T>
Tensor upload_as(const Exec& ex, Allocator& alloc, std::vector<Buffer>& keep, const HostTensor<double>& x) {
  std::vector<T> host(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) host[static_cast<size_t>(i)] = static_cast<T>(static_cast<float>(x[i]));
  keep.push_back(upload(ex, alloc, Tensor(host.data(), dtype_of<T>(), x.shape()), MemCategory::Workspace));
  return keep.back();
}

template <typename T>
HostTensor<double> read_as(const Exec& ex, const Tensor& t) {
  std::vector<T> host(static_cast<size_t>(t.numel()));
  copy(ex, Tensor(host.data(), dtype_of<T>(), t.shape), t);
  synchronize(ex);
  HostTensor<double> out(t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<double>(host[static_cast<size_t>(i)]);
  return out;
}
}  // namespace

Tensor OpRunner::in(const HostTensor<double>& x) {
  if (dtype_ == DType::F64) return upload_as<double>(ex_, alloc_, buffers_, x);
  return upload_as<float>(ex_, alloc_, buffers_, x);
}

Tensor OpRunner::ids(const HostTensor<int32_t>& x) {
  buffers_.push_back(upload(ex_, alloc_, x.t(), MemCategory::Workspace));
  return buffers_.back();
}

Tensor OpRunner::zeros(Shape s) {
  buffers_.emplace_back(alloc_, dtype_, s, MemCategory::Workspace);
  return buffers_.back();
}

Tensor OpRunner::f64_zeros(Shape s) {
  buffers_.emplace_back(alloc_, DType::F64, s, MemCategory::Workspace);
  return buffers_.back();
}

namespace {
template <typename T>
Tensor nan_filled(const Exec& ex, Allocator& alloc, std::vector<Buffer>& keep, Shape s) {
  std::vector<T> host(static_cast<size_t>(s.numel()), std::numeric_limits<T>::quiet_NaN());
  keep.push_back(upload(ex, alloc, Tensor(host.data(), dtype_of<T>(), s), MemCategory::Workspace));
  return keep.back();
}
}  // namespace

Tensor OpRunner::out(Shape s) {
  if (dtype_ == DType::F64) return nan_filled<double>(ex_, alloc_, buffers_, s);
  return nan_filled<float>(ex_, alloc_, buffers_, s);
}

Tensor OpRunner::f64_out(Shape s) { return nan_filled<double>(ex_, alloc_, buffers_, s); }

HostTensor<double> OpRunner::read(const Tensor& t) {
  switch (t.dtype) {
    case DType::F64: return read_as<double>(ex_, t);
    case DType::F32: return read_as<float>(ex_, t);
    case DType::I32: return read_as<int32_t>(ex_, t);
    default: break;
  }
  ADD_FAILURE() << "OpRunner::read: no host type for " << t.str();
  return HostTensor<double>(t.shape);
}

// ---- Backends ----

std::vector<BackendUnderTest> backends_under_test() { return {{"cpu_f32", Device::cpu(), DType::F32}}; }

BackendUnderTest cuda_backend() { return {"cuda_f32", Device::cuda(0), DType::F32}; }

BackendUnderTest reference_backend() { return {"cpu_f64_reference", Device::cpu(), DType::F64}; }

std::vector<OpOutput> run_case(const OpCase& c, const BackendUnderTest& b) {
  Allocator alloc(b.device);
  OpRunner r(Exec{b.device}, alloc, b.dtype);
  std::vector<OpOutput> outs = c.run(r);
  synchronize(r.ex());  // every queued op has finished before the buffers go
  return outs;
}

// ---- Cases ----

namespace {

HostTensor<double> uniform(Shape s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return HostTensor<double>::uniform(s, seed, lo, hi);
}

// Targets (N) in [0, V) with kIgnoreIndex at the given rows.
HostTensor<int32_t> targets_with_ignored(int64_t N, int32_t V, uint64_t seed, std::initializer_list<int64_t> ignored) {
  HostTensor<int32_t> t = random_ids({N}, V, seed);
  for (int64_t n : ignored) t[n] = kIgnoreIndex;
  return t;
}

}  // namespace

// The merge's weights are two exps and a log of lse differences, computed in double on every
// backend from the same float-rounded inputs; a float backend rounds each result once: 2^-24 =
// 6e-8 of the row's magnitude. 1e-7. lse in [-20, 20): some rows dominated by one side (weights
// down to e^-40), most mixed. Rows r with r % 5 == 1 have lse = -inf (and out = 0, as the forward
// leaves a row that saw no key), rows with r % 7 == 2 block_lse = -inf (the block saw no key: the
// row must stay as it is, whatever block_out holds), rows with both (r = 16, 51, ...) stay -inf.
OpCase attention_merge_case(const std::string& name, Shape shape, uint64_t seed) {
  return {name, 1e-7, [shape, seed](OpRunner& r) {
    const int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3];
    HostTensor<double> out = uniform(shape, seed), block_out = uniform(shape, seed + 1);
    HostTensor<double> lse = uniform({B, H, T}, seed + 2, -20, 20), block_lse = uniform({B, H, T}, seed + 3, -20, 20);
    const double inf = std::numeric_limits<double>::infinity();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = (b * T + t) * H + h, l = (b * H + h) * T + t;
          if (row % 5 == 1) {
            lse[l] = -inf;
            for (int64_t d = 0; d < D; ++d) out[row * D + d] = 0;
          }
          if (row % 7 == 2) block_lse[l] = -inf;
        }
    const Tensor o = r.in(out), l = r.in(lse);
    attention_merge(r.ex(), o, l, r.in(block_out), r.in(block_lse));
    return std::vector<OpOutput>{{"out", r.read(o)}, {"lse", r.read(l)}};
  }};
}

namespace {

std::vector<OpCase> make_cases() {
  std::vector<OpCase> cases;

  // ---- matmul.h ----

  // Dot products of K = 33 float products: the rounding errors add up to at most K eps = 2e-6
  // of the row's scale (worst case; ~sqrt(K) eps typically), plus the alpha/beta terms' two
  // roundings. 1e-5, as test_matmul.cpp; an indexing bug shows as O(1).
  cases.push_back({"matmul", 1e-5, [](OpRunner& r) {
    const int64_t M = 9, N = 7, K = 33;
    std::vector<OpOutput> outs;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = r.in(uniform(ta ? Shape{K, M} : Shape{M, K}, 1));
        const Tensor b = r.in(uniform(tb ? Shape{N, K} : Shape{K, N}, 2));
        const Tensor c = r.in(uniform({M, N}, 3));
        matmul(r.ex(), c, a, b, ta, tb, 0.5, 0.25);
        outs.push_back({std::string("c_") + (ta ? "t" : "n") + (tb ? "t" : "n"), r.read(c)});
      }
    return outs;
  }});
  // As matmul: In = 33 products per output, plus the bias.
  cases.push_back({"linear_forward", 1e-5, [](OpRunner& r) {
    const Tensor x = r.in(uniform({2, 5, 33}, 4)), w = r.in(uniform({17, 33}, 5)), b = r.in(uniform({17}, 6));
    const Tensor y = r.out({2, 5, 17});
    linear_forward(r.ex(), y, x, w, b);
    return std::vector<OpOutput>{{"y", r.read(y)}};
  }});
  // dx: Out = 17 products per element; dw: N = 10 products added to the old value; dbias: summed
  // in double, one rounding. All within matmul's bound: 1e-5.
  cases.push_back({"linear_backward", 1e-5, [](OpRunner& r) {
    const Tensor x = r.in(uniform({2, 5, 33}, 7)), w = r.in(uniform({17, 33}, 8)), dy = r.in(uniform({2, 5, 17}, 9));
    const Tensor dx = r.in(uniform({2, 5, 33}, 10));  // written: stale content must not matter
    const Tensor dw = r.in(uniform({17, 33}, 11)), db = r.in(uniform({17}, 12));  // accumulated
    linear_backward(r.ex(), dx, dw, db, dy, x, w);
    return std::vector<OpOutput>{{"dx", r.read(dx)}, {"dw", r.read(dw)}, {"dbias", r.read(db)}};
  }});

  // ---- layernorm.h, rmsnorm.h ----

  // C = 67 (a SIMD tail): the row sums err by ~sqrt(C) eps = 5e-7 (worst C eps = 4e-6); x - mean
  // of O(1) inputs does not amplify that much. 5e-6 normwise, as test_layernorm.cpp.
  cases.push_back({"layernorm_forward", 5e-6, [](OpRunner& r) {
    const Tensor x = r.in(uniform({2, 3, 67}, 13, -2, 2)), w = r.in(uniform({67}, 14, 0.5, 1.5));
    const Tensor b = r.in(uniform({67}, 15));
    const Tensor y = r.out({2, 3, 67}), mean = r.out({6}), rstd = r.out({6});
    layernorm_forward(r.ex(), y, mean, rstd, x, w, b, 1e-5);
    return std::vector<OpOutput>{{"y", r.read(y)}, {"mean", r.read(mean)}, {"rstd", r.read(rstd)}};
  }});
  // C = 130 (three column blocks of the dw/db reduction): row sums of float products (~7e-7) on
  // top of the forward's errors in mean and rstd (5e-6); dw and db sum in double. 5e-6.
  cases.push_back({"layernorm_backward", 5e-6, [](OpRunner& r) {
    const Tensor x = r.in(uniform({12, 130}, 16, -2, 2)), w = r.in(uniform({130}, 17, 0.5, 1.5));
    const Tensor b = r.in(uniform({130}, 18)), dy = r.in(uniform({12, 130}, 19));
    const Tensor y = r.out({12, 130}), mean = r.out({12}), rstd = r.out({12});
    layernorm_forward(r.ex(), y, mean, rstd, x, w, b, 1e-5);
    const Tensor dx = r.in(uniform({12, 130}, 20)), dw = r.in(uniform({130}, 21)), db = r.in(uniform({130}, 22));
    layernorm_backward(r.ex(), dx, dw, db, dy, x, w, mean, rstd);
    return std::vector<OpOutput>{{"dx", r.read(dx)}, {"dw", r.read(dw)}, {"db", r.read(db)}};
  }});
  // A sum of C positive squares: ~sqrt(C) eps = 5e-7, halved by the square root, plus y's two
  // roundings; no cancellation. 2e-6, as test_rmsnorm.cpp.
  cases.push_back({"rmsnorm_forward", 2e-6, [](OpRunner& r) {
    const Tensor x = r.in(uniform({6, 67}, 23, -2, 2)), w = r.in(uniform({67}, 24, 0.5, 1.5));
    const Tensor y = r.out({6, 67}), rstd = r.out({6});
    rmsnorm_forward(r.ex(), y, rstd, x, w, 1e-5);
    return std::vector<OpOutput>{{"y", r.read(y)}, {"rstd", r.read(rstd)}};
  }});
  // dx: a row sum of C = 130 products (~7e-7), cancelling by a few in g - xhat mean(g xhat), plus
  // rstd's error: 5e-6; dw sums in double. As test_rmsnorm.cpp.
  cases.push_back({"rmsnorm_backward", 5e-6, [](OpRunner& r) {
    const Tensor x = r.in(uniform({12, 130}, 25, -2, 2)), w = r.in(uniform({130}, 26, 0.5, 1.5));
    const Tensor dy = r.in(uniform({12, 130}, 27));
    const Tensor y = r.out({12, 130}), rstd = r.out({12});
    rmsnorm_forward(r.ex(), y, rstd, x, w, 1e-5);
    const Tensor dx = r.in(uniform({12, 130}, 28)), dw = r.in(uniform({130}, 29));
    rmsnorm_backward(r.ex(), dx, dw, dy, x, w, rstd);
    return std::vector<OpOutput>{{"dx", r.read(dx)}, {"dw", r.read(dw)}};
  }});

  // ---- gelu.h, swiglu.h, rope.h ----

  // A well-conditioned formula of a few roundings (the float tanh is a polynomial within a few
  // ulps): ~1e-6 relative. 2e-6, as test_gelu.cpp.
  cases.push_back({"gelu_forward", 2e-6, [](OpRunner& r) {
    const Tensor x = r.in(uniform({4, 37}, 30, -4, 4)), y = r.out({4, 37});
    gelu_forward(r.ex(), y, x);
    return std::vector<OpOutput>{{"y", r.read(y)}};
  }});
  cases.push_back({"gelu_backward", 2e-6, [](OpRunner& r) {
    const Tensor x = r.in(uniform({4, 37}, 31, -4, 4)), dy = r.in(uniform({4, 37}, 32));
    const Tensor dx = r.out({4, 37});
    gelu_backward(r.ex(), dx, dy, x);
    return std::vector<OpOutput>{{"dx", r.read(dx)}};
  }});
  // exp within an ulp or two, one add, one divide, two multiplies, for |gate| <= 6: ~6 eps. 2e-6.
  cases.push_back({"swiglu_forward", 2e-6, [](OpRunner& r) {
    const Tensor g = r.in(uniform({6, 45}, 33, -6, 6)), u = r.in(uniform({6, 45}, 34, -2, 2));
    const Tensor y = r.out({6, 45});
    swiglu_forward(r.ex(), y, g, u);
    return std::vector<OpOutput>{{"y", r.read(y)}};
  }});
  // As the forward; 1 - sig and 1 + g (1 - sig) lose a few bits for |g| <= 6. 5e-6.
  cases.push_back({"swiglu_backward", 5e-6, [](OpRunner& r) {
    const Tensor g = r.in(uniform({7, 33}, 35, -6, 6)), u = r.in(uniform({7, 33}, 36, -2, 2));
    const Tensor dy = r.in(uniform({7, 33}, 37));
    const Tensor dg = r.out({7, 33}), du = r.out({7, 33});
    swiglu_backward(r.ex(), dg, du, dy, g, u);
    return std::vector<OpOutput>{{"dgate", r.read(dg)}, {"dup", r.read(du)}};
  }});
  // Angles in double, cos/sin rounded once; two products and a sum per output: a few ulps. 5e-7.
  cases.push_back({"rope_forward", 5e-7, [](OpRunner& r) {
    const Tensor x = r.in(uniform({2, 9, 3, 10}, 38)), y = r.out({2, 9, 3, 10});
    rope_forward(r.ex(), y, x, 5, 10000.0);
    return std::vector<OpOutput>{{"y", r.read(y)}};
  }});
  cases.push_back({"rope_backward", 5e-7, [](OpRunner& r) {
    const Tensor dy = r.in(uniform({2, 9, 3, 10}, 39)), dx = r.out({2, 9, 3, 10});
    rope_backward(r.ex(), dx, dy, 5, 10000.0);
    return std::vector<OpOutput>{{"dx", r.read(dx)}};
  }});

  // ---- attention.h ----

  // Grouped-query (H = 4, KV = 2), queries at positions 64..69 over keys 0..69 (a chunk of a
  // longer sequence: every row sees 65 or more keys, two key tiles). Scores are D-term dot
  // products; out is a convex combination of <= S rows and the gradients sums of <= G T terms:
  // n eps with n <= 140 is ~8e-6. 3e-5, as test_attention.cpp.
  auto attention_inputs = [](OpRunner& r, uint64_t seed) {
    struct In {
      Tensor q, k, v;
    };
    return In{r.in(uniform({2, 6, 4, 8}, seed)), r.in(uniform({2, 70, 2, 8}, seed + 1)),
              r.in(uniform({2, 70, 2, 8}, seed + 2))};
  };
  cases.push_back({"attention_forward", 3e-5, [attention_inputs](OpRunner& r) {
    const auto in = attention_inputs(r, 40);
    const Tensor out = r.zeros({2, 6, 4, 8}), lse = r.zeros({2, 4, 6});
    attention_forward(r.ex(), out, lse, in.q, in.k, in.v, 64, 0);
    return std::vector<OpOutput>{{"out", r.read(out)}, {"lse", r.read(lse)}};
  }});
  cases.push_back({"attention_backward", 3e-5, [attention_inputs](OpRunner& r) {
    const auto in = attention_inputs(r, 43);
    const Tensor out = r.zeros({2, 6, 4, 8}), lse = r.zeros({2, 4, 6});
    attention_forward(r.ex(), out, lse, in.q, in.k, in.v, 64, 0);
    const Tensor dout = r.in(uniform({2, 6, 4, 8}, 46));
    const Tensor dq = r.in(uniform({2, 6, 4, 8}, 47));  // all three accumulated
    const Tensor dk = r.in(uniform({2, 70, 2, 8}, 48)), dv = r.in(uniform({2, 70, 2, 8}, 49));
    attention_backward(r.ex(), dq, dk, dv, dout, in.q, in.k, in.v, out, lse, 64, 0);
    return std::vector<OpOutput>{{"dq", r.read(dq)}, {"dk", r.read(dk)}, {"dv", r.read(dv)}};
  }});

  cases.push_back(attention_merge_case("attention_merge", {2, 9, 3, 40}, 140));  // D > 32: lanes loop

  // ---- embedding.h ----

  // One float addition of two equal inputs: eps / 2 = 6e-8. 1e-7, as test_embedding.cpp.
  cases.push_back({"embedding_forward", 1e-7, [](OpRunner& r) {
    const Tensor tokens = r.ids(random_ids({2, 5}, 11, 50));
    const Tensor wte = r.in(uniform({11, 12}, 51)), wpe = r.in(uniform({9, 12}, 52));
    const Tensor out = r.out({2, 5, 12});
    embedding_forward(r.ex(), out, tokens, wte, wpe, 3);
    return std::vector<OpOutput>{{"out", r.read(out)}};
  }});
  // Each gradient element adds at most B T = 10 floats to its old value, one rounding each:
  // <= 10 eps / 2 = 6e-7 of the O(1) scale. 1e-6, as test_embedding.cpp.
  cases.push_back({"embedding_backward", 1e-6, [](OpRunner& r) {
    const Tensor tokens = r.ids(random_ids({2, 5}, 11, 53));
    const Tensor dout = r.in(uniform({2, 5, 12}, 54));
    const Tensor dwte = r.in(uniform({11, 12}, 55)), dwpe = r.in(uniform({9, 12}, 56));
    embedding_backward(r.ex(), dwte, dwpe, dout, tokens, 3);
    return std::vector<OpOutput>{{"dwte", r.read(dwte)}, {"dwpe", r.read(dwpe)}};
  }});
  // Vocabulary-parallel: a table of 6 rows holding ids [6, 11) of 11 (one padding row); ids held
  // elsewhere give zero rows and no gradient. Copies and additions as above: 1e-6.
  cases.push_back({"embedding_vocab_shard", 1e-6, [](OpRunner& r) {
    const VocabShard shard = VocabShard::of(11, 2, 1);
    const Tensor tokens = r.ids(random_ids({2, 5}, 11, 57));
    const Tensor wte = r.in(uniform({6, 12}, 58)), out = r.out({2, 5, 12});
    embedding_forward(r.ex(), out, tokens, wte, Tensor(), 0, shard);
    const Tensor dout = r.in(uniform({2, 5, 12}, 59)), dwte = r.in(uniform({6, 12}, 60));
    embedding_backward(r.ex(), dwte, Tensor(), dout, tokens, 0, shard);
    return std::vector<OpOutput>{{"out", r.read(out)}, {"dwte", r.read(dwte)}};
  }});

  // ---- cross_entropy.h ----

  // Float exps of |x - max| <= 8 err by ~8 eps / 2 each; the double sum and the log turn that into
  // ~6e-7 absolute in lse (~6) and the losses. 1e-6, as test_cross_entropy.cpp.
  cases.push_back({"cross_entropy_forward", 1e-6, [](OpRunner& r) {
    const Tensor logits = r.in(uniform({7, 29}, 61, -4, 4));
    const Tensor targets = r.ids(targets_with_ignored(7, 29, 62, {2}));
    const Tensor losses = r.out({7}), lse = r.out({7});
    cross_entropy_forward(r.ex(), losses, lse, logits, targets);
    return std::vector<OpOutput>{{"losses", r.read(losses)}, {"lse", r.read(lse)}};
  }});
  // exp(x - lse) with lse stored rounded (~5e-7) and x - lse rounded again: ~1.2e-6 per
  // probability, a few ulps more with exp's own. 3e-6, as test_cross_entropy.cpp.
  cases.push_back({"cross_entropy_backward", 3e-6, [](OpRunner& r) {
    const Tensor logits = r.in(uniform({7, 29}, 63, -4, 4));
    const Tensor targets = r.ids(targets_with_ignored(7, 29, 64, {0, 5}));
    const Tensor losses = r.out({7}), lse = r.out({7});
    cross_entropy_forward(r.ex(), losses, lse, logits, targets);
    const Tensor dlogits = r.in(uniform({7, 29}, 65));  // written
    cross_entropy_backward(r.ex(), dlogits, logits, lse, targets, 0.25);
    return std::vector<OpOutput>{{"dlogits", r.read(dlogits)}};
  }});
  // Two ranks' shards of V = 29 (15 columns each, the second with one padding column): the
  // partial log-sum-exps as the forward's (1e-6), combined in double, and the backward's
  // gradient as above (3e-6).
  cases.push_back({"cross_entropy_vocab_shards", 3e-6, [](OpRunner& r) {
    const int64_t N = 7, R = 2, cols = 15;
    const HostTensor<double> whole = uniform({N, 29}, 66, -4, 4);
    const Tensor targets = r.ids(targets_with_ignored(N, 29, 67, {3}));
    const Tensor lse_parts = r.out({R, N}), target_logit = r.zeros({N});  // accumulated
    std::vector<Tensor> shard_logits;
    for (int64_t rank = 0; rank < R; ++rank) {
      const VocabShard s = VocabShard::of(29, R, rank);
      HostTensor<double> mine({N, cols});
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < s.valid; ++c) mine[n * cols + c] = whole[n * 29 + s.start + c];
      shard_logits.push_back(r.in(mine));
      const Tensor part = r.out({N}), tl = r.out({N});
      cross_entropy_shard_forward(r.ex(), part, tl, shard_logits.back(), targets, s);
      copy(r.ex(), lse_parts.slice_rows(rank, rank + 1).view({N}), part);
      accumulate(r.ex(), target_logit, tl);  // the tp group's sum
    }
    const Tensor losses = r.out({N}), lse = r.out({N});
    cross_entropy_combine(r.ex(), losses, lse, lse_parts, target_logit, targets);
    std::vector<OpOutput> outs = {
        {"lse_parts", r.read(lse_parts)}, {"losses", r.read(losses)}, {"lse", r.read(lse)}};
    for (int64_t rank = 0; rank < R; ++rank) {
      cross_entropy_backward(r.ex(), shard_logits[rank], shard_logits[rank], lse, targets, 0.5,
                             VocabShard::of(29, R, rank));  // in place
      outs.push_back({"dlogits_" + std::to_string(rank), r.read(shard_logits[rank])});
    }
    return outs;
  }});

  // ---- elementwise.h ----

  // One float addition of float-rounded inputs (residual_backward: one per gradient): eps / 2 of
  // the result. 1e-7.
  cases.push_back({"residual_forward_backward", 1e-7, [](OpRunner& r) {
    const Tensor a = r.in(uniform({5, 33}, 70)), b = r.in(uniform({5, 33}, 71)), y = r.out({5, 33});
    residual_forward(r.ex(), y, a, b);
    const Tensor dy = r.in(uniform({5, 33}, 72)), da = r.in(uniform({5, 33}, 73)), db = r.in(uniform({5, 33}, 74));
    residual_backward(r.ex(), da, db, dy);
    return std::vector<OpOutput>{{"y", r.read(y)}, {"da", r.read(da)}, {"db", r.read(db)}};
  }});
  // accumulate: one addition (eps / 2); scale: the factor rounded to float and one product
  // (2 x eps / 2). 2e-7.
  cases.push_back({"accumulate_scale", 2e-7, [](OpRunner& r) {
    const Tensor dst = r.in(uniform({5, 33}, 75)), src = r.in(uniform({5, 33}, 76));
    accumulate(r.ex(), dst, src);
    const Tensor t = r.in(uniform({5, 33}, 77));
    scale(r.ex(), t, 0.3);
    return std::vector<OpOutput>{{"dst", r.read(dst)}, {"t", r.read(t)}};
  }});
  // Moves of float-rounded values: exact.
  cases.push_back({"copy_fill_columns", 0.0, [](OpRunner& r) {
    const Tensor src = r.in(uniform({4, 9}, 78)), dst = r.out({4, 9});
    copy(r.ex(), dst, src);
    fill_zero(r.ex(), dst.slice_rows(1, 3));
    const Tensor narrow = r.out({4, 3});
    copy_columns(r.ex(), narrow, src, 5);
    const Tensor wide = r.in(uniform({4, 9}, 79));
    paste_columns(r.ex(), wide, narrow, 2);
    return std::vector<OpOutput>{{"dst", r.read(dst)}, {"narrow", r.read(narrow)}, {"wide", r.read(wide)}};
  }});
  // Float-rounded inputs summed in double: the same values, reassociated at most (~n 1e-16).
  // 1e-12. The count is exact.
  cases.push_back({"sum_squared_norm_count", 1e-12, [](OpRunner& r) {
    const Tensor t = r.in(uniform({1000}, 80));
    const Tensor out = r.f64_out({3});
    sum(r.ex(), out.slice_rows(0, 1), t);
    squared_norm(r.ex(), out.slice_rows(1, 2), t);
    count_not_equal(r.ex(), out.slice_rows(2, 3), r.ids(targets_with_ignored(50, 9, 81, {3, 4, 40})), kIgnoreIndex);
    return std::vector<OpOutput>{{"sum", r.read(out.slice_rows(0, 1))},
                                 {"squared_norm", r.read(out.slice_rows(1, 2))},
                                 {"count_not_equal", r.read(out.slice_rows(2, 3))}};
  }});
  // The reductions' F64 results added up on the device, as a training step does (its micro-batches'
  // loss sums accumulated, the gradient norm's per-run sums of squares summed): double additions
  // of a few float-rounded terms' sums. 1e-12, as above.
  cases.push_back({"sum_accumulate_f64", 1e-12, [](OpRunner& r) {
    const Tensor t = r.in(uniform({1000}, 190));
    const Tensor parts = r.f64_zeros({3});
    sum(r.ex(), parts.slice_rows(0, 1), t.slice_rows(0, 400));
    squared_norm(r.ex(), parts.slice_rows(1, 2), t.slice_rows(400, 1000));
    sum(r.ex(), parts.slice_rows(2, 3), t);
    const Tensor total = r.f64_out({1});
    sum(r.ex(), total, parts);
    const Tensor acc = r.f64_zeros({3});
    accumulate(r.ex(), acc, parts);
    accumulate(r.ex(), acc, parts);
    return std::vector<OpOutput>{{"total", r.read(total)}, {"acc", r.read(acc)}};
  }});

  // ---- adamw.h ----

  // Three steps of ~10 float operations per element, well conditioned (|g| >> eps): a few 1e-7 of
  // the values' scale. 2e-6, as test_adamw.cpp; a wrong term shows as >= 1e-3.
  cases.push_back({"adamw_update", 2e-6, [](OpRunner& r) {
    const Tensor p = r.in(uniform({300}, 82)), m = r.in(uniform({300}, 83, -0.1, 0.1));
    const Tensor v = r.in(uniform({300}, 84, 0.01, 0.1));
    for (int64_t step = 1; step <= 3; ++step) {
      AdamWStep s;
      s.lr = 1e-2;
      s.beta1 = 0.9;
      s.beta2 = 0.95;
      s.weight_decay = 0.1;
      s.step = step;
      s.grad_scale = 0.5;
      adamw_update(r.ex(), p, r.in(uniform({300}, 85 + static_cast<uint64_t>(step))), m, v, s);
    }
    return std::vector<OpOutput>{{"params", r.read(p)}, {"m", r.read(m)}, {"v", r.read(v)}};
  }});

  return cases;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = make_cases();
  return cases;
}

}  // namespace tessera::testing
