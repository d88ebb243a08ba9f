// The templates, one small function each: a header and a footer around every message.
#include "data/chat_template.h"

#include "kernels/check.h"

namespace tessera {

namespace {

constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>";
constexpr const char* kBeginOfText = "<|begin_of_text|>";
constexpr const char* kStartHeader = "<|start_header_id|>";
constexpr const char* kEndHeader = "<|end_header_id|>";
constexpr const char* kEotId = "<|eot_id|>";

ChatPiece text(std::string s, bool trained = false) { return ChatPiece{std::move(s), false, trained}; }
ChatPiece special(std::string s, bool trained = false) { return ChatPiece{std::move(s), true, trained}; }

bool is_assistant(const ChatMessage& m) { return m.role == "assistant"; }

std::vector<ChatPiece> render_plain(const std::vector<ChatMessage>& messages) {
  TESSERA_CHECK(messages.size() == 2 && messages[0].role == "user" && is_assistant(messages[1]),
                "the plain template takes a prompt and a response; a conversation (\"messages\") needs a chat ",
                "template (--chat-template chatml or llama3)");
  return {text(messages[0].content), text(messages[1].content, true)};
}

// <|im_start|>ROLE\nCONTENT<|im_end|>\n
std::vector<ChatPiece> render_chatml(const std::vector<ChatMessage>& messages) {
  std::vector<ChatPiece> out;
  for (const ChatMessage& m : messages) {
    const bool trained = is_assistant(m);
    out.push_back(special(kImStart));
    out.push_back(text(m.role + "\n"));
    out.push_back(text(m.content, trained));
    out.push_back(special(kImEnd, trained));
    out.push_back(text("\n"));
  }
  return out;
}

// <|begin_of_text|> then <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> per message
std::vector<ChatPiece> render_llama3(const std::vector<ChatMessage>& messages) {
  std::vector<ChatPiece> out = {special(kBeginOfText)};
  for (const ChatMessage& m : messages) {
    const bool trained = is_assistant(m);
    out.push_back(special(kStartHeader));
    out.push_back(text(m.role));
    out.push_back(special(kEndHeader));
    out.push_back(text("\n\n"));
    out.push_back(text(m.content, trained));
    out.push_back(special(kEotId, trained));
  }
  return out;
}

}  // namespace

ChatTemplate parse_chat_template(const std::string& name) {
  if (name == "plain") return ChatTemplate::kPlain;
  if (name == "chatml") return ChatTemplate::kChatMl;
  if (name == "llama3") return ChatTemplate::kLlama3;
  detail::fail("unknown chat template \"", name, "\" (expected plain, chatml or llama3)");
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatMl: return "chatml";
    case ChatTemplate::kLlama3: return "llama3";
    default: return "plain";
  }
}

std::vector<std::string> chat_template_special_tokens(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatMl: return {kImStart, kImEnd};
    case ChatTemplate::kLlama3: return {kBeginOfText, kStartHeader, kEndHeader, kEotId};
    default: return {};
  }
}

std::vector<ChatPiece> render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  switch (t) {
    case ChatTemplate::kChatMl: return render_chatml(messages);
    case ChatTemplate::kLlama3: return render_llama3(messages);
    default: return render_plain(messages);
  }
}

std::string chat_text(const std::vector<ChatPiece>& pieces) {
  std::string s;
  for (const ChatPiece& p : pieces) s += p.text;
  return s;
}

}  // namespace tessera
