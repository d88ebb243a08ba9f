// How the ranks of a `tessera train` job were launched (mpirun/mpiexec, srun, or one process) and
// what follows from it: the OpenMP threads each rank runs, the start-up summary printed once at
// the top of the log, and a bound on MPI_Init, where a rank that never started leaves the others
// waiting forever. Guide: docs/launching.md.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

// What decides a rank's OpenMP thread count: the environment, and the CPU sets of the job's ranks
// on this node.
struct ThreadInputs {
  const char* omp_num_threads = nullptr;      // OMP_NUM_THREADS (null: unset)
  const char* slurm_cpus_per_task = nullptr;  // SLURM_CPUS_PER_TASK (null: unset)
  int ranks_on_node = 1;                      // ranks of the job on this node
  int cpus_allowed = 1;                       // CPUs this rank may run on (its affinity mask)
  int cpus_of_node_ranks = 1;                 // CPUs in the union of the node's ranks' masks
  bool ranks_bound = false;                   // the launcher gave each rank CPUs of its own (disjoint masks)
};

// The threads a rank should run, or 0 to leave OpenMP's own choice. OMP_NUM_THREADS, when set and
// not empty, is the user's choice (0). Else Slurm's SLURM_CPUS_PER_TASK (sbatch/srun -c), the CPUs
// Slurm gave each task. Else, with several ranks on the node: a launcher that bound each rank to
// CPUs of its own decided (those CPUs); otherwise the ranks' CPUs are split evenly between them.
// Two ranks of two threads each on two cores stall at every parallel region, so oversubscribing
// is never the default.
int default_threads_per_rank(const ThreadInputs& in);

// Applies default_threads_per_rank to this process (omp_set_num_threads); collective over world
// (counts the ranks on each node).
void set_threads_per_rank(MPI_Comm world);

// What the summary needs besides MPI: the command's config file and --set overrides.
struct LaunchArgs {
  std::string config_path;
  std::vector<std::string> overrides;
};

// Collective over world: the start-up summary's lines (world size, hosts and the ranks on each,
// threads per rank, devices, the launcher and Slurm job, the MPI library, the config file and
// overrides) on rank 0; "" on the others. The trainer's header adds the layout and the checkpoint
// it resumed from.
std::string launch_summary(MPI_Comm world, const LaunchArgs& args);

// "0-3,6,8-9": sorted ranks as ranges.
std::string rank_ranges(const std::vector<int>& ranks);

// Bounds MPI_Init: MPI_Init returns only once every rank of the job has started it, so a rank that
// never started (tessera missing on one host, an exec error) leaves the others waiting there for
// ever under mpiexec (Hydra reports the failed launch and waits on). Constructed before MPI_Init
// and told done() after it; if that takes longer than the timeout, the process prints why and
// exits 1, and the launcher then ends the rest of the job. The timeout is TESSERA_MPI_INIT_TIMEOUT_S
// seconds (default kDefaultSeconds; 0 = no bound).
class MpiInitDeadline {
 public:
  static constexpr double kDefaultSeconds = 120;
  MpiInitDeadline();
  ~MpiInitDeadline();  // done(), if it was not called
  MpiInitDeadline(const MpiInitDeadline&) = delete;
  MpiInitDeadline& operator=(const MpiInitDeadline&) = delete;
  void done();

  // TESSERA_MPI_INIT_TIMEOUT_S's value: null or empty = the default; else a number >= 0 (an invalid
  // one: the default, with a warning on stderr).
  static double timeout_from(const char* env);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace tessera
