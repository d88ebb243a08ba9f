// Tests optim/schedule.h: learning rates at chosen steps, computed by hand.
#include "optim/schedule.h"

#include <cmath>

#include "testing.h"

namespace tessera {

TEST(LrSchedule, WarmupThenCosineToFloor) {
  LrSchedule s{1.0, 0.1, 10, 110, LrDecay::Cosine};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);   // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);  // decay starts at the peak
  // Halfway through the 99-step decay span: cos(pi/2) = 0 -> midpoint of peak and floor.
  LrSchedule h{1.0, 0.0, 0, 101, LrDecay::Cosine};
  EXPECT_NEAR(h.at(50), 0.5, 1e-12);
  EXPECT_NEAR(h.at(25), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(109), 0.1);  // last step reaches the floor
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);  // and stays there
}

TEST(LrSchedule, LinearAndConstant) {
  LrSchedule lin{2.0, 0.0, 0, 11, LrDecay::Linear};
  EXPECT_DOUBLE_EQ(lin.at(0), 2.0);
  EXPECT_DOUBLE_EQ(lin.at(5), 1.0);
  EXPECT_DOUBLE_EQ(lin.at(10), 0.0);
  LrSchedule c{3e-4, 0.0, 4, 100, LrDecay::Constant};
  EXPECT_DOUBLE_EQ(c.at(1), 1.5e-4);
  EXPECT_DOUBLE_EQ(c.at(50), 3e-4);
  EXPECT_EQ(parse_lr_decay("linear"), LrDecay::Linear);
  EXPECT_THROW(parse_lr_decay("step"), Error);
}

}  // namespace tessera

namespace tessera {
// [upscale] rewarm_steps: from the growth step the schedule starts over, its own linear warm-up of
// rewarm steps to the peak, then the decay over the steps left to min_lr at the last step.
TEST(LrSchedule, RestartWithItsOwnWarmup) {
  LrSchedule s{1.0, 0.1, 2, 12, LrDecay::Cosine};
  const LrSchedule plain = s;
  s.restart(6, 3);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(s.at(i), plain.at(i)) << i;  // before the growth: unchanged
  EXPECT_DOUBLE_EQ(s.at(6), 1.0 / 3);
  EXPECT_DOUBLE_EQ(s.at(7), 2.0 / 3);
  EXPECT_DOUBLE_EQ(s.at(8), 1.0);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);   // the decay's start: 6 steps left, 3 of them warm-up
  EXPECT_DOUBLE_EQ(s.at(10), 0.55);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(s.at(11), 0.1);   // min_lr at the last step
  LrSchedule c{2.0, 0.0, 0, 10, LrDecay::Constant};
  c.restart(4, 4);
  EXPECT_DOUBLE_EQ(c.at(3), 2.0);
  EXPECT_DOUBLE_EQ(c.at(4), 0.5);
  EXPECT_DOUBLE_EQ(c.at(7), 2.0);
}
}  // namespace tessera
