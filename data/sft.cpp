// SFT records: JSON line -> messages (checked field by field) -> rendered pieces -> ids and mask.
#include "data/sft.h"

#include <algorithm>
#include <string>

#include "data/json.h"
#include "kernels/check.h"

namespace tessera {

namespace {

bool known_role(const std::string& r) { return r == "system" || r == "user" || r == "assistant"; }

std::string required_string(const Json& object, const std::string& key, const std::string& where) {
  const std::optional<std::string> v = json_string(object, key, where);
  TESSERA_CHECK(v.has_value(), where, " has no \"", key, "\" string");
  return *v;
}

std::vector<ChatMessage> parse_messages(const Json& list) {
  TESSERA_CHECK(list.is_array(), "\"messages\" must be an array, got ", json_kind(list));
  TESSERA_CHECK(!list.empty(), "\"messages\" is empty");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "message " + std::to_string(i);
    TESSERA_CHECK(list[i].is_object(), where, " must be an object, got ", json_kind(list[i]));
    ChatMessage m{required_string(list[i], "role", where), required_string(list[i], "content", where)};
    TESSERA_CHECK(known_role(m.role), where, " has the unknown role \"", m.role,
                  "\" (expected system, user or assistant)");
    TESSERA_CHECK(m.role != "assistant" || !m.content.empty(), where, " is an empty response (assistant content \"\")");
    messages.push_back(std::move(m));
  }
  TESSERA_CHECK(std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == "assistant"; }),
                "no assistant message: nothing to train on");
  return messages;
}

// Appends the ids and mask of the text pieces [first, last) (none special), tokenized as one text.
void add_text(const std::vector<ChatPiece>& pieces, size_t first, size_t last, const Tokenizer& tok,
              SftExample& out) {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;  // byte ranges [begin, end) the loss covers
  for (size_t k = first; k < last; ++k) {
    if (pieces[k].trained && !pieces[k].text.empty()) trained.emplace_back(text.size(), text.size() + pieces[k].text.size());
    text += pieces[k].text;
  }
  if (text.empty()) return;
  const std::vector<int32_t> ids = tok.encode(text);
  size_t at = 0;
  for (int32_t id : ids) {
    const size_t end = at + tok.decode({id}).size();
    const bool covered = std::any_of(trained.begin(), trained.end(),
                                     [&](const auto& r) { return at < r.second && r.first < end; });
    out.ids.push_back(id);
    out.mask.push_back(covered ? 1 : 0);
    at = end;
  }
  TESSERA_CHECK(at == text.size(), "the ", tok.name(), " tokenizer's tokens do not spell out the text byte for byte",
                " (", at, " bytes for ", text.size(), "), so the loss mask cannot be placed");
}

}  // namespace

std::vector<ChatMessage> parse_sft_record(std::string_view line) {
  const Json record = parse_json_line(line);
  const bool pair = record.contains("prompt") || record.contains("response");
  const bool chat = record.contains("messages");
  TESSERA_CHECK(pair || chat, "the record has neither \"prompt\" and \"response\" nor \"messages\"");
  TESSERA_CHECK(!(pair && chat), "the record has both \"messages\" and \"prompt\"/\"response\"; give one form");
  if (chat) return parse_messages(record["messages"]);
  ChatMessage prompt{"user", required_string(record, "prompt", "the record")};
  ChatMessage response{"assistant", required_string(record, "response", "the record")};
  TESSERA_CHECK(!response.content.empty(), "empty response (\"response\": \"\")");
  return {std::move(prompt), std::move(response)};
}

void check_chat_template_tokens(ChatTemplate t, const Tokenizer& tok) {
  for (const std::string& s : chat_template_special_tokens(t))
    TESSERA_CHECK(tok.special_token_id(s).has_value(), "chat template ", chat_template_name(t),
                  " writes the special token ", s, ", which the ", tok.name(),
                  " tokenizer does not have (use a tokenizer that defines it, or --chat-template plain for "
                  "prompt/response records)");
}

SftExample tokenize_sft(ChatTemplate t, const std::vector<ChatMessage>& messages, const Tokenizer& tok) {
  const std::vector<ChatPiece> pieces = render_chat(t, messages);
  SftExample out;
  size_t run = 0;  // first piece of the current run of text pieces
  for (size_t k = 0; k <= pieces.size(); ++k) {
    if (k < pieces.size() && !pieces[k].special) continue;
    add_text(pieces, run, k, tok, out);
    if (k < pieces.size()) {
      const std::optional<int32_t> id = tok.special_token_id(pieces[k].text);
      TESSERA_CHECK(id.has_value(), "the ", tok.name(), " tokenizer has no special token ", pieces[k].text);
      out.ids.push_back(*id);
      out.mask.push_back(pieces[k].trained ? 1 : 0);
    }
    run = k + 1;
  }
  out.ids.push_back(tok.eot_id());
  out.mask.push_back(t == ChatTemplate::kPlain ? 1 : 0);
  return out;
}

}  // namespace tessera
