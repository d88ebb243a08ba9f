// Helpers for the cross-layout tests: run `tessera train` on N ranks (mpiexec) or one, and compare
// a run's losses and final checkpoint with a reference run's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "cli_testing.h"
#include "mpi_testing.h"

namespace tessera::testing {

// The tiny config of the tp layout tests (cli_testing.h's with the model changed): four heads (tp 4
// splits them), two KV heads for llama (tp 4 replicates them); vocabulary 14 (digits, '+', '=', ...)
// is padded on every tp > 1.
inline std::string layout_config(const std::string& preset) {
  std::string c = kTinyConfig;
  const std::string from = "preset = \"gpt2\"\nn_layer = 2\nn_head = 2\n";
  c.replace(c.find(from), from.size(),
            "preset = \"" + preset + "\"\nn_layer = 2\nn_head = 4\n" + (preset == "llama" ? "n_kv_head = 2\n" : ""));
  return c;
}

// a followed by b: command-line settings put together.
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `tessera train <dir>/<config> --run-dir <dir>/<run> <settings...>`, under mpiexec when ranks > 1.
inline RunResult train_run(const fs::path& dir, const std::string& config, const std::string& run, int ranks,
                           const std::vector<std::string>& settings) {
  std::vector<std::string> args;
  if (ranks > 1) args = {"-n", std::to_string(ranks), TESSERA_BINARY};
  args.insert(args.end(), {"train", (dir / config).string(), "--run-dir", (dir / run).string()});
  args.insert(args.end(), settings.begin(), settings.end());
  return ranks > 1 ? run_program(TESSERA_MPIEXEC, args, dir) : run_tessera(args, dir);
}

// The integer `key` of the last metrics.jsonl record that has it (communication counters: the
// first record does not yet include a stop vote, which follows the record); -1 when none does.
inline int64_t last_metric(const fs::path& metrics, const std::string& key) {
  const std::string text = read_file(metrics), field = "\"" + key + "\": ";
  const auto at = text.rfind(field);
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + field.size()));
}

// Every loss of `got` within rel of `want`, step by step.
inline void expect_losses_near(const std::vector<double>& got, const std::vector<double>& want, double rel,
                               const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << " step " << i + 1;
}

// Every tensor of checkpoint `got` against `want`'s: max |got - want| relative to the largest
// magnitude of its family in `want` (parameters, first moments, second moments). A per-tensor
// scale would not do: a tensor that is near zero because its gradient cancels (the attention key
// bias, whose exact gradient is zero; a bias whose gradient changes sign) moves by rounding noise
// that AdamW amplifies, by far less than lr, but by a large fraction of itself.
inline void expect_checkpoints_near(const fs::path& got, const fs::path& want, double rel, const std::string& what) {
  CheckpointReader a(got.string(), test_world()), b(want.string(), test_world());
  ASSERT_EQ(a.tensors().size(), b.tensors().size()) << what;
  auto family = [](const std::string& path) {
    if (path.rfind("/model/", 0) == 0) return 0;
    return path.size() > 7 && path.compare(path.size() - 7, 7, "_avg_sq") == 0 ? 2 : 1;
  };
  double scale[3] = {1e-30, 1e-30, 1e-30};
  for (const auto& t : b.tensors())
    for (float v : b.read_all(t.path)) scale[family(t.path)] = std::max(scale[family(t.path)], double(std::abs(v)));
  for (const auto& t : b.tensors()) {
    const auto x = a.read_all(t.path), y = b.read_all(t.path);
    ASSERT_EQ(x.size(), y.size()) << what << " " << t.path;
    double diff = 0;
    for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, double(std::abs(x[i] - y[i])));
    EXPECT_LT(diff / scale[family(t.path)], rel) << what << " " << t.path;
  }
}

// Every tensor of checkpoint `got` bit-equal to `want`'s (parameters and both AdamW moments).
inline void expect_checkpoints_equal(const fs::path& got, const fs::path& want, const std::string& what) {
  CheckpointReader a(got.string(), test_world()), b(want.string(), test_world());
  ASSERT_EQ(a.tensors().size(), b.tensors().size()) << what;
  for (const auto& t : b.tensors()) {
    const auto x = a.read_all(t.path), y = b.read_all(t.path);
    ASSERT_EQ(x.size(), y.size()) << what << " " << t.path;
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += std::memcmp(&x[i], &y[i], sizeof(x[i])) != 0;
    EXPECT_EQ(differ, 0u) << what << " " << t.path << ": elements not bit-equal";
  }
}

// A checkpoint written under one layout continues under another: `name`, `ranks_before` ranks with
// `before` for the first 6 of 8 steps, then resumed on `ranks_after` with `after`.
struct LayoutHop {
  std::string name;
  int ranks_before;
  std::vector<std::string> before;
  int ranks_after;
  std::vector<std::string> after;
};

// dir/config trained 8 steps on one rank ("one", with `settings`; it must write a checkpoint at
// step 6), then each hop: its resumed last two losses equal the 1-rank run's within 1e-5, and with
// `tensors` every tensor of its step-8 checkpoint too.
inline void expect_resumes_across_layouts(const fs::path& dir, const std::string& config,
                                          const std::vector<std::string>& settings, const std::vector<LayoutHop>& hops,
                                          bool tensors) {
  auto r = train_run(dir, config, "one", 1, settings);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 8u);
  const std::vector<double> last_two(want.end() - 2, want.end());
  for (const LayoutHop& h : hops) {
    r = train_run(dir, config, h.name, h.ranks_before, with(settings, with(h.before, {"--set", "train.exit_after_steps=6"})));
    ASSERT_EQ(r.exit_code, 0) << h.name << ": " << r.output;
    r = train_run(dir, config, h.name, h.ranks_after, with(settings, h.after));
    ASSERT_EQ(r.exit_code, 0) << h.name << ": " << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    const auto got = losses(dir / h.name / "metrics.jsonl");
    ASSERT_EQ(got.size(), 8u) << h.name;
    expect_losses_near(std::vector<double>(got.end() - 2, got.end()), last_two, 1e-5, h.name);
    if (tensors)
      expect_checkpoints_near(dir / h.name / "checkpoints" / "step_00000008.h5",
                              dir / "one" / "checkpoints" / "step_00000008.h5", 1e-5, h.name);
  }
}

}  // namespace tessera::testing
