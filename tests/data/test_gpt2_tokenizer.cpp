// Tests data/gpt2_tokenizer.h: exact ids against GPT-2 references (the 59 tokenizer cases and the
// vocabulary, in tests/reference/gpt2, so these always run; Tiny Shakespeare's ids and Alice's token
// count from shared/data, skipped when it is absent), byte-exact round trips of arbitrary bytes,
// parallel == serial, and errors on bad vocabulary files (on a tiny vocabulary written by the test).
#include "data/gpt2_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "data/json.h"
#include "error_testing.h"
#include "kernels/check.h"
#include "testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string shared_data_dir() { return TESSERA_SHARED_DATA_DIR; }
std::string gpt2_dir() { return std::string(TESSERA_TEST_DATA_DIR) + "/gpt2"; }  // in the repository

bool have_gpt2_files() {
  return fs::is_regular_file(gpt2_dir() + "/encoder.json") && fs::is_regular_file(gpt2_dir() + "/vocab.bpe");
}

// The real GPT-2 tokenizer, loaded once for the whole suite (nullptr without the files).
const Gpt2Tokenizer* real_gpt2() {
  static const std::unique_ptr<Gpt2Tokenizer> tok =
      have_gpt2_files() ? std::make_unique<Gpt2Tokenizer>(gpt2_dir()) : nullptr;
  return tok.get();
}

#define REQUIRE_FILE(path)                                                                           \
  if (!fs::is_regular_file(path)) {                                                                  \
    GTEST_SKIP() << "reference file " << (path) << " not found (the shared/data directory next to "   \
                    "the repository holds GPT-2's files); skipping";                                 \
  }

#define REQUIRE_GPT2()                                                                           \
  ASSERT_TRUE(have_gpt2_files()) << gpt2_dir() << " lacks GPT-2's encoder.json or vocab.bpe";    \
  const Gpt2Tokenizer& tok = *real_gpt2()

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- the 59 reference cases of tests/reference/gpt2/tokenizer_cases.json ----

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  bool allowed_special = false;
  int line = 0;
};

// {"description": ..., "cases": [{"text": "...", "ids": [...], "allowed_special": false, "source": "..."}, ...]};
// Case::line is the case's index in "cases".
std::vector<Case> read_cases(const std::string& path) {
  const Json file = read_json_file(path);
  std::vector<Case> cases;
  for (const Json& j : file.at("cases")) {
    Case c;
    c.line = static_cast<int>(cases.size());
    c.text = j.at("text").get<std::string>();
    c.ids = j.at("ids").get<std::vector<int32_t>>();
    c.allowed_special = j.value("allowed_special", false);
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(Gpt2Tokenizer, MatchesAllReferenceCases) {
  REQUIRE_GPT2();
  const std::string path = gpt2_dir() + "/tokenizer_cases.json";
  ASSERT_TRUE(fs::is_regular_file(path)) << path;
  std::vector<Case> cases = read_cases(path);
  ASSERT_EQ(cases.size(), 59u) << "expected 59 cases in " << path;
  int special = 0;
  for (const Case& c : cases) {
    EXPECT_EQ(tok.encode(c.text, c.allowed_special), c.ids) << path << " case " << c.line;
    EXPECT_EQ(tok.decode(c.ids), c.text) << path << " case " << c.line;
    special += c.allowed_special;
  }
  EXPECT_GE(special, 1);
}

TEST(Gpt2Tokenizer, TinyShakespeareIdsEqualTheReferenceFile) {
  REQUIRE_GPT2();
  const std::string text_path = shared_data_dir() + "/tinyshakespeare.txt";
  const std::string ids_path = shared_data_dir() + "/gpt2/tinyshakespeare_gpt2_u16le.bin";
  REQUIRE_FILE(text_path);
  REQUIRE_FILE(ids_path);
  const std::string text = read_file(text_path), raw = read_file(ids_path);
  std::vector<int32_t> expected(raw.size() / 2);
  for (size_t i = 0; i < expected.size(); ++i)
    expected[i] = static_cast<unsigned char>(raw[2 * i]) | static_cast<unsigned char>(raw[2 * i + 1]) << 8;
  ASSERT_EQ(expected.size(), 338025u);
  std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), expected.size());
  size_t first_diff = std::mismatch(ids.begin(), ids.end(), expected.begin()).first - ids.begin();
  EXPECT_EQ(first_diff, ids.size()) << "first differing token at " << first_diff;
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.encode(text, false, 1), ids) << "serial and parallel encodings differ";
}

TEST(Gpt2Tokenizer, AliceGives49126TokensAndRoundTrips) {
  REQUIRE_GPT2();
  const std::string path = shared_data_dir() + "/alice_in_wonderland_pg11.txt";
  REQUIRE_FILE(path);
  const std::string text = read_file(path);
  ASSERT_EQ(text.substr(0, 3), "\xEF\xBB\xBF") << "the file keeps its byte order mark";
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids.size(), 49126u);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.encode(text, false, 1), ids);
}

// ---- arbitrary bytes ----

// Random strings mixing ASCII, multi-byte UTF-8 (letters, numbers, Unicode spaces, marks), NUL and
// invalid UTF-8 (lone continuation bytes, truncated and overlong sequences, encoded surrogates).
std::string random_text(std::mt19937_64& rng, size_t pieces) {
  static const std::string kBits[] = {
      "a", "Z", "7", " ", "  ", "\n", "\t", "\r\n", "'", "'s", "'ll", "!", ".", "<|endoftext|>",
      "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\xC2\xB2", "\xE2\x80\x83", "\xE3\x80\x80",
      "\xC2\xA0", "\xCC\x81", "\x1C", std::string(1, '\0'), "\x80", "\xFF", "\xC3", "\xE2\x82",
      "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xEF\xBB\xBF"};
  std::uniform_int_distribution<size_t> pick(0, std::size(kBits) - 1);
  std::string s;
  for (size_t i = 0; i < pieces; ++i) {
    if (rng() % 8 == 0)
      s.push_back(static_cast<char>(rng() % 256));
    else
      s += kBits[pick(rng)];
  }
  return s;
}

TEST(Gpt2Tokenizer, ArbitraryBytesRoundTrip) {
  REQUIRE_GPT2();
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s = random_text(rng, 1 + rng() % 200);
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = tok.encode(s, special);
      ASSERT_EQ(tok.decode(ids), s) << "trial " << trial;
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
      ASSERT_TRUE(special || std::count(ids.begin(), ids.end(), tok.eot_id()) == 0);
    }
  }
  std::string all_bytes;
  for (int b = 255; b >= 0; --b) all_bytes += std::string(3, static_cast<char>(b));
  EXPECT_EQ(tok.decode(tok.encode(all_bytes)), all_bytes);
}

TEST(Gpt2Tokenizer, ParallelEncodeEqualsSerial) {
  REQUIRE_GPT2();
  std::mt19937_64 rng(11);
  // Large enough for several chunks; random text has many safe split points.
  const size_t size = 5 * Gpt2Tokenizer::kMinChunkBytes;
  std::string mixed;
  while (mixed.size() < size) mixed += random_text(rng, 1000);
  std::string one_line(size, 'x');
  for (size_t i = 0; i < one_line.size(); i += 7) one_line[i] = i % 3 ? ',' : ' ';
  std::string no_split;  // no safe split point at all: encoded on one thread
  while (no_split.size() < size) no_split += "\xC3\xA9\xC3\xA8 ";
  for (const std::string* s : {&mixed, &one_line, &no_split}) {
    for (bool special : {false, true}) {  // with special tokens mixed is cut into short parts first
      std::vector<int32_t> serial = tok.encode(*s, special, 1);
      EXPECT_EQ(tok.encode(*s, special, 2), serial);
      EXPECT_EQ(tok.encode(*s, special, 5), serial);
      EXPECT_EQ(tok.decode(serial), *s);
    }
  }
}

TEST(Gpt2Tokenizer, EndOfTextIsSpecialOnlyWhenAllowed) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.eot_id(), 50256);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.name(), "gpt2");
  const std::string s = "<|endoftext|>a<|endoftext|><|endoftext|>";
  EXPECT_EQ(tok.encode(s, true), (std::vector<int32_t>{50256, 64, 50256, 50256}));
  std::vector<int32_t> plain = tok.encode(s, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(tok.decode(plain), s);
  EXPECT_EQ(tok.decode({50256}), "<|endoftext|>");
  EXPECT_THROW(tok.decode({50257}), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
}

TEST(Gpt2Tokenizer, LongWordsTakeTheHeapPathWithTheSameResult) {
  REQUIRE_GPT2();
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::string word;  // one piece: letters only
    for (size_t i = 0, n = 100 + rng() % 3000; i < n; ++i) word.push_back(static_cast<char>('a' + rng() % 26));
    std::vector<int32_t> scan, heap;
    for (char c : word) scan.push_back(tok.encode(std::string(1, c))[0]);
    heap = scan;
    bpe_merge_scan(tok.merges(), &scan);
    bpe_merge_heap(tok.merges(), &heap);
    ASSERT_EQ(heap, scan) << "trial " << trial;
    ASSERT_EQ(tok.encode(word), scan);
    ASSERT_EQ(tok.decode(scan), word);
  }
}

// ---- a tiny vocabulary written by the test: loading and errors, no shared files needed ----

std::string to_mapped_utf8(std::string_view bytes) {
  std::array<char32_t, 256> map = gpt2_byte_to_unicode();
  std::string out;
  for (unsigned char b : bytes) {
    char32_t cp = map[b];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// JSON string literal as Python's json.dumps writes it (ensure_ascii).
std::string json_quote(std::string_view mapped) {
  std::string out = "\"";
  for (size_t i = 0; i < mapped.size(); ++i) {
    unsigned char c = mapped[i];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {  // two-byte UTF-8 (all mapped code points are below U+0800)
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ((c & 0x1F) << 6) | (mapped[++i] & 0x3F));
      out += buf;
    }
  }
  return out + "\"";
}

// A vocabulary directory: ids 0..255 the bytes, then the merges' results, then <|endoftext|>.
class TinyVocab {
 public:
  static inline const std::vector<std::pair<std::string, std::string>> kMerges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"}, {"l", "d"},
      {" wor", "ld"}, {"a", "b"}, {"b", "c"}, {"a", "bc"}};  // "abc" is a token BPE cannot reach

  TinyVocab() : dir_(fs::temp_directory_path() / ("tessera_tiny_vocab_" + std::to_string(::getpid()))) {
    fs::create_directories(dir_);
    std::string json = "{";
    for (int b = 0; b < 256; ++b) json += json_quote(to_mapped_utf8(std::string(1, char(b)))) + ": " + std::to_string(b) + ", ";
    std::string bpe = "#version: 0.2\n";
    int id = 256;
    for (const auto& [l, r] : kMerges) {
      json += json_quote(to_mapped_utf8(l + r)) + ": " + std::to_string(id++) + ", ";
      bpe += to_mapped_utf8(l) + " " + to_mapped_utf8(r) + "\n";
    }
    json += "\"<|endoftext|>\": " + std::to_string(id) + "}";
    write("encoder.json", json);
    write("vocab.bpe", bpe);
  }
  ~TinyVocab() { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  std::string dir() const { return dir_.string(); }
  std::string read(const std::string& name) const { return read_file((dir_ / name).string()); }

 private:
  fs::path dir_;
};

using testing::error_of;

TEST(Gpt2Tokenizer, TinyVocabularyMergesByRank) {
  TinyVocab v;
  Gpt2Tokenizer tok(v.dir());
  EXPECT_EQ(tok.vocab_size(), 256 + 12 + 1);
  EXPECT_EQ(tok.eot_id(), 268);
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{259, 264}));
  EXPECT_EQ(tok.encode("hello<|endoftext|>", true), (std::vector<int32_t>{259, 268}));
  // (a, b) ranks before (b, c): "abc" is ab + c, although "abc" (267) is in the vocabulary.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{265, 'c'}));
  EXPECT_EQ(tok.encode("hellohello"), (std::vector<int32_t>{259, 259}));  // one piece, two merges each
  EXPECT_EQ(tok.encode("hhe"), (std::vector<int32_t>{'h', 256}));
  EXPECT_EQ(tok.token_bytes(264), " world");
  EXPECT_EQ(tok.token_bytes('"'), "\"");  // the escaped key "\"" of encoder.json
  std::string bytes = "\x00\xff\\\"h\xe9llo";
  EXPECT_EQ(tok.decode(tok.encode(bytes)), bytes);
}

TEST(Gpt2Tokenizer, ParallelEncodeEqualsSerialOnATinyVocabulary) {
  TinyVocab v;
  Gpt2Tokenizer tok(v.dir());
  std::mt19937_64 rng(13);
  std::string s;  // several chunks
  while (s.size() < 5 * Gpt2Tokenizer::kMinChunkBytes) s += random_text(rng, 1000);
  std::vector<int32_t> serial = tok.encode(s, false, 1);
  EXPECT_EQ(tok.encode(s, false, 2), serial);
  EXPECT_EQ(tok.encode(s, false, 4), serial);
  EXPECT_EQ(tok.decode(serial), s);
}

TEST(Gpt2Tokenizer, MissingDirectoryOrFilesAreNamed) {
  EXPECT_NE(error_of([] { Gpt2Tokenizer("/nonexistent/tessera/vocab"); }).find("'/nonexistent/tessera/vocab' does not exist"),
            std::string::npos);
  TinyVocab v;
  fs::remove(fs::path(v.dir()) / "vocab.bpe");
  std::string msg = error_of([&] { Gpt2Tokenizer t(v.dir()); });
  EXPECT_NE(msg.find("vocab.bpe not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.json"), std::string::npos) << msg;
  fs::remove(fs::path(v.dir()) / "encoder.json");
  msg = error_of([&] { Gpt2Tokenizer t(v.dir()); });
  EXPECT_NE(msg.find("encoder.json not found"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, MalformedEncoderJsonIsReported) {
  TinyVocab v;
  const std::string good = v.read("encoder.json");
  auto error_with = [&](const std::string& json) {
    v.write("encoder.json", json);
    return error_of([&] { Gpt2Tokenizer t(v.dir()); });
  };
  const std::vector<std::pair<std::string, std::string>> bad = {
      {good.substr(0, good.size() / 2), "malformed JSON"},
      {"[1, 2]", "expected a JSON object of token -> id ('{'), got an array"},
      {"{\"a\": 1.5}", "expected an integer"},
      {"{\"a\": null}", "expected an integer"},
      {"{\"a\": 1,}", "expected string literal"},
      {"{\"\\ud800\": 1}", "surrogate"},
      {"{\"\\u4e00\": 1}", "outside GPT-2's byte alphabet"},
      {"{}", "empty"},
      {"{\"a\": -3}", "has id -3"},
      {"{\"a\": 1, \"b\": 1}", "id 1 is given to two tokens"},
      {"{\"a\": 1, \"a\": 2}", "appears twice"},
      {"{\"a\": 1}", "no token for byte"},
      {good.substr(0, good.rfind(", ")) + "}", "no \"<|endoftext|>\" token"},
  };
  for (const auto& [json, expected] : bad) {
    std::string msg = error_with(json);
    EXPECT_NE(msg.find("encoder.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << "for " << json.substr(0, 60) << ": " << msg;
  }
}

TEST(Gpt2Tokenizer, MalformedVocabBpeIsReported) {
  TinyVocab v;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"#version: 0.2\nh e\nl\n", "vocab.bpe:3: expected two tokens separated by one space"},
      {"h e x\n", "vocab.bpe:1: expected two tokens"},
      {"h \xE4\xB8\x80\n", "outside GPT-2's byte alphabet"},
      {"h Ġ\n", "vocab.bpe:1: the merge of \"h Ġ\" is not a token"},
      {"h e\nh e\n", "vocab.bpe:2: merge \"h e\" appears twice"},
      {"#version: 0.2\n", "no merges"},
  };
  for (const auto& [bpe, expected] : bad) {
    v.write("vocab.bpe", bpe);
    std::string msg = error_of([&] { Gpt2Tokenizer t(v.dir()); });
    EXPECT_NE(msg.find(expected), std::string::npos) << "for " << bpe << ": " << msg;
  }
}

// TESSERA_DATA_DIR set for the life of the object (the default directory of GPT-2's files).
class DataDirEnv {
 public:
  explicit DataDirEnv(const std::string& dir) { ::setenv("TESSERA_DATA_DIR", dir.c_str(), 1); }
  ~DataDirEnv() { ::unsetenv("TESSERA_DATA_DIR"); }
};

TEST(MakeTokenizer, BuildsByteAndGpt2AndRejectsOthers) {
  auto byte = make_tokenizer("byte", "");
  EXPECT_EQ(byte->name(), "byte");
  TinyVocab v;
  auto gpt2 = make_tokenizer("gpt2", v.dir());
  EXPECT_EQ(gpt2->name(), "gpt2");
  EXPECT_EQ(gpt2->decode(gpt2->encode("hello world")), "hello world");
  const DataDirEnv nowhere("/nonexistent/tessera/data");
  std::string msg = error_of([] { make_tokenizer("gpt2", ""); });
  EXPECT_NE(msg.find("encoder.json and vocab.bpe"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/nonexistent/tessera/data/gpt2 (the default: $TESSERA_DATA_DIR/gpt2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("run scripts/get_data.sh"), std::string::npos) << msg;
  msg = error_of([] { make_tokenizer("gpt2", "/nonexistent/dir"); });
  EXPECT_NE(msg.find("/nonexistent/dir"), std::string::npos) << msg;
  msg = error_of([] { make_tokenizer("sentencepiece", ""); });
  EXPECT_NE(msg.find("unknown tokenizer 'sentencepiece'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte, gpt2"), std::string::npos) << msg;
}

// No directory named: GPT-2's files are taken from the default directory, the repository's
// data/gpt2 (where scripts/get_data.sh puts them), or $TESSERA_DATA_DIR/gpt2 when that is set.
TEST(MakeTokenizer, Gpt2FindsItsFilesInTheDefaultDirectory) {
  EXPECT_EQ(fs::weakly_canonical(default_data_dir()), fs::weakly_canonical(std::string(TESSERA_TEST_DATA_DIR) + "/../../data"));
  EXPECT_EQ(fs::path(default_gpt2_vocab_dir()), fs::path(default_data_dir()) / "gpt2");
  TinyVocab v;
  const fs::path data = fs::path(v.dir()) / "data";
  fs::create_directories(data / "gpt2");
  for (const char* f : {"encoder.json", "vocab.bpe"}) fs::copy_file(fs::path(v.dir()) / f, data / "gpt2" / f);
  const DataDirEnv env(data.string());
  EXPECT_EQ(default_data_dir(), data.string());
  const auto tok = make_tokenizer("gpt2", "");
  EXPECT_EQ(tok->vocab_size(), 256 + 12 + 1);  // the tiny vocabulary: found there, not elsewhere
  EXPECT_EQ(tok->decode(tok->encode("hello world")), "hello world");
  fs::remove(data / "gpt2" / "vocab.bpe");
  const std::string msg = error_of([] { make_tokenizer("gpt2", ""); });
  EXPECT_NE(msg.find((data / "gpt2").string()), std::string::npos) << msg;
}

}  // namespace
}  // namespace tessera
