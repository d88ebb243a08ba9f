// CUDA token + position embedding (kernels/embedding.h). The backward is deterministic without
// float atomics: the positions are sorted by token id (CUB's stable radix sort), and the first
// position of each id's run adds the run's rows into the table row in position order, so each
// table row has one writer and the sums come out as the CPU's (same order, bit for bit).
// CUB's sort takes an int count and the positions are int32: B x T above INT_MAX is refused.
#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

// out[bt, c] = wte[tokens[bt] - start, c] (0 when another rank holds the id) + wpe[pos_offset + t, c].
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                         int64_t T, int64_t C, int64_t n, int64_t pos_offset, int64_t start,
                                         int64_t held) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    const int64_t r = int64_t(tokens[bt]) - start;
    const float e = r >= 0 && r < held ? wte[r * C + c] : 0.0f;
    out[i] = wpe ? e + wpe[(pos_offset + bt % T) * C + c] : e;
  }
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// Block i (grid-stride over the BT sorted positions): when i starts a run of equal ids, adds the
// run's dout rows, in position order, into the id's table row. Threads split the columns.
__global__ void token_grad_kernel(float* dwte, const float* dout, const uint32_t* ids, const int32_t* positions,
                                  int64_t BT, int64_t C, int64_t start, int64_t held) {
  for (int64_t i = blockIdx.x; i < BT; i += gridDim.x) {
    const uint32_t id = ids[i];
    if (i > 0 && ids[i - 1] == id) continue;  // not the first of its run
    const int64_t r = int64_t(id) - start;
    if (r < 0 || r >= held) continue;  // held by another rank
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dwte[r * C + c];
      for (int64_t j = i; j < BT && ids[j] == id; ++j) acc += dout[int64_t(positions[j]) * C + c];
      dwte[r * C + c] = acc;
    }
  }
}

// dwpe[pos_offset + t, c] += sum over b of dout[b, t, c], b in order; one thread per (t, c).
__global__ void position_grad_kernel(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C,
                                     int64_t pos_offset) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float acc = dwpe[(pos_offset + t) * C + c];
    for (int64_t b = 0; b < B; ++b) acc += dout[(b * T + t) * C + c];
    dwpe[(pos_offset + t) * C + c] = acc;
  }
}

// Every id of tokens (B, T) in [0, V), or an Error as the CPU backend's.
void check_token_ids(const char* op, const Exec& ex, const Tensor& tokens, int64_t V) {
  const BadId bad = first_bad_id(op, ex, tokens, V, false, 0);
  const int64_t T = tokens.dim(1);
  TESSERA_CHECK(bad.index < 0, op, ": token id ", bad.value, " at (b=", bad.index / T, ", t=", bad.index % T,
                ") is outside the vocabulary [0, ", V, ")");
}

// Bits that hold every id below V (radix sort passes only over those).
int key_bits(int64_t V) {
  int bits = 1;
  while (bits < 32 && (int64_t(1) << bits) < V) ++bits;
  return bits;
}

}  // namespace

void embedding_forward(const Exec& ex, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, const VocabShard& shard) {
  const char* op = "embedding_forward";
  require_f32(op, wte);
  use_device(op, ex);
  const VocabShard s = shard.resolved(wte.dim(0));
  check_token_ids(op, ex, tokens, s.vocab);
  const int64_t T = tokens.dim(1), C = wte.dim(1), n = out.numel();
  if (n == 0) return;
  embedding_forward_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(
      out.ptr<float>(), tokens.ptr<int32_t>(), wte.ptr<float>(), wpe.defined() ? wpe.ptr<float>() : nullptr, T, C, n,
      pos_offset, s.start, s.valid);
  check_launch(op);
}

void embedding_backward(const Exec& ex, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, int64_t pos_offset, const VocabShard& shard) {
  const char* op = "embedding_backward";
  require_f32(op, dwte);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dwte.dim(1), BT = B * T;
  // Before anything reads the tokens: CUB's radix sort counts items in an int and the sorted
  // positions are int32 (splitting the sort would break the one-writer, position-order sums).
  TESSERA_CHECK(BT <= INT_MAX, op, ": B x T = ", B, " x ", T, " = ", BT, " positions exceed the CUDA backward's limit of ",
                INT_MAX, " (CUB's int item count and int32 positions); use smaller micro-batches");
  use_device(op, ex);
  const VocabShard s = shard.resolved(dwte.dim(0));
  check_token_ids(op, ex, tokens, s.vocab);
  if (BT == 0 || C == 0) return;
  cudaStream_t st = stream_of(ex);

  // Positions sorted by id (stable: positions ascending within an id). The ids were checked to be
  // in [0, vocab), so they sort as unsigned keys.
  Scratch positions(op, ex, size_t(BT) * sizeof(int32_t)), sorted_positions(op, ex, size_t(BT) * sizeof(int32_t));
  Scratch sorted_ids(op, ex, size_t(BT) * sizeof(uint32_t));
  iota_kernel<<<blocks_for(BT), kThreads, 0, st>>>(positions.as<int32_t>(), BT);
  check_launch(op);
  const uint32_t* ids = reinterpret_cast<const uint32_t*>(tokens.ptr<int32_t>());
  const int bits = key_bits(s.vocab);
  size_t temp_bytes = 0;
  check_cuda(op, cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, sorted_ids.as<uint32_t>(),
                                                 positions.as<int32_t>(), sorted_positions.as<int32_t>(),
                                                 static_cast<int>(BT), 0, bits, st));
  Scratch temp(op, ex, temp_bytes);
  check_cuda(op, cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, ids, sorted_ids.as<uint32_t>(),
                                                 positions.as<int32_t>(), sorted_positions.as<int32_t>(),
                                                 static_cast<int>(BT), 0, bits, st));
  const unsigned grid = static_cast<unsigned>(BT < 65535 ? BT : 65535);
  token_grad_kernel<<<grid, kThreads, 0, st>>>(dwte.ptr<float>(), dout.ptr<float>(), sorted_ids.as<uint32_t>(),
                                               sorted_positions.as<int32_t>(), BT, C, s.start, s.valid);
  check_launch(op);
  if (dwpe.defined()) {
    position_grad_kernel<<<blocks_for(T * C), kThreads, 0, st>>>(dwpe.ptr<float>(), dout.ptr<float>(), B, T, C,
                                                                 pos_offset);
    check_launch(op);
  }
}

}  // namespace tessera::cuda
