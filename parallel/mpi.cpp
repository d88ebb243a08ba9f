// MpiSession and the collective error agreement. A failed MPI call here is a broken
// environment, not a user error: it throws with the MPI error string.
#include "parallel/mpi.h"

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
