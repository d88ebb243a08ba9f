// Checkpoint save and load throughput for a model's full training state (parameters + AdamW
// moments), through the trainer's own CheckpointWriter and restore path.
//   build/bench/checkpoint_bench [--preset gpt2|llama] [--layers 12] [--embd 768] [--dir /tmp/tessera_ckpt_bench]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "app/checkpoint/checkpointing.h"
#include "kernels/allocator.h"
#include "model/gpt.h"
#include "parallel/mpi.h"

using namespace tessera;
using Clock = std::chrono::steady_clock;

static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  ModelConfig cfg;  // GPT-2 124M by default
  std::string dir = "/tmp/tessera_ckpt_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--preset") cfg.preset = argv[i + 1];
    else if (a == "--layers") cfg.n_layer = std::atoll(argv[i + 1]);
    else if (a == "--embd") cfg.n_embd = std::atoll(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
  }
  std::filesystem::remove_all(dir);
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt(cfg, ps);
  ps.finalize();
  ps.initialize(Exec::cpu(), 1);
  std::vector<ParamSegment> segs;
  for (const auto& e : ps.entries()) segs.push_back({e.offset, e.local_shape.numel(), true});
  AdamW opt(ps.flat_params(), ps.flat_grads(), segs, alloc, {});
  const double bytes = 3.0 * 4.0 * static_cast<double>(ps.numel());  // params + two moments
  std::printf("%s: %ld parameters, state %.1f MiB (params + exp_avg + exp_avg_sq, f32)\n", cfg.preset.c_str(),
              static_cast<long>(ps.numel()), bytes / (1 << 20));
  for (int round = 0; round < 3; ++round) {
    CheckpointWriter writer(dir, 2, MPI_COMM_WORLD);
    TrainingState st;
    st.params = &ps;
    st.optimizer = optimizer_state(opt);
    st.step = 100 + round;
    st.consumed_samples = 1000;
    st.tokens_seen = 1000;
    st.config_toml = "[model]\n";
    auto t0 = Clock::now();
    writer.save(st);
    const double copy_s = since(t0);  // what the training step waits for
    writer.wait();
    const double total_s = since(t0);
    t0 = Clock::now();
    restore_training_state(writer.last_path(), ps, opt, MPI_COMM_WORLD);
    const double load_s = since(t0);
    std::printf("round %d: step blocked %.3f s (host copy); file written in %.2f s = %.0f MB/s; loaded in %.2f s = %.0f MB/s\n",
                round, copy_s, total_s, bytes / total_s / 1e6, load_s, bytes / load_s / 1e6);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
