// Supervised fine-tuning records (`tessera prepare --sft`): one JSON object per .jsonl line, either
// {"prompt": "...", "response": "..."} or {"messages": [{"role": "system|user|assistant",
// "content": "..."}, ...]}, turned into token ids and a per-token loss mask (1 on the responses).
// Key decision: the rendered text is tokenized as a whole between special tokens (as the model
// will read it), and the mask is placed by each token's bytes, so a token is trained when any of
// its bytes belongs to a response.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"

namespace tessera {

// The messages of one record (a prompt/response pair becomes user then assistant). Errors name the
// problem but not the line (the caller adds file:line): malformed JSON, not an object, both or
// neither of "prompt"/"response" and "messages", a value of the wrong type, an unknown role, no
// assistant message, or an empty response.
std::vector<ChatMessage> parse_sft_record(std::string_view line);

// Every special token template t writes is a special token of tok; else an Error naming the token,
// the template and the tokenizer.
void check_chat_template_tokens(ChatTemplate t, const Tokenizer& tok);

// One record as a document: ids (N) and mask (N), 1 where the token is a training target. The
// document ends with tok.eot_id() (the document mask's boundary), trained with the plain template
// (it ends the response) and not with a chat template (whose end-of-turn token already is).
struct SftExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};
SftExample tokenize_sft(ChatTemplate t, const std::vector<ChatMessage>& messages, const Tokenizer& tok);

}  // namespace tessera
