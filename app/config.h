// The run configuration: one struct per TOML section. Each field is declared exactly once, in its
// section's visit(), with its default, doc comment and allowed values; parsing, --set overrides,
// validation, to_toml and the docs table all walk that one declaration.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "parallel/process_grid.h"

namespace tessera {

enum class Recompute;  // model/gpt.h
struct ActivationCompression;  // kernels/activation_compression.h
struct StageSpec;      // model/gpt.h
struct RecomputeOps;   // model/recompute_ops.h

// The values a field accepts: for numbers a range (each end inclusive or exclusive) plus at most
// one sentinel outside it (parallel.dp = -1); for strings a list of choices. Empty: any value.
// A number must also be finite (inf and nan are refused whatever the range). Integer sizes carry
// an upper bound far beyond any real run, so that absurd values (n_layer = 2^63 - 1) are refused
// at load, naming the key, before any size arithmetic sees them.
struct Allowed {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
  std::optional<double> sentinel;
  std::vector<std::string> choices;
  std::string or_suffix;  // with choices: also any string ending in it (".json": a file path)

  static Allowed any() { return {}; }
  static Allowed at_least(double lo);
  static Allowed greater_than(double lo);
  static Allowed closed(double lo, double hi);     // [lo, hi]
  static Allowed half_open(double lo, double hi);  // [lo, hi)
  static Allowed one_of(std::vector<std::string> values);
  Allowed or_value(double v) const;  // also accept v, e.g. -1 = "derive it"
  Allowed or_ending(std::string suffix) const;  // also accept strings ending in suffix
  Allowed at_most(double hi) const;   // and at most hi: at_least(1).at_most(65536) = "in [1, 65536]"

  bool accepts(double v) const;
  bool accepts(const std::string& s) const;
  // ">= 1", "> 0", "in [0, 1)", "-1 or >= 1", "one of \"cosine\", \"linear\""; "" when empty.
  std::string describe() const;
};

// A visitor V provides
//   template <class S> void section(std::string_view name, std::string_view doc, S& s);
//   template <class T> void field(std::string_view key, T& value, std::string_view doc, const Allowed&);
// for T in int64_t, double, bool, std::string. Key names are a contract with users' files.

// Upper bounds of the integer sizes: far beyond any model trained today, small enough that their
// products are checked without surprises (token ids are int32: the vocabulary fits one).
inline constexpr double kMaxVocab = 2147483647.0;  // 2^31 - 1
inline constexpr double kMaxLayers = 65536, kMaxHeads = 65536, kMaxWidth = 1 << 20, kMaxSeqLen = 1 << 30;
inline constexpr double kMaxBatch = 1e9, kMaxEvalBatches = 1e6, kMaxValExamples = 1 << 20;
// train.steps and the parallel degrees need no bound of their own: what they multiply is checked
// (steps x global_batch x seq_len tokens; the product of the degrees, at most kMaxRanks).
inline constexpr double kMaxRanks = 1 << 24;

// [model]. The architecture fields are ModelConfig's (model/config.h), declared once there; the
// section adds the training-only recompute policy and two defaults of its own: vocab_size = 0
// (take it from the data) and max_seq_len = 0 (train.seq_len), which to_model_config() resolves.
// The choices resolve() derives from the preset (norm, MLP, positions, ...) are not keys.
struct ModelSection : ModelConfig {
  ModelSection() {
    vocab_size = 0;
    max_seq_len = 0;
  }
  std::string recompute = "none";
  int64_t recompute_layers = 0;
  int64_t recompute_ahead = 1;  // recompute = "bubble": recomputed micro-batches held at once (0: the cap's)
  // Per-op recomputation (model/recompute_ops.h, docs/training.md "Recomputation").
  std::vector<std::string> recompute_ops;
  std::vector<std::string> recompute_ops_layers;
  // Compressed saved activations (model/compression_policy.h, docs/training.md "Compression").
  std::string activation_compression = "none";
  std::vector<std::string> activation_compression_layers;
  int64_t activation_compression_rank = 16;

  template <class V>
  void visit(V& v) {
    v.field("kind", kind, "gpt = a language model; vlm = a vision-language model: the [vision] encoder and a "
            "projector feed image patches to the GPT in place of image placeholder tokens (docs/multimodal.md)",
            Allowed::one_of({"gpt", "vlm"}));
    v.field("preset", preset, "architecture family: gpt2 (LayerNorm, GELU, learned positions, biases, "
            "LM head tied to wte) or llama (RMSNorm, SwiGLU, RoPE, no biases, an LM head of its own); model.lm_head "
            "can change the head",
            Allowed::one_of({"gpt2", "llama"}));
    v.field("vocab_size", vocab_size, "vocabulary size; 0 = take it from the data/tokenizer",
            Allowed::at_least(0).at_most(kMaxVocab));
    v.field("n_layer", n_layer, "transformer blocks", Allowed::at_least(1).at_most(kMaxLayers));
    v.field("n_head", n_head, "attention heads", Allowed::at_least(1).at_most(kMaxHeads));
    v.field("n_kv_head", n_kv_head, "key/value heads (grouped-query attention, llama); 0 = n_head",
            Allowed::at_least(0).at_most(kMaxHeads));
    v.field("n_embd", n_embd, "model width (channels), a multiple of n_head",
            Allowed::at_least(1).at_most(kMaxWidth));
    v.field("ffn_hidden", ffn_hidden, "MLP hidden size; 0 = preset default (gpt2: 4 x n_embd, "
            "llama: 8/3 x n_embd rounded up to a multiple of 64)", Allowed::at_least(0).at_most(4 * kMaxWidth));
    v.field("max_seq_len", max_seq_len, "longest sequence the model accepts; 0 = train.seq_len",
            Allowed::at_least(0).at_most(kMaxSeqLen));
    v.field("norm_eps", norm_eps, "epsilon inside LayerNorm/RMSNorm", Allowed::greater_than(0));
    v.field("rope_theta", rope_theta, "rotary embedding base (llama)", Allowed::greater_than(0));
    v.field("lm_head", lm_head, "the output projection: tied (shares wte.weight) or untied (lm_head.weight of "
            "its own); preset = gpt2 tied, llama untied", Allowed::one_of({"preset", "tied", "untied"}));
    v.field("init_std", init_std, "standard deviation of the weight init; residual output "
            "projections use init_std / sqrt(2 n_layer)", Allowed::greater_than(0));
    v.field("recompute", recompute, "activation recomputation per block: none (keep activations), "
            "selective (keep the GEMM outputs, recompute the norm and activation-function outputs in "
            "backward), full (keep the block input, re-run its forward in backward) or bubble (full, "
            "with the re-run scheduled as its own pipeline action where the rank would wait; "
            "docs/parallel.md \"Recomputation\")",
            Allowed::one_of({"none", "selective", "full", "bubble"}));
    v.field("recompute_layers", recompute_layers, "blocks per pipeline chunk (the first ones; per model "
            "when pp = 1) that recompute fully; the others follow recompute. At most model.n_layer",
            Allowed::at_least(0).at_most(kMaxLayers));
    v.field("recompute_ahead", recompute_ahead, "recompute = \"bubble\" under pipeline parallelism: how many "
            "recomputed micro-batches (R actions run, their backward not yet) a rank may hold at once; 1 puts each R "
            "right before its backward, K > 1 also moves R's into earlier waits, 0 as many as fit "
            "train.max_memory_gib (unbounded without it); with train.max_memory_gib set, the largest K up to this "
            "whose memory estimate fits is used (docs/parallel.md \"Recomputation\")",
            Allowed::at_least(0));
    v.field("recompute_ops", recompute_ops, "per-op recomputation of blocks under recompute = none: what each "
            "block drops after its forward and recomputes in backward, any of norm (the two norms' outputs), qkv (the "
            "attention's q, k, v: their GEMMs again), attn (the attention output and lse: the attention forward "
            "again), mlp_in (the MLP activation's input: its first GEMM(s) again), mlp_act (the activation's output), "
            "or the sets selective (norm, mlp_act) and all; [] = none (docs/training.md \"Recomputation\")",
            Allowed::any());
    v.field("recompute_ops_layers", recompute_ops_layers, "per layer, first layer first: each block's ops "
            "joined by + (\"norm+qkv\", \"selective\", \"none\"), in place of recompute_ops; [] = every block "
            "recompute_ops", Allowed::any());
    v.field("activation_compression", activation_compression, "how each block stores the inputs only its "
            "weight-gradient GEMMs read in backward (the normed inputs and the MLP's last layer's input): none "
            "(exact), bf16 (rounded to bfloat16), int8 (per-row absmax scales) or lowrank (a rank-r randomized "
            "projection); lossy except none; blocks must not recompute (docs/training.md \"Compression\")",
            Allowed::one_of({"none", "bf16", "int8", "lowrank"}));
    v.field("activation_compression_layers", activation_compression_layers, "per layer, first layer first: one "
            "of none, bf16, int8, lowrank for each of model.n_layer blocks, in place of activation_compression; "
            "[] = every block activation_compression", Allowed::any());
    v.field("activation_compression_rank", activation_compression_rank, "the rank r of activation_compression = "
            "lowrank (at most the tensor's rows and columns)", Allowed::at_least(1).at_most(kMaxWidth));
  }
  bool operator==(const ModelSection&) const = default;
};

// [vision]: the vision encoder of model.kind = "vlm" (model/config.h VisionConfig, declared once
// there); ignored for model.kind = "gpt".
struct VisionSection : VisionConfig {
  template <class V>
  void visit(V& v) {
    v.field("image_size", image_size, "vlm: image height and width in pixels (images are square)",
            Allowed::at_least(1).at_most(65536));
    v.field("patch_size", patch_size, "vlm: patch height and width in pixels; divides image_size",
            Allowed::at_least(1).at_most(65536));
    v.field("channels", channels, "vlm: colour channels per pixel (3 = RGB)", Allowed::at_least(1).at_most(64));
    v.field("n_layer", n_layer, "vlm: encoder blocks (bidirectional attention)", Allowed::at_least(1).at_most(kMaxLayers));
    v.field("n_head", n_head, "vlm: encoder attention heads", Allowed::at_least(1).at_most(kMaxHeads));
    v.field("n_embd", n_embd, "vlm: encoder width, a multiple of n_head", Allowed::at_least(1).at_most(kMaxWidth));
    v.field("ffn_hidden", ffn_hidden, "vlm: encoder MLP hidden size; 0 = 4 x n_embd",
            Allowed::at_least(0).at_most(4 * kMaxWidth));
    v.field("placeholder_id", placeholder_id, "vlm: the image placeholder token id, (image_size / patch_size)^2 of "
            "them per image; -1 = the last id of the vocabulary (the scenes tokenizer's <image>)",
            Allowed::at_least(0).at_most(kMaxVocab).or_value(-1));
  }
  bool operator==(const VisionSection&) const = default;
};

// One training dataset of a blend: [[data.train]] path = "data/shakespeare", weight = 1.0
struct DataSource {
  std::string path;     // a Megatron indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx) or llm.c shards (a glob)
  double weight = 1.0;  // relative share of the blend's samples
  bool operator==(const DataSource&) const = default;
};

struct DataConfig {
  std::string task = "addition";
  int64_t digits = 2;
  int64_t val_examples = 512;
  int64_t seed = 1234;
  std::vector<DataSource> train;
  std::string valid;
  double val_fraction = 0.0;
  std::string tokenizer = "gpt2";
  std::string vocab_dir;
  bool document_mask = false;
  std::string batching = "windows";  // variable-length batches: app/token_batching.h

  template <class V>
  void visit(V& v) {
    v.field("task", task, "dataset: addition = the built-in synthetic task \"a+b=c\"; tokens = token files "
            "listed in [[data.train]]; scenes = the built-in synthetic image-text task (model.kind = \"vlm\"); "
            "image_text = an image-text HDF5 file (docs/data.md), the first [[data.train]] path, with data.valid "
            "for validation (model.kind = \"vlm\")",
            Allowed::one_of({"addition", "tokens", "scenes", "image_text"}));
    v.field("digits", digits, "addition: digits per operand", Allowed::closed(1, 9));
    v.field("val_examples", val_examples, "addition, scenes, image_text (with data.valid): held-out problems or images whose "
            "greedy answers or captions are scored",
            Allowed::at_least(1).at_most(kMaxValExamples));
    v.field("seed", seed, "seed of the data generator and sampler", Allowed::at_least(0));
    v.field("train", train, "tokens: the training datasets, blended by weight; each [[data.train]] table has "
            "path (indexed dataset prefix or llm.c shard glob) and weight", Allowed::any());
    v.field("valid", valid, "tokens: validation dataset path; empty = hold out data.val_fraction of the "
            "first training dataset's documents; image_text: a validation image-text file (.h5)", Allowed::any());
    v.field("val_fraction", val_fraction, "tokens: fraction of documents held out for validation when "
            "data.valid is empty (0 = no validation)", Allowed::half_open(0.0, 1.0));
    v.field("tokenizer", tokenizer, "tokens: the tokenizer the files were prepared with; sets the vocabulary "
            "when model.vocab_size = 0 (gpt2: 50257, byte: 257); image_text: the tokenizer of the file "
            "(tessera prepare --images), which decodes captions; or the path of a Hugging Face tokenizer.json "
            "(byte-level BPE)", Allowed::one_of({"gpt2", "byte"}).or_ending(".json"));
    v.field("vocab_dir", vocab_dir, "directory with GPT-2's encoder.json and vocab.bpe, to decode samples "
            "(optional)", Allowed::any());
    v.field("document_mask", document_mask, "tokens: packed windows hold documents ending in the tokenizer's "
            "end-of-text id; a token attends only within its own document and positions restart at each "
            "document (CPU only)", Allowed::any());
    v.field("batching", batching, "tokens: windows = fixed windows of train.seq_len cut from the stream; tokens = "
            "variable-length batches: whole documents (longer ones cut into pieces of train.seq_len whose "
            "positions continue) packed by train.tokens_per_micro_batch and balanced over dp, attention and "
            "positions per document, the loss averaged over real tokens (docs/data.md; CPU only)",
            Allowed::one_of({"windows", "tokens"}));
  }
  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  int64_t steps = 2000;
  int64_t global_batch = 32;
  int64_t micro_batch = 0;  // 0 = automatic (auto_micro_batch), chosen by the trainer for its layout
  int64_t seq_len = 64;
  int64_t tokens_per_micro_batch = 0;  // data.batching = "tokens": app/token_batching.h
  int64_t seed = 1337;
  int64_t eval_every = 200;
  int64_t eval_batches = 4;
  int64_t max_bad_steps = 5;
  std::string name;
  int64_t exit_after_steps = 0;
  double exit_after_minutes = 0.0;
  double max_memory_gib = 0.0;
  bool profile = false;
  bool memory_check = true;
  std::string device = "cpu";
  std::string dtype = "fp32";
  std::vector<std::string> freeze;

  template <class V>
  void visit(V& v) {
    v.field("steps", steps, "total optimizer steps", Allowed::at_least(1));
    v.field("global_batch", global_batch, "sequences per optimizer step, over all data-parallel "
            "ranks and accumulation steps", Allowed::at_least(1).at_most(kMaxBatch));
    v.field("micro_batch", micro_batch, "sequences per rank per forward/backward; gradient "
            "accumulation steps = global_batch / (micro_batch x dp); 0 = automatic: the largest that divides "
            "global_batch / dp and fits half the available memory by the estimate (printed in the run header)",
            Allowed::at_least(0).at_most(kMaxBatch));
    v.field("seq_len", seq_len, "tokens per training sequence", Allowed::at_least(2).at_most(kMaxSeqLen));
    v.field("tokens_per_micro_batch", tokens_per_micro_batch, "data.batching = \"tokens\": the token budget of a "
            "micro-batch, a multiple of train.seq_len (its rows; train.micro_batch follows from it); 0 = unset",
            Allowed::at_least(0).at_most(kMaxSeqLen));
    v.field("dtype", dtype, "precision of the GEMMs: \"fp32\", or \"bf16\" (mixed precision: bf16 copies of the weights "
            "and bf16 GEMM inputs, fp32 accumulation; fp32 master weights, gradients, optimizer, loss, norms and "
            "checkpoints)", Allowed::one_of({"fp32", "bf16"}));
    v.field("seed", seed, "seed of the parameter init (Philox) and of any training randomness",
            Allowed::at_least(0));
    v.field("eval_every", eval_every, "evaluate every this many steps; 0 = only at the end",
            Allowed::at_least(0));
    v.field("eval_batches", eval_batches, "micro-batches per evaluation",
            Allowed::at_least(1).at_most(kMaxEvalBatches));
    v.field("max_bad_steps", max_bad_steps, "consecutive steps with a non-finite loss or gradient "
            "(skipped) before the run stops", Allowed::at_least(1));
    v.field("name", name, "run name; \"\" = the config file name without .toml", Allowed::any());
    v.field("exit_after_steps", exit_after_steps, "save a checkpoint and exit after this many steps of this "
            "invocation (the schedule is unchanged: a resumed run continues it); 0 = off", Allowed::at_least(0));
    v.field("exit_after_minutes", exit_after_minutes, "save a checkpoint and exit at the first step boundary "
            "after this many minutes of this invocation; 0 = off", Allowed::at_least(0.0));
    v.field("profile", profile, "time every op family (matmul, attention, norm, communication, adamw, ...) and "
            "print where each step's time goes at every log step (rank 0's view)", Allowed::any());
    v.field("memory_check", memory_check, "before allocating, estimate one rank's memory (parameters, gradients, "
            "optimizer, activations, batches, checkpoint copies) and refuse to start when the ranks on a node "
            "need more than it has available; false = only warn (docs/training.md)", Allowed::any());
    v.field("max_memory_gib", max_memory_gib, "refuse to start when one rank's memory estimate exceeds this many "
            "GiB (a per-rank cap, e.g. a device's memory; parallel.cp divides the activations); 0 = no cap",
            Allowed::at_least(0.0).at_most(1 << 30));
    v.field("device", device, "where each rank trains: \"cpu\", or \"cuda\" (the GPU of the rank's local rank on "
            "its node; refused at start where no GPU or no CUDA backend is there; docs/cuda.md)",
            Allowed::one_of({"cpu", "cuda"}));
    v.field("freeze", freeze, "parameters not trained: glob patterns over global parameter names (\"wte.*\", "
            "\"blocks.[0-3].*\"; * ? [...]), and \"original\" = what an up-scaling carried over from its source "
            "model (docs/upscaling.md). Frozen parameters keep their values bit for bit, get no optimizer state and "
            "no gradient reduction; a pattern that matches nothing is refused; [] = train everything",
            Allowed::any());
  }
  bool operator==(const TrainConfig&) const = default;
};

struct OptimConfig {
  double lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 100;
  std::string decay = "cosine";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  bool decay_norms = false;
  bool decay_biases = false;
  bool decay_embeddings = false;

  template <class V>
  void visit(V& v) {
    v.field("lr", lr, "peak learning rate, reached after warm-up", Allowed::greater_than(0));
    v.field("min_lr", min_lr, "learning-rate floor of the decay; at most lr", Allowed::at_least(0));
    v.field("warmup_steps", warmup_steps, "linear warm-up from 0 to lr over this many steps",
            Allowed::at_least(0));
    v.field("decay", decay, "schedule from lr down to min_lr after warm-up",
            Allowed::one_of({"cosine", "linear", "constant"}));
    v.field("beta1", beta1, "AdamW first-moment decay", Allowed::half_open(0, 1));
    v.field("beta2", beta2, "AdamW second-moment decay", Allowed::half_open(0, 1));
    v.field("eps", eps, "AdamW denominator epsilon", Allowed::greater_than(0));
    v.field("weight_decay", weight_decay, "decoupled weight decay on matrices", Allowed::at_least(0));
    v.field("grad_clip", grad_clip, "clip the global gradient norm to this; 0 = off",
            Allowed::at_least(0));
    v.field("decay_norms", decay_norms, "apply weight decay to norm gains too", Allowed::any());
    v.field("decay_biases", decay_biases, "apply weight decay to biases too", Allowed::any());
    v.field("decay_embeddings", decay_embeddings, "apply weight decay to embeddings too",
            Allowed::any());
  }
  bool operator==(const OptimConfig&) const = default;
};

struct ParallelConfig {
  int64_t dp = -1;
  int64_t tp = 1;
  int64_t pp = 1;
  std::vector<int64_t> pp_layers;
  std::string pp_cut = "flops";  // how pp_layers = [] is cut: "flops" (model/stage_cut.h) or "measured" (app/pp_cut.h)
  int64_t vpp = 1;
  std::string pp_schedule = "1f1b";
  int64_t cp = 1;
  std::string cp_comm = "ring";
  std::string cp_mode = "static";  // "dynamic": rows split or kept whole per micro-batch (app/dynamic_cp.h)
  std::string cp_calibration;      // dynamic: the cost model's file; "": measured at start (resume: the checkpoint's)
  bool sequence_parallel = false;
  int64_t tp_overlap_chunks = 1;  // parallel/tp_overlap.h
  // Compressed tp communication (parallel/tp_compression.h): both directions, or each on its own.
  std::string tp_comm_compression = "none";
  std::string tp_comm_compression_forward;   // "": as tp_comm_compression
  std::string tp_comm_compression_backward;  // "": as tp_comm_compression
  bool tp_comm_compression_probe = false;    // measurement: the exact collective beside each compressed one
  int64_t zero = 0;
  double bucket_mb = 25.0;
  bool overlap_grad_reduce = true;
  double timeout_s = 0.0;
  std::string comm = "mpi";
  std::string mpi_wait = "auto";    // parallel/mpi.h MpiWait
  std::string layout = "explicit";  // "auto": app/auto_layout.h plans the keys above at start
  std::string cluster = "local";    // what "auto" plans for: local, a preset or a [cluster] file

  template <class V>
  void visit(V& v) {
    v.field("dp", dp, "data-parallel degree; -1 = world size / (tp x pp x cp)",
            Allowed::at_least(1).or_value(-1));
    v.field("tp", tp, "tensor-parallel degree", Allowed::at_least(1));
    v.field("pp", pp, "pipeline-parallel degree (stages)", Allowed::at_least(1));
    v.field("pp_layers", pp_layers, "blocks per pipeline stage, first stage first: one entry per stage, summing "
            "to model.n_layer, each a positive multiple of parallel.vpp (a vision-language model's stage 0 may "
            "hold 0 with vpp = 1: the vision encoder's own stage); [] = cut by a per-layer cost estimate that "
            "weighs the embedding, the vision tower and the LM head + loss as what they are (docs/parallel.md)",
            Allowed::at_least(0).at_most(kMaxLayers));
    v.field("pp_cut", pp_cut, "how the stages are cut when parallel.pp_layers = []: flops (a per-layer cost "
            "estimate) or measured (a short timing pass of every block, the embedding, the vision tower and the head "
            "on rank 0 before training, then the cut whose slowest stage is fastest within the memory limit; with "
            "parallel.vpp > 1 a stage's time is its vpp chunks', which hold equal blocks as in parallel.pp_layers, "
            "so model.n_layer must be a multiple of vpp; docs/parallel.md)", Allowed::one_of({"flops", "measured"}));
    v.field("vpp", vpp, "virtual pipeline chunks per stage (parallel.pp_schedule = \"interleaved\"): the model "
            "is cut into pp x vpp chunks and rank r holds chunks r, r + pp, ...", Allowed::at_least(1).at_most(kMaxLayers));
    v.field("pp_schedule", pp_schedule, "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b, "
            "interleaved (1F1B over parallel.vpp chunks per rank) or zb-h1 (zero-bubble H1: weight gradients "
            "deferred into the cool-down)", Allowed::one_of({"gpipe", "1f1b", "interleaved", "zb-h1"}));
    v.field("cp", cp, "context-parallel degree: every sequence is cut into 2 x cp chunks and cp rank r holds "
            "chunks r and 2 cp - 1 - r (train.seq_len must divide by 2 x cp)", Allowed::at_least(1));
    v.field("cp_comm", cp_comm, "context-parallel attention: ring (K/V passed around the cp ring, overlapped "
            "with attention) or allgather (K/V all-gathered once per layer; cheap with few KV heads)",
            Allowed::one_of({"ring", "allgather"}));
    v.field("cp_mode", cp_mode, "static (every row split over the whole cp group) or dynamic (data.batching = "
            "\"tokens\", ring: per micro-batch each row runs whole on one cp rank or split over an aligned subgroup "
            "of 2..cp ranks, chosen by a cost model measured at start so that the slowest cp rank is fastest; "
            "docs/parallel.md)", Allowed::one_of({"static", "dynamic"}));
    v.field("cp_calibration", cp_calibration, "parallel.cp_mode = \"dynamic\": a cost-model file (the "
            "cp_calibration.toml a run writes into its directory) to plan with instead of timing whole and split "
            "passes of the model at start; \"\" = measure, except that a resumed run plans with the cost model "
            "recorded in its checkpoint (group /dynamic_cp) when that was measured for the same train.seq_len "
            "and parallel.cp; a file set here wins over the record", Allowed::any());
    v.field("sequence_parallel", sequence_parallel, "split norms and residuals along the sequence "
            "over the tp group", Allowed::any());
    v.field("tp_overlap_chunks", tp_overlap_chunks, "sequence parallelism: cut each tensor-parallel all-gather "
            "and reduce-scatter (and their backward twins) into this many chunks along the sequence, each chunk's "
            "collective running beside the next chunk's GEMMs; 1 = no overlap; > 1 needs parallel.tp > 1, "
            "sequence_parallel = true and at most train.seq_len / (cp x tp) (docs/parallel.md)", Allowed::at_least(1));
    v.field("tp_comm_compression", tp_comm_compression, "lossy compression of the transformer blocks' "
            "tensor-parallel collectives (sp all-gather / reduce-scatter, plain-tp all-reduce), both directions: "
            "none (exact), bf16 (2 bytes an element), int8 (1 byte an element + an fp32 scale per row of C; sums in "
            "fp32) or int8-ef (int8 with error feedback: each collective's quantization residual is added to its "
            "next input); CPU only; embedding, LM head and loss stay exact (docs/training.md, Compression)",
            Allowed::one_of({"none", "bf16", "int8", "int8-ef"}));
    v.field("tp_comm_compression_forward", tp_comm_compression_forward, "the forward (activations) direction's "
            "parallel.tp_comm_compression; \"\" = as parallel.tp_comm_compression",
            Allowed::one_of({"", "none", "bf16", "int8", "int8-ef"}));
    v.field("tp_comm_compression_probe", tp_comm_compression_probe, "measurement: run the exact collective "
            "beside every compressed one and log the relative error of each layer's result (tp_comm_rel_error_*) "
            "and a histogram of the forward inputs over their row's max |x| (tp_comm_value_hist) in metrics.jsonl; "
            "the twins' bytes are left out of tp_bytes_per_step", Allowed::any());
    v.field("tp_comm_compression_backward", tp_comm_compression_backward, "the backward (activation gradients) "
            "direction's parallel.tp_comm_compression; \"\" = as parallel.tp_comm_compression",
            Allowed::one_of({"", "none", "bf16", "int8", "int8-ef"}));
    v.field("zero", zero, "ZeRO stage: 0 = replicated optimizer state, 1 = sharded over dp",
            Allowed::closed(0, 1));
    v.field("bucket_mb", bucket_mb, "data parallel: gradients are summed in buckets of about this many MiB",
            Allowed::greater_than(0.0).at_most(1 << 20));
    v.field("overlap_grad_reduce", overlap_grad_reduce, "data parallel: start each bucket's reduction as soon "
            "as its gradients are final during backward (false: all after backward)", Allowed::any());
    v.field("timeout_s", timeout_s, "a rank that waits this many seconds in one collective (a stopped, hung or "
            "dead peer) names the collective, its group and ranks, and aborts the job (exit 124); waits for a "
            "checkpoint save and the setup are allowed 4x; 0 = wait forever; production: 600-1800 "
            "(docs/parallel.md)", Allowed::half_open(0.0, std::numeric_limits<double>::infinity()));
    v.field("comm", comm, "communication backend: mpi (host buffers; with train.device = \"cuda\" device tensors "
            "are staged through pinned host buffers, so several ranks may share one GPU) or nccl (device buffers, "
            "parallel/nccl_communicator.h; needs train.device = \"cuda\" and one GPU per rank)",
            Allowed::one_of({"mpi", "nccl"}));
    v.field("mpi_wait", mpi_wait, "how a rank waits for its MPI collectives and transfers (parallel.comm = "
            "\"mpi\"): spin (poll without pause: the least latency where every rank has cores of its own), yield "
            "(poll, giving the core away between polls: where ranks share cores, a spinning rank holds its core "
            "until the scheduler's tick while the rank it waits for needs it) or auto (yield where this node's "
            "ranks x OpenMP threads exceed the CPUs their affinity masks allow, else spin; a CPU quota the masks "
            "do not show needs yield set by hand; docs/parallel.md)", Allowed::one_of({"auto", "spin", "yield"}));
    v.field("layout", layout, "explicit: the layout keys above as given; auto: `tessera train` plans them at "
            "start for the ranks it has (the planner of `tessera plan`: dp, tp, pp, vpp, pp_schedule, cp, cp_comm, "
            "sequence_parallel, zero, model.recompute and, when 0, train.micro_batch) and prints the choice; "
            "those keys must then be left unset (docs/planning.md)", Allowed::one_of({"explicit", "auto"}));
    v.field("cluster", cluster, "parallel.layout = \"auto\": the cluster planned for: local (this machine's "
            "ranks), a preset (h100-sxm-80g, h100-sxm-80g-ib4, h200-141g, h200-141g-ib4, a100-80g) or a [cluster] "
            "TOML file such as `tessera plan --calibrate` writes", Allowed::any());
  }
  bool operator==(const ParallelConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;
  int64_t every = 0;
  bool at_end = true;
  int64_t keep_last = 3;
  std::string resume = "auto";
  bool overwrite = false;
  std::string init_from;
  std::vector<std::string> init_prefixes;

  template <class V>
  void visit(V& v) {
    v.field("dir", dir, "checkpoint directory; \"\" = <run dir>/checkpoints", Allowed::any());
    v.field("every", every, "also save every this many steps; 0 = only at the end, on exit_after_* and on "
            "signals", Allowed::at_least(0));
    v.field("at_end", at_end, "save when the run completes train.steps; false: a completed run saves only what "
            "checkpoint.every asks for (benchmarks); signals and exit_after_* still save", Allowed::any());
    v.field("keep_last", keep_last, "checkpoints kept; older ones are deleted", Allowed::at_least(1));
    v.field("resume", resume, "auto = the newest checkpoint in dir if there is one; none = start "
            "fresh; anything else = the path of a checkpoint to resume from", Allowed::any());
    v.field("overwrite", overwrite, "start fresh even where dir holds another run's checkpoints (refused "
            "otherwise); they stay, never pruned, and a save at the same step replaces its file", Allowed::any());
    v.field("init_from", init_from, "a checkpoint whose parameters start a fresh run (weights only: no optimizer "
            "state, step or data position): every tensor of this model the file has, at the same shape; the others "
            "keep their initialization (a text-only GPT's file into a vlm: the encoder and projector start fresh). "
            "Another shape, or another model.preset / n_embd / n_head, is refused. Ignored when the run resumes "
            "its own checkpoint (checkpoint.resume = \"auto\"); \"\" = off (docs/checkpoints.md)", Allowed::any());
    v.field("init_prefixes", init_prefixes, "with init_from: load only the parameters whose global names start "
            "with one of these (\"wte.\", \"blocks.\", \"vision.\"); each must match a tensor of both the model "
            "and the file; [] = every tensor the file shares with the model", Allowed::any());
  }
  bool operator==(const CheckpointConfig&) const = default;
};

// In-run depth up-scaling and the learning-rate restart after a growth (docs/upscaling.md).
struct UpscaleConfig {
  std::string method;
  int64_t at_step = 0;
  int64_t layers = 0;
  int64_t factor = 0;
  int64_t overlap = -1;
  int64_t every = 0;
  std::string position;
  double sinkhorn_eps = 0.0;
  int64_t align_data = 0;
  bool carry_optimizer = false;
  int64_t rewarm_steps = 0;
  int64_t tp = 0;
  int64_t pp = 0;
  int64_t dp = 0;

  template <class V>
  void visit(V& v) {
    v.field("method", method, "grow the model inside this run at upscale.at_step by this method (as `tessera "
            "upscale --method`); \"\" = no growth in this run", Allowed::one_of({"", "solar", "stack", "interleave",
            "expand", "average", "ot"}));
    v.field("at_step", at_step, "the step after which the model grows (0 < at_step < train.steps); model.n_layer is "
            "the depth before it", Allowed::at_least(0));
    v.field("layers", layers, "as --layers: the grown depth; 0 = the method's default", Allowed::at_least(0));
    v.field("factor", factor, "stack: as --factor; 0 = the default (2)", Allowed::at_least(0));
    v.field("overlap", overlap, "solar: as --overlap; -1 = the default (n/4 rounded)", Allowed::at_least(-1));
    v.field("every", every, "inserting methods: as --every; 0 = the default (1)", Allowed::at_least(0));
    v.field("position", position, "inserting methods with upscale.layers: as --position",
            Allowed::one_of({"", "top", "bottom", "uniform"}));
    v.field("sinkhorn_eps", sinkhorn_eps, "ot: as --sinkhorn-eps; 0 = exact assignment", Allowed::at_least(0.0));
    v.field("align_data", align_data, "ot: align the units by their activations on this many micro-batches, as "
            "--align-data --align-batches N: the first ones of the validation data (the training data when there is "
            "none) in the order of a run from step 0, read apart from the run's own data position; 0 = by the "
            "weights", Allowed::at_least(0));
    v.field("carry_optimizer", carry_optimizer, "as --carry-optimizer: the AdamW moments and step follow their "
            "parameters; false = fresh moments and AdamW step count", Allowed::any());
    v.field("rewarm_steps", rewarm_steps, "after a growth (in this run, or the one that made the checkpoint this "
            "run resumes) the learning-rate schedule restarts at the growth step: a linear warm-up of this many "
            "steps to optim.lr, then the optim.decay over the steps left; 0 = the schedule continues unchanged",
            Allowed::at_least(0));
    v.field("tp", tp, "the tensor-parallel degree after the growth: the grown model is re-sharded onto another "
            "layout of the same ranks inside the run (docs/upscaling.md); 0 = parallel.tp", Allowed::at_least(0));
    v.field("pp", pp, "the pipeline-parallel degree after the growth (the stages cut for the grown depth); 0 = "
            "parallel.pp", Allowed::at_least(0));
    v.field("dp", dp, "the data-parallel degree after the growth; 0 = what the world size leaves (world / (tp x pp "
            "x cp)); tp x pp x dp x cp must stay the world size", Allowed::at_least(0));
  }
  bool operator==(const UpscaleConfig&) const = default;
};

struct LogConfig {
  int64_t every = 10;
  std::string dir = "runs";
  std::string progress = "auto";
  double peak_gflops = 0.0;

  template <class V>
  void visit(V& v) {
    v.field("every", every, "print and record metrics every this many steps", Allowed::at_least(1));
    v.field("dir", dir, "run directories go to <dir>/<train.name>", Allowed::any());
    v.field("progress", progress, "console output: tty = a live line updated every step, lines = one line per "
            "log step, auto = tty when stdout is a terminal", Allowed::one_of({"auto", "tty", "lines"}));
    v.field("peak_gflops", peak_gflops, "the device's peak GFLOP/s, the denominator of MFU; 0 = this CPU's "
            "fp32 peak: the larger of nominal (threads x clock x FLOPs per cycle) and measured (docs/training.md)", Allowed::at_least(0.0));
  }
  bool operator==(const LogConfig&) const = default;
};

// [lora]: low-rank adapters (model/lora_config.h LoraConfig, model/lora.h; app/lora.h freezes the
// base). resolve() checks the targets against the preset's layers.
struct LoraSection : LoraConfig {
  template <class V>
  void visit(V& v) {
    v.field("rank", rank, "r, the adapters' inner dimension; 0 = no adapters (full training)",
            Allowed::at_least(0).at_most(kMaxWidth));
    v.field("alpha", alpha, "the adapter update is scaled by alpha / rank", Allowed::greater_than(0));
    v.field("dropout", dropout, "dropout on the adapter input in training (its mask a pure function of train.seed, "
            "the step, the sample, position, layer and feature: every layout draws the same); CPU only",
            Allowed::half_open(0, 1));
    v.field("targets", targets, "the linear layers of every block to adapt: \"attn.q\", \"attn.k\", \"attn.v\", "
            "\"attn.proj\", gpt2 \"mlp.fc\", \"mlp.proj\", llama \"mlp.gate\", \"mlp.up\", \"mlp.down\"; globs "
            "(\"mlp.*\") allowed", Allowed::any());
    v.field("checkpoint", checkpoint, "what the run's checkpoints hold: \"full\" (every tensor) or \"adapters\" "
            "(the adapters, their moments and the run state; the frozen base is read from checkpoint.init_from, "
            "whose checksum the /lora record keeps)", Allowed::one_of({"full", "adapters"}));
  }
  std::string checkpoint = "full";  // app/checkpoint/adapter_checkpoint.h
  bool operator==(const LoraSection&) const = default;
};

struct Config {
  ModelSection model;
  VisionSection vision;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  UpscaleConfig upscale;
  LogConfig log;
  LoraSection lora;

  template <class V>
  void visit(V& v) {
    v.section("model", "the network architecture", model);
    v.section("vision", "the vision encoder of a vision-language model (model.kind = \"vlm\")", vision);
    v.section("data", "what to train on", data);
    v.section("train", "how long, on what batches, and when to evaluate", train);
    v.section("optim", "AdamW and the learning-rate schedule", optim);
    v.section("parallel", "the process layout", parallel);
    v.section("checkpoint", "saving and resuming", checkpoint);
    v.section("upscale", "depth up-scaling inside a run, and the learning-rate restart after a growth", upscale);
    v.section("log", "metrics and console output", log);
    v.section("lora", "low-rank adapters on a frozen base model (fine-tuning)", lora);
  }
  bool operator==(const Config&) const = default;
};

// Reads a TOML file, applies "section.key=value" overrides in order, validates, and fills
// train.name from the file name when empty. Throws tessera::Error naming the key and file:line
// (or the --set argument) of the first problem. Only a regular file of at most kMaxConfigBytes is
// read: a directory, a device (/dev/urandom) or a FIFO is refused before reading.
inline constexpr int64_t kMaxConfigBytes = 4 << 20;
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from text; source_name stands for the file in messages. train.name is left as written.
Config parse_config_string(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {});

// Checks every field against its Allowed and the cross-field rules (min_lr <= lr, batch
// divisibility, model shape, and that the sizes they imply fit 64-bit arithmetic: the tokens of
// the whole run, the process grid, one rank's memory estimate); load_config already does this.
void validate(const Config& c);

// A key whose value differs between two configs: "train.seed", "1337", "7" (values as TOML).
struct ConfigChange {
  std::string key, before, after;
};
// The keys whose values differ, in declaration order (resuming compares the checkpoint's config).
std::vector<ConfigChange> config_changes(const Config& before, const Config& after);

// Every section and key, each with its doc comment above it; parses back to an equal Config.
std::string to_toml(const Config& c);

// The reference tables of docs/config.md: per section, each key's type, default, allowed values
// and meaning.
std::string config_reference_markdown();

// Micro-batches each rank accumulates per optimizer step: global_batch / (micro_batch x dp_size)
// (Megatron semantics). Throws naming the three numbers when it does not divide, and when
// micro_batch is still 0 (automatic: resolve it first with auto_micro_batch).
int64_t grad_accum_steps(const Config& c, int64_t dp_size);

// train.micro_batch = 0: the largest divisor of global_batch / dp_size for which fits(micro_batch)
// is true (fits is monotone: a smaller micro-batch needs less memory), or 1 when none is (the
// memory check then refuses the run, naming the keys). Throws naming the numbers when dp_size does
// not divide global_batch: no micro-batch can work then.
int64_t auto_micro_batch(int64_t global_batch, int64_t dp_size, const std::function<bool(int64_t)>& fits);

// The process grid's degrees from [parallel] (tp, cp, pp, dp; dp = -1: the rest of the world).
GridDegrees grid_degrees(const ParallelConfig& p);

// The pipeline keys against the model and the batch: parallel.vpp > 1 only with the interleaved
// schedule (and pp > 1), which needs vpp > 1; at least one block per model chunk (pp x vpp <=
// model.n_layer); parallel.pp_layers, when given, one entry per stage summing to model.n_layer,
// each a multiple of vpp; and, with dp_size > 0 (0: not known yet), at least pp micro-batches per
// step for every schedule but gpipe. Throws tessera::Error naming the keys and numbers; validate()
// calls it (with parallel.dp when it is given).
void validate_pipeline(const Config& c, int64_t dp_size);

// The model hyper-parameters, resolved (model/config.h resolve()): vocab_size 0 takes
// data_vocab_size, max_seq_len 0 takes train.seq_len. A positive vocab_size must be at least
// data_vocab_size (larger pads the embedding).
ModelConfig to_model_config(const Config& c, int64_t data_vocab_size);

// model.recompute and model.recompute_layers as one policy per layer of the whole model, for the
// Gpt constructor: the first recompute_layers blocks of each chunk in `chunks` (the pipeline cut,
// model/stage_cut.h; all of a chunk's when it has fewer) recompute fully, every other block follows
// model.recompute. chunks empty: the whole model is one chunk (pp = 1).
Recompute recompute_kind(const std::string& name);  // "none", "selective", "full" ("bubble": Full)
// model.recompute = "bubble" with a pipeline (parallel.pp > 1): the schedule recomputes each
// micro-batch's chunks in an R action before its backward (parallel/pipeline_schedule.h); with
// pp = 1 "bubble" is "full".
bool recompute_in_bubbles(const Config& c);
std::vector<Recompute> recompute_policy(const Config& c, const std::vector<StageSpec>& chunks);
std::vector<Recompute> recompute_policy(const Config& c);
// model.activation_compression, _layers and _rank as one entry per layer of the whole model
// (model/compression_policy.h), checked against model.recompute and train.device.
std::vector<ActivationCompression> activation_compression_policy(const Config& c);
// model.recompute_ops / model.recompute_ops_layers: one entry per layer of the model, empty for the
// layers that recompute_policy(c, chunks) makes recompute (selective or full); an Error names the
// keys that do not combine with them (model/recompute_ops.h).
std::vector<RecomputeOps> recompute_ops_policy(const Config& c, const std::vector<StageSpec>& chunks);
std::vector<RecomputeOps> recompute_ops_policy(const Config& c);

// <log.dir>/<train.name>; and checkpoint.dir, or <dir>/checkpoints when it is empty, where dir is
// the run directory actually used (--run-dir may replace run_dir(c)); "" when both are empty.
std::string run_dir(const Config& c);
std::string checkpoint_dir(const Config& c, const std::string& dir);

}  // namespace tessera
