// Tests parallel/data_parallel.h under 1, 2 and 4 ranks: buckets cover the buffer from its end,
// every element ends up summed over ranks whether buckets start during "backward" or at finish,
// and the object is reusable step after step.
#include "parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <vector>

#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"

namespace tessera {
namespace {

using testing::test_world;

TEST(DataParallel, BucketsSumEveryGradientOverRanks) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const int p = comm.size(), r = comm.rank();
  // Five parameters of 3, 10, 1, 7 and 4 floats; 32-byte buckets cut from the end.
  const std::vector<int64_t> offsets = {0, 3, 13, 14, 21, 25};
  for (bool overlap : {true, false}) {
    std::vector<float> g(25);
    const Tensor grads(g.data(), DType::F32, {25});
    BucketedAllReduce reducer(grads, offsets, 32, comm, overlap);
    // Buckets (from the end): {4, 3} = 44 bytes, {2, 1} = 44 bytes, {0} = 12 bytes.
    EXPECT_EQ(reducer.num_buckets(), 3);
    for (int step = 0; step < 2; ++step) {
      for (int i = 0; i < 25; ++i) g[i] = static_cast<float>((r + 1) * (i + 1) + step);
      // Backward reports the last parameters first; parameter 0 is left for finish().
      reducer.ready(3, 5);
      reducer.ready(1, 3);
      reducer.finish();
      for (int i = 0; i < 25; ++i) {
        const float want = static_cast<float>(p * (p + 1) / 2 * (i + 1) + p * step);
        ASSERT_EQ(g[i], want) << "element " << i << ", step " << step << ", overlap " << overlap;
      }
    }
    EXPECT_THROW({
      reducer.ready(4, 5);
      reducer.ready(4, 5);
    }, Error);
    reducer.finish();
  }
}

}  // namespace
}  // namespace tessera
