// Data-parallel gradient reduction in buckets that start while backward still runs. It knows
// only a flat gradient buffer cut into ranges (one per parameter, in buffer order): the caller
// says when ranges are final, and each bucket's all-reduce starts as soon as all of its ranges are.
// Parameters finish from the end of the buffer to its start (last layer first), so buckets are
// cut from the end.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"
#include "parallel/communicator.h"

namespace tessera {

class BucketedAllReduce {
 public:
  // grads: the flat (N) buffer; offsets: parameter p occupies [offsets[p], offsets[p + 1]).
  // bucket_bytes: a bucket closes once it holds at least this many bytes (whole parameters).
  // overlap = false starts every bucket in finish() instead (to measure what overlap buys).
  BucketedAllReduce(const Tensor& grads, std::vector<int64_t> offsets, int64_t bucket_bytes, Communicator& comm,
                    bool overlap = true);

  // Parameters [first, end) hold their final gradients for this step.
  void ready(int first, int end);
  // Starts what is left and waits for every bucket: the gradients are then summed over ranks.
  void finish();
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int first = 0, end = 0;  // parameters
    int pending = 0;         // parameters not yet ready this step
    CommHandle handle;
  };
  void start(Bucket& b);
  Tensor grads_;
  std::vector<int64_t> offsets_;
  std::vector<int> bucket_of_;  // per parameter
  std::vector<char> is_ready_;  // per parameter, this step
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  bool overlap_;
};

}  // namespace tessera
