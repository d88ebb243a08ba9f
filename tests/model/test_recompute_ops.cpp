// Tests model/recompute_ops.h and its two consumers: the op sets by name and per layer; every op
// set gives the loss and gradients of no recomputation bit for bit (f64 and f32, gpt2 and llama,
// the whole backward and the split one of zero-bubble); model/memory.h counts each set to the byte
// against the allocator (whole model and two stages, with model.recompute_layers); the per-op cost
// against hand-computed values. Under `mpiexec -n 2` (RecomputeOpsTpSlow.*: tp = 2 with
// sequence parallelism) the same on a tensor-parallel layout, with whole and chunked region edges
// (parallel.tp_overlap_chunks; the chunked ones also on tp 4); under plain ctest it runs tp = 1.
#include "model/recompute_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "error_testing.h"
#include "kernels/allocator.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "model/weight_grads.h"
#include "mpi_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"
#include "tp_model_testing.h"

namespace tessera {
namespace {

using testing::kCpu;

RecomputeOps ops(const std::string& joined) { return recompute_ops_of(joined, "test"); }

// Each op alone, the named sets, and two pairs that recompute a GEMM output together with its input.
const std::vector<std::string> kSets = {"norm", "qkv",      "attn",     "mlp_in",     "mlp_act",
                                        "selective", "all", "norm+qkv", "attn+mlp_in"};

TEST(RecomputeOps, NamesAndSets) {
  EXPECT_EQ(ops("selective"), (RecomputeOps{true, false, false, false, true}));
  EXPECT_EQ(ops("norm+mlp_act"), RecomputeOps::selective());
  EXPECT_EQ(ops("all"), (RecomputeOps{true, true, true, true, true}));
  EXPECT_EQ(ops("none"), RecomputeOps{});
  EXPECT_FALSE(ops("none").any());
  EXPECT_TRUE(ops("attn").reruns_gemms());
  EXPECT_FALSE(ops("selective").reruns_gemms());
  EXPECT_EQ(recompute_ops_of(std::vector<std::string>{"qkv", "mlp_act", "qkv"}, "k"), ops("qkv+mlp_act"));
  EXPECT_EQ(recompute_ops_name(RecomputeOps::all()), "norm+qkv+attn+mlp_in+mlp_act");
  EXPECT_EQ(recompute_ops_name({}), "none");
  for (const std::string& s : kSets) EXPECT_EQ(ops(recompute_ops_name(ops(s))), ops(s)) << s;
}

TEST(RecomputeOps, BadNamesAndLayersAreRefusedNamingTheKey) {
  EXPECT_TRUE(testing::throws_with([] { recompute_ops_of(std::vector<std::string>{"norm", "q"}, "model.recompute_ops"); },
                                   {"model.recompute_ops[1] = \"q\" is not an op", "mlp_act"}));
  EXPECT_TRUE(testing::throws_with([] { recompute_ops_policy({}, {"norm", "norm+kv"}, 2); },
                                   {"model.recompute_ops_layers[1] = \"kv\""}));
  EXPECT_TRUE(testing::throws_with([] { recompute_ops_policy({}, {"norm"}, 2); },
                                   {"model.recompute_ops_layers has 1 entries", "model.n_layer = 2"}));
  const auto mixed = recompute_ops_policy({"norm"}, {"qkv", "none", "selective"}, 3);
  EXPECT_EQ(mixed, (std::vector<RecomputeOps>{ops("qkv"), {}, RecomputeOps::selective()}));
  EXPECT_EQ(recompute_ops_policy({"attn"}, {}, 2), (std::vector<RecomputeOps>{ops("attn"), ops("attn")}));
  EXPECT_TRUE(testing::throws_with(
      [] { check_recompute_ops({ops("qkv"), ops("qkv")}, {Recompute::None, Recompute::Full}); },
      {"model.recompute_ops = \"qkv\" on layer 1", "full"}));
  check_recompute_ops({ops("qkv"), {}}, {Recompute::None, Recompute::Full});  // no ops on the full layer: fine
}

// ---- gradients: bit for bit those of no recomputation ----

ModelConfig tiny_config(const std::string& preset) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 13;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_kv_head = preset == "llama" ? 1 : 0;
  c.n_embd = 8;
  c.ffn_hidden = 12;
  c.max_seq_len = 8;
  c.init_std = 0.3;  // every path carries a visible gradient
  return c;
}

struct TinyModel {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  TinyModel(const ModelConfig& cfg, DType dt, std::vector<RecomputeOps> ops)
      : ps(alloc, dt), gpt(cfg, ps, {}, {}, {}, {}, {}, std::move(ops)) {
    ps.finalize();
    ps.initialize(kCpu, 7);
  }
};

// One step's loss and flat gradients (as bytes: bit-exact comparison whatever the dtype).
struct Step {
  double loss = 0;
  std::vector<unsigned char> grads;
};

Step train_step(TinyModel& m, bool split) {
  auto tokens = testing::random_ids({2, 6}, 13, 3);
  auto targets = testing::random_ids({2, 6}, 13, 4);
  GptCtx ctx;
  m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
  Step s;
  s.loss = read_loss_sums(kCpu, ctx.loss_sums).mean();
  if (split) {
    WeightGrads deferred(m.alloc);
    m.gpt.backward(kCpu, ctx, m.alloc, Gpt::OutputGrad::loss(1.0 / 12), Tensor(), {}, &deferred);
    m.gpt.backward_weight(kCpu, deferred);
  } else {
    m.gpt.backward(kCpu, ctx, m.alloc, 1.0 / 12);
  }
  const Tensor g = m.ps.flat_grads();
  const auto* p = static_cast<const unsigned char*>(g.data);
  s.grads.assign(p, p + g.numel() * static_cast<int64_t>(dtype_size(g.dtype)));
  return s;
}

class RecomputeOpsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RecomputeOpsTest, EveryOpSetGivesTheGradientsOfNoRecomputation) {
  const ModelConfig cfg = tiny_config(GetParam());
  for (DType dt : {DType::F64, DType::F32})
    for (bool split : {false, true}) {
      TinyModel plain(cfg, dt, {});
      const Step want = train_step(plain, split);
      std::vector<std::vector<RecomputeOps>> policies;
      for (const std::string& s : kSets) policies.push_back(std::vector<RecomputeOps>(3, ops(s)));
      policies.push_back({ops("qkv"), {}, ops("attn+mlp_act")});  // per layer
      for (const auto& policy : policies) {
        const std::string what = recompute_ops_name(policy[0]) + (split ? ", split backward" : "") +
                                 (dt == DType::F64 ? ", f64" : ", f32");
        TinyModel m(cfg, dt, policy);
        const Step got = train_step(m, split);
        EXPECT_EQ(got.loss, want.loss) << what;
        ASSERT_EQ(got.grads.size(), want.grads.size());
        EXPECT_TRUE(got.grads == want.grads) << what << ": gradients differ";
      }
    }
}

// ---- memory: model/memory.h against the allocator ----

ModelConfig small_config(const std::string& preset) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 37;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_kv_head = preset == "llama" ? 2 : 0;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.max_seq_len = 12;
  return c;
}

TEST_P(RecomputeOpsTest, MemoryEqualsTheAllocatorsCounts) {
  const int64_t L = 4, B = 2, T = 10;
  const ModelConfig cfg = resolve(small_config(GetParam()));
  std::vector<std::vector<RecomputeOps>> policies;
  for (const std::string& s : kSets) policies.push_back(std::vector<RecomputeOps>(4, ops(s)));
  policies.push_back({ops("qkv"), {}, ops("attn+mlp_in"), ops("norm")});
  for (size_t p = 0; p < policies.size(); ++p)
    for (int64_t full_layers : {0, 1})
      for (int64_t stages : {1, 2})
        for (int64_t s = 0; s < stages; ++s) {
          const StageSpec spec = StageSpec::split(L, stages, s);
          const std::string what = recompute_ops_name(policies[p][0]) + " (policy " + std::to_string(p) + "), " +
                                   std::to_string(full_layers) + " full, stage " + std::to_string(s) + " of " +
                                   std::to_string(stages);
          std::vector<Recompute> recompute(static_cast<size_t>(L), Recompute::None);
          std::vector<RecomputeOps> policy = policies[p];
          for (int64_t l = spec.first_layer; l < std::min(spec.end_layer, spec.first_layer + full_layers); ++l) {
            recompute[static_cast<size_t>(l)] = Recompute::Full;
            policy[static_cast<size_t>(l)] = {};
          }
          ModelMemoryLayout layout{B, T, 1, false, Recompute::None, spec, full_layers};
          layout.recompute_ops = policies[p];  // the full layers' entries are ignored
          const ModelMemory m = model_memory(cfg, layout);
          Allocator alloc, caller;
          ParameterStore ps(alloc, DType::F32);
          Gpt gpt(cfg, ps, recompute, {}, spec, {}, {}, policy);
          ps.finalize();
          ps.initialize(kCpu, 3);
          const size_t state = alloc.total_current();
          auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
          auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
          Buffer input(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Activations);
          Buffer dy(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
          Buffer dx(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
          fill_zero(kCpu, input);
          fill_zero(kCpu, dy);
          GptCtx ctx;
          gpt.forward(kCpu, ctx, alloc, spec.embedding ? tokens.t() : input.tensor(), spec.head ? targets.t() : Tensor(),
                      SequenceLayout::contiguous(T));
          EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.activations)) << what;
          gpt.backward(kCpu, ctx, alloc, spec.head ? Gpt::OutputGrad::loss(0.01) : Gpt::OutputGrad::output(dy),
                       spec.embedding ? Tensor() : dx.tensor());
          const size_t peak = alloc.total_peak() - state, counted = 4u * static_cast<size_t>(m.training_peak);
          EXPECT_TRUE(peak == counted || (spec.head && peak == counted + ModelMemory::kLossSumsBytes))
              << what << ": measured " << peak << " bytes, counted " << counted;
          // What the ops save is what the cost says, per block that uses them.
          ModelMemoryLayout plain = layout;
          plain.recompute_ops.clear();
          int64_t saved = 0;
          for (int64_t l = spec.first_layer; l < spec.end_layer; ++l)
            saved += recompute_ops_cost(cfg, layout, policy[static_cast<size_t>(l)]).elements_saved;
          EXPECT_EQ(model_memory(cfg, plain).activations - m.activations, saved) << what;
        }
}

// The selective policy is the op set: the same counts either way.
TEST_P(RecomputeOpsTest, SelectiveIsItsOpSet) {
  const ModelConfig cfg = resolve(small_config(GetParam()));
  ModelMemoryLayout sel{2, 10, 1, false, Recompute::Selective};
  ModelMemoryLayout as_ops{2, 10, 1, false, Recompute::None};
  as_ops.recompute_ops.assign(4, RecomputeOps::selective());
  const ModelMemory a = model_memory(cfg, sel), b = model_memory(cfg, as_ops);
  EXPECT_EQ(a.activations, b.activations);
  EXPECT_EQ(a.training_peak, b.training_peak);
}

INSTANTIATE_TEST_SUITE_P(Presets, RecomputeOpsTest, ::testing::Values("gpt2", "llama"));

// ---- the per-op cost, by hand ----

TEST(RecomputeOpsCost, HandComputedValues) {
  ModelConfig cfg = small_config("gpt2");  // C 16, H 4 (D 4), F 24
  ModelMemoryLayout lay{2, 4, 1, false};   // B 2, T 4: 8 rows
  const auto cost = [&](const std::string& s) { return recompute_ops_cost(cfg, lay, ops(s)); };
  // norm: ln1 and ln2 outputs, 2 x 8 x 16.
  EXPECT_EQ(cost("norm").elements_saved, 256);
  EXPECT_EQ(cost("norm").bytes_saved, 1024);
  EXPECT_EQ(cost("norm").elementwise, 256);
  EXPECT_EQ(cost("norm").gemm_flops, 0.0);
  // qkv: q, k, v 3 x 8 x 16; GEMMs 2 x 8 x 16 x 48.
  EXPECT_EQ(cost("qkv").elements_saved, 384);
  EXPECT_EQ(cost("qkv").gemm_flops, 12288.0);
  EXPECT_EQ(cost("qkv").elementwise, 0);  // learned positions: no RoPE
  // attn: out 8 x 16 + lse 2 x 4 x 4; kernel 2 products x 2 D x B H T (T + 1) / 2 = 4 x 4 x 2 x 4 x 10.
  EXPECT_EQ(cost("attn").elements_saved, 160);
  EXPECT_EQ(cost("attn").attention_flops, 1280.0);
  // mlp_in: fc output 8 x 24; GEMM 2 x 8 x 16 x 24. mlp_act: 8 x 24, elementwise.
  EXPECT_EQ(cost("mlp_in").elements_saved, 192);
  EXPECT_EQ(cost("mlp_in").gemm_flops, 6144.0);
  EXPECT_EQ(cost("mlp_act").elements_saved, 192);
  EXPECT_EQ(cost("mlp_act").elementwise, 192);
  EXPECT_EQ(cost("all").elements_saved, 256 + 384 + 160 + 192 + 192);
  EXPECT_EQ(cost("all").gemm_flops, 12288.0 + 6144.0);

  // llama (2 KV heads, SwiGLU) on tp 4 with sequence parallelism: 1 query head per rank, the KV
  // heads replicated (all of them projected), T_local = 1.
  cfg = small_config("llama");
  lay = ModelMemoryLayout{2, 4, 4, true};
  EXPECT_EQ(cost("norm").elements_saved, 2 * 2 * 1 * 16);
  EXPECT_EQ(cost("qkv").elements_saved, 8 * 4 + 2 * 8 * 4);         // q (8, 1, 4), k and v (8, 1, 4)
  EXPECT_EQ(cost("qkv").gemm_flops, 2.0 * 8 * 16 * (4 + 2 * 8));   // q 4 columns, k and v all 8
  EXPECT_EQ(cost("qkv").elementwise, 8 * 4 + 8 * 4);               // RoPE on q and k
  EXPECT_EQ(cost("attn").elements_saved, 8 * 4 + 2 * 1 * 4);
  EXPECT_EQ(cost("attn").attention_flops, 2.0 * 2 * 4 * (2 * 1 * 10));
  EXPECT_EQ(cost("mlp_in").elements_saved, 2 * 8 * 6);              // gate and up (8, 24 / 4)
  EXPECT_EQ(cost("mlp_in").gemm_flops, 2.0 * 2 * 8 * 16 * 6);
}

// ---- tensor parallel with sequence parallelism (mpiexec -n 2; one rank: tp = 1) ----

struct TpOpsModel {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  TpOpsModel(const ModelConfig& cfg, ShardLayout layout, TensorParallel tp, std::vector<RecomputeOps> ops)
      : ps(alloc, DType::F64, layout), gpt(cfg, ps, {}, tp, {}, {}, {}, std::move(ops)) {
    ps.finalize();
    ps.initialize(kCpu, 11);
  }
};

// Every op set on this rank's shard gives the loss and gradients of the same shard without
// recomputation bit for bit (the collectives re-run on the same inputs), and its memory equals the
// model's count (the re-gathered inputs of qkv and mlp_in included). chunks > 1: both shards run
// their region edges chunked (parallel.tp_overlap_chunks), and qkv and mlp_in re-gather chunk by
// chunk, the forward's GEMMs on the forward's rows again.
void every_op_set_equals_no_recomputation(int64_t chunks) {
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int tp = comm.size(), rank = comm.rank();
  const int64_t B = 2, T = 8;
  for (const std::string preset : {"gpt2", "llama"}) {
    const ModelConfig cfg = testing::tp_model_config(preset, T);
    const TensorParallel group{&comm, true, chunks};
    const std::string what = preset + " k = " + std::to_string(chunks) + " rank " + std::to_string(rank) + " of " +
                             std::to_string(tp);
    const auto step = [&](TpOpsModel& m, const ModelMemory* want) {
      auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 5);
      auto targets = testing::random_ids({B, T}, cfg.vocab_size, 6);
      const size_t state = m.alloc.total_current();
      GptCtx ctx;
      m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
      const double loss = read_loss_sums(kCpu, ctx.loss_sums).mean();
      if (want) {
        EXPECT_EQ(m.alloc.counter(MemCategory::Activations).current, 8u * static_cast<size_t>(want->activations))
            << what;
      }
      m.gpt.backward(kCpu, ctx, m.alloc, 0.01);
      if (want) {
        EXPECT_EQ(m.alloc.total_peak() - state, 8u * static_cast<size_t>(want->training_peak) + ModelMemory::kLossSumsBytes)
            << what;
      }
      return loss;
    };
    TpOpsModel plain(cfg, {tp, rank}, group, {});
    const double loss = step(plain, nullptr);
    for (const std::string& s : kSets) {
      const std::vector<RecomputeOps> policy(2, ops(s));
      ModelMemoryLayout layout{B, T, tp, true};
      layout.recompute_ops = policy;
      layout.tp_overlap_chunks = chunks;
      const ModelMemory m = model_memory(cfg, layout);
      TpOpsModel model(cfg, {tp, rank}, group, policy);
      EXPECT_EQ(step(model, &m), loss) << s << " " << what;
      const double* a = plain.ps.flat_grads().ptr<double>();
      const double* b = model.ps.flat_grads().ptr<double>();
      int64_t differ = 0;
      for (int64_t i = 0; i < plain.ps.numel(); ++i) differ += a[i] != b[i];
      EXPECT_EQ(differ, 0) << s << " " << what;
    }
  }
}

TEST(RecomputeOpsTpSlow, EveryOpSetEqualsNoRecomputationAndTheMemoryCount) {
  every_op_set_equals_no_recomputation(1);
}

// parallel.tp_overlap_chunks = 2 and 3 (tp 2: 4 positions per rank, chunks 2, 2 and 2, 1, 1; tp 4:
// 2 positions, chunks 1, 1: k = 2 only, 3 would run the same 2 chunks).
TEST(RecomputeOpsTpSlow, ChunkedEdgesEveryOpSetEqualsNoRecomputationAndTheMemoryCount) {
  const int ranks = comm_size(testing::test_world());
  if (ranks == 1) GTEST_SKIP() << "needs a tp group (mpiexec -n 2 or 4)";
  for (int64_t chunks : {2, 3})
    if (chunks <= 8 / ranks) every_op_set_equals_no_recomputation(chunks);
}

}  // namespace
}  // namespace tessera
