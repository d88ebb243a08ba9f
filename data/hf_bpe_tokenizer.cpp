// HfBpeTokenizer: tokenizer.json reading (one function per top-level key, each refusing what it
// does not implement) and encode/decode.
#include "data/hf_bpe_tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "data/gpt2_pretokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/json.h"
#include "data/llama3_pretokenizer.h"
#include "kernels/check.h"

namespace tessera {

namespace {

constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr std::string_view kGpt2SplitPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// End-of-document tokens, in the order they are preferred.
constexpr std::string_view kEotNames[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};


// The object at key (which must be there and be an object).
const Json& object_at(const Json& parent, const std::string& key, const std::string& where) {
  TESSERA_CHECK(parent.contains(key), where, ": no \"", key, "\" key");
  const Json& v = parent.at(key);
  TESSERA_CHECK(v.is_object(), where, ": ", key, " must be an object, got ", json_kind(v));
  return v;
}

// A key that must be absent, null or equal to `allowed` (a boolean option tessera does not offer).
void require_flag(const Json& obj, const std::string& key, bool allowed, const std::string& where,
                  const std::string& why) {
  if (!obj.contains(key) || obj.at(key).is_null()) return;
  const Json& v = obj.at(key);
  TESSERA_CHECK(v.is_boolean(), where, ": ", key, " must be a boolean, got ", json_kind(v));
  TESSERA_CHECK(v.get<bool>() == allowed, where, ": ", key, " = ", v.get<bool>() ? "true" : "false",
                " is not supported; ", why);
}

std::string type_of(const Json& obj, const std::string& key, const std::string& where) {
  std::optional<std::string> type = json_string(obj, "type", where + ": " + key);
  TESSERA_CHECK(type.has_value(), where, ": ", key, " has no \"type\"");
  return *type;
}

}  // namespace

bool is_tokenizer_json_path(std::string_view path) {
  constexpr std::string_view kExt = ".json";
  return path.size() >= kExt.size() && path.substr(path.size() - kExt.size()) == kExt;
}

// Reads each part of the file into the tokenizer; `where` is the file's path, every message's start.
class HfBpeTokenizer::Loader {
 public:
  Loader(HfBpeTokenizer& tok, const std::string& path) : tok_(tok), where_(path) {}

  void load(const Json& doc) {
    TESSERA_CHECK(doc.is_object(), where_, ": expected a JSON object (a tokenizers library tokenizer.json), got ",
                  json_kind(doc));
    read_model(object_at(doc, "model", where_));
    read_normalizer(doc.contains("normalizer") ? doc.at("normalizer") : Json());
    TESSERA_CHECK(doc.contains("pre_tokenizer") && !doc.at("pre_tokenizer").is_null(), where_,
                  ": pre_tokenizer is null; a byte-level BPE needs the ByteLevel pre-tokenizer");
    read_pre_tokenizer(doc.at("pre_tokenizer"), "pre_tokenizer");
    read_decoder(doc.contains("decoder") ? doc.at("decoder") : Json());
    if (doc.contains("added_tokens") && !doc.at("added_tokens").is_null()) read_added_tokens(doc.at("added_tokens"));
    finish();
  }

 private:
  void read_model(const Json& model) {
    const std::string type = type_of(model, "model", where_);
    if (type != "BPE") {
      const char* what = type == "Unigram" ? " (SentencePiece)" : type == "WordPiece" ? " (BERT-style)" : "";
      detail::fail(where_, ": model.type = \"", type, "\"", what, " is not supported; tessera reads byte-level BPE");
    }
    if (model.contains("dropout") && !model.at("dropout").is_null()) {
      const Json& d = model.at("dropout");
      TESSERA_CHECK(d.is_number() && d.get<double>() == 0.0, where_, ": model.dropout = ", d.dump(),
                    " is not supported; BPE dropout makes encoding random (expected null)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      std::optional<std::string> v = json_string(model, key, where_ + ": model");
      TESSERA_CHECK(!v || v->empty(), where_, ": model.", key, " = \"", *v,
                    "\" is not supported; byte-level BPE has none (expected null)");
    }
    // byte_fallback and unk_token only act on characters outside the vocabulary; with all 256 byte
    // tokens required below there are none, so both are accepted and never used.
    if (model.contains("ignore_merges") && !model.at("ignore_merges").is_null()) {
      const Json& v = model.at("ignore_merges");
      TESSERA_CHECK(v.is_boolean(), where_, ": model.ignore_merges must be a boolean, got ", json_kind(v));
      tok_.ignore_merges_ = v.get<bool>();
    }
    read_vocab(object_at(model, "vocab", where_ + ": model"));
    TESSERA_CHECK(model.contains("merges") && model.at("merges").is_array(), where_,
                  ": model.merges must be an array of merges (\"a b\" or [\"a\", \"b\"])");
    read_merges(model.at("merges"));
  }

  void read_vocab(const Json& vocab) {
    TESSERA_CHECK(!vocab.empty(), where_, ": model.vocab is empty");
    for (const auto& [token, value] : vocab.items()) {
      TESSERA_CHECK(value.is_number_integer(), where_, ": model.vocab[", Json(token).dump(), "] must be an integer id, got ",
                    json_kind(value));
      const int64_t id = value.get<int64_t>();
      TESSERA_CHECK(id >= 0 && id < kMaxVocab, where_, ": model.vocab[", Json(token).dump(), "] = ", id,
                    " is outside [0, ", kMaxVocab, ")");
      std::string bytes;
      if (!byte_level_to_bytes(token, &bytes)) bytes = token;  // as the ByteLevel decoder does
      define(static_cast<int32_t>(id), bytes, "model.vocab[" + Json(token).dump() + "]");
      tok_.vocab_ids_.emplace(std::move(bytes), static_cast<int32_t>(id));
    }
    for (int b = 0; b < 256; ++b) {
      auto it = tok_.vocab_ids_.find(std::string(1, static_cast<char>(b)));
      TESSERA_CHECK(it != tok_.vocab_ids_.end(), where_, ": model.vocab has no token for byte 0x", std::hex, b,
                    "; a byte-level BPE vocabulary has all 256 (is this a byte-level tokenizer?)");
      tok_.byte_ids_[b] = it->second;
    }
  }

  // The id of a merge's part or result, or an Error naming the merge.
  int32_t vocab_id(const std::string& token, size_t index, const Json& merge) {
    std::string bytes;
    auto it = byte_level_to_bytes(token, &bytes) ? tok_.vocab_ids_.find(bytes) : tok_.vocab_ids_.end();
    TESSERA_CHECK(it != tok_.vocab_ids_.end(), where_, ": model.merges[", index, "] = ", merge.dump(), ": \"", token,
                  "\" is not a token of model.vocab");
    return it->second;
  }

  void read_merges(const Json& merges) {
    for (size_t i = 0; i < merges.size(); ++i) {
      const Json& m = merges[i];
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        TESSERA_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, where_,
                      ": model.merges[", i, "] = ", m.dump(), ": expected two tokens separated by one space");
        left = s.substr(0, space), right = s.substr(space + 1);
      } else {
        TESSERA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), where_, ": model.merges[", i,
                      "] = ", m.dump(), ": expected \"a b\" or [\"a\", \"b\"]");
        left = m[0].get<std::string>(), right = m[1].get<std::string>();
      }
      const int32_t l = vocab_id(left, i, m), r = vocab_id(right, i, m), merged = vocab_id(left + right, i, m);
      TESSERA_CHECK(tok_.merges_.add(l, r, merged), where_, ": model.merges[", i, "] = ", m.dump(), " appears twice");
    }
  }

  void read_normalizer(const Json& normalizer) {
    if (normalizer.is_null()) return;
    TESSERA_CHECK(normalizer.is_object(), where_, ": normalizer must be null or an object, got ", json_kind(normalizer));
    detail::fail(where_, ": normalizer.type = \"", type_of(normalizer, "normalizer", where_),
                 "\" is not supported; tessera reads byte-level BPE with no normalizer (null)");
  }

  void read_pre_tokenizer(const Json& pre, const std::string& key) {
    TESSERA_CHECK(pre.is_object(), where_, ": ", key, " must be an object, got ", json_kind(pre));
    const std::string type = type_of(pre, key, where_);
    if (type == "ByteLevel") {
      read_byte_level(pre, key, /*regex_allowed=*/true);
      return;
    }
    if (type == "Sequence") {
      const Json* list = pre.contains("pretokenizers") ? &pre.at("pretokenizers") : nullptr;
      TESSERA_CHECK(list && list->is_array() && list->size() == 2 && (*list)[0].is_object() && (*list)[1].is_object(),
                    where_, ": ", key, ".pretokenizers: expected [Split, ByteLevel] (LLaMA-3's form)");
      read_split((*list)[0], key + ".pretokenizers[0]");
      TESSERA_CHECK(type_of((*list)[1], key + ".pretokenizers[1]", where_) == "ByteLevel", where_, ": ", key,
                    ".pretokenizers[1].type = \"", type_of((*list)[1], key, where_), "\"; expected \"ByteLevel\"");
      read_byte_level((*list)[1], key + ".pretokenizers[1]", /*regex_allowed=*/false);
      return;
    }
    const char* what = type == "Metaspace" ? " (SentencePiece-style)" : "";
    detail::fail(where_, ": ", key, ".type = \"", type, "\"", what,
                 " is not supported; tessera reads ByteLevel, or Sequence[Split(LLaMA-3 regex), ByteLevel]");
  }

  void read_byte_level(const Json& pre, const std::string& key, bool regex_allowed) {
    require_flag(pre, "add_prefix_space", false, where_ + ": " + key,
                 "tessera does not prepend a space to the text (expected false)");
    bool use_regex = true;
    if (pre.contains("use_regex") && pre.at("use_regex").is_boolean()) use_regex = pre.at("use_regex").get<bool>();
    if (regex_allowed) {
      tok_.split_ = use_regex ? Split::kGpt2 : Split::kNone;
    } else {
      require_flag(pre, "use_regex", false, where_ + ": " + key,
                   "after a Split the ByteLevel pre-tokenizer must not split again (expected false)");
    }
  }

  void read_split(const Json& split, const std::string& key) {
    const std::string type = type_of(split, key, where_);
    TESSERA_CHECK(type == "Split", where_, ": ", key, ".type = \"", type, "\"; expected \"Split\"");
    const Json* pattern = split.contains("pattern") ? &split.at("pattern") : nullptr;
    TESSERA_CHECK(pattern && pattern->is_object() && pattern->contains("Regex") && pattern->at("Regex").is_string(),
                  where_, ": ", key, ".pattern: expected {\"Regex\": \"...\"}");
    const std::string regex = pattern->at("Regex").get<std::string>();
    if (regex == kLlama3SplitPattern) {
      tok_.split_ = Split::kLlama3;
    } else if (regex == kGpt2SplitPattern) {
      tok_.split_ = Split::kGpt2;
    } else {
      detail::fail(where_, ": ", key, ".pattern.Regex = ", Json(regex).dump(),
                   " is not a pattern tessera implements; it splits with LLaMA-3's ", Json(kLlama3SplitPattern).dump(),
                   " or GPT-2's ", Json(kGpt2SplitPattern).dump());
    }
    std::optional<std::string> behavior = json_string(split, "behavior", where_ + ": " + key);
    TESSERA_CHECK(behavior == "Isolated", where_, ": ", key, ".behavior = ", behavior ? Json(*behavior).dump() : "none",
                  " is not supported; expected \"Isolated\"");
    require_flag(split, "invert", false, where_ + ": " + key, "expected false");
  }

  void read_decoder(const Json& decoder) {
    TESSERA_CHECK(decoder.is_object(), where_, ": decoder must be the ByteLevel decoder, got ", json_kind(decoder));
    const std::string type = type_of(decoder, "decoder", where_);
    TESSERA_CHECK(type == "ByteLevel", where_, ": decoder.type = \"", type,
                  "\" is not supported; a byte-level BPE decodes with \"ByteLevel\"");
  }

  void read_added_tokens(const Json& list) {
    TESSERA_CHECK(list.is_array(), where_, ": added_tokens must be an array, got ", json_kind(list));
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& t = list[i];
      const std::string key = "added_tokens[" + std::to_string(i) + "]";
      TESSERA_CHECK(t.is_object(), where_, ": ", key, " must be an object, got ", json_kind(t));
      std::optional<std::string> content = json_string(t, "content", where_ + ": " + key);
      std::optional<int64_t> id = json_int(t, "id", where_ + ": " + key);
      TESSERA_CHECK(content && !content->empty() && id, where_, ": ", key, " needs a non-empty \"content\" and an \"id\"");
      TESSERA_CHECK(*id >= 0 && *id < kMaxVocab, where_, ": ", key, ".id = ", *id, " is outside [0, ", kMaxVocab, ")");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        require_flag(t, flag, false, where_ + ": " + key + " (" + Json(*content).dump() + ")",
                     "tessera matches added tokens exactly as written (expected false)");
      const bool special = t.contains("special") && t.at("special").is_boolean() && t.at("special").get<bool>();
      const int32_t id32 = static_cast<int32_t>(*id);
      if (static_cast<size_t>(id32) < tok_.has_token_.size() && tok_.has_token_[id32]) {
        TESSERA_CHECK(tok_.token_bytes_[id32] == *content, where_, ": ", key, " gives id ", id32, " to ",
                      Json(*content).dump(), ", which model.vocab gives to another token");
      } else {
        define(id32, *content, key);
      }
      tok_.added_.push_back({*content, id32, special});
    }
    std::stable_sort(tok_.added_.begin(), tok_.added_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (uint32_t i = 0; i < tok_.added_.size(); ++i)
      tok_.added_by_first_byte_[static_cast<unsigned char>(tok_.added_[i].content[0])].push_back(i);
  }

  void define(int32_t id, const std::string& bytes, const std::string& key) {
    if (static_cast<size_t>(id) >= tok_.has_token_.size()) {
      tok_.has_token_.resize(id + 1, 0);
      tok_.token_bytes_.resize(id + 1);
    }
    TESSERA_CHECK(!tok_.has_token_[id], where_, ": ", key, " has id ", id, ", which another token has");
    tok_.has_token_[id] = 1;
    tok_.token_bytes_[id] = bytes;
  }

  void finish() {
    tok_.vocab_size_ = static_cast<int64_t>(tok_.has_token_.size());
    for (std::string_view name : kEotNames) {
      for (const AddedToken& t : tok_.added_)
        if (t.content == name && tok_.eot_id_ < 0) tok_.eot_id_ = t.id;
      if (tok_.eot_id_ >= 0) return;
    }
    detail::fail(where_, ": no end-of-document token among added_tokens; expected one of \"<|endoftext|>\", ",
                 "\"<|end_of_text|>\", \"</s>\"");
  }

  HfBpeTokenizer& tok_;
  const std::string where_;
};

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) : path_(path) {
  TESSERA_CHECK(std::filesystem::is_regular_file(path), "tokenizer.json: ", path,
                " not found; expected the tokenizer.json of a Hugging Face tokenizer (byte-level BPE)");
  Loader(*this, path).load(read_json_file(path));
}

std::string_view HfBpeTokenizer::token_bytes(int32_t id) const {
  TESSERA_CHECK(id >= 0 && id < vocab_size_ && has_token_[id], path_, ": id ", id, " is not in the vocabulary [0, ",
                vocab_size_, ")");
  return token_bytes_[id];
}

std::string HfBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::optional<int32_t> HfBpeTokenizer::special_token_id(std::string_view text) const {
  for (const AddedToken& t : added_)
    if (t.special && t.content == text) return t.id;
  return std::nullopt;
}

const HfBpeTokenizer::AddedToken* HfBpeTokenizer::added_token_at(std::string_view text, size_t pos,
                                                                 bool allow_special) const {
  for (uint32_t i : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {  // longest first
    const AddedToken& t = added_[i];
    if ((allow_special || !t.special) && text.compare(pos, t.content.size(), t.content) == 0) return &t;
  }
  return nullptr;
}

// Added tokens are cut out first: at each position the longest one starting there, so the
// leftmost match wins, then the longest (the library's leftmost-longest Aho-Corasick search).
std::vector<int32_t> HfBpeTokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  PieceCache cache;
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* t = added_token_at(text, pos, allow_special);
    if (!t) {
      ++pos;
      continue;
    }
    encode_ordinary(text.substr(start, pos - start), cache, &ids);
    ids.push_back(t->id);
    pos += t->content.size();
    start = pos;
  }
  encode_ordinary(text.substr(start), cache, &ids);
  return ids;
}

void HfBpeTokenizer::encode_ordinary(std::string_view text, PieceCache& cache, std::vector<int32_t>* out) const {
  for (size_t p = 0; p < text.size();) {
    size_t q = split_ == Split::kGpt2    ? gpt2_piece_end(text, p)
               : split_ == Split::kLlama3 ? llama3_piece_end(text, p)
                                          : text.size();
    const std::string_view piece = text.substr(p, q - p);
    auto [it, fresh] = cache.try_emplace(piece);
    if (fresh) encode_piece(piece, &it->second);
    out->insert(out->end(), it->second.begin(), it->second.end());
    p = q;
  }
}

// ignore_merges: a piece that is a token is that token, whatever the merges would make of it.
void HfBpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    if (auto it = vocab_ids_.find(std::string(piece)); it != vocab_ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (unsigned char c : piece) symbols.push_back(byte_ids_[c]);
  bpe_merge(merges_, &symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
}

}  // namespace tessera
