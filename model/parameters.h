// ParameterStore: every parameter's global name, global shape and shard spec, with all of a
// rank's parameters in one flat buffer and their gradients in another (one allocation each: this
// keeps bucketed all-reduce, ZeRO-1 and checkpoints simple). Initialization is layout-independent:
// element i of parameter "name" is drawn from Philox keyed by (seed, name, global index i).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// Which process-grid axis a parameter is split over, and along which dimension. An even split
// needs the dimension divisible by tp; a padded split (the vocabulary: 50257 is prime to most tp)
// gives every rank ceil(n / tp) rows, the last ones ending in zero padding rows that the model
// never reads and checkpoints never store.
enum class GridAxis { None, Tp };
struct ShardSpec {
  GridAxis axis = GridAxis::None;
  int dim = -1;
  bool padded = false;
  static ShardSpec replicated() { return {}; }
  static ShardSpec tp(int dim) { return {GridAxis::Tp, dim}; }
  static ShardSpec tp_padded(int dim) { return {GridAxis::Tp, dim, true}; }
};

// This rank's place on the axes parameters can be split over (filled from the ProcessGrid later).
struct ShardLayout {
  int tp_size = 1;
  int tp_rank = 0;
};

// Uniform: in [-init_std, init_std] (init_std the bound), e.g. LoRA's Kaiming-uniform A.
enum class InitKind { Normal, Zeros, Ones, Uniform };
// What a parameter is, for optimizer groups (e.g. no weight decay on norms, biases, embeddings).
enum class ParamKind { Matrix, Embedding, Bias, Norm };

struct ParamSpec {
  std::string name;   // global name, e.g. "blocks.3.attn.q.weight"
  Shape global_shape;
  ShardSpec shard;
  ParamKind kind = ParamKind::Matrix;
  InitKind init = InitKind::Normal;
  double init_std = 0.02;
  // Replicated over tp, but each tp rank computes only part of the gradient (norms under
  // sequence parallelism, KV projections shared by several ranks' heads): the trainer sums the
  // gradient over the tp group before the update.
  bool sum_grad_over_tp = false;
  // Tied embeddings split over pipeline stages (Megatron's embedding group): the first stage's
  // token embedding and the last stage's copy of it for the LM head. Gradient finalisation sums
  // their gradients over the embedding group (first and last stage) before the update, so the
  // two stay equal.
  bool sum_grad_over_embedding_group = false;
  // This stage's copy of a parameter another pipeline stage owns, under the owner's name (the
  // last stage's "wte.weight" for a tied LM head): initialized equal (init is keyed by the
  // name), kept equal by the summed gradient. A checkpoint stores the owner's tensor only (the
  // writer declares the copy without writing it); on load the copy is read from the owner's
  // stored tensor by name (app/checkpoint/checkpointing.h).
  bool stage_copy = false;
};

struct ParamEntry {
  ParamSpec spec;
  Shape local_shape;
  int64_t offset = 0;       // into the flat buffers, in elements
  int64_t shard_start = 0;  // first global index along spec.shard.dim held here
  int64_t shard_valid = 0;  // indices along spec.shard.dim held here (< local_shape there when padded)
  bool frozen = false;      // not trained (train.freeze): laid out before the trainable parameters
  // A frozen matrix or embedding has no gradient buffer (ParameterStore::grad is undefined): its
  // modules skip its weight-gradient GEMM. Frozen norms and biases keep theirs (vectors; the
  // kernels write them beside the input gradient), unused.
  bool has_grad() const { return !frozen || spec.kind == ParamKind::Norm || spec.kind == ParamKind::Bias; }

  // Split over tp on this layout (false for replicated parameters, and for every one when tp = 1).
  bool sharded() const { return spec.shard.axis != GridAxis::None && !(local_shape == spec.global_shape); }
  // The part of local_shape that is real (padding rows dropped): what a checkpoint stores.
  Shape stored_shape() const;
  // Whether local element `local` (row-major over local_shape) lies in a padding row.
  bool is_padding(int64_t local) const;
};

class ParameterStore {
 public:
  ParameterStore(Allocator& alloc, DType dtype, ShardLayout layout = {});
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Registers a parameter before finalize(); returns its id. Names must be unique.
  int add(ParamSpec spec);
  // Marks parameter id frozen (not trained), before finalize().
  void freeze(int id);
  // Allocates the flat parameter and gradient buffers (zero-filled), padded with zeros to a multiple
  // of pad_multiple elements (ZeRO-1 shards them over the data-parallel ranks). Frozen parameters
  // come first, in registration order, then the trainable ones in registration order: the
  // trainable region [frozen_numel(), numel()) is one contiguous range, and it (not the whole
  // buffer) is what the padding rounds up to a multiple of pad_multiple. Without frozen parameters
  // the offsets are the registration order's.
  // Frozen matrices and embeddings (ParamEntry::has_grad false) are laid out first of all and the
  // gradient buffer starts after them: it holds padded_numel() - no_grad_numel() elements.
  void finalize(int64_t pad_multiple = 1);
  // Fills every parameter from (seed, name, global index): the same global model on any layout.
  // The values are drawn on the host and copied to the parameters' device (a copy op through a
  // host staging buffer), so a device model initializes as a CPU one does.
  void initialize(const Exec& ex, uint64_t seed);
  void zero_grads(const Exec& ex);

  Tensor param(int id) const;  // local shape
  Tensor grad(int id) const;   // undefined when !entry(id).has_grad()

  // Mixed precision (train.dtype = "bf16"): a copy of every parameter in `dt` (BF16), which the
  // GEMMs read (kernels/matmul.h) while the optimizer updates the master parameters. After
  // finalize(); refresh_compute_copy() rounds the masters into it and must follow every change to
  // them (initialization, a resume, each optimizer step). compute_param(id) is the copy's view of
  // parameter id, or param(id) when there is no copy (fp32 training).
  void enable_compute_copy(DType dt);
  void refresh_compute_copy(const Exec& ex);
  Tensor compute_param(int id) const;
  DType compute_dtype() const { return compute_.defined() ? compute_.tensor().dtype : dtype_; }
  int find(const std::string& name) const;  // -1 when absent
  const ParamEntry& entry(int id) const { return entries_.at(static_cast<size_t>(id)); }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  int size() const { return static_cast<int>(entries_.size()); }

  const Tensor& flat_params() const { return flat_params_; }  // (numel())
  // The gradients of [no_grad_numel(), numel()) (the parameters that have one).
  const Tensor& flat_grads() const { return flat_grads_; }
  // The same buffers with their padding: (padded_numel()), the padding zero.
  const Tensor& padded_flat_params() const { return params_.tensor(); }
  const Tensor& padded_flat_grads() const { return grads_.tensor(); }
  // Elements at the start of the flat parameters with no gradient (frozen matrices, embeddings).
  int64_t no_grad_numel() const { return no_grad_total_; }
  int64_t numel() const { return total_; }  // local elements (tp padding rows included)
  // Elements of the whole model (of this pipeline stage's part of it) on any tp layout; a
  // stage_copy is not counted, so the stages' counts add up to the model's.
  int64_t global_numel() const;
  int64_t padded_numel() const { return params_.tensor().numel(); }
  // The trainable region: what the optimizer, the gradient reduction and the norm see. Offsets of
  // trainable entries minus frozen_numel() index it.
  int64_t frozen_numel() const { return frozen_total_; }
  Tensor trainable_flat_params() const { return flat_params_.slice_rows(frozen_total_, total_); }
  Tensor trainable_flat_grads() const {
    return flat_grads_.slice_rows(frozen_total_ - no_grad_total_, total_ - no_grad_total_);
  }
  // The compute copy's trainable region (the layout of trainable_flat_params()); undefined without
  // a copy. The optimizer may write it in its update's pass (kernels/adamw.h).
  Tensor trainable_flat_compute() const;
  Tensor padded_trainable_flat_params() const;  // with the padding
  Tensor padded_trainable_flat_grads() const;
  bool any_frozen() const { return frozen_total_ > 0; }
  DType dtype() const { return dtype_; }
  const ShardLayout& layout() const { return layout_; }
  // Where the parameters live (modules allocate their temporaries beside them, e.g. LoRA's A x).
  Allocator& allocator() const { return alloc_; }

 private:
  void initialize_entry(const Exec& ex, int id, uint64_t seed, const Tensor& staging);
  Allocator& alloc_;
  DType dtype_;
  ShardLayout layout_;
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, int> by_name_;
  int64_t total_ = 0;
  int64_t frozen_total_ = 0;  // elements of the frozen parameters, at the start of the buffers
  int64_t no_grad_total_ = 0; // of them, those without a gradient (first of all)
  bool finalized_ = false;
  Buffer params_, grads_;           // (padded)
  Buffer compute_;                  // (padded) the GEMMs' copy, when enabled
  Tensor flat_params_, flat_grads_;  // (total_) views of them
};

// The global flat index of local element `local` of entry e (row-major over the global shape).
int64_t global_index(const ParamEntry& e, int64_t local);

}  // namespace tessera
