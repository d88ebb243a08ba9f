// Hugging Face export: config from the checkpoint's TOML, the per-preset name tables, a streaming
// safetensors writer, config.json, and the tokenizer as GPT-2-style byte-level BPE files. The
// checkpoint is checked against the config (and its tokenizer found) first, so a mismatch is one
// message listing every difference rather than a failure halfway through.
#include "app/checkpoint/hf_export.h"

#include <toml++/toml.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "app/checkpoint/atomic_file.h"
#include "app/config.h"
#include "data/addition.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenizer.h"
#include "kernels/allocator.h"
#include "kernels/check.h"
#include "model/gpt.h"
#include "model/parameters.h"

namespace tessera {

static_assert(std::endian::native == std::endian::little, "safetensors export writes host floats as little-endian");

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

  ModelConfig m = s;  // the architecture fields; vocab_size and max_seq_len 0 mean "as trained":
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

// ---- name tables ----

namespace {

std::string src(const std::string& name) { return "/model/" + name; }

void add_gpt2_block(std::vector<HfTensor>& t, int64_t l) {
  const std::string p = "blocks." + std::to_string(l) + ".", h = "transformer.h." + std::to_string(l) + ".";
  t.push_back({h + "ln_1.weight", {src(p + "ln1.weight")}});
  t.push_back({h + "ln_1.bias", {src(p + "ln1.bias")}});
  // Conv1D: y = x W + b with W (in, out), so tessera's Linear (out, in) weights are transposed.
  t.push_back({h + "attn.c_attn.weight", {src(p + "attn.q.weight"), src(p + "attn.k.weight"), src(p + "attn.v.weight")}, true});
  t.push_back({h + "attn.c_attn.bias", {src(p + "attn.q.bias"), src(p + "attn.k.bias"), src(p + "attn.v.bias")}});
  t.push_back({h + "attn.c_proj.weight", {src(p + "attn.proj.weight")}, true});
  t.push_back({h + "attn.c_proj.bias", {src(p + "attn.proj.bias")}});
  t.push_back({h + "ln_2.weight", {src(p + "ln2.weight")}});
  t.push_back({h + "ln_2.bias", {src(p + "ln2.bias")}});
  t.push_back({h + "mlp.c_fc.weight", {src(p + "mlp.fc.weight")}, true});
  t.push_back({h + "mlp.c_fc.bias", {src(p + "mlp.fc.bias")}});
  t.push_back({h + "mlp.c_proj.weight", {src(p + "mlp.proj.weight")}, true});
  t.push_back({h + "mlp.c_proj.bias", {src(p + "mlp.proj.bias")}});
}

// nn.Linear weights are (out, in) as in tessera; RoPE uses the same rotate-half convention, so
// q/k need no permutation.
void add_llama_block(std::vector<HfTensor>& t, int64_t l) {
  const std::string p = "blocks." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
  t.push_back({h + "input_layernorm.weight", {src(p + "ln1.weight")}});
  t.push_back({h + "self_attn.q_proj.weight", {src(p + "attn.q.weight")}});
  t.push_back({h + "self_attn.k_proj.weight", {src(p + "attn.k.weight")}});
  t.push_back({h + "self_attn.v_proj.weight", {src(p + "attn.v.weight")}});
  t.push_back({h + "self_attn.o_proj.weight", {src(p + "attn.proj.weight")}});
  t.push_back({h + "post_attention_layernorm.weight", {src(p + "ln2.weight")}});
  t.push_back({h + "mlp.gate_proj.weight", {src(p + "mlp.gate.weight")}});
  t.push_back({h + "mlp.up_proj.weight", {src(p + "mlp.up.weight")}});
  t.push_back({h + "mlp.down_proj.weight", {src(p + "mlp.down.weight")}});
}

}  // namespace

std::vector<HfTensor> hf_tensor_map(const ModelConfig& cfg) {
  std::vector<HfTensor> t;
  if (cfg.preset == "gpt2") {
    t.push_back({"transformer.wte.weight", {src("wte.weight")}});
    t.push_back({"transformer.wpe.weight", {src("wpe.weight")}});
    for (int64_t l = 0; l < cfg.n_layer; ++l) add_gpt2_block(t, l);
    t.push_back({"transformer.ln_f.weight", {src("ln_f.weight")}});
    t.push_back({"transformer.ln_f.bias", {src("ln_f.bias")}});
    // lm_head.weight is tied to transformer.wte.weight; HF re-ties it on load.
  } else if (cfg.preset == "llama") {
    t.push_back({"model.embed_tokens.weight", {src("wte.weight")}});
    for (int64_t l = 0; l < cfg.n_layer; ++l) add_llama_block(t, l);
    t.push_back({"model.norm.weight", {src("ln_f.weight")}});
    t.push_back({"lm_head.weight", {src("lm_head.weight")}});
  } else {
    detail::fail("no Hugging Face mapping for model.preset = \"", cfg.preset, "\"");
  }
  return t;
}

// ---- config.json ----

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Shortest round-trip form; whole numbers as "500000.0", the way HF configs write them.
std::string json_number(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return std::to_string(static_cast<int64_t>(v)) + ".0";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

// A JSON object from (key, already-encoded value) pairs, one per line.
std::string json_object(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = "{\n";
  for (size_t i = 0; i < fields.size(); ++i)
    out += "  " + json_string(fields[i].first) + ": " + fields[i].second + (i + 1 < fields.size() ? ",\n" : "\n");
  return out + "}\n";
}

std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

std::string hf_config_json(const ModelConfig& cfg, int32_t eos_id) {
  // Without these Hugging Face assumes bos 1 and eos 2 (LLaMA's SentencePiece ids), and generate()
  // stops on whatever token 2 is ("#" in GPT-2's vocabulary).
  const std::string eos = num(eos_id);
  if (cfg.preset == "gpt2") {
    return json_object({{"architectures", "[\"GPT2LMHeadModel\"]"},
                        {"model_type", json_string("gpt2")},
                        {"vocab_size", num(cfg.vocab_size)},
                        {"n_positions", num(cfg.max_seq_len)},
                        {"n_embd", num(cfg.n_embd)},
                        {"n_layer", num(cfg.n_layer)},
                        {"n_head", num(cfg.n_head)},
                        {"n_inner", num(cfg.ffn_hidden)},
                        {"activation_function", json_string("gelu_new")},
                        {"layer_norm_epsilon", json_number(cfg.norm_eps)},
                        {"tie_word_embeddings", "true"},
                        {"bos_token_id", eos},
                        {"eos_token_id", eos},
                        {"torch_dtype", json_string("float32")}});
  }
  TESSERA_CHECK(cfg.preset == "llama", "no Hugging Face config for model.preset = \"", cfg.preset, "\"");
  return json_object({{"architectures", "[\"LlamaForCausalLM\"]"},
                      {"model_type", json_string("llama")},
                      {"vocab_size", num(cfg.vocab_size)},
                      {"hidden_size", num(cfg.n_embd)},
                      {"intermediate_size", num(cfg.ffn_hidden)},
                      {"num_hidden_layers", num(cfg.n_layer)},
                      {"num_attention_heads", num(cfg.n_head)},
                      {"num_key_value_heads", num(cfg.kv_heads())},
                      {"max_position_embeddings", num(cfg.max_seq_len)},
                      {"rms_norm_eps", json_number(cfg.norm_eps)},
                      {"rope_theta", json_number(cfg.rope_theta)},
                      {"tie_word_embeddings", "false"},
                      {"hidden_act", json_string("silu")},
                      {"bos_token_id", eos},
                      {"eos_token_id", eos},
                      {"torch_dtype", json_string("float32")}});
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
  for (size_t i = 0; i < tokens.size(); ++i) t.vocab_json += (i ? ", " : "") + json_token(tokens[i]) + ": " + num(int64_t(i));
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

}  // namespace

HfTokenizer hf_tokenizer_of(const CheckpointReader& reader, const std::string& vocab_dir) {
  const StoredData d = stored_data(reader);
  if (d.task == "addition") {
    const std::string alphabet = CharTokenizer::kAlphabet;
    return single_byte_tokenizer("addition characters", alphabet, "", static_cast<int32_t>(alphabet.find('\n')));
  }
  TESSERA_CHECK(d.task == "tokens", "the config stored in ", reader.path(), " has data.task = \"", d.task,
                "\"; expected \"addition\" or \"tokens\"");
  if (d.tokenizer == "byte") {
    std::string bytes(256, '\0');
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = static_cast<char>(b);
    return single_byte_tokenizer("byte", bytes, "<|endoftext|>", ByteTokenizer().eot_id());
  }
  TESSERA_CHECK(d.tokenizer == "gpt2", "the config stored in ", reader.path(), " has data.tokenizer = \"", d.tokenizer,
                "\"; expected \"gpt2\" or \"byte\"");
  return gpt2_tokenizer(vocab_dir, d.vocab_dir);
}

std::string hf_tokenizer_config_json(const HfTokenizer& tok, int64_t max_seq_len) {
  const std::string eos = json_string(tok.eos_token);
  // No prefix space and no clean-up of spaces before punctuation: decode(encode(s)) == s, as in tessera.
  return json_object({{"tokenizer_class", json_string("GPT2Tokenizer")},
                      {"model_max_length", num(max_seq_len)},
                      {"bos_token", eos},
                      {"eos_token", eos},
                      {"unk_token", eos},
                      {"add_prefix_space", "false"},
                      {"add_bos_token", "false"},
                      {"clean_up_tokenization_spaces", "false"},
                      {"errors", json_string("replace")}});
}

std::string hf_special_tokens_map_json(const HfTokenizer& tok) {
  const std::string eos = json_string(tok.eos_token);
  return json_object({{"bos_token", eos}, {"eos_token", eos}, {"unk_token", eos}});
}

// ---- safetensors ----

namespace {

std::string shape_json(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.ndim(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  std::string h = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    if (!first) h += ',';
    h += json_string(k) + ":" + json_string(v);
    first = false;
  }
  h += "}";
  int64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const int64_t bytes = e.shape.numel() * static_cast<int64_t>(sizeof(float));
    h += ',';
    h += json_string(e.name);
    h += ":{\"dtype\":\"F32\",\"shape\":" + shape_json(e.shape);
    h += ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  h += "}";
  h.resize((h.size() + 7) / 8 * 8, ' ');  // the data then starts at 8 + N, a multiple of 8
  return h;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(entries, metadata);
  // A fresh exclusive temporary (a planted file or symlink is never followed), renamed when whole.
  AtomicFile out(path);
  const uint64_t n = header.size();
  out.write(&n, sizeof n);
  out.write(header);
  for (const SafetensorsEntry& e : entries) {
    const std::vector<float> values = e.data();
    TESSERA_CHECK(static_cast<int64_t>(values.size()) == e.shape.numel(), "safetensors entry ", e.name, " produced ",
                  values.size(), " values for shape ", e.shape.str());
    out.write(values.data(), values.size() * sizeof(float));
  }
  out.commit();
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

SafetensorsEntry entry_for(const CheckpointReader& reader, const HfTensor& t) {
  Shape shape = reader.shape(t.sources.front());
  for (size_t i = 1; i < t.sources.size(); ++i) shape[0] += reader.shape(t.sources[i])[0];
  TESSERA_CHECK(!t.transpose || shape.ndim() == 2, "cannot transpose ", t.sources.front(), " ", shape.str());
  const Shape stored = shape;
  if (t.transpose) shape = Shape{stored[1], stored[0]};
  auto data = [&reader, t, stored] {
    std::vector<float> all;
    for (const std::string& s : t.sources) {
      std::vector<float> part = reader.read_all(s);
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
                                      const std::string& vocab_dir) {
  require_text_model(reader, "tessera ckpt export");
  const ModelConfig cfg = model_config_of(reader);
  check_shapes(reader, model_tensor_shapes(cfg));
  const HfTokenizer tok = hf_tokenizer_of(reader, vocab_dir);  // before anything is written
  TESSERA_CHECK(tok.vocab_size <= cfg.vocab_size, reader.path(), ": the model's vocabulary (", cfg.vocab_size,
                ") is smaller than its tokenizer's (", tok.name, ", ", tok.vocab_size, ")");
  std::vector<SafetensorsEntry> entries;
  HfExportSummary summary;
  summary.architecture = cfg.preset == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM";
  for (const HfTensor& t : hf_tensor_map(cfg)) {
    entries.push_back(entry_for(reader, t));
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
                  json_object({{"bos_token_id", num(tok.eos_id)}, {"eos_token_id", num(tok.eos_id)}}));
  write_text_file(out_dir, "vocab.json", tok.vocab_json);
  write_text_file(out_dir, "merges.txt", tok.merges_txt);
  write_text_file(out_dir, "tokenizer_config.json", hf_tokenizer_config_json(tok, cfg.max_seq_len));
  write_text_file(out_dir, "special_tokens_map.json", hf_special_tokens_map_json(tok));
  return summary;
}

}  // namespace tessera
