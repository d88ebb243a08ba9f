// The share of context parallelism's ring transfers hidden behind attention (issue 14's "measure"):
// under mpiexec -n P, context_attention_forward + backward (ring) on this rank's load-balanced
// chunks of a sequence of T, timed whole, with the host time blocked in the ring's waits
// (ContextAttentionStats::ring_wait_s: the transfer time the attention did not cover); then the
// same transfers alone (the ring's send/recv pattern, same buffers, no attention between), and
// all-gather mode for comparison. hidden = 1 - wait / (transfers alone), per rank, median of --reps.
//   mpiexec -n 2 build/bench/cp_ring_bench [--T 4096] [--B 1] [--H 6] [--KV 2] [--D 64] [--reps 5]
// (one OpenMP thread per rank: OMP_NUM_THREADS=1; MPICH progresses a non-blocking transfer only
// inside MPI calls unless MPIR_CVAR_ASYNC_PROGRESS=1 gives it a thread of its own.)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallel/context_attention.h"
#include "parallel/mpi_communicator.h"

using namespace tessera;

namespace {

struct Args {
  int64_t T = 4096, B = 1, H = 6, KV = 2, D = 64;
  int reps = 5;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--T") a.T = v;
    else if (k == "--B") a.B = v;
    else if (k == "--H") a.H = v;
    else if (k == "--KV") a.KV = v;
    else if (k == "--D") a.D = v;
    else if (k == "--reps") a.reps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "cp_ring_bench: unknown option %s\n", argv[i]);
      std::exit(2);
    }
  }
  return a;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

struct Times {
  double total = 0, wait = 0;
};

// Forward + backward of context attention in `mode`, after a barrier (every rank starts together).
Times attention_step(const ContextParallel& cp, Allocator& alloc, const Args& a, const SequenceLayout& seq,
                     std::vector<std::vector<float>>& t) {
  const int64_t L = seq.length();
  auto view = [&](size_t i, Shape s) { return Tensor(t[i].data(), DType::F32, s); };
  const Shape qs{a.B, L, a.H, a.D}, ks{a.B, L, a.KV, a.D}, ls{a.B, a.H, L};
  // 0 q, 1 k, 2 v, 3 out, 4 lse, 5 dout, 6 dq, 7 dk, 8 dv
  MPI_Barrier(MPI_COMM_WORLD);
  ContextAttentionStats stats;
  const double t0 = now();
  context_attention_forward(Exec::cpu(), cp, alloc, view(3, qs), view(4, ls), view(0, qs), view(1, ks), view(2, ks), seq,
                            &stats);
  context_attention_backward(Exec::cpu(), cp, alloc, view(6, qs), view(7, ks), view(8, ks), view(5, qs), view(0, qs),
                             view(1, ks), view(2, ks), view(3, qs), view(4, ls), seq, &stats);
  return {now() - t0, stats.ring_wait_s};
}

// The ring's transfers alone, in its order: forward P - 1 K/V steps; backward P - 1 K/V steps,
// each beside the step's dK/dV transfer, and the last dK/dV transfer.
double transfers_alone(Communicator& comm, int64_t kv_numel) {
  const int P = comm.size(), r = comm.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  std::vector<float> a(static_cast<size_t>(kv_numel), 1.f), b(a.size()), c(a.size(), 1.f), d(a.size());
  const Tensor ta(a.data(), DType::F32, {kv_numel}), tb(b.data(), DType::F32, {kv_numel});
  const Tensor tc(c.data(), DType::F32, {kv_numel}), td(d.data(), DType::F32, {kv_numel});
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  for (int s = 0; s + 1 < P; ++s)
    comm.batch_send_recv_async({P2POp::send(ta, next, 31), P2POp::recv(tb, prev, 31)}).wait();
  for (int s = 0; s < P; ++s) {
    CommHandle kv;
    if (s + 1 < P) kv = comm.batch_send_recv_async({P2POp::send(ta, next, 31), P2POp::recv(tb, prev, 31)});
    comm.batch_send_recv_async({P2POp::send(tc, next, 32), P2POp::recv(td, prev, 32)}).wait();
    kv.wait();
  }
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    const Args a = parse(argc, argv);
    MpiCommunicator comm = MpiCommunicator::duplicate(MPI_COMM_WORLD);
    const int P = comm.size(), rank = comm.rank();
    if (P < 2 || a.T % (2 * P) != 0) {
      if (rank == 0) std::fprintf(stderr, "cp_ring_bench: run under mpiexec -n P >= 2 with --T a multiple of 2 P\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int64_t L = a.T / P;
    const SequenceLayout seq = SequenceLayout::load_balanced(a.T, P, rank);
    const int64_t q = a.B * L * a.H * a.D, kv = a.B * L * a.KV * a.D, lse = a.B * a.H * L;
    std::vector<std::vector<float>> t = {random_values(q, 1 + rank), random_values(kv, 11 + rank),
                                         random_values(kv, 21 + rank), std::vector<float>(q), std::vector<float>(lse),
                                         random_values(q, 31 + rank), std::vector<float>(q), std::vector<float>(kv),
                                         std::vector<float>(kv)};
    Allocator alloc;
    std::vector<double> ring_total, ring_wait, alone, gather_total;
    const ContextParallel ring{&comm, CpComm::Ring}, gather{&comm, CpComm::AllGather};
    for (int i = 0; i < a.reps + 1; ++i) {  // the first round warms up
      const Times r = attention_step(ring, alloc, a, seq, t);
      const double x = transfers_alone(comm, 2 * kv);
      const Times g = attention_step(gather, alloc, a, seq, t);
      if (i == 0) continue;
      ring_total.push_back(r.total);
      ring_wait.push_back(r.wait);
      alone.push_back(x);
      gather_total.push_back(g.total);
    }
    const double mine[5] = {median(ring_total), median(ring_wait), median(alone), median(gather_total),
                            1.0 - median(ring_wait) / median(alone)};
    std::vector<double> all(static_cast<size_t>(5 * P));
    MPI_Gather(mine, 5, MPI_DOUBLE, all.data(), 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("cp %d, T %lld, B %lld, H %lld, KV %lld, D %lld (fp32), K/V per rank %.2f MiB, median of %d\n", P,
                  static_cast<long long>(a.T), static_cast<long long>(a.B), static_cast<long long>(a.H),
                  static_cast<long long>(a.KV), static_cast<long long>(a.D), 2.0 * kv * 4 / (1 << 20), a.reps);
      std::printf("| rank | ring fwd+bwd ms | blocked in ring waits ms | transfers alone ms | hidden | allgather fwd+bwd ms |\n");
      std::printf("|---|---|---|---|---|---|\n");
      for (int r = 0; r < P; ++r) {
        const double* v = &all[static_cast<size_t>(5 * r)];
        std::printf("| %d | %.1f | %.2f | %.2f | %.0f%% | %.1f |\n", r, 1e3 * v[0], 1e3 * v[1], 1e3 * v[2],
                    100 * std::max(0.0, v[4]), 1e3 * v[3]);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
