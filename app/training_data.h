// Opens what a run trains and validates on, from [data]: the synthetic addition task, or token
// files (Megatron indexed datasets / llm.c shards) blended by weight.
#pragma once

#include <cstdint>
#include <memory>

#include "app/config.h"
#include "data/addition.h"
#include "data/dataset.h"
#include "data/image_text.h"
#include "data/scenes.h"
#include "data/tokenizer.h"

namespace tessera {

struct TrainingData {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> valid;    // null: no validation loss
  std::shared_ptr<const AdditionTask> task;  // addition only: scored by greedy accuracy
  std::shared_ptr<const SceneTask> scenes;   // scenes only: scored by greedy caption accuracy
  // image_text with data.valid: the validation file, scored by greedy caption accuracy, and its
  // captions' decoder for the examples printed (null when the file's tokenizer is not one tessera has)
  std::shared_ptr<const ImageTextDataset> captions;
  std::shared_ptr<const Tokenizer> caption_tokenizer;
  int64_t vocab_size = 0;                  // of the data (the model may pad beyond it)
  // data.document_mask: the end-of-text id that ends each packed document (the tokenizer's:
  // gpt2 50256, byte 256); -1: no document mask.
  int32_t document_eot = -1;
};

TrainingData open_training_data(const Config& cfg);

// The vocabulary of the data [data] describes (TrainingData::vocab_size), without opening it.
int64_t data_vocab_size(const Config& cfg);

}  // namespace tessera
