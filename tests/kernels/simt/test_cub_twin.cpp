// The cub::DeviceRadixSort::SortPairs twin (kernels/simt/include/cub/device/device_radix_sort.cuh)
// against std::stable_sort: duplicates keep their input order, a bit range sorts by those bits
// only, signed keys sort negative first, and the temporary storage is checked.
#include <gtest/gtest.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace {

// Sorts (keys, positions 0..n-1) on a stream with CUB's two phases; the sorted keys and values.
template <typename Key>
std::pair<std::vector<Key>, std::vector<int32_t>> sort_on_device(const std::vector<Key>& keys, int begin_bit,
                                                                 int end_bit) {
  const size_t n = keys.size();
  std::vector<int32_t> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = int32_t(i);
  Key *k_in = nullptr, *k_out = nullptr;
  int32_t *v_in = nullptr, *v_out = nullptr;
  EXPECT_EQ(cudaMalloc(&k_in, n * sizeof(Key)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&k_out, n * sizeof(Key)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&v_in, n * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&v_out, n * 4), cudaSuccess);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(k_in, keys.data(), n * sizeof(Key), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(v_in, values.data(), n * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  size_t temp_bytes = 0;
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, v_in, v_out, int(n), begin_bit, end_bit, s),
            cudaSuccess);
  EXPECT_GT(temp_bytes, 0u);
  void* temp = nullptr;
  EXPECT_EQ(cudaMallocAsync(&temp, temp_bytes, s), cudaSuccess);
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k_in, k_out, v_in, v_out, int(n), begin_bit, end_bit, s),
            cudaSuccess);
  EXPECT_EQ(cudaFreeAsync(temp, s), cudaSuccess);
  std::vector<Key> sorted_keys(n);
  std::vector<int32_t> sorted_values(n);
  EXPECT_EQ(cudaMemcpyAsync(sorted_keys.data(), k_out, n * sizeof(Key), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(sorted_values.data(), v_out, n * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  for (void* p : {(void*)k_in, (void*)k_out, (void*)v_in, (void*)v_out}) cudaFree(p);
  return {sorted_keys, sorted_values};
}

// The reference: positions stably sorted by the key's bits [begin_bit, end_bit) (sign flipped).
template <typename Key>
std::vector<int32_t> reference(const std::vector<Key>& keys, int begin_bit, int end_bit) {
  using U = std::make_unsigned_t<Key>;
  auto field = [&](Key k) {
    U u = U(k);
    if (std::is_signed_v<Key>) u ^= U(1) << (sizeof(Key) * 8 - 1);
    const int width = end_bit - begin_bit;
    return width >= int(sizeof(U) * 8) ? u : U((u >> begin_bit) & ((U(1) << width) - 1));
  };
  std::vector<int32_t> order(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = int32_t(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return field(keys[size_t(a)]) < field(keys[size_t(b)]); });
  return order;
}

TEST(CubTwin, StableWithDuplicates) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> id(0, 49);  // many duplicates among 5000
  std::vector<uint32_t> keys(5000);
  for (auto& k : keys) k = id(rng);
  const int bits = 6;  // ids below 64, as embedding.cu's key_bits(vocab)
  const auto [sorted, positions] = sort_on_device(keys, 0, bits);
  EXPECT_EQ(positions, reference(keys, 0, bits));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(sorted[i], keys[size_t(positions[i])]);
  EXPECT_TRUE(std::is_sorted(sorted.begin(), sorted.end()));
}

TEST(CubTwin, FullWidthKeysOverSeveralPasses) {
  std::mt19937 rng(3);
  std::vector<uint32_t> keys(3001);
  for (auto& k : keys) k = rng() % 4 == 0 ? 12345u : rng();
  const auto [sorted, positions] = sort_on_device(keys, 0, 32);
  EXPECT_EQ(positions, reference(keys, 0, 32));
}

// Only bits [4, 12) count: keys equal there keep their input order whatever their other bits.
TEST(CubTwin, BitRange) {
  std::mt19937 rng(11);
  std::vector<uint32_t> keys(2000);
  for (auto& k : keys) k = rng();
  const auto [sorted, positions] = sort_on_device(keys, 4, 12);
  EXPECT_EQ(positions, reference(keys, 4, 12));
  // The odd width: bits [3, 16) in two passes of 8 and 5 bits.
  const auto [sorted2, positions2] = sort_on_device(keys, 3, 16);
  EXPECT_EQ(positions2, reference(keys, 3, 16));
}

TEST(CubTwin, SignedKeysNegativeFirst) {
  std::vector<int32_t> keys = {5, -3, 0, -3, 2147483647, -2147483647 - 1, 7, -1, 5, 0};
  const auto [sorted, positions] = sort_on_device(keys, 0, 32);
  EXPECT_TRUE(std::is_sorted(sorted.begin(), sorted.end()));
  EXPECT_EQ(positions, reference(keys, 0, 32));
}

TEST(CubTwin, ChecksItsArguments) {
  size_t bytes = 0;
  uint32_t k = 0;
  int32_t v = 0;
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, bytes, &k, &k, &v, &v, 1, 0, 33), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, bytes, &k, &k, &v, &v, 100, 0, 32), cudaSuccess);
  size_t too_few = bytes - 1;
  char temp[8];
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp, too_few, &k, &k, &v, &v, 100, 0, 32), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("temporary storage"), std::string::npos);
  cudaGetLastError();
}

}  // namespace
