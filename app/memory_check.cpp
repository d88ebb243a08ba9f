// The memory estimate of a training run and the check against /proc/meminfo and the cgroup limit.
// What the trainer allocates and when (app/trainer.cpp, parallel/dp_optimizer.cpp, checkpointing.cpp):
// parameters and gradients in flat buffers (the trainable part padded to a multiple of dp under
// ZeRO-1), AdamW's two moments of the trainable parameters (whole, or this rank's 1/dp under ZeRO-1,
// which also keeps a gradient shard; train.freeze's parameters have none, and its matrices and
// embeddings no gradient either), then per
// step one micro-batch's activations and temporaries at a time; evaluation runs a forward without
// targets; a checkpoint save gathers the ZeRO-1 moments (between steps) and keeps a host copy of
// parameters and moments while a background thread writes it (beside the next steps). Under
// pipeline parallelism a rank holds its stage's chunks, the micro-batches its schedule keeps in
// flight and the tensors it sent during the step (the schedule's actions walked, as the trainer
// runs them).
#include "app/memory_check.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "kernels/allocator.h"
#include "data/scenes.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "parallel/tp_compression.h"
#include "model/stage_cut.h"
#include "parallel/dynamic_cp.h"
#include "parallel/mpi.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {

namespace {

constexpr int64_t kFloatBytes = 4;   // the trainer's parameters and activations are f32
constexpr int64_t kBf16Bytes = 2;    // train.dtype = "bf16": the parameters' compute copy
constexpr int64_t kIdBytes = 4;      // token and target ids (int32)
constexpr int64_t kLoaderDepth = 4;  // DataLoader's default prefetch depth (data/loader.h), as the trainer uses it
// What the process holds besides: code, MPI, HDF5 and BLAS buffers, thread stacks. Measured: the peak
// RSS of a 20-step run of a 27k-parameter model (tests' tiny config) is 37 MiB; rounded up.
constexpr int64_t kRuntimeBytes = int64_t{64} << 20;

int64_t mul(int64_t a, int64_t b) { return checked_mul(a, b); }
int64_t add(int64_t a, int64_t b) { return checked_add(a, b); }

const char* kModelKeys = "model.n_layer, model.n_embd, model.vocab_size; parallel.tp";

std::string plural(int64_t n, const std::string& word) {
  const bool sibilant = word.size() >= 2 && word.compare(word.size() - 2, 2, "ch") == 0;  // micro-batch -> micro-batches
  return std::to_string(n) + " " + word + (n == 1 ? "" : sibilant ? "es" : "s");
}

}  // namespace

int64_t MemoryEstimate::total() const {
  int64_t t = 0;
  for (const auto& i : items) t = add(t, i.bytes);
  return t;
}

int64_t MemoryEstimate::allocator_bytes() const {
  int64_t t = 0;
  for (const auto& i : items)
    if (i.allocator) t = add(t, i.bytes);
  return t;
}

namespace {

// One chunk of a pipeline rank, in bytes (estimate_training_memory in memory_check.h).
struct ChunkBytes {
  StageSpec stage;
  int64_t x = 0;         // one (B, T_local, C) activation or gradient: a received input or output
                         // gradient, a sent output or input gradient
  int64_t kept = 0;      // from its forward to its backward: activations (the output included), ids, loss sums
  int64_t forward = 0;   // its forward at its highest (what it keeps included), beside everything else live
  int64_t backward = 0;  // its backward at its highest (what the forward kept included), beside the rest
  // Zero-bubble's split: its input-gradient backward (B) at its highest, and the copies B keeps for
  // the weight-gradient action (W) that follows it (model/weight_grads.h).
  int64_t split_backward = 0;
  int64_t deferred = 0;
  // model.recompute = "bubble": its R action at its highest (what the forward kept included), and
  // what R keeps until the backward beyond that; backward and split_backward then count it too.
  int64_t recompute = 0;
  int64_t recomputed = 0;
};

// m: the chunk's counts; split: the same under a split backward (ModelMemoryLayout::split_backward);
// patches: the bytes of a micro-batch's image patches (kind = "vlm"), uploaded for the chunk with
// the embedding and kept until its backward.
ChunkBytes chunk_bytes(const ModelMemory& m, const ModelMemory& split, const StageSpec& st, int64_t B, int64_t T,
                       int64_t Tl, int64_t C, int64_t patches) {
  const int64_t ids = mul(mul(mul(B, T), kIdBytes), (st.embedding ? 1 : 0) + (st.head ? 1 : 0));
  const int64_t beside = add(add(ids, st.head ? ModelMemory::kLossSumsBytes : 0), st.embedding ? patches : 0);
  ChunkBytes c{st, mul(mul(mul(B, Tl), C), kFloatBytes), add(mul(m.activations, kFloatBytes), beside),
               add(mul(m.forward_peak, kFloatBytes), beside), add(mul(m.backward_peak, kFloatBytes), beside)};
  c.split_backward = add(mul(split.backward_peak, kFloatBytes), beside);
  c.deferred = mul(split.weight_grads, kFloatBytes);
  c.recompute = add(mul(m.recompute_peak, kFloatBytes), beside);
  c.recomputed = mul(m.recomputed, kFloatBytes);
  return c;
}

// The highest point of a rank's step, and the micro-batches (chunks of them, interleaved) in flight
// at most.
struct InFlight {
  int64_t bytes = 0;
  int64_t most = 0;
};

// Walks the rank's actions (parallel/pipeline_schedule.h, as the trainer's run_pipeline runs them)
// and tracks what is live: a receive allocates its tensor; a forward keeps its chunk's activations
// (with the received input) until the micro-batch's backward; when the schedule splits that
// backward, B releases the context too but leaves the copies its W reads (ChunkBytes::deferred)
// until that W; a backward of a chunk with the head allocates the input gradient it sends. A tensor sent (a forward's output, a
// backward's input gradient) stays until the step's transfers end, when run_schedule returns; the
// first chunk's received output gradient is freed with its backward.
InFlight walk(const std::vector<ChunkBytes>& chunks, const std::vector<Action>& actions) {
  InFlight r;
  int64_t live = 0, n = 0;
  const auto chunk = [&](const Action& a) -> const ChunkBytes& { return chunks.at(static_cast<size_t>(a.chunk)); };
  std::set<std::pair<int64_t, int64_t>> split;  // backwards whose W comes later
  for (const Action& a : actions)
    if (a.kind == ActionKind::BackwardWeight) split.insert({a.micro_batch, a.chunk});
  std::set<std::pair<int64_t, int64_t>> recomputed;  // R run, its backward not yet
  const auto release = [&](const ChunkBytes& c) {  // the micro-batch's context and received input
    live -= c.kept + (c.stage.embedding ? 0 : c.x);
    if (!c.stage.head) live = add(live, c.x);  // the output, sent, outlives the context
    --n;
  };
  for (const Action& a : actions) {
    const ChunkBytes& c = chunk(a);
    switch (a.kind) {
      case ActionKind::RecvActivation:
      case ActionKind::RecvGrad: live = add(live, c.x); break;
      case ActionKind::Forward:
        r.bytes = std::max(r.bytes, add(live, c.forward));
        live = add(live, c.kept);
        r.most = std::max(r.most, ++n);
        break;
      case ActionKind::Recompute:  // the contexts it re-creates stay until the backward
        r.bytes = std::max(r.bytes, add(live - c.kept, c.recompute));
        live = add(live, c.recomputed);
        recomputed.insert({a.micro_batch, a.chunk});
        break;
      case ActionKind::Backward: {
        if (c.stage.head && !c.stage.embedding) live = add(live, c.x);  // the input gradient it writes
        // After an R, backward's own count holds what R re-created (and releases it).
        const int64_t ahead = recomputed.erase({a.micro_batch, a.chunk}) ? c.recomputed : 0;
        live -= ahead;
        if (split.count({a.micro_batch, a.chunk})) {  // B alone: its peak with the copies for W
          r.bytes = std::max(r.bytes, add(live - c.kept, c.split_backward));
          live = add(live, c.deferred);
        } else {
          r.bytes = std::max(r.bytes, add(live - c.kept, c.backward));
        }
        if (c.stage.embedding && !c.stage.head) live -= c.x;  // the received gradient, not sent on
        release(c);
        break;
      }
      case ActionKind::BackwardWeight: live -= c.deferred; break;
      case ActionKind::SendActivation:
      case ActionKind::SendGrad: break;
    }
  }
  return r;
}

// The rank's peak under the schedule. A long step is not walked whole: past a few groups of pp
// micro-batches the steady phase repeats, so the peak (and the count in flight) grows by the same
// amount for every pp micro-batches more (the sent tensors that accumulate, gpipe's forwards in
// flight); it is extrapolated from two short steps, m1 and m1 + pp micro-batches with m1 = m mod pp
// (tests/app/test_memory_check.cpp checks it against the whole walk).
// The schedules walked: the step's own, or for a long step the two short ones (generated once for
// every rank of the estimate: a schedule holds all ranks' lists).
struct StepWalks {
  int64_t periods = 0;  // 0: `a` is the whole step
  std::shared_ptr<const Schedule> a, b;  // owned, or MemoryLayout::schedules' (not owned)
};

// ahead: model.recompute_ahead as the generator takes it (at least 1; unbounded is m vpp or more).
StepWalks step_walks(const ParallelConfig& p, int64_t m, bool bubble, int64_t ahead, const MemoryLayout& layout) {
  const PipelineKind kind = parse_pipeline_kind(p.pp_schedule);
  const auto schedule = [&](int64_t micro_batches) -> std::shared_ptr<const Schedule> {
    if (layout.schedules)  // the caller's, alive beyond the estimate
      return {std::shared_ptr<const Schedule>(), &layout.schedules(p.pp, p.vpp, micro_batches, kind, bubble, ahead)};
    return std::make_shared<const Schedule>(pipeline_schedule(p.pp, p.vpp, micro_batches, kind, bubble, ahead));
  };
  if (m <= 8 * p.pp) return {0, schedule(m), nullptr};
  const int64_t m1 = 4 * p.pp + m % p.pp;
  return {(m - m1) / p.pp, schedule(m1), schedule(m1 + p.pp)};
}

// The micro-batches per step of a pipeline rank.
int64_t micro_batches_of(const Config& cfg, const MemoryLayout& layout) {
  return std::max<int64_t>(1, cfg.train.global_batch / std::max<int64_t>(1, mul(cfg.train.micro_batch, layout.dp)));
}

// model.recompute_ahead for the generator: 0 (as many as the cap allows, unresolved) is unbounded,
// m vpp (every backward's R).
int64_t generator_ahead(const Config& cfg, int64_t m) {
  const int64_t all = mul(m, cfg.parallel.vpp);
  return cfg.model.recompute_ahead <= 0 ? all : std::min(cfg.model.recompute_ahead, all);
}

InFlight pipeline_peak(const std::vector<ChunkBytes>& chunks, const StepWalks& walks, int64_t rank) {
  const InFlight a = walk(chunks, walks.a->actions_of(rank));
  if (walks.periods == 0) return a;
  const InFlight b = walk(chunks, walks.b->actions_of(rank));
  const int64_t periods = walks.periods;
  return {add(a.bytes, mul(periods, b.bytes - a.bytes)), add(a.most, mul(periods, b.most - a.most))};
}

std::string describe_chunks(const std::vector<StageSpec>& chunks) {
  std::string s = "blocks";
  for (const StageSpec& c : chunks)
    s += " [" + std::to_string(c.first_layer) + ", " + std::to_string(c.end_layer) + ")";
  if (chunks.size() == 1 && chunks.front().layers() == 0) s = "no block";  // a VLM's encoder stage
  if (chunks.front().embedding) s += ", the embedding";
  if (chunks.back().head) s += ", the head";
  return s;
}

// The part of the estimate that depends on what the rank holds: its parameters and the largest
// transient of a step (training micro-batches, or the evaluation forward).
struct RankModel {
  int64_t parameters = 0;
  int64_t frozen = 0;     // of them, train.freeze's (frozen_elements)
  int64_t no_grad = 0;    // of those, the matrices and embeddings: no gradient buffer (ParamEntry::has_grad)
  std::string what;       // "" for the whole model, else the pipeline stage and its chunks
  MemoryItem transient;   // the training step's activations and temporaries
  int64_t eval_bytes = 0; // the evaluation forward (addition task), 0 when none
  std::string eval_what;
  int64_t tp_feedback = 0; // parallel.tp_comm_compression = "int8-ef": its residuals (elements, fp32)
};

// The elements of the frozen parameters a rank holds: its chunks' parameters registered on a store
// that is never finalized (nothing is allocated), each frozen one's tp shard as ParameterStore lays
// it out (ceil(global / tp) along its split dimension), k and v whole when the kv heads do not
// divide over tp (Attention replicates them then; registered at tp = 1 they show as split). A vlm's
// vision tower and projector count too (on the chunk that holds them), as model_memory counts them.
// no_grad: the part of them without a gradient buffer (frozen matrices and embeddings).
int64_t frozen_elements(const ModelConfig& mc, const std::vector<StageSpec>& chunks, int64_t tp,
                        const std::set<std::string>& frozen, int64_t* no_grad) {
  *no_grad = 0;
  if (frozen.empty()) return 0;
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  std::vector<std::unique_ptr<Gpt>> models;
  for (const StageSpec& c : chunks)
    models.push_back(std::make_unique<Gpt>(mc, ps, std::vector<Recompute>{}, TensorParallel{}, c));
  const bool kv_whole = mc.kv_heads() % tp != 0;
  int64_t n = 0;
  for (const ParamEntry& e : ps.entries()) {
    if (!frozen.count(e.spec.name)) continue;
    const Shape& g = e.spec.global_shape;
    const std::string& name = e.spec.name;
    const bool kv = name.rfind("blocks.", 0) == 0 &&
                    (name.find(".attn.k.") != std::string::npos || name.find(".attn.v.") != std::string::npos);
    int64_t elements = g.numel();
    if (e.spec.shard.axis == GridAxis::Tp && !(kv && kv_whole)) {
      const int64_t extent = g[e.spec.shard.dim];
      elements = mul(elements / extent, (extent + tp - 1) / tp);
    }
    n = add(n, elements);
    if (e.spec.kind == ParamKind::Matrix || e.spec.kind == ParamKind::Embedding) *no_grad = add(*no_grad, elements);
  }
  return n;
}

// The addition task's evaluation: greedy answers of data.val_examples problems at once (at most:
// they go by prompt length), the longest forward being the prompt "a+b=" and all but the last
// answer character. Returns (B, T) of it.
std::pair<int64_t, int64_t> eval_batch(const Config& cfg, const ModelConfig& mc, int64_t tp, bool sp) {
  const int64_t digits = cfg.data.digits, B = cfg.data.val_examples;
  int64_t T = std::min(3 * digits + 3, mc.max_seq_len);
  if (sp) T = (T + tp - 1) / tp * tp;
  return {B, T};
}

// The last position's logits, (B, V) gathered from the vocabulary shards, copied out after the
// forward beside everything it kept.
int64_t logits_at_elements(const ModelConfig& mc, int64_t B, int64_t tp) {
  const int64_t V = mc.vocab_size, Vl = V / tp + (V % tp != 0 ? 1 : 0);
  return add(mul(B, V), mul(mul(B, Vl), tp > 1 ? tp + 2 : 1));
}

const char* kActivationKeys =
    "train.micro_batch, train.seq_len, model.recompute = \"selective\" or \"full\", model.recompute_layers, "
    "model.recompute_ops, parallel.tp";

// model.recompute and model.recompute_layers, as model_memory takes them; vlm: every sequence
// carries an image (the most a micro-batch holds).
struct Policy {
  Recompute kind = Recompute::None;
  int64_t full_layers = 0;
  bool vlm = false;
  bool bf16 = false;  // train.dtype = "bf16": the GEMMs' rounded operands
  // model.recompute = "bubble": pipeline chunks recompute ahead in the schedule's R (pp > 1; with
  // pp = 1 the one-stage schedule recomputes inside backward, as "full").
  bool bubble = false;
  std::vector<ActivationCompression> compression;  // model.activation_compression, per layer
  TpCompressionModes tp_compression;  // parallel.tp_comm_compression: a re-run's replay words (forward int8-ef)
  std::vector<RecomputeOps> recompute_ops;         // model.recompute_ops, per layer
  int64_t tp_overlap_chunks = 1;                    // parallel.tp_overlap_chunks: the chunked edges' buffers
  int64_t cp = 1;              // the ranks a row is split over (context attention's temporaries)
  bool cp_allgather = false;   // parallel.cp_comm = "allgather"
  // A pipeline chunk without the head: the trainer keeps its output, sent, past its backward.
  ModelMemoryLayout layout(int64_t B, int64_t T, int64_t tp, bool sp, const StageSpec& stage = {},
                           bool split_backward = false, bool recompute_ahead = false) const {
    return {B,  T, tp, sp, kind, stage, full_layers, !stage.head, split_backward, vlm ? B : 0, bf16, recompute_ahead,
            compression, tp_compression, recompute_ops, tp_overlap_chunks, cp, cp_allgather};
  }
  // The evaluation forward: its compressed collectives are paused (no feedback), so it keeps no
  // replay words.
  ModelMemoryLayout eval_layout(int64_t B, int64_t T, int64_t tp, bool sp, const StageSpec& stage = {}) const {
    ModelMemoryLayout l = layout(B, T, tp, sp, stage);
    l.tp_compression = {};
    return l;
  }
};

// kind = "vlm": the patches (B, P, K) of a micro-batch of B images, uploaded through the allocator
// (app/evaluate.h upload_images) for the forward and kept until its backward.
int64_t patch_bytes(const ModelConfig& mc, int64_t B) {
  if (!mc.is_vlm()) return 0;
  return mul(mul(mul(B, mc.vision.num_patches()), mc.vision.patch_dim()), kFloatBytes);
}

// The scenes task's caption evaluation (app/evaluate.h caption_accuracy): micro_batch scenes per
// forward without targets over P placeholders and the longest caption (padded to a multiple of tp
// under sequence parallelism), the patches and ids uploaded, the last position's logits gathered.
// Returns (B, T).
std::pair<int64_t, int64_t> caption_batch(const Config& cfg, const ModelConfig& mc, int64_t tp, bool sp) {
  const int64_t B = std::min(cfg.train.micro_batch, cfg.data.val_examples);
  int64_t T = mc.vision.num_patches() + SceneTask::kMaxCaptionTokens;
  if (sp) T = (T + tp - 1) / tp * tp;
  return {B, T};
}

// What a training step reads back to the host at its end, in one F64 buffer (Trainer::finish_step):
// the micro-batches' loss sum and target count added up, and the squared gradient norm.
constexpr int64_t kStepReadsBytes = 3 * 8;

RankModel whole_model(const Config& cfg, const ModelConfig& mc, int64_t tp, bool sp, const Policy& policy) {
  const TrainConfig& t = cfg.train;
  const ModelMemory step = model_memory(mc, policy.layout(t.micro_batch, t.seq_len, tp, sp));
  RankModel r;
  r.parameters = step.parameters;
  r.transient = {"activations and temporaries of one micro-batch (" + std::to_string(t.micro_batch) + " x " +
                     std::to_string(t.seq_len) + " tokens)",
                 // the model's peak, its loss sums, the step's reads (the sum of them and the
                 // gradient norm), and the micro-batch's token and target ids uploaded through the
                 // allocator
                 add(add(add(mul(step.training_peak, kFloatBytes), ModelMemory::kLossSumsBytes + kStepReadsBytes),
                         mul(mul(2, mul(t.micro_batch, t.seq_len)), kIdBytes)),
                     patch_bytes(mc, t.micro_batch)),
                 true, kActivationKeys};
  if (cfg.data.task == "addition") {
    const auto [B, T] = eval_batch(cfg, mc, tp, sp);
    const ModelMemory eval = model_memory(mc, policy.eval_layout(B, T, tp, sp));
    // Plus the prompts' ids, uploaded through the allocator for the forward.
    r.eval_bytes = add(mul(std::max(eval.inference_peak, add(eval.inference_kept, logits_at_elements(mc, B, tp))),
                           kFloatBytes),
                       mul(mul(B, T), kIdBytes));
    r.eval_what = "evaluation forward (" + std::to_string(B) + " problems x " + std::to_string(T) + " tokens)";
  }
  if (cfg.data.task == "scenes" && cfg.data.val_examples > 0) {
    const auto [B, T] = caption_batch(cfg, mc, tp, sp);
    const ModelMemory eval = model_memory(mc, policy.eval_layout(B, T, tp, sp));
    r.eval_bytes = add(add(mul(std::max(eval.inference_peak, add(eval.inference_kept, logits_at_elements(mc, B, tp))),
                               kFloatBytes),
                           mul(mul(B, T), kIdBytes)),
                       patch_bytes(mc, B));
    r.eval_what = "caption evaluation forward (" + std::to_string(B) + " scenes x " + std::to_string(T) + " tokens)";
  }
  return r;
}

// Pipeline rank `rank`: its chunks' parameters, the micro-batches in flight under the schedule, and
// the evaluation forward of its heaviest chunk (the pipeline runs one chunk's forward at a time and
// keeps nothing for a backward).
RankModel pipeline_rank(const Config& cfg, const ModelConfig& mc, const std::vector<StageSpec>& cut, int64_t rank,
                        int64_t m, const StepWalks& walks, int64_t tp, bool sp, const Policy& policy) {
  const TrainConfig& t = cfg.train;
  const ParallelConfig& p = cfg.parallel;
  const std::vector<StageSpec> chunks = rank_chunks(cut, p.pp, rank);
  const int64_t Tl = sp ? t.seq_len / tp : t.seq_len;
  RankModel r;
  std::vector<ChunkBytes> bytes;
  for (const StageSpec& c : chunks) {
    const ModelMemory mm = model_memory(mc, policy.layout(t.micro_batch, t.seq_len, tp, sp, c, false, policy.bubble));
    const ModelMemory split = model_memory(mc, policy.layout(t.micro_batch, t.seq_len, tp, sp, c, true, policy.bubble));
    r.parameters = add(r.parameters, mm.parameters);
    bytes.push_back(chunk_bytes(mm, split, c, t.micro_batch, t.seq_len, Tl, mc.n_embd, patch_bytes(mc, t.micro_batch)));
  }
  r.what = "pipeline stage " + std::to_string(rank) + " of " + std::to_string(p.pp) + ": " + describe_chunks(chunks);
  const InFlight peak = pipeline_peak(bytes, walks, rank);
  r.transient = {"activations of " + std::to_string(peak.most) +
                     (p.vpp > 1 ? " micro-batch chunks" : " micro-batches") + " in flight of " + std::to_string(m) +
                      " (parallel.pp_schedule = \"" + p.pp_schedule + "\", " + r.what +
                     "), one's temporaries and the tensors sent, kept until the step's transfers end (" +
                     std::to_string(t.micro_batch) + " x " + std::to_string(t.seq_len) + " tokens each)",
                 // and the step's reads (the sum of the loss sums, the gradient norm: every rank
                 // allocates them)
                 add(peak.bytes, kStepReadsBytes), true,
                 std::string(kActivationKeys) + ", parallel.pp_schedule, parallel.pp"};
  if (cfg.data.task == "addition") {
    const auto [B, T] = eval_batch(cfg, mc, tp, sp);
    const int64_t Tle = sp ? T / tp : T;
    for (const StageSpec& c : chunks) {
      const ModelMemory eval = model_memory(mc, policy.eval_layout(B, T, tp, sp, c));
      const int64_t kept = add(eval.inference_kept, c.head ? logits_at_elements(mc, B, tp) : 0);
      int64_t b = mul(std::max(eval.inference_peak, kept), kFloatBytes);
      b = add(b, c.embedding ? mul(mul(B, T), kIdBytes) : mul(mul(mul(B, Tle), mc.n_embd), kFloatBytes));
      r.eval_bytes = std::max(r.eval_bytes, b);
    }
    r.eval_what = "evaluation forward (" + std::to_string(B) + " problems x " + std::to_string(T) +
                  " tokens, the heaviest chunk of " + r.what + ")";
  }
  return r;
}

MemoryEstimate estimate_for(const Config& cfg, const MemoryLayout& layout, const RankModel& rm) {
  const TrainConfig& t = cfg.train;
  const int64_t dp = layout.dp;
  // ZeRO-1 shards the optimizer state over the dp x cp group (every rank holding the same parameters).
  const int64_t shards = mul(dp, std::max<int64_t>(1, cfg.parallel.cp));
  const bool zero = cfg.parallel.zero == 1 && shards > 1;
  // The frozen parameters come first in the flat buffers, unpadded; the trainable rest is padded.
  const int64_t P = rm.parameters, F = rm.frozen, Tr = P - F, pad = zero ? shards : 1;
  const int64_t padded_trainable = mul(Tr / pad + (Tr % pad != 0 ? 1 : 0), pad);
  const int64_t padded = add(F, padded_trainable);
  const int64_t shard = padded_trainable / pad;  // ZeRO-1: this rank's part of the optimizer state
  MemoryEstimate e;
  auto item = [&](std::string what, int64_t elements, bool allocator, std::string keys, int64_t bytes_each) {
    e.items.push_back({std::move(what), mul(elements, bytes_each), allocator, std::move(keys)});
  };
  const std::string model_keys = std::string(kModelKeys) + (cfg.parallel.pp > 1 ? ", parallel.pp" : "");
  item("parameters (" + std::to_string(P) + " on this rank" + (rm.what.empty() ? "" : ": " + rm.what) +
           (F > 0 ? ", " + std::to_string(F) + " of them frozen" : "") + ")",
       padded, true, model_keys, kFloatBytes);
  if (t.dtype == "bf16")  // ParameterStore::enable_compute_copy: every parameter, padding included
    item("bf16 copy of the parameters (the GEMMs' weights)", padded, true, model_keys + ", train.dtype",
         kBf16Bytes);
  // Frozen matrices and embeddings have no gradient buffer (ParameterStore::finalize).
  const int64_t grads = padded - rm.no_grad;
  item(rm.no_grad > 0 ? "gradients (none for the " + std::to_string(rm.no_grad) + " frozen matrix elements)"
                      : std::string("gradients"),
       zero ? add(grads, shard) : grads, true, model_keys, kFloatBytes);
  item(std::string(zero ? "AdamW moments (ZeRO-1: 1/" + std::to_string(shards) + " of them)" : "AdamW moments") +
           (F > 0 ? " of the trainable parameters" : ""),
       mul(2, zero ? shard : Tr), true, model_keys + ", parallel.zero = 1" + (F > 0 ? ", train.freeze" : ""),
       kFloatBytes);

  if (rm.tp_feedback > 0)  // parallel/tp_compression.h: kept from step to step
    item("tensor-parallel error-feedback residuals (parallel.tp_comm_compression = \"int8-ef\")", rm.tp_feedback,
         true, "parallel.tp_comm_compression{,_forward,_backward}, train.micro_batch, train.seq_len", kFloatBytes);

  // The largest transient: a training step's, the evaluation forward, or the ZeRO-1 gather.
  MemoryItem transient = rm.transient;
  if (rm.eval_bytes > transient.bytes) transient = {rm.eval_what, rm.eval_bytes, true, "data.val_examples"};
  if (zero && layout.checkpoints && mul(mul(2, padded_trainable), kFloatBytes) > transient.bytes)
    transient = {"AdamW moments gathered for a checkpoint (ZeRO-1)", mul(mul(2, padded_trainable), kFloatBytes), true,
                 model_keys};
  e.items.push_back(transient);

  // Host memory the allocator does not see.
  const int64_t accum = std::max<int64_t>(1, t.global_batch / std::max<int64_t>(1, mul(t.micro_batch, dp)));
  item("token batches (" + plural(accum, "micro-batch") + " of a step + " + std::to_string(kLoaderDepth + 1) +
           " prefetched)",
       mul(mul(add(accum, kLoaderDepth + 1), mul(t.micro_batch, t.seq_len)), 2), false,
       "train.global_batch, train.micro_batch, train.seq_len", 4 /* int32 tokens and targets */);
  if (layout.checkpoints)
    item("host copy of a checkpoint while it is written (parameters and moments)",
         add(P, mul(2, zero ? padded_trainable : Tr)),
         false, model_keys, kFloatBytes);
  e.items.push_back({"runtime (code, MPI, HDF5, BLAS, threads)", kRuntimeBytes, false, ""});
  return e;
}

// The pipeline ranks whose estimates are compared for MemoryLayout::pp_rank = -1: all of them, or
// for very deep pipelines the first two, the middle and the last two (the first holds the most
// micro-batches in flight, the last the head; the cut balances the rest).
// Whether the schedule generator accepts the config's micro-batches per step (an automatic
// micro-batch too large for parallel.pp_schedule is not a candidate).
bool pipeline_runs(const Config& c, int64_t dp) {
  const int64_t m = c.train.global_batch / std::max<int64_t>(1, mul(c.train.micro_batch, dp));
  try {
    check_pipeline_schedule(c.parallel.pp, c.parallel.vpp, m, parse_pipeline_kind(c.parallel.pp_schedule));
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<int64_t> candidate_ranks(int64_t pp) {
  std::vector<int64_t> out;
  if (pp <= 512) {
    for (int64_t r = 0; r < pp; ++r) out.push_back(r);
  } else {
    out = {0, 1, pp / 2, pp - 2, pp - 1};
  }
  return out;
}

}  // namespace

// The estimate with each row split over `split` cp ranks (1: whole rows, no ring): its activations at
// seq_len / split positions and the ring's buffers over split ranks.
static MemoryEstimate estimate_at_cp_split(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout,
                                    int64_t split) {
  const ModelConfig mc = resolve(to_model_config(cfg, data_vocab_size));
  const int64_t tp = layout.tp;
  const bool sp = cfg.parallel.sequence_parallel && tp > 1;
  const ParallelConfig& p = cfg.parallel;
  const TpCompressionModes tp_modes =
      resolve_tp_compression(p.tp_comm_compression, p.tp_comm_compression_forward, p.tp_comm_compression_backward);
  Policy policy{recompute_kind(cfg.model.recompute), cfg.model.recompute_layers, mc.is_vlm(),
                cfg.train.dtype == "bf16", recompute_in_bubbles(cfg), activation_compression_policy(cfg),
                tp_modes};
  // Per layer of the model, as the trainer's blocks run them (none named: every layer keeps all, the
  // empty policy; the planner asks for many estimates without op sets, so skip the per-layer parse).
  if (!cfg.model.recompute_ops.empty() || !cfg.model.recompute_ops_layers.empty())
    policy.recompute_ops = recompute_ops_policy(cfg);
  policy.tp_overlap_chunks = sp ? p.tp_overlap_chunks : 1;
  // Context parallelism: a cp rank holds seq_len / cp positions of every sequence, so each
  // activation of the model (and the evaluation's) is that of the shorter sequence; parameters,
  // gradients and moments are not divided (the stage cut is the trainer's, by the whole length).
  Config local = cfg;
  if (split > 1 && cfg.train.seq_len % split == 0) local.train.seq_len = cfg.train.seq_len / split;
  // Each block's attention over the row's split (model/memory.h ModelMemoryLayout::cp): the
  // context attention's temporaries inside the block's attention forward and backward.
  policy.cp = split;
  policy.cp_allgather = p.cp_comm == "allgather";
  const auto with_frozen = [&](RankModel r, const std::vector<StageSpec>& chunks) {
    r.frozen = frozen_elements(mc, chunks, tp, layout.frozen, &r.no_grad);
    int64_t layers = 0;  // the error-feedback residuals: one set per block this rank runs
    for (const StageSpec& c : chunks) layers += resolve_stage(c, mc).layers();
    r.tp_feedback = mul(layers, tp_feedback_elements(tp_modes, cfg.train.micro_batch, local.train.seq_len, mc.n_embd,
                                                     tp, sp));
    return r;
  };
  if (p.pp == 1)
    return estimate_for(cfg, layout, with_frozen(whole_model(local, mc, tp, sp, policy), {StageSpec{}}));
  const std::vector<StageSpec> cut = cut_stages(mc, cfg.train.seq_len, p.pp, p.vpp, p.pp_layers);
  const int64_t m = micro_batches_of(cfg, layout);
  const StepWalks walks = step_walks(p, m, policy.bubble, generator_ahead(cfg, m), layout);
  if (layout.pp_rank >= 0) {
    TESSERA_CHECK(layout.pp_rank < p.pp, "estimate_training_memory: pipeline rank ", layout.pp_rank, " of ", p.pp);
    return estimate_for(cfg, layout,
                        with_frozen(pipeline_rank(local, mc, cut, layout.pp_rank, m, walks, tp, sp, policy),
                                    rank_chunks(cut, p.pp, layout.pp_rank)));
  }
  MemoryEstimate most;
  for (int64_t r : candidate_ranks(p.pp)) {
    MemoryEstimate e = estimate_for(
        cfg, layout,
        with_frozen(pipeline_rank(local, mc, cut, r, m, walks, tp, sp, policy), rank_chunks(cut, p.pp, r)));
    if (most.items.empty() || e.total() > most.total()) most = std::move(e);
  }
  return most;
}

// Static cp: every row split over the whole cp group. Dynamic cp (parallel.cp_mode = "dynamic",
// app/dynamic_cp.h): a pass holds whole rows (up to a micro-batch's, all of it on one rank when
// the plan puts it there: the 1-rank run's activations) or its share of rows split over a subgroup
// of s ranks (every s the planner may choose, parallel/dynamic_cp.h cp_split_sizes); the passes
// run one after another, so the bound is the largest of these.
MemoryEstimate estimate_training_memory(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout) {
  const ParallelConfig& p = cfg.parallel;
  if (p.cp_mode != "dynamic" || p.cp <= 1) return estimate_at_cp_split(cfg, data_vocab_size, layout, p.cp);
  MemoryEstimate most = estimate_at_cp_split(cfg, data_vocab_size, layout, 1);
  for (int64_t s : cp_split_sizes(p.cp, cfg.train.seq_len)) {
    MemoryEstimate e = estimate_at_cp_split(cfg, data_vocab_size, layout, s);
    if (e.total() > most.total()) most = std::move(e);
  }
  return most;
}

int64_t recompute_ahead_within_cap(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout) {
  if (!recompute_in_bubbles(cfg)) return cfg.model.recompute_ahead;
  const int64_t m = micro_batches_of(cfg, layout);
  int64_t k = generator_ahead(cfg, m);
  if (cfg.train.max_memory_gib <= 0) return k;
  for (Config c = cfg; k > 1; --k) {  // the largest K whose estimate fits (the estimate of K = 1 is refused as before)
    c.model.recompute_ahead = k;
    if (memory_cap_problem(estimate_training_memory(c, data_vocab_size, layout), cfg.train.max_memory_gib).empty())
      break;
  }
  return k;
}

Config with_recompute_ahead(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout) {
  Config c = cfg;
  c.model.recompute_ahead = recompute_ahead_within_cap(cfg, data_vocab_size, layout);
  return c;
}

namespace {

// The first integer on the line of `path` that starts with `key` (or the file's first integer
// when key is empty); -1 when absent or "max".
int64_t read_number(const std::string& path, const std::string& key = "") {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!key.empty() && line.rfind(key, 0) != 0) continue;
    std::istringstream s(key.empty() ? line : line.substr(key.size()));
    long long v = -1;
    if (s >> v) return v;
    return -1;
  }
  return -1;
}

// This process's cgroup directory for a controller: from /proc/self/cgroup ("0::/path" for v2,
// "N:memory:/path" for v1) when it exists under mount, else the mount itself (a container's
// namespaced view).
std::string cgroup_dir(const std::string& mount, bool v2) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (v2 ? !controllers.empty() : controllers.find("memory") == std::string::npos) continue;
    const std::string dir = mount + line.substr(b + 1);
    if (std::ifstream(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"))) return dir;
  }
  return mount;
}

}  // namespace

AvailableMemory available_host_memory() {
  AvailableMemory a;
  if (const char* test = std::getenv("TESSERA_TEST_MEMORY_AVAILABLE")) {
    a.bytes = std::atoll(test);
    a.source = "TESSERA_TEST_MEMORY_AVAILABLE";
    return a;
  }
  const int64_t kb = read_number("/proc/meminfo", "MemAvailable:");
  if (kb >= 0) a = {kb * 1024, "MemAvailable in /proc/meminfo"};
  // A cgroup limit (a container, a Slurm job) that is lower than what the node has free.
  struct Files {
    std::string limit, usage;
  };
  const std::string v2 = cgroup_dir("/sys/fs/cgroup", true), v1 = cgroup_dir("/sys/fs/cgroup/memory", false);
  for (const Files& f : {Files{v2 + "/memory.max", v2 + "/memory.current"},
                         Files{v1 + "/memory.limit_in_bytes", v1 + "/memory.usage_in_bytes"}}) {
    const int64_t limit = read_number(f.limit), usage = read_number(f.usage);
    if (limit <= 0 || usage < 0 || limit >= (int64_t{1} << 60)) continue;  // absent, or "no limit"
    const int64_t room = std::max<int64_t>(0, limit - usage);
    if (a.bytes < 0 || room < a.bytes)
      a = {room, "the cgroup limit " + format_bytes(static_cast<size_t>(limit)) + " minus " +
                     format_bytes(static_cast<size_t>(usage)) + " in use (" + f.limit + ")"};
    break;
  }
  return a;
}

std::string memory_problem(const MemoryEstimate& e, int64_t ranks_on_node, const AvailableMemory& available) {
  if (available.bytes < 0) return "";
  const int64_t per_rank = e.total(), needed = mul(per_rank, std::max<int64_t>(1, ranks_on_node));
  if (needed <= available.bytes) return "";
  std::vector<MemoryItem> items = e.items;
  std::stable_sort(items.begin(), items.end(), [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
  std::ostringstream os;
  os << "not enough memory for this run: it needs about " << format_bytes(static_cast<size_t>(per_rank)) << " per rank";
  if (ranks_on_node > 1)
    os << " x " << ranks_on_node << " ranks on this node = " << format_bytes(static_cast<size_t>(needed));
  os << ", and " << format_bytes(static_cast<size_t>(available.bytes)) << " is available (" << available.source
     << "). The estimate for one rank, largest first:";
  for (const MemoryItem& i : items) {
    os << "\n  " << format_bytes(static_cast<size_t>(i.bytes)) << "  " << i.what;
    if (!i.keys.empty()) os << "  <- " << i.keys;
  }
  os << "\nShrink the largest items with the keys named (or run on more ranks with parallel.tp / parallel.zero), "
        "or set train.memory_check = false to start anyway (docs/training.md, \"Memory\").";
  return os.str();
}

std::string memory_cap_problem(const MemoryEstimate& e, double cap_gib) {
  if (cap_gib <= 0) return "";
  const double cap = cap_gib * 1024.0 * 1024.0 * 1024.0;
  if (static_cast<double>(e.total()) <= cap) return "";
  std::ostringstream os;
  os << "train.max_memory_gib = " << cap_gib << ": one rank needs about " << format_bytes(static_cast<size_t>(e.total()))
     << ", more than the cap of " << format_bytes(static_cast<size_t>(cap)) << ". Largest items:";
  std::vector<MemoryItem> items = e.items;
  std::stable_sort(items.begin(), items.end(), [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
  for (size_t i = 0; i < items.size() && i < 3; ++i) {
    os << "\n  " << format_bytes(static_cast<size_t>(items[i].bytes)) << "  " << items[i].what;
    if (!items[i].keys.empty()) os << "  <- " << items[i].keys;
  }
  os << "\nShrink them with the keys named, or split each sequence over more ranks with parallel.cp (activations "
        "per rank / cp), or raise the cap.";
  return os.str();
}

std::string check_training_memory(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout,
                                  MPI_Comm comm) {
  const int64_t local = comm == MPI_COMM_NULL ? 1 : ranks_on_this_node(comm);
  std::string error, line;
  try {
    const MemoryEstimate e = estimate_training_memory(cfg, data_vocab_size, layout);
    const AvailableMemory available = available_host_memory();
    std::ostringstream os;
    os << "memory estimate: " << format_bytes(static_cast<size_t>(e.total())) << " per rank (tensors "
       << format_bytes(static_cast<size_t>(e.allocator_bytes())) << ", the progress line's mem)";
    if (local > 1) os << " x " << local << " ranks on this node";
    if (available.bytes >= 0)
      os << " of " << format_bytes(static_cast<size_t>(available.bytes)) << " available (" << available.source << ")";
    else
      os << " (available memory unknown: not checked)";
    line = os.str();
    const std::string problem = memory_problem(e, local, available);
    if (!problem.empty() && cfg.train.memory_check) error = problem;
    const std::string capped = memory_cap_problem(e, cfg.train.max_memory_gib);  // a cap set is always kept
    if (!capped.empty()) error = capped;
    if (!problem.empty() && !cfg.train.memory_check)
      line += "\nwarning: train.memory_check = false: starting anyway. " + problem;
  } catch (const Error& ex) {
    error = ex.what();
  }
  if (comm != MPI_COMM_NULL) throw_if_any_failed(comm, error);
  if (!error.empty()) throw Error(error);
  return line;
}

Config with_auto_micro_batch(const Config& cfg, int64_t data_vocab_size, const MemoryLayout& layout, MPI_Comm comm) {
  if (cfg.train.micro_batch > 0) return cfg;
  const int64_t local = comm == MPI_COMM_NULL ? 1 : ranks_on_this_node(comm);
  // The automatic choice takes at most half of what is available: the rest for the estimate's
  // error, the OS and whatever else runs beside the job (a CPU gains nothing from a micro-batch
  // that fills the machine; an explicit train.micro_batch may still use it all).
  AvailableMemory available = available_host_memory();
  if (available.bytes > 0) available.bytes = static_cast<int64_t>(kAutoMicroBatchMemoryShare * static_cast<double>(available.bytes));
  Config c = cfg;
  std::string error;
  int64_t mine = 1;
  try {
    mine = auto_micro_batch(cfg.train.global_batch, layout.dp, [&](int64_t micro_batch) {
      c.train.micro_batch = micro_batch;
      if (c.parallel.pp > 1 && !pipeline_runs(c, layout.dp)) return false;  // too few micro-batches for the schedule
      try {
        return memory_problem(estimate_training_memory(c, data_vocab_size, layout), local, available).empty();
      } catch (const SizeOverflow&) {
        return false;  // sizes beyond 64 bits: a smaller micro-batch, or the check's message
      }
    });
  } catch (const Error& e) {
    error = e.what();
  }
  if (comm != MPI_COMM_NULL) {
    throw_if_any_failed(comm, error);
    long long all = mine;  // nodes may have different memory available: the smallest choice fits everywhere
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_LONG_LONG, MPI_MIN, comm), "MPI_Allreduce (micro-batch)");
    mine = all;
  }
  if (!error.empty()) throw Error(error);
  c.train.micro_batch = mine;
  return c;
}

}  // namespace tessera
