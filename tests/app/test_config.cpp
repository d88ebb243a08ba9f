// Tests app/config.h: defaults, parsing, every error message (key, file:line, suggestion), --set
// overrides, cross-field validation, the to_toml round trip and that docs/config.md is current.
#include "app/config.h"
#include "kernels/activation_compression.h"
#include "model/compression_policy.h"
#include "model/recompute_ops.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <cmath>
#include <sstream>
#include <string>

#include "error_testing.h"
#include "kernels/check.h"
#include "model/gpt.h"

namespace tessera {
namespace {

using testing::error_of;

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config_string(text, "configs/x.toml", overrides); });
}

void expect_contains(const std::string& message, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(message.empty()) << "expected an error";
  for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "\"" << p << "\" not in: " << message;
}

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config_string(text, "configs/x.toml", overrides);
}

// A file in a fresh temporary directory, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : dir_(std::filesystem::temp_directory_path() / ("tessera_test_config_" + std::to_string(::getpid()))),
        path_((dir_ / name).string()) {
    std::filesystem::create_directories(dir_);
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::filesystem::path dir_;
  std::string path_;
};

// ---- Defaults and parsing ------------------------------------------------------------------

TEST(Config, DefaultsMatchTheContract) {
  Config c;
  EXPECT_EQ(c.model.preset, "gpt2");
  EXPECT_EQ(c.model.vocab_size, 0);
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(c.model.recompute, "none");
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-5);
  EXPECT_EQ(c.data.task, "addition");
  EXPECT_EQ(c.data.digits, 2);
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_EQ(c.train.global_batch, 32);
  EXPECT_EQ(c.train.micro_batch, 0);  // automatic
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.train.name, "");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.decay, "cosine");
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_EQ(c.parallel.dp, -1);
  EXPECT_EQ(c.parallel.zero, 0);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_EQ(c.log.dir, "runs");
  EXPECT_EQ(c.log.progress, "auto");
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(parse(""), c);
}

TEST(Config, GridDegreesFromTheParallelSection) {
  ParallelConfig p;
  p.tp = 2;
  const GridDegrees d = grid_degrees(p);
  EXPECT_EQ(d.tp, 2);
  EXPECT_EQ(d.cp, 1);
  EXPECT_EQ(d.pp, 1);
  EXPECT_EQ(d.dp, -1);  // the rest of the world, resolved by ProcessGrid
  p.dp = 3;
  EXPECT_EQ(grid_degrees(p).dp, 3);
  p.pp = 2;  // pipeline stages run in the trainer
  EXPECT_EQ(grid_degrees(p).pp, 2);
  p.pp = 1;
  p.cp = 4;  // context parallelism runs in the trainer
  EXPECT_EQ(grid_degrees(p).cp, 4);
}

// parallel.comm = "nccl" moves device tensors: refused with train.device = "cpu", naming both keys.
TEST(Config, NcclNeedsCuda) {
  EXPECT_TRUE(testing::throws_with([] { parse_config_string("", "t.toml", {"parallel.comm=\"nccl\""}); },
                                   {"parallel.comm = \"nccl\" (--set parallel.comm=\"nccl\")",
                                    "train.device = \"cpu\" (default)", "set train.device = \"cuda\""}));
  const Config ok = parse_config_string("", "t.toml", {"parallel.comm=\"nccl\"", "train.device=\"cuda\""});
  EXPECT_EQ(ok.parallel.comm, "nccl");
}

// parallel.tp_comm_compression (parallel/tp_compression.h): the values, CUDA refused, forward error
// feedback accepted with recomputation (the re-run replays what the forward received), each
// direction on its own.
TEST(Config, TpCommCompressionIsValidated) {
  EXPECT_TRUE(testing::throws_with([] { parse_config_string("", "t.toml", {"parallel.tp_comm_compression=\"int4\""}); },
                                   {"parallel.tp_comm_compression", "int4", "int8-ef"}));
  EXPECT_TRUE(testing::throws_with(
      [] { parse_config_string("", "t.toml", {"parallel.tp_comm_compression=\"int8\"", "train.device=\"cuda\""}); },
      {"runs on the CPU only", "parallel.tp_comm_compression = \"none\""}));
  for (const std::string recompute : {"full", "selective", "bubble"})
    EXPECT_EQ(parse_config_string("", "t.toml", {"parallel.tp_comm_compression=\"int8-ef\"",
                                                 "model.recompute=\"" + recompute + "\""})
                  .parallel.tp_comm_compression,
              "int8-ef");
  const Config ok = parse_config_string("", "t.toml", {"parallel.tp_comm_compression_backward=\"int8-ef\"",
                                                         "model.recompute=\"full\""});
  EXPECT_EQ(ok.parallel.tp_comm_compression, "none");
  EXPECT_EQ(ok.parallel.tp_comm_compression_backward, "int8-ef");
  parse_config_string("", "t.toml", {"train.device=\"cuda\""});  // "none" runs anywhere
}

// data.document_mask needs documents (token datasets) and the CPU's attention kernel.
TEST(Config, DocumentMaskIsRefusedWhereItCannotApply) {
  EXPECT_TRUE(testing::throws_with([] { parse_config_string("", "t.toml", {"data.document_mask=true"}); },
                                   {"data.document_mask = true (--set data.document_mask=true)", "data.task = \"addition\" (default)",
                                    "has none"}));
  EXPECT_TRUE(testing::throws_with(
      [] {
        parse_config_string("", "t.toml", {"data.task=\"tokens\"", "data.document_mask=true", "train.device=\"cuda\""});
      },
      {"data.document_mask = true", "CPU only", "train.device = \"cuda\""}));
  const Config ok = parse_config_string("", "t.toml", {"data.task=\"tokens\"", "data.document_mask=true"});
  EXPECT_TRUE(ok.data.document_mask);
  EXPECT_FALSE(Config{}.data.document_mask);
}

// parallel.tp_overlap_chunks (parallel/tp_overlap.h): refused without tp, without sequence
// parallelism, and beyond one chunk per local position.
TEST(Config, TpOverlapChunksNeedSequenceParallelTp) {
  auto parse = [](std::vector<std::string> sets) { return parse_config_string("", "t.toml", sets); };
  EXPECT_TRUE(testing::throws_with([&] { parse({"parallel.tp_overlap_chunks=2"}); },
                                   {"parallel.tp_overlap_chunks = 2", "parallel.tp = 1"}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"parallel.tp=2", "parallel.tp_overlap_chunks=2"}); },
                                   {"parallel.tp_overlap_chunks = 2", "parallel.sequence_parallel = true"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { parse({"parallel.tp=2", "parallel.sequence_parallel=true", "train.seq_len=8", "parallel.tp_overlap_chunks=5"}); },
      {"parallel.tp_overlap_chunks = 5", "at most 4"}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"parallel.tp_overlap_chunks=0"}); }, {"tp_overlap_chunks"}));
  const Config ok = parse({"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_overlap_chunks=4"});
  EXPECT_EQ(ok.parallel.tp_overlap_chunks, 4);
  EXPECT_EQ(Config{}.parallel.tp_overlap_chunks, 1);
}

// Overlap's chunked edges move exact collectives and apply no adapter dropout: both refused beside it.
TEST(Config, TpOverlapRefusesCompressionAndAdapterDropout) {
  auto parse = [](std::vector<std::string> sets) { return parse_config_string("", "t.toml", sets); };
  const std::vector<std::string> overlap = {"parallel.tp=2", "parallel.sequence_parallel=true",
                                            "parallel.tp_overlap_chunks=2"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> sets = overlap;
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  EXPECT_TRUE(testing::throws_with([&] { parse(with({"parallel.tp_comm_compression=\"int8\""})); },
                                   {"parallel.tp_comm_compression", "parallel.tp_overlap_chunks = 2"}));
  EXPECT_TRUE(testing::throws_with([&] { parse(with({"parallel.tp_comm_compression_backward=\"bf16\""})); },
                                   {"_backward", "parallel.tp_overlap_chunks = 2"}));
  EXPECT_TRUE(testing::throws_with([&] { parse(with({"lora.rank=4", "lora.targets=[\"attn.q\"]", "lora.dropout=0.1"})); },
                                   {"lora.dropout = 0.1", "parallel.tp_overlap_chunks = 2"}));
  EXPECT_NO_THROW(parse(with({"lora.rank=4", "lora.targets=[\"attn.q\"]"})));
}

TEST(Config, AdapterDropoutRefusesTokenBatching) {
  EXPECT_TRUE(testing::throws_with(
      [&] {
        parse_config_string("", "t.toml", {"lora.rank=4", "lora.targets=[\"attn.q\"]", "lora.dropout=0.1",
                                           "data.batching=\"tokens\"", "train.tokens_per_micro_batch=256"});
      },
      {"lora.dropout = 0.1", "data.batching = \"tokens\""}));
}

TEST(Config, FullFileParses) {
  Config c = parse(R"(
[model]
preset = "llama"
vocab_size = 96
n_layer = 4
n_head = 8
n_kv_head = 2
n_embd = 256
ffn_hidden = 512
max_seq_len = 256
norm_eps = 1e-6
rope_theta = 500000.0
init_std = 0.01
recompute = "full"

[data]
task = "addition"
digits = 3
val_examples = 100
seed = 7

[train]
steps = 300
global_batch = 64
micro_batch = 16
seq_len = 128
seed = 42
eval_every = 0
eval_batches = 2
max_bad_steps = 3
name = "tiny"

[optim]
lr = 1e-3
min_lr = 1e-4
warmup_steps = 10
decay = "linear"
beta1 = 0.8
beta2 = 0.99
eps = 1e-10
weight_decay = 0.0
grad_clip = 0.5
decay_norms = true
decay_biases = true
decay_embeddings = true

[parallel]
dp = 2
tp = 2
pp = 2
cp = 1
sequence_parallel = true
zero = 1

[checkpoint]
dir = "/tmp/ckpt"
every = 50
keep_last = 2
resume = "none"

[log]
every = 5
dir = "out"
progress = "lines"
)");
  EXPECT_EQ(c.model.preset, "llama");
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.recompute, "full");
  EXPECT_EQ(c.data.digits, 3);
  EXPECT_EQ(c.train.name, "tiny");
  EXPECT_EQ(c.train.eval_every, 0);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 1e-4);
  EXPECT_EQ(c.optim.decay, "linear");
  EXPECT_TRUE(c.optim.decay_embeddings);
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_EQ(c.checkpoint.dir, "/tmp/ckpt");
  EXPECT_EQ(c.checkpoint.resume, "none");
  EXPECT_EQ(c.log.progress, "lines");
  EXPECT_EQ(grad_accum_steps(c, 2), 2);
}

TEST(Config, IntegerAcceptedForFloat) {
  Config c = parse("[optim]\nlr = 1\nweight_decay = 0\n");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.0);
}

TEST(Config, DottedKeysAndInlineTablesWork) {
  Config c = parse("train.steps = 7\noptim = { lr = 0.5 }\n");
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
}

// ---- File errors: key, file:line, suggestion -------------------------------------------------

TEST(ConfigErrors, SyntaxErrorGivesFileLineColumn) {
  expect_contains(parse_error("[train]\nsteps = = 5\n"), {"TOML syntax error", "configs/x.toml:2:"});
}

TEST(ConfigErrors, MisspeltKeySuggestsTheNearest) {
  expect_contains(parse_error("[train]\nseq_len = 32\n\nstpes = 5\n"),
                  {"unknown key train.stpes", "configs/x.toml:4", "did you mean train.steps?"});
  expect_contains(parse_error("[optim]\nwarmup_step = 5\n"), {"did you mean optim.warmup_steps?"});
}

TEST(ConfigErrors, UnrelatedKeyHasNoSuggestion) {
  std::string m = parse_error("[train]\nbanana = 5\n");
  expect_contains(m, {"unknown key train.banana", "configs/x.toml:2"});
  EXPECT_EQ(m.find("did you mean"), std::string::npos) << m;
}

TEST(ConfigErrors, KeyInTheWrongSectionPointsToItsSection) {
  expect_contains(parse_error("[train]\nlr = 0.1\n"), {"unknown key train.lr", "did you mean optim.lr?"});
}

TEST(ConfigErrors, SubTableIsAnUnknownKey) {
  expect_contains(parse_error("[train.extra]\nx = 1\n"), {"unknown key train.extra", "configs/x.toml:1"});
}

TEST(ConfigErrors, UnknownSection) {
  expect_contains(parse_error("[model]\nn_layer = 2\n[trian]\nsteps = 5\n"),
                  {"unknown section [trian]", "configs/x.toml:3", "did you mean [train]?"});
}

TEST(ConfigErrors, KeyOutsideAnySection) {
  expect_contains(parse_error("steps = 5\n"), {"unknown key steps", "configs/x.toml:1", "outside any [section]",
                                               "did you mean train.steps?"});
}

TEST(ConfigErrors, SectionThatIsNotATable) {
  expect_contains(parse_error("train = 5\n"), {"wrong type for train", "configs/x.toml:1", "a table", "integer 5"});
}

TEST(ConfigErrors, WrongTypeNamesExpectedAndGiven) {
  expect_contains(parse_error("[train]\nsteps = \"many\"\n"),
                  {"wrong type for train.steps", "configs/x.toml:2", "expected an integer", "got string \"many\""});
  expect_contains(parse_error("[train]\n\nsteps = 2.5\n"), {"configs/x.toml:3", "expected an integer", "float 2.5"});
  expect_contains(parse_error("[optim]\nlr = \"fast\"\n"), {"wrong type for optim.lr", "expected a number"});
  expect_contains(parse_error("[optim]\ndecay_norms = 1\n"), {"optim.decay_norms", "expected a boolean"});
  expect_contains(parse_error("[model]\npreset = 2\n"), {"model.preset", "expected a string", "integer 2"});
  expect_contains(parse_error("[train]\nsteps = [1, 2]\n"), {"train.steps", "an array"});
  expect_contains(parse_error("[train]\n\"\" = 1\n"), {"unknown key train.", "configs/x.toml:2"});
}

TEST(ConfigErrors, OutOfRangeNamesValueAndRange) {
  expect_contains(parse_error("[train]\nsteps = 0\n"),
                  {"train.steps = 0", "configs/x.toml:2", "out of range", "must be >= 1"});
  expect_contains(parse_error("[optim]\nbeta1 = 1.0\n"), {"optim.beta1 = 1.0", "must be in [0, 1)"});
  expect_contains(parse_error("[model]\nnorm_eps = 0\n"), {"model.norm_eps = 0.0", "must be > 0"});
  expect_contains(parse_error("[data]\ndigits = 10\n"), {"data.digits = 10", "must be in [1, 9]"});
  expect_contains(parse_error("[parallel]\ndp = 0\n"), {"parallel.dp = 0", "must be -1 or >= 1"});
  expect_contains(parse_error("[parallel]\nzero = 2\n"), {"parallel.zero = 2", "must be in [0, 1]"});
  EXPECT_EQ(parse("[parallel]\ndp = -1\n").parallel.dp, -1);
  EXPECT_DOUBLE_EQ(parse("[optim]\nbeta2 = 0\n").optim.beta2, 0.0);
}

TEST(ConfigErrors, BadEnumListsTheChoices) {
  expect_contains(parse_error("[optim]\ndecay = \"cosin\"\n"),
                  {"optim.decay = \"cosin\"", "configs/x.toml:2", "not allowed",
                   "one of \"cosine\", \"linear\", \"constant\"", "did you mean \"cosine\"?"});
  expect_contains(parse_error("[log]\nprogress = \"bar\"\n"), {"log.progress", "one of \"auto\", \"tty\", \"lines\""});
}

TEST(ConfigErrors, FirstProblemInFileOrderIsReported) {
  // toml++ stores keys sorted; the report must still follow the file.
  std::string m = parse_error("[train]\nsteps = 0\n[model]\nzzz = 1\n");
  expect_contains(m, {"train.steps", "configs/x.toml:2"});
}

// ---- --set overrides -----------------------------------------------------------------------

TEST(ConfigOverrides, EachTypeParses) {
  Config c = parse("[train]\nsteps = 10\n", {"train.steps=20", "optim.lr=1e-3", "optim.weight_decay=0",
                                             "optim.decay_norms=true", "model.preset=llama", "log.dir=\"out dir\"",
                                             "checkpoint.dir=/tmp/a b", "train.name=123", "optim.decay = linear"});
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.0);
  EXPECT_TRUE(c.optim.decay_norms);
  EXPECT_EQ(c.model.preset, "llama");
  EXPECT_EQ(c.log.dir, "out dir");
  EXPECT_EQ(c.checkpoint.dir, "/tmp/a b");
  EXPECT_EQ(c.train.name, "123");  // not a TOML string: taken verbatim
  EXPECT_EQ(c.optim.decay, "linear");
  EXPECT_EQ(parse("", {"model.preset=\"llama\""}).model.preset, "llama");
}

TEST(ConfigOverrides, AppliedInOrderAfterTheFile) {
  Config c = parse("[train]\nsteps = 10\n", {"train.steps=20", "train.steps=30"});
  EXPECT_EQ(c.train.steps, 30);
}

TEST(ConfigOverrides, MalformedArgumentsAreNamed) {
  expect_contains(parse_error("", {"train.steps"}), {"--set train.steps: expected section.key=value"});
  expect_contains(parse_error("", {"steps=5"}),
                  {"--set steps=5: expected section.key=value", "did you mean train.steps?"});
  expect_contains(parse_error("", {"train.stesp=5"}),
                  {"--set train.stesp=5: unknown key train.stesp; did you mean train.steps?"});
  expect_contains(parse_error("", {"trian.steps=5"}),
                  {"--set trian.steps=5: unknown section [trian]; did you mean [train]?"});
  expect_contains(parse_error("", {"train.steps=abc"}),
                  {"--set train.steps=abc: wrong type for train.steps", "expected an integer", "`abc`"});
  expect_contains(parse_error("", {"train.steps=1.5"}), {"--set train.steps=1.5", "float 1.5"});
  expect_contains(parse_error("", {"train.steps=0"}), {"--set train.steps=0: train.steps = 0 is out of range"});
  expect_contains(parse_error("", {"optim.decay=cosin"}), {"--set optim.decay=cosin", "did you mean \"cosine\"?"});
  expect_contains(parse_error("", {"optim.decay_norms=yes"}), {"--set optim.decay_norms=yes", "expected a boolean"});
  expect_contains(parse_error("", {"train.steps=1\nfoo=2"}), {"wrong type for train.steps"});
}

// A --set value that is not TOML is taken verbatim as a string, so it must be UTF-8 text: TOML
// cannot hold other bytes, and to_toml (the run's config.toml, the checkpoint's stored config)
// wrote a file that did not load (found by tests/fuzz's config target: a 0xB7 byte in log.dir).
TEST(ConfigOverrides, VerbatimStringsMustBeUtf8) {
  for (const std::string bad : {"a\xB7" "b", "\xC3", "\xED\xA0\x80" /* a surrogate */, "\xC0\xAF" /* overlong */}) {
    const std::string arg = "log.dir=" + bad;
    expect_contains(parse_error("", {arg}), {"--set " + arg + ": log.dir is not valid UTF-8 text"});
  }
  const Config c = parse("", {"log.dir=runs/caf\xC3\xA9 \xF0\x9F\x98\x80"});
  EXPECT_EQ(c.log.dir, "runs/caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(parse(to_toml(c)), c);
}

// ---- Cross-field validation ----------------------------------------------------------------

TEST(ConfigValidation, MinLrAboveLrNamesBothAndWhereTheyCameFrom) {
  expect_contains(parse_error("[optim]\nlr = 0.001\nmin_lr = 0.01\n"),
                  {"optim.min_lr = 0.01 (configs/x.toml:3)", "must be <= optim.lr = 0.001 (configs/x.toml:2)"});
  expect_contains(parse_error("[optim]\nmin_lr = 1e-4\n", {"optim.lr=5e-5"}),
                  {"optim.min_lr = 1e-4 (configs/x.toml:2)", "optim.lr = 5e-5 (--set optim.lr=5e-5)"});
}

TEST(ConfigValidation, GlobalBatchMustBeAMultipleOfMicroBatch) {
  expect_contains(parse_error("[train]\nglobal_batch = 30\n", {"train.micro_batch=8"}),
                  {"train.global_batch = 30 (configs/x.toml:2)", "multiple of train.micro_batch = 8 (--set"});
  EXPECT_NO_THROW(parse_config_string("[train]\nglobal_batch = 30\n", "x.toml"));  // automatic: 30 on one rank
}

TEST(ConfigValidation, ExplicitDpMustDivideTheBatch) {
  expect_contains(parse_error("[parallel]\ndp = 3\n", {"train.micro_batch=8"}), {"train.global_batch = 32", "8 x 3 = 24"});
  // An automatic micro-batch needs global_batch / dp to be whole.
  expect_contains(parse_error("[parallel]\ndp = 3\n"),
                  {"train.global_batch = 32 must be a multiple of the data-parallel degree dp = 3"});
  EXPECT_NO_THROW(parse_config_string("[parallel]\ndp = 4\n", "x.toml"));
}

// train.micro_batch = 0: the largest divisor of global_batch / dp that fits.
TEST(ConfigValidation, AutoMicroBatchIsTheLargestDivisorThatFits) {
  const auto any = [](int64_t) { return true; };
  EXPECT_EQ(auto_micro_batch(32, 1, any), 32);
  EXPECT_EQ(auto_micro_batch(32, 2, any), 16);  // the quickstart under mpirun -n 2
  EXPECT_EQ(auto_micro_batch(32, 32, any), 1);
  EXPECT_EQ(auto_micro_batch(36, 1, [](int64_t b) { return b <= 10; }), 9);  // divisors 1 2 3 4 6 9 12 18 36
  EXPECT_EQ(auto_micro_batch(49, 1, [](int64_t b) { return b < 49; }), 7);   // a square's root once
  EXPECT_EQ(auto_micro_batch(97, 1, [](int64_t b) { return b < 97; }), 1);   // a prime
  EXPECT_EQ(auto_micro_batch(512, 4, [](int64_t b) { return b <= 100; }), 64);
  EXPECT_EQ(auto_micro_batch(8, 1, [](int64_t) { return false; }), 1);  // the memory check refuses it then
  EXPECT_EQ(auto_micro_batch(1000000000, 1, [](int64_t b) { return b <= 3; }), 2);
  std::vector<int64_t> asked;
  auto_micro_batch(12, 1, [&](int64_t b) { asked.push_back(b); return b <= 4; });
  EXPECT_EQ(asked, (std::vector<int64_t>{12, 6, 4}));  // largest first, stops at the first that fits
  expect_contains(error_of([&] { auto_micro_batch(30, 4, any); }),
                  {"train.global_batch = 30", "multiple of the data-parallel degree dp = 4"});
  expect_contains(error_of([&] { auto_micro_batch(32, 0, any); }), {"data-parallel size"});
  // Unresolved, grad_accum_steps refuses rather than divides by zero.
  Config c;
  expect_contains(error_of([&] { grad_accum_steps(c, 1); }), {"train.micro_batch = 0", "not resolved"});
}

TEST(ConfigValidation, SeqLenMustFitTheModel) {
  expect_contains(parse_error("[model]\nmax_seq_len = 32\n"),
                  {"train.seq_len = 64 (default)", "model.max_seq_len = 32"});
}

TEST(ConfigValidation, ModelShapeIsCheckedAtLoad) {
  expect_contains(parse_error("[model]\nn_embd = 100\n"), {"invalid [model]", "model.n_embd"});
  expect_contains(parse_error("[model]\nn_kv_head = 4\n"), {"invalid [model]", "n_kv_head"});  // gpt2: no GQA
}

TEST(ConfigValidation, ConfigsBuiltInCodeAreRangeChecked) {
  Config c;
  c.optim.beta1 = 1.5;
  expect_contains(error_of([&] { validate(c); }), {"optim.beta1 = 1.5 is out of range: must be in [0, 1)"});
  c = Config{};
  c.optim.decay = "step";
  expect_contains(error_of([&] { validate(c); }), {"optim.decay = \"step\""});
  c = Config{};
  c.checkpoint.resume = "";
  expect_contains(error_of([&] { validate(c); }), {"checkpoint.resume"});
}

TEST(ConfigValidation, GradAccumStepsIsMegatronSemantics) {
  Config c;
  c.train.global_batch = 64;
  c.train.micro_batch = 4;
  EXPECT_EQ(grad_accum_steps(c, 1), 16);
  EXPECT_EQ(grad_accum_steps(c, 4), 4);
  EXPECT_EQ(grad_accum_steps(c, 16), 1);
  expect_contains(error_of([&] { grad_accum_steps(c, 3); }),
                  {"train.global_batch = 64", "train.micro_batch x dp = 4 x 3 = 12"});
  expect_contains(error_of([&] { grad_accum_steps(c, 32); }), {"4 x 32 = 128"});
  expect_contains(error_of([&] { grad_accum_steps(c, 0); }), {"data-parallel size"});
}

// ---- to_toml -------------------------------------------------------------------------------

// ---- Pipeline keys (issue #13) --------------------------------------------------------------

TEST(ConfigPipeline, KeysParseOverrideAndRoundTrip) {
  Config c = parse("[parallel]\npp = 2\npp_layers = [7, 5]\n");
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<int64_t>{7, 5}));
  EXPECT_EQ(c.parallel.vpp, 1);
  EXPECT_EQ(c.parallel.pp_schedule, "1f1b");
  EXPECT_EQ(to_toml(c).find("pp_layers = [7, 5]\n") != std::string::npos, true) << to_toml(c);
  EXPECT_EQ(parse(to_toml(c)), c);
  EXPECT_TRUE(parse("").parallel.pp_layers.empty());
  EXPECT_NE(to_toml(Config{}).find("pp_layers = []\n"), std::string::npos);
  c = parse("", {"parallel.pp=2", "parallel.pp_layers=[4, 8]", "parallel.pp_schedule=zb-h1"});
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(c.parallel.pp_schedule, "zb-h1");
  c = parse("", {"parallel.pp=2", "parallel.vpp=3", "parallel.pp_schedule=interleaved", "parallel.pp_layers=[6, 6]"});
  EXPECT_EQ(c.parallel.vpp, 3);
  EXPECT_EQ(parse(to_toml(c)), c);
}

TEST(ConfigPipeline, MalformedValuesNameTheKey) {
  expect_contains(parse_error("[parallel]\npp_layers = 3\n"),
                  {"wrong type for parallel.pp_layers", "configs/x.toml:2", "an array of integers", "integer 3"});
  expect_contains(parse_error("[parallel]\npp_layers = [6, 6.5]\n"), {"wrong type for parallel.pp_layers"});
  expect_contains(parse_error("[parallel]\npp = 2\npp_layers = [12, 0]\n"),
                  {"parallel.pp_layers = [12, 0] (configs/x.toml:3): stage 1 holds 0 blocks; every stage needs at "
                   "least one (only a vision-language model's stage 0, model.kind = \"vlm\", may hold none)"});
  expect_contains(parse_error("[parallel]\npp = 2\npp_layers = [0, 12]\n"),
                  {"parallel.pp_layers = [0, 12] (configs/x.toml:3): stage 0 holds 0 blocks",
                   "model.kind = \"vlm\""});
  // A vision-language model's stage 0 may hold none (the encoder's own stage), with vpp = 1 only.
  const std::string vlm = "[model]\nkind = \"vlm\"\n[data]\ntask = \"scenes\"\n[parallel]\npp = 2\n";
  EXPECT_EQ(parse(vlm + "pp_layers = [0, 12]\n").parallel.pp_layers, (std::vector<int64_t>{0, 12}));
  expect_contains(parse_error(vlm + "pp_layers = [12, 0]\n"),
                  {"stage 1 holds 0 blocks; every stage needs at least one but the first"});
  expect_contains(parse_error(vlm + "vpp = 2\npp_schedule = \"interleaved\"\npp_layers = [0, 12]\n"),
                  {"stage 0 holds 0 blocks (the vision encoder's own stage), which needs parallel.vpp = 1, not "
                   "parallel.vpp = 2"});
  expect_contains(parse_error("[parallel]\npp = 2\npp_layers = [-1, 13]\n"),
                  {"parallel.pp_layers[0] = -1", "configs/x.toml:3", "must be in [0, 65536]"});
  expect_contains(parse_error("[parallel]\nvpp = 0\n"), {"parallel.vpp = 0", "must be in [1, 65536]"});
  expect_contains(parse_error("[parallel]\npp_schedule = \"1F1B\"\n"),
                  {"parallel.pp_schedule = \"1F1B\"", "one of \"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\""});
}

// An impossible split is refused at load, before any work, naming the keys, their values and where
// they came from.
TEST(ConfigPipeline, ImpossibleSplitsAreRefused) {
  expect_contains(parse_error("[parallel]\npp = 16\n"),
                  {"parallel.pp x parallel.vpp = 16 x 1 = 16 model chunks need at least one block each",
                   "model.n_layer = 12 (default)"});
  expect_contains(parse_error("[model]\nn_layer = 3\n[parallel]\npp = 2\nvpp = 2\npp_schedule = \"interleaved\"\n"),
                  {"2 x 2 = 4 model chunks", "model.n_layer = 3 (configs/x.toml:2)"});
  expect_contains(parse_error("[parallel]\npp = 3\npp_layers = [6, 6]\n"),
                  {"parallel.pp_layers = [6, 6] (configs/x.toml:3) has 2 entries, but parallel.pp = 3 "
                   "(configs/x.toml:2)"});
  expect_contains(parse_error("[parallel]\npp = 2\npp_layers = [6, 5]\n"),
                  {"parallel.pp_layers = [6, 5]", "sums to 11 blocks, but model.n_layer = 12 (default)"});
  expect_contains(parse_error("", {"parallel.pp=2", "parallel.vpp=2", "parallel.pp_schedule=interleaved",
                                   "parallel.pp_layers=[5, 7]"}),
                  {"parallel.pp_layers = [5, 7] (--set parallel.pp_layers=[5, 7])", "stage 0 holds 5 blocks",
                   "not a multiple of parallel.vpp = 2"});
  // pp_layers with a single stage must hold every block too.
  expect_contains(parse_error("[parallel]\npp_layers = [11]\n"), {"sums to 11 blocks"});
  EXPECT_NO_THROW(parse("[parallel]\npp_layers = [12]\n"));
}

TEST(ConfigPipeline, VirtualChunksGoWithTheInterleavedSchedule) {
  expect_contains(parse_error("[parallel]\nvpp = 2\n"), {"parallel.vpp = 2 (configs/x.toml:2) needs parallel.pp > 1"});
  expect_contains(parse_error("[parallel]\npp = 2\nvpp = 2\n"),
                  {"parallel.vpp = 2", "needs parallel.pp_schedule = \"interleaved\", not parallel.pp_schedule = "
                                       "\"1f1b\" (default)"});
  expect_contains(parse_error("[parallel]\npp = 2\npp_schedule = \"interleaved\"\n"),
                  {"parallel.pp_schedule = \"interleaved\" (configs/x.toml:3) needs parallel.vpp >= 2"});
  EXPECT_NO_THROW(parse("[parallel]\npp = 2\nvpp = 2\npp_schedule = \"interleaved\"\n"));
  EXPECT_NO_THROW(parse("[parallel]\npp = 4\n"));  // 12 layers over 4 stages, 1f1b
}

// 1F1B-style schedules keep up to pp micro-batches in flight: fewer per step is refused once dp is
// known (at load with parallel.dp given; the trainer knows it from the world size).
TEST(ConfigPipeline, TooFewMicroBatchesForTheSchedule) {
  const std::string text = "[train]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 4\ndp = 2\n";
  expect_contains(parse_error(text), {"train.global_batch / (train.micro_batch x dp) = 8 / (2 x 2) = 2 micro-batches "
                                      "per step, fewer than parallel.pp = 4 (configs/x.toml:5)",
                                      "parallel.pp_schedule = \"1f1b\" (default) needs at least one micro-batch"});
  EXPECT_NO_THROW(parse(text + "pp_schedule = \"gpipe\"\n"));
  Config c = parse("[train]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 4\n");  // dp = -1: not known yet
  EXPECT_NO_THROW(validate_pipeline(c, 1));
  expect_contains(error_of([&] { validate_pipeline(c, 2); }), {"= 2 micro-batches per step, fewer than parallel.pp = 4"});
  c.parallel.pp_schedule = "zb-h1";
  expect_contains(error_of([&] { validate_pipeline(c, 2); }), {"parallel.pp_schedule = \"zb-h1\" needs"});
  // Interleaved runs micro-batches in groups of pp (the generator's rule, named with the keys).
  Config i = parse("[train]\nglobal_batch = 12\nmicro_batch = 2\n[parallel]\npp = 4\nvpp = 2\n"
                   "pp_schedule = \"interleaved\"\n[model]\nn_layer = 16\n");
  expect_contains(error_of([&] { validate_pipeline(i, 1); }), {"= 6 micro-batches per step, not a multiple of parallel.pp = 4"});
  i.train.global_batch = 16;
  EXPECT_NO_THROW(validate_pipeline(i, 1));
  // An automatic micro-batch is not known yet: nothing to count.
  i.train.micro_batch = 0;
  EXPECT_NO_THROW(validate_pipeline(i, 1));
}

TEST(ConfigToToml, DefaultsRoundTrip) {
  Config c;
  EXPECT_EQ(parse(to_toml(c)), c);
}

TEST(ConfigToToml, CustomValuesRoundTripExactly) {
  Config c;
  c.model.preset = "llama";
  c.model.vocab_size = 50304;
  c.model.n_kv_head = 4;
  c.model.norm_eps = 1.0 / 3.0;
  c.model.rope_theta = 1e6;
  c.optim.lr = 6e-4;
  c.optim.min_lr = 6e-5;
  c.optim.eps = 1e-300;
  c.optim.decay = "constant";
  c.optim.decay_biases = true;
  c.train.name = "quote\" back\\slash tab\t newline\n unicode é";
  c.checkpoint.resume = "runs/x/checkpoints/step_000100.h5";
  c.parallel.dp = 4;
  c.parallel.zero = 1;
  c.log.progress = "tty";
  std::string text = to_toml(c);
  EXPECT_EQ(parse(text), c) << text;
}

TEST(ConfigToToml, EveryKeyHasItsDocCommentAbove) {
  std::string text = to_toml(Config{});
  expect_contains(text, {"[model]\n", "[data]\n", "[train]\n", "[optim]\n", "[parallel]\n", "[checkpoint]\n", "[log]\n",
                         "# total optimizer steps (>= 1)\nsteps = 2000\n",
                         "# schedule from lr down to min_lr after warm-up "
                         "(one of \"cosine\", \"linear\", \"constant\")\n"
                         "decay = \"cosine\"\n",
                         "lr = 3e-4\n", "eps = 1e-8\n", "norm_eps = 1e-5\n", "init_std = 0.02\n",
                         "rope_theta = 10000.0\n", "dp = -1\n", "name = \"\"\n",
                         "decay_norms = false\n"});
}

// ---- Non-finite numbers, absurd sizes, config files that are not configs (issue #11) ----------

// Every float key, from the declaration itself (to_toml's float literals), so a new key is covered.
std::vector<std::string> float_keys() {
  std::vector<std::string> keys;
  std::istringstream lines(to_toml(Config{}));
  std::string section;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const std::string key = line.substr(0, line.find(' ')), value = line.substr(line.find('=') + 2);
    const bool number = !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '-');
    if (number && value.find_first_of(".e") != std::string::npos) keys.push_back(section + "." + key);
  }
  return keys;
}

TEST(ConfigErrors, EveryFloatKeyMustBeFinite) {
  const std::vector<std::string> keys = float_keys();
  ASSERT_GE(keys.size(), 14u);  // norm_eps ... peak_gflops: the list is derived, not empty
  for (const std::string& key : keys) {
    for (const std::string v : {"inf", "-inf", "nan"}) {
      const std::string section = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
      expect_contains(parse_error("[" + section + "]\n" + name + " = " + v + "\n"),
                      {key + " = ", "configs/x.toml:2", "is not a finite number"});
      expect_contains(parse_error("", {key + "=" + v}), {"--set " + key + "=" + v, "is not a finite number"});
    }
  }
  // The ones the issue met: each trained (or printed a negative GFLOP/s) and exited 0.
  expect_contains(parse_error("[optim]\nlr = inf\n"), {"optim.lr = inf", "must be finite and > 0"});
  expect_contains(parse_error("[log]\npeak_gflops = inf\n"), {"log.peak_gflops = inf", "must be finite and >= 0"});
  expect_contains(parse_error("[[data.train]]\npath = \"a\"\nweight = inf\n"), {"data.train[0].weight = inf"});
}

TEST(ConfigErrors, AbsurdIntegersAreRefusedWithASaneRange) {
  const std::string huge = "9223372036854775807";  // 2^63 - 1: "cannot create std::vector larger than max_size()"
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.n_layer", "in [1, 65536]"},         {"model.n_head", "in [1, 65536]"},
      {"model.n_embd", "in [1, 1048576]"},        {"model.vocab_size", "in [0, 2147483647]"},
      {"model.ffn_hidden", "in [0, 4194304]"},    {"model.max_seq_len", "in [0, 1073741824]"},
      {"train.seq_len", "in [2, 1073741824]"},    {"train.micro_batch", "in [0, 1000000000]"},
      {"train.global_batch", "in [1, 1000000000]"}, {"train.eval_batches", "in [1, 1000000]"},
      {"data.val_examples", "in [1, 1048576]"},
  };
  for (const auto& [key, range] : cases)
    expect_contains(parse_error("", {key + "=" + huge}), {key + " = " + huge, "out of range", "must be " + range});
}

TEST(ConfigErrors, SizeProductsAreCheckedBeforeUse) {
  // The tokens of the whole run: steps x global_batch x seq_len must fit 64 bits.
  expect_contains(parse_error("[train]\nsteps = 4611686018427387904\n"),
                  {"train.steps = 4611686018427387904 (configs/x.toml:2)", "train.global_batch = 32 (default)",
                   "overflow"});
  // The process grid, before its product is taken.
  expect_contains(parse_error("", {"parallel.tp=4611686018427387904", "parallel.dp=4"}),
                  {"parallel.tp x parallel.pp x parallel.cp x parallel.dp", "more than 16777216 ranks"});
  // One rank's memory estimate: (B T) x V logits of 2^30 x 2^30 x 2^31 elements.
  expect_contains(parse_error("", {"train.steps=1", "train.micro_batch=1000000000", "train.global_batch=1000000000",
                                   "train.seq_len=1073741824", "model.vocab_size=2147483647"}),
                  {"overflow 64-bit arithmetic", "train.micro_batch = 1000000000 (--set", "train.seq_len = 1073741824"});
}

TEST(ConfigLoad, RefusesDirectoriesDevicesAndHugeFilesBeforeReading) {
  TempFile f("ok.toml", "[train]\nsteps = 3\n");
  const std::string dir = std::filesystem::path(f.path()).parent_path().string();
  // A directory used to read as an empty file: the default 12-layer model trained.
  expect_contains(error_of([&] { load_config(dir); }), {"the config file " + dir + " is a directory"});
  // A character device (/dev/null reads empty; /dev/urandom would never end: tests/app/test_preflight.cpp).
  expect_contains(error_of([&] { load_config("/dev/null"); }), {"/dev/null is not a regular file"});
  const std::string big = dir + "/big.toml";
  std::ofstream(big) << std::string(static_cast<size_t>(kMaxConfigBytes) + 1, '#');
  expect_contains(error_of([&] { load_config(big); }), {big, std::to_string(kMaxConfigBytes + 1) + " bytes"});
  EXPECT_EQ(load_config(f.path()).train.steps, 3);
}

TEST(ConfigChanges, ListsTheKeysThatDifferWithBothValues) {
  Config a, b;
  EXPECT_TRUE(config_changes(a, b).empty());
  b.train.global_batch = 64;
  b.data.seed = 7;
  b.optim.lr = 1e-3;
  const auto changes = config_changes(a, b);
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "data.seed");
  EXPECT_EQ(changes[0].before, "1234");
  EXPECT_EQ(changes[0].after, "7");
  EXPECT_EQ(changes[1].key, "train.global_batch");
  EXPECT_EQ(changes[2].key, "optim.lr");
  EXPECT_EQ(changes[2].after, "0.001");
}

// ---- Integration helpers -------------------------------------------------------------------

TEST(ConfigLoad, ReadsAFileAndNamesTheRunAfterIt) {
  TempFile f("quick.toml", "[train]\nsteps = 3\n");
  Config c = load_config(f.path(), {"optim.lr=0.01"});
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.train.name, "quick");
  EXPECT_EQ(load_config(f.path(), {"train.name=mine"}).train.name, "mine");
  EXPECT_EQ(run_dir(c), "runs/quick");
  EXPECT_EQ(checkpoint_dir(c, run_dir(c)), "runs/quick/checkpoints");
  EXPECT_EQ(checkpoint_dir(c, "elsewhere"), "elsewhere/checkpoints");
  EXPECT_EQ(checkpoint_dir(c, ""), "");
  c.checkpoint.dir = "/ckpt";
  EXPECT_EQ(checkpoint_dir(c, run_dir(c)), "/ckpt");
}

TEST(ConfigLoad, ErrorsNameThePathGiven) {
  TempFile f("bad.toml", "[train]\n\nstpes = 3\n");
  expect_contains(error_of([&] { load_config(f.path()); }), {"unknown key train.stpes in " + f.path() + ":3"});
  expect_contains(error_of([&] { load_config("/nonexistent/x.toml"); }),
                  {"cannot open config file /nonexistent/x.toml"});
}

TEST(ConfigModel, MapsAndResolvesTheModel) {
  Config c;
  c.model.n_layer = 2;
  c.model.n_embd = 64;
  c.model.n_head = 4;
  c.train.seq_len = 16;
  ModelConfig m = to_model_config(c, 13);
  EXPECT_EQ(m.vocab_size, 13);
  EXPECT_EQ(m.max_seq_len, 16);
  EXPECT_EQ(m.n_layer, 2);
  EXPECT_EQ(m.ffn_hidden, 4 * 64);  // resolved from the preset
  EXPECT_EQ(m.norm, NormKind::LayerNorm);
  c.model.vocab_size = 16;
  c.model.max_seq_len = 32;
  c.model.preset = "llama";
  m = to_model_config(c, 13);
  EXPECT_EQ(m.vocab_size, 16);
  EXPECT_EQ(m.max_seq_len, 32);
  EXPECT_EQ(m.position, PositionKind::Rope);
  expect_contains(error_of([&] { to_model_config(c, 20); }), {"model.vocab_size = 16", "20 tokens"});
  c.model.vocab_size = 0;
  expect_contains(error_of([&] { to_model_config(c, 0); }), {"model.vocab_size = 0"});
}

TEST(ConfigModel, RecomputePolicyPerLayer) {
  Config c;
  c.model.n_layer = 3;
  EXPECT_EQ(recompute_policy(c), std::vector<Recompute>(3, Recompute::None));
  c.model.recompute = "full";
  EXPECT_EQ(recompute_policy(c), std::vector<Recompute>(3, Recompute::Full));
  c.model.recompute = "selective";
  EXPECT_EQ(recompute_policy(c), std::vector<Recompute>(3, Recompute::Selective));
  // model.recompute_layers: the first blocks of the model (pp = 1), or of each pipeline chunk, all
  // of a chunk's when it has fewer.
  const Recompute N = Recompute::None, S = Recompute::Selective, F = Recompute::Full;
  c.model.recompute_layers = 1;
  EXPECT_EQ(recompute_policy(c), (std::vector<Recompute>{F, S, S}));
  c.model.n_layer = 5;
  c.model.recompute = "none";
  c.model.recompute_layers = 2;
  const std::vector<StageSpec> cut = {StageSpec{0, 1, true, false}, StageSpec{1, 5, false, true}};
  EXPECT_EQ(recompute_policy(c, cut), (std::vector<Recompute>{F, F, F, N, N}));
  EXPECT_EQ(recompute_policy(c, {cut[1]}), (std::vector<Recompute>{N, F, F, N, N}));  // a rank's own chunks
  // "bubble": full recomputation, run by the pipeline schedule's R actions when there is a pipeline.
  c.model.recompute = "bubble";
  c.model.recompute_layers = 0;
  EXPECT_EQ(recompute_policy(c), std::vector<Recompute>(5, Recompute::Full));
  EXPECT_FALSE(recompute_in_bubbles(c)) << "pp = 1: the one-stage schedule, recomputed inside backward";
  c.parallel.pp = 2;
  EXPECT_TRUE(recompute_in_bubbles(c));
  c.model.recompute = "full";
  EXPECT_FALSE(recompute_in_bubbles(c));
  EXPECT_NO_THROW(parse("[model]\nrecompute = \"bubble\"\n"));
}

TEST(ConfigModel, RecomputeKeysAreChecked) {
  expect_contains(parse_error("[model]\nrecompute = \"partial\"\n"),
                  {"model.recompute", "\"partial\"", "\"none\", \"selective\", \"full\""});
  expect_contains(parse_error("[model]\nrecompute_layers = -1\n"), {"model.recompute_layers = -1", "[0, 65536]"});
  expect_contains(parse_error("[model]\nn_layer = 3\nrecompute_layers = 4\n"),
                  {"model.recompute_layers = 4 (configs/x.toml:3)", "model.n_layer = 3 (configs/x.toml:2)"});
  EXPECT_NO_THROW(parse("[model]\nn_layer = 3\nrecompute = \"selective\"\nrecompute_layers = 3\n"));
  // model.recompute_ahead: at least 0, and only where there are R actions to place.
  expect_contains(parse_error("[model]\nrecompute = \"bubble\"\nrecompute_ahead = -1\n"),
                  {"model.recompute_ahead = -1"});
  expect_contains(parse_error("[model]\nrecompute = \"full\"\nrecompute_ahead = 2\n"),
                  {"model.recompute_ahead = 2 (configs/x.toml:3)", "model.recompute = \"full\" (configs/x.toml:2)",
                   "set model.recompute = \"bubble\""});
  EXPECT_NO_THROW(parse("[model]\nrecompute = \"bubble\"\nrecompute_ahead = 0\n"));
  EXPECT_NO_THROW(parse("[model]\nrecompute = \"bubble\"\nrecompute_ahead = 3\n"));
}

// model.activation_compression* (model/compression_policy.h): each bad value names its key and
// value; compression in a recomputing block and on CUDA is refused; the policy is one entry per layer.
TEST(ConfigModel, ActivationCompressionKeysAreChecked) {
  expect_contains(parse_error("[model]\nactivation_compression = \"int4\"\n"),
                  {"model.activation_compression = \"int4\"", "\"none\", \"bf16\", \"int8\", \"lowrank\""});
  expect_contains(parse_error("[model]\nactivation_compression_rank = 0\n"), {"model.activation_compression_rank = 0"});
  expect_contains(parse_error("[model]\nn_layer = 2\nactivation_compression_layers = [\"int8\", \"fp8\"]\n"),
                  {"model.activation_compression_layers[1] = \"fp8\""});
  expect_contains(parse_error("[model]\nn_layer = 3\nactivation_compression_layers = [\"int8\"]\n"),
                  {"model.activation_compression_layers has 1 entries", "model.n_layer = 3"});
  expect_contains(parse_error("[model]\nrecompute = \"selective\"\nactivation_compression = \"int8\"\n"),
                  {"model.activation_compression = \"int8\" on layer 0", "selective"});
  expect_contains(parse_error("[model]\nrecompute_layers = 1\nactivation_compression = \"bf16\"\n"),
                  {"model.activation_compression = \"bf16\" on layer 0", "full"});
  expect_contains(parse_error("[model]\nactivation_compression = \"lowrank\"\n[train]\ndevice = \"cuda\"\n"),
                  {"model.activation_compression is not built for train.device = \"cuda\""});
  const Config c = parse("[model]\nn_layer = 3\nrecompute_layers = 1\nactivation_compression_layers = [\"none\", "
                         "\"int8\", \"lowrank\"]\nactivation_compression_rank = 4\n");
  const std::vector<ActivationCompression> policy = activation_compression_policy(c);
  ASSERT_EQ(policy.size(), 3u);
  EXPECT_EQ(policy[0].method, CompressionMethod::None);
  EXPECT_EQ(policy[1].method, CompressionMethod::Int8);
  EXPECT_EQ(policy[2], (ActivationCompression{CompressionMethod::LowRank, 4}));
  EXPECT_EQ(activation_compression_policy(Config{}).size(), 12u);
  EXPECT_FALSE(any_compression(activation_compression_policy(Config{})));
}

// model.recompute_ops* (model/recompute_ops.h): names checked with their key; what does not combine
// with them refused naming both keys; the policy per layer, empty on the layers that recompute fully.
TEST(ConfigModel, RecomputeOpsKeysAreChecked) {
  auto parse = [](std::vector<std::string> sets) { return parse_config_string("", "t.toml", sets); };
  EXPECT_TRUE(testing::throws_with([&] { parse({"model.recompute_ops=[\"norm\", \"softmax\"]"}); },
                                   {"model.recompute_ops[1] = \"softmax\" is not an op"}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"model.n_layer=2", "model.recompute_ops_layers=[\"qkv\"]"}); },
                                   {"model.recompute_ops_layers has 1 entries", "model.n_layer = 2"}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"model.recompute_ops=[\"qkv\"]", "model.recompute=\"selective\""}); },
                                   {"model.recompute_ops (qkv)", "model.recompute = \"selective\""}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"model.recompute_ops=[\"attn\"]", "parallel.layout=\"auto\""}); },
                                   {"model.recompute_ops (attn)", "parallel.layout = \"auto\""}));
  EXPECT_TRUE(testing::throws_with(
      [&] { parse({"model.n_layer=2", "model.recompute_ops_layers=[\"none\", \"norm\"]",
                   "model.activation_compression=\"int8\""}); },
      {"model.recompute_ops_layers recomputes \"norm\" on layer 1", "model.activation_compression compresses (\"int8\")"}));
  // qkv and mlp_in beside chunked edges: recomputed chunk by chunk (model/gpt.cpp).
  EXPECT_NO_THROW(parse({"model.recompute_ops=[\"mlp_in\", \"qkv\"]", "parallel.tp=2", "parallel.sequence_parallel=true",
                         "parallel.tp_overlap_chunks=2"}));
  EXPECT_NO_THROW(parse({"model.recompute_ops=[\"attn\", \"selective\"]", "parallel.tp=2",
                         "parallel.sequence_parallel=true", "parallel.tp_overlap_chunks=2"}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"model.recompute_ops=[\"attn\"]", "parallel.cp=2"}); },
                                   {"model.recompute_ops (attn)", "parallel.cp = 2"}));
  EXPECT_NO_THROW(parse({"model.recompute_ops=[\"selective\"]", "parallel.cp=2"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { parse({"model.recompute_ops=[\"qkv\"]", "parallel.tp=2", "parallel.tp_comm_compression=\"int8-ef\""}); },
      {"model.recompute_ops (qkv)", "parallel.tp_comm_compression_forward = \"int8-ef\""}));
  EXPECT_NO_THROW(parse({"model.recompute_ops=[\"attn\"]", "parallel.tp=2", "parallel.tp_comm_compression=\"int8-ef\""}));
  EXPECT_TRUE(testing::throws_with([&] { parse({"model.recompute_ops=[\"qkv\"]", "lora.rank=4"}); },
                                   {"model.recompute_ops (qkv)", "lora.rank = 4"}));
  const Config c = parse({"model.n_layer=3", "model.recompute_layers=1",
                          "model.recompute_ops_layers=[\"all\", \"norm+qkv\", \"none\"]"});
  const std::vector<RecomputeOps> ops = recompute_ops_policy(c);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0], RecomputeOps{}) << "layer 0 recomputes fully (model.recompute_layers)";
  EXPECT_EQ(ops[1], (RecomputeOps{true, true, false, false, false}));
  EXPECT_EQ(ops[2], RecomputeOps{});
  EXPECT_EQ(recompute_ops_policy(Config{}), std::vector<RecomputeOps>(12));
}

// ---- Documentation -------------------------------------------------------------------------

TEST(ConfigDocs, AllowedDescribesItself) {
  EXPECT_EQ(Allowed::at_least(1).describe(), ">= 1");
  EXPECT_EQ(Allowed::greater_than(0).describe(), "> 0");
  EXPECT_EQ(Allowed::half_open(0, 1).describe(), "in [0, 1)");
  EXPECT_EQ(Allowed::at_least(1).or_value(-1).describe(), "-1 or >= 1");
  EXPECT_EQ(Allowed::greater_than(0.5).describe(), "> 0.5");
  EXPECT_EQ(Allowed::one_of({"a", "b"}).describe(), "one of \"a\", \"b\"");
  EXPECT_EQ(Allowed::any().describe(), "");
  EXPECT_EQ(Allowed::at_least(1).at_most(65536).describe(), "in [1, 65536]");
  EXPECT_EQ(Allowed::greater_than(0).at_most(4).describe(), "in (0, 4]");
  EXPECT_EQ(Allowed::at_least(1).at_most(8).or_value(-1).describe(), "-1 or in [1, 8]");
  EXPECT_FALSE(Allowed::any().accepts(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(Allowed::any().accepts(std::nan("")));
}

TEST(ConfigDocs, DocsConfigMdContainsTheGeneratedReference) {
  const std::string path = std::string(TESSERA_TEST_DATA_DIR) + "/../../docs/config.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string expected = config_reference_markdown();
  if (std::getenv("TESSERA_UPDATE_DOCS") && doc.str().find(expected) == std::string::npos) {
    // Regenerate: TESSERA_UPDATE_DOCS=1 build/tests/tests_app --gtest_filter='ConfigDocs.*'
    const std::string begin = "<!-- BEGIN GENERATED: config_reference_markdown(), do not edit by hand -->",
                      end = "<!-- END GENERATED -->";
    std::string text = doc.str();
    const size_t b = text.find(begin), e = text.find(end);
    ASSERT_TRUE(b != std::string::npos && e != std::string::npos) << "markers missing in " << path;
    text = text.substr(0, b + begin.size()) + "\n" + expected + text.substr(e);
    std::ofstream(path) << text;
    doc.str(text);
  }
  EXPECT_NE(doc.str().find(expected), std::string::npos)
      << "docs/config.md is out of date; regenerate it with\n"
      << "  TESSERA_UPDATE_DOCS=1 build/tests/tests_app --gtest_filter='ConfigDocs.*'\nor paste:\n"
      << expected;
  std::istringstream lines(to_toml(Config{}));  // every key of the table, as "key = value" lines
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#' || line[0] == '[') continue;
    std::string key = line.substr(0, line.find(' '));
    EXPECT_NE(doc.str().find("| `" + key + "` |"), std::string::npos) << key << " missing from docs/config.md";
  }
}

}  // namespace
}  // namespace tessera
