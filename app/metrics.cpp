// JSON records, the metrics file and the progress line.
#include "app/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "kernels/check.h"
#include "parallel/host_sums.h"
#include "parallel/tp_compression.h"

namespace tessera {

namespace {
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";  // JSON has no NaN/Inf
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}
}  // namespace

JsonRecord& JsonRecord::add(const std::string& key, double value) {
  fields_.emplace_back(key, json_number(value));
  return *this;
}
JsonRecord& JsonRecord::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}
JsonRecord& JsonRecord::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, json_string(value));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, const std::vector<double>& values) {
  std::string a = "[";
  for (size_t i = 0; i < values.size(); ++i) a += (i ? ", " : "") + json_number(values[i]);
  fields_.emplace_back(key, a + "]");
  return *this;
}

std::string JsonRecord::str() const {
  std::string s = "{";
  for (size_t i = 0; i < fields_.size(); ++i) s += (i ? ", " : "") + json_string(fields_[i].first) + ": " + fields_[i].second;
  return s + "}";
}

void add_pipeline_times(JsonRecord& rec, const PipelineBubble& b) {
  rec.add("pp_bubble_fraction", b.bubble_fraction)
      .add("pp_step_s", b.makespan)
      .add("pp_busy_s", b.busy)
      .add("pp_idle_s", b.idle)
      .add("pp_wait_s", b.wait);
}

void add_memory_peaks(JsonRecord& rec, const Allocator& alloc, Communicator* pp) {
  const int64_t n = pp ? pp->size() : 1, rank = pp ? pp->rank() : 0;
  // [category][rank], this rank's column filled: the sum is a gather.
  // (the last row: each stage's whole peak, which the categories' peaks, reached at different times, do not sum to)
  std::vector<double> all(static_cast<size_t>((kNumMemCategories + 1) * n), 0.0);
  for (int c = 0; c < kNumMemCategories; ++c)
    all[static_cast<size_t>(c * n + rank)] = static_cast<double>(alloc.counter(static_cast<MemCategory>(c)).peak);
  all[static_cast<size_t>(kNumMemCategories * n + rank)] = static_cast<double>(alloc.total_peak());
  sum_over_group(all, pp);
  for (int c = 0; c < kNumMemCategories; ++c)
    rec.add(std::string("peak_bytes_") + mem_category_name(static_cast<MemCategory>(c)),
            std::vector<double>(all.begin() + c * n, all.begin() + (c + 1) * n));
  rec.add("peak_bytes_by_stage", std::vector<double>(all.end() - n, all.end()));
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  TESSERA_CHECK(out_.is_open(), "cannot open ", path, " for writing");
}

void MetricsWriter::write(const JsonRecord& r) {
  if (!out_.is_open()) return;
  out_ << r.str() << '\n';
  out_.flush();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(s / 3600), static_cast<long>(s / 60 % 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(s / 60), static_cast<long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lds", static_cast<long>(s));
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

ProgressPrinter::ProgressPrinter(const std::string& mode, bool enabled) : enabled_(enabled) {
  tty_ = enabled && (mode == "tty" || (mode == "auto" && isatty(STDOUT_FILENO)));
}

void ProgressPrinter::step(const StepStats& s, bool record) {
  if (!enabled_) return;
  char buf[320];
  const int width = static_cast<int>(std::to_string(s.total_steps).size());
  std::snprintf(buf, sizeof buf,
                "step %*ld/%ld | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | MFU %.1f%% | mem %s | ETA %s", width,
                static_cast<long>(s.step), static_cast<long>(s.total_steps), s.loss, s.lr, s.grad_norm,
                format_rate(s.tokens_per_s).c_str(), 100.0 * s.mfu, s.memory.c_str(), format_duration(s.eta_s).c_str());
  if (tty_) {
    std::cout << "\r\033[K" << buf << std::flush;
    line_open_ = true;
  } else if (record) {
    std::cout << buf << std::endl;
  }
}

void ProgressPrinter::message(const std::string& text) {
  if (!enabled_) return;
  if (line_open_) std::cout << "\r\033[K";
  std::cout << text << std::endl;
  line_open_ = false;
}

void ProgressPrinter::finish() {
  if (line_open_) std::cout << std::endl;
  line_open_ = false;
}

void add_tp_compression_probe(JsonRecord& rec, const TpCompression& c) {
  int sites = 0;
  for (const auto& [slot, e] : c.probe_errors()) sites = std::max(sites, slot.site + 1);
  for (TpDirection d : {TpDirection::Forward, TpDirection::Backward})
    for (bool leave : {false, true}) {
      std::vector<double> errors(static_cast<size_t>(sites), std::nan("")), summed = errors;
      bool any = false;
      for (const auto& [slot, e] : c.probe_errors())
        if (slot.direction == d && slot.leave == leave && slot.site >= 0 && e.exact2 > 0) {
          errors[static_cast<size_t>(slot.site)] = std::sqrt(e.error2 / e.exact2);
          summed[static_cast<size_t>(slot.site)] = e.summed_relative_error();
          any = true;
        }
      const std::string key = std::string(d == TpDirection::Forward ? "forward_" : "backward_") + (leave ? "leave" : "enter");
      if (any) {
        rec.add("tp_comm_rel_error_" + key, errors);
        rec.add("tp_comm_rel_error_summed_" + key, summed);
      }
    }
  const std::vector<int64_t>& h = c.probe_histogram();
  rec.add("tp_comm_value_hist", std::vector<double>(h.begin(), h.end()));
}

}  // namespace tessera
