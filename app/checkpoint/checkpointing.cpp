// CheckpointWriter (snapshot, background write, rename, `latest`, pruning), run ids and resume.
#include "app/checkpoint/checkpointing.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "app/checkpoint/adapter_checkpoint.h"
#include "app/checkpoint/atomic_file.h"
#include "app/checkpoint/checkpoint_plan.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"
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

// A host copy of an F32 tensor on ex's device: what a save writes, or what a load reads into
// before upload_flat. On the CPU the same path copies host to host (the same bits).
std::vector<float> download_flat(const Exec& ex, const Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  if (host.empty()) return host;  // nothing trainable: no moments
  copy(ex, Tensor(host.data(), DType::F32, t.shape), t);
  synchronize(ex);
  return host;
}

// t (F32, on ex's device) = host, whole.
void upload_flat(const Exec& ex, const Tensor& t, std::vector<float>& host) {
  if (host.empty()) return;
  copy(ex, t, Tensor(host.data(), DType::F32, t.shape));
  synchronize(ex);
}

// This rank's slice of each parameter-shaped tensor, under prefix + name + suffix. A padded
// shard stores its real rows only: they come first in its local buffer. A pipeline stage declares
// only its own parameters (the other stages' ranks write theirs: the file holds the union); a
// stage_copy (the last stage's copy of a tied "wte.weight") is declared but never written, the
// owner's tensor being the one stored, so the write plan still checks that both agree on its shape.
// Moments (moments = true) lie at the layout of the trainable region, and frozen parameters have
// none.
void add_slices(std::vector<TensorSlice>& out, const ParameterStore& ps, const std::vector<float>& flat,
                const std::string& prefix, const std::string& suffix, const TrainingState& st, bool moments = false) {
  for (const ParamEntry& e : ps.entries()) {
    if (moments && e.frozen) continue;
    if (!moments && e.frozen && !st.writes_frozen_model) continue;  // an adapters-only checkpoint
    TensorSlice s;
    s.path = prefix + e.spec.name + suffix;
    s.global_shape = e.spec.global_shape;
    const bool sharded = e.sharded();
    s.dim = sharded ? e.spec.shard.dim : TensorSlice::kWhole;
    s.start = sharded ? e.shard_start : 0;
    s.local_shape = sharded ? e.stored_shape() : e.local_shape;
    s.data = flat.data() + e.offset - (moments ? ps.frozen_numel() : 0);
    s.write = st.writes_tensors && (sharded || st.writes_replicated) && !e.spec.stage_copy;
    out.push_back(s);
  }
}

// Writes text to path atomically: a fresh exclusive temporary, fsync, rename.
void write_atomically(const std::string& path, const std::string& text) {
  AtomicFile out(path);
  out.write(text);
  out.commit();
}

// Temporaries left by a process that died while saving (step_*.h5.tmp.<pid>.<random>,
// latest.tmp.<pid>.<random>, or the fixed .tmp names of older versions): never resumed from, so
// removed when a writer starts. unlink removes a symlink itself, never what it points to.
void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.find(".tmp");
    if (tmp == std::string::npos) continue;
    const std::string target = name.substr(0, tmp);
    const bool ours = target == "latest" || (target.rfind("step_", 0) == 0 && fs::path(target).extension() == ".h5");
    if (ours && is_temp_name_of(name, target) && !entry.is_directory(ec)) ::unlink(entry.path().c_str());
  }
}

// Checkpoints in dir (names as checkpoint_file_name writes them), newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (auto step = checkpoint_step(entry.path().filename().string())) found.emplace_back(*step, entry.path().string());
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

// Opens the file and reads every tensor (collective: all ranks reach the same verdict), so that a
// corrupted chunk is found before the run commits to this checkpoint.
bool verifies(const std::string& path, MPI_Comm comm, std::string& why) {
  try {
    CheckpointReader r(path, comm);
    verify_tensors(r, comm);
    return true;
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
}

// The file name `latest` holds, if it is a checkpoint name (anything else is ignored: `latest`
// never names a file outside its directory).
std::optional<std::string> latest_name(const std::string& dir) {
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (!(latest >> name)) return std::nullopt;
  if (name.find('/') != std::string::npos || !checkpoint_step(name)) return std::nullopt;
  return name;
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08ld.h5", static_cast<long>(step));
  return buf;
}

std::optional<int64_t> checkpoint_step(const std::string& name) {
  const size_t digits = name.size() - std::min(name.size(), std::strlen("step_") + std::strlen(".h5"));
  if (digits < 8 || digits > 18 || !name.starts_with("step_") || !name.ends_with(".h5")) return std::nullopt;
  const std::string number = name.substr(5, digits);
  if (!std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  const int64_t step = std::stoll(number);
  // Only the one spelling tessera writes: "step_000000042.h5" (9 digits) is not step 42's name.
  if (checkpoint_file_name(step) != name) return std::nullopt;
  return step;
}

std::string new_run_id() {
  uint64_t bits = 0;
  // getrandom(2): the kernel's entropy pool, never a time-seeded generator (two jobs started in
  // the same second on two nodes must differ). random_device reads the same pool if it fails.
  if (::getrandom(&bits, sizeof bits, 0) != static_cast<ssize_t>(sizeof bits))
    bits = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &utc);
  std::snprintf(buf + n, sizeof buf - n, "-%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep_last, MPI_Comm comm, CheckpointRun run)
    : dir_(std::move(dir)), keep_last_(keep_last), run_id_(std::move(run.id)), own_(std::move(run.files)) {
  MPI_Comm_dup(comm, &comm_);
  if (run_id_.empty()) run_id_ = broadcast_bytes(comm_, comm_rank(comm_) == 0 ? new_run_id() : "", 0);
  std::string error;
  if (comm_rank(comm_) == 0) {
    try {
      fs::create_directories(dir_);
      remove_stale_temporaries(dir_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  try {
    throw_if_any_failed(comm_, error);
  } catch (...) {
    MPI_Comm_free(&comm_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    failed_.store(false, std::memory_order_release);
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
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
  snap->meta.extra[kRunIdKey] = run_id_;
  snap->groups["/optim"]["step"] = st.optimizer.steps;
  snap->groups["/data"]["consumed_samples"] = st.consumed_samples;
  if (!st.seeds.empty()) snap->groups["/rng"] = st.seeds;
  if (!st.frozen.empty()) {
    std::string names;
    for (const std::string& n : st.frozen) names += (names.empty() ? "" : " ") + n;
    snap->groups["/optim"][kFrozenKey] = names;
  }
  for (const auto& [group, attrs] : st.extra_groups) snap->groups[group] = attrs;
  // The only part the training step waits for: copying the state to host memory.
  snap->params = download_flat(st.exec, st.params->flat_params());
  snap->exp_avg = download_flat(st.exec, st.optimizer.exp_avg);
  snap->exp_avg_sq = download_flat(st.exec, st.optimizer.exp_avg_sq);
  add_slices(snap->slices, *st.params, snap->params, "/model/", "", st);
  add_slices(snap->slices, *st.params, snap->exp_avg, "/optim/", "/exp_avg", st, true);
  add_slices(snap->slices, *st.params, snap->exp_avg_sq, "/optim/", "/exp_avg_sq", st, true);
  pending_path_ = (fs::path(dir_) / checkpoint_file_name(st.step)).string();
  thread_ = std::thread([this, snap] {
    try {
      write(snap);
    } catch (...) {
      error_ = std::current_exception();
      failed_.store(true, std::memory_order_release);
    }
  });
}

void CheckpointWriter::write(std::shared_ptr<Snapshot> snap) {
  const std::string final_path = (fs::path(dir_) / checkpoint_file_name(snap->step)).string();
  const bool lead = comm_rank(comm_) == 0;
  // A fresh name (never a file or symlink planted in advance), picked by rank 0 for all ranks.
  const std::string tmp = broadcast_bytes(comm_, lead ? unique_temp_name(final_path) : "", 0);
  write_checkpoint_file(tmp, snap->meta, snap->slices, comm_, snap->groups);
  std::string error;
  if (lead) {
    try {
      publish(tmp, final_path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  throw_if_any_failed(comm_, error);  // a failed rename or `latest` fails the save on every rank
}

// Rank 0, once every rank's part is on disk: rename into place, point `latest` at it, prune.
void CheckpointWriter::publish(const std::string& tmp, const std::string& final_path) {
  if (const char* pause = std::getenv("TESSERA_TEST_PAUSE_BEFORE_RENAME")) {
    // Test hook (tests/app/checkpoint/test_checkpointing.cpp): the file is written but not yet renamed;
    // announce it and wait to be killed.
    std::ofstream(pause) << tmp << "\n";
    for (;;) ::sleep(1);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    detail::fail("cannot rename ", tmp, " to ", final_path, ": ", std::strerror(err));
  }
  sync_directory(dir_);
  const std::string name = fs::path(final_path).filename().string();
  write_atomically((fs::path(dir_) / "latest").string(), name + "\n");
  prune(name);
}

// Deletes this run's checkpoints beyond the newest keep_last, newest meaning most recently saved:
// this process's saves, after the files of this run that were in the directory when it resumed
// (by step). Nothing else is ever deleted: not another run's files (a reused directory), not a
// name tessera does not write (step_best.h5), not a file that does not open, and never the file
// `latest` names, which is the one just saved.
void CheckpointWriter::prune(const std::string& latest) {
  std::erase(own_, latest);
  own_.push_back(latest);
  std::vector<std::string> kept;
  for (size_t i = 0; i < own_.size(); ++i) {
    if (i + static_cast<size_t>(keep_last_) >= own_.size() || own_[i] == latest) {
      kept.push_back(own_[i]);
      continue;
    }
    std::error_code ec;
    fs::remove(fs::path(dir_) / own_[i], ec);
    // A file that cannot be deleted costs disk space, not the run.
    if (ec) std::cerr << "warning: cannot delete old checkpoint " << (fs::path(dir_) / own_[i]).string() << ": "
                      << ec.message() << "\n";
  }
  own_ = std::move(kept);
}

std::optional<std::string> find_resume_checkpoint(const std::string& dir, const std::string& resume, MPI_Comm comm) {
  if (resume == "none") return std::nullopt;
  std::string why;
  if (resume != "auto") {
    TESSERA_CHECK(fs::exists(resume), "checkpoint.resume = \"", resume, "\": no such file");
    TESSERA_CHECK(opens_cleanly(resume, comm, why), "checkpoint.resume = \"", resume, "\": ", why);
    return resume;
  }
  // The ranks may not share one view of the directory (a lagging network file system): rank 0's
  // list is used by all.
  const bool lead = comm_rank(comm) == 0;
  std::vector<std::string> candidates;
  if (lead) {
    const auto latest = latest_name(dir);
    if (latest) {
      const std::string p = (fs::path(dir) / *latest).string();
      if (fs::exists(p))
        candidates.push_back(p);
      else
        std::cerr << "warning: `latest` in " << dir << " names " << *latest
                  << ", which does not exist; looking for the newest other checkpoint\n";
    }
    for (const auto& p : checkpoints_newest_first(dir))
      if (candidates.empty() || p != candidates[0]) candidates.push_back(p);
  }
  std::string list;
  for (const auto& p : candidates) list += p + '\n';
  std::istringstream shared(broadcast_bytes(comm, list, 0));
  for (std::string p; std::getline(shared, p);) {
    if (verifies(p, comm, why)) return p;
    if (lead) std::cerr << "warning: skipping checkpoint " << p << ": " << why << "\n";
  }
  return std::nullopt;
}

namespace {

struct FoundCheckpoint {
  std::string name;
  std::string run_id;  // "" for files written before run ids existed
};

std::string run_id_of(const CheckpointReader& r) {
  const auto it = r.meta().extra.find(kRunIdKey);
  return it != r.meta().extra.end() && std::holds_alternative<std::string>(it->second)
             ? std::get<std::string>(it->second)
             : "";
}

// The checkpoints in dir that open cleanly, oldest first, with their run ids. Each file is opened
// by this process alone (rank 0 of the job), so the other ranks need not take part.
std::vector<FoundCheckpoint> readable_checkpoints(const std::string& dir) {
  auto paths = checkpoints_newest_first(dir);
  std::reverse(paths.begin(), paths.end());
  std::vector<FoundCheckpoint> out;
  for (const auto& p : paths) {
    try {
      CheckpointReader r(p, MPI_COMM_SELF);
      out.push_back({fs::path(p).filename().string(), run_id_of(r)});
    } catch (const Error&) {
      // Not a checkpoint (junk under a checkpoint's name, a file cut short): nobody's, left alone.
    }
  }
  return out;
}

std::string refusal(const std::string& dir, const std::string& resume, const std::vector<FoundCheckpoint>& found) {
  std::map<std::string, std::vector<std::string>> by_run;
  for (const auto& f : found) by_run[f.run_id].push_back(f.name);
  std::ostringstream os;
  os << "checkpoint directory " << dir << " holds checkpoints of another run (";
  const char* sep = "";
  for (const auto& [id, names] : by_run) {
    os << sep << (id.empty() ? "written before run ids" : "run " + id) << ": ";
    for (size_t i = 0; i < names.size() && i < 6; ++i) os << (i ? ", " : "") << names[i];
    if (names.size() > 6) os << " and " << names.size() - 6 << " more";
    sep = "; ";
  }
  os << "), and this run would start fresh ("
     << (resume == "none" ? "checkpoint.resume = \"none\"" : "checkpoint.resume = \"auto\" found none it can resume")
     << "), so keep_last pruning and a later resume could mix the two runs. Set checkpoint.resume = \"auto\" to "
        "continue that run, or checkpoint.overwrite = true to start a new run here anyway (the other run's files "
        "are left in place and never pruned; a save at the same step replaces its file), or use another run "
        "directory (--run-dir or train.name) or checkpoint.dir";
  return os.str();
}

}  // namespace

RunStart start_run(const std::string& dir, const std::string& resume, bool overwrite, MPI_Comm comm) {
  RunStart start;
  start.resume_from = find_resume_checkpoint(dir, resume, comm);
  std::string error, id;
  if (comm_rank(comm) == 0) {
    try {
      const std::vector<FoundCheckpoint> found = readable_checkpoints(dir);
      if (start.resume_from) {
        id = run_id_of(CheckpointReader(*start.resume_from, MPI_COMM_SELF));
        if (id.empty()) {
          id = new_run_id();
          std::cerr << "note: " << *start.resume_from << " has no run id (written by an older tessera); this run "
                    << "continues as run " << id << ", and checkpoints without a run id are never pruned\n";
        }
        for (const auto& f : found)
          if (f.run_id == id) start.run.files.push_back(f.name);
      } else {
        if (!found.empty() && !overwrite) error = refusal(dir, resume, found);
        id = new_run_id();
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  throw_if_any_failed(comm, error);
  start.run.id = broadcast_bytes(comm, id, 0);
  return start;
}

namespace {
// Moments (moments = true): at the layout of the trainable region; a frozen parameter's are not
// read, and a trainable one's missing from the file (frozen when it was saved) are zero.
void read_entries(const CheckpointReader& r, const ParameterStore& ps, float* flat, const std::string& prefix,
                  const std::string& suffix, bool moments) {
  float* base = flat - (moments ? ps.frozen_numel() : 0);
  for (const ParamEntry& e : ps.entries()) {
    if (moments && e.frozen) continue;
    if (moments && !r.has(prefix + e.spec.name + suffix)) {
      std::fill(base + e.offset, base + e.offset + e.local_shape.numel(), 0.0f);
      continue;
    }
    const bool sharded = e.sharded();
    r.read(prefix + e.spec.name + suffix, sharded ? e.spec.shard.dim : TensorSlice::kWhole,
           sharded ? e.shard_start : 0, sharded ? e.stored_shape() : e.local_shape, base + e.offset);
  }
}

// flat (on ex's device) is read through a host copy of it: what no entry covers (padding) keeps
// its values.
void read_into(const Exec& ex, const CheckpointReader& r, const ParameterStore& ps, const Tensor& flat,
               const std::string& prefix, const std::string& suffix, bool moments = false) {
  std::vector<float> host = download_flat(ex, flat);
  read_entries(r, ps, host.data(), prefix, suffix, moments);
  upload_flat(ex, flat, host);
}

// The tensors a checkpoint of this model holds, with their global shapes: every rank's parameters
// (collective over comm). Under pipeline parallelism a rank holds one stage's; the union over the
// ranks is the whole model, so a tensor of another stage is neither missing nor unexpected, while
// one of no stage (a checkpoint of a deeper model) still is. A stage_copy adds nothing: its name
// is the owner's.
// A file's /optim@frozen: the parameters frozen when it was saved.
std::set<std::string> frozen_in(const CheckpointReader& r) {
  std::set<std::string> out;
  auto g = r.group_attributes().find("/optim");
  if (g == r.group_attributes().end()) return out;
  auto it = g->second.find(kFrozenKey);
  if (it == g->second.end() || !std::holds_alternative<std::string>(it->second)) return out;
  std::istringstream in(std::get<std::string>(it->second));
  for (std::string n; in >> n;) out.insert(n);
  return out;
}

// The moments of a parameter the file froze are neither expected nor read.
std::vector<std::pair<std::string, Shape>> expected_tensors(const ParameterStore& params, MPI_Comm comm,
                                                            const std::set<std::string>& frozen_in_file) {
  ckpt::ByteWriter mine;
  mine.i64(params.size());
  for (const ParamEntry& e : params.entries()) {
    mine.str(e.spec.name);
    mine.shape(e.spec.global_shape);
  }
  std::map<std::string, Shape> model;  // sorted: every rank lists the same tensors in the same order
  for (const std::string& bytes : allgather_bytes(comm, mine.bytes())) {
    ckpt::ByteReader in(bytes);
    for (int64_t n = in.i64(); n > 0; --n) {
      std::string name = in.str();
      Shape shape = in.shape();
      model.try_emplace(std::move(name), std::move(shape));
    }
  }
  std::vector<std::pair<std::string, Shape>> expected;
  for (const auto& [name, shape] : model) {
    expected.emplace_back("/model/" + name, shape);
    if (frozen_in_file.count(name)) continue;
    expected.emplace_back("/optim/" + name + "/exp_avg", shape);
    expected.emplace_back("/optim/" + name + "/exp_avg_sq", shape);
  }
  return expected;
}

int64_t int_attr(const GroupAttributes& g, const std::string& group, const std::string& key, const std::string& file) {
  auto it = g.find(group);
  TESSERA_CHECK(it != g.end() && it->second.count(key), file, ": attribute ", group, "@", key, " is missing");
  const AttrValue& v = it->second.at(key);
  TESSERA_CHECK(std::holds_alternative<int64_t>(v), file, ": attribute ", group, "@", key, " is not an integer");
  return std::get<int64_t>(v);
}
}  // namespace

RestoredState restore_training_state(const std::string& path, ParameterStore& params, AdamW& optimizer,
                                     MPI_Comm comm, const Exec& ex) {
  const RestoredState s = restore_training_state(path, params, optimizer_state(optimizer), comm, ex);
  optimizer.set_steps_taken(s.optimizer_steps);
  return s;
}

RestoredState restore_training_state(const std::string& path, ParameterStore& params, const OptimizerState& optimizer,
                                     MPI_Comm comm, const Exec& ex) {
  // An adapters-only LoRA checkpoint reads its base tensors from its base.
  const std::unique_ptr<CheckpointReader> reader = open_model_checkpoint(path, comm);
  const CheckpointReader& r = *reader;
  const std::set<std::string> frozen_before = frozen_in(r);
  check_shapes(r, expected_tensors(params, comm, frozen_before));
  std::string local_error;
  RestoredState s;
  try {
    read_into(ex, r, params, params.flat_params(), "/model/", "");
    const int64_t trainable = params.numel() - params.frozen_numel();
    TESSERA_CHECK(optimizer.exp_avg.numel() >= trainable && optimizer.exp_avg_sq.numel() >= trainable,
                  "restore_training_state: the moments' buffers are smaller than the ", trainable,
                  " trainable parameters");
    read_into(ex, r, params, optimizer.exp_avg, "/optim/", "/exp_avg", true);
    read_into(ex, r, params, optimizer.exp_avg_sq, "/optim/", "/exp_avg_sq", true);
    for (const ParamEntry& e : params.entries())
      if (!e.frozen && frozen_before.count(e.spec.name)) s.fresh_moments.push_back(e.spec.name);
  } catch (const Error& e) {
    local_error = e.what();
  }
  throw_if_any_failed(comm, local_error);  // a corrupt chunk seen by one rank stops them all
  s.groups = r.group_attributes();
  s.optimizer_steps = int_attr(r.group_attributes(), "/optim", "step", path);
  s.step = r.meta().step;
  s.consumed_samples = r.meta().consumed_samples;
  s.tokens_seen = r.meta().tokens_seen;
  s.config_toml = r.meta().config_toml;
  return s;
}

InitFromResult init_weights_from(const std::string& path, ParameterStore& params,
                                 const std::vector<std::pair<std::string, Shape>>& model_tensors,
                                 const std::vector<std::string>& prefixes, MPI_Comm comm, const Exec& ex) {
  CheckpointReader r(path, comm);
  const std::string model_group = "/model/";
  auto selected = [&](const std::string& name) {
    if (prefixes.empty()) return true;
    for (const std::string& p : prefixes)
      if (name.compare(0, p.size(), p) == 0) return true;
    return false;
  };
  std::ostringstream asked;  // the prefixes as the config writes them
  asked << "checkpoint.init_prefixes = [";
  for (size_t i = 0; i < prefixes.size(); ++i) asked << (i ? ", " : "") << '"' << prefixes[i] << '"';
  asked << "]";
  for (const std::string& p : prefixes) {
    bool in_model = false, in_file = false;
    for (const auto& [tensor, shape] : model_tensors)
      if (tensor.compare(0, model_group.size() + p.size(), model_group + p) == 0) in_model = true;
    for (const TensorInfo& t : r.tensors())
      if (t.path.compare(0, model_group.size() + p.size(), model_group + p) == 0) in_file = true;
    TESSERA_CHECK(in_model, asked.str(), ": \"", p, "\" matches no parameter of this model (global names such as "
                  "\"wte.weight\", \"blocks.0.attn.q.weight\", \"vision.patch.weight\", \"projector.fc1.weight\")");
    if (!in_file) {
      std::string held;  // the file's first few parameter names, to show what it does hold
      int n = 0;
      for (const TensorInfo& t : r.tensors())
        if (t.path.compare(0, model_group.size(), model_group) == 0 && n++ < 3)
          held += (held.empty() ? "" : ", ") + t.path.substr(model_group.size());
      throw Error(asked.str() + ": \"" + p + "\" matches no tensor of " + path + " (it holds " +
                  (held.empty() ? std::string("no /model tensors") : held + (n > 3 ? ", ..." : "")) + ")");
    }
  }
  InitFromResult out;
  std::vector<std::string> mismatches;
  for (const auto& [tensor, shape] : model_tensors) {
    const std::string name = tensor.substr(model_group.size());
    if (!selected(name) || !r.has(tensor)) {
      out.kept.push_back(name);
      continue;
    }
    const Shape stored = r.shape(tensor);
    if (stored != shape)
      mismatches.push_back(name + " is " + stored.str() + " in the file, " + shape.str() + " in this model");
    else
      out.loaded.push_back(name);
  }
  if (!mismatches.empty()) {
    std::string m = "checkpoint.init_from = \"" + path + "\" does not fit this model: " +
                    std::to_string(mismatches.size()) + " tensor(s) at another shape:";
    for (const std::string& line : mismatches) m += "\n  " + line;
    throw Error(m + "\n(select the tensors that fit with checkpoint.init_prefixes, or change the model to the file's)");
  }
  TESSERA_CHECK(!out.loaded.empty(), "checkpoint.init_from = \"", path, "\" holds none of this model's",
                prefixes.empty() ? std::string() : " selected (" + asked.str() + ")", " parameters");
  const std::set<std::string> load(out.loaded.begin(), out.loaded.end());
  std::string local_error;
  try {
    // Through a host copy of the flat buffer (on params' device): the tensors not loaded keep theirs.
    std::vector<float> host = download_flat(ex, params.flat_params());
    for (const ParamEntry& e : params.entries()) {
      if (!load.count(e.spec.name)) continue;
      const bool sharded = e.sharded();
      r.read(model_group + e.spec.name, sharded ? e.spec.shard.dim : TensorSlice::kWhole, sharded ? e.shard_start : 0,
             sharded ? e.stored_shape() : e.local_shape, host.data() + e.offset);
    }
    upload_flat(ex, params.flat_params(), host);
  } catch (const Error& e) {
    local_error = e.what();
  }
  throw_if_any_failed(comm, local_error);
  out.config_toml = r.meta().config_toml;
  return out;
}

}  // namespace tessera
