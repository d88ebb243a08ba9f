// The tiny vision-language model of the VLM tests (tests/app/test_vlm_training.cpp,
// tests/app/test_init_from.cpp): 8x8 scenes in 4x4 patches, 4 image placeholders + up to 9 caption
// tokens, vocabulary 15, one language block and one encoder block. Each test file fixes its own
// step count and warm-up.
#pragma once

#include <string>

namespace tessera::testing {

inline std::string tiny_vlm_toml(int steps, int warmup_steps) {
  return R"(
[model]
kind = "vlm"
preset = "gpt2"
n_layer = 1
n_head = 2
n_embd = 32

[vision]
image_size = 8
patch_size = 4
n_layer = 1
n_head = 2
n_embd = 16

[data]
task = "scenes"
val_examples = 8

[train]
steps = )" + std::to_string(steps) + R"(
global_batch = 8
micro_batch = 4
seq_len = 13
eval_every = 0
eval_batches = 1

[optim]
lr = 3e-3
warmup_steps = )" + std::to_string(warmup_steps) + R"(

[log]
every = 1
progress = "lines"
peak_gflops = 100.0
)";
}

}  // namespace tessera::testing
