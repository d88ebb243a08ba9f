// The measured pipeline cut: each part (a block, the embedding, the vision tower, the head) built as a
// stage on a store of its own and its forward + backward timed on world rank 0; the cut
// (model/stage_cut_measured.h) found there under each stage's memory estimate and broadcast.
#include "app/pp_cut.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>
#include <utility>

#include "kernels/allocator.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "model/stage_cut.h"
#include "parallel/mpi.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_sim.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// One stage of the model on a store of its own (tp = 1, or this rank's shard of tp's group; cp: the
// context-parallel group its attention runs over), initialized as the trainer initializes its model
// (the run's seed and dtype; the whole model's recomputation policy for its layers).
struct TimedStage {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  TimedStage(const Config& cfg, const ModelConfig& mc, const Exec& ex, const StageSpec& stage,
             const TensorParallel& tp = {}, const ContextParallel& cp = {})
      : alloc(ex.device, ex.stream),
        ps(alloc, DType::F32, ShardLayout{static_cast<int>(tp.size()), static_cast<int>(tp.rank())}),
        gpt(mc, ps, recompute_policy(cfg), tp, stage, cp) {
    ps.finalize();
    if (cfg.train.dtype == "bf16") ps.enable_compute_copy(DType::BF16);
    ps.initialize(ex, static_cast<uint64_t>(cfg.train.seed));
    ps.refresh_compute_copy(ex);
  }
};

// A host pattern of n values in [-0.5, 0.5] (activations, output gradients, patches): any finite
// values time the same; these keep the norms and the softmax away from degenerate inputs.
std::vector<float> pattern(int64_t n, double phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(0.5 * std::sin(0.37 * static_cast<double>(i) + phase));
  return v;
}

// One micro-batch's inputs on the device, shared by every stage timed: token ids and targets (B, T),
// a stage's input activations and output gradient (B, T, C) and its input gradient's room, and for a
// vision-language model one image per sequence, its placeholders at positions [0, P). Under cp the
// rank's positions of each sequence (cp.layout): T = their count.
class MicroBatch {
 public:
  MicroBatch(const Config& cfg, const ModelConfig& mc, const Exec& ex, const ContextParallel& cp = {})
      : alloc_(ex.device, ex.stream) {
    B_ = cfg.train.micro_batch;
    TESSERA_CHECK(B_ >= 1 && cfg.train.seq_len >= 1, "parallel.pp_cut = \"measured\": train.micro_batch = ", B_,
                  " and train.seq_len = ", cfg.train.seq_len, " must be resolved and positive before the timing pass");
    seq_ = cp.layout(cfg.train.seq_len);
    T_ = seq_.length();
    const int64_t C = mc.n_embd;
    std::vector<int32_t> ids(static_cast<size_t>(B_ * T_));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(mc.vocab_size));
    tokens_ = upload(ex, alloc_, Tensor(ids.data(), DType::I32, {B_, T_}), MemCategory::Activations);
    std::rotate(ids.begin(), ids.begin() + 1, ids.end());
    targets_ = upload(ex, alloc_, Tensor(ids.data(), DType::I32, {B_, T_}), MemCategory::Activations);
    std::vector<float> x = pattern(B_ * T_ * C, 0.0), dy = pattern(B_ * T_ * C, 1.0);
    for (float& g : dy) g *= 1e-3f;
    x_ = upload(ex, alloc_, Tensor(x.data(), DType::F32, {B_, T_, C}), MemCategory::Activations);
    dy_ = upload(ex, alloc_, Tensor(dy.data(), DType::F32, {B_, T_, C}), MemCategory::Activations);
    dx_ = Buffer(alloc_, DType::F32, {B_, T_, C}, MemCategory::Activations);
    if (mc.is_vlm()) {
      const int64_t P = mc.vision.num_patches(), K = mc.vision.patch_dim();
      TESSERA_CHECK(P <= cfg.train.seq_len, "parallel.pp_cut = \"measured\": an image's ", P,
                    " placeholder tokens do not fit train.seq_len = ", cfg.train.seq_len);
      std::vector<float> p = pattern(B_ * P * K, 2.0);
      patches_ = upload(ex, alloc_, Tensor(p.data(), DType::F32, {B_, P, K}), MemCategory::Activations);
      images_.patches = patches_;
      for (int64_t b = 0; b < B_; ++b) {
        images_.sample.push_back(b);
        images_.start.push_back(0);
      }
    }
  }

  // Seconds of one forward + backward of s (with the images when `images`).
  double run(const Exec& ex, TimedStage& s, bool images) const {
    const StageSpec& sp = s.gpt.stage();
    synchronize(ex);
    const Clock::time_point t0 = Clock::now();
    {
      GptCtx ctx;
      const Tensor& input = sp.embedding ? tokens_.tensor() : x_.tensor();
      s.gpt.forward(ex, ctx, s.alloc, input, sp.head ? targets_.tensor() : Tensor(), seq_, images ? &images_ : nullptr);
      const Gpt::OutputGrad from = sp.head ? Gpt::OutputGrad::loss(1.0 / static_cast<double>(B_ * T_))
                                           : Gpt::OutputGrad::output(dy_);
      s.gpt.backward(ex, ctx, s.alloc, from, sp.embedding ? Tensor() : dx_.tensor());
    }
    synchronize(ex);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  Allocator alloc_;
  SequenceLayout seq_;  // the positions of each sequence this rank runs (all of them without cp)
  int64_t B_ = 0, T_ = 0;
  Buffer tokens_, targets_, x_, dy_, dx_, patches_;
  ImageInput images_;
};

// The median of `repeats` timed runs after one warm-up (first-touch pages, cached workspaces).
double median_time(const Config& cfg, const ModelConfig& mc, const Exec& ex, const MicroBatch& mb,
                   const StageSpec& stage, bool images, int repeats, const TensorParallel& tp = {},
                   const ContextParallel& cp = {}) {
  TimedStage s(cfg, mc, ex, stage, tp, cp);
  const Exec local{ex.device, ex.stream, ex.device.is_cpu() ? &s.alloc : nullptr};
  mb.run(local, s, images);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(mb.run(local, s, images));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The first block of each stage: running sums of the block counts.
std::vector<int64_t> starts_of(const std::vector<int64_t>& blocks) {
  std::vector<int64_t> s(1, 0);
  for (int64_t n : blocks) s.push_back(s.back() + n);
  return s;
}

// A full cut with stage r holding n blocks (the others their least: one block per chunk, none for a
// VLM's stage 0 (encoder_stage); the rest on the first other stage): what estimate_training_memory
// reads for stage r, whose estimate depends only on its position and its chunks' counts. Empty when
// the others cannot hold their least.
std::vector<int64_t> cut_around(int64_t pp, int64_t vpp, int64_t L, int64_t r, int64_t n, bool encoder_stage) {
  std::vector<int64_t> blocks(static_cast<size_t>(pp), vpp);
  if (encoder_stage) blocks[0] = 0;
  blocks[static_cast<size_t>(r)] = n;
  int64_t placed = 0;
  for (int64_t b : blocks) placed += b;
  if (placed > L) return {};
  if (pp > 1) blocks[r == 0 ? 1 : 0] += L - placed;
  return blocks;
}

// Memory available to each rank of comm's nodes, agreed over comm (the smallest node's share), so
// that rank 0's cut fits on every node.
struct MemoryRoom {
  AvailableMemory available;
  int64_t ranks_on_node = 1;
};
MemoryRoom memory_room(MPI_Comm comm) {
  MemoryRoom m;
  m.available = available_host_memory();
  if (comm == MPI_COMM_NULL) return m;
  m.ranks_on_node = ranks_on_this_node(comm);
  long long bytes = m.available.bytes < 0 ? LLONG_MAX : static_cast<long long>(m.available.bytes / m.ranks_on_node);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_LONG_LONG, MPI_MIN, comm), "MPI_Allreduce (pp_cut memory)");
  if (bytes == LLONG_MAX) {
    m.available.bytes = -1;
  } else {
    m.available.bytes = static_cast<int64_t>(bytes);  // per rank now
    m.ranks_on_node = 1;
    m.available.source += " (the smallest share per rank over the run's nodes)";
  }
  return m;
}

// Whether the estimate of c's stage l.pp_rank is within cfg's cap and (train.memory_check) the room.
bool estimate_fits(const Config& c, int64_t data_vocab_size, const MemoryLayout& l, const MemoryRoom& room) {
  try {
    const MemoryEstimate e = estimate_training_memory(c, data_vocab_size, l);
    return memory_cap_problem(e, c.train.max_memory_gib).empty() &&
           (!c.train.memory_check || memory_problem(e, room.ranks_on_node, room.available).empty());
  } catch (const SizeOverflow&) {
    return false;
  }
}

// The FLOPs rule's cut (parallel.pp_layers empty): its first stage whose estimate does not fit as
// stage_fits asks, -1 when every stage fits.
int64_t flops_unfit_stage(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout, const MemoryRoom& room) {
  Config c = cfg;
  c.parallel.pp_layers.clear();
  for (int64_t r = 0; r < cfg.parallel.pp; ++r) {
    MemoryLayout l = layout;
    l.pp_rank = r;
    if (!estimate_fits(c, data_vocab_size, l, room)) return r;
  }
  return -1;
}

// fits(r, n) for cut_by_time: stage r's estimate with n blocks within the room and the cap, memoized.
StageFits stage_fits(const Config& cfg, int64_t L, bool encoder_stage, int64_t data_vocab_size, const MemoryLayout& layout, const MemoryRoom& room) {
  auto memo = std::make_shared<std::map<std::pair<int64_t, int64_t>, bool>>();
  return [=](int64_t r, int64_t n) {
    const auto key = std::make_pair(r, n);
    if (auto it = memo->find(key); it != memo->end()) return it->second;
    bool ok = false;
    const std::vector<int64_t> blocks = cut_around(cfg.parallel.pp, cfg.parallel.vpp, L, r, n, encoder_stage);
    if (!blocks.empty()) {
      Config c = cfg;
      c.parallel.pp_layers = blocks;
      MemoryLayout l = layout;
      l.pp_rank = r;
      ok = estimate_fits(c, data_vocab_size, l, room);
    }
    (*memo)[key] = ok;
    return ok;
  };
}

std::string ms_list(const std::vector<double>& seconds) {
  std::ostringstream os;
  os << std::setprecision(4) << "[";
  for (size_t i = 0; i < seconds.size(); ++i) os << (i ? ", " : "") << 1e3 * seconds[i];
  os << "]";
  return os.str();
}

std::string count_list(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// Everything rank 0 found, packed for one broadcast: pp block counts, the FLOPs cut's unfit stage,
// then embedding, vision, head and the L block times (doubles hold counts up to 2^53 exactly).
std::vector<double> pack(const MeasuredCut& c) {
  std::vector<double> v(c.blocks.begin(), c.blocks.end());
  v.push_back(static_cast<double>(c.flops_unfit_stage));
  v.push_back(c.times.embedding);
  v.push_back(c.times.vision);
  v.push_back(c.times.head);
  v.insert(v.end(), c.times.blocks.begin(), c.times.blocks.end());
  return v;
}
void unpack(const std::vector<double>& v, int64_t pp, MeasuredCut& c) {
  c.blocks.assign(v.begin(), v.begin() + pp);
  c.flops_unfit_stage = static_cast<int64_t>(v[static_cast<size_t>(pp)]);
  c.times.embedding = v[static_cast<size_t>(pp) + 1];
  c.times.vision = v[static_cast<size_t>(pp) + 2];
  c.times.head = v[static_cast<size_t>(pp) + 3];
  c.times.blocks.assign(v.begin() + pp + 4, v.end());
}

// The makespan of one step of m micro-batches under cfg's schedule for a cut given as chunks (model
// order), each chunk's forward, input gradient and weight gradient a third of its parts' time (the
// backward's two matmuls per forward one).
double simulated_step(const PartTimes& t, const std::vector<int64_t>& chunk_blocks, const Config& cfg, int64_t m) {
  const int64_t K = static_cast<int64_t>(chunk_blocks.size());
  SimOptions options;
  for (double c : rank_times(t, chunk_blocks, K)) options.chunks.push_back(ChunkCost{c / 3, c / 3, c / 3});
  const Schedule s = pipeline_schedule(cfg.parallel.pp, cfg.parallel.vpp, m, parse_pipeline_kind(cfg.parallel.pp_schedule));
  return simulate(s, options).makespan;
}

// From c's part times and cut: both cuts' predicted stage times, their simulated steps, and which
// runs (choose_cut, with c.flops_unfit_stage). The same numbers give the same result on every rank.
void price(MeasuredCut& c, const Config& cfg, const ModelConfig& m, const MemoryLayout& layout) {
  const int64_t pp = cfg.parallel.pp, vpp = cfg.parallel.vpp;
  c.predicted = stage_times(c.times, c.blocks, vpp);
  c.flops_blocks.clear();
  for (const StageSpec& s : cut_stages(m, cfg.train.seq_len, pp, vpp)) c.flops_blocks.push_back(s.layers());
  c.flops_predicted = rank_times(c.times, c.flops_blocks, pp);
  c.simulated_step = c.flops_simulated_step = 0;
  c.micro_batches = 0;
  if (cfg.train.micro_batch > 0) {  // a step the schedule refuses (checked later) prints none
    try {
      const int64_t steps = grad_accum_steps(cfg, layout.dp);
      c.simulated_step = simulated_step(c.times, stage_chunks(c.blocks, vpp), cfg, steps);
      c.flops_simulated_step = simulated_step(c.times, c.flops_blocks, cfg, steps);
      c.micro_batches = steps;
    } catch (const Error&) {
      c.simulated_step = c.flops_simulated_step = 0;
    }
  }
  const CutChoice choice = choose_cut(c.predicted, c.simulated_step, c.flops_predicted, c.flops_simulated_step,
                                      c.flops_unfit_stage);
  c.flops_kept = choice.flops;
  c.choice = choice.why;
}

}  // namespace

PartTimes measure_part_times(const Config& cfg, const ModelConfig& mc, const Exec& ex, int repeats) {
  TESSERA_CHECK(repeats >= 1, "measure_part_times: repeats = ", repeats, " must be at least 1");
  const ModelConfig m = resolve(mc);
  const int64_t L = m.n_layer;
  const MicroBatch mb(cfg, m, ex);
  PartTimes t;
  t.blocks.assign(static_cast<size_t>(L), 0.0);
  // A stage ending at the last layer holds the head, and a text model's stage starting at layer 0
  // the embedding: the blocks between are timed alone.
  const int64_t first_alone = m.is_vlm() ? 0 : 1;
  double alone = 0;
  for (int64_t l = first_alone; l < L - 1; ++l) {
    t.blocks[static_cast<size_t>(l)] = median_time(cfg, m, ex, mb, StageSpec{l, l + 1, false, false}, false, repeats);
    alone += t.blocks[static_cast<size_t>(l)];
  }
  const int64_t n_alone = std::max<int64_t>(0, L - 1 - first_alone);
  // A block alone runs with its weights and saved activations in cache; inside a stage they are
  // evicted by the next blocks' before its backward reads them (measured: 7 narrow blocks as one
  // stage took 4x their times alone). The blocks timed alone, run again as one stage, give the
  // in-place level: every block's time is scaled by it (their ratios from the blocks alone).
  const double hot_mean = n_alone > 0 ? alone / static_cast<double>(n_alone) : 0.0;
  double in_place_mean = hot_mean;
  if (n_alone >= 2) {
    const double chain = median_time(cfg, m, ex, mb, StageSpec{first_alone, L - 1, false, false}, false, repeats);
    const double scale = alone > 0 ? chain / alone : 1.0;
    for (int64_t l = first_alone; l < L - 1; ++l) t.blocks[static_cast<size_t>(l)] *= scale;
    in_place_mean = hot_mean * scale;
  }
  // An end block with its end part (the embedding, the head), timed together as one stage: the part
  // is their time less a block's alone (both hot), the block a block's in place (none timed alone,
  // as in a 2-block text model: the whole time stays on the block).
  const auto split = [&](double both, double& part, double& block) {
    part = n_alone > 0 ? std::max(0.0, both - hot_mean) : 0.0;
    block = n_alone > 0 ? in_place_mean : both;
  };
  if (m.is_vlm()) {  // the encoder's own stage {0, 0}: the embedding alone, then with the tower
    const StageSpec encoder{0, 0, true, false};
    t.embedding = median_time(cfg, m, ex, mb, encoder, false, repeats);
    t.vision = std::max(0.0, median_time(cfg, m, ex, mb, encoder, true, repeats) - t.embedding);
  } else if (L > 1) {
    split(median_time(cfg, m, ex, mb, StageSpec{0, 1, true, false}, false, repeats), t.embedding, t.blocks.front());
  }
  if (L > 1 || m.is_vlm()) {
    split(median_time(cfg, m, ex, mb, StageSpec{L - 1, L, false, true}, false, repeats), t.head, t.blocks.back());
  } else {  // one block with both ends: the whole model (nothing to cut)
    split(median_time(cfg, m, ex, mb, StageSpec{0, 1, true, true}, false, repeats), t.head, t.blocks.back());
  }
  return t;
}

double measure_stage_time(const Config& cfg, const ModelConfig& mc, const Exec& ex, const std::vector<int64_t>& chunk_blocks,
                          int64_t index, int repeats, const TensorParallel& tp, const ContextParallel& cp) {
  const ModelConfig m = resolve(mc);
  const std::vector<int64_t> starts = starts_of(chunk_blocks);
  const int64_t last = static_cast<int64_t>(chunk_blocks.size()) - 1;
  TESSERA_CHECK(index >= 0 && index <= last && starts.back() == m.n_layer, "measure_stage_time: chunk ", index, " of ",
                count_list(chunk_blocks), " for model.n_layer = ", m.n_layer);
  const StageSpec stage{starts[static_cast<size_t>(index)], starts[static_cast<size_t>(index) + 1], index == 0, index == last};
  const MicroBatch mb(cfg, m, ex, cp);
  return median_time(cfg, m, ex, mb, stage, index == 0 && m.is_vlm(), repeats, tp, cp);
}

std::string MeasuredCut::describe() const {
  std::ostringstream os;
  os << "pipeline cut (parallel.pp_cut = \"measured\"): blocks per stage " << count_list(blocks);
  if (vpp > 1)
    os << " in parallel.vpp = " << vpp << " equal chunks each: chunks " << count_list(stage_chunks(blocks, vpp))
       << " (the FLOPs rule's chunks: " << count_list(flops_blocks) << ")";
  else
    os << " (the FLOPs rule's: " << count_list(flops_blocks) << ")";
  double lo = 0, hi = 0, sum = 0;
  if (!times.blocks.empty()) {
    lo = *std::min_element(times.blocks.begin(), times.blocks.end());
    hi = *std::max_element(times.blocks.begin(), times.blocks.end());
    for (double b : times.blocks) sum += b;
  }
  os << std::setprecision(4) << "\n  parts (ms per micro-batch forward + backward, rank 0): embedding " << 1e3 * times.embedding;
  if (times.vision > 0) os << ", vision tower " << 1e3 * times.vision;
  os << ", blocks " << 1e3 * lo << " to " << 1e3 * hi << " (mean " << 1e3 * sum / static_cast<double>(std::max<size_t>(1, times.blocks.size()))
     << "), head " << 1e3 * times.head;
  if (!choice.empty()) os << "\n  runs " << choice;
  os << "\n  stage times (ms): predicted " << ms_list(predicted);
  if (!measured.empty() && !flops_kept) os << ", measured " << ms_list(measured);
  os << "; the FLOPs cut's predicted " << ms_list(flops_predicted);
  if (!measured.empty() && flops_kept) os << ", measured " << ms_list(measured);
  if (micro_batches > 0)
    os << "\n  step of " << micro_batches << " micro-batches, simulated from the parts (ms): " << 1e3 * simulated_step
       << "; the FLOPs cut's " << 1e3 * flops_simulated_step;
  return os.str();
}

MeasuredCut measured_cut(const Config& cfg, const ModelConfig& mc, int64_t data_vocab_size, const MemoryLayout& layout,
                         const Exec& ex, MPI_Comm comm, const PartTimer& timer, bool measure_stages) {
  const ModelConfig m = resolve(mc);
  const int64_t pp = cfg.parallel.pp, vpp = cfg.parallel.vpp, L = m.n_layer;
  // A VLM's encoder may have a stage of its own with one chunk per stage (model/stage_cut.h).
  const bool encoder_stage = m.is_vlm() && pp > 1 && vpp == 1;
  const MemoryRoom room = memory_room(comm);  // collective
  const bool lead = comm == MPI_COMM_NULL || comm_rank(comm) == 0;
  MeasuredCut out;
  out.vpp = vpp;
  std::string error;
  if (lead) {
    try {
      out.times = timer ? timer(cfg, m, ex) : measure_part_times(cfg, m, ex);
      TESSERA_CHECK(static_cast<int64_t>(out.times.blocks.size()) == L, "parallel.pp_cut = \"measured\": ",
                    out.times.blocks.size(), " block times for model.n_layer = ", L);
      out.blocks = cut_by_time(out.times, pp, encoder_stage,
                               stage_fits(cfg, L, encoder_stage, data_vocab_size, layout, room), vpp);
      out.flops_unfit_stage = flops_unfit_stage(cfg, data_vocab_size, layout, room);
      price(out, cfg, m, layout);
      if (measure_stages) {  // the running cut's chunks, each built whole; a stage's time is its chunks' sum
        const std::vector<int64_t> chunks = out.flops_kept ? out.flops_blocks : stage_chunks(out.blocks, vpp);
        out.measured.assign(static_cast<size_t>(pp), 0.0);
        for (int64_t c = 0; c < pp * vpp; ++c)
          out.measured[static_cast<size_t>(c % pp)] += measure_stage_time(cfg, m, ex, chunks, c);
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (comm != MPI_COMM_NULL) throw_if_any_failed(comm, error);
  if (!error.empty()) throw Error(error);
  if (comm != MPI_COMM_NULL) {
    std::vector<double> v = pack(out);
    v.resize(static_cast<size_t>(pp + 4 + L));
    check_mpi(MPI_Bcast(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, 0, comm), "MPI_Bcast (pp_cut)");
    unpack(v, pp, out);
    if (!lead) price(out, cfg, m, layout);  // rank 0's numbers: rank 0's choice
  }
  return out;
}

std::string apply_measured_cut(Config& cfg, const ModelConfig& mc, int64_t data_vocab_size, const MemoryLayout& layout,
                               const Exec& ex, MPI_Comm comm, const PartTimer& timer) {
  if (cfg.parallel.pp_cut != "measured" || cfg.parallel.pp <= 1) return "";
  const MeasuredCut cut = measured_cut(cfg, mc, data_vocab_size, layout, ex, comm, timer);
  if (cut.flops_kept) cfg.parallel.pp_layers.clear();  // the FLOPs rule
  else cfg.parallel.pp_layers = cut.blocks;
  cfg.parallel.pp_cut = "flops";
  return cut.describe();
}

}  // namespace tessera
