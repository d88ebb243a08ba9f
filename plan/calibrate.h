// `tessera plan --calibrate`: measures this machine's ranks for the `local` cluster, as they run
// during training (every rank at once, each with its own OpenMP threads): the fp32 and bf16 GEMM
// rates (kernels/matmul.h at 1024^3), the memory bandwidth (a residual add of 64 MiB tensors), the
// least time of an op, and the all-reduce over all ranks (parallel/mpi_communicator.h) from 4 KiB
// to 16 MiB fitted to the ring's alpha-beta model. The result is a [cluster] description.
// On a CUDA device (CalibrationDevice) the same measurements run on each rank's GPU: device
// buffers, the CUDA kernels on the rank's stream, every timed region closed by a device
// synchronize, and the collectives through the communicator the trainer would use there.
#pragma once

#include <mpi.h>

#include <iosfwd>
#include <string>

#include "kernels/exec.h"
#include "parallel/mpi.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"

namespace tessera::plan {

// Where calibration runs, as `tessera train` would run there (app/device.h, parallel.comm): the
// CPU's ranks on host buffers (the default), or each rank's CUDA device, ex holding its compute
// stream: every op on device buffers through the CUDA dispatch, the clock read only after
// synchronize(ex) (kernel time, not launch time), and the collectives on device buffers through
// parallel.comm's communicator (make_grid_comms: "mpi" stages them through pinned host buffers,
// "nccl" runs them on the device).
struct CalibrationDevice {
  Exec ex = Exec::cpu();
  std::string comm = "mpi";
  MpiWait waits = MpiWait::Spin;  // how the ranks wait in barriers, as the trainer's (parallel/mpi.h)
};

// What the runtime says of a CUDA device: its name ("NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)") and
// memory in bytes (cudaDeviceProp::totalGlobalMem); {"", 0} for the CPU.
struct DeviceInfo {
  std::string name;
  double memory = 0;
};
DeviceInfo device_info(const Device& device);

struct CalibrationOptions {
  // Each op (GEMM, elementwise, attention, optimizer) is timed as the mean over at least min_seconds
  // of back-to-back runs, every rank running the same count at the same time (as in training: a
  // loaded machine's time, not the best of a few short runs).
  double min_seconds = 0.05;
  int repeats = 5;           // the collectives' repetitions (the median is kept)
  int64_t gemm_size = 1024;  // the GEMMs' M = N = K
  int64_t stream_elements = int64_t{16} << 20;  // fp32 elements per tensor of the bandwidth measurement
  int64_t max_message = int64_t{16} << 20;      // bytes of the largest all-reduce
  // The collectives also on groups of 2, 4, ... ranks (cluster.h group_links): Auto where every rank
  // has a core of its own or a device (else a group's collective waits for ranks outside it to be
  // scheduled, which only the fit over all ranks sees: docs/planning.md, "By group size"), On, Off.
  enum class GroupLinks : uint8_t { Auto, On, Off };
  GroupLinks group_links = GroupLinks::Auto;
  // GEMM shapes to time, fp32 and with a bf16 weight (model_gemm_shapes: a model's step); each
  // above max_gemm_flops is timed with fewer rows (m) until below, the rest of its shape kept.
  std::vector<GemmShape> shapes;
  double max_gemm_flops = 2e9;
  // The other op families to time (model_op_shapes: a model's step), each at its shape; seconds
  // are filled in. An op over max_op_elements (its largest tensor) is timed at a shape with fewer
  // rows (or elements) and scaled back by op_work.
  std::vector<OpTime> ops;
  double max_op_elements = double(int64_t{32} << 20);
};

// The shapes of every op family but the GEMMs that a model's step runs (cluster.h OpKind), at each
// tp the grid allows (with and without sequence parallelism) and micro-batches 1, 2, 4, 8 (those
// dividing the global batch), without cp; AdamW (fp32 and with the bf16 copy) and the gradient norm
// at the model's parameters / 1, 2, 4, ... 2 x ranks (the shards a rank can hold). Each once.
std::vector<OpTime> model_op_shapes(const Workload& w, int64_t ranks);

// The GEMM shapes of a model's step on `ranks` ranks: every Linear's forward, dX and dW and the LM
// head (cost_model.h gemm_shapes) at each tp the grid allows and micro-batches 1, 2, 4, 8 (those
// dividing the global batch), without cp. Sorted, each once.
std::vector<GemmShape> model_gemm_shapes(const Workload& w, int64_t ranks);

// Collective over world. Returns `local`'s description with the measured numbers in place of its
// defaults (per rank: the mean over the ranks, measured together), and gemm_rates at options.shapes; log (rank 0's) gets a line per
// measurement. With one rank the links keep their defaults (nothing to measure).
// On a CUDA device (device.ex): cluster.device = "cuda", host_memory false, async_progress true with
// parallel.comm = "nccl" (false with "mpi": staged through the host); the device's name and memory
// are the caller's to fill in (device_info).
ClusterSpec calibrate_local(MPI_Comm world, const LocalMachine& local, const CalibrationOptions& options,
                            std::ostream* log, const CalibrationDevice& device = {});

// The least-squares fit of t = latency + bytes / bandwidth to the all-reduce of an n-rank ring,
// t = 2 (n - 1) (alpha + bytes / (n beta)), weighted by 1 / t^2 (relative errors: small and large
// messages count alike). Throws tessera::Error with fewer than two sizes.
Link fit_all_reduce(const std::vector<double>& bytes, const std::vector<double>& seconds, int64_t ranks);
// The same for any collective of the form t = steps x alpha + fraction x bytes / beta: the ring's
// all-gather and reduce-scatter (steps n - 1, fraction (n - 1)/n of the whole buffer), one send
// (1, 1). Returns {beta, alpha} as a Link's bandwidth and latency.
Link fit_link(const std::vector<double>& bytes, const std::vector<double>& seconds, double steps, double fraction);

// Why the chain scales measured at each micro-batch size (ClusterSpec::chain_scales, ascending)
// look disturbed, "" when they do not: a scale below 0.85 (the model's run faster than its ops
// timed alone, each in cache) or one that falls or rises by more than 25% from the size before it.
// Seen when other processes ran beside the calibration (docs/plan_validation.md: 1.10 then 0.75).
std::string chain_scale_doubts(const std::vector<ChainScale>& scales);
// Why tp (or cp) scales look disturbed ("" when they do not): a scale above 2 or below 0.5, the
// step at that degree measured at more than twice (or under half) its prediction. group: "tp" or
// "cp", as the reasons name it. Quiet tp calibrations here gave 0.96-1.36; one beside another
// process, 2 ranks spinning, 27 and 36.
std::string degree_scale_doubts(const std::vector<DegreeScale>& scales, const std::string& group);

}  // namespace tessera::plan
