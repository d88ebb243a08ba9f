// Tests plan/cost_model.h on hand-computed cases: the alpha-beta collectives, where each group's
// link is, the compute of a step against the FLOP count when nothing else costs, the pipeline
// bubble against (pp - 1)/(m + pp - 1), the data-parallel reduction hidden or exposed, and the
// step's parts adding up.
#include "plan/cost_model.h"

#include <gtest/gtest.h>

#include <tuple>

#include <algorithm>
#include <cmath>

#include "model/config.h"
#include "model/stage_cut.h"
#include "parallel/pipeline_sim.h"

namespace tessera::plan {
namespace {

// A cluster where only the GEMMs and attention cost: infinite memory bandwidth and links, no op latency.
ClusterSpec compute_only() {
  ClusterSpec c;
  c.devices_per_node = 8;
  c.peak_flops_fp32 = 1e12;
  c.peak_flops_bf16 = 4e12;
  c.compute_efficiency = 0.5;
  c.memory_bandwidth = 1e30;
  c.op_latency = 0;
  c.intra = {1e30, 0};
  c.inter = {1e30, 0};
  return c;
}

Workload llama(int64_t layers, int64_t vocab, int64_t seq_len, int64_t global_batch) {
  ModelConfig m;
  m.preset = "llama";
  m.vocab_size = vocab;
  m.n_layer = layers;
  m.n_head = 8;
  m.n_kv_head = 4;
  m.n_embd = 512;
  m.max_seq_len = seq_len;
  return {resolve(m), seq_len, global_batch};
}

TEST(CostModel, CollectivesFollowTheAlphaBetaRing) {
  const Link link{1e10, 1e-5};
  // all-reduce of 1 GB over 4 ranks: 2 x 3 steps of (10 us + 0.25 GB / 10 GB/s).
  EXPECT_NEAR(all_reduce_seconds(1e9, 4, link), 6 * (1e-5 + 0.025), 1e-12);
  EXPECT_NEAR(all_gather_seconds(1e9, 4, link), 3 * (1e-5 + 0.025), 1e-12);
  EXPECT_NEAR(reduce_scatter_seconds(1e9, 4, link), 3 * (1e-5 + 0.025), 1e-12);
  EXPECT_NEAR(p2p_seconds(1e6, link), 1e-5 + 1e-4, 1e-15);
  EXPECT_EQ(all_reduce_seconds(1e9, 1, link), 0.0);
  EXPECT_NEAR(all_reduce_bytes(1e9, 4), 1.5e9, 1e-3);  // what the trainer's counters count
  EXPECT_NEAR(all_gather_bytes(1e9, 4), 0.75e9, 1e-3);
}

TEST(CostModel, LinksFollowTheRankPlacement) {
  ClusterSpec c = compute_only();
  c.intra = {100e9, 1e-6};
  c.inter = {10e9, 5e-6};
  Layout l;
  l.tp = 8, l.dp = 2;  // 16 ranks: each tp group is one node, the dp groups cross
  GroupLinks g = group_links(l, c);
  EXPECT_FALSE(g.tp_across);
  EXPECT_TRUE(g.dp_across);
  EXPECT_DOUBLE_EQ(g.tp.bandwidth, 100e9);
  EXPECT_DOUBLE_EQ(g.dp.bandwidth, 10e9);
  l = Layout{};
  l.tp = 16;  // a tp group of 16 spans two nodes
  EXPECT_TRUE(group_links(l, c).tp_across);
  l = Layout{};
  l.tp = 3, l.dp = 8;  // 24 ranks: the group {6, 7, 8} straddles the first node's end
  EXPECT_TRUE(group_links(l, c).tp_across);
  l = Layout{};
  l.tp = 2, l.pp = 4;  // pp neighbours 2 ranks apart: all of it in one node
  g = group_links(l, c);
  EXPECT_FALSE(g.pp_across);
  EXPECT_FALSE(g.embedding_across);
  l.pp = 8;  // 16 ranks: stages 0-3 on node 0, 4-7 on node 1
  EXPECT_TRUE(group_links(l, c).pp_across);
  l = Layout{};
  l.tp = 2, l.cp = 4, l.dp = 2;  // a cp group spans tp x cp = 8 ranks: one node; dp x cp spans 16
  g = group_links(l, c);
  EXPECT_FALSE(g.cp_across);
  EXPECT_TRUE(g.dp_across);
}

// Within a node each group runs on the link calibrated for its size: on 4 ranks dp 2 x tp 2 puts
// tp (2 ranks), dp (dp x cp = 2) and the pp chain of 2 on the 2-rank link, tp 4 on the 4-rank one;
// an all-gather over the tp group then takes that link's fit.
TEST(CostModel, GroupsTakeTheLinkOfTheirSize) {
  ClusterSpec c = compute_only();
  c.intra = {1e9, 1e-3};
  Link two{20e9, 1e-5}, four{5e9, 4e-5};
  two.all_gather_bandwidth = 10e9, two.all_gather_latency = 2e-5;
  c.group_links = {{2, two}, {4, four}};
  Layout l;
  l.tp = 2, l.dp = 2;
  GroupLinks g = group_links(l, c);
  EXPECT_EQ(g.tp, two);
  EXPECT_EQ(g.dp, two);
  EXPECT_NEAR(all_gather_seconds(1e6, 2, g.tp), 1 * (2e-5 + 1e6 / (2 * 10e9)), 1e-15);
  l = Layout{};
  l.tp = 4;
  EXPECT_EQ(group_links(l, c).tp, four);
  l = Layout{};
  l.pp = 2, l.cp = 2;
  g = group_links(l, c);
  EXPECT_EQ(g.pp, two);
  EXPECT_EQ(g.cp, two);
  EXPECT_EQ(g.embedding, two);  // the first and last stage
  c.group_links.clear();
  EXPECT_EQ(group_links(l, c).pp, c.intra);
}

// With free memory traffic and links, one rank's step is its FLOPs at peak x efficiency: the
// linear layers 6 x (their weights) per token, causal attention 3.5 x 2 T C per layer and token
// (half the square forward, backward 2.5 x forward: it recomputes the probabilities), the LM head
// 6 C V per token. MFU then follows from flops_per_token (the full square) over the same time.
TEST(CostModel, ComputeIsTheFlopsAtPeakTimesEfficiency) {
  const Workload w = llama(4, 1000, 256, 8);
  const ClusterSpec c = compute_only();
  Layout l;
  l.micro_batch = 2;
  const StepCost s = predict_step(w, l, c);
  const ModelConfig& m = w.model;
  const double C = double(m.n_embd), kv = double(m.kv_heads() * m.head_dim()), F = double(m.ffn_hidden);
  const double weights = double(m.n_layer) * (2 * C * C + 2 * C * kv + 3 * C * F) + C * double(m.vocab_size);
  const double tokens = double(w.global_batch * w.seq_len);
  const double flops = tokens * (6 * weights + double(m.n_layer) * 3.5 * 2 * double(w.seq_len) * C);
  EXPECT_NEAR(s.step, flops / (c.peak_flops_fp32 * c.compute_efficiency), 1e-9 * s.step);
  EXPECT_NEAR(s.compute, s.step, 1e-9 * s.step);
  EXPECT_EQ(s.micro_batches, 4);
  EXPECT_NEAR(s.tokens_per_s, tokens / s.step, 1e-6);
  EXPECT_NEAR(s.mfu, flops_per_token(m, w.seq_len) * s.tokens_per_s / c.peak_flops_fp32, 1e-12);
  l.bf16 = true;  // the bf16 peak
  EXPECT_NEAR(predict_step(w, l, c).step, flops / (c.peak_flops_bf16 * c.compute_efficiency), 1e-9 * s.step);
  // Full recomputation runs every block's forward again: a third more of the blocks' FLOPs.
  l.bf16 = false;
  l.recompute = Recompute::Full;
  const StepCost f = predict_step(w, l, c);
  const double block_forward = 2 * (2 * C * C + 2 * C * kv + 3 * C * F) + 2 * double(w.seq_len) * C;
  EXPECT_NEAR(f.recompute, tokens * double(m.n_layer) * block_forward / (c.peak_flops_fp32 * c.compute_efficiency),
              1e-9 * s.step);
  EXPECT_NEAR(f.step - s.step, f.recompute, 1e-9 * s.step);
}

// Equal stages (a 16-id vocabulary, so the head weighs nothing next to two blocks; free memory
// traffic and links): the simulated 1F1B bubble is (pp - 1)/(m + pp - 1), also past the 8 pp
// micro-batches from which the step is extrapolated; interleaving divides the idle time by vpp.
TEST(CostModel, PipelineBubbleOfEqualStagesIsTheFormula) {
  const ClusterSpec c = compute_only();
  for (int64_t m : {4, 8, 16, 64}) {
    const Workload w = llama(8, 16, 128, m);
    Layout l;
    l.pp = 4;
    l.schedule = PipelineKind::OneFOneB;
    const StepCost s = predict_step(w, l, c);
    EXPECT_NEAR(s.bubble_fraction, 3.0 / double(m + 3), 2e-3) << "m " << m;
    // The busiest rank idles (pp - 1) stage-steps: bubble = 3 x (its step / m).
    EXPECT_NEAR(s.bubble / (s.compute / double(m)), 3.0, 1e-2) << "m " << m;
    EXPECT_NEAR(s.step, s.compute + s.bubble + s.optimizer, 1e-9 * s.step);
    l.schedule = PipelineKind::Interleaved;
    l.vpp = 2;
    const StepCost v = predict_step(w, l, c);
    EXPECT_NEAR(v.bubble / (v.compute / double(m)), 1.5, 1e-2) << "m " << m;
  }
}

// The step of a 2-stage 1F1B is the simulator's with the stages' own costs (the last stage holds
// the head), plus what follows the schedule.
TEST(CostModel, PipelineStepIsTheSimulatedOneWithTheStagesCosts) {
  ClusterSpec c = compute_only();
  c.memory_bandwidth = 1e12;
  c.op_latency = 1e-6;
  c.intra = {50e9, 2e-6};
  const Workload w = llama(4, 32000, 256, 16);
  Layout l;
  l.pp = 2;
  const GroupLinks links = group_links(l, c);
  const StepCost s = predict_step(w, l, c, links);
  SimOptions o;
  for (const StageSpec& st : cut_stages(w.model, w.seq_len, 2, 1)) {
    const ChunkTime t = chunk_time(w, l, c, links, st);
    o.chunks.push_back({t.f(), t.b(), t.w()});
  }
  o.latency = p2p_seconds(1.0 * 256 * 512 * 4, links.pp);  // one (B, T, C) activation, B = 1
  const SimResult r = simulate(pipeline_schedule(2, 1, 16, PipelineKind::OneFOneB), o);
  const double after = s.dp_exposed + s.embedding_exposed + s.optimizer + s.tp_exposed;
  EXPECT_NEAR(s.step, r.makespan + after, 1e-9 * s.step);
  EXPECT_NEAR(s.bubble_fraction, r.bubble_fraction, 1e-9);
  EXPECT_NE(o.chunks[1].forward, o.chunks[0].forward);  // unequal stages: the cut balances blocks against the head
  EXPECT_NEAR(s.compute + s.bubble, r.makespan, 1e-9 * s.step);
}

// Data parallel: the replicated all-reduce of the gradients runs during the last micro-batch's
// backward and only what that does not cover is exposed; ZeRO-1's reduce-scatter and all-gather
// come after backward, all of them exposed; without asynchronous progress nothing hides.
TEST(CostModel, DataParallelReductionHiddenOrExposed) {
  ClusterSpec c = compute_only();
  const Workload w = llama(2, 1000, 128, 16);
  Layout l;
  l.dp = 4;
  l.micro_batch = 2;
  const StepCost fast = predict_step(w, l, c);
  EXPECT_NEAR(fast.dp_exposed, 0.0, 1e-15);  // infinite links
  c.intra = {1e9, 1e-5};
  const StepCost slow = predict_step(w, l, c);
  const double params = slow.parameters, grads = params * 4;
  const double ar = all_reduce_seconds(grads, 4, c.intra);
  const double backward = (slow.compute / double(slow.micro_batches)) * 2.0 / 3.0;  // B + W of one micro-batch, about
  EXPECT_GT(slow.dp_exposed, 0.0);
  EXPECT_LT(slow.dp_exposed, ar);
  EXPECT_NEAR(slow.dp_exposed, ar - backward, 0.1 * ar);
  EXPECT_NEAR(slow.groups[3].seconds, ar, 1e-4);  // (+ a latency per extra 25 MiB bucket)
  EXPECT_NEAR(slow.groups[3].bytes, 1.5 * grads, 1e-3);
  l.zero = 1;
  const StepCost zero = predict_step(w, l, c);
  EXPECT_NEAR(zero.dp_exposed,
              reduce_scatter_seconds(grads, 4, c.intra) + all_gather_seconds(grads, 4, c.intra) +
                  all_reduce_seconds(8, 4, c.intra),
              1e-12);
  EXPECT_LT(zero.optimizer, slow.optimizer + 1e-15);  // each rank updates a quarter
  l.zero = 0;
  c.async_progress = false;
  EXPECT_NEAR(predict_step(w, l, c).dp_exposed, ar, 1e-4);
}

// Tensor parallel: every block's two regions cost an all-reduce of the (B T, C) activations each
// way, blocking; sequence parallelism moves the same bytes.
TEST(CostModel, TensorParallelCollectivesAreExposed) {
  ClusterSpec c = compute_only();
  c.intra = {100e9, 2e-6};
  const Workload w = llama(2, 1000, 128, 4);
  Layout l;
  l.tp = 2;
  l.dp = 1;
  const StepCost s = predict_step(w, l, c);
  const double x = 1.0 * 128 * 512 * 4;
  const double region = all_reduce_seconds(x, 2, c.intra);
  // 4 micro-batches x (2 blocks x 4 regions + the embedding's and the head's all-reduce + the
  // cross-entropy's all-gather and all-reduce), then the replicated K/V gradients' sum (4 KV heads
  // divide over 2: none; sequence parallelism off: no norms).
  const double ce = all_gather_seconds(128 * 4 * 2, 2, c.intra) + all_reduce_seconds(128 * 4, 2, c.intra);
  EXPECT_NEAR(s.tp_exposed, 4 * (2 * 4 * region + 2 * region + ce), 1e-12);
  l.sp = true;  // the norms' gradients are now partial over tp: 2 per block and the final one, summed after
                // backward; and backward gathers each region's input again (2 per block and micro-batch)
  const StepCost sp = predict_step(w, l, c);
  const double norms = (2 * 2 * 512 + 512) * 4.0;
  EXPECT_NEAR(sp.groups[0].bytes - s.groups[0].bytes,
              all_reduce_bytes(norms, 2) + 4 * 2 * 2 * all_gather_bytes(x, 2), 1e-6);
  EXPECT_NEAR(sp.tp_exposed, s.tp_exposed + all_reduce_seconds(norms, 2, c.intra) +
                                 4 * 2 * 2 * all_gather_seconds(x, 2, c.intra), 1e-12);
  // With the all-gather and the reduce-scatter fitted on their own (calibration), each region's
  // pair is priced on those fits: per micro-batch 2 blocks x 2 regions each way, and the re-gathers.
  ClusterSpec fitted = c;
  fitted.intra.all_gather_bandwidth = 20e9, fitted.intra.all_gather_latency = 5e-5;
  fitted.intra.reduce_scatter_bandwidth = 40e9, fitted.intra.reduce_scatter_latency = 1e-5;
  const Link& f = fitted.intra;
  const double pair = all_gather_seconds(x, 2, f) + reduce_scatter_seconds(x, 2, f);
  const StepCost spf = predict_step(w, l, fitted);
  const StepCost spc = predict_step(w, l, c);
  const double pair_c = all_gather_seconds(x, 2, c.intra) + reduce_scatter_seconds(x, 2, c.intra);
  EXPECT_NEAR(spf.tp_exposed - spc.tp_exposed,
              4 * (2 * 2 * 2 * (pair - pair_c) + 2 * 2 * (all_gather_seconds(x, 2, f) - all_gather_seconds(x, 2, c.intra))) +
                  4 * 2 * (all_gather_seconds(x, 2, f) - all_gather_seconds(x, 2, c.intra)) +
                  4 * 2 * (reduce_scatter_seconds(x, 2, f) - reduce_scatter_seconds(x, 2, c.intra)) +
                  4 * (all_gather_seconds(128 * 4 * 2, 2, f) - all_gather_seconds(128 * 4 * 2, 2, c.intra)),
              1e-12);
}

// cluster chain_scale_*: every computation (forward, backward, weight gradients, recomputation) of
// its dtype scaled, the tensor-parallel collectives and the optimizer not.
TEST(CostModel, ChainScaleMultipliesTheComputationOnly) {
  ClusterSpec c = compute_only();
  c.intra = {100e9, 2e-6};
  c.memory_bandwidth = 1e12;  // the optimizer costs something
  const Workload w = llama(2, 1000, 128, 4);
  Layout l;
  l.tp = 2, l.dp = 1, l.recompute = Recompute::Full;
  const StepCost base = predict_step(w, l, c);
  ClusterSpec scaled = c;
  scaled.chain_scale_fp32 = 1.5;
  scaled.chain_scale_bf16 = 4;  // (another dtype's: unused)
  const StepCost s = predict_step(w, l, scaled);
  EXPECT_GT(base.compute, 0);
  EXPECT_GT(base.recompute, 0);
  EXPECT_NEAR(s.compute, 1.5 * base.compute, 1e-12);
  EXPECT_NEAR(s.recompute, 1.5 * base.recompute, 1e-12);
  EXPECT_NEAR(s.tp_exposed, base.tp_exposed, 1e-12);
  EXPECT_NEAR(s.optimizer, base.optimizer, 1e-12);
  EXPECT_NEAR(s.step - base.step, 0.5 * (base.compute + base.recompute), 1e-12);
  l.bf16 = true;
  EXPECT_NEAR(predict_step(w, l, scaled).compute, 4 * predict_step(w, l, c).compute, 1e-12);
}

// cluster chain_scales: each layout's computation takes the scale at its micro-batch's positions
// per rank (sequences x seq_len / cp), interpolated in log(tokens) between the sizes measured.
TEST(CostModel, ChainScaleIsTheMicroBatchSizes) {
  ClusterSpec c = compute_only();
  const Workload w = llama(2, 1000, 64, 8);  // seq_len 64
  ClusterSpec scaled = c;
  scaled.chain_scale_fp32 = 7;  // replaced by the sizes measured
  scaled.chain_scales = {{64, 3.0, 5.0}, {256, 1.0, 1.0}};
  for (const auto& [mb, cp, scale] : {std::tuple{1, 1, 3.0}, std::tuple{2, 1, 2.0}, std::tuple{4, 2, 2.0},
                                      std::tuple{4, 1, 1.0}, std::tuple{8, 1, 1.0}, std::tuple{2, 2, 3.0}}) {
    Layout l;
    l.dp = 1, l.cp = cp, l.micro_batch = mb;
    const StepCost base = predict_step(w, l, c), s = predict_step(w, l, scaled);
    ASSERT_GT(base.compute, 0);
    EXPECT_NEAR(s.compute, scale * base.compute, 1e-9 * base.compute) << "micro-batch " << mb << ", cp " << cp;
  }
}

// cluster.tp_scales and cp_scales: a tp (cp) layout's computation and its group's collectives (ring
// transfers) take its degree's scale (by dtype), nothing else does (the other group's scale, set to
// 7, touches neither); a degree of 1 is left as it was.
TEST(CostModel, DegreeScalesMultiplyALayoutsComputeAndItsGroupsCommunication) {
  ClusterSpec c = compute_only();
  c.intra = {1e9, 50e-6};  // slow enough that the ring's transfers are not hidden behind attention
  const Workload w = llama(2, 1000, 128, 4);
  for (const bool tp_group : {true, false}) {
    ClusterSpec scaled = c;
    (tp_group ? scaled.tp_scales : scaled.cp_scales) = {{2, 1.5, 3.0}};
    (tp_group ? scaled.cp_scales : scaled.tp_scales) = {{2, 7.0, 7.0}};
    for (const auto& [degree, bf16, scale] :
         {std::tuple{2, false, 1.5}, std::tuple{2, true, 3.0}, std::tuple{1, true, 1.0}}) {
      Layout l;
      l.dp = 1, l.bf16 = bf16;
      (tp_group ? l.tp : l.cp) = degree;
      const StepCost base = predict_step(w, l, c), s = predict_step(w, l, scaled);
      const auto comm = [&](const StepCost& x) { return tp_group ? x.tp_exposed : x.cp_exposed; };
      const std::string where = std::string(tp_group ? "tp " : "cp ") + std::to_string(degree) + (bf16 ? " bf16" : " fp32");
      ASSERT_GT(base.compute, 0);
      EXPECT_NEAR(s.compute, scale * base.compute, 1e-9 * base.compute) << where;
      EXPECT_NEAR(comm(s), scale * comm(base), 1e-9 * base.step) << where;
      if (degree == 2) {
        EXPECT_GT(comm(base), 0) << where;
      }
      EXPECT_EQ(s.optimizer, base.optimizer);
    }
  }
}

// parallel.tp_comm_compression: the blocks' collectives move each direction's factor of their
// bytes (4 micro-batches x 2 blocks x 2 regions, forward and backward); the embedding's, the
// head's and the loss's stay as they were.
TEST(CostModel, CompressedTensorParallelBytesScaleTheBlocksCollectives) {
  ClusterSpec c = compute_only();
  c.intra = {100e9, 2e-6};
  Workload w = llama(2, 1000, 128, 4);
  Layout l;
  l.tp = 2;
  l.dp = 1;
  const StepCost exact = predict_step(w, l, c);
  w.tp_bytes_forward = 0.25;
  w.tp_bytes_backward = 0.5;
  const StepCost packed = predict_step(w, l, c);
  const double x = 1.0 * 128 * 512 * 4;
  EXPECT_NEAR(exact.groups[0].bytes - packed.groups[0].bytes,
              4 * 2 * 2 * (all_reduce_bytes(x, 2) * 0.75 + all_reduce_bytes(x, 2) * 0.5), 1e-6);
  EXPECT_NEAR(exact.tp_exposed - packed.tp_exposed,
              4 * 2 * 2 * (2 * all_reduce_seconds(x, 2, c.intra) - all_reduce_seconds(x / 4, 2, c.intra) -
                           all_reduce_seconds(x / 2, 2, c.intra)),
              1e-12);
}

TEST(CostModel, PartsAddUpToTheStep) {
  const ClusterSpec c = [] {
    ClusterSpec h;
    h.peak_flops_bf16 = 989e12;
    h.peak_flops_fp32 = 67e12;
    h.memory_bandwidth = 3.35e12;
    h.op_latency = 3e-6;
    h.intra = {450e9, 3e-6};
    h.inter = {50e9, 6e-6};
    return h;
  }();
  const Workload w = llama(8, 32000, 1024, 64);
  for (const Layout& l : {Layout{2, 2, 2, 1, 2, true, 1, PipelineKind::ZeroBubbleH1, true, 2, Recompute::Selective, true},
                          Layout{1, 4, 4, 2, 1, false, 0, PipelineKind::Interleaved, true, 1, Recompute::Full, false},
                          Layout{4, 1, 1, 1, 4, false, 0, PipelineKind::OneFOneB, false, 4, Recompute::None, true}}) {
    const StepCost s = predict_step(w, l, c);
    EXPECT_NEAR(s.compute + s.recompute + s.tp_exposed + s.cp_exposed + s.bubble + s.dp_exposed + s.embedding_exposed +
                    s.optimizer,
                s.step, 1e-9 * s.step)
        << describe(l);
    EXPECT_GT(s.tokens_per_s, 0);
    EXPECT_GT(s.mfu, 0);
    EXPECT_LT(s.mfu, 1);
    // The bound the search orders by is never above the simulated step.
    EXPECT_LE(predict_step(w, l, c, group_links(l, c), false).step, s.step * (1 + 1e-12)) << describe(l);
  }
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

// model.recompute_layers = k: k blocks of each chunk recompute their forward in full, the rest by
// the policy. Compute-only, one chunk: the recomputation is k/L of "full"'s, and k = L is "full".
TEST(CostModel, RecomputeLayersCostTheirBlocksForward) {
  const Workload w = llama(8, 4096, 256, 8);
  const ClusterSpec c = compute_only();
  Layout l;
  l.micro_batch = 2;
  l.recompute = Recompute::Full;
  const StepCost full = predict_step(w, l, c);
  l.recompute = Recompute::None;
  const StepCost none = predict_step(w, l, c);
  EXPECT_EQ(none.recompute, 0.0);
  for (int64_t k = 1; k <= 8; ++k) {
    l.recompute_layers = k;
    const StepCost s = predict_step(w, l, c);
    EXPECT_NEAR(s.recompute, full.recompute * double(k) / 8, 1e-12 * full.recompute) << k;
    EXPECT_NEAR(s.step, none.step + s.recompute, 1e-12 * s.step) << k;
  }
  EXPECT_NEAR(predict_step(w, l, c).step, full.step, 1e-12 * full.step);  // k = 8: every block
  // Under "selective" the blocks k leaves keep recomputing their norms and activation.
  l.recompute = Recompute::Selective;
  l.recompute_layers = 0;
  const double sel = predict_step(w, l, c).recompute;
  l.recompute_layers = 3;
  EXPECT_NEAR(predict_step(w, l, c).recompute, full.recompute * 3 / 8 + sel * 5 / 8, 1e-12 * full.recompute);
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

// GEMM rates measured by shape replace the roofline for the GEMMs of their dtype: at peak x
// efficiency the step is unchanged, at half of it the GEMMs take twice as long; rates of the other
// dtype change nothing.
TEST(CostModel, MeasuredGemmRatesReplaceTheRoofline) {
  const Workload w = llama(4, 4096, 256, 8);
  const ClusterSpec base = compute_only();
  Layout l;
  l.micro_batch = 2;
  const double rate = base.peak_flops_fp32 * base.compute_efficiency;
  const auto with_rates = [&](double r, bool bf16) {
    ClusterSpec c = base;
    for (const GemmShape& s : gemm_shapes(w, l)) c.gemm_rates.push_back({s.m, s.n, s.k, bf16, r});
    return c;
  };
  const StepCost a = predict_step(w, l, base);
  EXPECT_NEAR(predict_step(w, l, with_rates(rate, false)).step, a.step, 1e-12 * a.step);
  EXPECT_NEAR(predict_step(w, l, with_rates(rate / 2, true)).step, a.step, 1e-12 * a.step);
  // Twice as long for the GEMMs: 6 x rows x in x out FLOPs per Linear and the head, at the rate.
  const double rows = 2 * 256, C = 512, kv = 4 * 64, F = double(w.model.ffn_hidden);
  const double block = 6 * rows * (C * C + 2 * C * kv + C * C + 3 * C * F);
  const double gemm_seconds = (4 * block + 6 * rows * C * 4096) * double(w.micro_batches(l)) / rate;
  EXPECT_NEAR(predict_step(w, l, with_rates(rate / 2, false)).step, a.step + gemm_seconds, 1e-9 * a.step);
  // The shapes: a block's Linears forward (rows, out, in), dX (rows, in, out), dW (out, in, rows).
  const std::vector<GemmShape> shapes = gemm_shapes(w, l);
  for (const GemmShape& s : {GemmShape{512, 512, 512}, GemmShape{512, 256, 512}, GemmShape{512, 512, 256},
                             GemmShape{256, 512, 512}, GemmShape{512, 4096, 512}, GemmShape{4096, 512, 512}})
    EXPECT_TRUE(std::binary_search(shapes.begin(), shapes.end(), s)) << s.m << " " << s.n << " " << s.k;
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

// A link with per-collective fits (calibration) times each collective on its own fit; without
// them, on the all-reduce's.
TEST(CostModel, CollectivesUseTheirOwnFitWhenCalibrated) {
  Link l{1e10, 1e-5};
  EXPECT_NEAR(all_gather_seconds(1e9, 4, l), 3 * (1e-5 + 0.025), 1e-12);
  EXPECT_NEAR(p2p_seconds(1e6, l), 1e-5 + 1e-4, 1e-15);
  l.all_gather_bandwidth = 5e9, l.all_gather_latency = 2e-5;
  l.reduce_scatter_bandwidth = 2.5e9, l.reduce_scatter_latency = 1e-6;
  l.p2p_bandwidth = 1e9, l.p2p_latency = 3e-6;
  EXPECT_NEAR(all_gather_seconds(1e9, 4, l), 3 * (2e-5 + 0.05), 1e-12);
  EXPECT_NEAR(reduce_scatter_seconds(1e9, 4, l), 3 * (1e-6 + 0.1), 1e-12);
  EXPECT_NEAR(p2p_seconds(1e6, l), 3e-6 + 1e-3, 1e-15);
  EXPECT_NEAR(all_reduce_seconds(1e9, 4, l), 6 * (1e-5 + 0.025), 1e-12);  // unchanged
}

}  // namespace
}  // namespace tessera::plan

#include "plan/calibrate.h"

namespace tessera::plan {
namespace {

// A cluster where nothing costs (GEMMs, attention and the streamed ops at an endless rate): what
// the step holds is what op_times adds.
ClusterSpec free_cluster() {
  ClusterSpec c = compute_only();
  c.peak_flops_fp32 = c.peak_flops_bf16 = 1e30;
  return c;
}

Workload gpt2(int64_t layers, int64_t vocab, int64_t seq_len, int64_t global_batch) {
  ModelConfig m;
  m.preset = "gpt2";
  m.vocab_size = vocab;
  m.n_layer = layers;
  m.n_head = 4;
  m.n_embd = 256;
  m.max_seq_len = seq_len;
  return {resolve(m), seq_len, global_batch};
}

// Seconds given to each op family (any shape) in the hand-computed cases below.
double op_seconds(OpKind op) {
  switch (op) {
    case OpKind::AttentionForward: return 1e-3;
    case OpKind::AttentionBackward: return 2e-3;
    case OpKind::LayerNormForward: case OpKind::RmsNormForward: return 1e-4;
    case OpKind::LayerNormBackward: case OpKind::RmsNormBackward: return 2e-4;
    case OpKind::ResidualForward: return 1e-5;
    case OpKind::ResidualBackward: return 2e-5;
    case OpKind::GeluForward: case OpKind::SwigluForward: return 1e-6;
    case OpKind::GeluBackward: case OpKind::SwigluBackward: return 2e-6;
    case OpKind::RopeForward: return 1e-7;
    case OpKind::RopeBackward: return 2e-7;
    case OpKind::EmbeddingForward: return 3e-4;
    case OpKind::EmbeddingBackward: return 4e-4;
    case OpKind::CrossEntropyForward: return 5e-4;
    case OpKind::CrossEntropyBackward: return 6e-4;
    case OpKind::AdamW: return 7e-3;
    case OpKind::GradNorm: return 8e-3;
    case OpKind::LinearForward: return 1e-8;
    case OpKind::LinearBackwardInput: return 2e-8;
    case OpKind::LinearBackwardWeight: return 3e-8;
  }
  return 0;
}

// Measured op times (calibration's op_times, at the shapes model_op_shapes names for the model)
// replace the roofline: with every op of a family at one time, the step is the count of each op
// in the step times its time, computed by hand.
TEST(CostModel, MeasuredOpTimesReplaceTheRoofline) {
  for (const bool llama_model : {false, true}) {
    const Workload w = llama_model ? llama(4, 4096, 256, 16) : gpt2(3, 1000, 128, 16);
    ClusterSpec c = free_cluster();
    c.op_times = model_op_shapes(w, 2);
    for (OpTime& t : c.op_times) t.seconds = op_seconds(t.op) * (t.bf16 ? 0.5 : 1.0);
    Layout l;
    l.micro_batch = 4;
    const double L = double(w.model.n_layer), m = double(w.micro_batches(l));  // 4 micro-batches
    // A block: attention, two norms, two residual adds, the activation (and RoPE on q and k), forward
    // and backward; the embedding; the head's norm and cross-entropy; then AdamW and the norm.
    const double rope = llama_model ? 2 * (1e-7 + 2e-7) : 0;
    const double block = 1e-3 + 2e-3 + 2 * (1e-4 + 2e-4) + 2 * (1e-5 + 2e-5) + (1e-6 + 2e-6) + rope;
    // The Linears: q, k, v, the output, the MLP's two (SwiGLU: three) per block, and the head; each
    // forward, input and weight gradient (1 + 2 + 3) x 1e-8.
    const double linears = (L * (llama_model ? 7 : 6) + 1) * 6e-8;
    const double micro_batch = L * block + (3e-4 + 4e-4) + (1e-4 + 2e-4) + (5e-4 + 6e-4) + linears;
    const StepCost s = predict_step(w, l, c);
    EXPECT_NEAR(s.step, m * micro_batch + 7e-3 + 8e-3, 1e-9) << llama_model;
    EXPECT_NEAR(s.optimizer, 7e-3 + 8e-3, 1e-12);
    // Under bf16: AdamW's and the Linears' bf16 entries (half), the rest from the fp32 entries (the
    // trainer's fp32 activations).
    l.bf16 = true;
    EXPECT_NEAR(predict_step(w, l, c).step, m * (micro_batch - linears / 2) + 3.5e-3 + 8e-3, 1e-9) << llama_model;
    l.bf16 = false;
    // Micro-batch 16 was not measured: each op from the nearest measured shape, scaled by its work.
    // With times that grow as the work (1 ns per unit), twice the rows at half the micro-batches
    // give the step of micro-batch 8 (the optimizer's shapes are the same).
    for (OpTime& t : c.op_times)
      t.seconds = 1e-9 * op_work(t.op, std::vector<double>(t.shape.begin(), t.shape.end()));
    Layout big = l, eight = l;
    big.micro_batch = 16, eight.micro_batch = 8;
    const StepCost s8 = predict_step(w, eight, c), s16 = predict_step(w, big, c);
    EXPECT_NEAR(s16.step, s8.step, 1e-9 * s8.step) << llama_model;
    EXPECT_GT(s8.step, 0.01) << llama_model;  // (not a step of nothing)
  }
  // Without op_times: the roofline, as before (nothing but the FLOPs here).
  const Workload w = gpt2(3, 1000, 128, 16);
  Layout l;
  l.micro_batch = 4;
  EXPECT_LT(predict_step(w, l, free_cluster()).step, 1e-12);
}

// model.recompute = "bubble": the recomputation runs as the schedule's R actions, where the rank
// would wait, so the step is at most "full"'s and at least "none"'s, with the same work on every rank;
// with one stage (no pipeline, no R) it is "full".
TEST(CostModel, BubbleRecomputationIsPlacedByTheSchedule) {
  const Workload w = llama(4, 4096, 256, 8);
  ClusterSpec c = compute_only();
  c.intra = {1e9, 1e-5};  // the pp transfers cost something
  Layout l;
  l.pp = 2, l.dp = 1, l.micro_batch = 4;  // 2 micro-batches: a large bubble to fill
  l.schedule = PipelineKind::OneFOneB;
  l.recompute = Recompute::Full;
  const StepCost full = predict_step(w, l, c);
  Layout b = l;
  b.recompute_bubble = true;
  const StepCost bubble = predict_step(w, b, c);
  Layout n = l;
  n.recompute = Recompute::None;
  const StepCost none = predict_step(w, n, c);
  EXPECT_LT(bubble.step, full.step * (1 - 1e-3));
  EXPECT_GT(bubble.step, none.step);
  EXPECT_NEAR(bubble.compute + bubble.recompute, full.compute + full.recompute, 1e-12 * full.step);
  EXPECT_EQ(recompute_text(b), "bubble");
  // The search's lower bound (no pipeline) is "full"'s: the same work on every rank.
  EXPECT_NEAR(predict_step(w, b, c, group_links(b, c), false).step, predict_step(w, l, c, group_links(l, c), false).step,
              1e-12 * full.step);
  Layout one = b;
  one.pp = 1, one.dp = 2;
  Layout one_full = one;
  one_full.recompute_bubble = false;
  EXPECT_DOUBLE_EQ(predict_step(w, one, c).step, predict_step(w, one_full, c).step);
}

// model.recompute_ahead = K: the pipeline is the simulator's walk of the generator's schedule with
// R placed K ahead, with the stages' costs; the same work as "bubble" with K = 1.
TEST(CostModel, RecomputeAheadSimulatesItsOwnSchedule) {
  const Workload w = llama(4, 4096, 256, 16);
  ClusterSpec c = compute_only();
  c.intra = {1e9, 1e-5};
  Layout l;
  l.pp = 2, l.dp = 1, l.micro_batch = 2;  // 8 micro-batches
  l.schedule = PipelineKind::ZeroBubbleH1;
  l.recompute = Recompute::Full;
  l.recompute_bubble = true;
  Layout a = l;
  a.recompute_ahead = 2;
  EXPECT_EQ(recompute_text(a), "bubble+2a");
  const GroupLinks links = group_links(a, c);
  const StepCost one = predict_step(w, l, c), two = predict_step(w, a, c);
  SimOptions o;
  for (const StageSpec& st : cut_stages(w.model, w.seq_len, 2, 1)) {  // R: the recomputation and its collectives
    const ChunkTime t = chunk_time(w, a, c, links, st);
    const double rr = t.recompute + t.recompute_comm;
    o.chunks.push_back({t.f(), t.b() - rr, t.w(), rr});
  }
  o.latency = p2p_seconds(2.0 * 256 * 512 * 4, links.pp);  // one (B, T, C) activation, B = 2
  const SimResult r = simulate(pipeline_schedule(2, 1, 8, PipelineKind::ZeroBubbleH1, true, 2), o);
  const SimResult r1 = simulate(pipeline_schedule(2, 1, 8, PipelineKind::ZeroBubbleH1, true, 1), o);
  ASSERT_NE(r.makespan, r1.makespan);  // the placements differ in time
  // What follows the schedule (the gradient sums, the optimizer) is the same for both.
  EXPECT_NEAR(two.step - one.step, r.makespan - r1.makespan, 1e-9 * one.step);
  EXPECT_NEAR(two.compute + two.recompute, one.compute + one.recompute, 1e-12 * one.step);
}

}  // namespace
}  // namespace tessera::plan
