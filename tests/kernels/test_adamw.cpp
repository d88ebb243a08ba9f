// Tests kernels/adamw.h: the F64 path against a straightforward re-computation written here in
// PyTorch's own form (lerp, divide by the bias correction), and the F32 path against F64.
#include "kernels/adamw.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "error_testing.h"
#include "kernels/elementwise.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

namespace {

// Optimizer state for one flat parameter buffer.
template <typename T>
struct State {
  HostTensor<T> p, m, v;
};

State<double> initial_state(int64_t n, uint64_t seed) {
  // Rounded to float so the F32 run starts from the same values.
  return {HostTensor<float>::uniform({n}, seed).cast<double>(), HostTensor<double>({n}),
          HostTensor<double>({n})};
}

// torch.optim.AdamW's single-tensor step, element by element, written independently of the kernel:
// param.mul_(1 - lr*wd); exp_avg.lerp_(g, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2);
// denom = exp_avg_sq.sqrt() / sqrt(bias_correction2) + eps; param.addcdiv_(exp_avg, denom, -lr / bc1).
void torch_style_step(State<double>& s, const HostTensor<double>& grads, const AdamWStep& h) {
  double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  double bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  for (int64_t i = 0; i < s.p.numel(); ++i) {
    double g = grads[i] * h.grad_scale;
    s.p[i] *= 1 - h.lr * h.weight_decay;
    s.m[i] += (g - s.m[i]) * (1 - h.beta1);
    s.v[i] = s.v[i] * h.beta2 + (1 - h.beta2) * g * g;
    double denom = std::sqrt(s.v[i]) / std::sqrt(bc2) + h.eps;
    s.p[i] += -(h.lr / bc1) * s.m[i] / denom;
  }
}

AdamWStep hyper(int64_t step) {
  AdamWStep h;
  h.lr = 3e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  h.step = step;
  h.grad_scale = 0.5;
  return h;
}

HostTensor<double> grads_for_step(int64_t n, int64_t step) {
  return HostTensor<float>::uniform({n}, 100 + static_cast<uint64_t>(step)).cast<double>();
}

}  // namespace

TEST(AdamW, FirstStepMovesEachParameterByLrTimesSign) {
  // Step 1 without decay: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) ~ lr * sign(g).
  HostTensor<double> p({3}), g({3}), m({3}), v({3});
  p.vec() = {1.0, -2.0, 0.5};
  g.vec() = {0.3, -4.0, 1e-3};
  AdamWStep h;
  h.lr = 0.01;
  adamw_update(kCpu, p.t(), g.t(), m.t(), v.t(), h);
  EXPECT_NEAR(p[0], 1.0 - 0.01, 1e-9);
  EXPECT_NEAR(p[1], -2.0 + 0.01, 1e-9);
  EXPECT_NEAR(p[2], 0.5 - 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-12);
  EXPECT_NEAR(m[1], 0.1 * -4.0, 1e-15);
  EXPECT_NEAR(v[1], 0.001 * 16.0, 1e-15);
}

TEST(AdamW, DoubleMatchesTorchFormulaOverSeveralSteps) {
  const int64_t n = 257;
  State<double> kernel = initial_state(n, 1), expected = initial_state(n, 1);
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = grads_for_step(n, step);
    adamw_update(kCpu, kernel.p.t(), g.t(), kernel.m.t(), kernel.v.t(), hyper(step));
    torch_style_step(expected, g, hyper(step));
  }
  // Same arithmetic up to reassociation (lerp vs. weighted sum, * 1/sqrt vs. / sqrt): a few ulps.
  EXPECT_LT(testing::max_rel_error(kernel.p, expected.p), 1e-14);
  EXPECT_LT(testing::max_rel_error(kernel.m, expected.m), 1e-14);
  EXPECT_LT(testing::max_rel_error(kernel.v, expected.v), 1e-14);
}

TEST(AdamW, FloatMatchesDouble) {
  const int64_t n = 1000;
  State<double> s64 = initial_state(n, 2);
  State<float> s32{s64.p.cast<float>(), s64.m.cast<float>(), s64.v.cast<float>()};
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = grads_for_step(n, step);
    auto gf = g.cast<float>();
    adamw_update(kCpu, s64.p.t(), g.t(), s64.m.t(), s64.v.t(), hyper(step));
    adamw_update(kCpu, s32.p.t(), gf.t(), s32.m.t(), s32.v.t(), hyper(step));
  }
  // Each step is ~10 float operations per element, each rounding by <= 2^-24 ~ 6e-8 relative, and
  // the update is well conditioned (|g| >> eps), so after 5 steps the error is a few 1e-7 of the
  // values' scale; 2e-6 leaves margin while a wrong term would show as >= 1e-3.
  EXPECT_LT(testing::max_rel_error(s32.p, s64.p), 2e-6);
  EXPECT_LT(testing::max_rel_error(s32.m, s64.m), 2e-6);
  EXPECT_LT(testing::max_rel_error(s32.v, s64.v), 2e-6);
}

// Mixed precision: the bf16 copy written in the update's own loop equals the update followed by a
// separate conversion (convert: the AVX-512 rounding), and the fp32 state is the same bits as
// without a copy. n is not a multiple of any vector width; a NaN gradient checks the NaN rounding.
TEST(AdamW, Bf16CopyInTheSamePassEqualsUpdateThenConvert) {
  const int64_t n = 3 * 4096 + 77;
  State<double> s64 = initial_state(n, 3);
  State<float> plain{s64.p.cast<float>(), s64.m.cast<float>(), s64.v.cast<float>()};
  State<float> fused{s64.p.cast<float>(), s64.m.cast<float>(), s64.v.cast<float>()};
  HostTensor<float> from_masters({n});
  std::vector<uint16_t> expected(static_cast<size_t>(n)), copy(static_cast<size_t>(n), 0xabcd);
  const Tensor copy_t(copy.data(), DType::BF16, {n}, Device::cpu());
  for (int64_t step = 1; step <= 3; ++step) {
    auto g = grads_for_step(n, step).cast<float>();
    g[5] = std::numeric_limits<float>::quiet_NaN();  // p[5] becomes NaN: rounded to a quiet NaN
    adamw_update(kCpu, plain.p.t(), g.t(), plain.m.t(), plain.v.t(), hyper(step));
    adamw_update(kCpu, fused.p.t(), g.t(), fused.m.t(), fused.v.t(), hyper(step), copy_t);
    const auto bits = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    };
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(fused.p[i]), bits(plain.p[i])) << "step " << step << ", element " << i;
      ASSERT_EQ(bits(fused.m[i]), bits(plain.m[i])) << "step " << step << ", element " << i;
      ASSERT_EQ(bits(fused.v[i]), bits(plain.v[i])) << "step " << step << ", element " << i;
    }
    ASSERT_TRUE(std::isnan(plain.p[5]));
    convert(kCpu, Tensor(expected.data(), DType::BF16, {n}, Device::cpu()), plain.p.t());
    ASSERT_EQ(copy, expected) << "step " << step;
  }
}

TEST(AdamW, RefusesABadBf16Copy) {
  HostTensor<float> p({4}), g({4}), m({4}), v({4}), f32_copy({4});
  HostTensor<double> p64({4}), g64({4}), m64({4}), v64({4});
  std::vector<uint16_t> bits(4), short_bits(3);
  const Tensor copy(bits.data(), DType::BF16, {4}, Device::cpu());
  const Tensor short_copy(short_bits.data(), DType::BF16, {3}, Device::cpu());
  EXPECT_TRUE(testing::throws_with([&] { adamw_update(kCpu, p.t(), g.t(), m.t(), v.t(), AdamWStep{}, f32_copy.t()); },
                                   {"compute has dtype f32, expected bf16"}));
  EXPECT_TRUE(testing::throws_with([&] { adamw_update(kCpu, p.t(), g.t(), m.t(), v.t(), AdamWStep{}, short_copy); },
                                   {"compute has 3 elements"}));
  EXPECT_TRUE(testing::throws_with([&] { adamw_update(kCpu, p64.t(), g64.t(), m64.t(), v64.t(), AdamWStep{}, copy); },
                                   {"bf16 of f32 only"}));
}

TEST(AdamW, RejectsBadArguments) {
  HostTensor<float> p({4}), g({4}), m({4}), v({4}), short_v({3});
  HostTensor<double> g64({4});
  EXPECT_THROW(adamw_update(kCpu, p.t(), g.t(), m.t(), short_v.t(), AdamWStep{}), Error);
  EXPECT_THROW(adamw_update(kCpu, p.t(), g64.t(), m.t(), v.t(), AdamWStep{}), Error);
  AdamWStep zero_step;
  zero_step.step = 0;
  try {
    adamw_update(kCpu, p.t(), g.t(), m.t(), v.t(), zero_step);
    ADD_FAILURE() << "step 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step"), std::string::npos) << e.what();
  }
}

}  // namespace tessera
