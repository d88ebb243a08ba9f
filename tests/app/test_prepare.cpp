// Tests `tessera prepare` (app/prepare.h) by running the binary: .txt and .jsonl inputs with the
// byte tokenizer read back through IndexedDataset, separators, validation splits, and user errors.
#include "app/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "cli_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name)
      : path(fs::temp_directory_path() / ("tessera_prepare_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

using testing::RunResult;

RunResult run_prepare(std::vector<std::string> args, const Dir& dir) {
  args.insert(args.begin(), "prepare");
  RunResult r = testing::run_tessera(args, dir.path);
  fs::remove(dir.path / "output.txt");
  return r;
}

// The documents of an indexed dataset decoded back to bytes (the byte tokenizer's ids are the
// bytes), with the end-of-document id 256 shown as "|".
std::vector<std::string> documents(const std::string& prefix) {
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), TokenDType::kUInt16);
  std::vector<std::string> docs;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    const TokenSpan t = ds.document(d);
    std::string s;
    for (int64_t i = 0; i < t.size(); ++i) s += t[i] == 256 ? '|' : static_cast<char>(t[i]);
    docs.push_back(s);
  }
  return docs;
}

std::vector<std::string> files_in(const Dir& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(PrepareCommand, TextAndJsonlWithByteTokenizerReadBack) {
  Dir dir("basic");
  write_file(dir / "a.txt", "Hello, world\n");
  write_file(dir / "b.txt", "caf\xC3\xA9");
  write_file(dir / "c.jsonl", "{\"id\": 1, \"text\": \"line \\\"one\\\"\\n\\u00e9\"}\n\n{\"text\": \"\\ud83d\\ude00\"}\n");
  const RunResult r = run_prepare({"--input", dir / "a.txt", dir / "b.txt", "--input", dir / "c.jsonl",
                                   "--tokenizer", "byte", "--out", dir / "out/d"},
                                  dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents(dir / "out/d"), (std::vector<std::string>{"Hello, world\n|", "caf\xC3\xA9|",
                                                                 "line \"one\"\n\xC3\xA9|", "\xF0\x9F\x98\x80|"}));
  EXPECT_NE(r.output.find("4 documents"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("uint16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir / "out/d.idx"), std::string::npos) << r.output;
  // What prepare writes is what training reads.
  auto ds = open_token_dataset({dir / "out/d"}, 8, 257);
  EXPECT_EQ(ds->num_tokens(), 14 + 6 + 14 + 5);  // bytes + one end-of-document id each
}

TEST(PrepareCommand, SeparatorSplitsDocumentsAndEotIsOptional) {
  Dir dir("separator");
  write_file(dir / "a.txt", "a\n\nbb\n\n\n\nccc\n");
  RunResult r = run_prepare({"--input", dir / "a.txt", "--tokenizer", "byte", "--out", dir / "d", "--separator",
                             "\\n\\n", "--append-eot", "false"},
                            dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents(dir / "d"), (std::vector<std::string>{"a", "bb", "ccc\n"}));
  r = run_prepare({"--input", dir / "a.txt", "--tokenizer", "byte", "--out", dir / "d", "--separator", "\n"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents(dir / "d"), (std::vector<std::string>{"a|", "bb|", "ccc|"}));
}

TEST(PrepareCommand, ValFractionHoldsOutTheLastDocuments) {
  Dir dir("val");
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += "{\"text\": \"doc" + std::to_string(i) + "\"}\n";
  write_file(dir / "d.jsonl", lines);
  const RunResult r = run_prepare(
      {"--input", dir / "d.jsonl", "--tokenizer", "byte", "--out", dir / "d", "--val-fraction", "0.2"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> train, val;
  for (int i = 0; i < 10; ++i) (i < 8 ? train : val).push_back("doc" + std::to_string(i) + "|");
  EXPECT_EQ(documents(dir / "d"), train);
  EXPECT_EQ(documents(dir / "d_val"), val);
  EXPECT_NE(r.output.find(dir / "d_val.bin"), std::string::npos) << r.output;
}

TEST(PrepareCommand, ValFractionOfOneDocumentCutsItsText) {
  Dir dir("val_one");
  std::string text;
  for (int i = 0; i < 100; ++i) text += char('a' + i % 26);
  write_file(dir / "t.txt", text);
  const RunResult r =
      run_prepare({"--input", dir / "t.txt", "--tokenizer", "byte", "--out", dir / "d", "--val-fraction", "0.1"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents(dir / "d"), (std::vector<std::string>{text.substr(0, 90) + "|"}));
  EXPECT_EQ(documents(dir / "d_val"), (std::vector<std::string>{text.substr(90) + "|"}));
}

TEST(PrepareCommand, JsonlLineWithoutTextNamesFileAndLineAndWritesNothing) {
  Dir dir("jsonl_error");
  write_file(dir / "c.jsonl", "{\"text\": \"ok\"}\n\n{\"txt\": \"typo\"}\n");
  RunResult r = run_prepare({"--input", dir / "c.jsonl", "--tokenizer", "byte", "--out", dir / "d"}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir / "c.jsonl:3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no \"text\" field"), std::string::npos) << r.output;
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"c.jsonl"}));  // no d.bin/d.idx, no temporaries
  write_file(dir / "c.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  r = run_prepare({"--input", dir / "c.jsonl", "--tokenizer", "byte", "--out", dir / "d"}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir / "c.jsonl:2: malformed JSON"), std::string::npos) << r.output;
}

// TESSERA_DATA_DIR for the tessera processes started while the object lives (they inherit it).
class DataDirEnv {
 public:
  explicit DataDirEnv(const std::string& dir) { ::setenv("TESSERA_DATA_DIR", dir.c_str(), 1); }
  ~DataDirEnv() { ::unsetenv("TESSERA_DATA_DIR"); }
};

TEST(PrepareCommand, UserErrorsNameTheProblem) {
  Dir dir("errors");
  const DataDirEnv no_gpt2_files(dir / "no_data");  // whether or not the repository's data/gpt2 exists
  write_file(dir / "a.txt", "text");
  write_file(dir / "empty.txt", "");
  write_file(dir / "x.txt", "x");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--input", dir / "missing.txt", "--tokenizer", "byte"}, "missing input file " + dir / "missing.txt"},
      {{"--input", dir / "a.txt", "--tokenizer", "nonsense"}, "nonsense"},
      {{"--input", dir / "a.txt", "--tokenizer", "gpt2"}, "encoder.json and vocab.bpe"},
      {{"--input", dir / "empty.txt", "--tokenizer", "byte"}, "empty input"},
      {{"--input", dir / "a.txt", "--tokenizer", "byte", "--val-fraction", "1.5"}, "[0, 1)"},
      {{"--input", dir / "x.txt", "--tokenizer", "byte", "--val-fraction", "0.5"}, "too short"},
  };
  for (const auto& [args, expected] : cases) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--out", dir / "d"});
    const RunResult r = run_prepare(a, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << "expected \"" << expected << "\" in: " << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "d.bin"));
}

// --tokenizer gpt2 without --vocab: GPT-2's files come from the default directory,
// $TESSERA_DATA_DIR/gpt2 here (else the repository's data/gpt2, where scripts/get_data.sh puts
// them); missing there, the error says where it looked and how to get them.
TEST(PrepareCommand, Gpt2WithoutVocabFindsItsFilesInTheDataDirectory) {
  Dir dir("gpt2_default");
  write_file(dir / "a.txt", "hello world");
  {
    const DataDirEnv empty(dir / "data");
    const RunResult r = run_prepare({"--input", dir / "a.txt", "--tokenizer", "gpt2", "--out", dir / "d"}, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("not in " + dir / "data/gpt2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("run scripts/get_data.sh"), std::string::npos) << r.output;
  }
  fs::create_directories(dir.path / "data" / "gpt2");
  for (const char* f : {"encoder.json", "vocab.bpe"})
    fs::copy_file(std::string(TESSERA_TEST_DATA_DIR) + "/gpt2/" + f, dir.path / "data" / "gpt2" / f);
  const DataDirEnv data(dir / "data");
  const RunResult r = run_prepare({"--input", dir / "a.txt", "--tokenizer", "gpt2", "--out", dir / "d"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const IndexedDataset ds(dir / "d");
  std::vector<int32_t> ids(ds.num_tokens());
  ds.tokens().copy_to(0, ds.num_tokens(), ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{31373, 995, 50256}));  // tiktoken's "hello world", then <|endoftext|>
}

// The prefix gets ".bin"/".idx" appended: --out data/ used to write the hidden files data/.bin and
// data/.idx. A prefix that is a directory, or ends in a separator, is refused with a valid example.
TEST(PrepareCommand, OutThatNamesADirectoryIsRefusedWithAnExample) {
  Dir dir("out_dir");
  write_file(dir / "a.txt", "some text");
  fs::create_directories(dir.path / "data");
  for (const std::string& out : {dir / "data/", dir / "data", dir / "new/", dir / "data/."}) {
    const RunResult r = run_prepare({"--input", dir / "a.txt", "--tokenizer", "byte", "--out", out}, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--out " + out + " names a directory; give a file prefix inside it, e.g. --out "),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("/corpus (writes corpus.bin and corpus.idx there)"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(fs::is_empty(dir.path / "data"));
  EXPECT_FALSE(fs::exists(dir.path / "new"));
  EXPECT_FALSE(fs::exists(dir.path / "data.bin"));
  const RunResult ok = run_prepare({"--input", dir / "a.txt", "--tokenizer", "byte", "--out", dir / "data/corpus"}, dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir.path / "data" / "corpus.bin"));
}

TEST(PrepareCommand, SeparatorEscapes) {
  EXPECT_EQ(unescape_separator("\\n\\n"), "\n\n");
  EXPECT_EQ(unescape_separator("<\\t\\r\\\\>"), "<\t\r\\>");
  EXPECT_EQ(unescape_separator("a\\qb\\"), "a\\qb\\");
}

// Tiny Shakespeare through the byte tokenizer: every byte comes back, split 90/10 like nanoGPT.
TEST(PrepareCommand, TinyShakespeareByteRoundTrip) {
  const std::string src = std::string(TESSERA_SHARED_DATA_DIR) + "/tinyshakespeare.txt";
  if (!fs::exists(src)) GTEST_SKIP() << src << " not present";
  Dir dir("shakespeare");
  const RunResult r =
      run_prepare({"--input", src, "--tokenizer", "byte", "--out", dir / "s", "--val-fraction", "0.1"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(src);
  ASSERT_EQ(text.size(), 1115394u);
  const size_t cut = size_t(0.9 * double(text.size()));  // 1,003,854: nanoGPT's int(n * 0.9)
  const ByteTokenizer tok;
  const auto decode = [&](const std::string& prefix) {
    const IndexedDataset ds(prefix);
    EXPECT_EQ(ds.num_documents(), 1);
    std::vector<int32_t> ids(ds.num_tokens());
    ds.tokens().copy_to(0, ds.num_tokens(), ids.data());
    EXPECT_EQ(ids.back(), tok.eot_id());
    return tok.decode(ids);
  };
  EXPECT_EQ(decode(dir / "s"), text.substr(0, cut));
  EXPECT_EQ(decode(dir / "s_val"), text.substr(cut));
  EXPECT_EQ(open_token_dataset({dir / "s"}, 256, tok.vocab_size())->num_samples(), (int64_t(cut) + 1 - 1) / 256);
}

}  // namespace
}  // namespace tessera
