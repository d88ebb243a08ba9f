// Training output: metrics.jsonl (one JSON object per line, for scripts and plots) and the
// progress line (updated in place on a terminal, plain lines otherwise).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/allocator.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_timing.h"

namespace tessera {
class TpCompression;  // parallel/tp_compression.h


// One JSON object: numeric and string fields in insertion order.
class JsonRecord {
 public:
  JsonRecord& add(const std::string& key, double value);
  JsonRecord& add(const std::string& key, int64_t value);
  JsonRecord& add(const std::string& key, const std::string& value);
  JsonRecord& add(const std::string& key, const std::vector<double>& values);  // a JSON array
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// The pipeline's measured bubble (parallel/pipeline_timing.h says what is measured), per step:
// pp_bubble_fraction, pp_step_s (the makespan), and per pipeline rank pp_busy_s, pp_idle_s and
// pp_wait_s (the part of idle spent waiting on p2p transfers).
void add_pipeline_times(JsonRecord& rec, const PipelineBubble& b);

// The allocator's peak bytes per memory category since the run started, one entry per pipeline
// rank (one without pp): "peak_bytes_params": [rank 0, rank 1, ...], likewise grads, optim, acts,
// workspace and comm. Collective over `pp` (null: this rank alone).
void add_memory_peaks(JsonRecord& rec, const Allocator& alloc, Communicator* pp);

// parallel.tp_comm_compression_probe: per edge and direction, the relative error (||compressed -
// exact|| / ||exact|| over the run so far) of each site's collective, indexed by site (a block's
// attention 2 l, its MLP 2 l + 1; NaN where a site has none), as tp_comm_rel_error_{forward,
// backward}_{enter,leave}; the same of the results summed over the calls (what error feedback
// keeps small) as tp_comm_rel_error_summed_*; and tp_comm_value_hist, the probe's histogram (parallel/tp_compression.h).
void add_tp_compression_probe(JsonRecord& rec, const TpCompression& c);

// Appends records to <run dir>/metrics.jsonl, flushed per line so a killed run keeps its history.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  MetricsWriter(const std::string& path, bool append);
  void write(const JsonRecord& r);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

struct StepStats {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, elapsed_s = 0, eta_s = 0;
  std::string memory;
};

// Prints one line per call; on a terminal the line is rewritten in place.
class ProgressPrinter {
 public:
  // mode: "auto" (terminal if stdout is one), "tty" or "lines". A printer that is not enabled
  // prints nothing (every rank but one in a parallel run).
  explicit ProgressPrinter(const std::string& mode, bool enabled = true);
  // On a terminal every call rewrites the line (a recorded step is kept on screen);
  // otherwise only recorded steps print.
  void step(const StepStats& s, bool record);
  bool live() const { return tty_; }
  // A message on its own line (evaluation results, warnings), keeping the progress line intact.
  void message(const std::string& text);
  void finish();

 private:
  bool tty_ = false;
  bool enabled_ = true;
  bool line_open_ = false;
};

std::string format_duration(double seconds);  // "2m31s"
std::string format_rate(double per_s);         // "45.1k"

}  // namespace tessera
