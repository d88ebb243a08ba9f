// The vision side of a vision-language model (model.kind = "vlm"), LLaVA-style: a ViT encoder over
// image patches and a projector into the language model's width. The Gpt that holds it (the stage
// with the embedding) writes the projected patches over its image placeholder tokens' embeddings.
// Dimension letters: N images, P patches per image, K flattened patch (patch_size^2 x channels),
// W encoder width, C language-model width.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/layers.h"
#include "model/parameters.h"

namespace tessera {

// What one micro-batch's vision forward keeps for its backward.
struct VisionCtx {
  int64_t N = 0;
  Tensor patches;               // (N, P, K), owned by the caller
  std::vector<Buffer> resid;    // n_layer + 1 of (N, P, W): patch embedding + positions, each block's output
  std::vector<BlockCtx> blocks;
  NormCtx ln_f;                 // (N, P, W)
  Buffer h;                     // (N, P, C) projector fc1 output
  Buffer act;                   // (N, P, C) GELU(h)
  Buffer out;                   // (N, P, C) the projected patches, the language model's inputs
};

// Encoder: x0 = patches W_patch^T + b + pos (one matmul over the flattened patches; pos (P, W)
// learned), n_layer pre-norm blocks with bidirectional attention, a final LayerNorm. Projector:
// out = fc2(GELU(fc1(x))), W -> C -> C. Parameters (global names): vision.patch.{weight,bias},
// vision.pos.weight, vision.blocks.L.* (as the GPT's gpt2 blocks), vision.ln_f.{weight,bias},
// projector.fc1.{weight,bias}, projector.fc2.{weight,bias}. Under tensor parallelism the blocks
// split their heads and MLP over tp as the GPT's do (plain tp, never sequence parallel: the
// encoder's (N, P, W) stream is whole on every tp rank); the patch embedding, positions, final
// norm and projector are replicated and every tp rank computes their whole gradient (its input
// and output gradients are whole there too), so they need no tp sum.
class VisionTower {
 public:
  VisionTower() = default;
  // Registers the parameters in ps; cfg is the whole model's (cfg.vision sizes, cfg.n_embd = C);
  // tp: the model's tensor-parallel group (its sequence_parallel is ignored here).
  VisionTower(ParameterStore& ps, const ModelConfig& cfg, TensorParallel tp = {});
  // ctx.out (N, P, C) from patches (N, P, K) in the model's dtype (data/image_text.h patchify:
  // pixel / 255, patches in row-major order, each patch row-major (y, x, channel)).
  void forward(const Exec& ex, VisionCtx& ctx, Allocator& alloc, const Tensor& patches) const;
  // Accumulates the parameter gradients from dout (N, P, C), the gradient of ctx.out (whole and
  // equal on every tp rank); releases ctx.
  void backward(const Exec& ex, VisionCtx& ctx, Allocator& alloc, const Tensor& dout) const;
  void set_profiler(Profiler* p);
  int64_t num_patches() const { return P_; }
  int64_t patch_dim() const { return K_; }

 private:
  const ParameterStore* ps_ = nullptr;
  Profiler* prof_ = nullptr;
  int64_t P_ = 0, K_ = 0, W_ = 0, C_ = 0;
  Linear patch_;
  int pos_ = -1;
  std::vector<Block> blocks_;
  Norm ln_f_;
  Linear fc1_, fc2_;
};

}  // namespace tessera
