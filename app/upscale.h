// `tessera upscale`: grows a checkpoint deeper by a method of model/upscale.h and writes a normal
// checkpoint (docs/upscaling.md). Global tensors need no layout; the new file is written tensor by
// tensor, each made just before it is written, so the model is never whole in memory.
#pragma once

#include <ostream>
#include <string>

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

// Writes args.out; returns the exit code. Throws tessera::Error for a bad request (naming it) or a
// source that does not match its stored config.
int run_upscale_command(const UpscaleArgs& args, std::ostream& out);

// The stored config (TOML) of the grown model: the source's with model.n_layer = layers (and
// parallel.pp_layers cleared, since its split was for the source's depth).
std::string grown_config_toml(const std::string& source_toml, const std::string& source_name, int64_t layers);

}  // namespace tessera
