// Tests plan/calibrate.h: the all-reduce fit recovers the link of a ring from exact times, and
// stays sensible on noisy ones; one rank's calibration measures positive rates and keeps the
// default links (tests/app/test_plan_command.cpp runs it on two ranks end to end).
#include "plan/calibrate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "mpi_testing.h"
#include "kernels/exec.h"
#include "plan/calibrate_ops.h"
#include "plan/cost_model.h"

#include <chrono>
#include <cmath>

namespace tessera::plan {
namespace {

TEST(Calibrate, FitRecoversTheRingsLink) {
  for (int64_t n : {2, 4, 8}) {
    const Link truth{3e9, 7e-6};
    std::vector<double> bytes, seconds;
    for (double b = 4096; b <= 16 << 20; b *= 4) {
      bytes.push_back(b);
      seconds.push_back(all_reduce_seconds(b, n, truth));
    }
    const Link fit = fit_all_reduce(bytes, seconds, n);
    EXPECT_NEAR(fit.bandwidth, truth.bandwidth, 1e-6 * truth.bandwidth) << n;
    EXPECT_NEAR(fit.latency, truth.latency, 1e-9) << n;
  }
  // +-10% noise: within 15% of the truth (relative weights: no size dominates).
  const Link truth{1e9, 2e-5};
  std::vector<double> bytes, seconds;
  int k = 0;
  for (double b = 4096; b <= 16 << 20; b *= 2, ++k) {
    bytes.push_back(b);
    seconds.push_back(all_reduce_seconds(b, 2, truth) * (k % 2 ? 1.1 : 0.9));
  }
  const Link fit = fit_all_reduce(bytes, seconds, 2);
  EXPECT_NEAR(fit.bandwidth, 1e9, 0.15e9);
  EXPECT_NEAR(fit.latency, 2e-5, 0.5e-5);
  EXPECT_THROW(fit_all_reduce({1.0}, {1.0}, 2), Error);
}

TEST(Calibrate, OneRankMeasuresComputeAndKeepsTheLinks) {
  LocalMachine m;
  m.ranks = 1;
  m.memory_available = 1e9;
  CalibrationOptions o;
  o.repeats = 1;
  o.min_seconds = 1e-3;
  o.gemm_size = 128;
  o.stream_elements = 1 << 16;
  std::ostringstream log;
  testing::test_world();  // MPI started
  const ClusterSpec c = calibrate_local(MPI_COMM_SELF, m, o, &log);
  // Positive rates (the values depend on the machine and its load; the test checks the plumbing).
  EXPECT_GT(c.peak_flops_fp32, 0);
  EXPECT_GT(c.peak_flops_bf16, 0);
  EXPECT_GT(c.memory_bandwidth, 0);
  EXPECT_GT(c.op_latency, 0);
  EXPECT_EQ(c.compute_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(c.intra.bandwidth, local_cluster(m).intra.bandwidth);
  EXPECT_NE(log.str().find("GEMM 128^3 per rank"), std::string::npos) << log.str();
}

// Each collective's own fit: all-gather and reduce-scatter ((n - 1) steps, (n - 1)/n of the buffer)
// and a round trip of send/recv (2, 2) recover their link from exact times.
TEST(Calibrate, FitLinkRecoversEachCollectivesLink) {
  Link truth{2e9, 4e-6};
  truth.all_gather_bandwidth = 3e9, truth.all_gather_latency = 9e-6;
  truth.reduce_scatter_bandwidth = 1.5e9, truth.reduce_scatter_latency = 2e-6;
  truth.p2p_bandwidth = 6e9, truth.p2p_latency = 1e-6;
  for (int64_t n : {2, 4}) {
    std::vector<double> bytes, ag, rs, rt;
    for (double b = 8192; b <= 8 << 20; b *= 4) {
      bytes.push_back(b);
      ag.push_back(all_gather_seconds(b, n, truth));
      rs.push_back(reduce_scatter_seconds(b, n, truth));
      rt.push_back(2 * p2p_seconds(b, truth));
    }
    const double steps = double(n - 1), fraction = double(n - 1) / double(n);
    const Link a = fit_link(bytes, ag, steps, fraction), r = fit_link(bytes, rs, steps, fraction),
               p = fit_link(bytes, rt, 2, 2);
    EXPECT_NEAR(a.bandwidth, 3e9, 1e-6 * 3e9);
    EXPECT_NEAR(a.latency, 9e-6, 1e-11);
    EXPECT_NEAR(r.bandwidth, 1.5e9, 1e-6 * 1.5e9);
    EXPECT_NEAR(r.latency, 2e-6, 1e-11);
    EXPECT_NEAR(p.bandwidth, 6e9, 1e-6 * 6e9);
    EXPECT_NEAR(p.latency, 1e-6, 1e-11);
  }
  EXPECT_THROW(fit_link({1.0}, {1.0}, 1, 1), Error);
}

// The model's GEMM shapes: each tp the heads and MLP allow, micro-batches 1, 2, 4, 8; the shapes
// of one layout among them; calibrating them gives one rate per shape and dtype.
TEST(Calibrate, MeasuresTheModelsGemmShapes) {
  ModelConfig m;
  m.preset = "llama";
  m.vocab_size = 512;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.n_embd = 64;
  m.max_seq_len = 32;
  const Workload w{resolve(m), 32, 4};
  const std::vector<GemmShape> shapes = model_gemm_shapes(w, 2);
  ASSERT_TRUE(std::is_sorted(shapes.begin(), shapes.end()));
  EXPECT_EQ(std::adjacent_find(shapes.begin(), shapes.end()), shapes.end());
  // Exactly the union over tp 1, 2 and micro-batches 1, 2, 4 (8 does not divide the batch of 4).
  std::vector<GemmShape> from_layouts;
  for (int64_t tp : {1, 2})
    for (int64_t mb : {1, 2, 4}) {
      Layout l;
      l.tp = tp, l.dp = 2 / tp, l.micro_batch = mb;
      for (const GemmShape& s : gemm_shapes(w, l)) from_layouts.push_back(s);
    }
  std::sort(from_layouts.begin(), from_layouts.end());
  from_layouts.erase(std::unique(from_layouts.begin(), from_layouts.end()), from_layouts.end());
  EXPECT_EQ(shapes, from_layouts);
  LocalMachine lm;
  lm.ranks = 1;
  lm.memory_available = 1e9;
  CalibrationOptions o;
  o.repeats = 1;
  o.min_seconds = 1e-3;
  o.gemm_size = 64;
  o.stream_elements = 1 << 12;
  o.shapes = {shapes.front(), shapes.back()};
  o.max_gemm_flops = 1e6;  // the larger one timed with fewer rows
  std::ostringstream log;
  testing::test_world();
  const ClusterSpec c = calibrate_local(MPI_COMM_SELF, lm, o, &log);
  ASSERT_EQ(c.gemm_rates.size(), 4u);
  for (const GemmRate& g : c.gemm_rates) EXPECT_GT(g.flops, 0);
  EXPECT_EQ(c.gemm_rates[0].m, shapes.front().m);
  EXPECT_FALSE(c.gemm_rates[0].bf16);
  EXPECT_TRUE(c.gemm_rates[1].bf16);
  EXPECT_EQ(c.gemm_rates[3].k, shapes.back().k);
  EXPECT_NE(log.str().find("GEMMs at the model's 2 shapes"), std::string::npos) << log.str();
}

// The chain scales of a disturbed calibration are named; those of quiet ones (the 2- and 4-rank
// GPT-2 and LLaMA calibrations of 2026-12-07) are not.
TEST(Calibrate, DisturbedChainScalesAreNamed) {
  const std::vector<ChainScale> quiet_gpt2_4 = {{64, 1.174, 1.511}, {128, 1.183, 1.337}, {256, 1.141, 1.227},
                                                {512, 1.079, 1.163}, {1024, 1.096, 1.190}, {2048, 1.105, 1.174}};
  const std::vector<ChainScale> quiet_llama_2 = {{64, 1.126, 1.214}, {128, 1.059, 1.091}, {256, 1.044, 1.026},
                                                 {512, 1.025, 1.008}, {1024, 0.996, 0.960}, {2048, 0.997, 0.958}};
  EXPECT_EQ(chain_scale_doubts(quiet_gpt2_4), "");
  EXPECT_EQ(chain_scale_doubts(quiet_llama_2), "");
  EXPECT_EQ(chain_scale_doubts({}), "");
  const std::vector<ChainScale> disturbed = {{64, 1.159, 1.357}, {128, 1.081, 1.169}, {256, 1.065, 1.110},
                                             {512, 0.826, 0.750}, {1024, 0.810, 0.752}, {2048, 0.801, 0.754}};
  const std::string why = chain_scale_doubts(disturbed);
  for (const char* part : {"fp32 at 1024 tokens (0.81) is below 0.85", "bf16 at 512 tokens (0.75) is below 0.85",
                           "bf16 at 512 tokens (0.75) is below bf16 at 256 tokens (1.11) by more than 25%"})
    EXPECT_NE(why.find(part), std::string::npos) << part << "\n" << why;
  EXPECT_EQ(why.find("at 256 tokens (1.065) is below"), std::string::npos) << why;
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

Workload tiny(const std::string& preset, int64_t kv_heads) {
  ModelConfig m;
  m.preset = preset;
  m.vocab_size = 300;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = kv_heads;
  m.n_embd = 64;
  m.max_seq_len = 32;
  return {resolve(m), 32, 8};
}

bool has(const std::vector<OpTime>& ops, OpKind op, const std::vector<int64_t>& shape, bool bf16 = false) {
  return std::any_of(ops.begin(), ops.end(), [&](const OpTime& t) { return t.op == op && t.shape == shape && t.bf16 == bf16; });
}

// The op shapes of a step: a GQA LLaMA on 2 ranks (tp 1 and 2, micro-batches 1 .. 8), each once.
TEST(Calibrate, ModelOpShapesAreTheSteps) {
  const Workload w = tiny("llama", 2);  // 4 heads of 16, 2 KV heads, F = ffn_hidden
  const std::vector<OpTime> ops = model_op_shapes(w, 2);
  const int64_t F = w.model.ffn_hidden;
  EXPECT_TRUE(has(ops, OpKind::AttentionForward, {1, 32, 32, 4, 2, 16}));
  EXPECT_TRUE(has(ops, OpKind::AttentionBackward, {8, 32, 32, 2, 1, 16}));  // tp 2: 2 heads, 1 KV head
  EXPECT_TRUE(has(ops, OpKind::RmsNormForward, {256, 64}));
  EXPECT_TRUE(has(ops, OpKind::RmsNormBackward, {128, 64}));  // sequence parallel at tp 2, micro-batch 8
  EXPECT_TRUE(has(ops, OpKind::SwigluBackward, {8 * 32 * F / 2}));
  EXPECT_TRUE(has(ops, OpKind::RopeForward, {32 * 2 * 16}));  // k of micro-batch 1: 2 KV heads
  EXPECT_TRUE(has(ops, OpKind::EmbeddingForward, {64, 64, 150}));  // tp 2: half the vocabulary
  EXPECT_TRUE(has(ops, OpKind::CrossEntropyBackward, {128, 300}));
  EXPECT_TRUE(has(ops, OpKind::AdamW, {ops.back().shape[0]}, true));
  EXPECT_FALSE(std::any_of(ops.begin(), ops.end(), [](const OpTime& t) {
    return t.op == OpKind::LayerNormForward || t.op == OpKind::GeluForward;
  }));
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(ops[i].shape.size(), op_shape_size(ops[i].op)) << op_name(ops[i].op);
    for (size_t j = 0; j < i; ++j) EXPECT_FALSE(ops[i] == ops[j]) << op_name(ops[i].op);
  }
  // The Linears at tp 2, micro-batch 8 (256 rows): q (2 heads of 16), k (1 KV head), the output,
  // SwiGLU's gate and its output, the head (half the vocabulary, no bias), in both dtypes.
  for (OpKind op : {OpKind::LinearForward, OpKind::LinearBackwardInput, OpKind::LinearBackwardWeight})
    for (bool bf16 : {false, true}) {
      EXPECT_TRUE(has(ops, op, {256, 64, 32, 0}, bf16)) << op_name(op);
      EXPECT_TRUE(has(ops, op, {256, 64, 16, 0}, bf16)) << op_name(op);
      EXPECT_TRUE(has(ops, op, {256, 32, 64, 0}, bf16)) << op_name(op);
      EXPECT_TRUE(has(ops, op, {256, 64, F / 2, 0}, bf16)) << op_name(op);
      EXPECT_TRUE(has(ops, op, {256, F / 2, 64, 0}, bf16)) << op_name(op);
      EXPECT_TRUE(has(ops, op, {256, 64, 150, 0}, bf16)) << op_name(op);
    }
  // At 4 ranks tp 4 leaves 1 query head per rank over 2 KV heads: k and v are replicated and each
  // rank attends with one KV head (a shape the attention kernel accepts), while k's Linear computes both.
  const std::vector<OpTime> four = model_op_shapes(w, 4);
  EXPECT_TRUE(has(four, OpKind::AttentionForward, {1, 32, 32, 1, 1, 16}));
  EXPECT_TRUE(has(four, OpKind::LinearForward, {32, 64, 32, 0}));
  for (const OpTime& t : four) {
    if (t.op == OpKind::AttentionForward || t.op == OpKind::AttentionBackward) {
      EXPECT_EQ(t.shape[3] % t.shape[4], 0) << t.shape[3] << " heads over " << t.shape[4];
    }
  }
  // GPT-2: LayerNorm and GELU, no RoPE; Linears with their biases.
  const std::vector<OpTime> g = model_op_shapes(tiny("gpt2", 0), 1);
  EXPECT_TRUE(has(g, OpKind::LinearBackwardWeight, {32, 64, 64, 1}, true));
  EXPECT_TRUE(has(g, OpKind::LayerNormForward, {32, 64}));
  EXPECT_TRUE(has(g, OpKind::GeluForward, {32 * tiny("gpt2", 0).model.ffn_hidden}));
  EXPECT_FALSE(std::any_of(g.begin(), g.end(), [](const OpTime& t) { return t.op == OpKind::RopeForward; }));
}

// Every op of both models runs through the trainer's kernel at its shape and gets a positive time
// (one rank, short runs: the plumbing, not the machine's numbers); one over max_op_elements is timed
// smaller and keeps its shape; calibrate_local writes them as op_times.
TEST(Calibrate, OpsAreTimedThroughTheKernels) {
  testing::test_world();
  CalibrationOptions o;
  o.min_seconds = 1e-4;
  for (const Workload& w : {tiny("gpt2", 0), tiny("llama", 2)}) {
    std::vector<OpTime> ops = model_op_shapes(w, 2);
    time_ops(Exec::cpu(), o, ops, [](const std::function<void()>& run) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    for (const OpTime& t : ops) EXPECT_TRUE(t.seconds > 0 && std::isfinite(t.seconds)) << op_name(t.op);
  }
  std::vector<OpTime> big = {{OpKind::ResidualForward, {1 << 20}, false, 0}};
  o.max_op_elements = 1 << 12;
  time_ops(Exec::cpu(), o, big, [&](const std::function<void()>&) { return 1e-6; });
  EXPECT_EQ(big[0].shape, std::vector<int64_t>{1 << 20});
  EXPECT_NEAR(big[0].seconds, 1e-6 * 256, 1e-12);  // timed at 4096 elements, scaled by 256
  LocalMachine m;
  m.memory_available = 1e9;
  CalibrationOptions c;
  c.min_seconds = 1e-4, c.gemm_size = 64, c.stream_elements = 1 << 12, c.max_message = 1 << 14;
  c.ops = model_op_shapes(tiny("gpt2", 0), 1);
  const ClusterSpec spec = calibrate_local(MPI_COMM_SELF, m, c, nullptr);
  ASSERT_EQ(spec.op_times.size(), c.ops.size());
  EXPECT_GT(measured_op_seconds(spec, OpKind::AttentionForward, {1, 32, 32, 4, 4, 16}, false), 0);
}

}  // namespace
// A tp step measured at more than twice or under half its prediction is named; the scales of the
// quiet calibrations here are not (2026-12-07: GPT-2 and LLaMA on 4 ranks; one beside another
// test on 2 ranks gave 27 and 36).
TEST(Calibrate, DisturbedTpScalesAreNamed) {
  EXPECT_EQ(degree_scale_doubts({{2, 1.304, 1.356}, {4, 1.306, 1.299}}, "tp"), "");
  EXPECT_EQ(degree_scale_doubts({{2, 1.073, 1.070}, {4, 0.959, 1.027}}, "tp"), "");
  EXPECT_EQ(degree_scale_doubts({}, "tp"), "");
  EXPECT_EQ(degree_scale_doubts({{2, 26.962, 36.265}}, "tp"),
            "fp32 at tp 2 (26.962) is above 2; bf16 at tp 2 (36.265) is above 2");
  EXPECT_EQ(degree_scale_doubts({{4, 1.0, 0.4}}, "tp"), "bf16 at tp 4 (0.4) is below 0.5");
  EXPECT_EQ(degree_scale_doubts({{2, 1.2, 1.25}, {4, 2.5, 1.3}}, "cp"), "fp32 at cp 4 (2.5) is above 2");
}

}  // namespace tessera::plan
