// `tessera prepare`: inputs are mapped, enumerated as document pieces (a .txt part, a .jsonl
// line), tokenized one document at a time into IndexedDatasetBuilders. Nothing is written under
// the output names unless the whole run succeeds (the builders rename on finalize).
#include "app/prepare.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>

#include "app/metrics.h"
#include "data/file_io.h"
#include "data/indexed_dataset.h"
#include "data/json.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "kernels/check.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---- inputs and their document pieces ----

struct Input {
  std::string path;
  bool jsonl = false;
  std::unique_ptr<MappedFile> file;
  std::string_view bytes() const { return {reinterpret_cast<const char*>(file->data()), size_t(file->size())}; }
};

std::vector<Input> open_inputs(const std::vector<std::string>& paths) {
  std::vector<Input> inputs;
  for (const auto& p : paths) {
    TESSERA_CHECK(fs::exists(p), "missing input file ", p);
    TESSERA_CHECK(fs::is_regular_file(p), "input ", p, " is not a regular file");
    inputs.push_back(Input{p, ends_with(p, ".jsonl"), std::make_unique<MappedFile>(p)});
  }
  return inputs;
}

// The raw bytes of one document: a part of a text file, or one line of a .jsonl file (line > 0).
struct Piece {
  std::string_view bytes;
  int64_t line = 0;
  int64_t end = 0;  // byte offset in the file just past this piece (for progress)
};

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

// Calls f(piece) for every document piece of a file, in order. Text: the whole file, or the
// non-empty parts between separators. JSON lines: every line that is not blank.
template <typename F>
void for_each_piece(const Input& in, const std::string& separator, F&& f) {
  const std::string_view all = in.bytes();
  const std::string_view delim = in.jsonl ? std::string_view("\n") : std::string_view(separator);
  if (delim.empty()) {
    if (!all.empty()) f(Piece{all, 0, int64_t(all.size())});
    return;
  }
  int64_t line = 0;
  for (size_t start = 0; start < all.size();) {
    size_t stop = all.find(delim, start);
    if (stop == std::string_view::npos) stop = all.size();
    std::string_view part = all.substr(start, stop - start);
    start = std::min(all.size(), stop + delim.size());
    ++line;
    if (in.jsonl ? is_blank(part) : part.empty()) continue;
    f(Piece{part, in.jsonl ? line : 0, int64_t(start)});
  }
}

int64_t count_pieces(const std::vector<Input>& inputs, const std::string& separator) {
  int64_t n = 0;
  for (const auto& in : inputs) for_each_piece(in, separator, [&](const Piece&) { ++n; });
  return n;
}

// The text of a piece: itself, or the "text" field of its JSON line.
std::string document_text(const Input& in, const Piece& p) {
  if (!in.jsonl) return std::string(p.bytes);
  const std::string where = in.path + ":" + std::to_string(p.line);
  Json line;
  try {
    line = parse_json_line(p.bytes);
  } catch (const Error& e) {
    detail::fail(where, ": ", e.what());
  }
  const std::optional<std::string> text = json_string(line, "text", where);
  TESSERA_CHECK(text.has_value(), where, ": the JSON object has no \"text\" field");
  return *text;
}

// ---- progress on stderr ----

// Bytes done out of total with throughput: a redrawn bar on a terminal, else a line per 10%.
// Silent for the first second, so small inputs print nothing.
class ByteProgress {
 public:
  explicit ByteProgress(int64_t total) : total_(total), tty_(isatty(STDERR_FILENO)), start_(Clock::now()) {}

  void update(int64_t done) {
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < 1.0 || total_ <= 0) return;
    const int decile = int(10 * done / total_);
    if (tty_ && now - last_draw_ > std::chrono::milliseconds(100)) {
      std::fprintf(stderr, "\r\033[K%s", line(done, elapsed, true).c_str());
      last_draw_ = now;
      drawn_ = true;
    } else if (!tty_ && decile > last_decile_) {
      std::fprintf(stderr, "%s\n", line(done, elapsed, false).c_str());
      last_decile_ = decile;
    }
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  std::string line(int64_t done, double elapsed, bool bar) const {
    const double frac = double(done) / double(total_);
    std::string s = "prepare: ";
    if (bar) {
      const int width = 30, full = int(frac * width);
      s += '[';
      s.append(size_t(full), '#').append(size_t(width - full), '.').append("] ");
    }
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.1f/%.1f MB (%d%%), %.1f MB/s", done / 1e6, total_ / 1e6, int(100 * frac),
                  done / 1e6 / elapsed);
    return s + buf;
  }

  int64_t total_;
  bool tty_;
  Clock::time_point start_, last_draw_{};
  int last_decile_ = 0;
  bool drawn_ = false;
};

// ---- the output datasets ----

// Tokenizes documents into OUT (and OUT_val): pieces with index >= first_val go to OUT_val. When
// the whole input is one piece, its text is cut at (1 - f) of its bytes instead (nanoGPT's split).
class DocumentWriter {
 public:
  DocumentWriter(const PrepareArgs& a, const Tokenizer& tok, int64_t num_pieces) : args_(a), tok_(tok) {
    const TokenDType dtype = IndexedDatasetBuilder::dtype_for_vocab(tok.vocab_size());
    train_.emplace(a.out, dtype);
    if (a.val_fraction > 0) {
      val_.emplace(a.out + "_val", dtype);
      split_single_ = num_pieces == 1;
      first_val_ = split_single_ ? 1 : validation_first_document(num_pieces, a.val_fraction, a.out);
    } else {
      first_val_ = num_pieces;
    }
  }

  void add_piece(const std::string& text) {
    if (split_single_) {
      const size_t cut = text_cut(text);
      add(*train_, std::string_view(text).substr(0, cut));
      add(*val_, std::string_view(text).substr(cut));
    } else {
      add(piece_ < first_val_ ? *train_ : *val_, text);
    }
    ++piece_;
  }

  void finalize() {
    TESSERA_CHECK(train_->num_tokens() > 0, "empty input: the inputs hold no text to prepare");
    train_->finalize();
    if (val_) val_->finalize();
  }
  const IndexedDatasetBuilder& train() const { return *train_; }
  const IndexedDatasetBuilder* val() const { return val_ ? &*val_ : nullptr; }

 private:
  void add(IndexedDatasetBuilder& b, std::string_view text) {
    if (text.empty()) return;
    std::vector<int32_t> ids = tok_.encode(text);
    if (args_.append_eot) ids.push_back(tok_.eot_id());
    b.add_document(ids);
  }
  // Byte floor((1 - f) * n), moved back to the start of a UTF-8 character.
  size_t text_cut(const std::string& text) const {
    size_t cut = size_t((1.0 - args_.val_fraction) * double(text.size()));
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    TESSERA_CHECK(cut > 0 && cut < text.size(), "the input is one document of ", text.size(),
                  " bytes, too short to hold out a fraction ", args_.val_fraction, " of it");
    return cut;
  }

  const PrepareArgs& args_;
  const Tokenizer& tok_;
  std::optional<IndexedDatasetBuilder> train_, val_;
  int64_t first_val_ = 0, piece_ = 0;
  bool split_single_ = false;
};

// ---- the command ----

void check_args(const PrepareArgs& a) {
  TESSERA_CHECK(!a.inputs.empty(), "prepare: give at least one --input file (or --images DIR --captions FILE.jsonl for image-text data)");
  TESSERA_CHECK(!a.out.empty(), "prepare: give an output prefix with --out");
  // The prefix gets ".bin"/".idx" appended: "data/" would write the hidden files data/.bin, a
  // directory's name would write beside it.
  const fs::path out(a.out);
  const std::string name = out.filename().string();
  std::error_code ec;
  TESSERA_CHECK(!name.empty() && name != "." && name != ".." && !fs::is_directory(out, ec), "prepare: --out ", a.out,
                " names a directory; give a file prefix inside it, e.g. --out ",
                (name.empty() ? out.parent_path() : out).string(), "/corpus (writes corpus.bin and corpus.idx there)");
  TESSERA_CHECK(a.val_fraction >= 0 && a.val_fraction < 1, "prepare: --val-fraction must be in [0, 1), got ",
                a.val_fraction);
}

std::string plural(int64_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

void print_written(const IndexedDatasetBuilder& b) {
  std::cout << "  " << b.bin_path() << " + " << b.idx_path() << ": " << plural(b.num_documents(), "document")
            << ", " << plural(b.num_tokens(), "token") << ", " << token_dtype_name(b.dtype()) << "\n";
}

}  // namespace

std::string unescape_separator(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    if (e == 'n') out += '\n';
    else if (e == 't') out += '\t';
    else if (e == 'r') out += '\r';
    else if (e == '\\') out += '\\';
    else out += std::string{'\\', e};
  }
  return out;
}

int run_prepare_command(const PrepareArgs& args) {
  check_args(args);
  const auto start = Clock::now();
  std::unique_ptr<Tokenizer> tok = make_tokenizer(args.tokenizer, args.vocab_dir);
  const std::string separator = unescape_separator(args.separator);
  const std::vector<Input> inputs = open_inputs(args.inputs);
  int64_t total_bytes = 0;
  for (const auto& in : inputs) total_bytes += in.file->size();
  const int64_t pieces = count_pieces(inputs, separator);
  TESSERA_CHECK(pieces > 0, "empty input: ", inputs.size() == 1 ? inputs[0].path + " holds" : "the inputs hold",
                " no text");
  const fs::path parent = fs::path(args.out).parent_path();
  if (!parent.empty()) fs::create_directories(parent);

  DocumentWriter writer(args, *tok, pieces);
  ByteProgress progress(total_bytes);
  int64_t done_before = 0;
  for (const auto& in : inputs) {
    for_each_piece(in, separator, [&](const Piece& p) {
      writer.add_piece(document_text(in, p));
      progress.update(done_before + p.end);
    });
    done_before += in.file->size();
  }
  progress.finish();
  writer.finalize();

  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t tokens = writer.train().num_tokens() + (writer.val() ? writer.val()->num_tokens() : 0);
  std::cout << "prepared " << plural(int64_t(inputs.size()), "input") << " (" << total_bytes << " bytes) with the "
            << tok->name() << " tokenizer (vocabulary " << tok->vocab_size() << ")\n";
  print_written(writer.train());
  if (writer.val()) print_written(*writer.val());
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.2f s: %.2f MB/s, %s tokens/s\n", secs, total_bytes / 1e6 / secs,
                format_rate(tokens / secs).c_str());
  std::cout << buf;
  return 0;
}

}  // namespace tessera
