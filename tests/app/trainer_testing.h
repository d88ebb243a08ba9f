// In-process training for the layout tests: a Trainer run step by step on a communicator, and its
// parameters and AdamW moments compared with the 1-rank run's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "app/config.h"
#include "app/trainer.h"
#include "model/parameters.h"

namespace tessera::testing {

// A Trainer after every step of its config, and the losses of those steps.
struct Trained {
  std::unique_ptr<Trainer> trainer;
  std::vector<double> losses;
};

inline Trained train(const Config& cfg, MPI_Comm comm) {
  Trained t{std::make_unique<Trainer>(cfg, "", comm), {}};
  for (int64_t s = 0; s < cfg.train.steps; ++s) t.losses.push_back(t.trainer->step(s).loss);
  return t;
}

// Every parameter and both AdamW moments of `got` (this rank's shards, or its pipeline stage's
// tensors; padding rows left out)
// against the whole tensors of the 1-rank `want`, relative to the largest magnitude of their
// family in `want` (moments of trainable parameters only: frozen ones have none, and the moments lie
// at the layout of the trainable region, ParameterStore::frozen_numel()): the comparison of testing::expect_checkpoints_near (layout_testing.h says
// why not per tensor), without the file. Collective over got's data-parallel group (ZeRO-1
// gathers its moments).
inline void expect_state_near(Trainer& got, Trainer& want, double rel, const std::string& what) {
  const FullOptimizerState gs = got.optimizer().gather_state(), ws = want.optimizer().gather_state();
  const ParameterStore &gp = got.params(), &wp = want.params();
  const char* family[3] = {"parameters", "exp_avg", "exp_avg_sq"};
  const float* g[3] = {gp.flat_params().ptr<float>(), gs.state.exp_avg.ptr<float>(), gs.state.exp_avg_sq.ptr<float>()};
  const float* w[3] = {wp.flat_params().ptr<float>(), ws.state.exp_avg.ptr<float>(), ws.state.exp_avg_sq.ptr<float>()};
  double scale[3] = {1e-30, 1e-30, 1e-30};
  const int64_t w_moments = wp.numel() - wp.frozen_numel();
  for (int f = 0; f < 3; ++f)
    for (int64_t i = 0; i < (f == 0 ? wp.numel() : w_moments); ++i)
      scale[f] = std::max(scale[f], double(std::abs(w[f][i])));
  for (const ParamEntry& e : gp.entries()) {
    const int id = wp.find(e.spec.name);
    EXPECT_GE(id, 0) << what << ": " << e.spec.name << " is not in the 1-rank model";
    if (id < 0) continue;
    EXPECT_EQ(e.frozen, wp.entry(id).frozen) << what << ": " << e.spec.name;
    const int families = e.frozen ? 1 : 3;
    const int64_t at = wp.entry(id).offset;
    double diff[3] = {0, 0, 0};
    for (int64_t i = 0; i < e.local_shape.numel(); ++i) {
      if (e.is_padding(i)) continue;
      const int64_t j = at + global_index(e, i);
      for (int f = 0; f < families; ++f) {
        const int64_t gs_at = f == 0 ? 0 : gp.frozen_numel(), ws_at = f == 0 ? 0 : wp.frozen_numel();
        diff[f] = std::max(diff[f], double(std::abs(g[f][e.offset - gs_at + i] - w[f][j - ws_at])));
      }
    }
    for (int f = 0; f < families; ++f)
      EXPECT_LT(diff[f] / scale[f], rel) << what << " " << e.spec.name << " " << family[f];
  }
}

}  // namespace tessera::testing
