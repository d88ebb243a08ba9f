// train.freeze: which parameters a run does not train (docs/training.md, docs/upscaling.md). Glob
// patterns over global parameter names, and "original": what an up-scaling carried over from its
// source model, read from the checkpoint's /upscale record (model/upscale.h original_layers).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"

namespace tessera {

// The special value of train.freeze.
inline constexpr const char* kFreezeOriginal = "original";

// Where "original" comes from: the /upscale record (attributes of a grown checkpoint, or of an
// in-run growth) and what to call it in messages; record empty = none.
struct FreezeSource {
  AttrMap record;
  std::string where;  // "checkpoint F", "this run (no checkpoint resumed)"
};

// The names (of `names`, the whole model's global parameter names) that `patterns` freeze.
// Throws tessera::Error naming train.freeze and the value for a pattern that matches nothing,
// "original" without an up-scaling record (or with one whose layers are not this model's), and
// for a list that freezes every parameter. apply_original = false: "original" is accepted and
// ignored (a run whose in-run growth has not happened yet).
std::set<std::string> frozen_parameters(const std::vector<std::string>& patterns, const std::vector<std::string>& names,
                                        int64_t n_layer, const FreezeSource& source, bool apply_original = true);

// train.freeze as TOML shows it: ["original", "wte.*"].
std::string freeze_text(const std::vector<std::string>& patterns);

// A string attribute of an AttrMap ("" when absent or not a string).
std::string string_attr(const AttrMap& attrs, const std::string& key);

}  // namespace tessera
