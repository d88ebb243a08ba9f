// Tests data/sft.h: record parsing and its errors, and the ids and loss mask of each template with
// the byte tokenizer (plus chat special tokens, as a tokenizer with added tokens has them) and GPT-2.
#include "data/sft.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "data/gpt2_tokenizer.h"
#include "error_testing.h"

namespace tessera {
namespace {

using testing::throws_with;

// The byte tokenizer with chat special tokens after its 257 ids: what a tokenizer with added
// special tokens (a Hugging Face tokenizer.json) offers through the Tokenizer interface.
class ChatByteTokenizer : public ByteTokenizer {
 public:
  ChatByteTokenizer() {
    for (const char* s : {"<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                          "<|end_header_id|>", "<|eot_id|>"})
      specials_.emplace(s, 257 + static_cast<int32_t>(specials_.size()));
  }
  int64_t vocab_size() const override { return 257 + static_cast<int64_t>(specials_.size()); }
  std::string name() const override { return "chat-byte"; }
  std::optional<int32_t> special_token_id(std::string_view text) const override {
    const auto it = specials_.find(std::string(text));
    return it == specials_.end() ? std::nullopt : std::optional<int32_t>(it->second);
  }

 private:
  std::map<std::string, int32_t> specials_;
};

// The ids as text: bytes as themselves, 256 as "|", specials as "<k>" (k = id - 257); and the mask
// as a string of 0/1 of the same length per token.
std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (id < 256) {
      s += char(id);
    } else if (id == 256) {
      s += '|';
    } else {
      s += '<';
      s += std::to_string(id - 257);
      s += '>';
    }
  }
  return s;
}
std::string show_mask(const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t width = ids[i] <= 256 ? 1 : 2 + std::to_string(ids[i] - 257).size();
    s += std::string(width, mask[i] ? '1' : '0');
  }
  return s;
}

TEST(SftRecord, PromptResponseAndMessages) {
  const auto pair = parse_sft_record(R"({"prompt": "1+1=", "response": "2", "id": 7})");
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_EQ(pair[0].role, "user");
  EXPECT_EQ(pair[0].content, "1+1=");
  EXPECT_EQ(pair[1].role, "assistant");
  EXPECT_EQ(pair[1].content, "2");
  const auto chat = parse_sft_record(
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})");
  ASSERT_EQ(chat.size(), 3u);
  EXPECT_EQ(chat[0].role, "system");
  EXPECT_EQ(chat[2].content, "a");
}

TEST(SftRecord, BadRecordsNameTheProblem) {
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"prompt": "x", )"); }, {"malformed JSON"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"([1, 2])"); }, {"one JSON object"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"text": "x"})"); }, {"neither", "\"messages\""}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"prompt": "x"})"); }, {"no \"response\" string"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"prompt": 3, "response": "y"})"); },
                          {"\"prompt\" must be a string, got an integer"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"prompt": "x", "response": ""})"); }, {"empty response"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"prompt": "x", "response": "y", "messages": []})"); }, {"both"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"messages": {"role": "user"}})"); },
                          {"\"messages\" must be an array, got an object"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"messages": []})"); }, {"\"messages\" is empty"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"messages": ["hi"]})"); }, {"message 0 must be an object"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"messages": [{"role": "robot", "content": "x"}]})"); },
                          {"message 0", "unknown role \"robot\"", "system, user or assistant"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"messages": [{"role": "user"}]})"); },
                          {"message 0 has no \"content\" string"}));
  EXPECT_TRUE(throws_with([] { parse_sft_record(R"({"messages": [{"role": "user", "content": "x"}]})"); },
                          {"no assistant message"}));
  EXPECT_TRUE(throws_with(
      [] {
        parse_sft_record(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]})");
      },
      {"message 1", "empty response"}));
}

TEST(SftTokenize, PlainByteMasksTheResponseAndTheEnd) {
  const ByteTokenizer tok;
  const SftExample e = tokenize_sft(ChatTemplate::kPlain, {{"user", "1+1="}, {"assistant", "2"}}, tok);
  EXPECT_EQ(show(e.ids), "1+1=2|");
  EXPECT_EQ(show_mask(e.ids, e.mask), "000011");
}

TEST(SftTokenize, ChatMlMasksAssistantTurnsWithTheirEndOfTurn) {
  const ChatByteTokenizer tok;
  const SftExample e = tokenize_sft(
      ChatTemplate::kChatMl, {{"system", "S"}, {"user", "Q"}, {"assistant", "A"}, {"user", "R"}, {"assistant", "BC"}}, tok);
  // <0> = <|im_start|>, <1> = <|im_end|>; the document ends with the end-of-document id (|).
  EXPECT_EQ(show(e.ids),
            "<0>system\nS<1>\n<0>user\nQ<1>\n<0>assistant\nA<1>\n<0>user\nR<1>\n<0>assistant\nBC<1>\n|");
  const std::string turn(13, '0');  // "<0>user\nQ<1>\n" and "<0>assistant\n": 13 characters each
  EXPECT_EQ(show_mask(e.ids, e.mask), std::string(15, '0') + turn + turn + "1" + "111" + "0" + turn + turn + "11" +
                                          "111" + "0" + "0");
}

TEST(SftTokenize, Llama3MasksAssistantTurns) {
  const ChatByteTokenizer tok;
  const SftExample e = tokenize_sft(ChatTemplate::kLlama3, {{"user", "Q"}, {"assistant", "A"}}, tok);
  // <2> begin_of_text, <3> start_header_id, <4> end_header_id, <5> eot_id.
  EXPECT_EQ(show(e.ids), "<2><3>user<4>\n\nQ<5><3>assistant<4>\n\nA<5>|");
  EXPECT_EQ(show_mask(e.ids, e.mask), std::string(3 + 3 + 4 + 3 + 2 + 1 + 3, '0') +
                                          std::string(3 + 9 + 3 + 2, '0') + "1" + "111" + "0");
}

TEST(SftTokenize, TemplateTokensTheTokenizerLacksAreRefused) {
  EXPECT_TRUE(throws_with([] { check_chat_template_tokens(ChatTemplate::kChatMl, ByteTokenizer()); },
                          {"chat template chatml", "<|im_start|>", "the byte tokenizer does not have"}));
  EXPECT_NO_THROW(check_chat_template_tokens(ChatTemplate::kPlain, ByteTokenizer()));
  EXPECT_NO_THROW(check_chat_template_tokens(ChatTemplate::kLlama3, ChatByteTokenizer()));
}

// GPT-2's BPE merges across the prompt/response boundary where the text does: a token holding
// response bytes is trained. " 2" after "1+1=" is one token of its own here.
TEST(SftTokenize, Gpt2MasksByTokenBytes) {
  const std::string dir = std::string(TESSERA_TEST_DATA_DIR) + "/gpt2";
  ASSERT_TRUE(std::filesystem::is_regular_file(dir + "/encoder.json")) << dir << " lacks GPT-2's files";
  const Gpt2Tokenizer tok(dir);
  EXPECT_EQ(tok.special_token_id("<|endoftext|>"), std::optional<int32_t>(50256));
  EXPECT_EQ(tok.special_token_id("<|im_start|>"), std::nullopt);
  const SftExample e = tokenize_sft(ChatTemplate::kPlain, {{"user", "Question: 1+1="}, {"assistant", " 2"}}, tok);
  const std::vector<int32_t> text_ids = tok.encode("Question: 1+1= 2");
  ASSERT_EQ(e.ids.size(), text_ids.size() + 1);
  EXPECT_TRUE(std::equal(text_ids.begin(), text_ids.end(), e.ids.begin()));
  EXPECT_EQ(e.ids.back(), 50256);
  EXPECT_EQ(tok.decode({e.ids[e.ids.size() - 2]}), " 2");
  std::vector<uint8_t> expected(e.ids.size(), 0);
  expected[expected.size() - 2] = expected.back() = 1;
  EXPECT_EQ(e.mask, expected);
  // Whatever BPE makes of "helloworld", a token holding any response byte (from byte 5 on) is
  // trained and one holding none is not.
  const SftExample f = tokenize_sft(ChatTemplate::kPlain, {{"user", "hello"}, {"assistant", "world"}}, tok);
  size_t at = 0;
  for (size_t i = 0; i + 1 < f.ids.size(); ++i) {
    const size_t end = at + tok.decode({f.ids[i]}).size();
    EXPECT_EQ(f.mask[i], end > 5 ? 1 : 0) << "token " << i;
    at = end;
  }
}

}  // namespace
}  // namespace tessera
