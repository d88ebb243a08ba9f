// parallel.tp_overlap_chunks (parallel/tp_overlap.h) in the GPT: on 2 and 4 ranks (one tp group
// under sequence parallelism, double precision), the model with its region edges cut into k chunks
// equals the same shard without overlap: the loss and every gradient bit for bit, for both presets
// (gpt2: LayerNorm, GELU, tied head; llama: RMSNorm, SwiGLU, grouped KV heads, replicated under
// tp4), for chunk counts with and without remainders, and with full and selective recomputation (the forward
// re-run inside the backward takes the chunked path too). Bit-equal because no sum changes order:
// chunks cut the sequence, GEMM rows are independent of the rows beside them, the weight gradients
// run once over the whole gathered sequence, and each reduce-scatter element sums the same tp
// values. And model/memory.h counts the chunked edges' buffers (ModelMemoryLayout::tp_overlap_chunks)
// to the byte against the allocator. Slow: multi-rank only (one rank has no tp group to overlap).
#include <gtest/gtest.h>

#include "kernels/cross_entropy.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"
#include "tp_model_testing.h"

namespace tessera {
using testing::kCpu;
namespace {

struct Case {
  std::string preset;
  int64_t chunks;
  Recompute recompute;
};


class GptTpOverlapSlow : public ::testing::TestWithParam<Case> {};

TEST_P(GptTpOverlapSlow, ChunkedEdgesEqualTheBlockingShardBitForBit) {
  const Case c = GetParam();
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int tp = comm.size(), rank = comm.rank();
  if (tp == 1) GTEST_SKIP() << "needs a tp group (mpiexec -n 2 or 4)";
  const ModelConfig cfg = testing::tp_model_config(c.preset, 12);
  testing::TpModel plain(cfg, {tp, rank}, c.recompute, TensorParallel{&comm, true});
  testing::TpModel chunked(cfg, {tp, rank}, c.recompute, TensorParallel{&comm, true, c.chunks});
  const int64_t B = 2, T = 12;
  auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 5);
  auto targets = testing::random_ids({B, T}, cfg.vocab_size, 6);
  targets[3] = kIgnoreIndex;
  GptCtx pctx, cctx;
  plain.gpt.forward(kCpu, pctx, plain.alloc, tokens.t(), targets.t());
  chunked.gpt.forward(kCpu, cctx, chunked.alloc, tokens.t(), targets.t());
  const LossSums want = read_loss_sums(kCpu, pctx.loss_sums), got = read_loss_sums(kCpu, cctx.loss_sums);
  EXPECT_EQ(got.loss_sum, want.loss_sum) << "rank " << rank;
  const double scale = 1.0 / static_cast<double>(want.targets);
  plain.gpt.backward(kCpu, pctx, plain.alloc, scale);
  chunked.gpt.backward(kCpu, cctx, chunked.alloc, scale);
  for (int id = 0; id < plain.ps.size(); ++id) {
    const Tensor w = plain.ps.grad(id), g = chunked.ps.grad(id);
    int64_t differing = 0;
    for (int64_t i = 0; i < w.numel(); ++i) differing += w.ptr<double>()[i] != g.ptr<double>()[i];
    EXPECT_EQ(differing, 0) << plain.ps.entry(id).spec.name << " on rank " << rank << " of " << tp << ", k = " << c.chunks;
  }
}

// model/memory.h with the edges chunked: what the forward keeps, the peak of the forward, of
// forward + backward, and of a forward without targets equal the allocator's counts exactly (the
// chunks' send and receive buffers and partial sums, each GEMM's rows of one chunk, k's and v's
// all-heads rows under replicated KV heads). The k = 1 count (the estimate before the chunks were
// counted) is off on every case here.
TEST_P(GptTpOverlapSlow, MemoryEqualsTheAnalyticModel) {
  const Case c = GetParam();
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int tp = comm.size(), rank = comm.rank();
  if (tp == 1) GTEST_SKIP() << "needs a tp group (mpiexec -n 2 or 4)";
  const ModelConfig cfg = testing::tp_model_config(c.preset, 12);
  testing::TpModel chunked(cfg, {tp, rank}, c.recompute, TensorParallel{&comm, true, c.chunks});
  const int64_t B = 2, T = 12;
  ModelMemoryLayout layout{B, T, tp, true, c.recompute};
  layout.tp_overlap_chunks = c.chunks;
  const ModelMemory m = model_memory(cfg, layout);
  const std::string what = "rank " + std::to_string(rank) + " of " + std::to_string(tp) + ", k = " +
                           std::to_string(c.chunks);
  const size_t state = chunked.alloc.total_current(), bytes = sizeof(double);
  auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 5);
  auto targets = testing::random_ids({B, T}, cfg.vocab_size, 6);
  GptCtx ctx;
  chunked.gpt.forward(kCpu, ctx, chunked.alloc, tokens.t(), targets.t());
  EXPECT_EQ(chunked.alloc.counter(MemCategory::Activations).current, bytes * static_cast<size_t>(m.activations)) << what;
  // The loss sums (16 bytes) join the forward's peak only where it is at the loss.
  const size_t forward = chunked.alloc.total_peak() - state, counted = bytes * static_cast<size_t>(m.forward_peak);
  EXPECT_TRUE(forward == counted || forward == counted + ModelMemory::kLossSumsBytes)
      << what << ": forward measured " << forward << " bytes, counted " << counted;
  chunked.gpt.backward(kCpu, ctx, chunked.alloc, 0.01);
  EXPECT_EQ(chunked.alloc.total_peak() - state, bytes * static_cast<size_t>(m.training_peak) + ModelMemory::kLossSumsBytes)
      << what;
  chunked.alloc.reset_peaks();
  GptCtx infer;
  chunked.gpt.forward(kCpu, infer, chunked.alloc, tokens.t(), Tensor());
  EXPECT_EQ(chunked.alloc.total_peak() - state, bytes * static_cast<size_t>(m.inference_peak)) << what;
  EXPECT_EQ(chunked.alloc.total_current() - state, bytes * static_cast<size_t>(m.inference_kept)) << what;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.preset + "_k" + std::to_string(info.param.chunks) +
         (info.param.recompute == Recompute::Full ? "_recompute" : "") +
         (info.param.recompute == Recompute::Selective ? "_selective" : "");
}

// T = 12: tp2 holds 6 positions per rank (k = 4: chunks 2, 2, 1, 1), tp4 holds 3 (k = 2: 2, 1;
// k = 4 runs as 3 chunks of 1).
INSTANTIATE_TEST_SUITE_P(Layouts, GptTpOverlapSlow,
                         ::testing::Values(Case{"gpt2", 2, Recompute::None}, Case{"gpt2", 4, Recompute::None},
                                           Case{"llama", 2, Recompute::None}, Case{"llama", 4, Recompute::None},
                                           Case{"gpt2", 3, Recompute::Full}, Case{"llama", 2, Recompute::Selective}),
                         case_name);

}  // namespace
}  // namespace tessera
