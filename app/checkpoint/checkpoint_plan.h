// Internals of app/checkpoint_io: slice geometry and the collective write plan. A slice becomes
// element boxes (one for a hyperslab, a few for a flat range); ranks exchange their boxes and every
// rank checks the same plan for exact cover, so all ranks reach the same verdict.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"

namespace tessera::ckpt {

// A box of a tensor's index space: [start[i], start[i] + count[i]) along each dimension.
struct Box {
  std::vector<int64_t> start, count;
  int64_t volume() const;
  bool overlaps(const Box& o) const;
};

// The elements a selection (dim, start, local_shape) of a tensor of shape `global` covers, as
// boxes in row-major order: concatenated, they are the selection's memory layout. The selection
// must be valid (selection_problem returned "").
std::vector<Box> selection_boxes(const Shape& global, int dim, int64_t start, const Shape& local);
// "" when the selection fits the tensor, else what is wrong, e.g. "slice [5, 9) along dimension 0
// is out of range". local_shape may be empty for dim = kWhole.
std::string selection_problem(const Shape& global, int dim, int64_t start, const Shape& local);
// Elements the selection holds.
int64_t selection_size(const Shape& global, int dim, const Shape& local);

// "" when path is a valid tensor or group path (absolute, outside the reserved /meta).
std::string path_problem(const std::string& path);

// Per tensor: its global shape and, by rank, the selections (each a list of boxes) the rank
// writes, in the rank's slice order. Sorted by path, so every rank walks it in the same order.
struct DatasetPlan {
  Shape shape;
  std::vector<std::vector<std::vector<Box>>> writes;
  size_t rounds() const;  // the most selections any rank writes: collective write calls needed
};
using WritePlan = std::map<std::string, DatasetPlan>;

// Collective: checks every rank's slices, gathers them and checks that each tensor is declared
// with one shape and covered exactly once. Errors are thrown on every rank with the same message.
WritePlan make_write_plan(const std::vector<TensorSlice>& slices, const GroupAttributes& groups, MPI_Comm comm);

// The chunk shape of a stored tensor: about kChunkElements elements (1 MiB of float32), whole
// along the trailing dimensions, as many leading rows as fit. The chunk is the unit of the
// Fletcher32 checksum and of parallel I/O.
inline constexpr int64_t kChunkElements = 1 << 18;
std::vector<int64_t> chunk_shape(const Shape& shape);

// An upper bound on the bytes of the HDF5 file that write_checkpoint_file makes from this plan
// and metadata: every chunk at full size with its checksum, plus a generous bound on HDF5's own
// structures (chunk index B-trees, object headers, groups, attributes), so that space reserved up
// front covers every byte written. Tested against real files (tests/app/checkpoint/test_checkpoint_io.cpp).
int64_t estimated_file_bytes(const WritePlan& plan, const CheckpointMeta& meta, const GroupAttributes& groups);

// Plain byte encoding for exchanging plans and metadata between ranks (same binary everywhere).
class ByteWriter {
 public:
  void i64(int64_t v);
  void f64(double v);
  void str(const std::string& s);
  void shape(const Shape& s);
  void attrs(const AttrMap& m);
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& in) : in_(in) {}
  int64_t i64();
  double f64();
  std::string str();
  Shape shape();
  AttrMap attrs();

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

std::string join(const std::vector<std::string>& lines, const std::string& sep);

}  // namespace tessera::ckpt
