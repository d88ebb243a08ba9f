// Tests write_checkpoint_file_streamed (app/checkpoint/checkpoint_io.h): tensors made one at a time,
// in the file's order, read back equal; a tensor of the wrong size or a producer's error leaves no file.
#include <gtest/gtest.h>

#include <filesystem>

#include "app/checkpoint/checkpoint_io.h"
#include "app/cli_testing.h"
#include "error_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

std::vector<float> values(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + 0.25f * static_cast<float>(i);
  return v;
}

}  // namespace

TEST(CheckpointStreamed, WritesEachTensorAsProduced) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("ckpt_streamed");
  const std::string file = (dir / "s.h5").string();
  CheckpointMeta meta;
  meta.step = 3;
  meta.config_toml = "[model]\n";
  std::vector<std::string> order;
  write_checkpoint_file_streamed(file, meta, {{"/model/b", Shape{3, 2}}, {"/model/a", Shape{5}}},
                                 [&](const std::string& path) {
                                   order.push_back(path);
                                   return values(path == "/model/a" ? 5 : 6, path == "/model/a" ? 1.0f : -1.0f);
                                 },
                                 {{"/optim", {{"step", int64_t{0}}}}});
  EXPECT_EQ(order, (std::vector<std::string>{"/model/a", "/model/b"}));  // sorted by path, one at a time
  CheckpointReader r(file, MPI_COMM_SELF);
  EXPECT_EQ(r.meta().step, 3);
  EXPECT_EQ(r.read_all("/model/a"), values(5, 1.0f));
  EXPECT_EQ(r.read_all("/model/b"), values(6, -1.0f));
  EXPECT_EQ(r.shape("/model/b"), (Shape{3, 2}));
  fs::remove_all(dir);
}

TEST(CheckpointStreamed, AWrongTensorLeavesNoFile) {
  testing::test_world();
  const fs::path dir = testing::temp_dir("ckpt_streamed_bad");
  const std::string file = (dir / "s.h5").string();
  EXPECT_TRUE(testing::throws_with(
      [&] {
        write_checkpoint_file_streamed(file, {}, {{"/model/a", Shape{4}}}, [](const std::string&) { return values(3, 0); });
      },
      {"the tensor made for /model/a has 3 elements", "(4) holds 4"}));
  EXPECT_FALSE(fs::exists(file));
  EXPECT_TRUE(testing::throws_with(
      [&] {
        write_checkpoint_file_streamed(file, {}, {{"/model/a", Shape{4}}},
                                       [](const std::string&) -> std::vector<float> { throw Error("no source"); });
      },
      {"no source"}));
  EXPECT_FALSE(fs::exists(file));
  fs::remove_all(dir);
}

}  // namespace tessera
