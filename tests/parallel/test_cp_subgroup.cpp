// Tests parallel/cp_subgroup.h: under mpiexec (CpSubgroup.{one,four}_ranks) every aligned subgroup's
// ring exchange reaches the right parent ranks, rank() and size() follow the selection, collectives
// run over the whole group only, a subgroup without this rank is refused, and the scope restores
// the whole group.
#include "parallel/cp_subgroup.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/check.h"
#include "mpi_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"

namespace tessera {
namespace {
using testing::test_world;

TEST(CpSubgroup, RingsOverEveryAlignedSubgroup) {
  MpiCommunicator world = MpiCommunicator::duplicate(test_world());
  CpSubgroupComm sub(world);
  const int P = world.size(), r = world.rank();
  EXPECT_EQ(sub.size(), P);
  EXPECT_EQ(sub.rank(), r);
  for (int s = 2; s <= P; ++s) {
    if (P % s != 0) continue;
    const int first = r / s * s;
    const CpSubgroupScope scope(&sub, first, s);
    ASSERT_EQ(sub.size(), s);
    ASSERT_EQ(sub.rank(), r - first);
    // Send this world rank to the next member, receive the previous member's.
    float out = static_cast<float>(r), in = -1;
    sub.batch_send_recv({P2POp::send(Tensor(&out, DType::F32, {1}), (sub.rank() + 1) % s, 3),
                         P2POp::recv(Tensor(&in, DType::F32, {1}), (sub.rank() + s - 1) % s, 3)});
    EXPECT_EQ(in, static_cast<float>(first + (r - first + s - 1) % s)) << "subgroup of " << s;
    if (s < P) {  // collectives only over the whole group
      EXPECT_THROW(sub.all_reduce(Tensor(&out, DType::F32, {1})), Error);
    }
  }
  EXPECT_EQ(sub.size(), P);  // the scopes restored the whole group
  float x = 1;
  sub.all_reduce(Tensor(&x, DType::F32, {1}));
  EXPECT_EQ(x, static_cast<float>(P));
  // Alone: nothing to exchange, size 1.
  {
    const CpSubgroupScope alone(&sub, r, 1);
    EXPECT_EQ(sub.size(), 1);
    EXPECT_EQ(sub.rank(), 0);
  }
  if (P > 1) EXPECT_THROW(sub.select((r + 1) % P, 1), Error);  // a subgroup that does not hold this rank
}

}  // namespace
}  // namespace tessera
