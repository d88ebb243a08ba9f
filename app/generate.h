// `tessera generate`: loads a checkpoint's model and continues a prompt, with a KV cache (or,
// for comparison, re-running the whole sequence per token), greedy or sampled. With --image (a
// vision-language checkpoint) the image is decoded and resized as `tessera prepare --images`
// does, its placeholder tokens come before the prompt as in the training samples, and the
// caption is generated with the full forward per token, up to the end-of-text id.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct GenerateArgs {
  std::string ckpt;
  std::string prompt;
  std::string image;         // PNG or JPEG: caption it (model.kind = "vlm" checkpoints only)
  int64_t max_tokens = 32;
  bool max_tokens_given = true;  // false: 32, or fewer when the context has less room
  // Caption scoring instead of one prompt (vision-language checkpoints): the first held_out image
  // samples of `data` (an image-text file; "" = the checkpoint's own held-out data: the scenes
  // task's validation scenes, or the image_text run's data.valid) captioned greedily, one line
  // each and the exact-match accuracy; `dump` (optional) gets those samples as an image-text file.
  int64_t held_out = 0;
  std::string data;
  std::string dump;
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = whole vocabulary
  uint64_t seed = 0;
  std::string vocab_dir;     // GPT-2 files, when the checkpoint's data.vocab_dir is not set
  std::string tokenizer;     // "" = the checkpoint's data.tokenizer; else a name or a tokenizer.json path
  bool no_cache = false;
  bool stop_at_newline = false;
};

// Refuses out-of-range options before anything is loaded: --max-tokens < 0, a negative or
// non-finite --temperature, --top-k < 0. (--max-tokens beyond the model's context is refused once
// the checkpoint says what the context is.)
void check_generate_args(const GenerateArgs& args);

// Prints the prompt and its continuation to stdout, and tokens/s to stderr. Returns the exit code.
int run_generate_command(const GenerateArgs& args);

// The sampling rule, exposed for tests: index of the next token given the last position's logits.
// temperature 0 -> argmax; else softmax(logits / temperature) over the top_k largest (0 = all),
// drawn with u in [0, 1).
int32_t sample_token(const std::vector<float>& logits, double temperature, int64_t top_k, double u);

}  // namespace tessera
