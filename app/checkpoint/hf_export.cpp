// Hugging Face export: config from the checkpoint's TOML, the per-preset name tables, a streaming
// safetensors writer and config.json. The checkpoint is checked against the config first, so a
// mismatch is one message listing every difference rather than a failure halfway through.
#include "app/checkpoint/hf_export.h"

#include <toml++/toml.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "app/checkpoint/atomic_file.h"
#include "app/config.h"
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

std::string hf_config_json(const ModelConfig& cfg) {
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
                      {"torch_dtype", json_string("float32")}});
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

HfExportSummary export_hf_safetensors(const CheckpointReader& reader, const std::string& out_dir) {
  const ModelConfig cfg = model_config_of(reader);
  check_shapes(reader, model_tensor_shapes(cfg));
  std::vector<SafetensorsEntry> entries;
  HfExportSummary summary;
  summary.architecture = cfg.preset == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM";
  for (const HfTensor& t : hf_tensor_map(cfg)) {
    entries.push_back(entry_for(reader, t));
    summary.parameters += entries.back().shape.numel();
  }
  summary.tensors = static_cast<int64_t>(entries.size());
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TESSERA_CHECK(!ec, "cannot create the directory ", out_dir, ": ", ec.message());
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), entries, {{"format", "pt"}});
  AtomicFile config((fs::path(out_dir) / "config.json").string());
  config.write(hf_config_json(cfg));
  config.commit();
  return summary;
}

}  // namespace tessera
