// The embedded image-text task (no download): synthetic scenes of two coloured shapes, captioned
// by where one lies relative to the other ("a red circle left of a blue square"), with a word
// tokenizer. The caption names first the shape whose colour comes first in red, green, blue,
// yellow (then circle, square, triangle), so each image has exactly one caption. Scenes are a pure function of (seed, split, index); validation scenes come from their
// own stream, so held-out images never appear in training. For configs/quickstart-vl.toml; the
// trainer scores held-out captions by exact match of greedy decoding (app/evaluate.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tessera {

// Words of the captions. Id 0 is "<eos>" (end of caption, also padding); the last id is the image
// placeholder "<image>".
class SceneTokenizer {
 public:
  SceneTokenizer();
  int64_t vocab_size() const { return static_cast<int64_t>(words_.size()); }
  int32_t eos_id() const { return 0; }
  int32_t placeholder_id() const { return static_cast<int32_t>(words_.size()) - 1; }
  std::vector<int32_t> encode(const std::string& text) const;  // words separated by spaces; Error on an unknown word
  std::string decode(const std::vector<int32_t>& ids) const;   // stops at <eos>
 private:
  std::vector<std::string> words_;
};

struct Scene {
  std::vector<uint8_t> image;  // (size, size, 3) row-major
  std::string caption;         // "a red circle left of a blue square"
};

class SceneTask {
 public:
  // Images of size x size pixels (at least 8), RGB.
  SceneTask(int64_t image_size, uint64_t seed);
  Scene scene(uint64_t index, bool validation) const;
  int64_t image_size() const { return size_; }
  const SceneTokenizer& tokenizer() const { return tok_; }
  // The longest caption in tokens, <eos> included.
  static constexpr int64_t kMaxCaptionTokens = 9;

 private:
  int64_t size_;
  uint64_t seed_;
  SceneTokenizer tok_;
};

// Samples of seq_len + 1 ids: image_tokens placeholders, the caption, <eos>, then <eos> padding.
// The loss mask keeps the caption and its first <eos>. Needs seq_len >= image_tokens +
// kMaxCaptionTokens.
class SceneDataset : public Dataset {
 public:
  SceneDataset(const SceneTask& task, bool validation, int64_t seq_len, int64_t num_samples, int64_t image_tokens);
  int64_t num_samples() const override { return num_samples_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return task_.tokenizer().vocab_size(); }
  void get(int64_t index, int32_t* out, uint8_t* loss_mask) const override;
  std::string describe() const override;
  ImageShape image_shape() const override { return {task_.image_size(), task_.image_size(), 3}; }
  int32_t placeholder_id() const override { return task_.tokenizer().placeholder_id(); }
  bool get_image(int64_t index, uint8_t* out) const override;

 private:
  const SceneTask& task_;
  bool validation_;
  int64_t seq_len_, num_samples_, image_tokens_;
};

// Scenes [0, n) of a split as an image-text file's contents (data/image_text.h): each sample
// image_tokens placeholders, the caption, <eos>; tokenizer "scene-words", pad <eos>. For scoring a
// checkpoint on held-out scenes as on a file (`tessera generate --held-out`).
struct ImageTextData;
ImageTextData scenes_as_image_text(const SceneTask& task, bool validation, int64_t n, int64_t image_tokens);

// Cuts images (n, H, W, C) uint8 into patch x patch patches as the vision encoder reads them
// (model/vision.h): out (n, (H / patch) (W / patch), patch patch C), patches in row-major order,
// each patch row-major over (y, x, channel), values pixel / 255.
template <typename T>
void patchify(const uint8_t* images, int64_t n, const ImageShape& s, int64_t patch, T* out) {
  const int64_t ph = s.height / patch, pw = s.width / patch, K = patch * patch * s.channels;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t py = 0; py < ph; ++py)
      for (int64_t px = 0; px < pw; ++px) {
        T* o = out + ((i * ph + py) * pw + px) * K;
        for (int64_t y = 0; y < patch; ++y)
          for (int64_t x = 0; x < patch; ++x)
            for (int64_t c = 0; c < s.channels; ++c)
              *o++ = static_cast<T>(
                         images[((i * s.height + py * patch + y) * s.width + px * patch + x) * s.channels + c]) /
                     static_cast<T>(255);
      }
}

}  // namespace tessera
