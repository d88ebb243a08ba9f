// The CUDA attention kernels' launch limits (kernels/cuda/attention_limits.h): host code, so the
// CPU suite checks them. Long-context shapes past 2^31 elements are accepted (the kernels index
// with 64-bit offsets); each refusal names the grid dimension that does not fit.
#include "kernels/cuda/attention_limits.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::cuda {
namespace {

bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// B 16, T 32768, H 32, D 128: 2^31 elements in q (the old check refused it), under GQA and not.
TEST(AttentionLimits, LongContextPast2To31ElementsIsAccepted) {
  for (int64_t KV : {8, 32}) {
    const AttentionSizes s{16, 32768, 32768, 32, KV, 128};
    for (bool bf16 : {false, true})
      for (bool backward : {false, true})
        EXPECT_EQ(attention_launch_error(s, bf16, backward), "") << "KV " << KV << " bf16 " << bf16 << " backward "
                                                                  << backward;
  }
  EXPECT_EQ(attention_merge_launch_error(16, 32768, 32, 128), "");
}

// B x H past 65535: the row kernels put (b, h) on grid dimension y. The bf16 forward launches no
// row kernel (its (b, h) are on x), so it alone accepts it.
TEST(AttentionLimits, BTimesHPast65535IsRefusedNamingGridY) {
  const AttentionSizes s{2048, 64, 64, 32, 8, 64};  // B H = 65536
  for (auto [bf16, backward] : {std::pair{false, false}, std::pair{false, true}, std::pair{true, true}}) {
    const std::string e = attention_launch_error(s, bf16, backward);
    EXPECT_TRUE(mentions(e, "B x H = 65536") && mentions(e, "grid dimension y")) << e;
  }
  EXPECT_EQ(attention_launch_error(s, true, false), "");
  EXPECT_EQ(attention_launch_error({2047, 64, 64, 32, 8, 64}, false, true), "");  // B H = 65504
}

// The bf16 kernels put query tiles (forward, dq) and key tiles (dk/dv) of 64 on grid dimension y:
// T, S <= 64 x 65535. The f32 kernels put rows on x and take them.
TEST(AttentionLimits, Bf16SequencePast65535TilesIsRefusedNamingGridY) {
  const int64_t longest = 64 * 65535;
  EXPECT_EQ(attention_launch_error({1, longest, longest, 1, 1, 64}, true, true), "");
  const std::string t = attention_launch_error({1, longest + 1, 64, 1, 1, 64}, true, false);
  EXPECT_TRUE(mentions(t, "query tiles") && mentions(t, "grid dimension y")) << t;
  const std::string s = attention_launch_error({1, 64, longest + 1, 1, 1, 64}, true, true);
  EXPECT_TRUE(mentions(s, "key tiles") && mentions(s, "grid dimension y")) << s;
  EXPECT_EQ(attention_launch_error({1, 64, longest + 1, 1, 1, 64}, true, false), "");  // the forward: no key grid
  EXPECT_EQ(attention_launch_error({1, longest + 1, longest + 1, 1, 1, 64}, false, true), "");
}

// Every size is an int in the kernels (Geo): a dimension past 2^31 - 1 is refused, naming it.
TEST(AttentionLimits, DimensionsPastIntAreRefused) {
  const std::string e = attention_launch_error({1, int64_t(1) << 31, 64, 1, 1, 64}, false, false);
  EXPECT_TRUE(mentions(e, "T = 2147483648") && mentions(e, "int")) << e;
  EXPECT_TRUE(mentions(attention_merge_launch_error(1, 1, 1, int64_t(1) << 31), "D = 2147483648"));
}

// The merge's rows, 4 per block, on grid dimension x: up to 4 (2^31 - 1) rows.
TEST(AttentionLimits, MergeRowsPastGridXAreRefused) {
  const int64_t most = 4 * kGridXMax;  // rows that fill grid dimension x exactly
  EXPECT_EQ(attention_merge_launch_error(4, kGridXMax, 1, 64), "");
  const std::string e = attention_merge_launch_error(most + 1, 1, 1, 64);
  EXPECT_TRUE(mentions(e, "grid dimension x")) << e;
}

}  // namespace
}  // namespace tessera::cuda
