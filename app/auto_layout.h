// parallel.layout = "auto": `tessera train` plans its layout at start for the ranks it has, with the
// planner of `tessera plan` (plan/search.h, app/plan_command.h's trainer checks), on the cluster
// parallel.cluster names. Rank 0 searches and broadcasts its choice, so every rank applies the same
// layout; the choice is printed in the run header. A resumed run plans again for its own ranks (the
// checkpoints load on any layout), so a job that lost or gained nodes continues on the best layout
// for what it has.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "app/config.h"
#include "plan/cluster.h"
#include "plan/layout.h"

namespace tessera {

// The keys parallel.layout = "auto" chooses: set together with it (in the file or by --set) they
// are refused. train.micro_batch is not among them: 0 lets the planner choose, a value fixes it;
// train.dtype is the user's (it changes the numbers, not only the speed) and bounds the search.
const std::vector<std::string>& auto_layout_keys();

// Refuses parallel.layout = "auto" with one of auto_layout_keys() set (in the file or by --set) to
// a value other than its default. origin_of(key) says where a key was set ("file.toml:12", "--set")
// or nothing. The message names the key, its value and where it was set.
void check_auto_layout_keys(const Config& c, const std::function<std::optional<std::string>(const std::string&)>& origin_of);

// What the planner chose for a run, as every rank holds it.
struct AutoLayoutChoice {
  plan::Layout layout;
  int64_t ranks = 1;
  std::string cluster;          // its name, and where it came from (preset, file)
  double step_seconds = 0;      // predicted seconds per optimizer step
  double tokens_per_s = 0;      // predicted
  double memory_bytes = 0;      // the largest rank's estimate, as the memory check counts it
  double usable_bytes = 0;      // the device's usable memory on that cluster
  bool operator==(const AutoLayoutChoice&) const = default;
};

// One line of text and back, exactly (what rank 0 broadcasts). decode throws tessera::Error on a
// malformed text.
std::string encode_choice(const AutoLayoutChoice& c);
AutoLayoutChoice decode_choice(const std::string& text);

// parallel.cluster for `ranks` ranks: "local" (this machine's ranks, app/plan_command.h cluster_of),
// a preset or a [cluster] file. Throws tessera::Error naming parallel.cluster when it is neither.
plan::ClusterSpec auto_layout_cluster(const Config& cfg, int64_t ranks);

// The best layout the planner finds for `ranks` ranks of `cluster` (one process, no MPI). Throws
// tessera::Error saying why when no layout fits.
AutoLayoutChoice plan_auto_layout(const Config& cfg, int64_t ranks, const plan::ClusterSpec& cluster);

// Collective over comm: rank 0 plans for comm's size, every rank returns its choice (or throws the
// same tessera::Error as rank 0).
AutoLayoutChoice choose_auto_layout(const Config& cfg, MPI_Comm comm);

// The config the choice runs: the layout applied (app/plan_command.h apply_layout, which sets
// parallel.layout = "explicit"), so that the run directory's config.toml and the checkpoints'
// stored config read back as the layout that ran.
Config apply_auto_layout(const Config& cfg, const AutoLayoutChoice& c);

// The run header's line: "auto layout: dp 2 tp 1 ... on 2 x local: predicted 12.3 ms/step, ...".
std::string describe_choice(const AutoLayoutChoice& c);

}  // namespace tessera
