// BucketedAllReduce: buckets cut from the end of the buffer, each summed by an asynchronous
// all-reduce when its last parameter becomes ready.
#include "parallel/data_parallel.h"

#include <algorithm>

#include "kernels/check.h"

namespace tessera {

BucketedAllReduce::BucketedAllReduce(const Tensor& grads, std::vector<int64_t> offsets, int64_t bucket_bytes,
                                     Communicator& comm, bool overlap)
    : grads_(grads.view({grads.numel()})), offsets_(std::move(offsets)), comm_(comm), overlap_(overlap) {
  const int n = static_cast<int>(offsets_.size()) - 1;
  TESSERA_CHECK(n >= 1 && offsets_.front() == 0 && offsets_.back() == grads.numel(),
                "BucketedAllReduce: parameter offsets must cover the gradient buffer");
  TESSERA_CHECK(bucket_bytes > 0, "parallel.bucket_mb must be positive");
  bucket_of_.assign(static_cast<size_t>(n), -1);
  is_ready_.assign(static_cast<size_t>(n), 0);
  const int64_t elem = static_cast<int64_t>(dtype_size(grads.dtype));
  int end = n;
  while (end > 0) {
    int first = end;
    int64_t bytes = 0;
    while (first > 0 && bytes < bucket_bytes) {
      --first;
      bytes += (offsets_[first + 1] - offsets_[first]) * elem;
    }
    for (int p = first; p < end; ++p) bucket_of_[static_cast<size_t>(p)] = static_cast<int>(buckets_.size());
    Bucket b;
    b.first = first;
    b.end = end;
    b.pending = end - first;
    buckets_.push_back(std::move(b));
    end = first;
  }
}

void BucketedAllReduce::start(Bucket& b) {
  b.handle = comm_.all_reduce_async(grads_.slice_rows(offsets_[b.first], offsets_[b.end]), ReduceOp::Sum);
}

void BucketedAllReduce::ready(int first, int end) {
  for (int p = first; p < end; ++p) {
    char& flag = is_ready_[static_cast<size_t>(p)];
    TESSERA_CHECK(!flag, "BucketedAllReduce: parameter ", p, " reported ready twice in one step");
    flag = 1;
    Bucket& b = buckets_[static_cast<size_t>(bucket_of_[static_cast<size_t>(p)])];
    if (--b.pending == 0 && overlap_) start(b);
  }
}

void BucketedAllReduce::finish() {
  for (Bucket& b : buckets_)
    if (b.pending > 0 || !overlap_) start(b);  // parameters never reported (e.g. unused) still reduce
  for (Bucket& b : buckets_) {
    b.handle.wait();
    b.pending = b.end - b.first;  // ready for the next step
  }
  std::fill(is_ready_.begin(), is_ready_.end(), 0);
}

}  // namespace tessera
