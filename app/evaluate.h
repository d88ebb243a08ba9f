// Evaluation during training: validation loss, and for the addition task the exact-match accuracy
// of greedy answers on held-out problems. A gate asked before every forward can abandon either.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/addition.h"
#include "data/dataset.h"
#include "data/image_text.h"
#include "data/scenes.h"
#include "data/tokenizer.h"
#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "model/gpt.h"
#include "parallel/communicator.h"

namespace tessera {

// Asked before each evaluation forward whether to go on, with this rank's error reading that
// forward's batch ("" when none). The trainer's gate is a vote of every rank (tensor-parallel
// forwards are collective, so all ranks must give up at the same batch): false when any rank was
// asked to stop, an error thrown on every rank when any failed to read. An empty gate always goes
// on, and a read error is thrown as it is.
using EvalGate = std::function<bool(const std::string& read_error)>;

// The pipeline a stage's evaluation runs in: pp, the pipeline group (this rank's stage = its rank
// there; null: the model is whole); chunks: this rank's model chunks, virtual chunk 0 first (chunk c
// of rank r is virtual stage c pp + r; empty: the model given is the one chunk); sequence_shards:
// the activations' rows per sequence are T / sequence_shards (tp under sequence parallelism, else 1),
// of this cp rank's positions; cp: the context-parallel group (each rank evaluates its positions of
// every sequence, app/context_parallel.h, and the loss is summed over the group).
struct PipelineLink {
  Communicator* pp = nullptr;
  std::vector<const Gpt*> chunks;
  int64_t sequence_shards = 1;
  ContextParallel cp;
};

// A batch's images on the model's device (model.kind = "vlm"): the patches (N, P, K) in dtype and
// where each image goes; none for a text-only batch. An Error when the model has no vision encoder
// or the batch's placeholder runs are not the encoder's num_patches long.
struct DeviceImages {
  Buffer patches;
  ImageInput input;
  const ImageInput* get() const { return input.count() > 0 ? &input : nullptr; }
};
DeviceImages upload_images(const Exec& ex, Allocator& alloc, const Batch& b, const ModelConfig& cfg, DType dt);

// Mean loss over samples [0, batches * micro_batch) of the validation dataset (one device read);
// nothing when the gate gave up. Under a pipeline (link.pp) every stage runs its forward on each
// batch, the activations passed on to the next stage; the last stage's loss is summed over the
// pipeline group so that every stage returns it. document_eot >= 0: packed documents ending in that
// id are masked from each other, as in training (data.document_mask).
std::optional<double> validation_loss(const Exec& ex, const Gpt& model, Allocator& alloc, const Dataset& val,
                                      int64_t batches, int64_t micro_batch, const EvalGate& gate = {},
                                      const PipelineLink& link = {}, int32_t document_eot = -1);

// Greedy continuation: for each prompt (all the same length), appends max_new tokens chosen by
// argmax of the last position's logits. Re-runs the full forward per token (no KV cache). Nothing
// when the gate gave up. Under a pipeline (link.pp) every stage runs its forward per token, as
// validation_loss; the stage with the head picks the tokens and every stage returns them.
std::optional<std::vector<std::vector<int32_t>>> greedy_generate(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                                 int64_t max_new, const EvalGate& gate = {},
                                                                 const PipelineLink& link = {});

// One scored caption (image_text_caption_accuracy): the sample, what was generated, what the
// sample holds, whether they match.
struct CaptionOutcome {
  int64_t sample = 0;
  std::string generated, expected;
  bool right = false;
};

struct AccuracyResult {
  int64_t correct = 0, total = 0;
  std::vector<std::string> examples;  // a few "prompt -> answer (expected)" lines
  std::vector<CaptionOutcome> outcomes;  // image_text_caption_accuracy: every sample scored
  double accuracy() const { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
};

// Exact match of greedy answers on the first `examples` validation problems; nothing when the gate
// gave up. Under a pipeline (link) every stage returns the same result.
std::optional<AccuracyResult> addition_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                const AdditionTask& task, int64_t examples, const EvalGate& gate = {},
                                                const PipelineLink& link = {});

// Exact match of greedily decoded captions of the first `examples` held-out scenes (a model of
// kind "vlm"), micro_batch scenes per forward; nothing when the gate gave up. Decoding re-runs the
// full forward per token and stops at <eos> or the longest caption. Under a pipeline (link) every
// stage runs its part of each forward (the images go to the chunk with the embedding) and every
// stage returns the same result; under cp every rank decodes whole sequences.
std::optional<AccuracyResult> caption_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc,
                                               const SceneTask& task, int64_t examples, int64_t micro_batch,
                                               const EvalGate& gate = {}, const PipelineLink& link = {});

// Exact match of greedily decoded captions on an image-text validation file (data.task =
// "image_text"): its first `examples` samples that have an image, each prompted with its tokens up
// to the end of its placeholder run and decoded (full forward per token) until the file's pad id
// (the end-of-text of `tessera prepare --images`) or the sample's window ends; right when the ids
// before that end equal the sample's own, and the end came. micro_batch samples of one prompt
// length per forward. decode (may be empty) writes the examples' text; nothing when the gate gave up.
using CaptionDecoder = std::function<std::string(const std::vector<int32_t>&)>;
std::optional<AccuracyResult> image_text_caption_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                          const ImageTextDataset& val, int64_t examples,
                                                          int64_t micro_batch, const CaptionDecoder& decode,
                                                          const EvalGate& gate = {});
// A decode for it: tok's text of the ids it knows, the others (the image placeholder, an id after
// its vocabulary) left out. tok must outlive the function.
CaptionDecoder known_ids_decoder(const Tokenizer& tok);

}  // namespace tessera
