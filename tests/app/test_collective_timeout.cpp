// parallel.timeout_s end to end: a 2-rank `tessera train` whose rank 1 is stopped with SIGSTOP ends
// a few seconds after the timeout, with exit code 124 and a report from rank 0 naming the
// collective, its group and the peer; a watched run that nobody stops is unchanged; bad values are
// refused. Every run here has its own deadline, so a regression fails instead of hanging ctest
// (which also has a TIMEOUT for these tests: tests/CMakeLists.txt lists them by name).
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "cli_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// ---- processes, found through /proc (no test hook in tessera itself) ----

// The parent of pid, from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces).
std::optional<pid_t> parent_of(pid_t pid) {
  const std::string stat = testing::read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 1));
  char state = 0;
  pid_t ppid = 0;
  if (!(rest >> state >> ppid)) return std::nullopt;
  return ppid;
}

bool descends_from(pid_t pid, pid_t ancestor) {
  for (int depth = 0; depth < 16 && pid > 1; ++depth) {
    const auto parent = parent_of(pid);
    if (!parent) return false;
    if (*parent == ancestor) return true;
    pid = *parent;
  }
  return false;
}

// The tessera processes mpiexec `launcher` started, by MPI rank (PMI_RANK in their environment).
std::map<int, pid_t> ranks_of(pid_t launcher) {
  std::map<int, pid_t> ranks;
  DIR* proc = opendir("/proc");
  if (!proc) return ranks;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || !descends_from(pid, launcher)) continue;
    if (testing::read_file("/proc/" + std::to_string(pid) + "/comm") != "tessera\n") continue;
    std::string env = testing::read_file("/proc/" + std::to_string(pid) + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    const size_t at = env.find("\nPMI_RANK=");
    if (at != std::string::npos) ranks[std::atoi(env.c_str() + at + 10)] = pid;
  }
  closedir(proc);
  return ranks;
}

// Gone, or a zombie waiting for its parent.
bool ended(pid_t pid) {
  const std::string stat = testing::read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos || stat.compare(close + 2, 1, "Z") == 0;
}

// `mpiexec ... tessera ...` (or tessera alone) in the background, output to dir/output.txt. The
// destructor kills whatever of it still runs (a failed assertion must not leave a stopped rank).
class Job {
 public:
  Job(const std::vector<std::string>& args, const fs::path& dir)
      : log_(dir / "output.txt"), pid_(testing::spawn_logged(args, log_)) {}
  ~Job() {
    if (exit_code_) return;
    for (const auto& [rank, pid] : ranks_of(pid_)) kill(pid, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pid_t pid() const { return pid_; }
  std::string output() const { return testing::read_file(log_); }
  // The exit code once the job has ended, nullopt while it runs after `limit`.
  std::optional<int> wait(Clock::duration limit) {
    const auto deadline = Clock::now() + limit;
    while (!exit_code_ && Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_)
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      else
        std::this_thread::sleep_for(20ms);
    }
    return exit_code_;
  }

 private:
  fs::path log_;
  pid_t pid_ = 0;
  std::optional<int> exit_code_;
};

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::vector<std::string> train_args(const fs::path& dir, const std::string& run, int ranks,
                                    const std::vector<std::string>& sets) {
  std::vector<std::string> args;
  if (ranks > 1) args = {TESSERA_MPIEXEC, "-n", std::to_string(ranks)};
  args.insert(args.end(), {TESSERA_BINARY, "train", (dir / "tiny.toml").string(), "--run-dir", (dir / run).string()});
  args.insert(args.end(), sets.begin(), sets.end());
  return args;
}

fs::path tiny_config(const std::string& name) {
  const fs::path dir = testing::temp_dir(name);
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  return dir;
}

}  // namespace

// Rank 1 stopped mid-training (SIGSTOP: alive, silent, holding its sockets) leaves rank 0 waiting
// in a data-parallel collective. With parallel.timeout_s = 2, rank 0 reports that collective and
// aborts the job, which ends with code 124 a few seconds later, rank 1 included. Without the
// watchdog the job never ends (the deadline below fails the test).
TEST(CollectiveTimeout, AStoppedRankEndsTheJobNamingTheCollective) {
  const fs::path dir = tiny_config("collective_timeout");
  Job job(train_args(dir, "run", 2,
                     {"--set", "parallel.timeout_s=2", "--set", "train.steps=100000", "--set", "train.micro_batch=4",
                      "--set", "log.every=1", "--set", "checkpoint.at_end=false"}),
          dir);
  // Stop rank 1 once training runs (a few steps printed), not during setup.
  const auto started = Clock::now() + 60s;
  while (count(job.output(), "/100000 | loss") < 3) {
    ASSERT_FALSE(job.wait(0s)) << "ended before training ran:\n" << job.output();
    ASSERT_LT(Clock::now(), started) << "no training steps after 60 s:\n" << job.output();
    std::this_thread::sleep_for(50ms);
  }
  const auto ranks = ranks_of(job.pid());
  ASSERT_EQ(ranks.size(), 2u) << "the job's tessera processes by PMI_RANK";
  const pid_t stopped = ranks.at(1);
  ASSERT_EQ(kill(stopped, SIGSTOP), 0);
  const auto t0 = Clock::now();

  const auto code = job.wait(60s);
  ASSERT_TRUE(code) << "the job still runs 60 s after rank 1 was stopped, with parallel.timeout_s = 2:\n"
                    << job.output();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string out = job.output();
  const size_t report = out.find("tessera: error: collective timeout");
  std::printf("[ ended    ] %.1f s after SIGSTOP, exit %d: %s\n", seconds, *code,
              report == std::string::npos ? "no report" : out.substr(report, out.find('\n', report) - report).c_str());
  EXPECT_EQ(*code, 124) << out;
  // 2 s of waiting (which may have begun a little before the stop), at most 0.2 s to notice, 0.5 s
  // for the message to get out, then the abort; the rest is slack for a shared machine.
  EXPECT_GT(seconds, 1.0) << out;
  EXPECT_LT(seconds, 12.0) << out;
  EXPECT_NE(out.find("tessera: error: collective timeout (parallel.timeout_s = 2): world rank 0 waited 2."),
            std::string::npos) << out;
  // Which collective depends on where rank 1 stopped: one of the dp group's (gradients, targets,
  // loss) or of the world group's (the stop and data votes); all go through the watch.
  const std::string peer = " (world ranks 0, 1) for world rank 1, which has not come (stopped, hung or dead)";
  EXPECT_TRUE(out.find("on the dp group" + peer) != std::string::npos ||
              out.find("on the world group" + peer) != std::string::npos) << out;
  EXPECT_TRUE(out.find(" in all_reduce of ") != std::string::npos) << out;
  EXPECT_EQ(out.find("world rank 1 waited"), std::string::npos) << "the stopped rank reports nothing:\n" << out;
  const auto gone = Clock::now() + 10s;
  while (!ended(stopped) && Clock::now() < gone) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(ended(stopped)) << "the abort ends the stopped rank too";
  fs::remove_all(dir);
}

// parallel.timeout_s on a run that nobody stops: the same losses as without it, exit 0, no report
// (the checkpoint at the end is written under the watch too).
TEST(CollectiveTimeout, AWatchedRunFinishesAsBefore) {
  const fs::path dir = tiny_config("collective_timeout_ok");
  const std::vector<std::string> sets = {"--set", "train.steps=6", "--set", "train.micro_batch=2", "--set",
                                         "log.every=1"};
  std::vector<double> want;
  for (const std::string run : {"plain", "watched"}) {
    std::vector<std::string> s = sets;
    if (run == "watched") s.insert(s.end(), {"--set", "parallel.timeout_s=30"});
    Job job(train_args(dir, run, 2, s), dir);
    const auto code = job.wait(90s);
    ASSERT_TRUE(code) << run << " still runs after 90 s:\n" << job.output();
    ASSERT_EQ(*code, 0) << job.output();
    EXPECT_EQ(job.output().find("collective timeout"), std::string::npos) << job.output();
    EXPECT_TRUE(fs::exists(dir / run / "checkpoints" / "step_00000006.h5")) << run;
    const auto got = testing::losses(dir / run / "metrics.jsonl");
    ASSERT_EQ(got.size(), 6u) << run;
    if (want.empty()) want = got;
    EXPECT_EQ(got, want) << "the watch changes no arithmetic";
  }
  fs::remove_all(dir);
}

TEST(CollectiveTimeout, RefusesANegativeOrNonFiniteTimeout) {
  const fs::path dir = tiny_config("collective_timeout_bad");
  for (const std::string bad : {"-1", "inf", "nan"}) {
    Job job(train_args(dir, "run", 1, {"--set", "parallel.timeout_s=" + bad}), dir);
    const auto code = job.wait(60s);
    ASSERT_TRUE(code) << bad << ": " << job.output();
    EXPECT_EQ(*code, 1) << bad << ": " << job.output();
    EXPECT_NE(job.output().find("parallel.timeout_s = " + bad), std::string::npos) << job.output();
    EXPECT_NE(job.output().find("[0, inf)"), std::string::npos) << job.output();
  }
  fs::remove_all(dir);
}

}  // namespace tessera
