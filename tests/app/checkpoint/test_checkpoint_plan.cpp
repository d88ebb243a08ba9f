// Tests app/checkpoint/checkpoint_plan.h: a flat element range becomes row-major boxes that are exactly that
// range (checked for every range of a 3-D tensor), and selections outside a tensor are named.
#include "app/checkpoint/checkpoint_plan.h"

#include <gtest/gtest.h>

namespace tessera::ckpt {
namespace {

// The row-major flat indices of the boxes' elements, box after box.
std::vector<int64_t> flat_indices(const Shape& g, const std::vector<Box>& boxes) {
  std::vector<int64_t> out;
  for (const Box& b : boxes) {
    EXPECT_EQ(g.ndim(), 3);
    for (int64_t i = b.start[0]; i < b.start[0] + b.count[0]; ++i)
      for (int64_t j = b.start[1]; j < b.start[1] + b.count[1]; ++j)
        for (int64_t k = b.start[2]; k < b.start[2] + b.count[2]; ++k) out.push_back((i * g[1] + j) * g[2] + k);
  }
  return out;
}

TEST(CheckpointPlan, FlatRangesBecomeExactlyTheirElements) {
  const Shape g{3, 4, 5};
  for (int64_t begin = 0; begin < g.numel(); ++begin)
    for (int64_t end = begin + 1; end <= g.numel(); ++end) {
      const auto boxes = selection_boxes(g, TensorSlice::kFlat, begin, {end - begin});
      ASSERT_LE(boxes.size(), 5u) << begin << " " << end;  // at most 2 ndim - 1
      std::vector<int64_t> expected;
      for (int64_t i = begin; i < end; ++i) expected.push_back(i);
      ASSERT_EQ(flat_indices(g, boxes), expected) << begin << " " << end;
    }
}

TEST(CheckpointPlan, FlatRangeCuttingRowsIsThreeBoxes) {
  // (4, 10): elements [7, 33) = row 0 cols 7..9, rows 1..2 whole, row 3 cols 0..2.
  const auto boxes = selection_boxes({4, 10}, TensorSlice::kFlat, 7, {26});
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].start, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(boxes[0].count, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(boxes[1].start, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(boxes[1].count, (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(boxes[2].start, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(boxes[2].count, (std::vector<int64_t>{1, 3}));
}

TEST(CheckpointPlan, SelectionsOutsideTheTensorAreNamed) {
  const Shape g{6, 5};
  EXPECT_EQ(selection_problem(g, TensorSlice::kWhole, 0, {}), "");
  EXPECT_EQ(selection_problem(g, TensorSlice::kWhole, 0, {6, 6}), "shape (6, 6) was asked for");
  EXPECT_EQ(selection_problem(g, 1, 2, {6, 3}), "");
  EXPECT_EQ(selection_problem(g, 1, 3, {6, 3}), "slice [3, 6) along dimension 1 is out of range");
  EXPECT_EQ(selection_problem(g, 0, 0, {2, 4}), "a slice of shape (2, 4) along dimension 0 was asked for");
  EXPECT_EQ(selection_problem(g, 2, 0, {6, 5}), "slice dimension 2 is out of range");
  EXPECT_EQ(selection_problem(g, TensorSlice::kFlat, 25, {5}), "");
  EXPECT_EQ(selection_problem(g, TensorSlice::kFlat, 25, {6}), "the flat slice [25, 31) is out of range");
  EXPECT_EQ(selection_problem(g, TensorSlice::kFlat, 0, {2, 3}),
            "a flat slice needs a one-dimensional shape, not (2, 3)");
}

}  // namespace
}  // namespace tessera::ckpt
