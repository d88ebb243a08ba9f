// Tests data/loader.h: batches arrive in training order and equal the sampler's plan, a loader
// started at step k continues an uninterrupted one exactly, and data errors reach the caller.
#include "data/loader.h"

#include "data/addition.h"
#include "testing.h"

namespace tessera {

TEST(DataLoader, DeliversTheSamplersPlanInOrder) {
  AdditionTask task(2, 1);
  AdditionDataset ds(task, false, 16, 1000);
  Sampler sampler(ds.num_samples(), 9);
  BatchLayout layout{8, 2, 2, 1};  // rank 1 of 2: 2 micro-batches of 2 per step
  DataLoader loader(ds, sampler, layout, 0, 3);
  for (int64_t step = 0; step < 5; ++step)
    for (int64_t m = 0; m < 2; ++m) {
      Batch got = loader.next();
      Batch want = make_batch(ds, sampler.micro_batch(step * 8, m, layout));
      EXPECT_EQ(got.tokens, want.tokens) << "step " << step << " micro " << m;
      EXPECT_EQ(got.targets, want.targets);
    }
}

TEST(DataLoader, ResumingAtAStepContinuesExactly) {
  AdditionTask task(2, 1);
  AdditionDataset ds(task, false, 16, 50);  // small: several epochs
  Sampler sampler(ds.num_samples(), 4);
  BatchLayout layout{6, 3, 1, 0};
  DataLoader full(ds, sampler, layout, 0);
  for (int i = 0; i < 2 * 7; ++i) full.next();
  DataLoader resumed(ds, sampler, layout, 7 * 6);  // 7 steps of 6 samples consumed
  for (int i = 0; i < 2 * 20; ++i) EXPECT_EQ(full.next().tokens, resumed.next().tokens) << i;
}

namespace {
class FailingDataset : public Dataset {
 public:
  int64_t num_samples() const override { return 10; }
  int64_t seq_len() const override { return 4; }
  int64_t vocab_size() const override { return 10; }
  void get(int64_t i, int32_t*, uint8_t*) const override { TESSERA_CHECK(i < 0, "corrupt sample ", i); }
  std::string describe() const override { return "failing"; }
};
}  // namespace

TEST(DataLoader, ErrorsReachTheCaller) {
  FailingDataset ds;
  Sampler sampler(10, 1);
  DataLoader loader(ds, sampler, {2, 2, 1, 0}, 0);
  EXPECT_THROW(loader.next(), Error);
}

}  // namespace tessera
