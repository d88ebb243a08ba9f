// Tests checkpoints of a model split over pipeline stages (app/checkpoint/checkpointing.h), two MPI
// ranks holding a stage each (`mpiexec -n 2 tests_app --gtest_filter=CheckpointStages.*`; the suite
// runs only there, tests/CMakeLists.txt): the stages' CheckpointWriter writes one file that equals
// the whole model's (the tied "wte.weight" stored once, from the first stage, never the last
// stage's copy); a checkpoint of the whole model written by one rank loads into the stages, the
// copy filled from the stored tensor by name; and a tensor no stage holds is still refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "app/checkpoint/checkpointing.h"
#include "error_testing.h"
#include "model/gpt.h"
#include "mpi_testing.h"
#include "testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::kCpu;
using testing::test_world;

constexpr int64_t kLayers = 4;

ModelConfig tiny(const std::string& preset, int64_t n_layer = kLayers) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 13;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_kv_head = preset == "llama" ? 1 : 0;
  c.n_embd = 8;
  c.ffn_hidden = 12;
  c.max_seq_len = 8;
  return resolve(c);
}

// One rank's part of the model (the whole model or a stage) with its AdamW moments.
struct Part {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  Buffer exp_avg, exp_avg_sq;
  Part(const ModelConfig& cfg, StageSpec stage, uint64_t seed) : ps(alloc, DType::F32), gpt(cfg, ps, {}, {}, stage) {
    ps.finalize();
    ps.initialize(kCpu, seed);
    exp_avg = Buffer(alloc, DType::F32, {ps.numel()}, MemCategory::OptimizerState);
    exp_avg_sq = Buffer(alloc, DType::F32, {ps.numel()}, MemCategory::OptimizerState);
  }
  OptimizerState moments() const { return {exp_avg.tensor(), exp_avg_sq.tensor(), 5}; }
  // Moments that depend on the parameter's name and the element's global index only, as a
  // training run's do on any layout.
  void fill_moments() {
    for (const ParamEntry& e : ps.entries()) {
      const double key = static_cast<double>(std::hash<std::string>{}(e.spec.name) % 1000);
      for (int64_t i = 0; i < e.local_shape.numel(); ++i) {
        const double g = static_cast<double>(global_index(e, i));
        exp_avg.tensor().ptr<float>()[e.offset + i] = static_cast<float>(std::sin(key + g));
        exp_avg_sq.tensor().ptr<float>()[e.offset + i] = static_cast<float>(1.0 + std::cos(key - g));
      }
    }
  }
  TrainingState state() const {
    TrainingState st;
    st.params = &ps;
    st.optimizer = moments();
    st.step = 5;
    st.config_toml = "";
    return st;
  }
};

std::vector<float> host(const Tensor& t) { return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel()); }

// Every parameter of `part` and its moments equal the reference's of the same name.
void expect_equal_by_name(const Part& part, const Part& ref, const std::string& what) {
  for (int id = 0; id < part.ps.size(); ++id) {
    const ParamEntry& e = part.ps.entry(id);
    const int r = ref.ps.find(e.spec.name);
    ASSERT_GE(r, 0) << e.spec.name;
    const ParamEntry& f = ref.ps.entry(r);
    const int64_t n = e.local_shape.numel();
    EXPECT_EQ(host(part.ps.param(id)), host(ref.ps.param(r))) << what << ": " << e.spec.name;
    EXPECT_EQ(host(part.exp_avg.tensor().slice_rows(e.offset, e.offset + n)),
              host(ref.exp_avg.tensor().slice_rows(f.offset, f.offset + n)))
        << what << ": exp_avg of " << e.spec.name;
    EXPECT_EQ(host(part.exp_avg_sq.tensor().slice_rows(e.offset, e.offset + n)),
              host(ref.exp_avg_sq.tensor().slice_rows(f.offset, f.offset + n)))
        << what << ": exp_avg_sq of " << e.spec.name;
  }
}

// One directory for all ranks: rank 0 names it and tells the others.
fs::path shared_temp_dir(MPI_Comm comm, const std::string& name) {
  std::string dir;
  if (comm_rank(comm) == 0) {
    fs::path p = fs::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    dir = p.string();
  }
  return broadcast_bytes(comm, dir, 0);
}

class CheckpointStages : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    world_ = test_world();
    if (comm_size(world_) != 2) GTEST_SKIP() << "runs on 2 ranks, one stage each (mpiexec -n 2)";
    stage_ = comm_rank(world_);
  }
  MPI_Comm world_ = MPI_COMM_NULL;
  int stage_ = 0;
};

// Each rank writes its stage; the file read into one whole model equals the model the stages
// were cut from.
TEST_P(CheckpointStages, StagesWriteTheWholeModel) {
  const ModelConfig cfg = tiny(GetParam());
  const fs::path dir = shared_temp_dir(world_, "ckpt_stages_" + GetParam());
  Part stage(cfg, StageSpec::split(kLayers, 2, stage_), 7);
  stage.fill_moments();
  const int copy = stage.ps.find("wte.weight");
  if (cfg.tied_embeddings && stage_ == 1) {
    // The last stage's copy of the tied table: not the tensor a checkpoint stores. Garbage here
    // shows that it is never written (were it, the file's wte.weight would hold it, or the write
    // would fail on two ranks writing one tensor).
    // EXPECT, not ASSERT: returning here would leave the other rank waiting in the collective save.
    EXPECT_GE(copy, 0);
    EXPECT_TRUE(copy >= 0 && stage.ps.entry(copy).spec.stage_copy);
  }
  if (copy >= 0 && stage_ == 1) {
    float* p = stage.ps.param(copy).ptr<float>();
    for (int64_t i = 0; i < stage.ps.param(copy).numel(); ++i) p[i] = 99.0f;
  }
  std::string path;
  {
    CheckpointWriter writer(dir.string(), 3, world_);
    writer.save(stage.state());
    writer.wait();
    path = writer.last_path();
  }
  Part want(cfg, {}, 7);
  want.fill_moments();
  Part whole(cfg, {}, 8);  // another seed: every value must come from the file
  const RestoredState st = restore_training_state(path, whole.ps, whole.moments(), MPI_COMM_SELF);
  EXPECT_EQ(st.step, 5);
  EXPECT_EQ(st.optimizer_steps, 5);
  expect_equal_by_name(whole, want, "whole model read from the stages' checkpoint");
  MPI_Barrier(world_);
  if (stage_ == 0) fs::remove_all(dir);
}

// A checkpoint of the whole model, written by one rank, loads into the stages: each reads its own
// tensors, and the last stage's copy of the tied table is filled from the stored wte.weight.
TEST_P(CheckpointStages, OneRankCheckpointLoadsIntoTheStages) {
  const ModelConfig cfg = tiny(GetParam());
  const fs::path dir = shared_temp_dir(world_, "ckpt_whole_" + GetParam());
  Part whole(cfg, {}, 7);
  whole.fill_moments();
  std::string path;
  if (stage_ == 0) {
    CheckpointWriter writer(dir.string(), 3, MPI_COMM_SELF);
    writer.save(whole.state());
    writer.wait();
    path = writer.last_path();
  }
  path = broadcast_bytes(world_, path, 0);
  Part stage(cfg, StageSpec::split(kLayers, 2, stage_), 8);
  const RestoredState st = restore_training_state(path, stage.ps, stage.moments(), world_);
  EXPECT_EQ(st.step, 5);
  expect_equal_by_name(stage, whole, "stage " + std::to_string(stage_) + " read from a one-rank checkpoint");
  if (cfg.tied_embeddings && stage_ == 1) {  // the copy, filled by name
    const int copy = stage.ps.find("wte.weight");
    EXPECT_GE(copy, 0);
    if (copy >= 0) {
      EXPECT_TRUE(stage.ps.entry(copy).spec.stage_copy);
      EXPECT_EQ(host(stage.ps.param(copy)), host(whole.ps.param(whole.ps.find("wte.weight"))));
    }
  }
  MPI_Barrier(world_);
  if (stage_ == 0) fs::remove_all(dir);
}

// The stages together expect the whole model: a tensor of no stage (a checkpoint of a deeper model)
// is refused on every rank with the same message; one of the other stage is not.
TEST_P(CheckpointStages, ATensorOfNoStageIsStillUnexpected) {
  const fs::path dir = shared_temp_dir(world_, "ckpt_deeper_" + GetParam());
  Part deeper(tiny(GetParam(), kLayers + 1), {}, 7);
  deeper.fill_moments();
  std::string path;
  if (stage_ == 0) {
    CheckpointWriter writer(dir.string(), 3, MPI_COMM_SELF);
    writer.save(deeper.state());
    writer.wait();
    path = writer.last_path();
  }
  path = broadcast_bytes(world_, path, 0);
  Part stage(tiny(GetParam()), StageSpec::split(kLayers, 2, stage_), 8);
  const std::string error =
      testing::error_of([&] { restore_training_state(path, stage.ps, stage.moments(), world_); });
  EXPECT_NE(error.find("unexpected /model/blocks.4.ln1.weight"), std::string::npos) << error;
  EXPECT_EQ(error.find("blocks.3"), std::string::npos) << error;  // held by stage 1, expected by both
  EXPECT_EQ(error.find("blocks.0"), std::string::npos) << error;  // held by stage 0
  EXPECT_EQ(broadcast_bytes(world_, error, 0), error);             // the same verdict everywhere
  MPI_Barrier(world_);
  if (stage_ == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, CheckpointStages, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace tessera
