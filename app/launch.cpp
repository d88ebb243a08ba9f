// Threads per rank, the start-up summary and the MPI_Init bound (app/launch.h): what depends on how
// the job was launched, read from the environment the launcher (mpiexec, srun) leaves.
#include "app/launch.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "parallel/mpi.h"

namespace tessera {

namespace {

bool is_set(const char* v) { return v != nullptr && *v != '\0'; }
std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return is_set(v) ? std::string(v) : fallback;
}

// A positive count, or 0 when `text` is not one.
int positive_count(const char* text) {
  if (!is_set(text)) return 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  return *end == '\0' && n > 0 && n <= 1 << 20 ? static_cast<int>(n) : 0;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// This node's ranks, with this rank's CPU set and theirs: the inputs of default_threads_per_rank.
ThreadInputs thread_inputs(MPI_Comm world) {
  ThreadInputs in;
  in.omp_num_threads = std::getenv("OMP_NUM_THREADS");
  in.slurm_cpus_per_task = std::getenv("SLURM_CPUS_PER_TASK");
  const NodeCpus node = node_cpus(world);
  in.ranks_on_node = node.ranks_on_node;
  in.cpus_allowed = node.cpus_allowed;
  in.cpus_of_node_ranks = node.cpus_of_node_ranks;
  in.ranks_bound = node.ranks_bound;
  return in;
}

std::string launcher_line(int world_size) {
  std::string who;
  if (std::getenv("MPI_LOCALNRANKS") != nullptr) who = "mpiexec (Hydra)";  // set by Hydra only
  else if (std::getenv("SLURM_STEP_ID") != nullptr && world_size > 1) who = "srun";
  else if (world_size > 1) who = "mpirun";
  else who = "one process";
  std::string line = "launcher: " + who;
  if (const char* job = std::getenv("SLURM_JOB_ID"); is_set(job)) {
    line += " | Slurm job " + std::string(job);
    if (const char* task = std::getenv("SLURM_ARRAY_TASK_ID"); is_set(task))
      line += " (array " + env_or("SLURM_ARRAY_JOB_ID", "?") + "_" + task + ")";
    line += ", restart " + env_or("SLURM_RESTART_COUNT", "0") + ", partition " + env_or("SLURM_JOB_PARTITION", "?") +
            ", nodes " + env_or("SLURM_JOB_NODELIST", "?");
  }
  return line;
}

// The first line of MPI_Get_library_version, its tabs and runs of spaces made single spaces.
std::string mpi_library() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string first(buf, static_cast<size_t>(std::max(0, len)));
  first = first.substr(0, first.find('\n'));
  std::string out;
  for (char c : first) {
    if (c == '\t' || c == ' ') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// "2 on 1 host (vm: 0-1)": hosts in the order of their first rank, at most kShown named.
std::string hosts_line(const std::vector<std::string>& host_of_rank) {
  constexpr size_t kShown = 8;
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    auto& list = ranks[host_of_rank[r]];
    if (list.empty()) order.push_back(host_of_rank[r]);
    list.push_back(static_cast<int>(r));
  }
  std::ostringstream os;
  os << host_of_rank.size() << " on " << order.size()
     << (order.size() == 1 ? " host (" : " hosts (");
  for (size_t h = 0; h < order.size() && h < kShown; ++h)
    os << (h ? ", " : "") << order[h] << ": " << rank_ranges(ranks[order[h]]);
  if (order.size() > kShown) os << ", ... " << order.size() - kShown << " more";
  os << ")";
  return os.str();
}

}  // namespace

int default_threads_per_rank(const ThreadInputs& in) {
  if (is_set(in.omp_num_threads)) return 0;
  if (const int slurm = positive_count(in.slurm_cpus_per_task)) return slurm;
  if (in.ranks_on_node <= 1) return 0;
  if (in.ranks_bound) return std::max(1, in.cpus_allowed);
  return std::max(1, in.cpus_of_node_ranks / in.ranks_on_node);
}

void set_threads_per_rank(MPI_Comm world) {
  if (const int n = default_threads_per_rank(thread_inputs(world)); n > 0) omp_set_num_threads(n);
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    os << (i ? "," : "") << ranks[i];
    if (j > i) os << "-" << ranks[j];
    i = j + 1;
  }
  return os.str();
}

std::string launch_summary(MPI_Comm world, const LaunchArgs& args) {
  const int threads = omp_get_max_threads();
  const std::vector<std::string> all = allgather_bytes(world, host_name() + "\n" + std::to_string(threads));
  if (comm_rank(world) != 0) return "";
  std::vector<std::string> hosts;
  int lo = threads, hi = threads;
  for (const std::string& entry : all) {
    const size_t cut = entry.find('\n');
    hosts.push_back(entry.substr(0, cut));
    const int t = std::atoi(entry.c_str() + cut + 1);
    lo = std::min(lo, t), hi = std::max(hi, t);
  }
  std::ostringstream os;
  os << "ranks: " << hosts_line(hosts) << " | " << lo;
  if (hi != lo) os << "-" << hi;
  os << (hi == 1 ? " OpenMP thread" : " OpenMP threads") << " per rank | device CPU\n";
  os << launcher_line(static_cast<int>(all.size())) << "\n";
  os << "mpi: " << mpi_library() << "\n";
  os << "config: " << args.config_path;
  for (const std::string& o : args.overrides) os << " --set " << o;
  os << "\n";
  return os.str();
}

double MpiInitDeadline::timeout_from(const char* env) {
  if (!is_set(env)) return kDefaultSeconds;
  char* end = nullptr;
  const double t = std::strtod(env, &end);
  if (*end != '\0' || !(t >= 0) || t > 1e9) {
    std::fprintf(stderr, "tessera: warning: TESSERA_MPI_INIT_TIMEOUT_S = '%s' is not a number of seconds >= 0; using %g\n",
                 env, kDefaultSeconds);
    return kDefaultSeconds;
  }
  return t;
}

MpiInitDeadline::MpiInitDeadline() {
  const double seconds = timeout_from(std::getenv("TESSERA_MPI_INIT_TIMEOUT_S"));
  if (seconds <= 0) return;
  thread_ = std::thread([this, seconds] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
    // MPI is not up: no rank can be told. This process ends; the launcher sees it and ends the rest.
    std::fprintf(stderr,
                 "tessera: error: MPI_Init did not complete within %g s on %s: a rank of this job did not start "
                 "or cannot reach the others (is tessera at the same path on every host? the launcher's messages "
                 "above say which failed); exiting. TESSERA_MPI_INIT_TIMEOUT_S sets this bound (0 = none)\n",
                 seconds, host_name().c_str());
    std::fflush(nullptr);
    std::_Exit(1);
  });
}

void MpiInitDeadline::done() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

MpiInitDeadline::~MpiInitDeadline() { done(); }

}  // namespace tessera
