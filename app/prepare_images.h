// `tessera prepare --images DIR --captions FILE.jsonl --out FILE.h5`: images and their captions into
// the image-text HDF5 format (data/image_text.h) that `data.task = "image_text"` trains on. Each
// jsonl line is {"image": "name.png", "text": "a caption"}; the image (PNG or JPEG, under DIR) is
// decoded to RGB and resized to the model's square size (data/image_decode.h), the caption
// tokenized. A sample is P placeholders (P = (image_size / patch_size)^2), the caption, the
// tokenizer's end-of-text id; the placeholder is a new id after the tokenizer's vocabulary.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace tessera {

struct PrepareImagesArgs {
  std::string images_dir;   // image names in the jsonl are relative to this
  std::string captions;     // the .jsonl file
  std::string out;          // the .h5 file written
  std::string tokenizer;    // "byte" or "gpt2"
  std::string vocab_dir;    // gpt2: encoder.json and vocab.bpe; "" = the default
  std::string config;       // a TOML config whose [vision] image_size and patch_size are used ("" = none)
  int64_t image_size = 0;   // overrides the config's; one of the two is needed
  int64_t patch_size = 0;   // overrides the config's (the config's default, 4, when neither is given)
  std::string on_error = "refuse";  // a bad line or image: "refuse" the run, or "skip" it and count
};

// Writes args.out (through a temporary file renamed at the end: a refused run leaves nothing) and
// prints a summary to out; progress on stderr for long runs. Returns 0. Errors throw tessera::Error
// naming the jsonl line and the image file.
int run_prepare_images(const PrepareImagesArgs& args, std::ostream& out);

}  // namespace tessera
