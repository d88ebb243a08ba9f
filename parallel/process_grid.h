// ProcessGrid: where each world rank sits in the (pp, dp, cp, tp) layout. Pure arithmetic, no MPI:
// computed once from the degrees and passed explicitly; the sub-communicators live in grid_comms.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// The degrees from the [parallel] config section. dp = -1: the rest of the world,
// world / (tp x cp x pp).
struct GridDegrees {
  int64_t tp = 1, cp = 1, pp = 1, dp = -1;
};

// One rank's position on each axis.
struct GridCoords {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
  bool operator==(const GridCoords&) const = default;
  std::string str() const;  // "(tp 1, cp 0, dp 2, pp 1)"
};

// Ranks are ordered tp fastest, then cp, then dp, then pp (Megatron's tp-cp-dp-pp order), so a
// tp group (the most bandwidth-hungry) is a run of consecutive ranks, i.e. one node:
//
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
//
// Worked example: 16 ranks, tp = 2, cp = 1, pp = 2, so dp = 16 / (2 x 1 x 2) = 4.
//
//   pp 0:  dp 0 -> {0, 1}   dp 1 -> {2, 3}     dp 2 -> {4, 5}     dp 3 -> {6, 7}
//   pp 1:  dp 0 -> {8, 9}   dp 1 -> {10, 11}   dp 2 -> {12, 13}   dp 3 -> {14, 15}
//          (each pair is a tp group: tp rank 0, then tp rank 1)
//
//   rank 13 = 1 + 2 x (0 + 1 x (2 + 4 x 1))  ->  (tp 1, cp 0, dp 2, pp 1)
//   tp group    {12, 13}           same cp, dp, pp; tp varies
//   cp group    {13}               cp = 1: alone
//   dp group    {9, 11, 13, 15}    same tp, cp, pp; dp varies
//   pp group    {5, 13}            same tp, cp, dp; pp varies (stage 0 sends to stage 1)
//   dp_cp group {9, 11, 13, 15}    same tp, pp: gradients are reduced over dp and cp together
//   tp_cp group {12, 13}           same dp, pp: one stage of one replica (cp = 1: the tp group)
//   embedding   {5, 13}            the first and the last stage of the pp group (pp = 2: all of it)
//
// With pp = 3 (12 ranks, tp = 2, cp = 1, pp = 3, so dp = 2) a middle stage holds no embedding:
//
//   rank 5 = 1 + 2 x (0 + 2 x 1)  ->  (tp 1, cp 0, dp 0, pp 1)
//   pp group    {1, 5, 9}          stages 0, 1, 2
//   embedding   {5}                a middle stage: alone (it has no embedding gradient to sum)
//   rank 9 (pp 2): embedding {1, 9}: the first stage's input embedding and the last stage's tied
//   LM head sum their gradients (Megatron's embedding group). pp = 1: every rank is alone in its own.
//
// Every group lists world ranks in ascending order, which is also the order of the varying
// coordinate(s): position i in dp_cp_group() is cp_rank + cp x dp_rank, in tp_cp_group()
// tp_rank + tp x cp_rank. Each kind of group partitions the world (every rank is in exactly one).
class ProcessGrid {
 public:
  // Throws tessera::Error (naming the parallel.* keys) when the degrees do not fit the world.
  ProcessGrid(const GridDegrees& degrees, int64_t world_size, int64_t world_rank);

  int64_t world_size() const { return world_size_; }
  int64_t rank() const { return rank_; }

  int64_t tp_size() const { return size_.tp; }
  int64_t cp_size() const { return size_.cp; }
  int64_t dp_size() const { return size_.dp; }
  int64_t pp_size() const { return size_.pp; }
  // The resolved degrees (dp filled in).
  GridDegrees degrees() const { return {size_.tp, size_.cp, size_.pp, size_.dp}; }

  const GridCoords& coords() const { return coords_; }
  int64_t tp_rank() const { return coords_.tp; }
  int64_t cp_rank() const { return coords_.cp; }
  int64_t dp_rank() const { return coords_.dp; }
  int64_t pp_rank() const { return coords_.pp; }

  GridCoords coords_of(int64_t rank) const;
  int64_t rank_of(const GridCoords& c) const;

  // World ranks of this rank's groups, ascending (see the example above).
  const std::vector<int64_t>& tp_group() const { return tp_group_; }
  const std::vector<int64_t>& cp_group() const { return cp_group_; }
  const std::vector<int64_t>& dp_group() const { return dp_group_; }
  const std::vector<int64_t>& pp_group() const { return pp_group_; }
  const std::vector<int64_t>& dp_cp_group() const { return dp_cp_group_; }
  const std::vector<int64_t>& tp_cp_group() const { return tp_cp_group_; }
  // {first stage, last stage} of the pp group for a rank on either; the rank alone otherwise (a
  // middle stage, or pp = 1).
  const std::vector<int64_t>& embedding_group() const { return embedding_group_; }

 private:
  struct Varying {
    bool tp = false, cp = false, dp = false, pp = false;
  };
  std::vector<int64_t> group_of(Varying v) const;

  GridCoords size_;  // the degree of each axis, stored per axis like a coordinate
  int64_t world_size_ = 1, rank_ = 0;
  GridCoords coords_;
  std::vector<int64_t> tp_group_, cp_group_, dp_group_, pp_group_, dp_cp_group_, tp_cp_group_, embedding_group_;
};

// dp filled in from the world size. Throws tessera::Error naming the parallel.* keys when a degree
// is out of range, when dp = -1 and tp x cp x pp does not divide the world, or when the product
// of the degrees is not the world size.
GridDegrees resolve_degrees(const GridDegrees& degrees, int64_t world_size);

// The model facts the layout must fit, as plain numbers (parallel/ knows no transformer types).
struct GridLimits {
  int64_t n_head = 1;
  int64_t n_kv_head = 0;  // 0 = n_head (as model.n_kv_head)
  int64_t n_layer = 1;
  int64_t virtual_stages = 1;  // model chunks per pipeline stage (parallel.vpp, interleaved 1F1B)
  int64_t seq_len = 2;         // train.seq_len
  int64_t vocab_size = 1;
  int64_t ffn_hidden = 0;          // 0: not checked
  bool sequence_parallel = false;  // parallel.sequence_parallel
};

// Checks the degrees against the world (resolve_degrees) and the model, throwing tessera::Error
// with a message naming the config keys and values:
//   tp x cp x pp x dp = world;  model.n_head % tp = 0;
//   model.n_kv_head % tp = 0, or, with fewer KV heads than tp (replicated), tp % n_kv_head = 0;
//   model.n_layer >= pp x virtual_stages (a block per chunk);  train.seq_len % (2 x cp) = 0 when cp > 1;
//   model.ffn_hidden % tp = 0;  (train.seq_len / cp) % tp = 0 under sequence parallelism.
// The vocabulary needs no divisibility: each tp rank holds ceil(V / tp) rows, the last padded.
void validate_grid(const GridDegrees& degrees, int64_t world_size, const GridLimits& limits);


}  // namespace tessera
