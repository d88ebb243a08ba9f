// The CPU twin of the CUDA runtime (kernels/simt/runtime.cpp): streams run asynchronously on
// their own threads and in order, events order two streams, a throwing piece of work is the
// device's sticky error, memory is exactly the size asked for, copies check their device side.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/simt/runtime_api.h"
#include "kernels/simt/stream.h"

namespace {

using namespace std::chrono_literals;

// A gate the host opens: work that waits on it proves that the host returned before it ran.
class Gate {
 public:
  void open() { open_ = true; }
  void wait() const {
    while (!open_) std::this_thread::sleep_for(1ms);
  }

 private:
  std::atomic<bool> open_{false};
};

// Every test leaves the device without a sticky error and with no last error.
class RuntimeTwin : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
  void TearDown() override {
    cudaDeviceReset();
    cudaGetLastError();
  }
};

TEST_F(RuntimeTwin, DeviceQueries) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_GE(n, 1);
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_EQ(p.major, 9);
  EXPECT_EQ(p.minor, 0);
  EXPECT_EQ(p.sharedMemPerBlockOptin, 232448u);
  EXPECT_NE(std::string(p.name).find("sm_90"), std::string::npos);
  EXPECT_EQ(cudaGetDeviceProperties(&p, n), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared by the read
  EXPECT_EQ(cudaSetDevice(n), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);  // not cleared by a peek
  cudaGetLastError();
  int v = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, CUDART_VERSION);
  int d = -1;
  ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
  EXPECT_EQ(d, 0);
}

TEST_F(RuntimeTwin, StreamWorkRunsOnAnotherThreadAfterTheHostReturns) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  Gate gate;
  std::thread::id worker;
  std::vector<int> order;  // written by the worker only, read after the sync
  tessera::simt::enqueue(s, "wait for the gate", [&] {
    gate.wait();
    worker = std::this_thread::get_id();
    order.push_back(0);
  });
  for (int i = 1; i <= 100; ++i) tessera::simt::enqueue(s, "append", [&order, i] { order.push_back(i); });
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);  // the first work waits for the host
  cudaGetLastError();
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_NE(worker, std::this_thread::get_id());
  ASSERT_EQ(order.size(), 101u);
  for (int i = 0; i <= 100; ++i) EXPECT_EQ(order[size_t(i)], i);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Between device and pinned memory copies return at once and run in stream order.
TEST_F(RuntimeTwin, AsyncCopiesAndMemsetRunInStreamOrder) {
  const size_t n = 1000;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float *d = nullptr, *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMallocAsync(&d, n * sizeof(float), s), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&in, n * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&out, n * sizeof(float)), cudaSuccess);
  for (size_t i = 0; i < n; ++i) in[i] = float(i), out[i] = -1.f;
  Gate gate;
  tessera::simt::enqueue(s, "gate", [&] { gate.wait(); });
  ASSERT_EQ(cudaMemsetAsync(d, 0, n * sizeof(float), s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, in, n / 2 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, d, n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(d, s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);  // nothing ran yet: the gate is closed
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i < n / 2 ? float(i) : 0.f) << i;
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(in), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(out), cudaSuccess);
}

// CUDA's rules for pageable host memory: the source of a copy to the device may be reused as soon
// as the call returns (it was staged), and a copy into pageable memory is done when it returns.
TEST_F(RuntimeTwin, PageableCopiesFollowCudasRules) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * sizeof(int)), cudaSuccess);
  Gate gate;
  tessera::simt::enqueue(s, "gate", [&] { gate.wait(); });
  std::vector<int> src = {1, 2};
  ASSERT_EQ(cudaMemcpyAsync(d, src.data(), 2 * sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  src = {7, 8};  // after the call: not what the device gets
  src.shrink_to_fit();
  gate.open();
  std::vector<int> back(2, 0);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d, 2 * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(back, (std::vector<int>{1, 2}));  // complete on return: no synchronisation needed
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  cudaStreamDestroy(s);
}

TEST_F(RuntimeTwin, SynchronousCopiesWaitForTheLegacyStream) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 4 * sizeof(int)), cudaSuccess);
  tessera::simt::enqueue(nullptr, "slow write", [d] {
    std::this_thread::sleep_for(20ms);
    d[2] = 7;
  });
  int h[4] = {1, 1, 1, 1};
  ASSERT_EQ(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 0);
  EXPECT_EQ(h[2], 7);
  int back[4] = {};
  ASSERT_EQ(cudaMemcpy(d, h, sizeof h, cudaMemcpyDefault), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back, d, sizeof back, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(std::memcmp(back, h, sizeof h), 0);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// The legacy default stream waits for blocking streams, and their later work waits for it; a
// non-blocking stream is ordered with neither.
TEST_F(RuntimeTwin, LegacyStreamOrdersWithBlockingStreamsOnly) {
  cudaStream_t blocking = nullptr, nonblocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<int> step{0};
  int seen_by_legacy = -1, seen_by_later = -1;
  tessera::simt::enqueue(blocking, "first", [&] {
    std::this_thread::sleep_for(20ms);
    step = 1;
  });
  tessera::simt::enqueue(nullptr, "legacy", [&] {
    seen_by_legacy = step.load();
    std::this_thread::sleep_for(20ms);
    step = 2;
  });
  tessera::simt::enqueue(blocking, "later", [&] { seen_by_later = step.load(); });
  std::atomic<bool> nonblocking_ran{false};
  tessera::simt::enqueue(nonblocking, "independent", [&] { nonblocking_ran = true; });
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);  // returns while the others still run
  EXPECT_TRUE(nonblocking_ran);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(seen_by_legacy, 1);
  EXPECT_EQ(seen_by_later, 2);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

TEST_F(RuntimeTwin, WaitEventOrdersTwoStreams) {
  cudaStream_t producer = nullptr, consumer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ready = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ready), cudaSuccess);  // never recorded: complete
  int value = 0, seen = -1;
  Gate gate;
  tessera::simt::enqueue(producer, "produce", [&] {
    gate.wait();
    value = 42;
  });
  ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, ready, 0), cudaSuccess);
  tessera::simt::enqueue(consumer, "consume", [&] { seen = value; });
  // A record after the wait is not what the consumer waits for.
  tessera::simt::enqueue(producer, "after", [&] { std::this_thread::sleep_for(50ms); });
  ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ready), cudaErrorNotReady);
  cudaGetLastError();
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(cudaStreamQuery(consumer), cudaErrorNotReady);  // held by the event
  cudaGetLastError();
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_EQ(seen, 42);
  ASSERT_EQ(cudaEventSynchronize(ready), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ready), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(ready), cudaSuccess);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

TEST_F(RuntimeTwin, EventElapsedTime) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t a = nullptr, b = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(a, s), cudaSuccess);
  tessera::simt::enqueue(s, "sleep", [] { std::this_thread::sleep_for(30ms); });
  ASSERT_EQ(cudaEventRecord(b, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 29.f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  for (cudaEvent_t e : {a, b, untimed}) cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

// A throwing piece of work is a device fault: its message is printed and is the text of the
// sticky cudaErrorLaunchFailure; the work after it is dropped; every sync reports it.
TEST_F(RuntimeTwin, ThrowingWorkIsTheStickyError) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  bool ran_after = false;
  testing::internal::CaptureStderr();
  Gate gate;  // holds the fault back until everything is queued (a call after it would see it)
  tessera::simt::enqueue(s, "gate", [&] { gate.wait(); });
  tessera::simt::enqueue(s, "kernel broken_kernel", [] { throw std::runtime_error("index 12 out of range [0, 8)"); });
  tessera::simt::enqueue(s, "after the fault", [&] { ran_after = true; });
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  gate.open();
  EXPECT_EQ(cudaEventSynchronize(e), cudaErrorLaunchFailure);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("tessera simt: kernel broken_kernel: index 12 out of range [0, 8)"), std::string::npos) << err;
  EXPECT_FALSE(ran_after);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);  // sticky: not cleared by a read
  EXPECT_EQ(std::string(cudaGetErrorString(cudaErrorLaunchFailure)),
            "kernel broken_kernel: index 12 out of range [0, 8)");
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(RuntimeTwin, SetLastErrorCarriesItsMessage) {
  tessera::simt::set_last_error(cudaErrorInvalidConfiguration, "kernel k: 2048 threads per block exceed 1024");
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidConfiguration), "kernel k: 2048 threads per block exceed 1024");
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_STREQ(cudaGetErrorString(cudaSuccess), "no error");
}

TEST_F(RuntimeTwin, Memcpy2D) {
  // A (4, 6) int matrix; copy columns [1, 4) of it into a packed (4, 3) one and back into a zeroed one.
  const size_t R = 4, C = 6, W = 3;
  std::vector<int> h(R * C);
  for (size_t i = 0; i < h.size(); ++i) h[i] = int(i);
  int *src = nullptr, *cols = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, h.size() * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&cols, R * W * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, h.size() * sizeof(int)), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(src, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dst, 0, h.size() * sizeof(int), s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy2DAsync(cols, W * sizeof(int), src + 1, C * sizeof(int), W * sizeof(int), R,
                              cudaMemcpyDeviceToDevice, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy2DAsync(dst + 2, C * sizeof(int), cols, W * sizeof(int), W * sizeof(int), R,
                              cudaMemcpyDeviceToDevice, s),
            cudaSuccess);
  std::vector<int> packed(R * W), out(R * C);
  ASSERT_EQ(cudaMemcpyAsync(packed.data(), cols, packed.size() * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), dst, out.size() * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < W; ++c) EXPECT_EQ(packed[r * W + c], h[r * C + 1 + c]);
    for (size_t c = 0; c < C; ++c) EXPECT_EQ(out[r * C + c], c >= 2 && c < 2 + W ? h[r * C + c - 1] : 0);
  }
  // A width over the pitch, and a last row past the end of the allocation, are refused.
  EXPECT_EQ(cudaMemcpy2DAsync(cols, 2, src, C * sizeof(int), 3, R, cudaMemcpyDeviceToDevice, s), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy2DAsync(cols, W * sizeof(int), src + 4, C * sizeof(int), W * sizeof(int), R,
                              cudaMemcpyDeviceToDevice, s),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("source"), std::string::npos);
  cudaGetLastError();
  cudaStreamDestroy(s);
  for (int* p : {src, cols, dst}) EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(RuntimeTwin, CopiesCheckTheirDeviceSide) {
  std::vector<char> host(64), other(64);
  char* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(other.data(), host.data(), 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("cudaMemcpy (cudaMemcpyHostToDevice)"),
            std::string::npos);
  EXPECT_EQ(cudaMemcpy(d + 1, host.data(), 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // one past the end
  EXPECT_EQ(cudaMemcpy(d, host.data(), 64, cudaMemcpyKind(7)), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemset(host.data(), 0, 8), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d + 8, host.data(), 56, cudaMemcpyHostToDevice), cudaSuccess);  // inside the allocation
  cudaGetLastError();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // twice
  cudaGetLastError();
}

TEST_F(RuntimeTwin, MallocHonoursTheMemoryLimit) {
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  void* big = nullptr;
  EXPECT_EQ(cudaMalloc(&big, p.totalGlobalMem + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(big, nullptr);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)).find("TESSERA_SIMT_DEVICE_MEMORY_GIB"),
            std::string::npos);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  void* p0 = nullptr;
  ASSERT_EQ(cudaMalloc(&p0, 1000), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p0) % 256, 0u);
  EXPECT_EQ(cudaFree(p0), cudaSuccess);
  void* zero = &p0;
  EXPECT_EQ(cudaMalloc(&zero, 0), cudaSuccess);
  EXPECT_EQ(zero, nullptr);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
}

TEST_F(RuntimeTwin, PinnedMemory) {
  float* h = nullptr;
  ASSERT_EQ(cudaHostAlloc(&h, 100 * sizeof(float), cudaHostAllocPortable), cudaSuccess);
  h[99] = 1.f;
  EXPECT_EQ(cudaFreeHost(h), cudaSuccess);
  std::vector<float> v(4);
  EXPECT_EQ(cudaFreeHost(v.data()), cudaErrorInvalidValue);
  cudaGetLastError();
}

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer sees one element past the end of a cudaMalloc'd buffer: the allocation is
// exactly the size asked for.
TEST(RuntimeTwinDeathTest, OnePastTheEndIsCaught) {
  EXPECT_DEATH(
      {
        float* p = nullptr;
        cudaMalloc(&p, 10 * sizeof(float));
        volatile float* vp = p;
        vp[10] = 1.f;
      },
      "heap-buffer-overflow");
}
#endif

}  // namespace
