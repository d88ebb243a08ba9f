// Tests data/chat_template.h: each template renders to a hand-written string, and its pieces say
// which text is special and which the loss covers.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include "error_testing.h"

namespace tessera {
namespace {

using testing::throws_with;

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}, {"assistant", "6"}};

// The trained pieces' text, in order.
std::vector<std::string> trained(const std::vector<ChatPiece>& pieces) {
  std::vector<std::string> out;
  for (const auto& p : pieces)
    if (p.trained) out.push_back(p.text);
  return out;
}

TEST(ChatTemplate, ChatMlRendersExactly) {
  const auto pieces = render_chat(ChatTemplate::kChatMl, kConversation);
  EXPECT_EQ(chat_text(pieces),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n6<|im_end|>\n");
  // The assistants' contents and their end-of-turn tokens, nothing else.
  EXPECT_EQ(trained(pieces), (std::vector<std::string>{"4", "<|im_end|>", "6", "<|im_end|>"}));
  for (const auto& p : pieces) EXPECT_EQ(p.special, p.text == "<|im_start|>" || p.text == "<|im_end|>") << p.text;
}

TEST(ChatTemplate, Llama3RendersExactly) {
  const auto pieces = render_chat(ChatTemplate::kLlama3, {{"user", "Hi"}, {"assistant", "Hello!"}});
  EXPECT_EQ(chat_text(pieces),
            "<|begin_of_text|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>");
  EXPECT_EQ(trained(pieces), (std::vector<std::string>{"Hello!", "<|eot_id|>"}));
  int specials = 0;
  for (const auto& p : pieces) specials += p.special;
  EXPECT_EQ(specials, 7);  // begin_of_text + 3 per message
}

TEST(ChatTemplate, PlainIsPromptThenResponse) {
  const auto pieces = render_chat(ChatTemplate::kPlain, {{"user", "1+1="}, {"assistant", "2"}});
  EXPECT_EQ(pieces, (std::vector<ChatPiece>{{"1+1=", false, false}, {"2", false, true}}));
  EXPECT_TRUE(throws_with([] { render_chat(ChatTemplate::kPlain, kConversation); }, {"plain", "--chat-template"}));
}

TEST(ChatTemplate, NamesAndSpecialTokens) {
  EXPECT_EQ(parse_chat_template("chatml"), ChatTemplate::kChatMl);
  EXPECT_EQ(parse_chat_template("llama3"), ChatTemplate::kLlama3);
  EXPECT_EQ(parse_chat_template("plain"), ChatTemplate::kPlain);
  EXPECT_TRUE(throws_with([] { parse_chat_template("zephyr"); }, {"\"zephyr\"", "plain, chatml or llama3"}));
  EXPECT_EQ(chat_template_special_tokens(ChatTemplate::kChatMl), (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));
  EXPECT_TRUE(chat_template_special_tokens(ChatTemplate::kPlain).empty());
}

}  // namespace
}  // namespace tessera
