// Tests app/checkpoint/atomic_file.h: fresh temporary names, exclusive creation that refuses files and
// symlinks already there, atomic replacement that never writes through a symlink, no temporary left
// by a failed write; and the safetensors writer (app/checkpoint/safetensors.h), which writes through it.
#include "app/checkpoint/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <set>

#include "app/checkpoint/safetensors.h"
#include "app/cli_testing.h"
#include "app/disk_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AtomicFile, TemporaryNamesAreFreshAndRecognized) {
  std::set<std::string> names;
  for (int i = 0; i < 100; ++i) names.insert(unique_temp_name("/d/step_00000010.h5"));
  EXPECT_EQ(names.size(), 100u);
  const std::string name = fs::path(*names.begin()).filename().string();
  EXPECT_EQ(name.rfind("step_00000010.h5.tmp." + std::to_string(getpid()) + ".", 0), 0u) << name;
  EXPECT_TRUE(is_temp_name_of(name, "step_00000010.h5"));
  EXPECT_TRUE(is_temp_name_of("step_00000010.h5.tmp", "step_00000010.h5"));  // older versions' name
  EXPECT_TRUE(is_temp_name_of("latest.tmp.12.00ff", "latest"));
  EXPECT_FALSE(is_temp_name_of("latest.tmp.12.00ff", "step_00000010.h5"));
  EXPECT_FALSE(is_temp_name_of("latest.tmp.x.00ff", "latest"));
  EXPECT_FALSE(is_temp_name_of("latest.tmp.12.", "latest"));
  EXPECT_FALSE(is_temp_name_of("latest.tmpfoo", "latest"));
  EXPECT_FALSE(is_temp_name_of("latest", "latest"));
}

TEST(AtomicFile, ExclusiveCreationRefusesFilesAndSymlinks) {
  const fs::path dir = testing::temp_dir("atomic_exclusive");
  std::ofstream(dir / "file") << "x";
  fs::create_symlink(dir / "file", dir / "link");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  for (const char* name : {"file", "link", "dangling"})
    EXPECT_EQ(error_of([&] { create_exclusive((dir / name).string()); }),
              "cannot create " + (dir / name).string() + ": a file or symlink with that name already exists");
  EXPECT_FALSE(fs::exists(dir / "nowhere"));
  const int fd = create_exclusive((dir / "fresh").string());
  EXPECT_GE(fd, 0);
  ::close(fd);
  fs::remove_all(dir);
}

// A symlink at the target is replaced by the new file, not written through; the file appears only
// on commit, and an uncommitted one leaves nothing behind.
TEST(AtomicFile, ReplacesAtomicallyAndNeverWritesThroughASymlink) {
  const fs::path dir = testing::temp_dir("atomic_replace");
  std::ofstream(dir / "victim") << "precious";
  fs::create_symlink(dir / "victim", dir / "latest");
  {
    AtomicFile f((dir / "latest").string());
    f.write("step_00000002.h5\n");
    EXPECT_TRUE(fs::is_symlink(dir / "latest"));  // not yet replaced
    f.commit();
  }
  EXPECT_FALSE(fs::is_symlink(dir / "latest"));
  EXPECT_EQ(testing::read_file(dir / "latest"), "step_00000002.h5\n");
  EXPECT_EQ(testing::read_file(dir / "victim"), "precious");
  {
    AtomicFile f((dir / "latest").string());
    f.write("step_00000003.h5\n");
  }  // no commit: an error on the way
  EXPECT_EQ(testing::read_file(dir / "latest"), "step_00000002.h5\n");
  EXPECT_EQ(testing::names_of(dir), (std::vector<std::string>{"latest", "victim"}));
  fs::remove_all(dir);
}

// A write that runs out of space names the temporary and the reason, and leaves nothing.
TEST(AtomicFile, AFullDiskIsAnErrorAndLeavesNothing) {
  const fs::path dir = testing::temp_dir("atomic_full");
  const testing::RemoveAtEnd cleanup{dir};
  testing::SmallDisk disk(dir / "disk", 64 << 10);
  std::unique_ptr<testing::FileSizeLimit> limit;
  if (!disk.mounted()) limit = std::make_unique<testing::FileSizeLimit>(64 << 10);
  const std::string big(256 << 10, 'x');
  std::string e;
  {
    AtomicFile f((disk.path() / "model.safetensors").string());
    e = error_of([&] { f.write(big); });
  }
  limit.reset();
  EXPECT_EQ(e.rfind("cannot write " + (disk.path() / "model.safetensors.tmp.").string(), 0), 0u) << e;
  EXPECT_NE(e.find(disk.mounted() ? "No space left on device" : "File too large"), std::string::npos) << e;
  EXPECT_EQ(testing::names_of(disk.path()), std::vector<std::string>{});
}

// The safetensors export: a symlink planted under the temporary name older versions used
// (model.safetensors.tmp) is left alone, and so is what it points to.
TEST(AtomicFile, SafetensorsExportNeverWritesThroughAPlantedTemporary) {
  const fs::path dir = testing::temp_dir("atomic_safetensors");
  std::ofstream(dir / "victim") << "precious";
  fs::create_symlink(dir / "victim", dir / "model.safetensors.tmp");
  const SafetensorsEntry e{"w", Shape{2}, [] { return std::vector<float>{1.0f, 2.0f}; }};
  write_safetensors((dir / "model.safetensors").string(), {e}, {{"format", "pt"}});
  EXPECT_EQ(testing::read_file(dir / "victim"), "precious");
  EXPECT_TRUE(fs::is_symlink(dir / "model.safetensors.tmp"));
  const std::string st = testing::read_file(dir / "model.safetensors");
  ASSERT_GT(st.size(), 16u);
  EXPECT_NE(st.find("\"w\":{\"dtype\":\"F32\""), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
