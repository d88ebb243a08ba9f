// Checks `tessera train` makes before it trains, so that a problem shows in the first second
// rather than at the first save or as a silently different run: the run and checkpoint directories
// are writable, a checkpoint to resume holds finite numbers, and resuming with changed batch,
// seeds or data settings is said out loud. (The memory check is app/memory_check.h.)
#pragma once

#include <string>
#include <vector>

#include "app/checkpoint/checkpointing.h"
#include "app/config.h"
#include "model/parameters.h"

namespace tessera {

// Creates the run directory and the checkpoint directory (checkpoint_dir(cfg, run_dir)) and proves
// each writable by creating and removing a probe file; throws tessera::Error naming the directory,
// the key that chose it and the system's reason. run_dir_from_flag: --run-dir named it (else
// log.dir / train.name).
void check_writable_directories(const std::string& run_dir, const Config& cfg, bool run_dir_from_flag);

// The same for one directory; `what` names it in the message ("the checkpoint directory (checkpoint.dir)").
void check_writable_directory(const std::string& dir, const std::string& what);

// "" when every parameter and both AdamW moments of this rank are finite; otherwise the refusal,
// naming the tensors (global names) that hold NaN or inf and the checkpoint they came from.
// The tensors are on ex's device (alloc: the same device's, for the sums read back once).
std::string nonfinite_tensor_in(const Exec& ex, Allocator& alloc, const std::string& checkpoint,
                                const ParameterStore& params, const OptimizerState& moments);

// One warning per key that differs between the config stored in a checkpoint and this run's, among
// those that decide which samples each step sees (train.global_batch, train.seed, data.*): old ->
// new and what it changes. Empty when none changed.
std::vector<std::string> data_order_changes(const std::string& stored_config_toml, const Config& now);

}  // namespace tessera
