// Runs the op test cases (op_cases.h) on every backend under test against the CPU's double
// reference, one test per (backend, case): OpCases/OnBackend.Matches/cpu_f32_gelu_forward. And
// checks that the comparison would catch a wrong result: a perturbed output, a case whose
// tolerance could hide a real bug, an output whose reference is all zeros (nothing to compare).
#include <set>
#include <string>
#include <tuple>

#include "op_cases.h"

namespace tessera::testing {
namespace {

// The error of each output of got against want (same names and shapes, in order).
std::vector<double> errors(const std::vector<OpOutput>& got, const std::vector<OpOutput>& want) {
  std::vector<double> e;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].values.shape(), want[i].values.shape()) << got[i].name;
    e.push_back(max_rel_error(got[i].values, want[i].values));
  }
  return e;
}

double scale_of(const HostTensor<double>& t) {
  double s = 0;
  for (double v : t.vec()) s = std::max(s, std::abs(v));
  return s;
}

using Param = std::tuple<size_t, size_t>;  // (backend, case) indices

class OnBackend : public ::testing::TestWithParam<Param> {};

TEST_P(OnBackend, Matches) {
  const auto [bi, ci] = GetParam();
  const BackendUnderTest backend = backends_under_test()[bi];
  const OpCase& c = op_cases()[ci];
  const std::vector<OpOutput> want = run_case(c, reference_backend());
  const std::vector<OpOutput> got = run_case(c, backend);
  const std::vector<double> e = errors(got, want);
  for (size_t i = 0; i < e.size(); ++i)
    EXPECT_LE(e[i], c.tolerance) << c.name << " on " << backend.name << ": output " << got[i].name;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return backends_under_test()[std::get<0>(info.param)].name + "_" + op_cases()[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(OpCases, OnBackend,
                         ::testing::Combine(::testing::Range<size_t>(0, backends_under_test().size()),
                                            ::testing::Range<size_t>(0, op_cases().size())),
                         param_name);

// A backend with one wrong element in any output of any case fails its comparison: an error of
// 1e-3 of the output's scale (a plausible bug: a wrong index, a lost term) exceeds every tolerance.
// Every output is compared, and none is all zeros (a relative error would then mean nothing).
TEST(OpCaseRegistry, CatchesAWrongElementInEveryOutput) {
  for (const BackendUnderTest& backend : backends_under_test())
    for (const OpCase& c : op_cases()) {
      SCOPED_TRACE(c.name + " on " + backend.name);
      const std::vector<OpOutput> want = run_case(c, reference_backend());
      ASSERT_FALSE(want.empty());
      for (size_t i = 0; i < want.size(); ++i) {
        const double scale = scale_of(want[i].values);
        EXPECT_GT(scale, 0.0) << want[i].name;
        std::vector<OpOutput> wrong = run_case(c, backend);
        ASSERT_EQ(wrong.size(), want.size());
        HostTensor<double>& v = wrong[i].values;
        v[v.numel() / 2] += 1e-3 * scale;
        EXPECT_GT(errors(wrong, want)[i], c.tolerance) << want[i].name << " with one element off by 1e-3";
      }
    }
}

// Tolerances are float rounding, not "whatever passed": none is loose enough to let a 1e-4
// relative error through, and every case name is unique (they name the tests).
TEST(OpCaseRegistry, TolerancesAreTightAndNamesUnique) {
  std::set<std::string> names;
  for (const OpCase& c : op_cases()) {
    EXPECT_LT(c.tolerance, 1e-4) << c.name;
    EXPECT_GE(c.tolerance, 0.0) << c.name;
    EXPECT_TRUE(names.insert(c.name).second) << c.name << " twice";
  }
  EXPECT_GE(op_cases().size(), 25u);
}

}  // namespace
}  // namespace tessera::testing
