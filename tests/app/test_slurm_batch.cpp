// Tests scripts/slurm/train.sbatch on a real one-node Slurm cluster (tests/app/slurm_testing.h),
// two tasks of the quickstart config each: a short run completes under srun and under mpiexec; a
// preempted run (SIGUSR1 to the batch script, as --signal=B:USR1 sends it) saves, exits 75, is
// requeued, resumes and ends bit for bit as an uninterrupted one; the requeues are bounded; a killed
// rank ends the whole job within seconds and leaves the newest checkpoint intact. Skipped, saying
// why, where Slurm cannot start (not installed, not root). CTest: label `slurm` (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstring>

#include "app/checkpoint/checkpoint_io.h"
#include "mpi_testing.h"
#include "slurm_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::LocalSlurm;
using Clock = std::chrono::steady_clock;

// The repository: scripts/slurm/train.sbatch and configs/ (the reference data is in tests/reference).
const std::string kSource = fs::path(TESSERA_TEST_DATA_DIR).parent_path().parent_path().string();

const std::vector<std::string> kEnded = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                                         "BOOT_FAIL", "DEADLINE", "PREEMPTED"};

// One sbatch submission of train.sbatch: its directory (the job runs there), log and run directory.
struct Job {
  std::string id;
  fs::path dir;
  std::string run_name = "run";
  fs::path log() const { return dir / "slurm.out"; }
  fs::path run() const { return dir / run_name; }
  fs::path ckpts() const { return run() / "checkpoints"; }
  std::vector<double> losses() const { return testing::losses(run() / "metrics.jsonl"); }
  std::string output() const { return testing::read_file(log()); }
  std::string latest() const {
    std::string name = testing::read_file(ckpts() / "latest");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    return name;
  }
};

class SlurmCluster : public ::testing::Test {
 protected:
  static std::unique_ptr<LocalSlurm>& cluster() {
    static std::unique_ptr<LocalSlurm> c;
    return c;
  }
  static std::string& skip_reason() {
    static std::string why;
    return why;
  }
  // One cluster for the suite: starting one takes seconds.
  static void SetUpTestSuite() {
    skip_reason() = LocalSlurm::unavailable();
    if (skip_reason().empty()) {
      cluster() = std::make_unique<LocalSlurm>(fs::temp_directory_path() / ("tessera_slurm_" + std::to_string(getpid())));
      if (!cluster()->error().empty()) {
        skip_reason() = "a local Slurm cluster did not start: " + cluster()->error();
        cluster().reset();
      }
    }
    if (!skip_reason().empty()) std::fprintf(stderr, "SlurmCluster: skipped: %s\n", skip_reason().c_str());
  }
  static void TearDownTestSuite() { cluster().reset(); }  // stops the daemons, removes the directory
  void SetUp() override {
    if (!cluster()) GTEST_SKIP() << skip_reason();
  }
  void TearDown() override {
    if (HasFailure() && cluster()) std::fprintf(stderr, "Slurm daemons' logs:\n%s", cluster()->logs().c_str());
  }

  const LocalSlurm& slurm() const { return *cluster(); }

  // Submits train.sbatch with 2 tasks on the quickstart config, `steps` steps (a tiny run: 8
  // sequences a step, no evaluation until the end, 32 held-out problems), a checkpoint every `every`
  // steps (0: at the end and when preempted only; a two-rank save takes seconds on a busy machine).
  // sbatch_args go before the script; run_dir (TESSERA_RUN_DIR, in the job's directory) may hold
  // %a, which the script replaces in array jobs.
  Job submit(const std::string& name, int steps, const std::vector<std::string>& env, int every = 0,
             const std::vector<std::string>& sbatch_args = {}, const std::string& run_dir = "run") const {
    Job j;
    j.dir = slurm().dir() / "jobs" / name;
    fs::create_directories(j.dir);
    const std::string& source = kSource;
    std::vector<std::string> args = {"--job-name=" + name, "--nodes=1", "--ntasks=2", "--chdir=" + j.dir.string(),
                                     "--output=" + j.log().string()};
    args.insert(args.end(), sbatch_args.begin(), sbatch_args.end());
    args.insert(args.end(), {source + "/scripts/slurm/train.sbatch", source + "/configs/quickstart.toml"});
    for (const std::string& s : {"train.steps=" + std::to_string(steps), std::string("train.global_batch=8"), std::string("train.micro_batch=4"),
                                 std::string("train.eval_every=0"), std::string("data.val_examples=32"),
                                 std::string("log.every=1"), std::string("log.progress=lines"),
                                 "checkpoint.every=" + std::to_string(every)})
      args.push_back("--set"), args.push_back(s);
    std::vector<std::string> full_env = {std::string("TESSERA_BIN=") + TESSERA_BINARY, "TESSERA_RUN_DIR=" + (j.dir / run_dir).string()};
    full_env.insert(full_env.end(), env.begin(), env.end());
    j.id = slurm().submit(args, full_env);
    return j;
  }
  std::string field(const Job& j, const std::string& key) const {
    const auto f = slurm().job(j.id);
    const auto it = f.find(key);
    return it == f.end() ? "" : it->second;
  }
  // Waits until the job has recorded at least n steps (it is running).
  bool wait_for_steps(const Job& j, size_t n, double timeout_s = 120) const {
    return LocalSlurm::wait_until([&] { return j.losses().size() >= n; }, timeout_s);
  }
  // SIGUSR1 to the batch script alone, as --signal=B:USR1@120 sends it before the time limit.
  void preempt(const Job& j) const {
    const auto r = slurm().client("scancel", {"--batch", "--signal=USR1", j.id});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
};

// Every tensor of two checkpoints, byte for byte.
void expect_same_tensors(const fs::path& got, const fs::path& want) {
  CheckpointReader a(got.string(), testing::test_world()), b(want.string(), testing::test_world());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& t : b.tensors()) {
    const std::vector<float> x = a.read_all(t.path), y = b.read_all(t.path);
    ASSERT_EQ(x.size(), y.size()) << t.path;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << t.path << " differs";
  }
}

// The mpiexec one as task 1 of an array job, its run directory named after the task (%a).
TEST_F(SlurmCluster, AShortTwoTaskRunCompletesUnderSrunAndMpiexec) {
  const Job by_srun = submit("short_srun", 8, {});
  Job by_mpiexec = submit("short_mpiexec", 8, {"TESSERA_LAUNCHER=mpiexec"}, 0, {"--array=1"}, "run_%a");
  by_mpiexec.run_name = "run_1";
  for (const Job* j : std::vector<const Job*>{&by_srun, &by_mpiexec}) {
    ASSERT_FALSE(j->id.empty());
    EXPECT_EQ(slurm().wait_for_state(j->id, kEnded, 180), "COMPLETED") << j->output();
    EXPECT_EQ(field(*j, "ExitCode"), "0:0");
    EXPECT_EQ(j->losses().size(), 8u) << j->output();
    EXPECT_EQ(j->latest(), "step_00000008.h5") << j->output();
    // The start-up summary, printed once.
    const std::string out = j->output();
    const size_t at = out.find("ranks: 2 on 1 host (");
    EXPECT_NE(at, std::string::npos) << out;
    EXPECT_EQ(out.rfind("ranks: 2 on 1 host ("), at) << "printed more than once: " << out;
    EXPECT_NE(out.find("config: " + kSource + "/configs/quickstart.toml --set train.steps=8"),
              std::string::npos)
        << out;
  }
  EXPECT_NE(by_srun.output().find("launcher: srun | Slurm job " + by_srun.id + ", restart 0"), std::string::npos)
      << by_srun.output();
  EXPECT_NE(by_mpiexec.output().find("launcher: mpiexec (Hydra) | Slurm job " + by_mpiexec.id + " (array " +
                                     by_mpiexec.id + "_1)"),
            std::string::npos)
      << by_mpiexec.output();
  // One layout (dp = 2), two launchers: the same run.
  EXPECT_EQ(by_srun.losses(), by_mpiexec.losses());
}

TEST_F(SlurmCluster, APreemptedRunIsRequeuedAndEndsBitForBitAsAnUninterruptedOne) {
  constexpr int kSteps = 16;
  const Job whole = submit("uninterrupted", kSteps, {});
  // Slowed down (every sample read waits 80 ms, 0.32 s a step: the numbers are the same) so that it
  // is surely still running when the signal arrives.
  const Job preempted = submit("preempted", kSteps, {"TESSERA_TEST_SAMPLE_DELAY_MS=80"});
  ASSERT_FALSE(whole.id.empty() || preempted.id.empty());
  ASSERT_TRUE(wait_for_steps(preempted, 2)) << preempted.output();
  preempt(preempted);
  // It saves, exits 75 and the script requeues it: pending again, restarted once.
  ASSERT_TRUE(LocalSlurm::wait_until(
      [&] { return field(preempted, "Restarts") == "1" && field(preempted, "JobState") == "PENDING"; }, 60))
      << slurm().state(preempted.id) << "\n" << preempted.output();
  const size_t stopped_at = preempted.losses().size();
  EXPECT_LT(stopped_at, size_t{kSteps});
  const std::string saved = (preempted.ckpts() / preempted.latest()).string();
  EXPECT_NE(preempted.output().find("preempted by signal: saved " + saved), std::string::npos) << preempted.output();
  EXPECT_NE(preempted.output().find("requeueing job " + preempted.id), std::string::npos) << preempted.output();
  // A requeued job may not start for about two minutes (its begin time): now. What the two minutes
  // leave behind, waited for here: the previous run's step daemons, still cleaning up for seconds
  // (the requeued job's step has the same id, and the pmi2 socket it names; a new step that starts
  // first loses it: "failed to send temp kvs", a hang in MPI_Finalize), and the second in which
  // slurmd revoked the job's credential (one issued in that same second is refused: "Job
  // credential revoked").
  const auto requeued = Clock::now();
  ASSERT_TRUE(LocalSlurm::wait_until([&] { return slurm().step_daemons(preempted.id).empty(); }, 60));
  std::this_thread::sleep_until(requeued + std::chrono::seconds(2));
  const auto r = slurm().client("scontrol", {"update", "JobId=" + preempted.id, "StartTime=now"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurm().wait_for_state(preempted.id, kEnded, 180), "COMPLETED") << preempted.output();
  EXPECT_EQ(slurm().wait_for_state(whole.id, kEnded, 180), "COMPLETED") << whole.output();
  EXPECT_EQ(field(preempted, "Restarts"), "1");
  const std::string out = preempted.output();
  EXPECT_NE(out.find("resumed from " + saved), std::string::npos) << out;
  EXPECT_NE(out.find("launcher: srun | Slurm job " + preempted.id + ", restart 1"), std::string::npos) << out;
  const auto got = preempted.losses(), want = whole.losses();
  ASSERT_EQ(want.size(), size_t{kSteps});
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), want.back()) << "the final loss";
  const std::string last = "step_000000" + std::to_string(kSteps) + ".h5";
  EXPECT_EQ(preempted.latest(), last);
  expect_same_tensors(preempted.ckpts() / last, whole.ckpts() / last);
}

TEST_F(SlurmCluster, APreemptionPastTheRequeueLimitEndsTheJobWithThePreemptionCode) {
  const Job j = submit("limit", 400, {"TESSERA_TEST_SAMPLE_DELAY_MS=20", "TESSERA_MAX_REQUEUES=0"});
  ASSERT_FALSE(j.id.empty());
  ASSERT_TRUE(wait_for_steps(j, 2)) << j.output();
  preempt(j);
  EXPECT_EQ(slurm().wait_for_state(j.id, kEnded, 60), "FAILED") << j.output();
  EXPECT_EQ(field(j, "ExitCode"), "75:0");
  EXPECT_EQ(field(j, "Restarts"), "0");
  EXPECT_NE(j.output().find("not requeued"), std::string::npos) << j.output();
  EXPECT_TRUE(fs::exists(j.ckpts() / j.latest())) << j.output();
}

// The tessera processes of a job of this cluster, by rank (SLURM_PROCID under srun).
std::map<int, pid_t> ranks_of(const LocalSlurm& slurm, const std::string& job) {
  std::map<int, pid_t> out;
  const fs::path binary = fs::canonical(TESSERA_BINARY);
  for (pid_t p : testing::processes_with_env("SLURM_JOB_ID=" + job)) {
    std::error_code ec;
    if (fs::read_symlink("/proc/" + std::to_string(p) + "/exe", ec) != binary) continue;
    const auto env = testing::environment_of(p);
    if (std::find(env.begin(), env.end(), slurm.conf_env()) == env.end()) continue;  // another cluster's
    for (const std::string& e : env)
      if (e.rfind("SLURM_PROCID=", 0) == 0) out[std::atoi(e.c_str() + 13)] = p;
  }
  return out;
}

TEST_F(SlurmCluster, AKilledRankEndsTheWholeJobAndTheNewestCheckpointIsIntact) {
  const Job j = submit("killed", 400, {"TESSERA_TEST_SAMPLE_DELAY_MS=20"}, 2);
  ASSERT_FALSE(j.id.empty());
  ASSERT_TRUE(wait_for_steps(j, 5)) << j.output();
  ASSERT_TRUE(LocalSlurm::wait_until([&] { return fs::exists(j.ckpts() / "latest"); }, 30)) << j.output();
  const auto ranks = ranks_of(slurm(), j.id);
  ASSERT_EQ(ranks.size(), 2u) << j.output();
  const auto t0 = Clock::now();
  kill(ranks.at(1), SIGKILL);
  const std::string state = slurm().wait_for_state(j.id, kEnded, 90);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(state, "FAILED") << j.output();
  // srun --kill-on-bad-exit ends the step: SIGTERM to rank 0, which is waiting for rank 1 in a
  // collective, then SIGKILL KillWait (5 s here) later.
  EXPECT_LT(took, 45) << j.output();
  EXPECT_EQ(field(j, "Restarts"), "0");
  EXPECT_EQ(j.output().find("requeueing"), std::string::npos) << j.output();
  EXPECT_TRUE(ranks_of(slurm(), j.id).empty()) << "a rank outlived its job";
  // The newest complete checkpoint opens, and every chunk's checksum holds.
  const fs::path newest = j.ckpts() / j.latest();
  ASSERT_TRUE(fs::exists(newest)) << j.output();
  EXPECT_NO_THROW({
    CheckpointReader r(newest.string(), testing::test_world());
    verify_tensors(r, testing::test_world());
  });
}

}  // namespace
}  // namespace tessera
