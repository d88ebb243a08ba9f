// Hugging Face export: config from the checkpoint's TOML, the tensors through the name tables of
// app/checkpoint/hf_model.h into safetensors, and the tokenizer as GPT-2-style byte-level BPE files.
// The checkpoint is checked against the config (and its tokenizer found) first, so a mismatch is
// one message listing every difference rather than a failure halfway through.
#include "app/checkpoint/hf_export.h"

#include <toml++/toml.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "app/checkpoint/atomic_file.h"
#include "app/checkpoint/hf_model.h"
#include "app/checkpoint/safetensors.h"
#include "app/config.h"
#include "app/lora.h"
#include "data/addition.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "kernels/allocator.h"
#include "kernels/check.h"
#include "model/gpt.h"
#include "model/parameters.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

// Reads section.key into out when present; a value of the wrong type is an error naming it.
template <typename T>
void read_key(const toml::table& section, const std::string& key, T& out, const std::string& where) {
  const toml::node* n = section.get(key);
  if (n == nullptr) return;
  std::optional<T> v = n->value<T>();
  TESSERA_CHECK(v.has_value(), "model.", key, " in the config stored in ", where, " must be ",
                std::is_same_v<T, std::string> ? "a string" : std::is_same_v<T, double> ? "a number" : "an integer");
  out = *v;
}

toml::table parse_stored_config(const CheckpointReader& reader) {
  try {
    return toml::parse(reader.meta().config_toml, reader.path() + ":/meta/config");
  } catch (const toml::parse_error& e) {
    detail::fail("the config stored in ", reader.path(), " is not valid TOML: ", std::string(e.description()));
  }
}

// The [lora] section of a stored config (absent: no adapters); a key of the wrong type names it.
LoraConfig stored_lora(const toml::table& config, const std::string& where) {
  LoraConfig l;
  const toml::table* t = config["lora"].as_table();
  if (t == nullptr) return l;
  auto bad = [&](const char* key, const char* what) {
    return Error("lora." + std::string(key) + " in the config stored in " + where + " must be " + what);
  };
  if (const toml::node* n = t->get("rank")) {
    if (!n->value<int64_t>()) throw bad("rank", "an integer");
    l.rank = *n->value<int64_t>();
  }
  if (const toml::node* n = t->get("alpha")) {
    if (!n->value<double>()) throw bad("alpha", "a number");
    l.alpha = *n->value<double>();
  }
  if (const toml::node* n = t->get("dropout")) {
    if (!n->value<double>()) throw bad("dropout", "a number");
    l.dropout = *n->value<double>();
  }
  if (const toml::node* n = t->get("targets")) {
    const toml::array* a = n->as_array();
    if (a == nullptr) throw bad("targets", "an array of strings");
    l.targets.clear();
    for (const toml::node& e : *a) {
      if (!e.value<std::string>()) throw bad("targets", "an array of strings");
      l.targets.push_back(*e.value<std::string>());
    }
  }
  return l;
}

int64_t rows_of(const CheckpointReader& reader, const std::string& path, const std::string& field) {
  TESSERA_CHECK(reader.has(path), reader.path(), ": model.", field, " = 0 in the stored config and there is no ", path,
                " to take it from");
  return reader.shape(path)[0];
}

}  // namespace

ModelConfig model_config_of(const CheckpointReader& reader) {
  const toml::table config = parse_stored_config(reader);
  const toml::table* model = config["model"].as_table();
  TESSERA_CHECK(model != nullptr, "the config stored in ", reader.path(), " has no [model] section");
  ModelSection s;  // the trainer's defaults for absent keys
  const std::string& where = reader.path();
  read_key(*model, "preset", s.preset, where);
  read_key(*model, "vocab_size", s.vocab_size, where);
  read_key(*model, "n_layer", s.n_layer, where);
  read_key(*model, "n_head", s.n_head, where);
  read_key(*model, "n_kv_head", s.n_kv_head, where);
  read_key(*model, "n_embd", s.n_embd, where);
  read_key(*model, "ffn_hidden", s.ffn_hidden, where);
  read_key(*model, "max_seq_len", s.max_seq_len, where);
  read_key(*model, "norm_eps", s.norm_eps, where);
  read_key(*model, "rope_theta", s.rope_theta, where);
  read_key(*model, "lm_head", s.lm_head, where);

  ModelConfig m = s;  // the architecture fields; vocab_size and max_seq_len 0 mean "as trained":
  m.lora = stored_lora(config, where);  // a LoRA run's adapters are model tensors too
  m.vocab_size = s.vocab_size > 0 ? s.vocab_size : rows_of(reader, "/model/wte.weight", "vocab_size");
  if (s.max_seq_len > 0) {
    m.max_seq_len = s.max_seq_len;
  } else if (m.preset == "gpt2") {
    m.max_seq_len = rows_of(reader, "/model/wpe.weight", "max_seq_len");
  } else {  // rotary positions: the trainer's rule, max_seq_len = train.seq_len
    m.max_seq_len = TrainConfig{}.seq_len;
    if (const toml::table* train = config["train"].as_table())
      if (auto v = (*train)["seq_len"].value<int64_t>()) m.max_seq_len = *v;
  }
  return resolve(m);
}

void require_text_model(const CheckpointReader& reader, const std::string& what) {
  const toml::table config = parse_stored_config(reader);
  std::string kind = "gpt";
  if (const toml::table* model = config["model"].as_table()) read_key(*model, "kind", kind, reader.path());
  TESSERA_CHECK(kind != "vlm", reader.path(), " holds a vision-language model (model.kind = \"vlm\" in its stored "
                "config): ", what, " takes text-only GPT checkpoints for now (docs/multimodal.md, \"Not yet\")");
}

std::vector<std::pair<std::string, Shape>> model_tensor_shapes(const ModelConfig& cfg) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt model(cfg, ps);  // registers the parameters; nothing is allocated before finalize()
  std::vector<std::pair<std::string, Shape>> out;
  for (const ParamEntry& e : ps.entries()) out.emplace_back("/model/" + e.spec.name, e.spec.global_shape);
  return out;
}

// ---- the tokenizer ----

namespace {

// The [data] keys that say which tokenizer made the training data; absent keys keep the trainer's
// defaults (task "addition", tokenizer "gpt2").
struct StoredData {
  std::string task = DataConfig{}.task, tokenizer = DataConfig{}.tokenizer, vocab_dir;
};

StoredData stored_data(const CheckpointReader& reader) {
  StoredData d;
  const toml::table config = parse_stored_config(reader);
  if (const toml::table* data = config["data"].as_table()) {
    if (auto v = (*data)["task"].value<std::string>()) d.task = *v;
    if (auto v = (*data)["tokenizer"].value<std::string>()) d.tokenizer = *v;
    if (auto v = (*data)["vocab_dir"].value<std::string>()) d.vocab_dir = *v;
  }
  return d;
}

// A token's characters as a JSON string, ASCII only (as OpenAI's encoder.json): other code points
// (GPT-2's byte characters are below U+0200) as \uXXXX.
std::string json_token(const std::u32string& token) {
  std::string out = "\"";
  for (const char32_t c : token) {
    if (c == U'"' || c == U'\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      TESSERA_CHECK(c < 0x10000, "internal: token code point ", static_cast<uint32_t>(c), " needs a surrogate pair");
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  return out + "\"";
}

// A tokenizer whose tokens are single bytes: bytes[i] is id i, written as GPT-2's byte character;
// no merges. `extra` follows at the next id (the byte tokenizer's <|endoftext|>).
HfTokenizer single_byte_tokenizer(const std::string& name, const std::string& bytes, const std::string& extra,
                                  int32_t eos_id) {
  const std::array<char32_t, 256> chars = gpt2_byte_to_unicode();
  HfTokenizer t;
  t.name = name;
  std::vector<std::u32string> tokens;
  for (const char b : bytes) tokens.push_back(std::u32string(1, chars[static_cast<unsigned char>(b)]));
  if (!extra.empty()) tokens.push_back(std::u32string(extra.begin(), extra.end()));
  t.vocab_size = static_cast<int64_t>(tokens.size());
  t.vocab_json = "{";
  for (size_t i = 0; i < tokens.size(); ++i) t.vocab_json += (i ? ", " : "") + json_token(tokens[i]) + ": " + std::to_string(i);
  t.vocab_json += "}";
  t.merges_txt = "#version: 0.2\n";  // Hugging Face skips the first line of merges.txt
  t.eos_id = eos_id;
  const std::u32string& eos = tokens.at(static_cast<size_t>(eos_id));
  for (const char32_t c : eos) {  // as UTF-8 (all below U+0800): the special-token strings are JSON-encoded later
    if (c < 0x80) {
      t.eos_token += static_cast<char>(c);
    } else {
      t.eos_token += static_cast<char>(0xC0 | (c >> 6));
      t.eos_token += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return t;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good(), "cannot read ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

HfTokenizer gpt2_tokenizer(const std::string& dir_arg, const std::string& stored_dir) {
  // --vocab, else the directory the run used when it is still there, else the default one.
  std::string dir = dir_arg;
  if (dir.empty() && !stored_dir.empty() && fs::is_directory(stored_dir)) dir = stored_dir;
  const std::unique_ptr<Tokenizer> tok = make_tokenizer("gpt2", dir);  // checks the files
  if (dir.empty()) dir = default_gpt2_vocab_dir();
  HfTokenizer t;
  t.name = "gpt2";
  t.vocab_size = tok->vocab_size();
  t.eos_id = tok->eot_id();
  t.eos_token = "<|endoftext|>";
  t.vocab_json = read_bytes(fs::path(dir) / "encoder.json");  // the same format as vocab.json
  t.merges_txt = read_bytes(fs::path(dir) / "vocab.bpe");
  // The "#version" line is optional in vocab.bpe, but Hugging Face drops merges.txt's first line.
  if (!t.merges_txt.starts_with("#version")) t.merges_txt = "#version: 0.2\n" + t.merges_txt;
  return t;
}

// A tokenizer.json, checked by reading it as tessera does.
HfTokenizer tokenizer_json_file(const std::string& path) {
  const HfBpeTokenizer tok(path);
  HfTokenizer t;
  t.name = path;
  t.vocab_size = tok.vocab_size();
  t.eos_id = tok.eot_id();
  t.eos_token = std::string(tok.token_bytes(tok.eot_id()));
  t.tokenizer_json = read_bytes(path);
  return t;
}

}  // namespace

HfTokenizer hf_tokenizer_named(const std::string& name, const std::string& vocab_dir, const std::string& stored_dir) {
  if (name == "addition") {
    const std::string alphabet = CharTokenizer::kAlphabet;
    return single_byte_tokenizer("addition characters", alphabet, "", static_cast<int32_t>(alphabet.find('\n')));
  }
  if (name == "byte") {
    std::string bytes(256, '\0');
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = static_cast<char>(b);
    return single_byte_tokenizer("byte", bytes, "<|endoftext|>", ByteTokenizer().eot_id());
  }
  if (is_tokenizer_json_path(name)) return tokenizer_json_file(name);
  TESSERA_CHECK(name == "gpt2", "no tokenizer \"", name, "\"; expected addition, byte, gpt2 or a tokenizer.json path");
  return gpt2_tokenizer(vocab_dir, stored_dir);
}

HfTokenizer hf_tokenizer_of(const CheckpointReader& reader, const std::string& vocab_dir) {
  const StoredData d = stored_data(reader);
  if (d.task == "addition") return hf_tokenizer_named("addition", vocab_dir);
  TESSERA_CHECK(d.task == "tokens", "the config stored in ", reader.path(), " has data.task = \"", d.task,
                "\"; expected \"addition\" or \"tokens\"");
  TESSERA_CHECK(d.tokenizer == "byte" || d.tokenizer == "gpt2" || is_tokenizer_json_path(d.tokenizer), "the config stored in ",
                reader.path(), " has data.tokenizer = \"", d.tokenizer, "\"; expected \"gpt2\", \"byte\" or a tokenizer.json path");
  return hf_tokenizer_named(d.tokenizer, vocab_dir, d.vocab_dir);
}

std::string hf_tokenizer_config_json(const HfTokenizer& tok, int64_t max_seq_len) {
  // No prefix space and no clean-up of spaces before punctuation: decode(encode(s)) == s, as in tessera.
  nlohmann::ordered_json j;
  j["tokenizer_class"] = tok.tokenizer_json.empty() ? "GPT2Tokenizer" : "PreTrainedTokenizerFast";
  j["model_max_length"] = max_seq_len;
  j["bos_token"] = j["eos_token"] = j["unk_token"] = tok.eos_token;
  j["add_prefix_space"] = false;
  j["add_bos_token"] = false;
  j["clean_up_tokenization_spaces"] = false;
  j["errors"] = "replace";
  return j.dump(2) + "\n";
}

std::string hf_special_tokens_map_json(const HfTokenizer& tok) {
  nlohmann::ordered_json j;
  j["bos_token"] = j["eos_token"] = j["unk_token"] = tok.eos_token;
  return j.dump(2) + "\n";
}

// ---- export ----

namespace {

// (R, C) row-major -> (C, R).
std::vector<float> transpose(const std::vector<float>& m, int64_t R, int64_t C) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) t[static_cast<size_t>(c * R + r)] = m[static_cast<size_t>(r * C + c)];
  return t;
}

// merge_scale > 0: a weight with a LoRA adapter is read merged, W + scale B A (lora_merged_weight).
SafetensorsEntry entry_for(const CheckpointReader& reader, const HfTensor& t, double merge_scale) {
  Shape shape = reader.shape(t.sources.front());
  for (size_t i = 1; i < t.sources.size(); ++i) shape[0] += reader.shape(t.sources[i])[0];
  TESSERA_CHECK(!t.transpose || shape.ndim() == 2, "cannot transpose ", t.sources.front(), " ", shape.str());
  const Shape stored = shape;
  if (t.transpose) shape = Shape{stored[1], stored[0]};
  auto data = [&reader, t, stored, merge_scale] {
    std::vector<float> all;
    for (const std::string& s : t.sources) {
      std::vector<float> part = merge_scale > 0 ? lora_merged_weight(reader, s, merge_scale) : reader.read_all(s);
      all.insert(all.end(), part.begin(), part.end());
    }
    return t.transpose ? transpose(all, stored[0], stored[1]) : all;
  };
  return {t.name, shape, data};
}

}  // namespace

namespace {
void write_text_file(const std::string& dir, const std::string& name, const std::string& text) {
  AtomicFile f((fs::path(dir) / name).string());
  f.write(text);
  f.commit();
}
}  // namespace

HfExportSummary export_hf_safetensors(const CheckpointReader& reader, const std::string& out_dir,
                                      const std::string& vocab_dir, bool merge_lora) {
  require_text_model(reader, "tessera ckpt export");
  const ModelConfig cfg = model_config_of(reader);
  check_shapes(reader, model_tensor_shapes(cfg));
  TESSERA_CHECK(!cfg.lora.enabled() || merge_lora, reader.path(), " holds LoRA adapters ([lora] rank = ", cfg.lora.rank,
                "): pass --merge-lora to export the merged weights W + (alpha / r) B A as a plain model");
  TESSERA_CHECK(cfg.lora.enabled() || !merge_lora, "--merge-lora: ", reader.path(), " holds no LoRA adapters (its "
                "stored config has no [lora] rank > 0)");
  const double merge_scale = merge_lora ? cfg.lora.scale() : 0.0;
  const HfTokenizer tok = hf_tokenizer_of(reader, vocab_dir);  // before anything is written
  TESSERA_CHECK(tok.vocab_size <= cfg.vocab_size, reader.path(), ": the model's vocabulary (", cfg.vocab_size,
                ") is smaller than its tokenizer's (", tok.name, ", ", tok.vocab_size, ")");
  std::vector<SafetensorsEntry> entries;
  HfExportSummary summary;
  summary.architecture = cfg.preset == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM";
  for (const HfTensor& t : hf_tensor_map(cfg)) {
    entries.push_back(entry_for(reader, t, merge_scale));
    summary.parameters += entries.back().shape.numel();
  }
  summary.tensors = static_cast<int64_t>(entries.size());
  summary.tokenizer = tok.name;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TESSERA_CHECK(!ec, "cannot create the directory ", out_dir, ": ", ec.message());
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), entries, {{"format", "pt"}});
  write_text_file(out_dir, "config.json", hf_config_json(cfg, tok.eos_id));
  write_text_file(out_dir, "generation_config.json",
                  nlohmann::ordered_json{{"bos_token_id", tok.eos_id}, {"eos_token_id", tok.eos_id}}.dump(2) + "\n");
  if (!tok.tokenizer_json.empty()) {
    write_text_file(out_dir, "tokenizer.json", tok.tokenizer_json);
  } else {
    write_text_file(out_dir, "vocab.json", tok.vocab_json);
    write_text_file(out_dir, "merges.txt", tok.merges_txt);
  }
  write_text_file(out_dir, "tokenizer_config.json", hf_tokenizer_config_json(tok, cfg.max_seq_len));
  write_text_file(out_dir, "special_tokens_map.json", hf_special_tokens_map_json(tok));
  return summary;
}

}  // namespace tessera
