// Tests app/checkpoint/checkpoint_io.h across ranks: registered twice, as plain one-rank tests and as
// `mpiexec -n 2 tests_app --gtest_filter=CheckpointMpi.*` (tests/CMakeLists.txt). Each rank writes
// its share of tensors split along dim 0 and dim 1 and a ZeRO-1 style flat range that cuts rows;
// rank 0 alone writes a replicated one; every rank reads all of it back, and so does a single
// process on its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/checkpoint_plan.h"
#include "error_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::test_world;

// One directory for all ranks: rank 0 names it and tells the others.
fs::path shared_temp_dir(MPI_Comm comm, const std::string& name) {
  std::string dir;
  if (comm_rank(comm) == 0) {
    fs::path p = fs::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    dir = p.string();
  }
  return broadcast_bytes(comm, dir, 0);
}

// Element i of a global tensor has value base + i / 8 on every rank, whatever it holds.
std::vector<float> global_values(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + static_cast<float>(i) * 0.125f;
  return v;
}

// This rank's even share [begin, end) of n items.
std::pair<int64_t, int64_t> share(int64_t n, int rank, int size) { return {n * rank / size, n * (rank + 1) / size}; }

TEST(CheckpointMpi, RanksWriteShardsAndEveryoneReadsTheWhole) {
  MPI_Comm comm = test_world();
  const int rank = comm_rank(comm), size = comm_size(comm);
  const fs::path file = shared_temp_dir(comm, "ckpt_mpi") / "step.h5";

  // (R, C) split by rows, (R, K) split by columns (a row-parallel weight), (C) replicated.
  const int64_t R = 700, C = 600, K = 30;
  const auto rows = global_values(R * C, 1.0f), cols = global_values(R * K, -50.0f), norm = global_values(C, 2.0f);
  const auto moment = global_values(R * K, 7.0f);
  const auto [r0, r1] = share(R, rank, size);
  const auto [f0, f1] = share(R * K - 1, rank, size);  // R K - 1: the split falls inside a row
  const auto [k0, k1] = share(K, rank, size);
  std::vector<float> my_cols;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = k0; k < k1; ++k) my_cols.push_back(cols[static_cast<size_t>(r * K + k)]);
  const std::vector<TensorSlice> slices = {
      {"/model/rows.weight", {R, C}, 0, r0, {r1 - r0, C}, rows.data() + r0 * C, true},
      {"/model/cols.weight", {R, K}, 1, k0, {R, k1 - k0}, my_cols.data(), true},
      {"/model/norm.weight", {C}, -1, 0, {C}, norm.data(), rank == 0},
      {"/optim/cols.weight/exp_avg", {R, K}, TensorSlice::kFlat, f0, {f1 - f0}, moment.data() + f0, true},
      {"/optim/cols.weight/exp_avg", {R, K}, TensorSlice::kFlat, R * K - 1, {1}, moment.data() + R * K - 1,
       rank == size - 1},
  };
  CheckpointMeta meta;
  meta.step = 42;
  meta.extra["ranks"] = int64_t{size};
  const GroupAttributes groups = {{"/optim", {{"step", int64_t{42}}}}};
  write_checkpoint_file(file, meta, slices, comm, groups);
  // The space reserved up front bounds the file written in parallel too.
  EXPECT_LE(static_cast<int64_t>(fs::file_size(file)),
            ckpt::estimated_file_bytes(ckpt::make_write_plan(slices, groups, comm), meta, groups));

  {
    CheckpointReader r(file, comm);
    EXPECT_EQ(r.meta().step, 42);
    EXPECT_EQ(std::get<int64_t>(r.meta().extra.at("ranks")), size);
    EXPECT_EQ(r.read_all("/model/rows.weight"), rows);
    EXPECT_EQ(r.read_all("/model/cols.weight"), cols);
    EXPECT_EQ(r.read_all("/model/norm.weight"), norm);
    EXPECT_EQ(r.read_all("/optim/cols.weight/exp_avg"), moment);
    // Each rank's own shard, as a resume on the same layout reads it.
    std::vector<float> mine(static_cast<size_t>(R * (k1 - k0)));
    r.read("/model/cols.weight", 1, k0, {R, k1 - k0}, mine.data());
    EXPECT_EQ(mine, my_cols);
  }
  MPI_Barrier(comm);
  if (rank == 0) {  // a single process, e.g. `tessera ckpt inspect`, sees the same file
    CheckpointReader alone(file, MPI_COMM_SELF);
    EXPECT_EQ(alone.read_all("/model/rows.weight"), rows);
    EXPECT_EQ(alone.read_all("/model/cols.weight"), cols);
    EXPECT_EQ(alone.read_all("/model/norm.weight"), norm);
    EXPECT_EQ(alone.read_all("/optim/cols.weight/exp_avg"), moment);
    EXPECT_EQ(std::get<int64_t>(alone.group_attributes().at("/optim").at("step")), 42);
  }
  MPI_Barrier(comm);
}

// A mistake on one rank (here: the last rank's slice runs past the tensor) is reported on every
// rank with the same message, before anything is written: no rank hangs in a collective call.
TEST(CheckpointMpi, AnErrorOnOneRankIsRaisedOnAll) {
  MPI_Comm comm = test_world();
  const int rank = comm_rank(comm), size = comm_size(comm);
  const fs::path file = shared_temp_dir(comm, "ckpt_mpi_error") / "step.h5";
  const auto v = global_values(16, 0.0f);
  const auto [b, e] = share(8, rank, size);
  const int64_t len = rank == size - 1 ? e - b + 1 : e - b;
  const std::string message = testing::error_of(
      [&] { write_checkpoint_file(file, CheckpointMeta{}, {{"/model/a", {8}, 0, b, {len}, v.data(), true}}, comm); });
  const std::string expected = "tensor /model/a (8): slice [" + std::to_string(8 * (size - 1) / size) +
                               ", 9) along dimension 0 is out of range";
  EXPECT_EQ(message, expected);
  EXPECT_FALSE(fs::exists(file));
}

}  // namespace
}  // namespace tessera
