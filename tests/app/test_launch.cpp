// Tests app/launch.h: the threads each rank runs (OMP_NUM_THREADS, Slurm's CPUs per task, a share
// of the node), the start-up summary, and under mpiexec: a rank that never starts ends the job
// instead of leaving the others in MPI_Init, a config missing on one rank and a rank count that
// does not fit the layout stop every rank with one message.
#include "app/launch.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>

#include "cli_testing.h"
#include "process_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

ThreadInputs inputs(int ranks, int allowed, int node_cpus, bool bound = false) {
  ThreadInputs in;
  in.ranks_on_node = ranks;
  in.cpus_allowed = allowed;
  in.cpus_of_node_ranks = node_cpus;
  in.ranks_bound = bound;
  return in;
}

TEST(ThreadsPerRank, OmpNumThreadsIsTheUsersChoice) {
  ThreadInputs in = inputs(4, 8, 8);
  in.omp_num_threads = "3";
  in.slurm_cpus_per_task = "2";
  EXPECT_EQ(default_threads_per_rank(in), 0) << "0: OpenMP keeps what OMP_NUM_THREADS says";
  in.omp_num_threads = "";  // set but empty: OpenMP ignores it, and so does this
  EXPECT_EQ(default_threads_per_rank(in), 2);
}

TEST(ThreadsPerRank, SlurmCpusPerTaskComesNext) {
  ThreadInputs in = inputs(1, 16, 16);
  in.slurm_cpus_per_task = "4";
  EXPECT_EQ(default_threads_per_rank(in), 4) << "also for one rank: sbatch -c 4 on a shared node";
  in.slurm_cpus_per_task = "four";
  EXPECT_EQ(default_threads_per_rank(in), 0) << "not a count: ignored";
  in.slurm_cpus_per_task = "0";
  EXPECT_EQ(default_threads_per_rank(in), 0);
}

TEST(ThreadsPerRank, RanksSplitTheirNodesCpusUnlessBoundToTheirOwn) {
  EXPECT_EQ(default_threads_per_rank(inputs(1, 8, 8)), 0) << "one rank: OpenMP's default, every CPU it may use";
  EXPECT_EQ(default_threads_per_rank(inputs(2, 8, 8)), 4);
  EXPECT_EQ(default_threads_per_rank(inputs(3, 8, 8)), 2);
  EXPECT_EQ(default_threads_per_rank(inputs(4, 2, 2)), 1) << "never below one";
  // Bound by the launcher (mpiexec -bind-to core, srun --cpu-bind): the rank's own CPUs.
  EXPECT_EQ(default_threads_per_rank(inputs(2, 3, 6, true)), 3);
  // A job confined to 4 of the node's CPUs (a cgroup, taskset), shared by its 2 ranks.
  EXPECT_EQ(default_threads_per_rank(inputs(2, 4, 4)), 2);
}

TEST(LaunchSummary, RankRanges) {
  EXPECT_EQ(rank_ranges({0}), "0");
  EXPECT_EQ(rank_ranges({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(rank_ranges({0, 2, 3, 5, 7, 8}), "0,2-3,5,7-8");
}

TEST(MpiInitDeadline, TimeoutFromTheEnvironment) {
  EXPECT_EQ(MpiInitDeadline::timeout_from(nullptr), MpiInitDeadline::kDefaultSeconds);
  EXPECT_EQ(MpiInitDeadline::timeout_from(""), MpiInitDeadline::kDefaultSeconds);
  EXPECT_EQ(MpiInitDeadline::timeout_from("2.5"), 2.5);
  EXPECT_EQ(MpiInitDeadline::timeout_from("0"), 0.0);
  EXPECT_EQ(MpiInitDeadline::timeout_from("-1"), MpiInitDeadline::kDefaultSeconds);
  EXPECT_EQ(MpiInitDeadline::timeout_from("soon"), MpiInitDeadline::kDefaultSeconds);
}

// sbatch/srun -c N: each rank runs N threads when OMP_NUM_THREADS is not set (ctest sets it to 1:
// here it is set empty, which OpenMP ignores), and the summary says so.
TEST(LaunchSummary, SlurmCpusPerTaskSetsTheThreadsAndTheSummaryNamesThem) {
  const testing::TrainRun run = testing::make_run("launch_threads");
  const testing::RunResult r =
      run.train({"train.steps=1"}, {}, SIGINT, {"OMP_NUM_THREADS=", "SLURM_CPUS_PER_TASK=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", 3 OpenMP threads,"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks: 1 on 1 host ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" | 3 OpenMP threads per rank | device CPU\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher: one process"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mpi: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("config: " + run.config.string() + " --set log.every=1 --set train.steps=1\n"),
            std::string::npos)
      << r.output;
  fs::remove_all(run.dir);
}

TEST(LaunchSummary, TwoRanksUnderMpiexecShareTheCoresAndPrintOnce) {
  const testing::TrainRun run = testing::make_run("launch_two");
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY};
  const auto train = run.args({"train.steps=1", "train.micro_batch=4"});
  args.insert(args.end(), train.begin(), train.end());
  // OMP_NUM_THREADS set empty (OpenMP ignores it): the two ranks split this machine's CPUs.
  const testing::RunResult r = testing::run_program(TESSERA_MPIEXEC, args, run.dir, {}, SIGINT, {"OMP_NUM_THREADS="});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("ranks: 2 on 1 host (");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.rfind("ranks: 2 on 1 host ("), at) << "printed once: " << r.output;
  cpu_set_t cpus;
  ASSERT_EQ(sched_getaffinity(0, sizeof cpus, &cpus), 0);
  const int each = std::max(1, CPU_COUNT(&cpus) / 2);
  EXPECT_NE(r.output.find(": 0-1) | " + std::to_string(each) + (each == 1 ? " OpenMP thread" : " OpenMP threads") +
                          " per rank"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("launcher: mpiexec (Hydra)"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// Hydra reports a rank it could not start (an executable missing on one host) and waits on; the
// others would wait in MPI_Init for ever. Bounded: they exit, and mpiexec ends the job.
TEST(MpiInitDeadline, ARankThatNeverStartsEndsTheJobInsteadOfHanging) {
  const testing::TrainRun run = testing::make_run("launch_missing_binary");
  std::vector<std::string> args = {"-n", "1", TESSERA_BINARY};
  const auto train = run.args({});
  args.insert(args.end(), train.begin(), train.end());
  args.insert(args.end(), {":", "-n", "1", (run.dir / "not-here" / "tessera").string(), "train"});
  const auto t0 = Clock::now();
  testing::Spawned p(TESSERA_MPIEXEC, args, run.dir / "output.txt", {"TESSERA_MPI_INIT_TIMEOUT_S=3"});
  const auto code = p.wait_exit(45);
  ASSERT_TRUE(code.has_value()) << "still waiting after 45 s:\n" << p.output();
  EXPECT_NE(*code, 0) << p.output();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 40);
  EXPECT_NE(p.output().find("MPI_Init did not complete within 3 s"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("not-here/tessera"), std::string::npos) << "the launcher names the file: " << p.output();
  fs::remove_all(run.dir);
}

// A config file on one host but not another (here: two working directories, one without it).
TEST(LaunchErrors, AConfigMissingOnOneRankStopsEveryRankWithOneMessage) {
  const testing::TrainRun run = testing::make_run("launch_missing_config");
  fs::create_directories(run.dir / "with");
  fs::create_directories(run.dir / "without");
  fs::copy_file(run.config, run.dir / "with" / "tiny.toml");
  const std::string rundir = (run.dir / "run").string();
  const std::vector<std::string> args = {"-n", "1", "-wdir", (run.dir / "with").string(), TESSERA_BINARY,
                                         "train", "tiny.toml", "--run-dir", rundir, ":", "-n", "1", "-wdir",
                                         (run.dir / "without").string(), TESSERA_BINARY, "train", "tiny.toml",
                                         "--run-dir", rundir};
  testing::Spawned p(TESSERA_MPIEXEC, args, run.dir / "output.txt");
  const auto code = p.wait_exit(60);
  ASSERT_TRUE(code.has_value()) << p.output();
  EXPECT_EQ(*code, 1) << p.output();
  const std::string want = "tessera: error: cannot open config file tiny.toml";
  const size_t at = p.output().find(want);
  EXPECT_NE(at, std::string::npos) << p.output();
  EXPECT_EQ(p.output().rfind(want), at) << "one message: " << p.output();
  fs::remove_all(run.dir);
}

TEST(LaunchErrors, ARankCountThatDoesNotFitTheLayoutStopsEveryRankWithOneMessage) {
  const testing::TrainRun run = testing::make_run("launch_layout");
  std::vector<std::string> args = {"-n", "3", TESSERA_BINARY};
  const auto train = run.args({"parallel.tp=2"});
  args.insert(args.end(), train.begin(), train.end());
  testing::Spawned p(TESSERA_MPIEXEC, args, run.dir / "output.txt");
  const auto code = p.wait_exit(60);
  ASSERT_TRUE(code.has_value()) << p.output();
  EXPECT_EQ(*code, 1) << p.output();
  const std::string want = "parallel.tp x parallel.cp x parallel.pp = 2 x 1 x 1 = 2 does not divide the 3 ranks";
  const size_t at = p.output().find(want);
  EXPECT_NE(at, std::string::npos) << p.output();
  EXPECT_EQ(p.output().rfind(want), at) << "one message: " << p.output();
  fs::remove_all(run.dir);
}

// scripts/slurm/train.sbatch checks what it launches before launching it: one line and exit 2 (the
// same checks run in a Slurm job: tests/app/test_slurm_batch.cpp runs the rest).
TEST(TrainSbatch, AMissingExecutableOrConfigEndsTheJobWithOneLine) {
  const testing::TrainRun run = testing::make_run("sbatch_checks");
  const std::string script =
      (fs::path(TESSERA_TEST_DATA_DIR).parent_path().parent_path() / "scripts" / "slurm" / "train.sbatch").string();
  const std::string config = run.config.string();
  struct Case {
    std::vector<std::string> args, env;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{config}, {"SLURM_JOB_ID="}, "not inside a Slurm job"},  // empty: also when the tests run in a job
      {{}, {"SLURM_JOB_ID=1"}, "error: no config given"},
      {{config}, {"SLURM_JOB_ID=1", "TESSERA_BIN=" + (run.dir / "none" / "tessera").string()},
       "error: no tessera executable at " + (run.dir / "none" / "tessera").string()},
      {{(run.dir / "missing.toml").string()}, {"SLURM_JOB_ID=1", std::string("TESSERA_BIN=") + TESSERA_BINARY},
       "error: config file " + (run.dir / "missing.toml").string() + " not found"},
      {{config}, {"SLURM_JOB_ID=1", std::string("TESSERA_BIN=") + TESSERA_BINARY, "TESSERA_LAUNCHER=ssh"},
       "error: TESSERA_LAUNCHER = 'ssh': srun or mpiexec"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {script};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const testing::RunResult r = testing::run_program("/bin/bash", args, run.dir, {}, SIGINT, c.env);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.want), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  }
  fs::remove_all(run.dir);
}

}  // namespace
}  // namespace tessera
