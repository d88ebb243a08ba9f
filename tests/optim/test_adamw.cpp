// Tests optim/adamw.h: per-segment weight decay, clipping and the gradient norm.
#include "optim/adamw.h"

#include <cmath>

#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

TEST(AdamWOptimizer, DecaysOnlyDecaySegments) {
  Allocator alloc;
  HostTensor<float> p({6}, 2.0f), g({6}, 0.0f);
  AdamW opt(p.t(), g.t(), {{0, 4, true}, {4, 2, false}}, alloc, {0.9, 0.95, 1e-8, 0.5});
  opt.step(kCpu, 0.1);
  // Zero gradients: the Adam term is 0, only decoupled decay p *= 1 - lr * wd acts.
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(p[i], 2.0f * (1 - 0.1f * 0.5f));
  for (int i = 4; i < 6; ++i) EXPECT_FLOAT_EQ(p[i], 2.0f);
  EXPECT_EQ(opt.steps_taken(), 1);
  EXPECT_EQ(alloc.counter(MemCategory::OptimizerState).current, 2u * 6 * 4);
}

TEST(AdamWOptimizer, FirstStepMovesEachElementByLr) {
  Allocator alloc;
  HostTensor<double> p({3}, 0.0), g({3});
  g[0] = 3.0; g[1] = -0.001; g[2] = 10.0;
  AdamW opt(p.t(), g.t(), {{0, 3, false}}, alloc, {0.9, 0.999, 1e-12, 0.0});
  opt.step(kCpu, 0.01, 0.5);
  // Step 1: mhat = g', vhat = g'^2, so the update is lr * sign(g) whatever the scale.
  EXPECT_NEAR(p[0], -0.01, 1e-9);
  EXPECT_NEAR(p[1], 0.01, 1e-7);
  EXPECT_NEAR(p[2], -0.01, 1e-9);
}

TEST(AdamWOptimizer, RejectsSegmentsThatDoNotTile) {
  Allocator alloc;
  HostTensor<float> p({6}), g({6});
  EXPECT_THROW(AdamW(p.t(), g.t(), {{0, 4, true}}, alloc, {}), Error);
  EXPECT_THROW(AdamW(p.t(), g.t(), {{0, 2, true}, {3, 3, true}}, alloc, {}), Error);
}

TEST(Clipping, NormAndFactor) {
  HostTensor<float> g({2});
  g[0] = 3.0f; g[1] = 4.0f;
  Allocator alloc;
  EXPECT_DOUBLE_EQ(grad_norm(kCpu, alloc, g.t()), 5.0);
  EXPECT_DOUBLE_EQ(clip_factor(5.0, 1.0), 0.2);
  EXPECT_DOUBLE_EQ(clip_factor(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_factor(5.0, 0.0), 1.0);  // clipping off
  EXPECT_DOUBLE_EQ(clip_factor(NAN, 1.0), 1.0);  // non-finite norms are the trainer's to handle
}

}  // namespace tessera
