// Test helper for imported checkpoints: the forward of a checkpoint's model on one sequence, its
// weights loaded as `generate` loads them (shared by test_hf_import.cpp and
// test_hf_import_transformers.cpp).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/hf_export.h"
#include "kernels/allocator.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "testing.h"

namespace tessera::testing {

struct CheckpointForward {
  std::vector<float> logits;  // (T, V) row-major, T = ids.size() - 1
  double loss = 0;            // mean cross-entropy of predicting ids[1:] from ids[:-1]
};

// The checkpoint's model on ids[:-1] with targets ids[1:], in float32 on the CPU.
inline CheckpointForward forward_checkpoint(const std::filesystem::path& file, const std::vector<int32_t>& ids) {
  const CheckpointReader r(file.string(), MPI_COMM_SELF);
  const ModelConfig mc = model_config_of(r);
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt(mc, ps);
  ps.finalize();
  for (int id = 0; id < ps.size(); ++id)
    r.read("/model/" + ps.entry(id).spec.name, -1, 0, ps.entry(id).local_shape, ps.param(id).ptr<float>());
  const int64_t T = static_cast<int64_t>(ids.size()) - 1;
  HostTensor<int32_t> tokens(Shape{1, T}), targets(Shape{1, T});
  for (int64_t t = 0; t < T; ++t) {
    tokens[t] = ids[static_cast<size_t>(t)];
    targets[t] = ids[static_cast<size_t>(t + 1)];
  }
  GptCtx ctx;
  gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t());
  const Tensor l = ctx.logits.tensor();
  return {{l.ptr<float>(), l.ptr<float>() + l.numel()}, read_loss_sums(kCpu, ctx.loss_sums).mean()};
}

}  // namespace tessera::testing
