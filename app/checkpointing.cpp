// CheckpointWriter (snapshot, background write, rename, `latest`, pruning) and resume.
#include "app/checkpointing.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "kernels/check.h"
#include "parallel/mpi.h"

namespace tessera {

namespace fs = std::filesystem;

// A host copy of everything a file needs, owned by the writer thread.
struct CheckpointWriter::Snapshot {
  int64_t step = 0;
  CheckpointMeta meta;
  GroupAttributes groups;
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::vector<TensorSlice> slices;  // point into the vectors above
};

namespace {

std::vector<float> copy_flat(const Tensor& t) {
  const float* p = t.ptr<float>();
  return std::vector<float>(p, p + t.numel());
}

// This rank's slice of each parameter-shaped tensor, under prefix + name + suffix. A padded
// shard stores its real rows only: they come first in its local buffer.
void add_slices(std::vector<TensorSlice>& out, const ParameterStore& ps, const std::vector<float>& flat,
                const std::string& prefix, const std::string& suffix, const TrainingState& st) {
  for (const ParamEntry& e : ps.entries()) {
    TensorSlice s;
    s.path = prefix + e.spec.name + suffix;
    s.global_shape = e.spec.global_shape;
    const bool sharded = e.sharded();
    s.dim = sharded ? e.spec.shard.dim : TensorSlice::kWhole;
    s.start = sharded ? e.shard_start : 0;
    s.local_shape = sharded ? e.stored_shape() : e.local_shape;
    s.data = flat.data() + e.offset;
    s.write = st.writes_tensors && (sharded || st.writes_replicated);
    out.push_back(s);
  }
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes text to path atomically: a temp file, fsync, rename.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    TESSERA_CHECK(out.is_open(), "cannot write ", tmp);
    out << text;
  }
  fsync_path(tmp, O_RDONLY);
  fs::rename(tmp, path);
}

int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("step_", 0) != 0 || p.extension() != ".h5") return -1;
  return std::atoll(name.c_str() + 5);
}

// Complete checkpoints in dir, newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (step_of(entry.path()) >= 0) found.emplace_back(step_of(entry.path()), entry.path().string());
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

bool opens_cleanly(const std::string& path, MPI_Comm comm, std::string& why) {
  try {
    CheckpointReader r(path, comm);
    return true;
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08ld.h5", static_cast<long>(step));
  return buf;
}

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep_last, MPI_Comm comm)
    : dir_(std::move(dir)), keep_last_(keep_last) {
  MPI_Comm_dup(comm, &comm_);
  if (comm_rank(comm_) == 0) fs::create_directories(dir_);
  MPI_Barrier(comm_);
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  if (!pending_path_.empty()) last_path_ = std::exchange(pending_path_, "");
}

void CheckpointWriter::save(const TrainingState& st) {
  wait();
  auto snap = std::make_shared<Snapshot>();
  snap->step = st.step;
  snap->meta.step = st.step;
  snap->meta.consumed_samples = st.consumed_samples;
  snap->meta.tokens_seen = st.tokens_seen;
  snap->meta.config_toml = st.config_toml;
  snap->groups["/optim"]["step"] = st.optimizer.steps;
  snap->groups["/data"]["consumed_samples"] = st.consumed_samples;
  if (!st.seeds.empty()) snap->groups["/rng"] = st.seeds;
  // The only part the training step waits for: copying the state to host memory.
  snap->params = copy_flat(st.params->flat_params());
  snap->exp_avg = copy_flat(st.optimizer.exp_avg);
  snap->exp_avg_sq = copy_flat(st.optimizer.exp_avg_sq);
  add_slices(snap->slices, *st.params, snap->params, "/model/", "", st);
  add_slices(snap->slices, *st.params, snap->exp_avg, "/optim/", "/exp_avg", st);
  add_slices(snap->slices, *st.params, snap->exp_avg_sq, "/optim/", "/exp_avg_sq", st);
  pending_path_ = (fs::path(dir_) / checkpoint_file_name(st.step)).string();
  thread_ = std::thread([this, snap] {
    try {
      write(snap);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void CheckpointWriter::write(std::shared_ptr<Snapshot> snap) {
  const std::string final_path = (fs::path(dir_) / checkpoint_file_name(snap->step)).string();
  const std::string tmp = final_path + ".tmp";
  write_checkpoint_file(tmp, snap->meta, snap->slices, comm_, snap->groups);
  if (comm_rank(comm_) == 0) publish(tmp, final_path);
  MPI_Barrier(comm_);
}

// Rank 0, once every rank's part is on disk: rename into place, point `latest` at it, prune.
void CheckpointWriter::publish(const std::string& tmp, const std::string& final_path) {
  if (const char* pause = std::getenv("TESSERA_TEST_PAUSE_BEFORE_RENAME")) {
    // Test hook (tests/app/test_checkpointing.cpp): the file is written but not yet renamed;
    // announce it and wait to be killed.
    std::ofstream(pause) << tmp << "\n";
    for (;;) ::sleep(1);
  }
  fs::rename(tmp, final_path);
  fsync_path(dir_, O_RDONLY | O_DIRECTORY);
  write_atomically((fs::path(dir_) / "latest").string(), fs::path(final_path).filename().string() + "\n");
  const auto all = checkpoints_newest_first(dir_);
  for (size_t i = static_cast<size_t>(keep_last_); i < all.size(); ++i) fs::remove(all[i]);
}

std::optional<std::string> find_resume_checkpoint(const std::string& dir, const std::string& resume, MPI_Comm comm) {
  if (resume == "none") return std::nullopt;
  std::string why;
  if (resume != "auto") {
    TESSERA_CHECK(fs::exists(resume), "checkpoint.resume = \"", resume, "\": no such file");
    TESSERA_CHECK(opens_cleanly(resume, comm, why), "checkpoint.resume = \"", resume, "\": ", why);
    return resume;
  }
  std::vector<std::string> candidates;
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (latest >> name) candidates.push_back((fs::path(dir) / name).string());
  for (const auto& p : checkpoints_newest_first(dir))
    if (candidates.empty() || p != candidates[0]) candidates.push_back(p);
  for (const auto& p : candidates) {
    if (!fs::exists(p)) continue;
    if (opens_cleanly(p, comm, why)) return p;
    if (comm_rank(comm) == 0) std::cerr << "warning: skipping checkpoint " << p << ": " << why << "\n";
  }
  return std::nullopt;
}

namespace {
void read_into(const CheckpointReader& r, const ParameterStore& ps, const Tensor& flat, const std::string& prefix,
               const std::string& suffix) {
  float* base = flat.ptr<float>();
  for (const ParamEntry& e : ps.entries()) {
    const bool sharded = e.sharded();
    r.read(prefix + e.spec.name + suffix, sharded ? e.spec.shard.dim : TensorSlice::kWhole,
           sharded ? e.shard_start : 0, sharded ? e.stored_shape() : e.local_shape, base + e.offset);
  }
}

int64_t int_attr(const GroupAttributes& g, const std::string& group, const std::string& key, const std::string& file) {
  auto it = g.find(group);
  TESSERA_CHECK(it != g.end() && it->second.count(key), file, ": attribute ", group, "@", key, " is missing");
  const AttrValue& v = it->second.at(key);
  TESSERA_CHECK(std::holds_alternative<int64_t>(v), file, ": attribute ", group, "@", key, " is not an integer");
  return std::get<int64_t>(v);
}
}  // namespace

OptimizerState optimizer_state(const AdamW& optimizer) {
  return {optimizer.exp_avg(), optimizer.exp_avg_sq(), optimizer.steps_taken()};
}

RestoredState restore_training_state(const std::string& path, ParameterStore& params, AdamW& optimizer,
                                     MPI_Comm comm) {
  const RestoredState s = restore_training_state(path, params, optimizer_state(optimizer), comm);
  optimizer.set_steps_taken(s.optimizer_steps);
  return s;
}

RestoredState restore_training_state(const std::string& path, ParameterStore& params, const OptimizerState& optimizer,
                                     MPI_Comm comm) {
  CheckpointReader r(path, comm);
  std::vector<std::pair<std::string, Shape>> expected;
  for (const ParamEntry& e : params.entries()) {
    expected.emplace_back("/model/" + e.spec.name, e.spec.global_shape);
    expected.emplace_back("/optim/" + e.spec.name + "/exp_avg", e.spec.global_shape);
    expected.emplace_back("/optim/" + e.spec.name + "/exp_avg_sq", e.spec.global_shape);
  }
  check_shapes(r, expected);
  std::string local_error;
  try {
    read_into(r, params, params.flat_params(), "/model/", "");
    TESSERA_CHECK(optimizer.exp_avg.numel() >= params.numel() && optimizer.exp_avg_sq.numel() >= params.numel(),
                  "restore_training_state: the moments' buffers are smaller than the ", params.numel(), " parameters");
    read_into(r, params, optimizer.exp_avg, "/optim/", "/exp_avg");
    read_into(r, params, optimizer.exp_avg_sq, "/optim/", "/exp_avg_sq");
  } catch (const Error& e) {
    local_error = e.what();
  }
  throw_if_any_failed(comm, local_error);  // a corrupt chunk seen by one rank stops them all
  RestoredState s;
  s.optimizer_steps = int_attr(r.group_attributes(), "/optim", "step", path);
  s.step = r.meta().step;
  s.consumed_samples = r.meta().consumed_samples;
  s.tokens_seen = r.meta().tokens_seen;
  s.config_toml = r.meta().config_toml;
  return s;
}

}  // namespace tessera
