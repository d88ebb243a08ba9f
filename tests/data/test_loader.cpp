// Tests data/loader.h: batches arrive in training order and equal the sampler's plan, a loader
// started at step k continues an uninterrupted one exactly, data errors (a file truncated under
// the reading thread) reach the caller, and both waits can be given up promptly.
#include "data/loader.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "data/addition.h"
#include "data/token_dataset.h"
#include "temp_files.h"
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

// A file truncated after it was opened: the loader thread's read error reaches next(), naming it.
TEST(DataLoader, AFileTruncatedUnderTheThreadReachesTheCaller) {
  testing::TempDir dir("loader_truncated");
  IndexedDatasetBuilder b(dir / "d", TokenDType::kUInt16);
  b.add_document(std::vector<int32_t>(4000, 3));
  b.finalize();
  auto ds = open_token_dataset({dir / "d"}, 16, 100);
  std::filesystem::resize_file(dir / "d.bin", 0);
  Sampler sampler(ds->num_samples(), 1);
  DataLoader loader(*ds, sampler, {4, 4, 1, 0}, 0);
  EXPECT_TRUE(testing::throws_with([&] { loader.next(); }, {dir / "d.bin", "cannot read", "has 0 bytes now"}));
}

namespace {
// Every sample takes 50 ms to read, as from slow storage.
class SlowDataset : public Dataset {
 public:
  int64_t num_samples() const override { return 1000; }
  int64_t seq_len() const override { return 4; }
  int64_t vocab_size() const override { return 10; }
  void get(int64_t, int32_t* out, uint8_t* mask) const override {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fill(out, out + 5, 1);
    if (mask) std::fill(mask, mask + 5, uint8_t{1});
  }
  std::string describe() const override { return "slow"; }
};
}  // namespace

// A micro-batch of 200 slow samples takes 10 s: next(give_up) returns nothing within a poll of
// give_up turning true, and the loader's destructor stops the thread between samples.
TEST(DataLoader, WaitsCanBeGivenUpAndTheThreadStopsBetweenSamples) {
  using Clock = std::chrono::steady_clock;
  SlowDataset ds;
  Sampler sampler(ds.num_samples(), 1);
  const auto t0 = Clock::now();
  {
    DataLoader loader(ds, sampler, {200, 200, 1, 0}, 0);
    const auto quit_at = Clock::now() + std::chrono::milliseconds(200);
    EXPECT_FALSE(loader.next([&] { return Clock::now() > quit_at; }).has_value());
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
}

}  // namespace tessera
