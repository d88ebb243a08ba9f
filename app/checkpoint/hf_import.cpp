// The import: config.json -> ModelConfig (hf_model_config), the folder's tensors checked against the
// inverted name table, the tokenizer recognized, then each tessera tensor cut out of its HF tensor
// (transposed back for GPT-2's Conv1D, split at the row counts of q, k, v) as the checkpoint
// writer asks for it.
#include "app/checkpoint/hf_import.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/checkpointing.h"
#include "app/checkpoint/hf_export.h"
#include "app/checkpoint/hf_model.h"
#include "app/checkpoint/safetensors.h"
#include "app/config.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/json.h"
#include "kernels/check.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

// Where a tessera tensor comes from: rows [row, row + rows) of the table's HF tensor `hf`, viewed
// as tessera lays it out (transposed back when the table transposes).
struct Source {
  size_t hf = 0;
  int64_t row = 0, rows = 0;
};

// The shape tessera's table gives an HF tensor: its sources' shapes stacked along dim 0, then
// transposed when the table says.
std::vector<int64_t> hf_shape(const HfTensor& t, const std::map<std::string, Shape>& shapes) {
  const Shape& first = shapes.at(t.sources.front());
  std::vector<int64_t> s;
  for (int i = 0; i < first.ndim(); ++i) s.push_back(first[i]);
  for (size_t i = 1; i < t.sources.size(); ++i) s[0] += shapes.at(t.sources[i])[0];
  if (t.transpose) std::swap(s[0], s[1]);
  return s;
}

// The folder's tensor names with the base model's prefix ("transformer.", "model."), mapped to the
// names as stored: a folder saved from GPT2Model or LlamaModel stores them without it, as
// transformers accepts.
std::map<std::string, std::string> canonical_names(const SafetensorsSet& w, const std::string& prefix) {
  std::map<std::string, std::string> out;
  for (const std::string& n : w.names()) {
    const std::string c = n.rfind(prefix, 0) == 0 || n.rfind("lm_head.", 0) == 0 ? n : prefix + n;
    const auto [it, fresh] = out.emplace(c, n);
    TESSERA_CHECK(fresh, "the model holds both \"", it->second, "\" (", w.file_of(it->second), ") and \"", n, "\" (",
                  w.file_of(n), "): the same tensor with and without the prefix \"", prefix, "\"");
  }
  return out;
}

std::string list(const std::vector<std::string>& items, size_t most = 6) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < most; ++i) s += (i ? "\n  " : "  ") + items[i];
  if (items.size() > most) s += "\n  ... and " + std::to_string(items.size() - most) + " more";
  return s;
}

// (R, C) row-major -> (C, R).
std::vector<float> transpose(const std::vector<float>& m, int64_t R, int64_t C) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) t[static_cast<size_t>(c * R + r)] = m[static_cast<size_t>(r * C + c)];
  return t;
}

// ---- the tokenizer ----

// The merges of a merges.txt: its lines without a "#version" header, blank lines and CRs.
std::vector<std::string> merge_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (out.empty() && line.rfind("#version", 0) == 0)) continue;
    out.push_back(line);
  }
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TESSERA_CHECK(in.good(), "cannot read ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Which of tessera's tokenizers the folder's vocab.json and merges.txt are (what `ckpt export`
// writes: the addition characters, the byte tokenizer, GPT-2's files); "" when none, with why.
std::string recognize_tokenizer(const fs::path& dir, const std::string& vocab_dir, std::string& why) {
  const fs::path vocab = dir / "vocab.json", merges = dir / "merges.txt";
  if (!fs::exists(vocab) || !fs::exists(merges)) {
    why = "it has no vocab.json and merges.txt";
    return "";
  }
  const Json theirs = read_json_file(vocab.string());
  const std::vector<std::string> their_merges = merge_lines(read_text(merges));
  std::string gpt2_missing;
  for (const std::string name : {"addition", "byte", "gpt2"}) {
    HfTokenizer t;
    try {
      t = hf_tokenizer_named(name, vocab_dir);
    } catch (const Error& e) {  // GPT-2's files are not here: it cannot be compared
      gpt2_missing = e.what();
      continue;
    }
    if (parse_json(t.vocab_json, name + " vocabulary") == theirs && merge_lines(t.merges_txt) == their_merges) return name;
  }
  why = "its vocab.json and merges.txt are not those of the addition task's characters, the byte tokenizer" +
        std::string(gpt2_missing.empty() ? " or GPT-2" : "; GPT-2's could not be compared: " + gpt2_missing);
  return "";
}

// ---- the stored config ----

std::string stored_config(const ModelConfig& m, const std::string& tokenizer, const std::string& vocab_dir) {
  Config c;
  ModelSection& s = c.model;
  s.preset = m.preset;
  s.vocab_size = m.vocab_size;
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.n_kv_head = m.n_kv_head;
  s.n_embd = m.n_embd;
  s.ffn_hidden = m.ffn_hidden;
  s.max_seq_len = m.max_seq_len;
  s.norm_eps = m.norm_eps;
  s.rope_theta = m.rope_theta;
  // The preset's own choice stays "preset", so a model exported by tessera comes back as it was.
  const std::string head = m.tied_embeddings ? "tied" : "untied";
  s.lm_head = resolve_lm_head(m.preset, "preset") == head ? "preset" : head;
  if (tokenizer == "addition") {
    c.data.task = "addition";
  } else {
    c.data.task = "tokens";
    c.data.tokenizer = tokenizer;
    c.data.vocab_dir = tokenizer == "gpt2" ? vocab_dir : "";
  }
  c.train.seq_len = std::min(c.train.seq_len, m.max_seq_len);
  validate(c);
  return to_toml(c);
}

// The export's table read backwards: for each tessera tensor, its HF tensor and rows.
struct Inverted {
  std::vector<HfTensor> table;
  std::vector<std::pair<std::string, Shape>> tensors;  // "/model/<name>", in the writer's terms
  std::map<std::string, Shape> shapes;
  std::map<std::string, Source> source_of;
};

Inverted invert_table(const ModelConfig& cfg) {
  Inverted inv;
  inv.table = hf_tensor_map(cfg);
  inv.tensors = model_tensor_shapes(cfg);
  inv.shapes = std::map<std::string, Shape>(inv.tensors.begin(), inv.tensors.end());
  for (size_t i = 0; i < inv.table.size(); ++i) {
    int64_t row = 0;
    for (const std::string& s : inv.table[i].sources) {
      const int64_t rows = inv.shapes.at(s)[0];
      inv.source_of[s] = {i, row, rows};
      row += rows;
    }
  }
  for (const auto& [path, shape] : inv.tensors)
    TESSERA_CHECK(inv.source_of.count(path), "internal: no Hugging Face tensor maps to ", path);
  return inv;
}

// Checks every tensor of the folder: mapped (present, a float dtype, its shape), a buffer to skip,
// or refused; all problems in one error. Returns the stored names by canonical name (with the base
// model's prefix); fills summary.skipped and summary.dtypes.
std::map<std::string, std::string> check_tensors(const SafetensorsSet& w, const Inverted& inv, const HfModelConfig& hf,
                                                 const std::string& dir, const std::string& config_path,
                                                 HfImportSummary& summary) {
  const ModelConfig& cfg = hf.model;
  const std::map<std::string, std::string> stored = canonical_names(w, hf_base_prefix(cfg.preset));
  std::set<std::string> expected, dtypes;
  std::vector<std::string> problems, unknown;
  for (const HfTensor& t : inv.table) {
    expected.insert(t.name);
    const auto it = stored.find(t.name);
    const std::string want = safetensors_shape_str(hf_shape(t, inv.shapes));
    if (it == stored.end()) {
      problems.push_back("missing " + t.name + " " + want);
      continue;
    }
    const SafetensorsTensor& st = w.tensor(it->second);
    const std::string where = " in " + w.file_of(it->second);
    if (st.shape != hf_shape(t, inv.shapes)) problems.push_back(it->second + " is " + st.shape_str() + where + ", expected " + want);
    if (!safetensors_float_dtype(st.dtype))
      problems.push_back(it->second + " is " + st.dtype + where +
                         ": tessera reads F32, F16 and BF16 weights (a quantized model? import its unquantized release)");
    dtypes.insert(st.dtype);
  }
  bool tied_head_stored = false;
  for (const auto& [canonical, name] : stored) {
    if (expected.count(canonical)) continue;
    if (hf_ignored_buffer(cfg.preset, canonical)) {
      summary.skipped.push_back(name);
    } else if (canonical == "lm_head.weight" && cfg.tied_embeddings) {
      tied_head_stored = true;
    } else {
      unknown.push_back(name + " " + w.tensor(name).shape_str() + " in " + w.file_of(name));
    }
  }
  if (!unknown.empty()) {
    bool quantized = false;
    for (const std::string& u : unknown)
      for (const char* q : {"qweight", "qzeros", "scales", "g_idx", "absmax", "quant", "weight_scale", ".SCB"})
        quantized = quantized || u.find(q) != std::string::npos;
    problems.push_back(std::to_string(unknown.size()) + " tensor(s) that " + hf.architecture + " with this config.json " +
                       "does not have" + (quantized ? " (a quantized model's: tessera imports unquantized weights)" : "") +
                       ":\n" + list(unknown));
  }
  const std::string files = w.sharded() ? (fs::path(dir) / "model.safetensors.index.json").string() : w.files()[0];
  TESSERA_CHECK(problems.empty(), "ckpt import: ", dir, " does not hold the ", hf.architecture, " that ", config_path,
                " describes (", problems.size(), " problem", problems.size() == 1 ? "" : "s", "; ", files, "):\n",
                list(problems, 12));
  if (tied_head_stored) {
    // transformers ties the head to the embedding on load and ignores a stored one: it must be the same.
    const std::string emb = stored.at(inv.table.front().name), head = stored.at("lm_head.weight");
    TESSERA_CHECK(w.tensor(head).shape == w.tensor(emb).shape && w.read_f32(head) == w.read_f32(emb), "ckpt import: ",
                  config_path, " says tie_word_embeddings = true, but lm_head.weight in ", w.file_of(head),
                  " differs from ", emb, ": transformers would ignore it and use the embedding. If the model's head "
                  "is its own, set \"tie_word_embeddings\": false in config.json");
    summary.skipped.push_back(head + " (tied: equal to " + emb + ")");
  }
  summary.dtypes.assign(dtypes.begin(), dtypes.end());
  return stored;
}

// --tokenizer, or the one recognized in the folder; it must fit the model's vocabulary.
std::string choose_tokenizer(const CkptImportArgs& args, const ModelConfig& cfg) {
  std::string tokenizer = args.tokenizer;
  if (tokenizer == "auto" && fs::is_regular_file(fs::path(args.dir) / "tokenizer.json"))
    tokenizer = (fs::path(args.dir) / "tokenizer.json").string();
  if (is_tokenizer_json_path(tokenizer)) tokenizer = fs::absolute(tokenizer).lexically_normal().string();
  if (tokenizer == "auto") {
    std::string why;
    tokenizer = recognize_tokenizer(args.dir, args.vocab_dir, why);
    TESSERA_CHECK(!tokenizer.empty(), "ckpt import: cannot tell which of tessera's tokenizers ", args.dir,
                  "'s model uses: ", why, ". Pass --tokenizer gpt2, byte or addition to record the one its token ids "
                  "follow (it decides how `generate` and `ckpt export` read the ids)");
  }
  TESSERA_CHECK(tokenizer == "gpt2" || tokenizer == "byte" || tokenizer == "addition" || is_tokenizer_json_path(tokenizer),
                "ckpt import: --tokenizer \"", tokenizer, "\" is not one of auto, gpt2, byte, addition or a tokenizer.json path");
  const HfTokenizer tok = hf_tokenizer_named(tokenizer, args.vocab_dir);
  TESSERA_CHECK(tok.vocab_size <= cfg.vocab_size, "ckpt import: the model's vocabulary (", cfg.vocab_size,
                ", config.json's vocab_size) is smaller than the ", tok.name, " tokenizer's (", tok.vocab_size, ")");
  return tokenizer;
}

// Tessera tensor `path`: its HF tensor read (widened to float32), transposed back where the table
// transposes, and its rows cut out; NaN or inf refused unless allowed.
std::vector<float> tessera_tensor(const std::string& path, const Inverted& inv, const SafetensorsSet& w,
                                  const std::map<std::string, std::string>& stored, bool allow_non_finite) {
  const Source& s = inv.source_of.at(path);
  const HfTensor& t = inv.table[s.hf];
  const std::string name = stored.at(t.name);
  std::vector<float> values = w.read_f32(name);
  const std::vector<int64_t>& hs = w.tensor(name).shape;
  if (t.transpose) values = transpose(values, hs[0], hs[1]);
  const int64_t row_size = static_cast<int64_t>(values.size()) / (t.transpose ? hs[1] : hs[0]);
  std::vector<float> out;
  if (s.row == 0 && s.rows * row_size == static_cast<int64_t>(values.size())) {
    out = std::move(values);  // the whole HF tensor: no copy
  } else {
    out.assign(values.begin() + s.row * row_size, values.begin() + (s.row + s.rows) * row_size);
  }
  if (!allow_non_finite) {
    const int64_t bad = std::count_if(out.begin(), out.end(), [](float v) { return !std::isfinite(v); });
    TESSERA_CHECK(bad == 0, "ckpt import: ", name, " in ", w.file_of(name), " holds ", bad, " NaN or inf value(s) (",
                  path, "): the model would produce NaN. Pass --allow-non-finite to import it as it is");
  }
  return out;
}

// The /import group: where the weights came from.
AttrMap import_record(const CkptImportArgs& args, const HfImportSummary& s) {
  auto joined = [](const std::vector<std::string>& items, const char* sep, bool basename) {
    std::string out;
    for (const std::string& i : items) out += (out.empty() ? "" : sep) + (basename ? fs::path(i).filename().string() : i);
    return out;
  };
  AttrMap rec;
  rec["source_dir"] = args.dir;
  rec["architecture"] = s.architecture;
  rec["files"] = joined(s.files, " ", true);
  rec["dtypes"] = joined(s.dtypes, " ", false);
  rec["tokenizer"] = s.tokenizer;
  if (!s.notes.empty()) rec["notes"] = joined(s.notes, "; ", false);
  return rec;
}

}  // namespace

HfImportSummary import_hf_model(const CkptImportArgs& args) {
  const fs::path dir(args.dir);
  TESSERA_CHECK(fs::is_directory(dir), "ckpt import: ", args.dir, " is not a directory (a Hugging Face model folder)");
  const std::string config_path = (dir / "config.json").string();
  TESSERA_CHECK(fs::exists(config_path), "ckpt import: ", args.dir, " has no config.json");
  const HfModelConfig hf = hf_model_config(read_json_file(config_path), config_path);
  const SafetensorsSet weights(args.dir);
  const Inverted inv = invert_table(hf.model);

  HfImportSummary summary;
  summary.architecture = hf.architecture;
  summary.notes = hf.notes;
  summary.files = weights.files();
  const std::map<std::string, std::string> stored = check_tensors(weights, inv, hf, args.dir, config_path, summary);
  summary.tokenizer = choose_tokenizer(args, hf.model);
  summary.config_toml = stored_config(hf.model, summary.tokenizer, args.vocab_dir);

  // Everything is checked: the tensors stream from the safetensors files into the checkpoint.
  CheckpointMeta meta;
  meta.config_toml = summary.config_toml;
  meta.extra[kRunIdKey] = new_run_id();  // its own model: a run of its own
  const TensorProducer produce = [&](const std::string& path) {
    return tessera_tensor(path, inv, weights, stored, args.allow_non_finite);
  };
  write_checkpoint_file_streamed(args.out, meta, inv.tensors, produce, {{"/import", import_record(args, summary)}});

  summary.hf_tensors = static_cast<int64_t>(inv.table.size());
  summary.tensors = static_cast<int64_t>(inv.tensors.size());
  for (const auto& [path, shape] : inv.tensors) summary.parameters += shape.numel();
  return summary;
}

int run_ckpt_import(const CkptImportArgs& args, std::ostream& out) {
  const HfImportSummary s = import_hf_model(args);
  std::string params = std::to_string(s.parameters);  // 602880 -> 602,880
  for (int i = static_cast<int>(params.size()) - 3; i > 0; i -= 3) params.insert(static_cast<size_t>(i), ",");
  std::string dtypes;
  for (const std::string& d : s.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
  const Config c = parse_config_string(s.config_toml, args.out + ":/meta/config");
  const ModelSection& m = c.model;
  out << "imported " << args.dir << " (" << s.architecture << ", " << s.files.size() << " safetensors file"
      << (s.files.size() == 1 ? "" : "s") << ", " << s.hf_tensors << " tensors in " << dtypes << ") into " << args.out
      << ": " << s.tensors << " tensors, " << params << " parameters as float32, no optimizer state\n";
  out << "  model.preset = \"" << m.preset << "\", n_layer = " << m.n_layer << ", n_head = " << m.n_head
      << ", n_kv_head = " << (m.n_kv_head > 0 ? m.n_kv_head : m.n_head) << ", n_embd = " << m.n_embd
      << ", ffn_hidden = " << m.ffn_hidden << ", vocab_size = " << m.vocab_size << ", max_seq_len = " << m.max_seq_len
      << ", lm_head = \"" << resolve_lm_head(m.preset, m.lm_head) << "\"";
  if (m.preset == "llama") out << ", rope_theta = " << m.rope_theta;
  out << ", norm_eps = " << m.norm_eps << "\n";
  out << "  tokenizer: " << s.tokenizer << "\n";
  for (const std::string& n : s.notes) out << "  note: " << n << "\n";
  if (!s.skipped.empty()) out << "  skipped " << s.skipped.size() << " buffer(s) and tied copies: " << s.skipped[0]
                              << (s.skipped.size() > 1 ? ", ..." : "") << "\n";
  out << "  start a run from it with checkpoint.init_from = \"" << args.out
      << "\" and the [model] keys above (tessera ckpt inspect --config shows them all)\n";
  return 0;
}

}  // namespace tessera
