// `tessera prepare --images`: the jsonl is read line by line; each entry's image is decoded once
// (a name used by several lines is stored once), resized, and its caption tokenized. A bad entry
// (malformed line, missing field, missing or bad image) refuses the run or is skipped and counted
// (--on-error). The file is written under a temporary name and renamed when whole.
#include "app/prepare_images.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>

#include "app/config.h"
#include "data/image_decode.h"
#include "data/image_text.h"
#include "data/json.h"
#include "data/tokenizer.h"
#include "kernels/check.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Geometry {
  int64_t image_size = 0, patch_size = 0;
  int64_t patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

Geometry geometry_of(const PrepareImagesArgs& a) {
  Geometry g;
  if (!a.config.empty()) {
    const Config cfg = load_config(a.config);
    g.image_size = cfg.vision.image_size;
    g.patch_size = cfg.vision.patch_size;
  }
  if (a.image_size > 0) g.image_size = a.image_size;
  if (a.patch_size > 0) g.patch_size = a.patch_size;
  if (g.patch_size == 0) g.patch_size = VisionConfig{}.patch_size;
  TESSERA_CHECK(g.image_size > 0, "prepare --images: give the image size with --image-size N or a --config whose "
                "[vision] image_size is the model's");
  TESSERA_CHECK(g.image_size <= kMaxImageSide, "prepare --images: --image-size ", g.image_size, " is above ",
                kMaxImageSide);
  TESSERA_CHECK(g.image_size % g.patch_size == 0, "prepare --images: the patch size ", g.patch_size,
                " does not divide the image size ", g.image_size, " (vision.patch_size must divide vision.image_size)");
  return g;
}

void check_args(const PrepareImagesArgs& a) {
  TESSERA_CHECK(!a.captions.empty(), "prepare --images: give the captions with --captions FILE.jsonl");
  TESSERA_CHECK(!a.out.empty(), "prepare --images: give the output file with --out FILE.h5");
  TESSERA_CHECK(a.out.size() > 3 && a.out.compare(a.out.size() - 3, 3, ".h5") == 0,
                "prepare --images: --out names the image-text HDF5 file written; it must end in .h5, got ", a.out);
  TESSERA_CHECK(a.on_error == "refuse" || a.on_error == "skip", "prepare: --on-error must be refuse or skip, got \"",
                a.on_error, "\"");
  TESSERA_CHECK(fs::is_directory(a.images_dir), "prepare --images: ", a.images_dir, " is not a directory");
  TESSERA_CHECK(fs::is_regular_file(a.captions), "prepare --images: missing captions file ", a.captions);
}

// Entries done out of a total (the jsonl's lines): a redrawn line on a terminal, else one per 10%.
// Silent for the first second, so small inputs print nothing.
class LineProgress {
 public:
  explicit LineProgress(int64_t total) : total_(total), tty_(isatty(STDERR_FILENO)), start_(Clock::now()) {}
  void update(int64_t done, int64_t images) {
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < 1.0 || total_ <= 0) return;
    const int decile = static_cast<int>(10 * done / total_);
    char buf[160];
    std::snprintf(buf, sizeof buf, "prepare: line %lld/%lld (%d%%), %lld images, %.0f lines/s",
                  static_cast<long long>(done), static_cast<long long>(total_), static_cast<int>(100 * done / total_),
                  static_cast<long long>(images), done / elapsed);
    if (tty_ && now - last_draw_ > std::chrono::milliseconds(100)) {
      std::fprintf(stderr, "\r\033[K%s", buf);
      last_draw_ = now;
      drawn_ = true;
    } else if (!tty_ && decile > last_decile_) {
      std::fprintf(stderr, "%s\n", buf);
      last_decile_ = decile;
    }
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  int64_t total_;
  bool tty_;
  Clock::time_point start_, last_draw_{};
  int last_decile_ = 0;
  bool drawn_ = false;
};

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in, path, ": cannot open");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  return lines;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// One jsonl line's fields; an Error (without the location) when malformed.
struct Entry {
  std::string image, text;
};
Entry parse_entry(const std::string& line) {
  const Json entry = parse_json_line(line);
  const std::optional<std::string> image = json_string(entry, "image", "");
  const std::optional<std::string> text = json_string(entry, "text", "");
  TESSERA_CHECK(image.has_value() && !image->empty(), "the JSON object has no \"image\" field (a file name under ",
                "--images)");
  TESSERA_CHECK(text.has_value(), "the JSON object has no \"text\" field (the caption)");
  TESSERA_CHECK(!is_blank(*text), "the caption (\"text\") is empty");
  return {*image, *text};
}

std::string plural(int64_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

}  // namespace

int run_prepare_images(const PrepareImagesArgs& a, std::ostream& out) {
  check_args(a);
  const Geometry g = geometry_of(a);
  const auto start = Clock::now();
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(a.tokenizer, a.vocab_dir);
  const bool skip = a.on_error == "skip";
  const int64_t P = g.patches();

  ImageTextData d;
  d.image_shape = {g.image_size, g.image_size, 3};
  d.tokenizer = tok->name();
  d.vocab_size = tok->vocab_size() + 1;
  d.placeholder_id = static_cast<int32_t>(tok->vocab_size());
  d.pad_id = tok->eot_id();
  d.offsets.push_back(0);

  const std::vector<std::string> lines = read_lines(a.captions);
  std::map<std::string, int64_t> image_row;  // image name -> row of d.images
  int64_t skipped = 0, longest = 0;
  std::string first_skip;
  LineProgress progress(static_cast<int64_t>(lines.size()));
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t lineno = static_cast<int64_t>(i) + 1;
    progress.update(lineno, static_cast<int64_t>(image_row.size()));
    if (is_blank(lines[i])) continue;
    const std::string where = a.captions + ":" + std::to_string(lineno);
    try {
      Entry e;
      try {
        e = parse_entry(lines[i]);
      } catch (const Error& err) {
        detail::fail(where, ": ", err.what());
      }
      auto it = image_row.find(e.image);
      if (it == image_row.end()) {
        const std::string path = (fs::path(a.images_dir) / e.image).string();
        std::vector<uint8_t> pixels;
        try {
          pixels = resize_rgb(decode_image_file(path), g.image_size);
        } catch (const Error& err) {
          detail::fail(where, ": ", err.what());
        }
        d.images.insert(d.images.end(), pixels.begin(), pixels.end());
        it = image_row.emplace(e.image, static_cast<int64_t>(image_row.size())).first;
      }
      std::vector<int32_t> ids(static_cast<size_t>(P), d.placeholder_id);
      const std::vector<int32_t> caption = tok->encode(e.text, false);
      ids.insert(ids.end(), caption.begin(), caption.end());
      ids.push_back(tok->eot_id());
      d.tokens.insert(d.tokens.end(), ids.begin(), ids.end());
      d.offsets.push_back(static_cast<int64_t>(d.tokens.size()));
      d.image_index.push_back(it->second);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.size()));
    } catch (const Error& err) {
      if (!skip) detail::fail(err.what(), " (--on-error skip leaves such entries out)");
      if (skipped == 0) first_skip = err.what();
      std::fprintf(stderr, "prepare: skipped %s\n", err.what());
      ++skipped;
    }
  }
  progress.finish();
  TESSERA_CHECK(d.num_samples() > 0, a.captions, ": no samples to write (", plural(skipped, "entry"),
                skipped == 1 ? " was" : " were", " skipped)");

  const fs::path parent = fs::path(a.out).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  const std::string tmp = a.out + ".tmp";
  write_image_text(tmp, d);
  fs::rename(tmp, a.out);

  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  out << "prepared " << plural(d.num_samples(), "sample") << " from " << a.captions << " with the " << tok->name()
      << " tokenizer (vocabulary " << tok->vocab_size() << " + <image> = " << d.vocab_size << ")\n";
  out << "  " << a.out << ": " << plural(d.num_images(), "image") << " of " << g.image_size << "x" << g.image_size
      << "x3, " << P << " placeholders (id " << d.placeholder_id << ") per image, " << plural(int64_t(d.tokens.size()), "token")
      << "; the longest sample is " << longest << " tokens: train.seq_len >= " << longest - 1 << "\n";
  if (skipped > 0) out << "  skipped " << plural(skipped, "entry") << " (--on-error skip); the first: " << first_skip << "\n";
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.2f s\n", secs);
  out << buf;
  return 0;
}

}  // namespace tessera
