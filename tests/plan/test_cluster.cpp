// Tests plan/cluster.h: the presets carry the data sheets' figures, a [cluster] file reads back what
// cluster_to_toml wrote, `base` starts from a preset, and every mistake is an error naming the key
// and the file:line.
#include "plan/cluster.h"

#include <gtest/gtest.h>

#include <cmath>

#include <string>

#include "error_testing.h"

namespace tessera::plan {
namespace {

using testing::throws_with;

constexpr double kGiB = double(int64_t{1} << 30);

TEST(Cluster, PresetsCarryTheDataSheetFigures) {
  const ClusterSpec h100 = preset("h100-sxm-80g");
  EXPECT_EQ(h100.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(h100.device_memory, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h100.peak_flops_bf16, 989.4e12);
  EXPECT_DOUBLE_EQ(h100.peak_flops_fp32, 67e12);
  EXPECT_DOUBLE_EQ(h100.memory_bandwidth, 3350e9);
  EXPECT_DOUBLE_EQ(h100.intra.bandwidth, 450e9);  // NVLink 4: 900 GB/s both directions
  EXPECT_DOUBLE_EQ(h100.inter.bandwidth, 50e9);   // 8 x 400 Gb/s per node of 8
  EXPECT_FALSE(h100.host_memory);
  EXPECT_DOUBLE_EQ(preset("h100-sxm-80g-ib4").inter.bandwidth, 25e9);
  const ClusterSpec h200 = preset("h200-141g");
  EXPECT_DOUBLE_EQ(h200.device_memory, 141 * kGiB);
  EXPECT_DOUBLE_EQ(h200.memory_bandwidth, 4800e9);
  EXPECT_DOUBLE_EQ(preset("h200-141g-ib4").inter.bandwidth, 25e9);
  const ClusterSpec a100 = preset("a100-80g");
  EXPECT_DOUBLE_EQ(a100.peak_flops_bf16, 312e12);
  EXPECT_DOUBLE_EQ(a100.peak_flops_fp32, 19.5e12);
  EXPECT_DOUBLE_EQ(a100.memory_bandwidth, 2039e9);
  EXPECT_DOUBLE_EQ(a100.intra.bandwidth, 300e9);  // NVLink 3: 600 GB/s both directions
  EXPECT_DOUBLE_EQ(a100.inter.bandwidth, 25e9);   // 8 x 200 Gb/s HDR per node of 8
  for (const std::string& name : preset_names()) EXPECT_EQ(preset(name).name, name);
  EXPECT_TRUE(throws_with([] { preset("h100"); }, {"no cluster preset named \"h100\"", "h100-sxm-80g", "local"}));
}

TEST(Cluster, LocalSplitsTheMachineBetweenItsRanks) {
  LocalMachine m;
  m.ranks = 4;
  m.memory_available = 8 * kGiB;
  m.peak_flops_fp32 = 100e9;
  const ClusterSpec c = local_cluster(m);
  EXPECT_EQ(c.devices_per_node, 4);
  EXPECT_DOUBLE_EQ(c.device_memory, 2 * kGiB);
  EXPECT_DOUBLE_EQ(c.peak_flops_fp32, 25e9);
  EXPECT_DOUBLE_EQ(c.usable_memory(), 2 * kGiB);  // the trainer's check lets the ranks use all of it
  EXPECT_TRUE(c.host_memory);
  EXPECT_FALSE(c.async_progress);
  m.bf16_native = true;
  EXPECT_DOUBLE_EQ(local_cluster(m).peak_flops_bf16, 50e9);
  EXPECT_EQ(preset("local", m).devices_per_node, 4);
}

TEST(Cluster, FileReadsBackWhatWasWritten) {
  ClusterSpec s = preset("a100-80g");
  s.name = "my \"lab\"";
  s.devices_per_node = 4;
  s.op_latency = 7e-6;
  s.async_progress = false;
  s.intra.all_gather_bandwidth = 3e9, s.intra.all_gather_latency = 9e-6;
  s.intra.reduce_scatter_bandwidth = 2e9, s.intra.reduce_scatter_latency = 8e-6;
  s.intra.p2p_bandwidth = 4e9, s.intra.p2p_latency = 1e-6;
  const ClusterSpec back = parse_cluster(cluster_to_toml(s), "written.toml");
  EXPECT_NEAR(back.intra.all_gather_bandwidth, 3e9, 1);
  EXPECT_NEAR(back.intra.all_gather_latency, 9e-6, 1e-15);
  EXPECT_NEAR(back.intra.reduce_scatter_bandwidth, 2e9, 1);
  EXPECT_NEAR(back.intra.reduce_scatter_latency, 8e-6, 1e-15);
  EXPECT_NEAR(back.intra.p2p_bandwidth, 4e9, 1);
  EXPECT_NEAR(back.intra.p2p_latency, 1e-6, 1e-15);
  EXPECT_EQ(parse_cluster("[cluster]\nbase = \"a100-80g\"\n", "b.toml").intra.all_gather_bandwidth, 0.0);
  EXPECT_EQ(back.name, s.name);
  EXPECT_EQ(back.description, s.description);
  EXPECT_EQ(back.devices_per_node, 4);
  EXPECT_DOUBLE_EQ(back.device_memory, s.device_memory);
  EXPECT_DOUBLE_EQ(back.usable_memory_fraction, s.usable_memory_fraction);
  EXPECT_DOUBLE_EQ(back.peak_flops_bf16, s.peak_flops_bf16);
  EXPECT_DOUBLE_EQ(back.peak_flops_fp32, s.peak_flops_fp32);
  EXPECT_DOUBLE_EQ(back.compute_efficiency, s.compute_efficiency);
  EXPECT_DOUBLE_EQ(back.memory_bandwidth, s.memory_bandwidth);
  EXPECT_NEAR(back.op_latency, 7e-6, 1e-18);
  EXPECT_DOUBLE_EQ(back.intra.bandwidth, s.intra.bandwidth);
  EXPECT_NEAR(back.intra.latency, s.intra.latency, 1e-18);
  EXPECT_DOUBLE_EQ(back.inter.bandwidth, s.inter.bandwidth);
  EXPECT_NEAR(back.inter.latency, s.inter.latency, 1e-18);
  EXPECT_FALSE(back.async_progress);
  EXPECT_FALSE(back.host_memory);
  EXPECT_EQ(back.source, "written.toml");
}

// The calibrated device (cluster.device, cluster.device_name) reads back; presets and files
// without it say nothing (""); a device other than cpu or cuda is refused, naming the key and line.
TEST(Cluster, TheCalibratedDeviceReadsBack) {
  ClusterSpec s = preset("h200-141g");
  EXPECT_EQ(s.device, "");
  s.device = "cuda", s.device_name = "NVIDIA H200 (sm_90, 139.8 GiB)";
  const ClusterSpec back = parse_cluster(cluster_to_toml(s), "gpu.toml");
  EXPECT_EQ(back.device, "cuda");
  EXPECT_EQ(back.device_name, s.device_name);
  EXPECT_EQ(parse_cluster("[cluster]\nbase = \"a100-80g\"\n", "old.toml").device, "");
  EXPECT_EQ(parse_cluster("[cluster]\nbase = \"a100-80g\"\ndevice = \"cpu\"\n", "c.toml").device, "cpu");
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\ndevice = \"gpu\"\n", "c.toml"); },
                          {"cluster.device (c.toml:3) = \"gpu\" must be \"cpu\", \"cuda\" or \"\""}));
}

// Format 2: GEMM rates by shape read back; a file without format_version (format 1, before the
// rates) reads as it did; a later version and malformed rates are refused, naming the key and line.
TEST(Cluster, GemmRatesAndTheFormatVersion) {
  ClusterSpec s = preset("a100-80g");
  s.gemm_rates = {{1024, 768, 768, false, 1.5e12}, {1024, 768, 768, true, 3.25e12}, {7, 64, 4096, false, 2e11}};
  const std::string text = cluster_to_toml(s);
  EXPECT_NE(text.find("format_version = " + std::to_string(kClusterFormatVersion)), std::string::npos) << text;
  const ClusterSpec back = parse_cluster(text, "c.toml");
  ASSERT_EQ(back.gemm_rates.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.gemm_rates[i].m, s.gemm_rates[i].m);
    EXPECT_EQ(back.gemm_rates[i].n, s.gemm_rates[i].n);
    EXPECT_EQ(back.gemm_rates[i].k, s.gemm_rates[i].k);
    EXPECT_EQ(back.gemm_rates[i].bf16, s.gemm_rates[i].bf16);
    EXPECT_NEAR(back.gemm_rates[i].flops, s.gemm_rates[i].flops, 1e-9 * s.gemm_rates[i].flops);
  }
  // The nearest measured shape of the dtype; none of it: 0.
  EXPECT_NEAR(measured_gemm_rate(back, 1000, 768, 768, false), 1.5e12, 1e3);
  EXPECT_NEAR(measured_gemm_rate(back, 8, 64, 4000, false), 2e11, 1e3);
  EXPECT_NEAR(measured_gemm_rate(back, 8, 64, 4000, true), 3.25e12, 1e3);
  EXPECT_EQ(measured_gemm_rate(preset("a100-80g"), 8, 64, 4000, true), 0.0);
  // Format 1 (no format_version, no gemm_rates): as before.
  EXPECT_TRUE(parse_cluster("[cluster]\nbase = \"a100-80g\"\nname = \"old\"\n", "old.toml").gemm_rates.empty());
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\nformat_version = 9\n", "new.toml"); },
                          {"cluster.format_version = 9", "new.toml:3", "newer tessera", "versions 1 to 8"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\ngemm_rates = [[1, 2, 3, \"fp16\", 5.0]]\n", "g.toml"); },
                          {"cluster.gemm_rates (g.toml:3", "\"fp32\" or \"bf16\""}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\ngemm_rates = [[1, 2, 3, \"fp32\"]]\n", "g.toml"); },
                          {"cluster.gemm_rates", "entry 0"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\ngemm_rates = [[0, 2, 3, \"fp32\", 1.0]]\n", "g.toml"); },
                          {"cluster.gemm_rates", "positive integer"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\ngemm_rates = [[1, 2, 3, \"fp32\", -1.0]]\n", "g.toml"); },
                          {"cluster.gemm_rates", "positive rate"}));
}

TEST(Cluster, BaseStartsFromAPreset) {
  const ClusterSpec c = parse_cluster("[cluster]\nbase = \"h100-sxm-80g\"\ninter_node_bandwidth_gbs = 12.5\n"
                                      "devices_per_node = 4\n",
                                      "mine.toml");
  EXPECT_DOUBLE_EQ(c.inter.bandwidth, 12.5e9);
  EXPECT_EQ(c.devices_per_node, 4);
  EXPECT_DOUBLE_EQ(c.peak_flops_bf16, 989.4e12);  // the rest from the preset
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"b200\"\n", "x.toml"); },
                          {"cluster.base (x.toml:2)", "no cluster preset named \"b200\""}));
}

TEST(Cluster, ErrorsNameTheKeyAndTheLine) {
  EXPECT_TRUE(throws_with([] { parse_cluster("[model]\nn_layer = 2\n", "c.toml"); },
                          {"\"model\" in c.toml:1", "one [cluster] table"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("", "c.toml"); }, {"c.toml has no [cluster] table"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster\n", "c.toml"); }, {"TOML syntax error in c.toml:1"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"h100-sxm-80g\"\ndevice_memory_gb = 80\n", "c.toml"); },
                          {"unknown key cluster.device_memory_gb (c.toml:3)", "did you mean cluster.device_memory_gib?"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"h100-sxm-80g\"\ndevices_per_node = 2.5\n", "c.toml"); },
                          {"cluster.devices_per_node (c.toml:3) must be an integer"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"h100-sxm-80g\"\npeak_tflops_bf16 = \"fast\"\n", "c.toml"); },
                          {"cluster.peak_tflops_bf16 (c.toml:3) must be a number"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"h100-sxm-80g\"\n\ncompute_efficiency = 1.5\n", "c.toml"); },
                          {"cluster.compute_efficiency (c.toml:4) = 1.5 must be > 0 and <= 1"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"h100-sxm-80g\"\nintra_node_bandwidth_gbs = 0\n", "c.toml"); },
                          {"cluster.intra_node_bandwidth_gbs (c.toml:3) = 0 must be > 0"}));
  // Without a base every key without a default is required.
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\ndevices_per_node = 8\n", "c.toml"); },
                          {"c.toml: cluster.device_memory_gib is missing", "base = \"h100-sxm-80g\""}));
}

TEST(Cluster, OverridesAreCheckedLikeTheFile) {
  ClusterSpec c = preset("h100-sxm-80g");
  apply_cluster_override(c, "cluster.inter_node_bandwidth_gbs=25");
  apply_cluster_override(c, "intra_node_latency_us = 2");
  apply_cluster_override(c, "cluster.name=my-cluster");
  EXPECT_DOUBLE_EQ(c.inter.bandwidth, 25e9);
  EXPECT_NEAR(c.intra.latency, 2e-6, 1e-18);
  EXPECT_EQ(c.name, "my-cluster");
  EXPECT_TRUE(throws_with([&] { apply_cluster_override(c, "cluster.inter_bw=1"); }, {"unknown key cluster.inter_bw"}));
  EXPECT_TRUE(throws_with([&] { apply_cluster_override(c, "cluster.devices_per_node=0"); },
                          {"cluster.devices_per_node (--set cluster.devices_per_node=0) = 0 must be >= 1"}));
  EXPECT_TRUE(throws_with([&] { apply_cluster_override(c, "cluster.peak_tflops_fp32=lots"); },
                          {"cluster.peak_tflops_fp32 must be a number"}));
  EXPECT_TRUE(throws_with([&] { apply_cluster_override(c, "cluster.devices_per_node"); }, {"expected cluster.key=value"}));
}

TEST(Cluster, LoadTakesAFileOrAPreset) {
  EXPECT_EQ(load_cluster("h200-141g").name, "h200-141g");
  EXPECT_TRUE(throws_with([] { load_cluster("/no/such/cluster.toml"); },
                          {"--cluster /no/such/cluster.toml: no such file, and no preset of that name"}));
}

// Format 6: the chain scale by micro-batch size, read back ascending; between two sizes it is
// interpolated linearly in log(tokens), outside them the nearest's; without any, the two scalars.
TEST(Cluster, ChainScalesByMicroBatchAndFormatSix) {
  ClusterSpec s = preset("local");
  s.chain_scale_fp32 = 1.25, s.chain_scale_bf16 = 1.5;
  EXPECT_EQ(s.chain_scale(false, 100), 1.25);  // none measured by size
  EXPECT_EQ(s.chain_scale(true, 100), 1.5);
  s.chain_scales = {{256, 1.0, 1.2}, {64, 2.0, 1.6}};
  const std::string text = cluster_to_toml(s);
  EXPECT_NE(text.find("[64, 2, 1.6],"), std::string::npos) << text;
  const ClusterSpec back = parse_cluster(text, "c.toml");
  ASSERT_EQ(back.chain_scales.size(), 2u);
  EXPECT_EQ(back.chain_scales[0], (ChainScale{64, 2.0, 1.6}));  // sorted
  EXPECT_EQ(back.chain_scales[1], (ChainScale{256, 1.0, 1.2}));
  EXPECT_DOUBLE_EQ(back.chain_scale(false, 128), 1.5);  // halfway in log(tokens)
  EXPECT_DOUBLE_EQ(back.chain_scale(true, 128), 1.4);
  EXPECT_DOUBLE_EQ(back.chain_scale(false, 64 * std::pow(2.0, 0.5)), 1.75);
  EXPECT_DOUBLE_EQ(back.chain_scale(false, 16), 2.0);  // below the smallest: its scale
  EXPECT_DOUBLE_EQ(back.chain_scale(true, 4096), 1.2);  // above the largest: its scale
  const auto file = [](int version, const std::string& rows) {
    return "[cluster]\nbase = \"a100-80g\"\nformat_version = " + std::to_string(version) + "\nchain_scales = [" +
           rows + "]\n";
  };
  EXPECT_EQ(parse_cluster(file(6, "[64, 1.1, 1.2]"), "c.toml").chain_scales.size(), 1u);
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[64, 1.1, 1.2]"), "c.toml"); },
                          {"cluster.chain_scales (c.toml:4)", "format_version = 6", "says 5"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(6, "[64, 1.1, 1.2], [64, 1.0, 1.0]"), "c.toml"); },
                          {"entry 1 gives 64 tokens a second time"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(6, "[0, 1.1, 1.2]"), "c.toml"); },
                          {"entry 0 field 0 must be the positions per rank of a micro-batch"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(6, "[64, 1.1, 0.0]"), "c.toml"); },
                          {"entry 0 field 2 must be a positive scale"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(6, "[64, 1.1]"), "c.toml"); },
                          {"cluster.chain_scales (c.toml:4): entry 0 must be [tokens per micro-batch"}));
}

// Formats 7 and 8: tp_scales and cp_scales, written and read back (sorted); a layout takes its
// degree's, or the nearest measured degree's in log(degree); a degree of 1 and a file without them 1;
// older formats refuse them and malformed entries name the entry.
TEST(Cluster, DegreeScalesByTpAndCpInFormatsSevenAndEight) {
  for (const auto& [group, version] : {std::pair<std::string, int>{"tp", 7}, {"cp", 8}}) {
    SCOPED_TRACE(group);
    const bool tp = group == "tp";
    ClusterSpec s = preset("local");
    const auto scale = [&](const ClusterSpec& c, int64_t degree, bool bf16) {
      return tp ? c.tp_scale(degree, bf16) : c.cp_scale(degree, bf16);
    };
    EXPECT_EQ(scale(s, 2, false), 1.0);  // none measured
    (tp ? s.tp_scales : s.cp_scales) = {{4, 1.5, 1.75}, {2, 1.25, 1.3}};
    const std::string text = cluster_to_toml(s);
    EXPECT_NE(text.find("format_version = 8"), std::string::npos) << text;
    EXPECT_NE(text.find(group + "_scales = [\n"), std::string::npos) << text;
    EXPECT_NE(text.find("  [2, 1.25, 1.3],\n"), std::string::npos) << text;
    const ClusterSpec back = parse_cluster(text, "c.toml");
    const std::vector<DegreeScale>& read = tp ? back.tp_scales : back.cp_scales;
    ASSERT_EQ(read.size(), 2u);
    EXPECT_EQ(read[0], (DegreeScale{2, 1.25, 1.3}));
    EXPECT_EQ(read[1], (DegreeScale{4, 1.5, 1.75}));
    EXPECT_TRUE((tp ? back.cp_scales : back.tp_scales).empty());
    EXPECT_EQ(scale(back, 1, true), 1.0);
    EXPECT_EQ(scale(back, 2, false), 1.25);
    EXPECT_EQ(scale(back, 4, true), 1.75);
    EXPECT_EQ(scale(back, 8, false), 1.5);  // the nearest: 4
    EXPECT_EQ(scale(back, 3, true), 1.75);  // between 2 and 4 (log 1.5 > log 4/3): 4
    const auto file = [&](int v, const std::string& rows) {
      return "[cluster]\nbase = \"a100-80g\"\nformat_version = " + std::to_string(v) + "\n" + group + "_scales = [" +
             rows + "]\n";
    };
    const std::string key = "cluster." + group + "_scales (c.toml:4)";
    EXPECT_EQ(parse_cluster(file(version, "[2, 1.1, 1.2]"), "c.toml").tp_scales.size(), tp ? 1u : 0u);
    EXPECT_TRUE(throws_with([&] { parse_cluster(file(version - 1, "[2, 1.1, 1.2]"), "c.toml"); },
                            {key, "format_version = " + std::to_string(version), "says " + std::to_string(version - 1)}));
    EXPECT_TRUE(throws_with([&] { parse_cluster(file(version, "[2, 1.1, 1.2], [2, 1.0, 1.0]"), "c.toml"); },
                            {"entry 1 gives " + group + " 2 a second time"}));
    EXPECT_TRUE(throws_with([&] { parse_cluster(file(version, "[1, 1.1, 1.2]"), "c.toml"); },
                            {"entry 0 field 0 must be the " + group + " degree: an integer of at least 2"}));
    EXPECT_TRUE(throws_with([&] { parse_cluster(file(version, "[2, -1.0, 1.2]"), "c.toml"); },
                            {"entry 0 field 1 must be a positive scale"}));
    EXPECT_TRUE(throws_with([&] { parse_cluster(file(version, "[2, 1.1]"), "c.toml"); },
                            {key + ": entry 0 must be [" + group + " degree, fp32 scale, bf16 scale]"}));
  }
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

// Format 3: op_times, written and read back; the nearest measured shape scaled by the op's work;
// files of format 1 and 2 read as before and refuse op_times; malformed entries name the entry.
TEST(Cluster, OpTimesAndFormatThree) {
  ClusterSpec s = preset("a100-80g");
  s.op_times = {{OpKind::AttentionForward, {2, 256, 256, 8, 4, 64}, false, 1.5e-3},
                {OpKind::LayerNormBackward, {512, 768}, false, 2.5e-5},
                {OpKind::AdamW, {1000000}, true, 4e-4},
                {OpKind::AdamW, {1000000}, false, 6e-4}};
  const std::string text = cluster_to_toml(s);
  EXPECT_NE(text.find("format_version = " + std::to_string(kClusterFormatVersion)), std::string::npos) << text;
  EXPECT_NE(text.find("[\"attention_forward\", [2, 256, 256, 8, 4, 64], \"fp32\", 1500.0]"), std::string::npos) << text;
  const ClusterSpec back = parse_cluster(text, "c.toml");
  ASSERT_EQ(back.op_times.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back.op_times[i].op, s.op_times[i].op);
    EXPECT_EQ(back.op_times[i].shape, s.op_times[i].shape);
    EXPECT_EQ(back.op_times[i].bf16, s.op_times[i].bf16);
    EXPECT_NEAR(back.op_times[i].seconds, s.op_times[i].seconds, 1e-12);
  }
  // At a measured shape its time; elsewhere scaled by the work: attention b t s h d (4 x the batch,
  // half the keys: 2x), a norm rows x c, AdamW its elements.
  EXPECT_DOUBLE_EQ(measured_op_seconds(back, OpKind::AttentionForward, {2, 256, 256, 8, 4, 64}, false), 1.5e-3);
  EXPECT_NEAR(measured_op_seconds(back, OpKind::AttentionForward, {8, 256, 128, 8, 4, 64}, false), 3e-3, 1e-15);
  EXPECT_NEAR(measured_op_seconds(back, OpKind::LayerNormBackward, {256, 768}, false), 1.25e-5, 1e-17);
  EXPECT_NEAR(measured_op_seconds(back, OpKind::AdamW, {3000000}, true), 1.2e-3, 1e-15);
  EXPECT_NEAR(measured_op_seconds(back, OpKind::AdamW, {3000000}, false), 1.8e-3, 1e-15);
  // bf16 asked, only fp32 measured: the fp32 entry (the trainer's activations are fp32 under both);
  // fp32 asked, only bf16 measured: none. An op not measured: 0.
  EXPECT_DOUBLE_EQ(measured_op_seconds(back, OpKind::LayerNormBackward, {512, 768}, true), 2.5e-5);
  ClusterSpec only16 = back;
  only16.op_times = {{OpKind::AdamW, {10}, true, 1e-6}};
  EXPECT_EQ(measured_op_seconds(only16, OpKind::AdamW, {10}, false), 0.0);
  EXPECT_EQ(measured_op_seconds(back, OpKind::GeluForward, {100}, false), 0.0);
  EXPECT_TRUE(has_op_times(back, OpKind::AdamW));
  EXPECT_FALSE(has_op_times(back, OpKind::GeluForward));
  // Format 2 (and 1) files: no op_times; one that has them is refused, asking for version 3.
  EXPECT_TRUE(parse_cluster("[cluster]\nbase = \"a100-80g\"\nformat_version = 2\n", "v2.toml").op_times.empty());
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\nformat_version = 2\n"
                                             "op_times = [[\"adamw\", [10], \"fp32\", 1.0]]\n", "v2.toml"); },
                          {"cluster.op_times (v2.toml:4)", "format_version = 3", "says 2"}));
  EXPECT_TRUE(throws_with([] { parse_cluster("[cluster]\nbase = \"a100-80g\"\n"
                                             "op_times = [[\"adamw\", [10], \"fp32\", 1.0]]\n", "v1.toml"); },
                          {"cluster.op_times (v1.toml:3)", "no format_version key"}));
  const auto v3 = [](const std::string& entry) {
    return "[cluster]\nbase = \"a100-80g\"\nformat_version = 3\nop_times = [" + entry + "]\n";
  };
  EXPECT_TRUE(throws_with([&] { parse_cluster(v3("[\"softmax\", [10], \"fp32\", 1.0]"), "o.toml"); },
                          {"cluster.op_times (o.toml:4)", "entry 0", "\"softmax\"", "attention_forward"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(v3("[\"layernorm_forward\", [10], \"fp32\", 1.0]"), "o.toml"); },
                          {"entry 0 (layernorm_forward)", "2 positive integers"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(v3("[\"gelu_forward\", [10], \"fp16\", 1.0]"), "o.toml"); },
                          {"entry 0", "\"fp32\" or \"bf16\""}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(v3("[\"gelu_forward\", [10], \"fp32\", 0.0]"), "o.toml"); },
                          {"entry 0", "positive time in microseconds"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(v3("[\"gelu_forward\", [10], \"fp32\"]"), "o.toml"); },
                          {"entry 0 must be [op, [dims...]"}));
}

// Format 4: the linear_* ops, [rows, in, out, bias] with bias 0 or 1; looked up only at their own
// dtype and bias flag (a bf16 GEMM is another kernel), the nearest (rows, in, out) scaled by
// rows x in x out; refused in a file of version 3.
TEST(Cluster, LinearOpTimesAndFormatFour) {
  ClusterSpec s = preset("a100-80g");
  s.op_times = {{OpKind::LinearForward, {512, 256, 1024, 1}, false, 2e-3},
                {OpKind::LinearForward, {512, 256, 1024, 1}, true, 1e-3},
                {OpKind::LinearForward, {512, 256, 13, 0}, false, 5e-5},
                {OpKind::LinearBackwardWeight, {512, 256, 1024, 1}, false, 4e-3}};
  const std::string text = cluster_to_toml(s);
  EXPECT_NE(text.find("[\"linear_forward\", [512, 256, 13, 0], \"fp32\", 50.0]"), std::string::npos) << text;
  const ClusterSpec back = parse_cluster(text, "c.toml");
  ASSERT_EQ(back.op_times.size(), 4u);
  EXPECT_EQ(back.op_times[2].shape, (std::vector<int64_t>{512, 256, 13, 0}));
  EXPECT_DOUBLE_EQ(measured_op_seconds(back, OpKind::LinearForward, {512, 256, 1024, 1}, false), 2e-3);
  EXPECT_DOUBLE_EQ(measured_op_seconds(back, OpKind::LinearForward, {512, 256, 1024, 1}, true), 1e-3);
  EXPECT_NEAR(measured_op_seconds(back, OpKind::LinearForward, {1024, 256, 1024, 1}, false), 4e-3, 1e-15);
  // Without a bias: only the entry without one, however far its shape (the head's 13 outputs).
  EXPECT_NEAR(measured_op_seconds(back, OpKind::LinearForward, {512, 256, 1024, 0}, false), 5e-5 * 1024 / 13, 1e-12);
  // bf16 asked, only fp32 measured: none (unlike the elementwise ops).
  EXPECT_EQ(measured_op_seconds(back, OpKind::LinearBackwardWeight, {512, 256, 1024, 1}, true), 0.0);
  EXPECT_EQ(measured_op_seconds(back, OpKind::LinearBackwardInput, {512, 256, 1024, 1}, false), 0.0);
  const auto file = [](int version, const std::string& dims) {
    return "[cluster]\nbase = \"a100-80g\"\nformat_version = " + std::to_string(version) +
           "\nop_times = [[\"linear_backward_input\", " + dims + ", \"fp32\", 1.0]]\n";
  };
  EXPECT_EQ(parse_cluster(file(4, "[8, 16, 32, 0]"), "l.toml").op_times.size(), 1u);
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(3, "[8, 16, 32, 0]"), "l.toml"); },
                          {"cluster.op_times (l.toml:4)", "linear_backward_input", "format_version = 4", "says 3"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(4, "[8, 16, 32, 2]"), "l.toml"); },
                          {"entry 0 (linear_backward_input)", "bias 0 or 1"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(4, "[8, 0, 32, 1]"), "l.toml"); },
                          {"entry 0 (linear_backward_input)", "4 positive integers"}));
}

// Links by group size (format 5): written per collective, read back, each size needing its
// all-reduce; intra_link takes a group's own size, else the nearest calibrated one, else intra.
TEST(Cluster, GroupLinksByGroupSizeAndFormatFive) {
  ClusterSpec s = preset("local");
  s.intra = {3e9, 4e-5};
  Link two{8e9, 2e-6};
  two.all_gather_bandwidth = 6e9, two.all_gather_latency = 3e-6;
  two.p2p_bandwidth = 5e9, two.p2p_latency = 0;  // a fit may leave no latency
  const Link four{4e9, 9e-6};
  s.group_links = {{2, two}, {4, four}};
  const std::string text = cluster_to_toml(s);
  EXPECT_NE(text.find("[2, \"all_gather\", 6, 3],"), std::string::npos) << text;
  EXPECT_EQ(text.find("[4, \"p2p\""), std::string::npos) << text;  // not fitted: not written
  const ClusterSpec back = parse_cluster(text, "g.toml");
  ASSERT_EQ(back.group_links.size(), 2u);
  EXPECT_EQ(back.group_links[0], (SizedLink{2, two}));
  EXPECT_EQ(back.group_links[1], (SizedLink{4, four}));
  EXPECT_EQ(intra_link(back, 2), two);
  EXPECT_EQ(intra_link(back, 4), four);
  EXPECT_EQ(intra_link(back, 8), four);   // the nearest
  EXPECT_EQ(intra_link(back, 3), four);   // 3 lies nearer 4 than 2 (|log 4/3| < |log 3/2|)
  EXPECT_EQ(intra_link(back, 1), two);
  ClusterSpec none = back;
  none.group_links.clear();
  EXPECT_EQ(intra_link(none, 4), none.intra);  // none calibrated: the node's link
  const auto file = [](int version, const std::string& rows) {
    return "[cluster]\nbase = \"a100-80g\"\nformat_version = " + std::to_string(version) + "\ngroup_links = [" +
           rows + "]\n";
  };
  EXPECT_EQ(parse_cluster(file(5, "[2, \"all_reduce\", 1.0, 2.0]"), "g.toml").group_links.size(), 1u);
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(4, "[2, \"all_reduce\", 1.0, 2.0]"), "g.toml"); },
                          {"cluster.group_links (g.toml:4)", "format_version = 5", "says 4"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[2, \"p2p\", 1.0, 2.0]"), "g.toml"); },
                          {"groups of 2 ranks have no all_reduce entry"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[2, \"all_reduce\", 1.0, 2.0], [2, \"all_reduce\", 1.0, 2.0]"), "g.toml"); },
                          {"entry 1 gives all_reduce over 2 ranks a second time"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[1, \"all_reduce\", 1.0, 2.0]"), "g.toml"); },
                          {"entry 0 field 0 must be the group's size: an integer of at least 2"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[2, \"broadcast\", 1.0, 2.0]"), "g.toml"); },
                          {"entry 0 field 1 must be \"all_reduce\""}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[2, \"all_reduce\", 0.0, 2.0]"), "g.toml"); },
                          {"entry 0 field 2 must be a positive bandwidth in GB/s"}));
  EXPECT_TRUE(throws_with([&] { parse_cluster(file(5, "[2, \"all_reduce\", 1.0, -2.0]"), "g.toml"); },
                          {"entry 0 field 3 must be a latency in microseconds (0 or more)"}));
}

}  // namespace
}  // namespace tessera::plan
