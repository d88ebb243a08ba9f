// Tests plan/cluster.h: the presets carry the data sheets' figures, a [cluster] file reads back what
// cluster_to_toml wrote, `base` starts from a preset, and every mistake is an error naming the key
// and the file:line.
#include "plan/cluster.h"

#include <gtest/gtest.h>

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
  const ClusterSpec back = parse_cluster(cluster_to_toml(s), "written.toml");
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

}  // namespace
}  // namespace tessera::plan
