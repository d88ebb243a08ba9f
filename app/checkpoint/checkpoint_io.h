// Checkpoint files (docs/checkpoints.md): one HDF5 file holding every tensor at its global shape,
// written collectively with MPI-IO where each rank writes only its slices (one replica per
// element), chunked with Fletcher32 checksums so corruption is caught on read. This is the file
// layer only: what to save, temporary names, `latest` and resume belong to the trainer.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "app/checkpoint/hdf5.h"
#include "kernels/tensor.h"

namespace tessera {

// The format this build writes and the newest it reads.
inline constexpr int64_t kCheckpointFormatVersion = 1;

using AttrValue = std::variant<int64_t, double, std::string>;
using AttrMap = std::map<std::string, AttrValue>;
// Attributes of groups other than /meta, by group path: {"/optim", {{"step", int64_t{100}}}}.
using GroupAttributes = std::map<std::string, AttrMap>;

// This rank's part of a global float32 tensor stored at `path` (e.g. "/model/wte.weight"):
//   dim >= 0:     the hyperslab [start, start + local_shape[dim]) along dim, whole along the others
//                 (a tensor-parallel shard);
//   dim = kWhole: the whole tensor (local_shape may be left empty);
//   dim = kFlat:  elements [start, start + local_shape[0]) of the tensor's row-major flattening,
//                 local_shape = {count} (a ZeRO-1 shard of a flat buffer, which may cut rows).
// data is row-major over the selection. write = false marks a replica that another rank writes:
// it declares the tensor but writes nothing. Across all ranks the written slices must cover each
// tensor exactly once.
struct TensorSlice {
  static constexpr int kWhole = -1;
  static constexpr int kFlat = -2;
  std::string path;
  Shape global_shape;
  int dim = kWhole;
  int64_t start = 0;
  Shape local_shape;
  const float* data = nullptr;
  bool write = true;
};

// The /meta group. extra holds any further scalars (seeds, ...); its names must differ from the
// fixed ones.
struct CheckpointMeta {
  int64_t format_version = kCheckpointFormatVersion;
  std::string tessera_version = TESSERA_VERSION;
  int64_t step = 0;
  int64_t tokens_seen = 0;
  int64_t consumed_samples = 0;
  std::string config_toml;  // the run's config, TOML text
  AttrMap extra;
  bool operator==(const CheckpointMeta&) const = default;
};

// Writes a checkpoint to exactly `path`, which must not exist: rank 0 creates it exclusively (a
// file or symlink already there is an error, never written through) and reserves disk space for
// the whole file before HDF5 writes anything, so a full disk fails here, on every rank at once.
// Collective over comm: every rank calls it with its own slices (several slices of one tensor are
// allowed, also on one rank); the tensors created are the union over ranks, each at its global
// shape. meta and groups are taken from rank 0; /meta@checksum covers them and the tensor list.
// The slices are checked before anything is written (shapes, bounds, exact cover); any error, on
// any rank, is thrown on every rank with the same message (and the file is removed). On return
// the file is flushed, closed and fsync'ed.
void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta, const std::vector<TensorSlice>& slices,
                           MPI_Comm comm, const GroupAttributes& groups = {});

// One process writing tensors it makes one at a time (tessera upscale): the tensors are declared
// up front (path, global shape), and produce(path) returns the whole tensor, row-major, just before
// it is written, so at most one is held in memory. Otherwise as write_checkpoint_file (on
// MPI_COMM_SELF); a tensor of the wrong size, or an error thrown by produce, removes the file.
using TensorProducer = std::function<std::vector<float>(const std::string& path)>;
void write_checkpoint_file_streamed(const std::string& path, const CheckpointMeta& meta,
                                    const std::vector<std::pair<std::string, Shape>>& tensors,
                                    const TensorProducer& produce, const GroupAttributes& groups = {});

struct TensorInfo {
  std::string path;   // "/model/wte.weight"
  Shape shape;
  std::string dtype;  // "float32" (the only type tessera writes), "float64", "int32", ...
};

// An open checkpoint file, validated on open (HDF5 readable, /meta present, format version
// supported, and the metadata checksum /meta@checksum matching when the file has one: files
// written before it existed have none and load as before). Construction is collective over comm (ranks agree on open errors, so all fail
// together); each rank then opens the file independently, so reads and destruction are
// independent: a rank that fails a read can never leave the others waiting in a collective close.
// Errors name the file and the tensor; a corrupted chunk reads as a checksum mismatch.
class CheckpointReader {
 public:
  CheckpointReader(const std::string& path, MPI_Comm comm);
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const CheckpointMeta& meta() const { return meta_; }
  // Attributes of every group except /meta that has any (e.g. /optim: step).
  const GroupAttributes& group_attributes() const { return groups_; }
  // Every dataset in the file, sorted by path.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& path) const;
  Shape shape(const std::string& path) const;  // throws if absent

  // Reads a selection, as TensorSlice defines it (dim >= 0, kWhole or kFlat), into out (row-major).
  // local_shape must match the stored shape along every other dimension: a differing shape is an
  // error naming both.
  void read(const std::string& path, int dim, int64_t start, const Shape& local_shape, float* out) const;
  std::vector<float> read_all(const std::string& path) const;

  // An adapters-only checkpoint (lora.checkpoint = "adapters", app/checkpoint/adapter_checkpoint.h):
  // every /model tensor of base this file lacks (the frozen base model) is listed, shaped and read
  // as if this file held it, from base. Nothing else of base is seen (its meta, groups, /optim).
  void use_model_base(std::unique_ptr<CheckpointReader> base);
  // The file whose /model tensors stand in for those this one lacks (null: none).
  const CheckpointReader* model_base() const { return base_.get(); }
  // Whether path is read from the base (listed by tensors() but not stored in this file).
  bool from_base(const std::string& path) const { return from_base_.count(path) > 0; }

 private:
  const TensorInfo& info(const std::string& path) const;
  std::unique_ptr<CheckpointReader> base_;
  std::set<std::string> from_base_;
  std::string path_;
  H5File file_;
  CheckpointMeta meta_;
  GroupAttributes groups_;
  std::vector<TensorInfo> tensors_;
};

// Reads every float32 tensor of the file whole (in blocks of at most 64 MiB), so that every
// chunk's checksum is verified, the tensors shared out between the ranks of comm so that each is
// read once. Collective: a corrupted chunk found by any rank is thrown on every rank, with the
// message naming the file and the tensor. resume = auto runs it on a candidate before using it.
void verify_tensors(const CheckpointReader& reader, MPI_Comm comm);

// Compares the checkpoint's tensors with the expected (path, shape) list. Returns one line per
// mismatch, ready to print: "missing /model/x (expected (4, 8))", "/model/y has shape (4, 8) in
// the checkpoint, expected (4, 16)", "unexpected /model/z (4, 4)". A tensor is unexpected when it
// is not listed but lies in a top-level group (/model, /optim, ...) that some expected path uses.
std::vector<std::string> compare_shapes(const CheckpointReader& reader,
                                        const std::vector<std::pair<std::string, Shape>>& expected);
// Throws one tessera::Error listing every mismatch, e.g. when a config does not fit a checkpoint.
void check_shapes(const CheckpointReader& reader, const std::vector<std::pair<std::string, Shape>>& expected);

}  // namespace tessera
