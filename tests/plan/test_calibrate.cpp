// Tests plan/calibrate.h: the all-reduce fit recovers the link of a ring from exact times, and
// stays sensible on noisy ones; one rank's calibration measures positive rates and keeps the
// default links (tests/app/test_plan_command.cpp runs it on two ranks end to end).
#include "plan/calibrate.h"

#include <gtest/gtest.h>

#include <sstream>

#include "mpi_testing.h"
#include "plan/cost_model.h"

namespace tessera::plan {
namespace {

TEST(Calibrate, FitRecoversTheRingsLink) {
  for (int64_t n : {2, 4, 8}) {
    const Link truth{3e9, 7e-6};
    std::vector<double> bytes, seconds;
    for (double b = 4096; b <= 16 << 20; b *= 4) {
      bytes.push_back(b);
      seconds.push_back(all_reduce_seconds(b, n, truth));
    }
    const Link fit = fit_all_reduce(bytes, seconds, n);
    EXPECT_NEAR(fit.bandwidth, truth.bandwidth, 1e-6 * truth.bandwidth) << n;
    EXPECT_NEAR(fit.latency, truth.latency, 1e-9) << n;
  }
  // +-10% noise: within 15% of the truth (relative weights: no size dominates).
  const Link truth{1e9, 2e-5};
  std::vector<double> bytes, seconds;
  int k = 0;
  for (double b = 4096; b <= 16 << 20; b *= 2, ++k) {
    bytes.push_back(b);
    seconds.push_back(all_reduce_seconds(b, 2, truth) * (k % 2 ? 1.1 : 0.9));
  }
  const Link fit = fit_all_reduce(bytes, seconds, 2);
  EXPECT_NEAR(fit.bandwidth, 1e9, 0.15e9);
  EXPECT_NEAR(fit.latency, 2e-5, 0.5e-5);
  EXPECT_THROW(fit_all_reduce({1.0}, {1.0}, 2), Error);
}

TEST(Calibrate, OneRankMeasuresComputeAndKeepsTheLinks) {
  LocalMachine m;
  m.ranks = 1;
  m.memory_available = 1e9;
  CalibrationOptions o;
  o.repeats = 1;
  o.gemm_size = 128;
  o.stream_elements = 1 << 16;
  std::ostringstream log;
  testing::test_world();  // MPI started
  const ClusterSpec c = calibrate_local(MPI_COMM_SELF, m, o, &log);
  // Positive rates (the values depend on the machine and its load; the test checks the plumbing).
  EXPECT_GT(c.peak_flops_fp32, 0);
  EXPECT_GT(c.peak_flops_bf16, 0);
  EXPECT_GT(c.memory_bandwidth, 0);
  EXPECT_GT(c.op_latency, 0);
  EXPECT_EQ(c.compute_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(c.intra.bandwidth, local_cluster(m).intra.bandwidth);
  EXPECT_NE(log.str().find("GEMM 128^3 per rank"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace tessera::plan
