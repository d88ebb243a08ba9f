// A real one-node Slurm cluster for tests (LocalSlurm): munged, slurmctld and slurmd started as
// root from Debian's slurm-wlm and munge packages, each with its own key, socket, ports, state and
// logs in a temp directory, and stopped by PID when the cluster object goes, however the test ended.
// Plugins that need no cgroups (proctrack/linuxproc, task/none), so it runs in containers too.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_testing.h"
#include "process_testing.h"

namespace tessera::testing {

namespace fs = std::filesystem;

// name's path on PATH or in the sbin directories (daemons live there; ctest's PATH may lack them);
// "" if absent.
inline std::string find_program(const std::string& name) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin:/usr/local/sbin:/usr/local/bin";
  std::istringstream in(dirs);
  for (std::string d; std::getline(in, d, ':');) {
    if (d.empty()) continue;
    const fs::path p = fs::path(d) / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// The last `lines` lines of a file, for failure messages.
inline std::string tail_of(const fs::path& file, size_t lines = 15) {
  std::istringstream in(read_file(file));
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out.empty() ? "    (empty)\n" : out;
}

// The environment of process pid, one "KEY=value" per entry (empty if it is gone or unreadable).
inline std::vector<std::string> environment_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::vector<std::string> out;
  for (std::string e; std::getline(in, e, '\0');) out.push_back(e);
  return out;
}

// Every process whose environment holds `entry` (e.g. "SLURM_CONF=/tmp/x/slurm.conf").
inline std::vector<pid_t> processes_with_env(const std::string& entry) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const pid_t p = static_cast<pid_t>(std::atoi(e.path().filename().c_str()));
    if (p <= 0 || p == getpid()) continue;
    const auto env = environment_of(p);
    if (std::find(env.begin(), env.end(), entry) != env.end()) out.push_back(p);
  }
  return out;
}

inline int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

class LocalSlurm {
 public:
  using Clock = std::chrono::steady_clock;

  // Why no cluster can start here ("" when one can): a program missing, or not root (slurmd
  // starts every job as its user).
  static std::string unavailable() {
    for (const char* p : {"munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo"})
      if (find_program(p).empty())
        return std::string(p) + " is not installed (Debian packages slurm-wlm and munge: scripts/setup.sh installs them)";
    if (geteuid() != 0) return "slurmd must run as root to start jobs, and this test runs as uid " + std::to_string(geteuid());
    return "";
  }

  // Starts the cluster in dir (created); error() says why when it did not come up.
  explicit LocalSlurm(fs::path dir) : dir_(std::move(dir)) {
    fs::remove_all(dir_);
    for (const char* d : {"run", "munge", "state", "spool", "log", "jobs"}) fs::create_directories(dir_ / d);
    // munged refuses a socket directory others cannot enter, and a key others can read.
    chmod(dir_.c_str(), 0755);
    chmod((dir_ / "run").c_str(), 0755);
    chmod((dir_ / "munge").c_str(), 0700);
    conf_ = dir_ / "slurm.conf";
    node_ = host_name();
    error_ = start();
  }
  ~LocalSlurm() { stop(); }
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;

  const std::string& error() const { return error_; }
  const fs::path& dir() const { return dir_; }
  // The entry every client and job of this cluster carries, and by which its leftovers are found.
  std::string conf_env() const { return "SLURM_CONF=" + conf_.string(); }

  // Runs a Slurm client (sbatch, squeue, ...) against this cluster; its exit code and output.
  RunResult client(const std::string& program, const std::vector<std::string>& args,
                   const std::vector<std::string>& env = {}, double timeout_s = 60) const {
    std::vector<std::string> full_env = {conf_env()};
    full_env.insert(full_env.end(), env.begin(), env.end());
    const fs::path log = dir_ / "log" / ("client_" + std::to_string(++calls_) + ".txt");
    Spawned p(find_program(program), args, log, full_env);
    RunResult r;
    r.exit_code = p.wait_exit(timeout_s).value_or(-1);
    r.output = p.output();
    return r;
  }

  // sbatch --parsable args...; the job id ("" after an ADD_FAILURE when sbatch failed).
  std::string submit(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) const {
    std::vector<std::string> full = {"--parsable"};
    full.insert(full.end(), args.begin(), args.end());
    const RunResult r = client("sbatch", full, env);
    std::string id = r.output.substr(0, r.output.find_first_of(";\n"));
    if (r.exit_code != 0 || id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
      ADD_FAILURE() << "sbatch failed (" << r.exit_code << "): " << r.output;
      return "";
    }
    return id;
  }

  // The job's fields as `scontrol show job -o` prints them (JobState, Restarts, ExitCode, ...);
  // empty when Slurm does not know the job.
  std::map<std::string, std::string> job(const std::string& id) const {
    const RunResult r = client("scontrol", {"show", "job", "-o", id});
    std::map<std::string, std::string> fields;
    if (r.exit_code != 0) return fields;
    std::istringstream in(r.output);
    for (std::string word; in >> word;) {
      const size_t eq = word.find('=');
      if (eq != std::string::npos) fields.emplace(word.substr(0, eq), word.substr(eq + 1));
    }
    return fields;
  }
  std::string state(const std::string& id) const {
    const auto f = job(id);
    const auto it = f.find("JobState");
    return it == f.end() ? "" : it->second;
  }
  // Polls until done() or timeout_s; the last value of done().
  template <typename F>
  static bool wait_until(F&& done, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (!done()) {
      if (Clock::now() > deadline) return done();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return true;
  }
  // Waits until the job's state is one of `states` ("COMPLETED", "FAILED", ...); the last seen.
  std::string wait_for_state(const std::string& id, const std::vector<std::string>& states, double timeout_s) const {
    std::string s;
    wait_until([&] {
      s = state(id);
      return std::find(states.begin(), states.end(), s) != states.end();
    }, timeout_s);
    return s;
  }

  // The slurmstepd processes of a job of this cluster (its batch script's and its steps').
  std::vector<pid_t> step_daemons(const std::string& job) const {
    std::vector<pid_t> out;
    const std::string prefix = "slurmstepd: [" + job + ".";
    for (pid_t p : processes_with_env(conf_env()))
      if (read_file("/proc/" + std::to_string(p) + "/cmdline").rfind(prefix, 0) == 0) out.push_back(p);
    return out;
  }

  // The daemons' logs' ends, for failure messages.
  std::string logs() const {
    std::string out;
    for (const char* f : {"munged.log", "slurmctld.log", "slurmd.log"})
      out += std::string("  ") + f + ":\n" + tail_of(dir_ / "log" / f);
    return out;
  }

 private:
  static std::string host_name() {
    char buf[256] = {};
    gethostname(buf, sizeof buf - 1);
    std::string h = buf;
    return h.substr(0, h.find('.'));
  }

  // Starts a daemon in the foreground; with setpriv it dies with this process, should the test
  // be killed before its destructor runs.
  std::unique_ptr<Spawned> daemon(const std::string& name, std::vector<std::string> args) const {
    const std::string program = find_program(name);
    const std::string setpriv = find_program("setpriv");
    std::string exe = program;
    if (!setpriv.empty()) {
      args.insert(args.begin(), {"--pdeathsig", "KILL", program});
      exe = setpriv;
    }
    return std::make_unique<Spawned>(exe, args, dir_ / "log" / (name + ".out"), std::vector<std::string>{conf_env()});
  }

  void write_conf(int ctld_port, int slurmd_port) const {
    const int cpus = std::max(2u, std::thread::hardware_concurrency());  // 2 tasks fit even on one core
    std::ofstream out(conf_);
    out << "# A one-node cluster for tessera's tests (tests/app/slurm_testing.h)\n"
        << "ClusterName=tessera\n"
        << "SlurmctldHost=" << node_ << "(127.0.0.1)\n"
        << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << slurmd_port << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << (dir_ / "run" / "munge.sock").string() << "\n"
        << "StateSaveLocation=" << (dir_ / "state").string() << "\n"
        << "SlurmdSpoolDir=" << (dir_ / "spool").string() << "\n"
        << "SlurmctldPidFile=" << (dir_ / "run" / "slurmctld.pid").string() << "\n"
        << "SlurmdPidFile=" << (dir_ / "run" / "slurmd.pid").string() << "\n"
        << "SlurmctldLogFile=" << (dir_ / "log" / "slurmctld.log").string() << "\n"
        << "SlurmdLogFile=" << (dir_ / "log" / "slurmd.log").string() << "\n"
        // No cgroups: containers (and this project's CI) may not delegate them.
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        << "SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\nJobRequeue=1\n"
        << "SlurmdParameters=config_overrides\n"  // the node as declared here, whatever the hardware
        // A step's tasks get SIGTERM, then SIGKILL this many seconds later (the default is 30).
        << "KillWait=5\nInactiveLimit=0\nMinJobAge=600\n"
        << "NodeName=" << node_ << " NodeHostname=" << node_ << " NodeAddr=127.0.0.1 CPUs=" << cpus
        << " State=UNKNOWN\n"
        << "PartitionName=tessera Nodes=" << node_ << " Default=YES MaxTime=INFINITE State=UP\n";
  }

  std::string start() {
    // munge: its own key and socket, so that a system munged (if any) is left alone.
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      random.read(key.data(), static_cast<std::streamsize>(key.size()));
      std::ofstream(dir_ / "munge" / "munge.key", std::ios::binary) << key;
      chmod((dir_ / "munge" / "munge.key").c_str(), 0400);
    }
    const fs::path sock = dir_ / "run" / "munge.sock";
    munged_ = daemon("munged", {"--foreground", "--socket=" + sock.string(),
                                "--key-file=" + (dir_ / "munge" / "munge.key").string(),
                                "--pid-file=" + (dir_ / "run" / "munged.pid").string(),
                                "--log-file=" + (dir_ / "log" / "munged.log").string(),
                                "--seed-file=" + (dir_ / "munge" / "seed").string()});
    if (!wait_until([&] { return fs::exists(sock); }, 20))
      return "munged did not create its socket within 20 s:\n" + tail_of(dir_ / "log" / "munged.out") +
             tail_of(dir_ / "log" / "munged.log");
    write_conf(free_tcp_port(), free_tcp_port());
    ctld_ = daemon("slurmctld", {"-D", "-i", "-f", conf_.string()});
    slurmd_ = daemon("slurmd", {"-D", "-f", conf_.string(), "-N", node_});
    std::string seen;
    const bool idle = wait_until([&] {
      const RunResult r = client("sinfo", {"-h", "-N", "-o", "%T"}, {}, 10);
      seen = r.output;
      return r.exit_code == 0 && seen.rfind("idle", 0) == 0;
    }, 60);
    if (!idle) return "the node did not become idle within 60 s (sinfo: " + seen + ")\n" + logs();
    return "";
  }

  // Cancels every job, waits for them to go, then stops the daemons (SIGTERM, SIGKILL after 10 s)
  // and kills whatever still carries this cluster's SLURM_CONF (a step daemon, a task).
  void stop() {
    if (ctld_ && error_.empty()) {
      const RunResult q = client("squeue", {"-h", "-o", "%i"}, {}, 10);
      std::vector<std::string> ids;
      std::istringstream in(q.output);
      for (std::string id; in >> id;) ids.push_back(id);
      if (!ids.empty()) {
        std::vector<std::string> args = {"--full"};
        args.insert(args.end(), ids.begin(), ids.end());
        client("scancel", args, {}, 10);
        wait_until([&] {
          const RunResult r = client("squeue", {"-h", "-o", "%i"}, {}, 10);
          return r.exit_code != 0 || r.output.find_first_not_of(" \n") == std::string::npos;
        }, 20);
      }
    }
    for (auto* d : {&slurmd_, &ctld_, &munged_}) {
      if (!*d) continue;
      (*d)->signal(SIGTERM);
      (*d)->wait_exit(10);
      d->reset();
    }
    for (pid_t p : processes_with_env(conf_env())) kill(p, SIGKILL);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  fs::path dir_, conf_;
  std::string node_;
  std::string error_;
  std::unique_ptr<Spawned> munged_, ctld_, slurmd_;
  mutable int calls_ = 0;
};

}  // namespace tessera::testing
