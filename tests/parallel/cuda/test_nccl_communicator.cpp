// NcclCommunicator (parallel/nccl_communicator.h) on real GPUs and real MPI ranks: all-reduce (sum,
// average), reduce-scatter, all-gather, broadcast, send/recv and a batched exchange, each ordered on
// the compute stream both ways (inputs uploaded on the compute stream just before the op, results
// read back on it after CommHandle::wait_on, with no host wait in between). CTest label `gpu`; run
// under `mpiexec -n 2`. Skipped (on every rank alike) unless each rank of a node has its own GPU:
// NCCL refuses two ranks on one device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <vector>

#include "mpi_testing.h"
#include "parallel/mpi.h"
#include "parallel/nccl_communicator.h"

namespace tessera {
namespace {

// The rank's GPU: its index among the ranks of its node. -1 (on every rank) when some node has
// fewer GPUs than ranks, or the world has one rank.
int device_for_this_rank(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, comm_rank(world), MPI_INFO_NULL, &node), "split");
  const int local = comm_rank(node), local_size = comm_size(node);
  MPI_Comm_free(&node);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  int ok = comm_size(world) >= 2 && n >= local_size ? 1 : 0, all = 0;
  check_mpi(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, world), "MPI_Allreduce");
  return all ? local : -1;
}

#define REQUIRE_GPU_PER_RANK(dev)                                                                        \
  const int dev = device_for_this_rank(testing::test_world());                                          \
  if (dev < 0) GTEST_SKIP() << "needs >= 2 ranks (mpiexec -n 2) and one GPU per rank (NCCL refuses two " \
                               "ranks on one GPU)"

// Device memory for n floats, RAII.
class DeviceFloats {
 public:
  explicit DeviceFloats(int64_t n, int dev) : n_(n), dev_(dev) { EXPECT_EQ(cudaMalloc(&p_, sizeof(float) * n), cudaSuccess); }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  Tensor t() const { return Tensor(p_, DType::F32, {n_}, Device::cuda(dev_)); }
  // Queued on the compute stream (pageable host memory: the copy is staged, host data may go).
  void upload(const std::vector<float>& v, cudaStream_t s) {
    EXPECT_EQ(cudaMemcpyAsync(p_, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  }
  std::vector<float> download(cudaStream_t s) const {
    std::vector<float> v(static_cast<size_t>(n_));
    EXPECT_EQ(cudaMemcpyAsync(v.data(), p_, sizeof(float) * v.size(), cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
  int64_t n_;
  int dev_;
};

// A compute stream on the rank's GPU and a NCCL communicator over the world, torn down in order.
struct Fixture {
  explicit Fixture(int dev) {
    EXPECT_EQ(cudaSetDevice(dev), cudaSuccess);
    EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ex = Exec::cuda(dev, stream);
    comm = NcclCommunicator::create(testing::test_world(), ex);
  }
  ~Fixture() {
    comm.reset();
    cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  Exec ex;
  std::unique_ptr<NcclCommunicator> comm;
};

TEST(NcclCommunicator, AllReduceSumAndAverage) {
  REQUIRE_GPU_PER_RANK(dev);
  Fixture f(dev);
  const int p = f.comm->size(), r = f.comm->rank();
  constexpr int64_t n = 1000003;  // not a multiple of anything NCCL chunks by
  DeviceFloats x(n, dev);
  std::vector<float> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[i] = float((r + 1) * (i % 7));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
    x.upload(mine, f.stream);
    CommHandle h = f.comm->all_reduce_async(x.t(), op);
    h.wait_on(f.ex);
    EXPECT_TRUE(h.done());
    const std::vector<float> got = x.download(f.stream);
    const float ranks_sum = float(p * (p + 1) / 2);
    for (int64_t i = 0; i < n; ++i) {
      const float want = float(i % 7) * (op == ReduceOp::Sum ? ranks_sum : ranks_sum / p);
      ASSERT_FLOAT_EQ(got[i], want) << "i = " << i << (op == ReduceOp::Sum ? " sum" : " average");
    }
  }
}

TEST(NcclCommunicator, ReduceScatterAllGatherBroadcast) {
  REQUIRE_GPU_PER_RANK(dev);
  Fixture f(dev);
  const int p = f.comm->size(), r = f.comm->rank();
  constexpr int64_t chunk = 4099;
  DeviceFloats full(chunk * p, dev), part(chunk, dev);
  std::vector<float> v(chunk * p);
  for (int64_t i = 0; i < chunk * p; ++i) v[i] = float(r * 1000 + i % 1000);
  full.upload(v, f.stream);
  f.comm->reduce_scatter_async(full.t(), part.t()).wait_on(f.ex);
  std::vector<float> got = part.download(f.stream);
  for (int64_t i = 0; i < chunk; ++i) {
    float want = 0;
    for (int q = 0; q < p; ++q) want += float(q * 1000 + (r * chunk + i) % 1000);
    ASSERT_FLOAT_EQ(got[i], want) << "reduce_scatter at " << i;
  }

  std::vector<float> mine(chunk);
  for (int64_t i = 0; i < chunk; ++i) mine[i] = float(r * 10000 + i);
  part.upload(mine, f.stream);
  f.comm->all_gather_async(part.t(), full.t()).wait_on(f.ex);
  got = full.download(f.stream);
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(got[q * chunk + i], float(q * 10000 + i)) << "all_gather";

  part.upload(mine, f.stream);
  f.comm->broadcast(part.t(), p - 1);  // blocking form: waits on the host
  got = part.download(f.stream);
  for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(got[i], float((p - 1) * 10000 + i)) << "broadcast";
}

TEST(NcclCommunicator, SendRecvAndBatchedRing) {
  REQUIRE_GPU_PER_RANK(dev);
  Fixture f(dev);
  const int p = f.comm->size(), r = f.comm->rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  constexpr int64_t n = 1 << 20;  // 4 MiB: past any eager limit, so a blocking ring would deadlock
  DeviceFloats out_a(n, dev), out_b(n, dev), in_a(n, dev), in_b(n, dev);
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = float(r + i % 13);
    b[i] = float(-r - i % 11);
  }
  out_a.upload(a, f.stream);
  out_b.upload(b, f.stream);
  // Both directions at once: a to the next rank, b to the previous one.
  f.comm->batch_send_recv_async({P2POp::send(out_a.t(), next), P2POp::send(out_b.t(), prev), P2POp::recv(in_a.t(), prev),
                                 P2POp::recv(in_b.t(), next)})
      .wait_on(f.ex);
  std::vector<float> ga = in_a.download(f.stream), gb = in_b.download(f.stream);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(ga[i], float(prev + i % 13)) << "batched ring, from the previous rank";
    ASSERT_EQ(gb[i], float(-next - i % 11)) << "batched ring, from the next rank";
  }
  // Plain send/recv between ranks 0 and 1 (the others idle), host-waited.
  if (r == 0) f.comm->send(out_a.t(), 1);
  if (r == 1) {
    f.comm->recv(in_a.t(), 0);
    ga = in_a.download(f.stream);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ga[i], float(0 + i % 13)) << "send/recv";
  }
}

// The grid factory: with dp = world size every rank is alone in its tp, cp, pp groups (size 1,
// complete at once) and together in dp and world; ranks follow the grid's order.
TEST(NcclCommunicator, GridCommsFollowTheGrid) {
  REQUIRE_GPU_PER_RANK(dev);
  MPI_Comm world = testing::test_world();
  const int p = comm_size(world), r = comm_rank(world);
  const ProcessGrid grid(GridDegrees{1, 1, 1, p}, p, r);
  EXPECT_EQ(cudaSetDevice(dev), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Exec ex = Exec::cuda(dev, stream);
  {
    GridComms comms = nccl_grid_comms(grid, world, ex);
    EXPECT_EQ(comms.tp->size(), 1);
    EXPECT_EQ(comms.dp->size(), p);
    EXPECT_EQ(comms.dp->rank(), grid.dp_rank());
    EXPECT_EQ(comms.world->rank(), r);
    DeviceFloats x(3, dev);
    x.upload({1.f, 2.f, float(r)}, stream);
    comms.tp->all_reduce_async(x.t()).wait_on(ex);  // alone: unchanged
    comms.dp->all_reduce_async(x.t()).wait_on(ex);
    const std::vector<float> got = x.download(stream);
    EXPECT_EQ(got, (std::vector<float>{float(p), 2.f * p, float(p * (p - 1) / 2)}));
  }
  cudaStreamDestroy(stream);
}

// A tensor on the wrong device is an error naming it, before anything is queued; all_reduce alone
// takes host values (the trainer's host sums: stop votes, loss sums), staged through the device.
TEST(NcclCommunicator, RefusesHostTensors) {
  REQUIRE_GPU_PER_RANK(dev);
  Fixture f(dev);
  std::vector<double> sums = {1.0, static_cast<double>(f.comm->rank())};
  f.comm->all_reduce(Tensor(sums.data(), DType::F64, {2}));
  const int p = f.comm->size();
  EXPECT_EQ(sums[0], static_cast<double>(p));
  EXPECT_EQ(sums[1], static_cast<double>(p * (p - 1) / 2));
  std::vector<float> host(8);
  try {
    f.comm->broadcast(Tensor(host.data(), DType::F32, {8}), 0);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32(8) cpu is not on cuda:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
