// ProcessGrid arithmetic and layout validation. Errors are user errors: they name the config keys
// (parallel.*, model.*, train.*) and their values, never our variables.
#include "parallel/process_grid.h"

#include <sstream>

#include "kernels/check.h"

namespace tessera {

std::string GridCoords::str() const {
  std::ostringstream os;
  os << "(tp " << tp << ", cp " << cp << ", dp " << dp << ", pp " << pp << ")";
  return os.str();
}

namespace {

void check_degree(const char* key, int64_t value) {
  TESSERA_CHECK(value >= 1, "parallel.", key, " = ", value, " must be at least 1");
}

void check_divisible(const char* what, int64_t value, const char* by, int64_t divisor) {
  TESSERA_CHECK(value % divisor == 0, what, " = ", value, " is not divisible by ", by, " = ", divisor);
}

void check_kv_heads(int64_t n_kv_head, int64_t tp) {
  if (n_kv_head >= tp) {
    check_divisible("model.n_kv_head", n_kv_head, "parallel.tp", tp);
    return;
  }
  TESSERA_CHECK(tp % n_kv_head == 0, "parallel.tp = ", tp, " is not a multiple of model.n_kv_head = ", n_kv_head,
                " (with fewer KV heads than tp ranks each KV head is replicated, so tp must be a multiple "
                "of n_kv_head)");
}

}  // namespace

GridDegrees resolve_degrees(const GridDegrees& d, int64_t world) {
  TESSERA_CHECK(world >= 1, "the world has ", world, " ranks");
  check_degree("tp", d.tp);
  check_degree("cp", d.cp);
  check_degree("pp", d.pp);
  TESSERA_CHECK(d.dp >= 1 || d.dp == -1, "parallel.dp = ", d.dp, " must be at least 1, or -1 (the rest of the world)");
  const int64_t model = d.tp * d.cp * d.pp;
  GridDegrees out = d;
  if (d.dp == -1) {
    TESSERA_CHECK(world % model == 0, "parallel.tp x parallel.cp x parallel.pp = ", d.tp, " x ", d.cp, " x ", d.pp,
                  " = ", model, " does not divide the ", world, " ranks mpirun started (parallel.dp = -1 takes the rest)");
    out.dp = world / model;
  }
  TESSERA_CHECK(model * out.dp == world, "parallel.tp x parallel.cp x parallel.pp x parallel.dp = ", d.tp, " x ", d.cp,
                " x ", d.pp, " x ", out.dp, " = ", model * out.dp, ", but mpirun started ", world, " ranks");
  return out;
}

void validate_grid(const GridDegrees& degrees, int64_t world, const GridLimits& m) {
  const GridDegrees d = resolve_degrees(degrees, world);
  check_divisible("model.n_head", m.n_head, "parallel.tp", d.tp);
  check_kv_heads(m.n_kv_head > 0 ? m.n_kv_head : m.n_head, d.tp);
  TESSERA_CHECK(m.virtual_stages >= 1, "parallel.vpp = ", m.virtual_stages, " must be at least 1");
  // Stages need not hold equal numbers of blocks (model/stage_cut.h cuts by cost), only one each.
  TESSERA_CHECK(m.n_layer >= d.pp * m.virtual_stages, "parallel.pp x parallel.vpp = ", d.pp, " x ", m.virtual_stages,
                " = ", d.pp * m.virtual_stages, " model chunks need at least one block each, but model.n_layer = ",
                m.n_layer);
  if (d.cp > 1) {
    TESSERA_CHECK(m.seq_len % (2 * d.cp) == 0, "train.seq_len = ", m.seq_len, " is not divisible by 2 x parallel.cp = 2 x ",
                  d.cp, " = ", 2 * d.cp, " (context parallel cuts the sequence into 2 x cp chunks)");
  }
  if (m.ffn_hidden > 0) check_divisible("model.ffn_hidden", m.ffn_hidden, "parallel.tp", d.tp);
  if (m.sequence_parallel && d.tp > 1 && d.cp == 1)
    TESSERA_CHECK(m.seq_len % d.tp == 0, "train.seq_len = ", m.seq_len, " is not divisible by parallel.tp = ", d.tp,
                  " (parallel.sequence_parallel shards the sequence over the tensor-parallel ranks)");
  if (m.sequence_parallel && d.tp > 1 && d.cp > 1 && m.seq_len % (2 * d.cp) == 0)
    TESSERA_CHECK(m.seq_len / d.cp % d.tp == 0, "train.seq_len / parallel.cp = ", m.seq_len, " / ", d.cp, " = ",
                  m.seq_len / d.cp, " positions per context-parallel rank are not divisible by parallel.tp = ", d.tp,
                  " (parallel.sequence_parallel shards each cp rank's positions over the tensor-parallel ranks)");
  TESSERA_CHECK(m.vocab_size >= 1, "model.vocab_size = ", m.vocab_size, " must be at least 1");
}


ProcessGrid::ProcessGrid(const GridDegrees& degrees, int64_t world_size, int64_t world_rank)
    : world_size_(world_size), rank_(world_rank) {
  const GridDegrees d = resolve_degrees(degrees, world_size);
  size_ = {d.tp, d.cp, d.dp, d.pp};
  TESSERA_CHECK(world_rank >= 0 && world_rank < world_size, "rank ", world_rank, " is outside a world of ", world_size);
  coords_ = coords_of(world_rank);
  tp_group_ = group_of({.tp = true});
  cp_group_ = group_of({.cp = true});
  dp_group_ = group_of({.dp = true});
  pp_group_ = group_of({.pp = true});
  dp_cp_group_ = group_of({.cp = true, .dp = true});
  tp_cp_group_ = group_of({.tp = true, .cp = true});
  const bool first_or_last = coords_.pp == 0 || coords_.pp == size_.pp - 1;
  embedding_group_ = first_or_last && size_.pp > 1 ? std::vector<int64_t>{pp_group_.front(), pp_group_.back()}
                                                   : std::vector<int64_t>{world_rank};
}

GridCoords ProcessGrid::coords_of(int64_t rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is outside a world of ", world_size_);
  GridCoords c;
  c.tp = rank % size_.tp;
  rank /= size_.tp;
  c.cp = rank % size_.cp;
  rank /= size_.cp;
  c.dp = rank % size_.dp;
  c.pp = rank / size_.dp;
  return c;
}

int64_t ProcessGrid::rank_of(const GridCoords& c) const {
  const bool inside = c.tp >= 0 && c.tp < size_.tp && c.cp >= 0 && c.cp < size_.cp && c.dp >= 0 && c.dp < size_.dp &&
                      c.pp >= 0 && c.pp < size_.pp;
  TESSERA_CHECK(inside, "coordinates ", c.str(), " are outside the grid ", size_.str());
  return c.tp + size_.tp * (c.cp + size_.cp * (c.dp + size_.dp * c.pp));
}

// The ranks that share this rank's coordinates on every axis that does not vary.
std::vector<int64_t> ProcessGrid::group_of(Varying v) const {
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < world_size_; ++r) {
    const GridCoords c = coords_of(r);
    const bool same = (v.tp || c.tp == coords_.tp) && (v.cp || c.cp == coords_.cp) && (v.dp || c.dp == coords_.dp) &&
                      (v.pp || c.pp == coords_.pp);
    if (same) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace tessera
