// Chat templates for supervised fine-tuning: a conversation (roles and contents) rendered as the
// text a model sees, in pieces that say which text is a special token and which the loss covers.
// Key decision: rendering is pure text (tested against hand-written strings); the tokenizer turns
// the pieces into ids (data/sft.h), so any tokenizer that knows the template's special tokens fits.
#pragma once

#include <string>
#include <vector>

namespace tessera {

// plain: the prompt then the response, nothing around them (a prompt/response record, or one
// user message then one assistant message).
// chatml: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message.
// llama3: "<|begin_of_text|>" then "<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>" per message.
enum class ChatTemplate { kPlain, kChatMl, kLlama3 };

// "plain", "chatml", "llama3"; anything else is an Error listing them.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate t);
// The special tokens the template writes (each must be one special token of the tokenizer).
std::vector<std::string> chat_template_special_tokens(ChatTemplate t);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// One piece of a rendered conversation: plain text, or a special token written as its text.
// trained: the loss covers it (an assistant's content and its end-of-turn token).
struct ChatPiece {
  std::string text;
  bool special = false;
  bool trained = false;
  bool operator==(const ChatPiece&) const = default;
};

// The conversation rendered with template t. plain takes exactly a user message then an assistant
// message (the prompt/response form); an Error otherwise.
std::vector<ChatPiece> render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages);
// The pieces' text back to back: what the model reads.
std::string chat_text(const std::vector<ChatPiece>& pieces);

}  // namespace tessera
