// sum_over_group / sum_over_grid: the values viewed as an F64 tensor and all-reduced in place.
#include "parallel/host_sums.h"

#include "kernels/tensor.h"

namespace tessera {

void sum_over_group(std::vector<double>& values, Communicator* group) {
  if (!group || group->size() == 1 || values.empty()) return;
  group->all_reduce(Tensor(values.data(), DType::F64, {static_cast<int64_t>(values.size())}), ReduceOp::Sum);
}

void sum_over_grid(std::vector<double>& values, GridComms* comms) {
  if (!comms) return;
  sum_over_group(values, comms->world.get());  // one all-reduce over every rank
}

}  // namespace tessera
