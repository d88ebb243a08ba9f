// `tessera upscale`: grows a checkpoint deeper by a method of model/upscale.h and writes a normal
// checkpoint (docs/upscaling.md). Global tensors need no layout; the new file is written tensor by
// tensor, each made just before it is written, so the model is never whole in memory.
#pragma once

#include <mpi.h>

#include <functional>
#include <map>
#include <ostream>
#include <string>

#include "app/config.h"
#include "app/training_data.h"
#include "model/parameters.h"
#include "model/upscale.h"

namespace tessera {

struct UpscaleArgs {
  std::string from;             // source checkpoint
  std::string out;              // the grown checkpoint (must not exist)
  UpscaleOptions options;
  bool carry_optimizer = false;  // copy (or average, like the weights) the AdamW moments and step
};

// What a grown checkpoint records of how it was made: group /upscale of the file.
inline constexpr const char* kUpscaleGroup = "/upscale";

// Global tensors by parameter name, row-major (the in-run growth's view of a model).
using GlobalTensors = std::map<std::string, std::vector<float>>;

// The whole model's tensors, assembled on every rank from the ranks' shards (collective over comm;
// MPI_COMM_NULL: this process alone holds the model). values(e) points at entry e's local values
// (parameters, or a moment at its own layout); entries values skips (returns null) are left out.
// Only ranks with `contributes` send (one replica: dp rank 0, cp rank 0), and of the tensors every
// tp rank holds whole only tp rank 0's (`contributes_whole`); a stage_copy is never sent (its
// owner's is). Every rank receives the whole model: transiently about one model per rank.
GlobalTensors gather_global_tensors(const ParameterStore& ps, const std::function<const float*(const ParamEntry&)>& values,
                                    bool contributes, bool contributes_whole, MPI_Comm comm);

// Entry e's local part of a global tensor (its tp shard; padding rows zero) into out.
void copy_local_part(const ParamEntry& e, const std::vector<float>& global, float* out);

// The [upscale] section's method and options as `tessera upscale` takes them.
UpscaleOptions upscale_options(const UpscaleConfig& c);

// ot --align-data (and the in-run [upscale] align_data): the first `n` micro-batches (B =
// train.micro_batch, or 4 when automatic, x T = train.seq_len) of the validation data, or of the
// training data when there is none, in the order of a run from step 0 (seeded by train.seed), read
// by a loader of their own: the same batches every time, whatever the layout or the step, and a run
// that grows in itself does not move its own data position.
std::vector<std::vector<int32_t>> alignment_batches(const Config& c, const TrainingData& data, int64_t n, int64_t& B,
                                                   int64_t& T);

// Writes args.out; returns the exit code. Throws tessera::Error for a bad request (naming it) or a
// source that does not match its stored config.
int run_upscale_command(const UpscaleArgs& args, std::ostream& out);

// The stored config (TOML) of the grown model: the source's with model.n_layer = layers (and
// parallel.pp_layers cleared, since its split was for the source's depth).
std::string grown_config_toml(const std::string& source_toml, const std::string& source_name, int64_t layers);

}  // namespace tessera
