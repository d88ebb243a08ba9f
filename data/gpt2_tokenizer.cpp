// Gpt2Tokenizer: file loading (encoder.json, vocab.bpe), encode (pre-tokenize, cached BPE per
// piece, chunks on OpenMP threads) and decode (concatenated token bytes).
#include "data/gpt2_tokenizer.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/gpt2_pretokenizer.h"
#include "data/json.h"
#include "data/unicode_class.h"
#include "kernels/check.h"

namespace tessera {

std::array<char32_t, 256> gpt2_byte_to_unicode() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

namespace {

constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr std::string_view kEndOfText = "<|endoftext|>";

// Code point -> byte, the inverse of gpt2_byte_to_unicode() (-1: not a byte's code point).
struct UnicodeToByte {
  std::array<int16_t, 256 + 68> byte;
  UnicodeToByte() {
    byte.fill(-1);
    std::array<char32_t, 256> fwd = gpt2_byte_to_unicode();
    for (int b = 0; b < 256; ++b) byte[fwd[b]] = static_cast<int16_t>(b);
  }
};

// The bytes a token of encoder.json / vocab.bpe stands for. Throws naming `where` when a character
// is not one of the 256 byte code points.
std::string token_to_bytes(std::string_view token, const std::string& where) {
  std::string out;
  TESSERA_CHECK(byte_level_to_bytes(token, &out), where, ": token \"", token,
                "\" has a character outside GPT-2's byte alphabet; is this a GPT-2 vocabulary?");
  return out;
}

std::string read_file(const std::string& path, const char* what) {
  TESSERA_CHECK(std::filesystem::is_regular_file(path), "gpt2 tokenizer: ", path, " not found; the vocabulary ",
                "directory must hold GPT-2's encoder.json (token -> id) and vocab.bpe (merges); this is ", what);
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "gpt2 tokenizer: cannot read ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

bool byte_level_to_bytes(std::string_view token, std::string* bytes) {
  static const UnicodeToByte inv;  // immutable after its thread-safe initialisation
  const size_t old_size = bytes->size();
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  const auto* end = p + token.size();
  while (p < end) {
    Utf8Char ch = decode_utf8(p, end);
    if (!ch.valid || ch.code_point >= inv.byte.size() || inv.byte[ch.code_point] < 0) {
      bytes->resize(old_size);
      return false;
    }
    bytes->push_back(static_cast<char>(inv.byte[ch.code_point]));
    p += ch.length;
  }
  return true;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) {
  TESSERA_CHECK(std::filesystem::is_directory(dir), "gpt2 tokenizer: vocabulary directory '", dir,
                "' does not exist; it must hold GPT-2's encoder.json and vocab.bpe");
  const std::filesystem::path d(dir);
  IdsByBytes ids = load_vocab((d / "encoder.json").string());
  load_merges((d / "vocab.bpe").string(), ids);
  index_whole_tokens();
}

Gpt2Tokenizer::IdsByBytes Gpt2Tokenizer::load_vocab(const std::string& path) {
  const std::string text = read_file(path, "the token -> id map");
  const Json map = parse_json(text, path);  // a repeated token is refused here
  TESSERA_CHECK(map.is_object(), path, ": expected a JSON object of token -> id ('{'), got ", json_kind(map));
  TESSERA_CHECK(!map.empty(), path, ": the token map is empty");
  IdsByBytes ids;
  for (const auto& [token, value] : map.items()) {
    TESSERA_CHECK(value.is_number_integer(), path, ": token ", Json(token).dump(), " has ", json_kind(value),
                  " for its id; expected an integer");
    const int64_t id = *json_int(map, token, path);  // within int64
    TESSERA_CHECK(id >= 0 && id < kMaxVocab, path, ": token \"", token, "\" has id ", id, ", outside [0, ",
                  kMaxVocab, ")");
    bool fresh = ids.emplace(token_to_bytes(token, path), static_cast<int32_t>(id)).second;
    TESSERA_CHECK(fresh, path, ": token \"", token, "\" appears twice");
    vocab_size_ = std::max(vocab_size_, id + 1);
  }
  token_at_.assign(vocab_size_, {0, 0});
  has_token_.assign(vocab_size_, 0);
  for (const auto& [bytes, id] : ids) {
    TESSERA_CHECK(!has_token_[id], path, ": id ", id, " is given to two tokens");
    has_token_[id] = 1;
    token_at_[id] = {static_cast<uint32_t>(token_pool_.size()), static_cast<uint32_t>(bytes.size())};
    token_pool_ += bytes;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(std::string(1, static_cast<char>(b)));
    TESSERA_CHECK(it != ids.end(), path, ": no token for byte 0x", std::hex, b, "; a GPT-2 vocabulary has all 256");
    byte_ids_[b] = it->second;
  }
  auto eot = ids.find(std::string(kEndOfText));
  TESSERA_CHECK(eot != ids.end(), path, ": no \"<|endoftext|>\" token");
  eot_id_ = eot->second;
  return ids;
}

void Gpt2Tokenizer::load_merges(const std::string& path, const IdsByBytes& ids) {
  const std::string text = read_file(path, "the merges list");
  std::istringstream lines(text);
  std::string line;
  for (int64_t line_no = 1; std::getline(lines, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    size_t space = line.find(' ');
    bool two = space != std::string::npos && space > 0 && space + 1 < line.size() &&
               line.find(' ', space + 1) == std::string::npos;
    TESSERA_CHECK(two, where, ": expected two tokens separated by one space, got \"", line, "\"");
    const std::string left = token_to_bytes(std::string_view(line).substr(0, space), where);
    const std::string right = token_to_bytes(std::string_view(line).substr(space + 1), where);
    auto l = ids.find(left), r = ids.find(right), m = ids.find(left + right);
    TESSERA_CHECK(l != ids.end() && r != ids.end(), where, ": a token of \"", line, "\" is not in encoder.json");
    TESSERA_CHECK(m != ids.end(), where, ": the merge of \"", line, "\" is not a token of encoder.json");
    TESSERA_CHECK(merges_.add(l->second, r->second, m->second), where, ": merge \"", line, "\" appears twice");
  }
  TESSERA_CHECK(merges_.size() > 0, path, ": no merges; expected lines like \"Ġ t\"");
}

// A piece equal to such a token needs no merging: its ids are [id]. Checked per token by running
// BPE on it, so the shortcut is exact for any vocabulary (in GPT-2's, nearly every token qualifies).
void Gpt2Tokenizer::index_whole_tokens() {
  std::vector<int32_t> symbols;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!has_token_[id] || id == eot_id_) continue;
    std::string_view bytes = token_bytes(id);
    symbols.clear();
    for (unsigned char c : bytes) symbols.push_back(byte_ids_[c]);
    bpe_merge(merges_, &symbols);
    if (symbols.size() == 1 && symbols[0] == id) whole_tokens_.emplace(bytes, id);
  }
}

std::string_view Gpt2Tokenizer::token_bytes(int32_t id) const {
  TESSERA_CHECK(id >= 0 && id < vocab_size_ && has_token_[id], "gpt2 tokenizer: id ", id,
                " is not in the vocabulary [0, ", vocab_size_, ")");
  return std::string_view(token_pool_).substr(token_at_[id].first, token_at_[id].second);
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

// Encodes pieces of one text on one thread. A piece that is a whole token is looked up; the ids of
// other pieces are cached for the rest of the call (no mutable state is shared between threads or
// calls).
class Gpt2Tokenizer::ChunkEncoder {
 public:
  explicit ChunkEncoder(const Gpt2Tokenizer& tok) : tok_(tok) {}

  // Pieces starting in [begin, end) of text; end must be a piece start (or text.size()).
  void encode(std::string_view text, size_t begin, size_t end, std::vector<int32_t>* out) {
    for (size_t p = begin; p < end;) {
      size_t q = gpt2_piece_end(text, p);
      encode_piece(text.substr(p, q - p), out);
      p = q;
    }
  }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) {
    if (piece.size() == 1) {
      out->push_back(tok_.byte_ids_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (auto whole = tok_.whole_tokens_.find(piece); whole != tok_.whole_tokens_.end()) {
      out->push_back(whole->second);
      return;
    }
    auto [it, fresh] = cache_.try_emplace(piece, 0, 0);
    if (fresh) {
      symbols_.clear();
      for (unsigned char c : piece) symbols_.push_back(tok_.byte_ids_[c]);
      bpe_merge(tok_.merges_, &symbols_);
      it->second = {pool_.size(), symbols_.size()};
      pool_.insert(pool_.end(), symbols_.begin(), symbols_.end());
    }
    out->insert(out->end(), pool_.begin() + it->second.first,
                pool_.begin() + it->second.first + it->second.second);
  }

  const Gpt2Tokenizer& tok_;
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache_;  // piece -> (offset, count) in pool_
  std::vector<int32_t> pool_;
  std::vector<int32_t> symbols_;
};

namespace {

// Chunk boundaries [0, b1, ..., text.size()]: up to `chunks` pieces of similar size, cut only where
// gpt2_is_safe_split() holds (fewer chunks when no such place is found).
std::vector<size_t> chunk_bounds(std::string_view text, int chunks) {
  std::vector<size_t> bounds{0};
  for (int i = 1; i < chunks; ++i) {
    size_t target = std::max(bounds.back() + 1, text.size() * i / chunks);
    size_t limit = text.size() * (i + 1) / chunks;
    size_t p = target;
    while (p < limit && !gpt2_is_safe_split(text, p)) ++p;
    if (p < limit) bounds.push_back(p);
  }
  bounds.push_back(text.size());
  return bounds;
}

}  // namespace

// Several chunks per thread, taken dynamically: a thread that the OS holds back (a busy machine)
// delays the others by one chunk at most. Each thread's cache serves all the chunks it takes.
void Gpt2Tokenizer::encode_ordinary(std::string_view text, int threads, std::vector<int32_t>* out) const {
  threads = std::max(threads, 1);
  size_t chunks = std::min<size_t>(static_cast<size_t>(threads) * kChunksPerThread, text.size() / kMinChunkBytes);
  std::vector<size_t> bounds = chunk_bounds(text, static_cast<int>(std::max<size_t>(chunks, 1)));
  const int n = static_cast<int>(bounds.size()) - 1;
  if (n == 1 || threads == 1) {
    ChunkEncoder(*this).encode(text, 0, text.size(), out);
    return;
  }
  std::vector<std::vector<int32_t>> parts(n);
#pragma omp parallel num_threads(std::min(threads, n))
  {
    ChunkEncoder encoder(*this);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < n; ++i) encoder.encode(text, bounds[i], bounds[i + 1], &parts[i]);
  }
  for (const auto& part : parts) out->insert(out->end(), part.begin(), part.end());
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode(text, allow_special, omp_get_max_threads());
}

// With allow_special the text is first cut at each "<|endoftext|>" (as tiktoken does), and the parts
// between are encoded as ordinary text.
std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text, bool allow_special, int threads) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4);
  if (!allow_special) {
    encode_ordinary(text, threads, &ids);
    return ids;
  }
  size_t start = 0;
  for (size_t hit; (hit = text.find(kEndOfText, start)) != std::string_view::npos; start = hit + kEndOfText.size()) {
    encode_ordinary(text.substr(start, hit - start), threads, &ids);
    ids.push_back(eot_id_);
  }
  encode_ordinary(text.substr(start), threads, &ids);
  return ids;
}

}  // namespace tessera
