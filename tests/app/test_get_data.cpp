// Tests scripts/get_data.sh, the first run that needs nothing outside the repository: files taken
// from a directory (--from, as offline machines do; this machine cannot download) are checked
// against their SHA-256 before they are put in place, and `tessera prepare --tokenizer gpt2` then
// finds GPT-2's files there without --vocab. The Tiny Shakespeare run needs ../shared/data and is
// skipped, saying so, without it; the hash and error checks always run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;

const std::string kScript = std::string(TESSERA_TEST_DATA_DIR) + "/../../scripts/get_data.sh";
const std::string kShared = TESSERA_SHARED_DATA_DIR;
const std::string kRepoGpt2 = std::string(TESSERA_TEST_DATA_DIR) + "/gpt2";  // the same files, in the repository

RunResult get_data(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> all = {kScript};
  all.insert(all.end(), args.begin(), args.end());
  return testing::run_program("/bin/sh", all, dir);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "\"" << part << "\" not in:\n" << text;
}

// A --from directory laid out as shared/data is: GPT-2's real files, and a Tiny Shakespeare that
// is not the real one.
fs::path fake_source(const fs::path& dir) {
  const fs::path src = dir / "src";
  fs::create_directories(src / "gpt2");
  for (const char* f : {"encoder.json", "vocab.bpe"}) fs::copy_file(kRepoGpt2 + "/" + f, src / "gpt2" / f);
  std::ofstream(src / "tinyshakespeare.txt") << "First Citizen:\nnot quite\n";
  return src;
}

TEST(GetData, RefusesAFileWhoseHashIsNotTheExpectedOne) {
  const fs::path dir = testing::temp_dir("get_data_hash");
  const fs::path src = fake_source(dir);
  const RunResult r = get_data({"--from", src.string(), "--dest", (dir / "data").string()}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  contains(r.output, (src / "tinyshakespeare.txt").string() + " has sha256 ");
  contains(r.output, "expected 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed");
  EXPECT_FALSE(fs::exists(dir / "data" / "tinyshakespeare.txt"));
  for (const auto& e : fs::recursive_directory_iterator(dir / "data"))  // no partial file left behind
    EXPECT_TRUE(e.is_directory()) << e.path();
  fs::remove_all(dir);
}

TEST(GetData, NamesAMissingFileAndUnknownArguments) {
  const fs::path dir = testing::temp_dir("get_data_missing");
  const fs::path src = fake_source(dir);
  fs::remove(src / "tinyshakespeare.txt");
  RunResult r = get_data({"--from", src.string(), "--dest", (dir / "data").string()}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  contains(r.output, src.string() + " has no tinyshakespeare.txt");
  r = get_data({"--from", (dir / "nowhere").string()}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  contains(r.output, "is not a directory");
  r = get_data({"--form", src.string()}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  contains(r.output, "unknown argument: --form");
  fs::remove_all(dir);
}

// The README's Tiny Shakespeare example, end to end from the files get_data.sh put in place.
TEST(GetData, CopiesTheFilesThenPrepareFindsGpt2WithoutVocab) {
  if (!fs::is_regular_file(kShared + "/tinyshakespeare.txt"))
    GTEST_SKIP() << kShared << "/tinyshakespeare.txt not found (the shared/data directory next to the repository): "
                 << "this test copies Tiny Shakespeare from there";
  const fs::path dir = testing::temp_dir("get_data_copy");
  const fs::path data = dir / "data";
  RunResult r = get_data({"--from", kShared, "--dest", data.string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(bytes_of(data / "tinyshakespeare.txt"), bytes_of(kShared + "/tinyshakespeare.txt"));
  EXPECT_EQ(bytes_of(data / "gpt2" / "encoder.json"), bytes_of(kRepoGpt2 + "/encoder.json"));
  EXPECT_EQ(bytes_of(data / "gpt2" / "vocab.bpe"), bytes_of(kRepoGpt2 + "/vocab.bpe"));
  r = get_data({"--from", kShared, "--dest", data.string()}, dir);  // again: nothing to do
  ASSERT_EQ(r.exit_code, 0) << r.output;
  contains(r.output, (data / "gpt2" / "vocab.bpe").string() + ": already there (sha256 ok)");

  r = testing::run_tessera({"prepare", "--input", (data / "tinyshakespeare.txt").string(), "--tokenizer", "gpt2",
                            "--val-fraction", "0.1", "--out", (dir / "shakespeare").string()},
                           dir, {}, SIGINT, {"TESSERA_DATA_DIR=" + data.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  contains(r.output, "1 document, 301967 tokens");  // nanoGPT's counts + one end-of-text each (README)
  contains(r.output, "1 document, 36060 tokens");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
