// The dataset interface every training source implements: a fixed number of samples, each a
// window of seq_len + 1 token ids (inputs are the first seq_len, targets the last seq_len), with
// an optional loss mask saying which tokens are worth predicting.
// The synthetic task (data/addition.h) and file datasets (Megatron indexed, llm.c shards) plug in here.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

// A target that carries no loss (the same value as kernels' kIgnoreIndex).
constexpr int32_t kIgnoreTarget = -1;

// The size of every image of an image-text dataset (uint8, (height, width, channels) row-major);
// all zero for a text-only dataset.
struct ImageShape {
  int64_t height = 0, width = 0, channels = 0;
  int64_t numel() const { return height * width * channels; }
  bool operator==(const ImageShape&) const = default;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t num_samples() const = 0;
  virtual int64_t seq_len() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Writes sample `index` (0 <= index < num_samples) as seq_len + 1 ids into out, and when
  // loss_mask is not null, seq_len + 1 flags: 0 where a token is not a training target (e.g. the
  // question of a question/answer pair). Datasets without such a notion write all ones.
  virtual void get(int64_t index, int32_t* out, uint8_t* loss_mask) const = 0;
  virtual std::string describe() const = 0;

  // Image-text datasets (model.kind = "vlm"; data/image_text.h, data/scenes.h). A sample with an
  // image holds one run of image-token placeholders (placeholder_id()) in its window, where the
  // model puts the image's patches; a text-only sample holds none.
  virtual ImageShape image_shape() const { return {}; }
  virtual int32_t placeholder_id() const { return -1; }
  // Writes sample `index`'s image (image_shape().numel() bytes) and returns true, or returns false
  // for a text-only sample.
  virtual bool get_image(int64_t /*index*/, uint8_t* /*out*/) const { return false; }
};

// A micro-batch on the host: tokens and targets (B, T), row-major. doc_start (B, T), when not
// empty, marks packed documents (mark_documents): each token's document start, a position in the
// whole window (also after a context-parallel rank took its share of the T positions).
// From an image-text dataset it also holds the images of the samples that have one: image i
// (image_shape, row-major in `images`) belongs to row image_sample[i], whose placeholder run starts
// at position image_start[i] and is image_tokens long (the same for every image).
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  std::vector<int32_t> doc_start;
  // doc_position (B, T), when not empty (variable-length batches, data/token_batching.h): the position
  // each token's document start takes, so that the pieces of a long document continue their positions.
  std::vector<int32_t> doc_position;
  ImageShape image_shape;
  int64_t image_tokens = 0;
  std::vector<uint8_t> images;  // (N, H, W, C)
  std::vector<int64_t> image_sample, image_start;
  int64_t num_images() const { return static_cast<int64_t>(image_sample.size()); }
};

// Packed documents (data.document_mask): the position of each token's document start in a window
// of T token ids. Documents end with the end-of-text id eot, which belongs to the document it ends:
// the token after an eot starts a new document; the window's first token starts one (a document
// cut by the window's start counts from there). Example, eot = 9: ids 5 9 7 7 9 9 3 give
// 0 0 2 2 2 5 6.
std::vector<int32_t> document_starts(const int32_t* tokens, int64_t T, int32_t eot);
// Sets b.doc_start from b.tokens (each sequence separately).
void mark_documents(Batch& b, int32_t eot);

// Fills a batch from samples indices[0..B): tokens = window[0, T), targets = window[1, T + 1),
// with kIgnoreIndex (-1) for targets the loss mask excludes. From an image-text dataset, also the
// images and where their placeholder runs start; a placeholder is never a target, and a sample
// whose placeholders are not one run, or whose run does not match its image (none without one,
// the same length for every image), is an Error naming the dataset and sample.
Batch make_batch(const Dataset& ds, const std::vector<int64_t>& indices);
// The same, giving up (nothing returned) once `cancel` is set, checked before each sample: a batch
// of slow reads (cold storage, a huge batch) can be abandoned within one sample's read.
std::optional<Batch> make_batch(const Dataset& ds, const std::vector<int64_t>& indices,
                                const std::atomic<bool>& cancel);

}  // namespace tessera
