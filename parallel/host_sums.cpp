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
  // A rank's tp, cp, dp and pp groups together span the grid: summing over each in turn sums over
  // every rank. (With a world communicator in GridComms, this is one all-reduce over it.)
  for (Communicator* c : {&comms->tp, &comms->cp, &comms->dp, &comms->pp}) sum_over_group(values, c);
}

}  // namespace tessera
