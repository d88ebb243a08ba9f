// Dynamic context parallelism's communicator (parallel.cp_mode = "dynamic"): the cp group seen
// through a selectable aligned subgroup of its ranks, so that the model's attention (which holds one
// Communicator for its ring) runs each pass's ring over the ranks that split its rows. Key decision:
// no new MPI/NCCL communicators; a subgroup's ring is the parent's point-to-point ops with ranks
// mapped, which every backend has, and passes run in one global order (parallel/dynamic_cp.h
// cp_passes) so that their messages never cross.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/communicator.h"

namespace tessera {

class CpSubgroupComm : public Communicator {
 public:
  // Selects the whole of parent. Takes parent's profiler and wait slot (the watchdog's).
  explicit CpSubgroupComm(Communicator& parent);

  // The ops that follow run over parent's ranks [first, first + ranks), which must hold this rank
  // (an Error otherwise); rank() and size() are then this rank's within them. ranks = 1: this rank
  // alone (nothing to exchange).
  void select(int64_t first, int64_t ranks);
  void select_all() { select(0, parent_->size()); }
  int64_t first() const { return first_; }

  int size() const override { return static_cast<int>(ranks_); }
  int rank() const override { return static_cast<int>(parent_->rank() - first_); }

 protected:
  // Point-to-point: peers mapped into parent's ranks. Collectives only over the whole parent (the
  // all-gather mode is refused with dynamic cp): an Error naming the subgroup otherwise.
  CommHandle start_all_reduce(Tensor t, ReduceOp op) override;
  CommHandle start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) override;
  CommHandle start_all_gather(Tensor input, Tensor output) override;
  CommHandle start_broadcast(Tensor t, int root) override;
  CommHandle start_send(Tensor t, int dst, int tag) override;
  CommHandle start_recv(Tensor t, int src, int tag) override;
  CommHandle start_batch_send_recv(const std::vector<P2POp>& ops) override;

 private:
  void require_whole(const char* op) const;
  int to_parent(int peer) const { return static_cast<int>(first_ + peer); }
  Communicator* parent_;
  int64_t first_ = 0, ranks_ = 1;
};

// Selects a subgroup for a scope, and the whole group again at its end.
class CpSubgroupScope {
 public:
  CpSubgroupScope(CpSubgroupComm* comm, int64_t first, int64_t ranks) : comm_(comm) {
    if (comm_) comm_->select(first, ranks);
  }
  ~CpSubgroupScope() {
    if (comm_) comm_->select_all();
  }
  CpSubgroupScope(const CpSubgroupScope&) = delete;
  CpSubgroupScope& operator=(const CpSubgroupScope&) = delete;

 private:
  CpSubgroupComm* comm_;
};

}  // namespace tessera
