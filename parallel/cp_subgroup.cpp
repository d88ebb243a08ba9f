// Dynamic cp's subgroup view of the cp communicator (cp_subgroup.h).
#include "parallel/cp_subgroup.h"

#include "kernels/check.h"

namespace tessera {

CpSubgroupComm::CpSubgroupComm(Communicator& parent) : parent_(&parent), ranks_(parent.size()) {
  set_profiler(parent.profiler());
  set_wait_slot(parent.wait_slot());
}

void CpSubgroupComm::select(int64_t first, int64_t ranks) {
  const int64_t r = parent_->rank();
  TESSERA_CHECK(ranks >= 1 && first >= 0 && first + ranks <= parent_->size() && r >= first && r < first + ranks,
                "dynamic cp: cp rank ", r, " selected the subgroup [", first, ", ", first + ranks, ") of a cp group of ",
                parent_->size(), " ranks, which does not hold it");
  first_ = first;
  ranks_ = ranks;
}

void CpSubgroupComm::require_whole(const char* op) const {
  TESSERA_CHECK(ranks_ == parent_->size(), "dynamic cp: ", op, " over the cp subgroup [", first_, ", ",
                first_ + ranks_, "): subgroups run point-to-point rings only");
}

CommHandle CpSubgroupComm::start_all_reduce(Tensor t, ReduceOp op) {
  require_whole("all_reduce");
  return parent_->all_reduce_async(t, op);
}
CommHandle CpSubgroupComm::start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) {
  require_whole("reduce_scatter");
  return parent_->reduce_scatter_async(input, output, op);
}
CommHandle CpSubgroupComm::start_all_gather(Tensor input, Tensor output) {
  require_whole("all_gather");
  return parent_->all_gather_async(input, output);
}
CommHandle CpSubgroupComm::start_broadcast(Tensor t, int root) {
  require_whole("broadcast");
  return parent_->broadcast_async(t, root);
}
CommHandle CpSubgroupComm::start_send(Tensor t, int dst, int tag) { return parent_->send_async(t, to_parent(dst), tag); }
CommHandle CpSubgroupComm::start_recv(Tensor t, int src, int tag) { return parent_->recv_async(t, to_parent(src), tag); }
CommHandle CpSubgroupComm::start_batch_send_recv(const std::vector<P2POp>& ops) {
  std::vector<P2POp> mapped = ops;
  for (P2POp& o : mapped) o.peer = to_parent(o.peer);
  return parent_->batch_send_recv_async(mapped);
}

}  // namespace tessera
