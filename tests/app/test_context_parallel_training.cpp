// Context parallelism in the trainer: cp 2 and 4 (ring; cp 2 also under full recomputation), cp 2
// with all-gather attention, cp 2 x tp 2 with sequence parallelism, cp 2 x dp 2 with ZeRO-1 and
// cp 2 x pp 2 train the 1-rank run's losses
// and final parameters and AdamW moments within 1e-5 (fp32, other summation orders), for the GPT-2
// preset (learned positions: each rank's chunks read their global rows of wpe) and LLaMA (RoPE at
// the global positions, grouped KV heads). A cp checkpoint resumes on one rank and a 1-rank one on
// cp 2. Runs under `mpiexec -n 2` and `-n 4` (ctest ContextParallelLayouts.*; the suite means
// nothing on one rank): each layout trains the real Trainer on its own communicator and compares
// with the 1-rank run it computed itself (trainer_testing.h). Packed documents
// (data.document_mask) on a token dataset: cp 2 (ring, all-gather), cp 2 x dp 2 (+ZeRO-1),
// cp 2 x tp 2 (+sp) and cp 2 x pp 2 equal the 1-rank run with the mask.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/memory_check.h"
#include "app/trainer.h"
#include "data/indexed_dataset.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "trainer_testing.h"

namespace tessera {
namespace {
using testing::expect_state_near;
using testing::Trained;
using testing::train;

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> sets;
};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// 5 steps of 4 micro-batches of 2 sequences of 24 positions: chunks of 6 under cp 2, of 3 (odd)
// under cp 4.
const std::vector<std::string> kBase = {"train.steps=5", "train.global_batch=8", "train.micro_batch=2"};
std::vector<std::string> cp(int n, const std::string& comm = "ring") {
  return {"parallel.cp=" + std::to_string(n), "parallel.cp_comm=\"" + comm + "\""};
}

std::vector<Layout> layouts() {
  return {{"cp2_ring", 2, cp(2)},
          {"cp2_allgather", 2, cp(2, "allgather")},
          // Full recomputation re-runs the ring inside backward: every cp rank in the same order.
          {"cp2_ring_recompute", 2, cp(2) + std::vector<std::string>{"model.recompute=\"full\""}},
          {"cp4_ring", 4, cp(4)},
          {"cp2tp2sp", 4, cp(2) + std::vector<std::string>{"parallel.tp=2", "parallel.sequence_parallel=true"}},
          {"cp2dp2_zero", 4, cp(2) + std::vector<std::string>{"parallel.zero=1"}},
          {"cp2pp2_1f1b", 4, cp(2) + std::vector<std::string>{"parallel.pp=2", "parallel.pp_schedule=\"1f1b\""}}};
}

void expect_cp_layouts_equal_one_rank(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const std::string config = testing::layout_config(preset);
  const Trained one = train(parse_config_string(config, preset + ".toml", kBase), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 5u);
  int ran = 0;
  for (const Layout& l : layouts()) {
    if (l.ranks != world.size()) continue;
    ++ran;
    const std::string what = preset + " " + l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trained got = train(parse_config_string(config, preset + ".toml", kBase + l.sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
  }
  EXPECT_GT(ran, 0) << "no context-parallel layout of " << world.size() << " ranks";
}

}  // namespace

TEST(ContextParallelLayouts, Gpt2EqualsTheOneRankRun) { expect_cp_layouts_equal_one_rank("gpt2"); }
TEST(ContextParallelLayouts, LlamaEqualsTheOneRankRun) { expect_cp_layouts_equal_one_rank("llama"); }

// A byte-tokenizer dataset of short documents (3 to 17 bytes each, then the end-of-text id 256),
// written by rank 0 of world into a temp directory every rank gets the prefix of.
std::string document_dataset(const MpiCommunicator& world) {
  std::string prefix;
  if (world.rank() == 0) {
    prefix = (testing::temp_dir("cp_documents") / "docs").string();
    IndexedDatasetBuilder out(prefix, IndexedDatasetBuilder::dtype_for_vocab(257));
    uint64_t x = 12345;
    for (int d = 0; d < 400; ++d) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int n = 3 + static_cast<int>((x >> 33) % 15);
      std::vector<int32_t> ids;
      for (int i = 0; i < n; ++i) ids.push_back(97 + (d * 7 + i * (d % 5 + 1)) % 26);  // learnable letters
      ids.push_back(256);
      out.add_document(ids);
    }
    out.finalize();
  }
  return broadcast_bytes(world.comm(), prefix, 0);
}

void expect_document_mask_layouts_equal_one_rank(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const std::string prefix = document_dataset(world);
  const std::string config = testing::layout_config(preset);
  const std::vector<std::string> docs = kBase + std::vector<std::string>{
      "data.task=\"tokens\"", "data.tokenizer=\"byte\"", "data.train=[{path=\"" + prefix + "\"}]",
      "data.document_mask=true"};
  const Trained one = train(parse_config_string(config, preset + ".toml", docs), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 5u);
  // The mask changes the run: the same data without it trains other losses.
  std::vector<std::string> unmasked = docs;
  unmasked.back() = "data.document_mask=false";
  const Trained plain = train(parse_config_string(config, preset + ".toml", unmasked), MPI_COMM_NULL);
  EXPECT_GT(std::abs(plain.losses[0] - one.losses[0]), 1e-4 * one.losses[0]) << preset;
  const std::vector<Layout> layouts = {
      {"cp2_ring", 2, cp(2)},
      {"cp2_allgather", 2, cp(2, "allgather")},
      {"cp2dp2_zero", 4, cp(2) + std::vector<std::string>{"parallel.zero=1"}},
      {"cp2tp2sp", 4, cp(2) + std::vector<std::string>{"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"cp2pp2_1f1b", 4, cp(2) + std::vector<std::string>{"parallel.pp=2", "parallel.pp_schedule=\"1f1b\""}}};
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != world.size()) continue;
    ++ran;
    const std::string what = preset + " documents " + l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trained got = train(parse_config_string(config, preset + ".toml", docs + l.sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
  }
  EXPECT_GT(ran, 0) << "no document-mask layout of " << world.size() << " ranks";
  MPI_Barrier(world.comm());
  if (world.rank() == 0) std::filesystem::remove_all(std::filesystem::path(prefix).parent_path());
}

TEST(ContextParallelLayouts, DocumentMaskGpt2EqualsTheOneRankRun) { expect_document_mask_layouts_equal_one_rank("gpt2"); }
TEST(ContextParallelLayouts, DocumentMaskLlamaEqualsTheOneRankRun) {
  expect_document_mask_layouts_equal_one_rank("llama");
}

// A checkpoint saved under cp (every rank in the collective write; cp rank 0 writes the tensors)
// after 3 of 5 steps resumes on one rank, and a 1-rank checkpoint resumes under cp: the remaining
// losses and the final state are the uninterrupted 1-rank run's.
TEST(ContextParallelLayouts, CheckpointsResumeAcrossCp) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  if (world.size() != 2) GTEST_SKIP() << "the cp 2 checkpoints run on two ranks";
  const std::string config = testing::layout_config("llama");
  const Trained one = train(parse_config_string(config, "llama.toml", kBase), MPI_COMM_NULL);
  const std::vector<double> last_two(one.losses.begin() + 3, one.losses.end());
  const std::vector<std::string> stop = {"train.exit_after_steps=3"};
  for (bool from_cp : {true, false}) {
    const std::string what = std::string(from_cp ? "cp 2 -> 1 rank" : "1 rank -> cp 2") + " (rank " +
                             std::to_string(world.rank()) + ")";
    const std::string dir = broadcast_bytes(
        world.comm(), world.rank() == 0 ? testing::temp_dir(std::string("cp_resume_") + (from_cp ? "a" : "b")).string() : "",
        0);
    std::string error;
    if (from_cp) {  // both ranks save
      MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
      error = testing::error_of([&] {
        Trainer first(parse_config_string(config, "llama.toml", kBase + cp(2) + stop), dir, comm.comm());
        first.run();
      });
    } else if (world.rank() == 0) {
      error = testing::error_of([&] {
        Trainer first(parse_config_string(config, "llama.toml", kBase + stop), dir, MPI_COMM_SELF);
        first.run();
      });
    }
    throw_if_any_failed(world.comm(), error);
    // Resume: on rank 0 alone, or on both under cp 2.
    if (from_cp && world.rank() == 0) {
      Trainer t(parse_config_string(config, "llama.toml", kBase), dir, MPI_COMM_SELF);
      EXPECT_EQ(t.start_step(), 3) << what;
      std::vector<double> losses;
      for (int64_t s = t.start_step(); s < 5; ++s) losses.push_back(t.step(s).loss);
      testing::expect_losses_near(losses, last_two, 1e-5, what);
      expect_state_near(t, *one.trainer, 1e-5, what);
    } else if (!from_cp) {
      MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
      Trainer t(parse_config_string(config, "llama.toml", kBase + cp(2)), dir, comm.comm());
      EXPECT_EQ(t.start_step(), 3) << what;
      std::vector<double> losses;
      for (int64_t s = t.start_step(); s < 5; ++s) losses.push_back(t.step(s).loss);
      testing::expect_losses_near(losses, last_two, 1e-5, what);
      expect_state_near(t, *one.trainer, 1e-5, what);
    }
    MPI_Barrier(world.comm());
    if (world.rank() == 0) std::filesystem::remove_all(dir);
  }
}

// `tessera train` end to end under mpiexec: cp 2 (ring) gives the 1-rank run's losses and final
// validation loss, and metrics.jsonl's cp_bytes_per_step is the ring's traffic: per layer and
// micro-batch each rank sends its K and V once forward, once again backward, and the accumulated
// dK/dV twice, kv = 2 B (T / cp) KV D x 4 bytes each time. A sequence that does not cut into
// 2 x cp chunks is refused by every rank, naming the keys.
TEST(ContextParallelTrainingSlow, MetricsValidationAndRefusal) {
  const std::filesystem::path dir = testing::temp_dir("cp_cli");
  std::ofstream(dir / "llama.toml") << testing::layout_config("llama");  // C 32, 4 heads, 2 KV heads, D 8
  const std::vector<std::string> base = {"--set", "train.steps=3", "--set", "train.global_batch=8", "--set",
                                         "train.micro_batch=2", "--set", "log.every=1", "--set", "train.eval_every=3"};
  auto r = testing::train_run(dir, "llama.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = testing::losses(dir / "one" / "metrics.jsonl");
  r = testing::train_run(dir, "llama.toml", "cp", 2, testing::with(base, {"--set", "parallel.cp=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("x cp 2 (ring)"), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "cp" / "metrics.jsonl"), want, 1e-5, "cp 2 via tessera train");
  const auto val = [](const std::filesystem::path& m) {
    const std::string text = testing::read_file(m), key = "\"val_loss\": ";
    const auto at = text.rfind(key);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
  };
  ASSERT_GT(val(dir / "one" / "metrics.jsonl"), 0);
  EXPECT_NEAR(val(dir / "cp" / "metrics.jsonl"), val(dir / "one" / "metrics.jsonl"), 1e-5);
  const int64_t kv = 2 * 2 * (24 / 2) * 2 * 8 * 4, layers = 2, micro_batches = 4;
  EXPECT_EQ(testing::last_metric(dir / "cp" / "metrics.jsonl", "cp_bytes_per_step"), 4 * kv * layers * micro_batches);
  r = testing::train_run(dir, "llama.toml", "bad", 2,
                         testing::with(base, {"--set", "parallel.cp=2", "--set", "train.seq_len=22"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train.seq_len = 22 is not divisible by 2 x parallel.cp = 2 x 2 = 4"), std::string::npos)
      << r.output;
  std::filesystem::remove_all(dir);
}

// The point of cp: under a per-rank cap (train.max_memory_gib) between the estimate of one rank and
// that of a cp rank, a sequence length one rank cannot hold is refused there and trains under cp
// (the world's size: 2 or 4), each rank holding T / cp of every sequence's activations.
TEST(ContextParallelLayouts, ALengthOneRankCannotHoldTrainsUnderCp) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const std::vector<std::string> lengthy = {"train.steps=2",       "train.global_batch=8", "train.micro_batch=8",
                                            "train.seq_len=512",   "model.max_seq_len=512"};
  const std::string config = testing::layout_config("llama");
  const Config one = parse_config_string(config, "llama.toml", lengthy);
  const Config split = parse_config_string(config, "llama.toml", lengthy + cp(world.size()));
  const double one_rank = static_cast<double>(estimate_training_memory(one, 13, MemoryLayout{1, 1, false}).total());
  const double cp_rank = static_cast<double>(estimate_training_memory(split, 13, MemoryLayout{1, 1, false}).total());
  ASSERT_LT(cp_rank, one_rank);
  const double cap_gib = (one_rank + cp_rank) / 2 / (1024.0 * 1024.0 * 1024.0);
  const std::vector<std::string> capped = {"train.max_memory_gib=" + std::to_string(cap_gib)};
  if (world.rank() == 0) {
    EXPECT_TRUE(testing::throws_with(
        [&] { Trainer t(parse_config_string(config, "llama.toml", lengthy + capped), "", MPI_COMM_SELF); },
        {"train.max_memory_gib = ", "parallel.cp"}));
  }
  MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
  Trained got = train(parse_config_string(config, "llama.toml", lengthy + cp(world.size()) + capped), comm.comm());
  ASSERT_EQ(got.losses.size(), 2u);
  for (double l : got.losses) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
}

}  // namespace tessera
