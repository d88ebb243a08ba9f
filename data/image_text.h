// The image-text HDF5 format (docs/data.md, "Image-text files"): images and captions for a
// vision-language model (model.kind = "vlm"). One file holds
//   /images       uint8 (N, H, W, C)      every image, once
//   /tokens       int32 (M)               every sample's token ids, one after another
//   /offsets      int64 (S + 1)           sample s is tokens[offsets[s], offsets[s + 1])
//   /image_index  int64 (S)               the image of sample s (a row of /images), or -1: text only
// and on the root group the attributes format = "tessera-image-text", version = 1, tokenizer (the
// name of the tokenizer the ids come from), vocab_size, placeholder_id (the image placeholder
// token) and pad_id (fills a sample's window after its tokens, never a target). A sample with an
// image holds exactly one run of placeholder tokens, as long as the images' patch count; one
// without holds none. The reader checks all of it and names the dataset and field it refuses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tessera {

struct ImageTextData {
  ImageShape image_shape;
  std::vector<uint8_t> images;       // (N, H, W, C)
  std::vector<int32_t> tokens;       // (M)
  std::vector<int64_t> offsets;      // (S + 1)
  std::vector<int64_t> image_index;  // (S)
  std::string tokenizer;
  int64_t vocab_size = 0;
  int32_t placeholder_id = -1;
  int32_t pad_id = 0;
  int64_t num_images() const { return image_shape.numel() ? static_cast<int64_t>(images.size()) / image_shape.numel() : 0; }
  int64_t num_samples() const { return static_cast<int64_t>(image_index.size()); }
};

// Checks every field's shape and values (offsets from 0 to M, non-decreasing; image indices in
// [-1, N); ids in [0, vocab_size); the placeholder runs: one of the same length per image sample,
// none elsewhere). `where` names the file in messages. Throws tessera::Error.
void check_image_text(const ImageTextData& d, const std::string& where);

// Writes d (checked first) to path, replacing it.
void write_image_text(const std::string& path, const ImageTextData& d);
// Reads and checks a file; an Error names the file, the dataset or attribute and what is wrong.
ImageTextData read_image_text(const std::string& path);

// Samples of seq_len + 1 ids over an image-text file's samples: the sample's tokens, then pad_id;
// the loss mask keeps the tokens that are neither placeholders nor padding. A sample longer than
// seq_len + 1 is cut (an Error at construction when the cut would split its placeholder run).
class ImageTextDataset : public Dataset {
 public:
  ImageTextDataset(ImageTextData data, int64_t seq_len, std::string name);
  int64_t num_samples() const override { return data_.num_samples(); }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return data_.vocab_size; }
  void get(int64_t index, int32_t* out, uint8_t* loss_mask) const override;
  std::string describe() const override { return name_; }
  ImageShape image_shape() const override { return data_.image_shape; }
  int32_t placeholder_id() const override { return data_.placeholder_id; }
  bool get_image(int64_t index, uint8_t* out) const override;
  const ImageTextData& data() const { return data_; }

 private:
  ImageTextData data_;
  int64_t seq_len_;
  std::string name_;
};

}  // namespace tessera
