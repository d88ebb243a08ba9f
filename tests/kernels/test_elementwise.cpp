// Tests kernels/elementwise.h against plain loops.
#include "kernels/elementwise.h"

#include "op_testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

TEST(Elementwise, ResidualForwardAndBackward) {
  auto a = HostTensor<float>::uniform({5, 7}, 1), b = HostTensor<float>::uniform({5, 7}, 2);
  HostTensor<float> y(a.shape());
  residual_forward(kCpu, y.t(), a.t(), b.t());
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y[i], a[i] + b[i]);
  HostTensor<float> da(a.shape(), 1.0f), db(a.shape());
  residual_backward(kCpu, da.t(), db.t(), y.t());
  for (int64_t i = 0; i < y.numel(); ++i) {
    EXPECT_EQ(da[i], 1.0f + y[i]);
    EXPECT_EQ(db[i], y[i]);
  }
}

TEST(Elementwise, CopyFillScaleNorm) {
  auto a = HostTensor<double>::uniform({100}, 3);
  HostTensor<double> b(a.shape());
  copy(kCpu, b.t(), a.t());
  EXPECT_EQ(a.vec(), b.vec());
  scale(kCpu, b.t(), -2.0);
  double expect = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_EQ(b[i], -2.0 * a[i]);
    expect += 4.0 * a[i] * a[i];
  }
  EXPECT_NEAR(testing::squared_norm_of(b.t()), expect, 1e-12 * expect);
  double total = 0;
  for (int64_t i = 0; i < b.numel(); ++i) total += b[i];
  EXPECT_NEAR(testing::sum_of(b.t()), total, 1e-12 * std::abs(total) + 1e-15);
  HostTensor<int32_t> ids({5});
  ids[0] = -1; ids[1] = 3; ids[2] = -1; ids[3] = 0; ids[4] = 7;
  EXPECT_EQ(testing::count_not_equal_of(ids.t(), -1), 3);
  fill_zero(kCpu, b.t());
  EXPECT_EQ(testing::squared_norm_of(b.t()), 0.0);
}

TEST(Elementwise, RejectsMismatch) {
  HostTensor<float> a({3}), b({4});
  HostTensor<double> c({3});
  EXPECT_THROW(copy(kCpu, a.t(), b.t()), Error);
  EXPECT_THROW(accumulate(kCpu, a.t(), c.t()), Error);
}

TEST(Elementwise, CopyAndPasteColumns) {
  HostTensor<float> wide({3, 5});
  for (int64_t i = 0; i < wide.numel(); ++i) wide[i] = static_cast<float>(i);
  HostTensor<float> narrow({3, 2});
  copy_columns(kCpu, narrow.t(), wide.t(), 2);  // columns 2, 3 of each row
  EXPECT_EQ(narrow.vec(), (std::vector<float>{2, 3, 7, 8, 12, 13}));
  HostTensor<float> back({3, 5});
  paste_columns(kCpu, back.t(), narrow.t(), 3);
  EXPECT_EQ(back.vec(), (std::vector<float>{0, 0, 0, 2, 3, 0, 0, 0, 7, 8, 0, 0, 0, 12, 13}));
  testing::expect_error([&] { copy_columns(kCpu, narrow.t(), wide.t(), 4); },
                        {"copy_columns", "columns [4, 6)", "(3, 5)"});
  HostTensor<float> rows4({4, 2});
  testing::expect_error([&] { paste_columns(kCpu, wide.t(), rows4.t(), 0); },
                        {"paste_columns", "expected (N, w) and (N, W)"});
}

}  // namespace tessera
