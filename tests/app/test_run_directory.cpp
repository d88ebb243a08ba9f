// Tests what a run owns in its directory (app/checkpoint/checkpointing.h run ids and pruning, app/run_lock.h)
// through `tessera train`: a fresh run over another run's checkpoints is refused or, with
// checkpoint.overwrite, leaves them alone; pruning spares files tessera did not write and `latest`;
// a second job on a locked directory stops at once, naming the holder.
#include <gtest/gtest.h>
#include <sys/file.h>

#include <chrono>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/checkpointing.h"
#include "app/run_lock.h"
#include "cli_testing.h"
#include "error_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;

using testing::make_run;
using testing::TrainRun;

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string run_id_of(const fs::path& file) {
  CheckpointReader r(file.string(), testing::test_world());
  const auto it = r.meta().extra.find(kRunIdKey);
  return it == r.meta().extra.end() ? "" : std::get<std::string>(it->second);
}

// The file `latest` names, which must exist.
std::string latest_of(const fs::path& ckpts) {
  std::string name = testing::read_file(ckpts / "latest");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  EXPECT_TRUE(fs::exists(ckpts / name)) << "`latest` names " << name << ", which does not exist";
  return name;
}

std::string hostname() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// `tessera <args>` started in the background, output to log; returns its PID.
pid_t spawn_tessera(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> full = {TESSERA_BINARY};
  full.insert(full.end(), args.begin(), args.end());
  return testing::spawn_logged(std::move(full), log);
}

// Kills and reaps a background process on scope exit, so a failed assertion leaves none running.
struct Reaper {
  pid_t pid;
  ~Reaper() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

bool wait_for_nonempty(const fs::path& file, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(file) || fs::file_size(file) == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

// Only the names checkpoint_file_name writes count as checkpoints.
TEST(RunDirectory, CheckpointStepAcceptsOnlyTheNamesTesseraWrites) {
  EXPECT_EQ(checkpoint_step("step_00000010.h5"), 10);
  EXPECT_EQ(checkpoint_step("step_00000000.h5"), 0);
  EXPECT_EQ(checkpoint_step(checkpoint_file_name(123456789)), 123456789);  // past 8 digits
  for (const char* name : {"step_notes.h5", "step_00000006_best_keep.h5", "step_0000010.h5", "step_000000010.h5",
                           "step_00000010.h5.tmp", "step_+0000010.h5", "step_-0000010.h5", "xstep_00000010.h5",
                           "step_00000010.H5", "step_.h5", "latest"})
    EXPECT_EQ(checkpoint_step(name), std::nullopt) << name;
  const std::string a = new_run_id(), b = new_run_id();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), std::string("20250131T120000Z-0123456789abcdef").size()) << a;
}

// Issue #11: a second run (resume = "none", another seed) in a reused run directory had its
// checkpoints pruned in favour of the old run's higher steps. Now it is refused, naming the
// files and the ways out, and nothing of the old run changes (config.toml, metrics, `latest`).
TEST(RunDirectory, FreshRunOverAnotherRunsCheckpointsIsRefused) {
  const TrainRun run = make_run("rundir_refuse");
  RunResult r = run.train({"train.steps=10", "checkpoint.every=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string config = testing::read_file(run.run() / "config.toml"),
                    metrics = testing::read_file(run.run() / "metrics.jsonl");
  r = run.train({"train.steps=6", "train.seed=7", "checkpoint.resume=\"none\""});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const std::string& want : {run.ckpts().string(), std::string("holds checkpoints of another run"),
                                  std::string("step_00000005.h5, step_00000010.h5"),
                                  std::string("checkpoint.resume = \"auto\""),
                                  std::string("checkpoint.overwrite = true")})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  EXPECT_EQ(names_in(run.ckpts()), (std::vector<std::string>{"latest", "step_00000005.h5", "step_00000010.h5"}));
  EXPECT_EQ(latest_of(run.ckpts()), "step_00000010.h5");
  EXPECT_EQ(testing::read_file(run.run() / "config.toml"), config);
  EXPECT_EQ(testing::read_file(run.run() / "metrics.jsonl"), metrics);
  fs::remove_all(run.dir);
}

// With checkpoint.overwrite the new run starts, prunes only its own files, leaves the old run's
// alone, and a later resume = "auto" continues the new run (not the old one's higher step).
TEST(RunDirectory, OverwriteKeepsTheNewRunsCheckpointsAndResumesThem) {
  const TrainRun run = make_run("rundir_overwrite");
  RunResult r = run.train({"train.steps=10", "checkpoint.every=2", "checkpoint.keep_last=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string old_id = run_id_of(run.ckpts() / "step_00000010.h5");
  EXPECT_FALSE(old_id.empty());
  EXPECT_NE(r.output.find("run id " + old_id), std::string::npos) << r.output;

  r = run.train({"train.steps=6", "train.seed=7", "checkpoint.every=2", "checkpoint.keep_last=2",
                 "checkpoint.resume=\"none\"", "checkpoint.overwrite=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(names_in(run.ckpts()), (std::vector<std::string>{"latest", "step_00000004.h5", "step_00000006.h5",
                                                              "step_00000008.h5", "step_00000010.h5"}));
  EXPECT_EQ(latest_of(run.ckpts()), "step_00000006.h5");
  const std::string new_id = run_id_of(run.ckpts() / "step_00000006.h5");
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(run_id_of(run.ckpts() / "step_00000004.h5"), new_id);
  EXPECT_EQ(run_id_of(run.ckpts() / "step_00000010.h5"), old_id);

  r = run.train({"train.steps=8", "train.seed=7", "checkpoint.every=2", "checkpoint.keep_last=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_00000006.h5 at step 6"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run id " + new_id), std::string::npos) << "a resumed run keeps its id\n" << r.output;
  EXPECT_EQ(latest_of(run.ckpts()), "step_00000008.h5");
  EXPECT_EQ(run_id_of(run.ckpts() / "step_00000008.h5"), new_id);
  EXPECT_EQ(names_in(run.ckpts()),
            (std::vector<std::string>{"latest", "step_00000006.h5", "step_00000008.h5", "step_00000010.h5"}));
  fs::remove_all(run.dir);
}

// Files that merely start with step_ (a user's copy, notes) and junk under a checkpoint's name are
// never deleted and never resumed from; the junk is skipped with a warning.
TEST(RunDirectory, UserFilesAndJunkAreNeverDeletedNorResumed) {
  const TrainRun run = make_run("rundir_userfiles");
  RunResult r = run.train({"train.steps=6", "checkpoint.every=3", "checkpoint.keep_last=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::copy_file(run.ckpts() / "step_00000006.h5", run.dir / "best.h5");
  auto add_user_files = [&] {
    fs::copy_file(run.dir / "best.h5", run.ckpts() / "step_00000006_best_keep.h5", fs::copy_options::overwrite_existing);
    std::ofstream(run.ckpts() / "step_notes.h5") << "my notes\n";
    std::ofstream(run.ckpts() / "step_99999999.h5") << "not a checkpoint\n";
  };
  add_user_files();
  const std::vector<std::string> users = {"step_00000006_best_keep.h5", "step_99999999.h5", "step_notes.h5"};

  r = run.train({"train.steps=12", "checkpoint.every=3", "checkpoint.keep_last=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_00000006.h5 at step 6"), std::string::npos) << r.output;
  EXPECT_EQ(names_in(run.ckpts()), (std::vector<std::string>{"latest", "step_00000006_best_keep.h5",
                                                              "step_00000009.h5", "step_00000012.h5",
                                                              "step_99999999.h5", "step_notes.h5"}));
  EXPECT_EQ(latest_of(run.ckpts()), "step_00000012.h5");

  // With no checkpoint of tessera's own left, "auto" must not pick the user's copy (or the junk).
  for (const char* f : {"latest", "step_00000009.h5", "step_00000012.h5"}) fs::remove(run.ckpts() / f);
  add_user_files();  // whatever happened above, this part checks resume on its own
  r = run.train({"train.steps=3", "checkpoint.keep_last=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("warning: skipping checkpoint"), std::string::npos) << r.output;
  for (const auto& f : users) EXPECT_TRUE(fs::exists(run.ckpts() / f)) << f;
  EXPECT_EQ(latest_of(run.ckpts()), "step_00000003.h5");
  fs::remove_all(run.dir);
}

// Junk under the highest checkpoint name once made keep_last delete every valid checkpoint,
// `latest`'s included.
TEST(RunDirectory, JunkNamedLikeACheckpointCostsNoValidOne) {
  const TrainRun run = make_run("rundir_junk");
  fs::create_directories(run.ckpts());
  std::ofstream(run.ckpts() / "step_99999999.h5") << "not a checkpoint\n";
  const RunResult r = run.train({"train.steps=4", "checkpoint.every=2", "checkpoint.keep_last=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(names_in(run.ckpts()), (std::vector<std::string>{"latest", "step_00000004.h5", "step_99999999.h5"}));
  EXPECT_EQ(latest_of(run.ckpts()), "step_00000004.h5");
  fs::remove_all(run.dir);
}

// The lock itself: a second holder (another open file description, as another process would have)
// is refused with the first one's host and PID; once the first is released the lock is free.
TEST(RunLock, SecondHolderIsRefusedWithTheHolderNamed) {
  const fs::path dir = testing::temp_dir("runlock_unit");
  {
    RunLock first(dir.string());
    ASSERT_TRUE(first.held());
    EXPECT_EQ(first.path(), (dir / ".tessera.lock").string());
    EXPECT_NE(testing::read_file(first.path()).find("pid " + std::to_string(getpid())), std::string::npos);
    EXPECT_TRUE(testing::throws_with([&] { RunLock second(dir.string()); },
                                     {"host " + hostname() + ", pid " + std::to_string(getpid()), first.path()}))
        << "a second lock on " << dir;
  }
  RunLock again(dir.string());
  EXPECT_TRUE(again.held());
  fs::remove_all(dir);
}

// A checkpoint.dir inside the run directory shares its lock; one outside gets its own.
TEST(RunLock, CheckpointDirOutsideTheRunDirectoryIsLockedToo) {
  const fs::path dir = testing::temp_dir("runlock_dirs");
  fs::create_directories(dir / "run");
  auto lock_paths = [&](const fs::path& ckpt) {
    std::vector<std::string> paths;
    for (const RunLock& l : lock_run_directories((dir / "run").string(), ckpt.string())) paths.push_back(l.path());
    return paths;
  };
  const std::string run_lock = (dir / "run" / ".tessera.lock").string();
  EXPECT_EQ(lock_paths(dir / "run" / "checkpoints"), std::vector<std::string>{run_lock});
  EXPECT_EQ(lock_paths(dir / "run" / "x" / ".." / "ckpt"), std::vector<std::string>{run_lock});
  EXPECT_EQ(lock_paths(dir / "run"), std::vector<std::string>{run_lock});
  EXPECT_EQ(lock_paths(dir / "run" / ".." / "shared"),
            (std::vector<std::string>{run_lock, (dir / "run" / ".." / "shared" / ".tessera.lock").string()}));
  EXPECT_EQ(lock_paths(dir / "runx"), (std::vector<std::string>{run_lock, (dir / "runx" / ".tessera.lock").string()}));
  fs::remove_all(dir);
}

// Issue #11: two jobs on one run directory. The second stops at once, naming the first (host and
// PID) and the lock file, and leaves the first's metrics alone; after the first is killed with
// SIGKILL, and after a normal exit, the next job takes the lock.
TEST(RunDirectory, SecondJobOnALockedRunDirectoryStopsAtOnce) {
  const TrainRun run = make_run("rundir_lock");
  const pid_t first = spawn_tessera(run.args({"train.steps=100000"}), run.dir / "first.txt");
  Reaper reaper{first};
  ASSERT_TRUE(wait_for_nonempty(run.run() / "metrics.jsonl", std::chrono::seconds(60)))
      << testing::read_file(run.dir / "first.txt");
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = run.train({"train.steps=3"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds, 20.0) << "the second job must stop before building anything";
  for (const std::string& want : {"host " + hostname() + ", pid " + std::to_string(first),
                                  (run.run() / ".tessera.lock").string(), std::string("in use by another tessera job")})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  EXPECT_EQ(r.output.find("step 1/3"), std::string::npos) << r.output;

  kill(first, SIGKILL);
  int status = 0;
  waitpid(first, &status, 0);
  reaper.pid = 0;
  EXPECT_TRUE(WIFSIGNALED(status));
  const std::string metrics = testing::read_file(run.run() / "metrics.jsonl");
  EXPECT_EQ(metrics.find("\"step\": 3,"), metrics.rfind("\"step\": 3,")) << "one writer: " << metrics;

  r = run.train({"train.steps=3"});
  ASSERT_EQ(r.exit_code, 0) << "the lock of a killed job is free\n" << r.output;
  r = run.train({"train.steps=5"});
  ASSERT_EQ(r.exit_code, 0) << "the lock of a finished job is free\n" << r.output;
  EXPECT_NE(r.output.find("at step 3"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// A checkpoint.dir outside the run directory is locked too: two runs sharing it would prune and
// resume each other's files. The holder here is this test process (a real flock, as another job's).
TEST(RunDirectory, SharedCheckpointDirIsLockedToo) {
  const TrainRun run = make_run("rundir_shared_ckpt");
  const fs::path shared = run.dir / "shared_ckpts";
  fs::create_directories(shared);
  const std::string set_dir = "checkpoint.dir=\"" + shared.string() + "\"";
  {
    RunLock other(shared.string());
    const RunResult r = run.train({"train.steps=3", set_dir});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find((shared / ".tessera.lock").string()), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("pid " + std::to_string(getpid())), std::string::npos) << r.output;
  }
  const RunResult r = run.train({"train.steps=3", set_dir});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(shared / "step_00000003.h5"));
  EXPECT_TRUE(fs::exists(run.run() / ".tessera.lock"));
  fs::remove_all(run.dir);
}

// Under mpiexec only rank 0 takes the lock; its refusal stops every rank with one message.
TEST(RunDirectory, LockedRunDirectoryStopsEveryRankWithOneMessage) {
  const TrainRun run = make_run("rundir_lock_mpi");
  fs::create_directories(run.run());
  RunLock other(run.run().string());
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY};
  for (const auto& a : run.args({"train.steps=3"})) args.push_back(a);
  const RunResult r = testing::run_program(TESSERA_MPIEXEC, args, run.dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string want = "in use by another tessera job (host " + hostname() + ", pid " + std::to_string(getpid());
  const size_t at = r.output.find(want);
  EXPECT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.rfind(want), at) << "printed more than once:\n" << r.output;
  EXPECT_EQ(r.output.find("aborting"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

}  // namespace tessera
