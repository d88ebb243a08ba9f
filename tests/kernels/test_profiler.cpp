// Tests kernels/profiler.h: null-profiler scopes, counts and self times adding up under nesting,
// per-step averages, reset, and the table's order. Times come from a fake clock, so every
// expectation is exact; nothing here measures speed.
#include "kernels/profiler.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "kernels/check.h"
#include "testing.h"

namespace tessera {
namespace {

// A clock the test advances by hand, and how often the profiler read it.
double fake_now = 0;
int fake_reads = 0;
double fake_clock() {
  ++fake_reads;
  return fake_now;
}

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_now = 0, fake_reads = 0; }
  // One scope of family f lasting `seconds` on the fake clock.
  static void timed(Profiler* p, OpFamily f, double seconds) {
    ProfileScope s(p, f);
    fake_now += seconds;
  }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string first_word(const std::string& line) { return line.substr(0, line.find(' ')); }

}  // namespace

TEST_F(ProfilerTest, NullProfilerScopeIsNoOp) {
  Profiler prof(&fake_clock);
  {
    ProfileScope a(nullptr, OpFamily::Matmul);
    ProfileScope b(nullptr, OpFamily::Attention);
    fake_now += 5;
  }
  EXPECT_EQ(fake_reads, 0);
  EXPECT_EQ(prof.total_calls(), 0);
  EXPECT_EQ(prof.total_seconds(), 0.0);
  EXPECT_EQ(prof.open_scopes(), 0);
}

TEST_F(ProfilerTest, CountsAndTimesAddUp) {
  Profiler prof(&fake_clock);
  timed(&prof, OpFamily::Matmul, 2.0);
  timed(&prof, OpFamily::Matmul, 3.0);
  timed(&prof, OpFamily::Norm, 0.5);
  timed(&prof, OpFamily::AdamW, 1.5);
  prof.add(OpFamily::Communication, 0.25, 4);  // measured elsewhere

  EXPECT_EQ(prof.entry(OpFamily::Matmul).calls, 2);
  EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Matmul).seconds, 5.0);
  EXPECT_EQ(prof.entry(OpFamily::Norm).calls, 1);
  EXPECT_EQ(prof.entry(OpFamily::Communication).calls, 4);
  EXPECT_EQ(prof.entry(OpFamily::Attention).calls, 0);
  EXPECT_EQ(prof.total_calls(), 2 + 1 + 1 + 4);
  EXPECT_DOUBLE_EQ(prof.total_seconds(), 5.0 + 0.5 + 1.5 + 0.25);
  EXPECT_EQ(fake_reads, 8);  // two clock reads per scope
}

// Overlapped communication (parallel/tp_overlap.h): the wait is charged to communication, the
// rest of the op's flight to "comm hidden", which runs beside the families and stays out of the
// total; reset clears it, and a profile without it prints no such row.
TEST_F(ProfilerTest, HiddenCommunicationIsReportedBesideTheTotal) {
  Profiler prof(&fake_clock);
  EXPECT_EQ(prof.table().find("comm hidden"), std::string::npos);
  timed(&prof, OpFamily::Matmul, 3.0);
  timed(&prof, OpFamily::Communication, 1.0);  // the exposed wait
  prof.add_hidden(2.0);                         // in flight beside the matmul
  prof.add_hidden(0.5);
  prof.end_step();
  EXPECT_DOUBLE_EQ(prof.hidden_seconds(), 2.5);
  EXPECT_DOUBLE_EQ(prof.total_seconds(), 4.0);
  const std::vector<std::string> lines = lines_of(prof.table());
  ASSERT_EQ(lines.size(), 5u);  // header, matmul, communication, total, comm hidden
  EXPECT_EQ(lines[3].rfind("total", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("comm hidden", 0), 0u) << lines[4];
  EXPECT_NE(lines[4].find("2500.00"), std::string::npos) << lines[4];  // ms per step
  EXPECT_NE(lines[4].find("62.5%"), std::string::npos) << lines[4];    // of the 4 s total
  EXPECT_DOUBLE_EQ(fake_now, prof.now());
  prof.reset();
  EXPECT_DOUBLE_EQ(prof.hidden_seconds(), 0.0);
  EXPECT_EQ(prof.table().find("comm hidden"), std::string::npos);
}

TEST_F(ProfilerTest, NestedScopesChargeSelfTime) {
  Profiler prof(&fake_clock);
  {
    ProfileScope attn(&prof, OpFamily::Attention);  // 10 s in all
    fake_now += 1;
    timed(&prof, OpFamily::Matmul, 3);
    fake_now += 2;
    {
      ProfileScope ew(&prof, OpFamily::Elementwise);  // 3 s, of which matmul 2
      timed(&prof, OpFamily::Matmul, 2);
      fake_now += 1;
    }
    fake_now += 1;
    EXPECT_EQ(prof.open_scopes(), 1);
  }
  EXPECT_EQ(prof.open_scopes(), 0);
  EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Matmul).seconds, 5.0);
  EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Elementwise).seconds, 1.0);
  EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Attention).seconds, 4.0);
  EXPECT_DOUBLE_EQ(prof.total_seconds(), 10.0);  // = wall time of the outermost scope
  EXPECT_EQ(prof.total_calls(), 4);
}

// A device that queues its ops: a scope returns at once and its work finishes later, at the next
// synchronization. With the fence (the trainer's stream synchronize on a GPU) each scope is charged
// its own queued work; without it the work lands wherever the host happens to wait.
double queued = 0;  // seconds of device work queued and not yet finished
void finish_queued() {
  fake_now += queued;
  queued = 0;
}

TEST_F(ProfilerTest, AFenceChargesQueuedDeviceWorkToTheScopeThatQueuedIt) {
  for (const bool fenced : {true, false}) {
    Profiler prof(&fake_clock);
    if (fenced) prof.set_fence(&finish_queued);
    queued = 0;
    {
      ProfileScope mm(&prof, OpFamily::Matmul);
      queued += 3;  // a GEMM launched: 3 s of device work
    }
    {
      ProfileScope n(&prof, OpFamily::Norm);
      queued += 1;
    }
    {
      ProfileScope c(&prof, OpFamily::Communication);  // a host wait for everything queued
      finish_queued();
    }
    if (fenced) {
      EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Matmul).seconds, 3.0);
      EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Norm).seconds, 1.0);
      EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Communication).seconds, 0.0);
    } else {
      EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Matmul).seconds, 0.0);
      EXPECT_DOUBLE_EQ(prof.entry(OpFamily::Communication).seconds, 4.0);
    }
  }
}

TEST_F(ProfilerTest, PerStepAveragesAndReset) {
  Profiler prof(&fake_clock);
  for (int step = 0; step < 2; ++step) {
    timed(&prof, OpFamily::Matmul, 0.010);
    timed(&prof, OpFamily::Matmul, 0.030);
    prof.end_step();
  }
  EXPECT_EQ(prof.steps(), 2);
  // 80 ms over 2 steps = 40 ms/step, 2 calls/step.
  const auto lines = lines_of(prof.table());
  ASSERT_EQ(lines.size(), 3u);  // header, matmul, total
  std::istringstream row(lines[1]);
  std::string name;
  double ms = 0, calls = 0;
  std::string pct;
  row >> name >> ms >> pct >> calls;
  EXPECT_EQ(name, "matmul");
  EXPECT_NEAR(ms, 40.0, 1e-9);
  EXPECT_EQ(pct, "100.0%");
  EXPECT_EQ(calls, 2.0);

  prof.reset();
  EXPECT_EQ(prof.steps(), 0);
  EXPECT_EQ(prof.total_calls(), 0);
  EXPECT_EQ(prof.total_seconds(), 0.0);
  EXPECT_EQ(lines_of(prof.table()).size(), 2u);  // header and total only
}

TEST_F(ProfilerTest, TableListsFamiliesSortedByTime) {
  Profiler prof(&fake_clock);
  timed(&prof, OpFamily::Norm, 1);
  timed(&prof, OpFamily::AdamW, 4);
  timed(&prof, OpFamily::Matmul, 10);
  timed(&prof, OpFamily::CrossEntropy, 2);
  timed(&prof, OpFamily::Activation, 3);
  prof.end_step();
  const auto lines = lines_of(prof.table());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(first_word(lines[0]), "op");
  const std::vector<std::string> order = {"matmul", "adamw", "gelu/swiglu", "cross_entropy", "norm", "total"};
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(first_word(lines[i + 1]), order[i]) << prof.table();
  // Families never called are not listed.
  EXPECT_EQ(prof.table().find("attention"), std::string::npos);
  EXPECT_NE(lines.back().find("100.0%"), std::string::npos);
}

TEST_F(ProfilerTest, MisuseIsReported) {
  Profiler prof(&fake_clock);
  EXPECT_THROW(prof.close(), Error);
  prof.open(OpFamily::Rope);
  EXPECT_THROW(prof.reset(), Error);
  prof.close();
  EXPECT_NO_THROW(prof.reset());
}

TEST(Profiler, SteadyClockScopeIsCounted) {
  Profiler prof;  // the real clock: only structural checks
  {
    ProfileScope s(&prof, OpFamily::Embedding);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(prof.entry(OpFamily::Embedding).calls, 1);
  EXPECT_GT(prof.entry(OpFamily::Embedding).seconds, 0.0);
  EXPECT_EQ(prof.total_seconds(), prof.entry(OpFamily::Embedding).seconds);
}

}  // namespace tessera
