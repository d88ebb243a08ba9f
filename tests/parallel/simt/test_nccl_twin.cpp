// The NCCL twin (kernels/simt/nccl.cpp) on every rank of the test's world (2 under
// `mpiexec -n 2`; 1 also works): each collective and grouped send/receive against the values
// every rank can compute, bf16 sums rounded once to nearest even, ordering after earlier work on
// the stream, and the refusals.
#include <gtest/gtest.h>

#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/simt/host_bf16.h"
#include "kernels/simt/stream.h"
#include "mpi_testing.h"

namespace {

using tessera::simt::bf16_to_f32;
using tessera::simt::f32_to_bf16;

// Device memory of n T, filled from and read back to the host.
template <class T>
class Buffer {
 public:
  explicit Buffer(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess); }
  explicit Buffer(const std::vector<T>& v) : Buffer(v.size()) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Buffer() { cudaFree(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() const { return p_; }
  std::vector<T> read() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// A communicator over the whole world and a stream, as parallel/nccl_communicator.cpp makes them.
class NcclTwin : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = tessera::testing::test_world();
    MPI_Comm_rank(world_, &rank_);
    MPI_Comm_size(world_, &size_);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ncclUniqueId id{};
    if (rank_ == 0) {
      ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    }
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world_);
    ASSERT_EQ(ncclCommInitRank(&comm_, size_, id, rank_), ncclSuccess) << ncclGetErrorString(ncclInvalidUsage);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  MPI_Comm world_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

// Rank r's i-th value: exact in f32 and bf16, distinct across ranks.
float value(int r, size_t i) { return float(r + 1) + 0.25f * float(i % 8); }

TEST_F(NcclTwin, AllReduceSumAndAverage) {
  const size_t n = 1000;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = value(rank_, i);
  Buffer<float> in(mine), out(n);
  ASSERT_EQ(ncclAllReduce(in.get(), out.get(), n, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(in.get(), in.get(), n, ncclFloat32, ncclAvg, comm_, stream_), ncclSuccess);  // in place
  sync();
  const auto sum = out.read(), avg = in.read();
  for (size_t i = 0; i < n; ++i) {
    float expect = 0;
    for (int r = 0; r < size_; ++r) expect += value(r, i);
    ASSERT_EQ(sum[i], expect) << i;
    ASSERT_EQ(avg[i], expect / float(size_)) << i;
  }
}

TEST_F(NcclTwin, AllReduceF64AndInt32) {
  Buffer<double> d(std::vector<double>{0.5 * rank_, 1.0});
  Buffer<int32_t> k(std::vector<int32_t>{rank_ + 1, 7});
  ASSERT_EQ(ncclAllReduce(d.get(), d.get(), 2, ncclFloat64, ncclSum, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(k.get(), k.get(), 2, ncclInt32, ncclAvg, comm_, stream_), ncclSuccess);
  sync();
  double dsum = 0;
  int32_t ksum = 0;
  for (int r = 0; r < size_; ++r) {
    dsum += 0.5 * r;
    ksum += r + 1;
  }
  EXPECT_EQ(d.read(), (std::vector<double>{dsum, double(size_)}));
  EXPECT_EQ(k.read(), (std::vector<int32_t>{ksum / size_, 7}));
}

// bf16: widened to f32, summed, rounded once to nearest even. 1 + 2^-8 on one rank and 1 on the
// other sum to 2 + 2^-8, halfway between bf16 neighbours 2 and 2 + 2^-6: it rounds to even, 2.
TEST_F(NcclTwin, AllReduceBf16RoundsOnce) {
  const float q = std::ldexp(1.f, -8);
  const std::vector<float> mine = {rank_ == 0 ? 1 + q : 1.f, value(rank_, 3), -value(rank_, 5)};
  std::vector<uint16_t> bits(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) bits[i] = f32_to_bf16(mine[i]);
  Buffer<uint16_t> buf(bits);
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), bits.size(), ncclBfloat16, ncclSum, comm_, stream_), ncclSuccess);
  sync();
  const auto got = buf.read();
  for (size_t i = 0; i < mine.size(); ++i) {
    float sum = 0;
    for (int r = 0; r < size_; ++r) {
      const std::vector<float> theirs = {r == 0 ? 1 + q : 1.f, value(r, 3), -value(r, 5)};
      sum += bf16_to_f32(f32_to_bf16(theirs[i]));
    }
    EXPECT_EQ(got[i], f32_to_bf16(sum)) << i;
  }
  if (size_ == 2) {
    EXPECT_EQ(bf16_to_f32(got[0]), 2.f);
  }
}

TEST_F(NcclTwin, ReduceScatterOutOfPlaceAndInPlace) {
  const size_t n = 5;  // per rank
  std::vector<float> mine(n * size_t(size_));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(rank_, i) * float(i + 1);
  Buffer<float> in(mine), out(n), inplace(mine);
  ASSERT_EQ(ncclReduceScatter(in.get(), out.get(), n, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclReduceScatter(inplace.get(), inplace.get() + size_t(rank_) * n, n, ncclFloat32, ncclAvg, comm_, stream_),
            ncclSuccess);
  sync();
  const auto got = out.read(), got_inplace = inplace.read();
  for (size_t j = 0; j < n; ++j) {
    const size_t i = size_t(rank_) * n + j;
    float expect = 0;
    for (int r = 0; r < size_; ++r) expect += value(r, i) * float(i + 1);
    EXPECT_EQ(got[j], expect);
    EXPECT_EQ(got_inplace[i], expect / float(size_));
  }
}

TEST_F(NcclTwin, AllGatherOutOfPlaceAndInPlace) {
  const size_t n = 3;
  std::vector<int32_t> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = int32_t(100 * rank_ + int(i));
  Buffer<int32_t> in(mine), out(n * size_t(size_));
  std::vector<int32_t> slot(n * size_t(size_), -1);
  std::copy(mine.begin(), mine.end(), slot.begin() + std::ptrdiff_t(size_t(rank_) * n));
  Buffer<int32_t> inplace(slot);
  ASSERT_EQ(ncclAllGather(in.get(), out.get(), n, ncclInt32, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclAllGather(inplace.get() + size_t(rank_) * n, inplace.get(), n, ncclInt32, comm_, stream_), ncclSuccess);
  sync();
  std::vector<int32_t> expect;
  for (int r = 0; r < size_; ++r)
    for (size_t i = 0; i < n; ++i) expect.push_back(int32_t(100 * r + int(i)));
  EXPECT_EQ(out.read(), expect);
  EXPECT_EQ(inplace.read(), expect);
}

TEST_F(NcclTwin, Broadcast) {
  const int root = size_ - 1;
  std::vector<float> mine = {float(rank_), float(rank_) + 0.5f};
  Buffer<float> send(mine), recv(2);
  ASSERT_EQ(ncclBroadcast(send.get(), recv.get(), 2, ncclFloat32, root, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclBroadcast(send.get(), send.get(), 2, ncclFloat32, root, comm_, stream_), ncclSuccess);
  sync();
  EXPECT_EQ(recv.read(), (std::vector<float>{float(root), float(root) + 0.5f}));
  EXPECT_EQ(send.read(), (std::vector<float>{float(root), float(root) + 0.5f}));
}

// A ring exchange in one group: every rank sends to the next and receives from the previous,
// which deadlocks unless both are in flight together.
TEST_F(NcclTwin, GroupedSendRecvRing) {
  const size_t n = 1 << 16;  // large enough for MPI's rendezvous protocol
  std::vector<float> mine(n, float(rank_));
  Buffer<float> send(mine), recv(n);
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(send.get(), n, ncclFloat32, next, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclRecv(recv.get(), n, ncclFloat32, prev, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  sync();
  const auto got = recv.read();
  EXPECT_EQ(got.front(), float(prev));
  EXPECT_EQ(got.back(), float(prev));
}

TEST_F(NcclTwin, UngroupedSendRecv) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  Buffer<double> buf(std::vector<double>{rank_ == 0 ? 3.25 : 0.0});
  if (rank_ == 0) {
    ASSERT_EQ(ncclSend(buf.get(), 1, ncclFloat64, 1, comm_, stream_), ncclSuccess);
  }
  if (rank_ == 1) {
    ASSERT_EQ(ncclRecv(buf.get(), 1, ncclFloat64, 0, comm_, stream_), ncclSuccess);
  }
  sync();
  if (rank_ <= 1) {
    EXPECT_EQ(buf.read()[0], 3.25);
  }
}

// The collective runs after the work queued before it on the stream (here a slow write).
TEST_F(NcclTwin, RunsInStreamOrder) {
  Buffer<float> buf(std::vector<float>{0.f});
  float* p = buf.get();
  tessera::simt::enqueue(stream_, "slow write", [p, r = rank_] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    *p = float(r + 1);
  });
  ASSERT_EQ(ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  sync();
  EXPECT_EQ(buf.read()[0], float(size_ * (size_ + 1) / 2));
}

// Every rank makes a communicator of its own in the same round (distinct roots: distinct colours).
TEST_F(NcclTwin, SingletonCommunicatorsInOneRound) {
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t self = nullptr;
  ASSERT_EQ(ncclCommInitRank(&self, 1, id, 0), ncclSuccess);
  int count = 0, rank = -1;
  ncclCommCount(self, &count);
  ncclCommUserRank(self, &rank);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(rank, 0);
  Buffer<float> b(std::vector<float>{2.f});
  ASSERT_EQ(ncclAllReduce(b.get(), b.get(), 1, ncclFloat32, ncclSum, self, stream_), ncclSuccess);
  sync();
  EXPECT_EQ(b.read()[0], 2.f);
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(self, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(self), ncclSuccess);
}

TEST_F(NcclTwin, RefusesWhatItDoesNotHave) {
  testing::internal::CaptureStderr();
  Buffer<float> b(4);
  EXPECT_EQ(ncclAllReduce(b.get(), b.get(), 4, ncclFloat32, ncclProd, comm_, stream_), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetErrorString(ncclInvalidArgument)).find("ncclSum and ncclAvg"), std::string::npos);
  EXPECT_EQ(ncclAllReduce(b.get(), b.get(), 4, ncclFloat16, ncclSum, comm_, stream_), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetErrorString(ncclInvalidArgument)).find("ncclFloat16"), std::string::npos);
  std::vector<float> host(4);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comm_, stream_), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetErrorString(ncclInvalidArgument)).find("device allocation"), std::string::npos);
  EXPECT_EQ(ncclSend(b.get(), 4, ncclFloat32, size_, comm_, stream_), ncclInvalidArgument);  // no such peer
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(b.get(), b.get(), 4, ncclFloat32, ncclSum, comm_, stream_), ncclInvalidUsage);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  testing::internal::GetCapturedStderr();
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
}

}  // namespace
