// The synthetic scenes task: a word tokenizer, a rasterizer of three shapes, the dataset.
#include "data/scenes.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "data/image_text.h"
#include "kernels/check.h"

namespace tessera {

namespace {
const char* const kColors[] = {"red", "green", "blue", "yellow"};
const uint8_t kRgb[][3] = {{220, 40, 40}, {40, 200, 60}, {50, 90, 230}, {230, 220, 40}};
const char* const kShapes[] = {"circle", "square", "triangle"};

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether pixel offset (dx, dy) from a shape's centre lies in it, radius r.
bool inside(int shape, double dx, double dy, double r) {
  if (shape == 0) return dx * dx + dy * dy <= r * r;
  if (shape == 1) return std::abs(dx) <= 0.85 * r && std::abs(dy) <= 0.85 * r;
  return dy >= -r && dy <= 0.8 * r && std::abs(dx) <= (dy + r) * 0.55;  // apex up
}
}  // namespace

SceneTokenizer::SceneTokenizer() {
  words_ = {"<eos>", "a"};
  for (const char* c : kColors) words_.push_back(c);
  for (const char* s : kShapes) words_.push_back(s);
  for (const char* w : {"left", "right", "of", "above", "below"}) words_.push_back(w);
  words_.push_back("<image>");
}

std::vector<int32_t> SceneTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    const auto it = std::find(words_.begin(), words_.end(), w);
    TESSERA_CHECK(it != words_.end(), "scene tokenizer: unknown word \"", w, "\"");
    ids.push_back(static_cast<int32_t>(it - words_.begin()));
  }
  return ids;
}

std::string SceneTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id == eos_id()) break;
    if (!s.empty()) s += ' ';
    s += id >= 0 && id < vocab_size() ? words_[static_cast<size_t>(id)] : "<?>";
  }
  return s;
}

SceneTask::SceneTask(int64_t image_size, uint64_t seed) : size_(image_size), seed_(seed) {
  TESSERA_CHECK(image_size >= 8, "scenes: vision.image_size = ", image_size, " is too small to draw shapes (>= 8)");
}

Scene SceneTask::scene(uint64_t index, bool validation) const {
  uint64_t st = seed_ * 0x2545F4914F6CDD1Dull ^ (validation ? 0xA5A5A5A5A5A5A5A5ull : 0) ^ (index * 0x9E3779B97F4A7C15ull);
  auto draw = [&](uint64_t n) { return static_cast<int>(splitmix(st) % n); };
  int c[2], s[2];
  do {
    for (int k = 0; k < 2; ++k) {
      c[k] = draw(4);
      s[k] = draw(3);
    }
  } while (c[0] == c[1] && s[0] == s[1]);
  const bool horizontal = draw(2) == 0;
  // Shape 0 is left (or above) of shape 1; centres in their halves, jittered.
  const double S = static_cast<double>(size_), r = S * 0.16;
  double cx[2], cy[2];
  for (int k = 0; k < 2; ++k) {
    const double along = (k == 0 ? 0.25 : 0.75) * S + (draw(5) - 2) * S * 0.03;
    const double across = S * (0.3 + 0.4 * (draw(1000) / 999.0));
    cx[k] = horizontal ? along : across;
    cy[k] = horizontal ? across : along;
  }
  Scene sc;
  sc.image.assign(static_cast<size_t>(size_ * size_ * 3), 16);
  for (int k = 0; k < 2; ++k)
    for (int64_t y = 0; y < size_; ++y)
      for (int64_t x = 0; x < size_; ++x)
        if (inside(s[k], x + 0.5 - cx[k], y + 0.5 - cy[k], r))
          for (int ch = 0; ch < 3; ++ch) sc.image[static_cast<size_t>((y * size_ + x) * 3 + ch)] = kRgb[c[k]][ch];
  // The caption starts with the shape whose colour comes first (red, green, blue, yellow; then
  // circle, square, triangle): a function of the image, so the caption is unambiguous.
  const int first = std::make_pair(c[0], s[0]) < std::make_pair(c[1], s[1]) ? 0 : 1;
  const char* rel = horizontal ? (first == 0 ? "left of" : "right of") : (first == 0 ? "above" : "below");
  const int a = first, b = 1 - first;
  sc.caption = std::string("a ") + kColors[c[a]] + " " + kShapes[s[a]] + " " + rel + " a " + kColors[c[b]] + " " +
               kShapes[s[b]];
  return sc;
}

SceneDataset::SceneDataset(const SceneTask& task, bool validation, int64_t seq_len, int64_t num_samples,
                           int64_t image_tokens)
    : task_(task), validation_(validation), seq_len_(seq_len), num_samples_(num_samples), image_tokens_(image_tokens) {
  TESSERA_CHECK(seq_len >= image_tokens + SceneTask::kMaxCaptionTokens, "scenes: train.seq_len = ", seq_len,
                " cannot hold an image's ", image_tokens, " placeholder tokens and a caption of up to ",
                SceneTask::kMaxCaptionTokens, " tokens; use at least ", image_tokens + SceneTask::kMaxCaptionTokens);
}

void SceneDataset::get(int64_t index, int32_t* out, uint8_t* loss_mask) const {
  const Scene sc = task_.scene(static_cast<uint64_t>(index), validation_);
  const std::vector<int32_t> caption = task_.tokenizer().encode(sc.caption);
  const SceneTokenizer& tok = task_.tokenizer();
  for (int64_t t = 0; t <= seq_len_; ++t) {
    const int64_t c = t - image_tokens_;
    int32_t id = tok.eos_id();
    if (c < 0) id = tok.placeholder_id();
    else if (c < static_cast<int64_t>(caption.size())) id = caption[static_cast<size_t>(c)];
    out[t] = id;
    if (loss_mask) loss_mask[t] = c >= 0 && c <= static_cast<int64_t>(caption.size()) ? 1 : 0;
  }
}

bool SceneDataset::get_image(int64_t index, uint8_t* out) const {
  const Scene sc = task_.scene(static_cast<uint64_t>(index), validation_);
  std::copy(sc.image.begin(), sc.image.end(), out);
  return true;
}

std::string SceneDataset::describe() const {
  return std::string("synthetic scenes (") + (validation_ ? "validation" : "training") + ", " +
         std::to_string(task_.image_size()) + "x" + std::to_string(task_.image_size()) + " images)";
}

ImageTextData scenes_as_image_text(const SceneTask& task, bool validation, int64_t n, int64_t image_tokens) {
  const SceneTokenizer& tok = task.tokenizer();
  ImageTextData d;
  d.image_shape = {task.image_size(), task.image_size(), 3};
  d.tokenizer = "scene-words";
  d.vocab_size = tok.vocab_size();
  d.placeholder_id = tok.placeholder_id();
  d.pad_id = tok.eos_id();
  d.offsets = {0};
  for (int64_t i = 0; i < n; ++i) {
    const Scene sc = task.scene(static_cast<uint64_t>(i), validation);
    d.images.insert(d.images.end(), sc.image.begin(), sc.image.end());
    d.tokens.insert(d.tokens.end(), static_cast<size_t>(image_tokens), tok.placeholder_id());
    for (int32_t id : tok.encode(sc.caption)) d.tokens.push_back(id);
    d.tokens.push_back(tok.eos_id());
    d.offsets.push_back(static_cast<int64_t>(d.tokens.size()));
    d.image_index.push_back(i);
  }
  return d;
}

}  // namespace tessera
