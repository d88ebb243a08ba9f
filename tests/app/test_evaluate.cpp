// Tests app/evaluate.h under a pipeline: the model cut into pipeline stages over the ranks (and into
// two chunks per rank, as the interleaved schedule holds it) evaluates as the whole model does on
// each rank: the same greedy tokens, the same addition-task answers and accuracy, the same
// validation loss. Every stage's store is initialized from the same seed, and initialization is
// keyed by the parameter's name, so the stages hold exactly the whole model's values (the tied
// gpt2 table's copy on the last stage too); a forward through the stages then computes what the
// whole model computes, in the same order. The model is a random one with large weights (init_std
// 0.3), so its logits differ from token to token and every generated token is a real comparison.
// Runs under mpiexec -n 2 (pp 2, pp 2 x vpp 2) and -n 4 (pp 4): ctest EvaluatePipeline.*.
#include "app/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "data/addition.h"
#include "model/stage_cut.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"

namespace tessera {
namespace {
using testing::kCpu;

constexpr int64_t kSeqLen = 16;

ModelConfig eval_config(const std::string& preset) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 13;  // the addition task's characters
  c.n_layer = 4;
  c.n_head = 2;
  c.n_kv_head = preset == "llama" ? 1 : 0;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.max_seq_len = kSeqLen;
  c.init_std = 0.3;
  return resolve(c);
}

// A model on its own store: the whole model, or a pipeline rank's chunks (one Gpt each).
struct Model {
  Allocator alloc;
  ParameterStore ps{alloc, DType::F32};
  std::vector<std::unique_ptr<Gpt>> chunks;
  Model(const ModelConfig& cfg, const std::vector<StageSpec>& specs) {
    for (const StageSpec& s : specs) chunks.push_back(std::make_unique<Gpt>(cfg, ps, std::vector<Recompute>{}, TensorParallel{}, s));
    ps.finalize();
    ps.initialize(kCpu, 11);
  }
  PipelineLink link(Communicator* pp) const {
    PipelineLink l;
    l.pp = pp;
    for (const auto& c : chunks) l.chunks.push_back(c.get());
    return l;
  }
};

void expect_pipeline_evaluates_as_whole(const std::string& preset, int64_t vpp) {
  MpiCommunicator pp = MpiCommunicator::duplicate(testing::test_world());
  const ModelConfig cfg = eval_config(preset);
  const std::string what = preset + " pp " + std::to_string(pp.size()) + " vpp " + std::to_string(vpp) + " (rank " +
                           std::to_string(pp.rank()) + ")";
  Model whole(cfg, {StageSpec{}});
  Model stages(cfg, rank_chunks(cut_stages(cfg, kSeqLen, pp.size(), vpp), pp.size(), pp.rank()));
  ASSERT_LT(stages.ps.numel(), whole.ps.numel()) << what << ": a rank holds part of the model";
  const Gpt& model = *stages.chunks.front();
  const PipelineLink link = stages.link(&pp);

  // Greedy tokens from two prompts of the vocabulary, 6 new tokens each.
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 10, 4}, {9, 8, 7, 11, 12}};
  const auto want = greedy_generate(kCpu, *whole.chunks[0], whole.alloc, prompts, 6);
  const auto got = greedy_generate(kCpu, model, stages.alloc, prompts, 6, {}, link);
  ASSERT_TRUE(want && got) << what;
  EXPECT_EQ(*got, *want) << what;

  // The addition task's answers (examples carry the generated text) and accuracy.
  const AdditionTask task(2, 5);
  const auto acc_want = addition_accuracy(kCpu, *whole.chunks[0], whole.alloc, task, 12);
  const auto acc_got = addition_accuracy(kCpu, model, stages.alloc, task, 12, {}, link);
  ASSERT_TRUE(acc_want && acc_got) << what;
  EXPECT_EQ(acc_got->total, 12) << what;
  EXPECT_EQ(acc_got->correct, acc_want->correct) << what;
  EXPECT_EQ(acc_got->examples, acc_want->examples) << what;

  // The validation loss over 3 batches of 2 (the last stage's, summed to every rank).
  const AdditionDataset val(task, /*validation=*/true, kSeqLen, 8);
  const auto loss_want = validation_loss(kCpu, *whole.chunks[0], whole.alloc, val, 3, 2);
  const auto loss_got = validation_loss(kCpu, model, stages.alloc, val, 3, 2, {}, link);
  ASSERT_TRUE(loss_want && loss_got) << what;
  EXPECT_GT(*loss_want, 0) << what;
  EXPECT_NEAR(*loss_got, *loss_want, 1e-12 * *loss_want) << what;
}

TEST(EvaluatePipeline, Gpt2StagesAnswerAsTheWholeModel) { expect_pipeline_evaluates_as_whole("gpt2", 1); }
TEST(EvaluatePipeline, LlamaStagesAnswerAsTheWholeModel) { expect_pipeline_evaluates_as_whole("llama", 1); }
TEST(EvaluatePipeline, InterleavedChunksAnswerAsTheWholeModel) {
  if (testing::test_world() != MPI_COMM_NULL && comm_size(testing::test_world()) * 2 > 4)
    GTEST_SKIP() << "pp x vpp 2 needs more than the 4 blocks of the test model";
  expect_pipeline_evaluates_as_whole("gpt2", 2);
  expect_pipeline_evaluates_as_whole("llama", 2);
}

}  // namespace
}  // namespace tessera
