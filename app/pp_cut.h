// parallel.pp_cut = "measured": a short timing pass before training (each part of the model built
// alone on world rank 0, its forward + backward of one micro-batch timed, the median of a few
// repeats), broadcast, and the cut it gives (model/stage_cut_measured.h) under the memory limit,
// computed from the same numbers on every rank, so every rank holds the identical cut. With the
// interleaved schedule (parallel.vpp > 1) the cut is in the parallel.pp_layers form: each stage's
// vpp chunks hold the same number of blocks.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/memory_check.h"
#include "kernels/exec.h"
#include "model/config.h"
#include "model/stage_cut_measured.h"
#include "parallel/context_attention.h"
#include "parallel/tensor_parallel.h"

namespace tessera {

// Forward + backward repeats per part (after one warm-up run); the median is kept.
inline constexpr int kPpCutRepeats = 3;

// Each part's seconds for one micro-batch (train.micro_batch x train.seq_len tokens) on ex's
// device, in this process (tp = cp = 1, the run's dtype and recomputation), each part built as a
// stage of its own (model/gpt.h StageSpec) and timed forward + backward:
//   block l (0 < l < L - 1; a VLM's from l = 0): the stage {l, l + 1}, activations to activations;
//   the first block with the embedding (text: a stage starting at layer 0 holds it) and the last
//     block with the head (a stage ending at layer L holds it): the stages {0, 1} and {L - 1, L},
//     each split as the part = the stage's time less the mean of the blocks timed alone (none:
//     all on the block), the block = a block's time in place (below);
//   in place: the blocks timed alone run again as one stage, and every block's time is scaled to
//     that stage's (alone, a block's weights and saved activations stay in cache);
//   a VLM's embedding: the encoder's stage {0, 0} on text; its vision tower (and projector): the
//     same stage with one image per sequence, less that.
// A difference below zero (noise, a part far cheaper than a block) counts as 0.
PartTimes measure_part_times(const Config& cfg, const ModelConfig& mc, const Exec& ex, int repeats = kPpCutRepeats);

// The seconds of chunk `index` of a cut (chunk_blocks: blocks per chunk, model order; vpp = 1: per
// stage), built whole (its blocks, and the embedding, vision tower and head where it holds them)
// and timed as measure_part_times times a part: what the header prints beside the prediction (the
// sum of the parts; a stage's measured time is the sum of its chunks'). tp: the chunk's tensor-
// parallel group (collective over tp.comm: every rank of it times its shard together); {}: tp = 1.
// cp: likewise its context-parallel group (each rank runs its chunks of every sequence, cp.layout);
// {}: cp = 1.
double measure_stage_time(const Config& cfg, const ModelConfig& mc, const Exec& ex, const std::vector<int64_t>& chunk_blocks,
                          int64_t index, int repeats = kPpCutRepeats, const TensorParallel& tp = {},
                          const ContextParallel& cp = {});

struct MeasuredCut {
  PartTimes times;                      // the measured parts (rank 0's, broadcast)
  int64_t vpp = 1;                      // chunks per stage (parallel.vpp)
  std::vector<int64_t> blocks;          // the measured cut: blocks per stage (parallel.pp_layers' form)
  std::vector<double> predicted;        // its stage times from the parts (a stage: the sum of its chunks)
  std::vector<double> measured;         // the running cut's stages' chunks timed whole, summed (rank 0 only; empty elsewhere)
  // The FLOPs rule's cut (model/stage_cut.h), for comparison: blocks per chunk, model order (pp x vpp
  // entries; vpp = 1: per stage; with vpp > 1 its chunks need not be equal within a stage).
  std::vector<int64_t> flops_blocks;
  std::vector<double> flops_predicted;  // its stage times from the same parts
  // The step's makespan under the run's schedule, simulated (parallel/pipeline_sim.h) from the same
  // parts for the measured cut and the FLOPs cut (each chunk's forward, input gradient and weight
  // gradient a third of its time); 0 when the micro-batches per step are not known.
  double simulated_step = 0, flops_simulated_step = 0;
  int64_t micro_batches = 0;  // per step, for the simulation
  // The FLOPs cut's first stage over the memory limit the measured cut respects (-1: all fit).
  int64_t flops_unfit_stage = -1;
  // Which cut runs (choose_cut, model/stage_cut_measured.h): the FLOPs cut unless the measured cut is
  // predicted faster (simulated step, else slowest stage) or the FLOPs cut does not fit; and why.
  bool flops_kept = false;
  std::string choice;
  // The header's lines: the cut, which cut runs and why, predicted and measured stage times, the
  // FLOPs cut's prediction.
  std::string describe() const;
};

// Where the part times come from: measure_part_times on world rank 0 by default; tests inject
// skewed costs here (called on rank 0 only).
using PartTimer = std::function<PartTimes(const Config&, const ModelConfig&, const Exec&)>;

// The measured cut of cfg's model (mc, resolved) for parallel.pp stages of parallel.vpp chunks each,
// each stage's memory estimate (app/memory_check.h, stage r holding n blocks, for `layout`'s tp and dp)
// within this node's available memory (shared by its ranks; not checked with train.memory_check =
// false) and train.max_memory_gib. Collective over comm (MPI_COMM_NULL: one process): rank 0
// times, broadcasts the times, every rank cuts; an error on rank 0 is thrown on every rank. Which cut
// runs: MeasuredCut::flops_kept (choose_cut), the same on every rank.
// measure_stages: time the running cut's stages whole on rank 0 too (MeasuredCut::measured).
MeasuredCut measured_cut(const Config& cfg, const ModelConfig& mc, int64_t data_vocab_size, const MemoryLayout& layout,
                         const Exec& ex, MPI_Comm comm, const PartTimer& timer = {}, bool measure_stages = true);

// The trainer's wiring: with parallel.pp_cut = "measured" and parallel.pp > 1, the cut that runs
// written into cfg: the measured cut as parallel.pp_layers, or (flops_kept) parallel.pp_layers left
// empty, the FLOPs rule; pp_cut set to "flops" either way (the config from then on, the one
// checkpoints store, is the explicit equivalent, as train.micro_batch = 0 is stored resolved),
// returning the header's lines; otherwise cfg unchanged and "". timer: as for measured_cut.
std::string apply_measured_cut(Config& cfg, const ModelConfig& mc, int64_t data_vocab_size, const MemoryLayout& layout,
                               const Exec& ex, MPI_Comm comm, const PartTimer& timer = {});

}  // namespace tessera
