// The trainer's side of checkpoints: which state goes into a file (parameters, AdamW moments and
// step, data position, seeds, config, run id), the file names (step_00001000.h5, written under a
// fresh step_00001000.h5.tmp.<pid>.<random> name and renamed when complete; `latest` names the
// newest complete one), pruning to keep_last (this run's own files only), and which file a run
// resumes from. A file is written on a background thread from a host copy of the state, so
// training waits only for the copy. The format itself is app/checkpoint/checkpoint_io.h.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "kernels/exec.h"
#include "model/parameters.h"
#include "optim/adamw.h"

namespace tessera {

// OptimizerState (the moments a checkpoint holds) is optim/adamw.h's.

// The live state a checkpoint captures (views; copied by CheckpointWriter::save).
struct TrainingState {
  // The device context of params' and the optimizer's tensors (train.device): save() downloads them
  // through it, so the file is the same whatever device trained.
  Exec exec;
  const ParameterStore* params = nullptr;
  // The moments at the layout of params' trainable region [frozen_numel(), numel()) (the whole
  // buffer when nothing is frozen): frozen parameters have none, and none are written.
  OptimizerState optimizer;
  std::vector<std::string> frozen;  // the whole model's frozen parameters (global names): /optim@frozen
  GroupAttributes extra_groups;     // written as they are (the /upscale record a run carries on)
  int64_t step = 0;              // optimizer steps done
  int64_t consumed_samples = 0;  // samples drawn by the sampler (all ranks)
  int64_t tokens_seen = 0;
  std::string config_toml;
  AttrMap seeds;                 // stored under /rng
  bool writes_tensors = true;    // false on data-parallel replicas: one copy of each element is written
  bool writes_replicated = true; // false on tp ranks > 0: tensors every tp rank holds whole are written once
  // false (lora.checkpoint = "adapters", app/checkpoint/adapter_checkpoint.h): the frozen
  // parameters' /model tensors are left out; the base checkpoint the /lora record names holds them.
  bool writes_frozen_model = true;
};

// The /meta attribute naming the run a checkpoint belongs to (CheckpointMeta::extra).
inline constexpr const char* kRunIdKey = "run_id";

// A run as its checkpoint directory knows it: its id, made when the run starts fresh and inherited
// when it resumes, stored in every checkpoint it writes; and the checkpoints of this run already in
// the directory (a resumed run's, oldest first; known on rank 0), which pruning may delete.
struct CheckpointRun {
  std::string id;
  std::vector<std::string> files;  // file names in dir
};

class CheckpointWriter {
 public:
  // comm is duplicated: the writer thread's collective I/O never mixes with training's messages.
  // Collective. Creates dir and removes temporaries a killed process left there (one job per
  // directory: the run-directory lock, app/run_lock.h, is taken before). run.id empty: a new run id.
  CheckpointWriter(std::string dir, int64_t keep_last, MPI_Comm comm, CheckpointRun run = {});
  ~CheckpointWriter();  // waits for a pending write
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous write, copies the state, and writes it on the background thread.
  // A failed write (a full disk, ...) fails on every rank together (one CollectiveError): it is
  // rethrown by the next save() or wait(), which all ranks reach at the same step.
  void save(const TrainingState& state);
  // Blocks until the pending write has finished; rethrows its error.
  void wait();
  // Whether the background write has failed (wait() then rethrows it), without waiting: the
  // trainer's stop vote reads it each step, so a failed save ends the run at once.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  const std::string& dir() const { return dir_; }
  const std::string& run_id() const { return run_id_; }
  // The file the last finished save wrote.
  std::string last_path() const { return last_path_; }

 private:
  struct Snapshot;
  void write(std::shared_ptr<Snapshot> snap);
  void publish(const std::string& tmp, const std::string& final_path);
  void prune(const std::string& latest);
  std::string dir_;
  int64_t keep_last_;
  std::string run_id_;
  std::vector<std::string> own_;  // this run's checkpoint names in dir_, oldest first (rank 0)
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread thread_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  std::string last_path_, pending_path_;
};

// "step_00001000.h5"
std::string checkpoint_file_name(int64_t step);
// The step of a name checkpoint_file_name writes (^step_[0-9]{8}\.h5$, more digits only past step
// 99,999,999); nullopt for any other name (step_notes.h5, step_00000006_best.h5): only such names
// are listed, resumed from or pruned.
std::optional<int64_t> checkpoint_step(const std::string& file_name);
// A new run id: the UTC start time and 64 random bits from the kernel's entropy source,
// "20250131T120000Z-0123456789abcdef".
std::string new_run_id();
// The checkpoint to resume from: resume = "none" -> none; "auto" -> the file `latest` names, or
// else the newest checkpoint (checkpoint_step names only) in dir, whichever first passes a full
// check (it opens, its metadata checksum matches, every tensor chunk reads back with a valid
// checksum); each one skipped, a missing file `latest` names included, is reported with a warning
// naming it and why; none -> start fresh. Anything else -> that path, which must open (a damaged
// explicit path is an error). Collective over comm.
std::optional<std::string> find_resume_checkpoint(const std::string& dir, const std::string& resume, MPI_Comm comm);

// How a run starts in its checkpoint directory (collective over comm): the checkpoint it resumes
// from (find_resume_checkpoint) and the run it continues, whose id is read from that file; or,
// starting fresh, a new run. A fresh start in a directory holding checkpoints that open cleanly
// (another run's) is refused, naming them and the ways out, unless overwrite is set.
struct RunStart {
  std::optional<std::string> resume_from;
  CheckpointRun run;
};
RunStart start_run(const std::string& dir, const std::string& resume, bool overwrite, MPI_Comm comm);

struct RestoredState {
  int64_t step = 0, consumed_samples = 0, tokens_seen = 0;
  int64_t optimizer_steps = 0;  // AdamW's bias corrections continue from here
  std::string config_toml;      // the resolved config of the run that saved it
  GroupAttributes groups;       // the file's group attributes (/optim, /data, /upscale, ...)
  std::vector<std::string> fresh_moments;  // trainable parameters whose moments the file lacked
};

// The /optim attribute listing the parameters a run froze (space-separated global names).
inline constexpr const char* kFrozenKey = "frozen";
// Loads the parameters and the moments into this rank's tensor-parallel shards (moments: into
// optimizer's tensors, whose steps are ignored, at the layout of params' trainable region; a frozen
// parameter's stored moments are not read, and a trainable one's that the file lacks because it
// was frozen when saved (listed in /optim@frozen) start at zero, reported in `fresh_moments`), after checking every shape against the model (all
// mismatches listed in one error). Collective over comm, whose ranks together hold the model: a
// pipeline stage loads its own parameters (the others' tensors are expected, not its own), and a
// stage_copy (the last stage's tied "wte.weight") is filled from the stored tensor of its name.
// The tensors may be on a device (ex: their context): each flat buffer is read through a host copy
// and uploaded (on the CPU the same path, host to host), so a file resumes on any device.
RestoredState restore_training_state(const std::string& path, ParameterStore& params, const OptimizerState& optimizer,
                                     MPI_Comm comm, const Exec& ex = Exec::cpu());
// The same into a replicated AdamW, whose step count is set too.
RestoredState restore_training_state(const std::string& path, ParameterStore& params, AdamW& optimizer,
                                     MPI_Comm comm, const Exec& ex = Exec::cpu());

// checkpoint.init_from: a fresh run's parameters taken from another checkpoint's /model tensors,
// weights only (no moments, step or data position are read). model_tensors is the whole model's
// (every pipeline stage's) global tensors, "/model/<name>" with its shape (model_tensor_shapes).
// Selected: the names starting with one of prefixes ([] = every one). A selected tensor the file
// has is read into this rank's shard (its stage's; a stage_copy from the tensor of its name); one
// the file lacks keeps its initialization. Refused, before anything is read, naming the file: a
// selected tensor stored at another shape (every one listed, both shapes), a prefix matching no
// tensor of the model or none of the file, and a file sharing no selected tensor with the model.
// Collective over comm (a read error on any rank is thrown on every rank).
struct InitFromResult {
  std::vector<std::string> loaded;  // global names read from the file, sorted
  std::vector<std::string> kept;    // selected or not, the model's names left at their initialization
  std::string config_toml;          // the config of the run that saved the file ("" if none)
};
InitFromResult init_weights_from(const std::string& path, ParameterStore& params,
                                 const std::vector<std::pair<std::string, Shape>>& model_tensors,
                                 const std::vector<std::string>& prefixes, MPI_Comm comm,
                                 const Exec& ex = Exec::cpu());  // params' device context, as restore_training_state

}  // namespace tessera
