// The up-front memory check of `tessera train`: one rank's memory estimated from the config and the
// layout (the model from model/memory.h; gradients, optimizer state, token batches and checkpoint
// copies here) against the memory this node has available, before anything is allocated. A run
// that cannot fit is refused in a second with the estimate and the keys that shrink it, instead of
// being killed by the kernel after minutes of allocating.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "app/config.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {

// One line of the estimate.
struct MemoryItem {
  std::string what;         // "activations and temporaries of one micro-batch (8 x 64 tokens)"
  int64_t bytes = 0;
  bool allocator = false;   // counted by the Allocator (its peak is the progress line's `mem`)
  std::string keys;         // what shrinks it: "train.micro_batch, train.seq_len, ..."
};

// One rank's memory at its peak: the items add up (the largest transient alone is listed).
struct MemoryEstimate {
  std::vector<MemoryItem> items;
  int64_t total() const;
  int64_t allocator_bytes() const;  // the part the allocator counts: an estimate of its peak
};

struct MemoryLayout {
  int64_t tp = 1, dp = 1;
  bool checkpoints = true;  // checkpoints are written (their host copy lives beside training)
  // parallel.pp > 1: the pipeline rank whose memory is estimated; -1: the one that needs the most
  // (ranks sharing a node are then each counted at that rank's size).
  int64_t pp_rank = -1;
  // train.freeze resolved (app/freeze.h frozen_parameters): the global names of the parameters the
  // run does not train. They keep their parameter and gradient buffers (the store's flat buffers
  // hold every parameter) but get no AdamW moments, no ZeRO-1 gradient shard and no padding, and a
  // checkpoint copies no moments of theirs; empty: every parameter trains.
  std::set<std::string> frozen{};
  // Where the pipeline schedules walked come from: pipeline_schedule(pp, vpp, micro_batches, kind,
  // bubble, ahead) when empty; a caller estimating many layouts (the planner's search) passes a
  // cache of the same, so that each schedule is generated once. It must return that schedule.
  std::function<const Schedule&(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind, bool bubble,
                                int64_t ahead)>
      schedules{};
};

// data_vocab_size: the data's vocabulary (model.vocab_size = 0 takes it). Checked arithmetic:
// throws SizeOverflow (model/memory.h) for sizes beyond 64 bits; the config's validation calls it
// for that reason.
// Under pipeline parallelism (parallel.pp > 1) a rank holds its stage's chunks (model/stage_cut.h,
// parallel.pp_layers) and their parameters, gradients and moments only; its activations are those
// of the micro-batches in flight under parallel.pp_schedule, found by walking the rank's actions
// of the schedule generator (parallel/pipeline_schedule.h): each chunk's activations under
// model.recompute and model.recompute_layers (model/memory.h), plus what the pipeline holds for
// it: the received input activations (B, T_local, C) of a chunk without the embedding, the token
// ids of the one with the embedding and the targets of the one with the head, until the
// micro-batch's backward; the received output gradient from its receive; and every tensor the
// rank sent (forward outputs, input gradients), which the trainer keeps until the step's
// transfers end (parallel/schedule.h run_schedule).
MemoryEstimate estimate_training_memory(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout);

// model.recompute = "bubble" under pipeline parallelism: how many recomputed micro-batches (chunks of
// them, interleaved) the schedule may hold at once (parallel/pipeline_schedule.h recompute_ahead).
// model.recompute_ahead = K >= 1 asks for at most K, 0 for as many as the schedule can use (every
// backward's R: micro-batches x parallel.vpp). With train.max_memory_gib set, the result is the
// largest K' <= that whose estimate (of the rank that needs the most) fits the cap, at least 1 (a
// run whose estimate with 1 does not fit is refused by check_training_memory, as before). Without a
// cap, the request itself (0: micro-batches x vpp). Any other config: model.recompute_ahead as it
// is. The same on every rank (no collective).
int64_t recompute_ahead_within_cap(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout);
// cfg with model.recompute_ahead resolved so (the trainer's config, before anything reads it).
Config with_recompute_ahead(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout);

// What this process may still allocate: MemAvailable from /proc/meminfo, or the cgroup's limit
// minus its usage when that is lower. bytes < 0 when neither can be read.
// TESSERA_TEST_MEMORY_AVAILABLE=<bytes> replaces it (tests).
struct AvailableMemory {
  int64_t bytes = -1;
  std::string source;  // "MemAvailable in /proc/meminfo", "the cgroup limit (...)"
};
AvailableMemory available_host_memory();

// The refusal message when ranks_on_node ranks of this estimate need more than is available,
// "" when they fit (or when the available memory is unknown).
std::string memory_problem(const MemoryEstimate& e, int64_t ranks_on_node, const AvailableMemory& available);

// "" when the estimate fits train.max_memory_gib (0: no cap), else the refusal naming the key, the
// numbers, the largest items and parallel.cp.
std::string memory_cap_problem(const MemoryEstimate& e, double cap_gib);

// The trainer's check, collective over comm (MPI_COMM_NULL: one process): estimates, compares
// with this node's available memory (all ranks on the node share it) and, when it does not fit
// and train.memory_check is on, throws the same error on every rank. Returns the header line,
// "memory estimate: 1.21 GiB per rank (tensors 1.10 GiB, the progress line's mem) of 23.40 GiB
// available (MemAvailable in /proc/meminfo)",
// with a warning appended when it does not fit and the check is off.
std::string check_training_memory(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout,
                                  MPI_Comm comm);

// The share of the available memory an automatic micro-batch may take.
inline constexpr double kAutoMicroBatchMemoryShare = 0.5;

// train.micro_batch = 0 (automatic) resolved for a layout: the largest micro-batch that divides
// global_batch / dp and whose estimate fits kAutoMicroBatchMemoryShare of the memory this node
// has available (its ranks together; any size when that is unknown), the smallest such choice over the ranks of comm, so
// that every rank runs the same one (collective; MPI_COMM_NULL: one process). A config with a
// micro_batch of its own is returned as it is. Errors (global_batch not a multiple of dp) are
// thrown on every rank.
Config with_auto_micro_batch(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout, MPI_Comm comm);

}  // namespace tessera
