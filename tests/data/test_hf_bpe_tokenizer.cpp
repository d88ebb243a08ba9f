// Tests data/hf_bpe_tokenizer.h: exact ids against the `tokenizers` library on two small trained
// tokenizers (tests/reference/hf_tokenizers, made by tests/reference/make_hf_tokenizers.py: a GPT-2
// style one with "a b" merges and a LLaMA-3 style one with pair merges, ignore_merges and special
// tokens), decode round trips, special tokens as plain text, and refusals of what it does not read.
#include "data/hf_bpe_tokenizer.h"

#include <fstream>
#include <functional>
#include <random>

#include "data/json.h"
#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::TempDir;
using testing::throws_with;

std::string fixture(const std::string& name) {
  return std::string(TESSERA_TEST_DATA_DIR) + "/hf_tokenizers/" + name;
}

const Json& cases() {
  static const Json doc = read_json_file(fixture("cases.json"));
  return doc.at("cases");
}

std::vector<int32_t> ids_of(const Json& v) { return v.get<std::vector<int32_t>>(); }

void expect_library_ids(const std::string& name) {
  const HfBpeTokenizer tok(fixture(name + ".json"));
  ASSERT_GE(cases().size(), 50u);
  for (const Json& c : cases()) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> expected = ids_of(c.at(name));
    EXPECT_EQ(tok.encode(text, /*allow_special=*/true), expected) << name << ": " << Json(text).dump();
    EXPECT_EQ(tok.decode(expected), text) << name << ": " << Json(text).dump();
  }
}

TEST(HfBpeTokenizer, Gpt2StyleIdsEqualTheLibrarys) { expect_library_ids("gpt2_style"); }

TEST(HfBpeTokenizer, Llama3StyleIdsEqualTheLibrarys) { expect_library_ids("llama3_style"); }

TEST(HfBpeTokenizer, ReadsTheFilesParts) {
  const HfBpeTokenizer gpt2(fixture("gpt2_style.json")), llama3(fixture("llama3_style.json"));
  EXPECT_EQ(gpt2.split(), HfBpeTokenizer::Split::kGpt2);
  EXPECT_EQ(llama3.split(), HfBpeTokenizer::Split::kLlama3);
  EXPECT_EQ(gpt2.vocab_size(), 800);
  EXPECT_EQ(llama3.vocab_size(), 800);
  EXPECT_EQ(gpt2.token_bytes(gpt2.eot_id()), "<|endoftext|>");
  EXPECT_EQ(llama3.token_bytes(llama3.eot_id()), "<|end_of_text|>");
  EXPECT_EQ(gpt2.name(), "tokenizer.json");
}

TEST(HfBpeTokenizer, SpecialTokensAreTextUnlessAllowed) {
  const HfBpeTokenizer tok(fixture("llama3_style.json"));
  const std::string text = "<|begin_of_text|>Hi";
  const std::vector<int32_t> special = tok.encode(text, true), plain = tok.encode(text, false);
  EXPECT_EQ(special.front(), 0);  // <|begin_of_text|>
  EXPECT_GT(plain.size(), special.size());
  for (int32_t id : plain) EXPECT_GE(id, 5) << "no special token id in the plain encoding";
  EXPECT_EQ(tok.decode(plain), text);
}

// Chat templates (data/chat_template.h) look their tokens up by content: special added tokens only.
TEST(HfBpeTokenizer, SpecialTokenIdsByContent) {
  const HfBpeTokenizer llama3(fixture("llama3_style.json"));
  EXPECT_EQ(llama3.special_token_id("<|begin_of_text|>"), std::optional<int32_t>(0));
  const std::optional<int32_t> eot = llama3.special_token_id("<|eot_id|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_EQ(llama3.encode("<|eot_id|>", true), std::vector<int32_t>{*eot});
  EXPECT_FALSE(llama3.special_token_id("<|im_start|>").has_value());
  EXPECT_FALSE(llama3.special_token_id("<|eot_id").has_value());
  EXPECT_FALSE(llama3.special_token_id("Hi").has_value());
}

TEST(HfBpeTokenizer, AnyBytesRoundTrip) {
  const HfBpeTokenizer tok(fixture("llama3_style.json"));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 40, '\0');
    for (char& ch : s) ch = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
}

TEST(HfBpeTokenizer, IsPickedByMakeTokenizerFromAJsonPath) {
  auto tok = make_tokenizer(fixture("gpt2_style.json"), "");
  EXPECT_EQ(tok->name(), "tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 800);
  EXPECT_TRUE(throws_with([] { make_tokenizer("tokenizer.model", ""); }, {"tokenizer.model", ".json"}));
}

// The GPT-2 style fixture with one part replaced, written to a temporary file.
class EditedTokenizer {
 public:
  explicit EditedTokenizer(const std::function<void(Json&)>& edit) : dir_("hf_tok") {
    Json doc = read_json_file(fixture("gpt2_style.json"));
    edit(doc);
    std::ofstream(path()) << doc.dump();
  }
  std::string path() const { return dir_ / "tokenizer.json"; }

 private:
  TempDir dir_;
};

// Reading the edited file throws an Error naming the file and saying each of parts.
::testing::AssertionResult refused(const std::function<void(Json&)>& edit, std::initializer_list<std::string> parts) {
  EditedTokenizer f(edit);
  const std::string message = testing::error_of([&] { HfBpeTokenizer tok(f.path()); });
  std::vector<std::string> all(parts);
  all.push_back(f.path() + ": ");
  for (const std::string& part : all)
    if (message.find(part) == std::string::npos)
      return ::testing::AssertionFailure() << "the error \"" << message << "\" does not say \"" << part << "\"";
  return ::testing::AssertionSuccess();
}

TEST(HfBpeTokenizer, RefusesOtherModelsAndPreTokenizers) {
  EXPECT_TRUE(refused([](Json& d) { d["model"] = {{"type", "Unigram"}, {"vocab", Json::array()}}; },
                      {"model.type = \"Unigram\" (SentencePiece) is not supported; tessera reads byte-level BPE"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["type"] = "WordPiece"; }, {"model.type = \"WordPiece\""}));
  EXPECT_TRUE(refused([](Json& d) { d["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}}; },
                      {"pre_tokenizer.type = \"Metaspace\" (SentencePiece-style) is not supported"}));
  EXPECT_TRUE(refused([](Json& d) { d["pre_tokenizer"] = {{"type", "Whitespace"}}; }, {"pre_tokenizer.type = \"Whitespace\""}));
  EXPECT_TRUE(refused([](Json& d) { d["pre_tokenizer"] = nullptr; }, {"pre_tokenizer is null"}));
  EXPECT_TRUE(refused([](Json& d) { d["normalizer"] = {{"type", "NFC"}}; }, {"normalizer.type = \"NFC\" is not supported"}));
  EXPECT_TRUE(refused([](Json& d) { d["decoder"] = {{"type", "Metaspace"}}; }, {"decoder.type = \"Metaspace\""}));
  EXPECT_TRUE(refused([](Json& d) { d["pre_tokenizer"]["add_prefix_space"] = true; }, {"pre_tokenizer: add_prefix_space = true"}));
  EXPECT_TRUE(refused(
      [](Json& d) {
        d["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}},
                                                 {{"type", "ByteLevel"}, {"use_regex", false}}}}};
      },
      {"pre_tokenizer.pretokenizers[0].pattern.Regex = \"\\\\s+\" is not a pattern tessera implements"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["dropout"] = 0.1; }, {"model.dropout = 0.1"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["continuing_subword_prefix"] = "##"; }, {"model.continuing_subword_prefix"}));
  EXPECT_TRUE(refused([](Json& d) { d["added_tokens"][0]["lstrip"] = true; }, {"added_tokens[0]", "lstrip = true"}));
}

TEST(HfBpeTokenizer, RefusesBrokenVocabulariesAndMerges) {
  EXPECT_TRUE(refused([](Json& d) { d["model"]["vocab"].erase("a"); }, {"model.vocab has no token for byte 0x61"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["merges"].push_back("zzzq y"); }, {"\"zzzq\" is not a token of model.vocab"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["merges"].push_back("a b c"); }, {"expected two tokens separated by one space"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["merges"].push_back(Json::array({"a"})); }, {"expected \"a b\" or [\"a\", \"b\"]"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["merges"].push_back(d["model"]["merges"][0]); }, {"appears twice"}));
  EXPECT_TRUE(refused([](Json& d) { d["model"]["vocab"]["b"] = 97; }, {"has id 97, which another token has"}));
  EXPECT_TRUE(refused([](Json& d) { d["added_tokens"] = Json::array(); }, {"no end-of-document token"}));
  EXPECT_TRUE(refused([](Json& d) { d.erase("model"); }, {"no \"model\" key"}));
}

TEST(HfBpeTokenizer, RefusesMissingFilesAndBadJson) {
  EXPECT_TRUE(throws_with([] { HfBpeTokenizer tok("/nonexistent/tokenizer.json"); },
                          {"/nonexistent/tokenizer.json not found", "byte-level BPE"}));
  TempDir dir("hf_tok_bad");
  std::ofstream(dir / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\",";
  EXPECT_TRUE(throws_with([&] { HfBpeTokenizer tok(dir / "tokenizer.json"); },
                          {dir / "tokenizer.json", "malformed JSON"}));
}

}  // namespace
}  // namespace tessera
