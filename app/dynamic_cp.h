// The trainer's side of dynamic context parallelism (parallel.cp_mode = "dynamic", docs/parallel.md):
// the cost model measured at start (or read from parallel.cp_calibration), each micro-batch planned
// (parallel/dynamic_cp.h) and cut into this cp rank's passes (its whole rows as one batch, its share
// of each split subgroup's rows as another), and the step's plan and busy-time numbers for the
// metrics. The model's attention holds the CpSubgroupComm; a pass runs inside a CpSubgroupScope of
// its group, so the same model runs whole rows (no ring) and split rows (the subgroup's ring).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "app/config.h"
#include "data/dataset.h"
#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "model/gpt.h"
#include "parallel/context_attention.h"
#include "parallel/cp_subgroup.h"
#include "parallel/dynamic_cp.h"

namespace tessera {

// The calibration file a run writes into its directory (and parallel.cp_calibration reads).
inline constexpr const char* kCpCalibrationFile = "cp_calibration.toml";

// The document lengths of row r of a packed batch (runs of equal doc_start; the padding is one).
std::vector<int64_t> row_documents(const Batch& b, int64_t r);

// Rows `rows` of b as a batch (tokens, targets, documents and positions).
Batch batch_rows(const Batch& b, const std::vector<int64_t>& rows);

// The cost model in TOML ([cp_cost] token_s, pair_s, ring_step_s, ring_token_s) and back; reading
// is an Error naming the file and the key for a missing, non-numeric or negative value.
std::string cp_cost_toml(const CpCostModel& m);
CpCostModel read_cp_cost(const std::string& path);

// The checkpoint's record of the cost model a run planned with (token_s, pair_s, ring_step_s,
// ring_token_s, and the seq_len and cp it was measured for), so that a resume plans the same rows
// alike without parallel.cp_calibration.
inline constexpr const char* kDynamicCpGroup = "/dynamic_cp";
AttrMap cp_cost_record(const CpCostModel& m, int64_t seq_len, int64_t cp);
// The record's cost model when groups hold one measured for seq_len and cp; nullopt when there is no
// record or it was for another seq_len or cp (*why says which). A malformed record is an Error
// naming path and the attribute.
std::optional<CpCostModel> cp_cost_of(const GroupAttributes& groups, const std::string& path, int64_t seq_len,
                                      int64_t cp, std::string* why);

class DynamicCp {
 public:
  // Null unless parallel.cp_mode = "dynamic". cp: the grid's cp communicator (size >= 2); tp: the
  // tp group (null for tp = 1), whose ranks must plan alike (they run the same passes).
  static std::unique_ptr<DynamicCp> open(const Config& cfg, Communicator* cp, Communicator* tp = nullptr);

  CpSubgroupComm* comm() { return comm_.get(); }

  // A resumed run: the cost model of checkpoint `path`'s record, when it has one for this seq_len and
  // cp and parallel.cp_calibration is not set (the file, named by the user, wins); else calibrate
  // measures as for a fresh run.
  void resume_from(const GroupAttributes& groups, const std::string& path);
  // The record save_checkpoint writes (kDynamicCpGroup).
  AttrMap record() const { return cp_cost_record(cost_, length_, cp_->size()); }

  // The cost model: parallel.cp_calibration's, the resumed checkpoint's, or measured here
  // (collective over the cp group) by running passes of the model as the trainer's step runs them
  // (its subgroup selected, cp_share's positions; loss scale 0: the gradients are unchanged), the
  // median of 3 after a warm-up: one row of seq_len whole on every cp rank with one document and
  // with eight, and the one-document row split over each subgroup size the planner may use (every
  // aligned subgroup of that size at once, its ring's waits included); fit_cp_cost
  // (parallel/dynamic_cp.h) turns those timings, averaged over the cp group, into token_s and pair_s
  // and then ring_step_s and ring_token_s so that a split's predicted time matches its measured one.
  // The fit is broadcast from the cp group's first rank, then from the tp group's first rank (each
  // tp rank has its own cp group), so every rank plans alike. Collective over the cp and tp groups.
  // Returns the line the header prints (with each split size's measured and predicted time).
  std::string calibrate(const Config& cfg, const Gpt& model, const Exec& ex, Allocator& alloc);
  const CpCostModel& cost() const { return cost_; }
  // Where the cost model came from: the file, "checkpoint <path>", or "" (measured).
  const std::string& cost_from() const { return cost_from_; }
  void set_cost(const CpCostModel& m) { cost_ = m; }

  struct Pass {
    CpPlacement group;
    Batch batch;  // whole: its rows; split: this rank's share of its rows (load-balanced chunks)
  };
  // This cp rank's passes of micro-batch b (R, L), in cp_passes' order; the plan counted for the
  // metrics.
  std::vector<Pass> passes(const Batch& b);
  // A pass of b's first row with no targets: run by a cp rank whose step has no pass at all, so that
  // it still takes part in the gradient reduction (its contribution is zero).
  Pass idle_pass(const Batch& b) const;

  // Seconds this rank spent in its passes' forwards and backwards (added by the trainer).
  void add_busy(double s) { busy_s_ += s; }

  // Since the last take_window: rows split and whole per step, the plans' predicted imbalance
  // (mean), the cost model's seconds per step of the slowest cp rank's passes (the sum over the
  // micro-batches of each plan's slowest rank) under these plans and under static cp's (every row
  // split over the whole group), and the measured busy seconds per step: this rank's, the slowest
  // cp rank's, and max / mean - 1 over the cp group (collective over the cp group).
  struct Window {
    double rows_split = 0, rows_whole = 0, predicted_imbalance = 0, predicted_s = 0, predicted_static_s = 0;
    double busy_s = 0, busy_max_s = 0, busy_imbalance = 0;
  };
  Window take_window(int64_t steps);
  // Rows planned since the start, and how many of them were split (never reset: tests read them).
  int64_t rows_planned() const { return rows_total_; }
  int64_t rows_split_total() const { return split_total_; }

 private:
  std::unique_ptr<CpSubgroupComm> comm_;
  Communicator* cp_ = nullptr;
  Communicator* tp_ = nullptr;
  int64_t length_ = 0;
  CpCostModel cost_;
  std::string cost_from_;  // where cost_ came from ("" until known: calibrate measures)
  std::string resume_note_;  // why a resumed run measures again (the checkpoint's record did not fit)
  int64_t plans_ = 0, split_ = 0, whole_ = 0;
  double imbalance_sum_ = 0, busy_s_ = 0, predicted_s_ = 0, predicted_static_s_ = 0;
  int64_t rows_total_ = 0, split_total_ = 0;
};

}  // namespace tessera
