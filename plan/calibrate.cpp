// The local calibration of plan/calibrate.h: each measurement on every rank at once, between
// barriers, through the kernels and the communicator training uses.
#include "plan/calibrate.h"
#include "plan/calibrate_ops.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend_info.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_grid.h"

namespace tessera::plan {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The mean of a value over the ranks.
double mean_over(MPI_Comm world, double v) {
  double sum = 0;
  check_mpi(MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, world), "MPI_Allreduce");
  return sum / comm_size(world);
}

// Seconds per run of f: after a warm-up, every rank runs f the same number of times back to back,
// at least min_seconds on the slowest rank, all starting together (the load training puts on the
// machine); the mean per run, averaged over the ranks. On a device the clock is read after
// synchronize(ex): the kernels' time, not their launches'.
double timed_mean(MPI_Comm world, const CalibrationDevice& device, double min_seconds, const std::function<void()>& f) {
  const Exec& ex = device.ex;
  f();
  synchronize(ex);
  barrier(world, device.waits);
  double t0 = now();
  f();
  synchronize(ex);
  double once = now() - t0;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, world), "MPI_Allreduce");
  const int64_t runs = std::clamp<int64_t>(int64_t(std::ceil(min_seconds / std::max(once, 1e-9))), 3, 1000000);
  barrier(world, device.waits);
  t0 = now();
  for (int64_t i = 0; i < runs; ++i) f();
  synchronize(ex);
  return mean_over(world, (now() - t0) / double(runs));
}

// The largest value over the ranks.
double max_over(MPI_Comm world, double v) {
  double top = 0;
  check_mpi(MPI_Allreduce(&v, &top, 1, MPI_DOUBLE, MPI_MAX, world), "MPI_Allreduce");
  return top;
}

// The first n elements of a 1-D tensor.
Tensor prefix(const Tensor& t, int64_t n) { return Tensor(t.data, t.dtype, {n}, t.device); }


// The links of groups of `group` consecutive ranks (as the trainer's tensor-parallel groups are;
// every group measuring at once, as a layout runs them): the all-reduce at 4 KiB .. max_message
// fitted to the ring, then all-gather, reduce-scatter and point-to-point, each fitted on its own.
// Each size's time is the median of the repeats; a collective's the mean over the ranks, a chain's
// the slowest rank's, which is the rank that waits for the whole chain.
Link calibrate_group_link(MPI_Comm world, const CalibrationDevice& device, int group, const CalibrationOptions& o,
                          const std::function<void(const std::string&)>& say) {
  const int ranks = comm_size(world);
  const Exec& ex = device.ex;
  char line[256];
  const std::string over = std::to_string(group) + " ranks" +
                           (group < ranks ? " (" + std::to_string(ranks / group) + " groups at once)" : "");
  // The trainer's communicator on this device for a tensor-parallel group of this size.
  const ProcessGrid grid(GridDegrees{group, 1, 1, -1}, ranks, comm_rank(world));
  GridComms comms = make_grid_comms(grid, world, ex, device.comm, device.waits);
  Communicator& comm = *comms.tp;
  CalibrationBuffers buf(ex);
  // Zeros: sums of sums stay finite however often they run.
  const Tensor whole = buf.f({o.max_message / 4}, 0), part = buf.f({o.max_message / 4 / group + 1}, 0);
  synchronize(ex);
  // The median over the repeats of run(bytes) at each size from `first`, x4 to max_message.
  const auto series = [&](int64_t first, const std::function<void(int64_t)>& run, bool slowest,
                          std::vector<double>& sz, std::vector<double>& tm, const char* what) {
    for (int64_t bytes = first; bytes <= o.max_message; bytes *= 4) {
      run(bytes);  // warm-up
      std::vector<double> runs;
      const int reps = bytes <= (1 << 20) ? 4 * o.repeats : o.repeats;
      for (int i = 0; i < reps; ++i) {
        barrier(world, device.waits);
        const double t0 = now();
        run(bytes);  // blocking: the host waits for the device's copy too
        runs.push_back(now() - t0);
      }
      std::nth_element(runs.begin(), runs.begin() + long(runs.size() / 2), runs.end());
      const double median = runs[runs.size() / 2];
      sz.push_back(double(bytes));
      tm.push_back(slowest ? max_over(world, median) : mean_over(world, median));
      if (what) {
        std::snprintf(line, sizeof line, "%s %lld bytes over %s: %.1f us", what, (long long)bytes, over.c_str(),
                      tm.back() * 1e6);
        say(line);
      }
    }
  };
  std::vector<double> sizes, times;
  series(4096, [&](int64_t bytes) { comm.all_reduce(prefix(whole, bytes / 4)); }, false, sizes, times, "all-reduce");
  Link link = fit_all_reduce(sizes, times, group);
  std::snprintf(line, sizeof line, "link over %s (fitted to the ring): %.2f GB/s, %.1f us per message", over.c_str(),
                link.bandwidth / 1e9, link.latency * 1e6);
  say(line);
  const double n = double(group);
  const auto measure = [&](const char* what, double steps, double fraction, const std::function<void(int64_t)>& run,
                           bool slowest = false) {
    std::vector<double> sz, tm;
    series(4096 * group, run, slowest, sz, tm, nullptr);
    const Link fit = fit_link(sz, tm, steps, fraction);
    std::snprintf(line, sizeof line, "%s over %s (%lld .. %lld bytes, fitted): %.2f GB/s, %.1f us per message", what,
                  over.c_str(), (long long)(4096 * group), (long long)sz.back(), fit.bandwidth / 1e9,
                  fit.latency * 1e6);
    say(line);
    return fit;
  };
  const Link ag = measure("all-gather", n - 1, (n - 1) / n, [&](int64_t bytes) {
    const int64_t e = bytes / 4;
    comm.all_gather(prefix(part, e / group), prefix(whole, e));
  });
  const Link rs = measure("reduce-scatter", n - 1, (n - 1) / n, [&](int64_t bytes) {
    const int64_t e = bytes / 4;
    comm.reduce_scatter(prefix(whole, e), prefix(part, e / group));
  });
  // Point-to-point as a pipeline (and the cp ring) uses it: a message handed along a chain, each
  // rank receiving from the previous and then sending to the next, the group's rank 0 starting and
  // ending it: one lap is n dependent messages (2 ranks: a round trip). Every hop includes the
  // receiver's wake-up, which with more ranks than cores is the scheduler's and not the wire's (a
  // round trip between two ranks while the others wait in a barrier does not see it).
  const int me = comm.rank(), next = (me + 1) % group, prev = (me + group - 1) % group;
  const Link p2p = measure(
      "send/recv", n, n,
      [&](int64_t bytes) {
        const Tensor t = prefix(whole, bytes / 4);
        if (me == 0) {
          comm.send(t, next), comm.recv(t, prev);
        } else {
          comm.recv(t, prev), comm.send(t, next);
        }
      },
      true);
  link.all_gather_bandwidth = ag.bandwidth, link.all_gather_latency = ag.latency;
  link.reduce_scatter_bandwidth = rs.bandwidth, link.reduce_scatter_latency = rs.latency;
  link.p2p_bandwidth = p2p.bandwidth, link.p2p_latency = p2p.latency;
  return link;
}

}  // namespace

DeviceInfo device_info(const Device& device) {
  DeviceInfo info;
  if (device.is_cpu()) return info;
  info.name = cuda_device_name(device.index);
  info.memory = double(cuda_device_memory(device.index));  // the runtime's own count (totalGlobalMem)
  return info;
}

std::vector<GemmShape> model_gemm_shapes(const Workload& w, int64_t ranks) {
  std::vector<GemmShape> all;
  const ModelConfig& m = w.model;
  for (int64_t tp = 1; tp <= ranks; ++tp) {
    if (ranks % tp != 0 || m.n_head % tp != 0 || m.ffn_hidden % tp != 0) continue;
    for (int64_t mb = 1; mb <= 8; mb *= 2) {
      if (w.global_batch % mb != 0) continue;
      Layout l;
      l.tp = tp, l.dp = ranks / tp, l.micro_batch = mb;
      for (const GemmShape& s : gemm_shapes(w, l)) all.push_back(s);
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

Link fit_all_reduce(const std::vector<double>& bytes, const std::vector<double>& seconds, int64_t ranks) {
  TESSERA_CHECK(ranks >= 2, "fit_all_reduce: needs at least two ranks");
  const double n = double(ranks);
  return fit_link(bytes, seconds, 2 * (n - 1), 2 * (n - 1) / n);
}

Link fit_link(const std::vector<double>& bytes, const std::vector<double>& seconds, double steps, double fraction) {
  TESSERA_CHECK(bytes.size() == seconds.size() && bytes.size() >= 2 && steps > 0 && fraction > 0,
                "fit_link: needs at least two message sizes");
  // t = a + b x, weights 1 / t^2.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const double w = 1 / (seconds[i] * seconds[i]), x = bytes[i], y = seconds[i];
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  const double det = sw * sxx - sx * sx;
  double b = det > 0 ? (sw * sxy - sx * sy) / det : 0;
  double a = det > 0 ? (sy - b * sx) / sw : seconds.front();
  if (b <= 0) b = (seconds.back() - seconds.front()) / std::max(1.0, bytes.back() - bytes.front());
  b = std::max(b, 1e-15);
  a = std::max(a, 0.0);
  // a = steps alpha, b = fraction / beta.
  return Link{fraction / b, a / steps};
}

ClusterSpec calibrate_local(MPI_Comm world, const LocalMachine& local, const CalibrationOptions& o, std::ostream* log,
                            const CalibrationDevice& device) {
  const int ranks = comm_size(world);
  const bool lead = comm_rank(world) == 0;
  const auto say = [&](const std::string& line) {
    if (lead && log) *log << line << "\n" << std::flush;
  };
  ClusterSpec s = local_cluster(local);
  const Exec& ex = device.ex;
  const bool on_device = !ex.device.is_cpu();
  s.device = on_device ? "cuda" : "cpu";
  if (on_device) {  // the device's own memory, less the runtime's and cuBLAS's share (as the presets)
    s.host_memory = false, s.usable_memory_fraction = 0.9;
    s.async_progress = device.comm == "nccl";
  }
  const auto timed = [&](const std::function<void()>& f) { return timed_mean(world, device, o.min_seconds, f); };
  const int64_t n = o.gemm_size;
  char line[256];

  // GEMMs: (n, n) x (n, n)^T at n = gemm_size / 8 .. gemm_size, fp32, and at gemm_size with a bf16
  // weight (the mixed-precision path). When the fp32 rate grows with the size (a device that small
  // GEMMs leave idle) the rates are fitted to rate(f) = peak f / (f + half) (least squares on
  // 1 / rate = 1 / peak + (half / peak) / f); otherwise (a CPU, where small GEMMs stay in cache) the
  // median rate stands for every GEMM.
  const auto gemm_rate = [&](int64_t size, bool bf16) {
    CalibrationBuffers buf(ex);
    const Tensor ta = buf.f({size, size}, 1), tb = buf.f({size, size}, 0.5f), tc = buf.f({size, size}, 0);
    const Tensor tb16 = bf16 ? buf.bf16({size, size}) : Tensor();
    if (bf16) convert(ex, tb16, tb);
    barrier(world, device.waits);
    const double seconds = timed([&] { matmul(ex, tc, ta, bf16 ? tb16 : tb, false, true); });
    return 2.0 * double(size * size * size) / seconds;
  };
  std::vector<double> flops, rates;
  for (int64_t size = std::max<int64_t>(16, n / 8); size <= n; size *= 2) {
    flops.push_back(2.0 * double(size * size * size));
    rates.push_back(gemm_rate(size, false));
    std::snprintf(line, sizeof line, "GEMM %lld^3 per rank: fp32 %.1f GFLOP/s", (long long)size, rates.back() / 1e9);
    say(line);
  }
  const bool grows = std::is_sorted(rates.begin(), rates.end()) && rates.size() >= 2;
  double peak = 0, half = 0;
  if (grows) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double k = double(flops.size());
    for (size_t i = 0; i < flops.size(); ++i) {
      const double x = 1 / flops[i], y = 1 / rates[i];
      sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    const double det = k * sxx - sx * sx, slope = det > 0 ? (k * sxy - sx * sy) / det : 0;
    const double intercept = (sy - slope * sx) / k;
    if (intercept > 0 && slope >= 0) peak = 1 / intercept, half = slope / intercept;
  }
  if (peak == 0) {
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    peak = sorted[sorted.size() / 2];
  }
  const double large = flops.back();
  s.peak_flops_fp32 = peak;
  s.gemm_half_flops = half;
  const double bf16 = gemm_rate(n, true);
  s.peak_flops_bf16 = bf16 * (large + half) / large;  // the same saturation
  s.compute_efficiency = 1.0;  // the measured rate is what a GEMM reaches
  std::snprintf(line, sizeof line,
                "GEMM %lld^3 per rank: bf16 %.1f GFLOP/s; taken: fp32 %.1f, bf16 %.1f GFLOP/s (%s)", (long long)n,
                bf16 / 1e9, s.peak_flops_fp32 / 1e9, s.peak_flops_bf16 / 1e9,
                grows ? ("fitted; half the rate at " + std::to_string(half / 1e9) + " GFLOP").c_str()
                      : "the median: the rate does not grow with the size");
  say(line);

  // GEMMs at the given shapes (a model's step), fp32 and with a bf16 weight, as the model runs them:
  // (m, k) x (n, k)^T.
  if (!o.shapes.empty()) {
    double lo = INFINITY, hi = 0;
    for (const GemmShape& shape : o.shapes) {
      GemmShape t = shape;
      while (t.m > 1 && 2.0 * double(t.m) * double(t.n) * double(t.k) > o.max_gemm_flops) t.m = (t.m + 1) / 2;
      CalibrationBuffers buf(ex);
      const Tensor ta = buf.f({t.m, t.k}, 1), tb = buf.f({t.n, t.k}, 0.5f), tc = buf.f({t.m, t.n}, 0);
      const Tensor tb16 = buf.bf16({t.n, t.k});
      convert(ex, tb16, tb);
      for (bool bf16 : {false, true}) {
        barrier(world, device.waits);
        const double seconds = timed([&] { matmul(ex, tc, ta, bf16 ? tb16 : tb, false, true); });
        const double rate = 2.0 * double(t.m) * double(t.n) * double(t.k) / seconds;
        s.gemm_rates.push_back({shape.m, shape.n, shape.k, bf16, rate});
        lo = std::min(lo, rate), hi = std::max(hi, rate);
      }
    }
    std::snprintf(line, sizeof line, "GEMMs at the model's %zu shapes (fp32 and bf16) per rank: %.1f .. %.1f GFLOP/s",
                  o.shapes.size(), lo / 1e9, hi / 1e9);
    say(line);
  }

  // The other op families at the model's shapes (plan/calibrate_ops.h).
  if (!o.ops.empty()) {
    s.op_times = o.ops;
    const double t0 = now();
    time_ops(ex, o, s.op_times, timed);
    std::snprintf(line, sizeof line, "ops at the model's shapes (attention, norms, residual, activation, %sembedding, "
                  "cross-entropy, AdamW, gradient norm): %zu shapes in %.1f s", has_op_times(s, OpKind::RopeForward) ? "RoPE, " : "",
                  s.op_times.size(), now() - t0);
    say(line);
  }

  // Memory bandwidth: y = x + y over stream_elements floats (two reads, one write).
  {
    const int64_t m = o.stream_elements;
    CalibrationBuffers buf(ex);
    const Tensor tx = buf.f({m}, 1), ty = buf.f({m}, 2);
    barrier(world, device.waits);
    const double bw = 3.0 * 4.0 * double(m) / timed([&] { residual_forward(ex, ty, tx, ty); });
    s.memory_bandwidth = bw;
    std::snprintf(line, sizeof line, "memory bandwidth per rank: %.1f GB/s", bw / 1e9);
    say(line);
  }
  // The least time of an op: a residual add of 64 elements.
  {
    CalibrationBuffers buf(ex);
    const Tensor tx = buf.f({64}, 1), ty = buf.f({64}, 2);
    barrier(world, device.waits);
    const double per_op = timed([&] {
                            for (int i = 0; i < 1000; ++i) residual_forward(ex, ty, tx, ty);
                          }) / 1000;
    s.op_latency = per_op;
    std::snprintf(line, sizeof line, "least time of an op: %.2f us", per_op * 1e6);
    say(line);
  }

  // The collectives on groups of 2, 4, ... ranks (each size dividing the ranks; every group at once),
  // and over every rank: the node's link (intra), and group_links by size.
  if (ranks > 1) {
    using GL = CalibrationOptions::GroupLinks;
    const bool own_cores = on_device || int64_t(ranks) <= local.cores;
    const bool by_size = o.group_links == GL::On || (o.group_links == GL::Auto && own_cores);
    if (o.group_links == GL::Auto && !own_cores && ranks > 2) {
      std::snprintf(line, sizeof line,
                    "groups of fewer ranks: not fitted (%d ranks share %lld cores: a group's collective waits for "
                    "ranks outside it to be scheduled, which only the fit over all ranks sees; calibrate.group_links "
                    "= on fits them anyway)",
                    ranks, (long long)local.cores);
      say(line);
    }
    for (int group = 2; by_size && group <= ranks; group *= 2) {
      if (ranks % group != 0 || group == ranks) continue;
      s.group_links.push_back({group, calibrate_group_link(world, device, group, o, say)});
    }
    s.intra = calibrate_group_link(world, device, ranks, o, say);
    if (!s.group_links.empty()) s.group_links.push_back({ranks, s.intra});
    s.inter = s.intra;  // one node
  }
  return s;
}

std::string chain_scale_doubts(const std::vector<ChainScale>& scales) {
  std::ostringstream why;
  const auto next = [&why]() -> std::ostream& { return why << (why.tellp() > 0 ? "; " : ""); };
  const auto name = [](const ChainScale& s, bool bf16) {
    std::ostringstream os;
    os << (bf16 ? "bf16" : "fp32") << " at " << s.tokens << " tokens (" << (bf16 ? s.bf16 : s.fp32) << ")";
    return os.str();
  };
  for (const bool bf16 : {false, true})
    for (size_t i = 0; i < scales.size(); ++i) {
      const double v = bf16 ? scales[i].bf16 : scales[i].fp32;
      if (v < 0.85) next() << name(scales[i], bf16) << " is below 0.85";
      if (i == 0) continue;
      const double before = bf16 ? scales[i - 1].bf16 : scales[i - 1].fp32;
      if (v < 0.8 * before || v > 1.25 * before)
        next() << name(scales[i], bf16) << " is " << (v < before ? "below" : "above")
            << " " << name(scales[i - 1], bf16) << " by more than 25%";
    }
  return why.str();
}

std::string degree_scale_doubts(const std::vector<DegreeScale>& scales, const std::string& group) {
  std::ostringstream why;
  for (const DegreeScale& t : scales)
    for (const bool bf16 : {false, true}) {
      const double v = bf16 ? t.bf16 : t.fp32;
      if (v > 2 || v < 0.5)
        why << (why.tellp() > 0 ? "; " : "") << (bf16 ? "bf16" : "fp32") << " at " << group << " " << t.degree << " ("
            << v << ") is " << (v > 2 ? "above 2" : "below 0.5");
    }
  return why.str();
}

}  // namespace tessera::plan
