// SIMT stand-in for CUB's <cub/device/device_radix_sort.cuh> (-DTESSERA_SIMT=ON only): the
// pointer overload of cub::DeviceRadixSort::SortPairs that kernels/cuda/embedding.cu calls, with
// CUB's two phases (a temporary-storage size query with d_temp_storage == nullptr, then the sort
// queued on the stream). A stable LSD radix sort of 8-bit digits over [begin_bit, end_bit) that
// ping-pongs between the caller's output and its temporary storage, as CUB's does.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/simt/runtime_api.h"
#include "kernels/simt/stream.h"

namespace cub {

struct DeviceRadixSort {
  // Sorts (key, value) pairs by key, stably. Keys are integers; a signed key's sign bit is
  // flipped first (CUB's "twiddle"), so that negative keys sort first over all the key's bits.
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<KeyT>, "the SIMT twin of cub::DeviceRadixSort sorts integer keys");
    static_assert(std::is_trivially_copyable_v<ValueT>, "values are moved as bytes");
    const char* call = "cub::DeviceRadixSort::SortPairs";
    if (num_items < 0 || begin_bit < 0 || end_bit > int(sizeof(KeyT) * 8) || begin_bit > end_bit) {
      tessera::simt::set_last_error(cudaErrorInvalidValue,
                                    std::string(call) + ": " + std::to_string(num_items) + " items, bits [" +
                                        std::to_string(begin_bit) + ", " + std::to_string(end_bit) + ") of a " +
                                        std::to_string(sizeof(KeyT) * 8) + "-bit key");
      return cudaErrorInvalidValue;
    }
    const size_t n = static_cast<size_t>(num_items);
    const size_t needed = temp_bytes<KeyT, ValueT>(n);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (temp_storage_bytes < needed) {
      tessera::simt::set_last_error(cudaErrorInvalidValue, std::string(call) + ": " + std::to_string(temp_storage_bytes) +
                                                               " bytes of temporary storage, " +
                                                               std::to_string(needed) + " needed");
      return cudaErrorInvalidValue;
    }
    if (n == 0) return cudaSuccess;
    tessera::simt::enqueue(stream, call, [=] {
      sort(static_cast<unsigned char*>(d_temp_storage), d_keys_in, d_keys_out, d_values_in, d_values_out, n,
           begin_bit, end_bit);
    });
    return cudaSuccess;
  }

 private:
  static constexpr size_t kAlign = 256;
  static constexpr int kDigitBits = 8;

  // A second buffer of keys and one of values (each 256-byte aligned), as the ping-pong needs.
  static size_t round_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
  template <typename KeyT, typename ValueT>
  static size_t temp_bytes(size_t n) {
    return round_up(n * sizeof(KeyT)) + round_up(n * sizeof(ValueT)) + kAlign;
  }

  template <typename KeyT>
  static auto bits_of(KeyT k) {
    using U = std::make_unsigned_t<KeyT>;
    U u = static_cast<U>(k);
    if constexpr (std::is_signed_v<KeyT>) u ^= U(1) << (sizeof(KeyT) * 8 - 1);
    return u;
  }

  template <typename KeyT, typename ValueT>
  static void sort(unsigned char* temp, const KeyT* keys_in, KeyT* keys_out, const ValueT* values_in,
                   ValueT* values_out, size_t n, int begin_bit, int end_bit) {
    auto* temp_keys = reinterpret_cast<KeyT*>(temp);
    auto* temp_values = reinterpret_cast<ValueT*>(temp + round_up(n * sizeof(KeyT)));
    const int passes = (end_bit - begin_bit + kDigitBits - 1) / kDigitBits;
    if (passes == 0) {
      std::memcpy(keys_out, keys_in, n * sizeof(KeyT));
      std::memcpy(values_out, values_in, n * sizeof(ValueT));
      return;
    }
    const KeyT* src_k = keys_in;
    const ValueT* src_v = values_in;
    for (int pass = 0; pass < passes; ++pass) {
      // The last pass writes the caller's output; the ones before alternate so that it does.
      const bool to_out = (passes - 1 - pass) % 2 == 0;
      KeyT* dst_k = to_out ? keys_out : temp_keys;
      ValueT* dst_v = to_out ? values_out : temp_values;
      const int shift = begin_bit + pass * kDigitBits;
      const int width = end_bit - shift < kDigitBits ? end_bit - shift : kDigitBits;
      const auto mask = (1u << width) - 1u;
      size_t count[(1 << kDigitBits) + 1] = {};
      for (size_t i = 0; i < n; ++i) ++count[((bits_of(src_k[i]) >> shift) & mask) + 1];
      for (int d = 0; d < (1 << kDigitBits); ++d) count[d + 1] += count[d];
      for (size_t i = 0; i < n; ++i) {  // in input order: stable
        const size_t at = count[(bits_of(src_k[i]) >> shift) & mask]++;
        dst_k[at] = src_k[i];
        dst_v[at] = src_v[i];
      }
      src_k = dst_k;
      src_v = dst_v;
    }
  }
};

}  // namespace cub
