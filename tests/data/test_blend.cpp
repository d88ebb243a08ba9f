// Tests data/blend.h: proportions in every prefix, each component read in order, errors.
#include "data/blend.h"

#include <cmath>

#include "testing.h"

namespace tessera {
namespace {

// Sample i of dataset `tag` is T + 1 copies of tag * 1000 + i.
class TaggedDataset : public Dataset {
 public:
  TaggedDataset(int32_t tag, int64_t n, int64_t T = 4) : tag_(tag), n_(n), T_(T) {}
  int64_t num_samples() const override { return n_; }
  int64_t seq_len() const override { return T_; }
  int64_t vocab_size() const override { return 100000; }
  void get(int64_t i, int32_t* out, uint8_t* mask) const override {
    for (int64_t t = 0; t <= T_; ++t) {
      out[t] = tag_ * 1000 + static_cast<int32_t>(i);
      if (mask) mask[t] = 1;
    }
  }
  std::string describe() const override { return "tagged " + std::to_string(tag_); }

 private:
  int32_t tag_;
  int64_t n_, T_;
};

}  // namespace

TEST(BlendedDataset, EveryPrefixHoldsTheWeights) {
  auto a = std::make_shared<TaggedDataset>(1, 500), b = std::make_shared<TaggedDataset>(2, 500),
       c = std::make_shared<TaggedDataset>(3, 100);
  BlendedDataset blend({a, b, c}, {0.5, 0.3, 0.2});
  // c (100 samples at weight 0.2) limits the blend to 500 samples.
  ASSERT_EQ(blend.num_samples(), 500);
  EXPECT_EQ(blend.count(0), 250);
  EXPECT_EQ(blend.count(1), 150);
  EXPECT_EQ(blend.count(2), 100);
  std::vector<int64_t> seen(4, 0), next(4, 0);
  std::vector<int32_t> w(5);
  for (int64_t i = 0; i < blend.num_samples(); ++i) {
    blend.get(i, w.data(), nullptr);
    const int32_t tag = w[0] / 1000;
    EXPECT_EQ(w[0] % 1000, next[tag]++) << "components are read in order";
    ++seen[tag];
    const double weights[] = {0, 0.5, 0.3, 0.2};
    for (int d = 1; d <= 3; ++d) EXPECT_LE(std::abs(seen[d] - weights[d] * (i + 1)), 1.0) << "prefix " << i + 1;
  }
}

TEST(BlendedDataset, Errors) {
  auto a = std::make_shared<TaggedDataset>(1, 10), other_len = std::make_shared<TaggedDataset>(2, 10, 8);
  EXPECT_THROW(BlendedDataset({a}, {0.0}), Error);
  EXPECT_THROW(BlendedDataset({a, other_len}, {1.0, 1.0}), Error);
  EXPECT_THROW(BlendedDataset({a}, {1.0, 2.0}), Error);
  BlendedDataset one({a}, {3.0});
  EXPECT_EQ(one.num_samples(), 10);
  std::vector<int32_t> w(5);
  EXPECT_THROW(one.get(10, w.data(), nullptr), Error);
}

}  // namespace tessera
