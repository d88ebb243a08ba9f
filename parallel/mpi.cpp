// MpiSession and the collective error agreement. A failed MPI call here is a broken
// environment, not a user error: it throws with the MPI error string.
#include "parallel/mpi.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/check.h"

namespace tessera {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  detail::fail(what, " failed: ", std::string(text, static_cast<size_t>(len)));
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) {
    check_mpi(MPI_Query_thread(&thread_level_), "MPI_Query_thread");
    return;
  }
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_), "MPI_Init_thread");
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int comm_rank(MPI_Comm comm) {
  int r = 0;
  check_mpi(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

int comm_size(MPI_Comm comm) {
  int s = 0;
  check_mpi(MPI_Comm_size(comm, &s), "MPI_Comm_size");
  return s;
}

int ranks_on_this_node(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, comm_rank(comm), MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  const int n = comm_size(node);
  MPI_Comm_free(&node);
  return n;
}

const char* to_string(MpiWait how) { return how == MpiWait::Yield ? "yield" : "spin"; }

MpiWait mpi_wait_for(int64_t ranks_on_node, int64_t threads_per_rank, int64_t cpus) {
  return ranks_on_node * std::max<int64_t>(1, threads_per_rank) > std::max<int64_t>(1, cpus) ? MpiWait::Yield
                                                                                             : MpiWait::Spin;
}

namespace {

// This process's affinity mask; every online CPU where it cannot be read.
cpu_set_t allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < std::max(1L, online) && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  return set;
}

}  // namespace

NodeCpus node_cpus(MPI_Comm comm) {
  NodeCpus n;
  cpu_set_t mine = allowed_cpus();
  n.cpus_allowed = CPU_COUNT(&mine);
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, comm_rank(comm), MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  n.ranks_on_node = comm_size(node);
  const std::vector<std::string> sets =
      allgather_bytes(node, std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  MPI_Comm_free(&node);
  cpu_set_t all;
  CPU_ZERO(&all);
  int sum = 0;
  for (const std::string& bytes : sets) {
    cpu_set_t s;
    std::memcpy(&s, bytes.data(), sizeof s);
    CPU_OR(&all, &all, &s);
    sum += CPU_COUNT(&s);
  }
  n.cpus_of_node_ranks = CPU_COUNT(&all);
  n.ranks_bound = n.ranks_on_node > 1 && sum == n.cpus_of_node_ranks;  // no CPU in two sets
  return n;
}

MpiWait mpi_wait_on_this_node(MPI_Comm comm, int64_t threads_per_rank) {
  const NodeCpus node = node_cpus(comm);
  return mpi_wait_for(node.ranks_on_node, threads_per_rank, node.cpus_of_node_ranks);
}

MpiWait resolve_mpi_wait(const std::string& setting, MPI_Comm comm, int64_t threads_per_rank) {
  if (setting == "spin") return MpiWait::Spin;
  if (setting == "yield") return MpiWait::Yield;
  TESSERA_CHECK(setting == "auto", "parallel.mpi_wait = \"", setting, "\": expected auto, spin or yield");
  return mpi_wait_on_this_node(comm, threads_per_rank);
}

void wait_requests(MpiWait how, int n, MPI_Request* requests) {
  if (how == MpiWait::Spin) {
    check_mpi(MPI_Waitall(n, requests, MPI_STATUSES_IGNORE), "MPI_Waitall");
    return;
  }
  for (int done = 0;;) {
    check_mpi(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    sched_yield();
  }
}

void barrier(MPI_Comm comm, MpiWait how) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier");
  wait_requests(how, 1, &request);
}

void throw_if_any_failed(MPI_Comm comm, const std::string& local_error) {
  const int n = comm_size(comm);
  int mine = local_error.empty() ? n : comm_rank(comm);
  int first = n;
  check_mpi(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (first == n) return;
  int len = static_cast<int>(local_error.size());
  check_mpi(MPI_Bcast(&len, 1, MPI_INT, first, comm), "MPI_Bcast");
  std::string message = local_error;
  message.resize(static_cast<size_t>(len));
  check_mpi(MPI_Bcast(message.data(), len, MPI_CHAR, first, comm), "MPI_Bcast");
  throw CollectiveError(message);
}

std::vector<std::string> allgather_bytes(MPI_Comm comm, const std::string& mine) {
  const int n = comm_size(comm);
  TESSERA_CHECK(mine.size() <= static_cast<size_t>(INT32_MAX), "allgather_bytes: ", mine.size(), " bytes is too many");
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(n)), offsets(static_cast<size_t>(n));
  check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather");
  int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  TESSERA_CHECK(total <= INT32_MAX, "allgather_bytes: ", total, " bytes in all is too many");
  std::exclusive_scan(lens.begin(), lens.end(), offsets.begin(), 0);
  std::string all(static_cast<size_t>(total), '\0');
  check_mpi(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, comm),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lens[r])));
  return out;
}

std::string broadcast_bytes(MPI_Comm comm, const std::string& bytes, int root) {
  const bool is_root = comm_rank(comm) == root;
  TESSERA_CHECK(!is_root || bytes.size() <= static_cast<size_t>(INT32_MAX), "broadcast_bytes: ", bytes.size(),
                " bytes is too many");
  int len = is_root ? static_cast<int>(bytes.size()) : 0;
  check_mpi(MPI_Bcast(&len, 1, MPI_INT, root, comm), "MPI_Bcast");
  std::string out = is_root ? bytes : std::string(static_cast<size_t>(len), '\0');
  check_mpi(MPI_Bcast(out.data(), len, MPI_CHAR, root, comm), "MPI_Bcast");
  return out;
}

}  // namespace tessera
