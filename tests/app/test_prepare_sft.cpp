// Tests `tessera prepare --sft` (app/prepare_sft.h) by running the binary: records to documents
// whose loss mask lines up with the responses, packing with document boundaries, file:line errors,
// --on-error skip counting, and templates the tokenizer cannot write refused.
#include "app/prepare_sft.h"
#include "app/evaluate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_testing.h"
#include "data/dataset.h"
#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "golden_config.h"
#include "h5_reader.h"
#include "model/gpt.h"
#include "data/temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::TempDir;

void write_text(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

RunResult run_prepare(std::vector<std::string> args, const TempDir& dir) {
  args.insert(args.begin(), "prepare");
  RunResult r = testing::run_tessera(args, dir.path());
  fs::remove(dir.path() / "output.txt");
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each document as text (byte ids as bytes, 256 as "|") and its mask as a string of 0/1.
struct Doc {
  std::string text, mask;
};
std::vector<Doc> documents(const std::string& prefix) {
  IndexedDataset ds(prefix);
  auto mask = open_loss_mask(prefix, ds.num_tokens());
  EXPECT_NE(mask, nullptr) << prefix << ".mask missing";
  std::vector<Doc> docs;
  for (int64_t d = 0; d < ds.num_documents() && mask; ++d) {
    const TokenSpan t = ds.document(d);
    std::vector<uint8_t> flags(size_t(t.size()));
    mask->read(ds.document_token_offset(d), t.size(), flags.data());
    Doc doc;
    for (int64_t i = 0; i < t.size(); ++i) {
      doc.text += t[i] == 256 ? '|' : static_cast<char>(t[i]);
      doc.mask += flags[size_t(i)] ? '1' : '0';
    }
    docs.push_back(doc);
  }
  return docs;
}

const char* kRecords =
    "{\"prompt\": \"1+1=\", \"response\": \"2\"}\n"
    "\n"
    "{\"prompt\": \"Q: hi\\n\", \"response\": \"A: hello\"}\n"
    "{\"prompt\": \"\", \"response\": \"xy\"}\n";

TEST(PrepareSft, PromptResponseRecordsWithTheirMask) {
  TempDir dir("sft_basic");
  write_text(dir / "r.jsonl", kRecords);
  const RunResult r = run_prepare({"--sft", dir / "r.jsonl", "--tokenizer", "byte", "--out", dir / "out/d"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<Doc> docs = documents(dir / "out/d");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "1+1=2|");
  EXPECT_EQ(docs[0].mask, "000011");
  EXPECT_EQ(docs[1].text, "Q: hi\nA: hello|");
  EXPECT_EQ(docs[1].mask, "000000111111111");
  EXPECT_EQ(docs[2].text, "xy|");
  EXPECT_EQ(docs[2].mask, "111");
  EXPECT_TRUE(contains(r.output, "3 records")) << r.output;
  EXPECT_TRUE(contains(r.output, "24 tokens, 14 trained")) << r.output;
  EXPECT_TRUE(contains(r.output, dir / "out/d.mask")) << r.output;
}

// Records packed into windows: the targets outside the responses are ignored, and the document
// mask (data.document_mask) starts a new document after each record's end-of-document id.
TEST(PrepareSft, PackedRecordsKeepTheirBoundariesAndMask) {
  TempDir dir("sft_pack");
  write_text(dir / "r.jsonl", kRecords);
  ASSERT_EQ(run_prepare({"--sft", dir / "r.jsonl", "--tokenizer", "byte", "--out", dir / "d"}, dir).exit_code, 0);
  TokenWindowDataset ds(open_token_segments({dir / "d"}), 23, 257);  // all 24 tokens in one window
  const Batch b = make_batch(ds, {0});
  std::string targets;
  for (int32_t t : b.targets) targets += t == kIgnoreTarget ? '.' : t == 256 ? '|' : static_cast<char>(t);
  // Window "1+1=2|Q: hi\nA: hello|xy|"; target k is token k + 1.
  EXPECT_EQ(targets, "...2|......A: hello|xy|");
  const std::vector<int32_t> starts = document_starts(b.tokens.data(), b.T, 256);
  EXPECT_EQ(starts[0], 0);
  EXPECT_EQ(starts[5], 0);    // the first record's end-of-document id belongs to it
  EXPECT_EQ(starts[6], 6);    // "Q" starts the second record
  EXPECT_EQ(starts[20], 6);
  EXPECT_EQ(starts[21], 21);  // "x" starts the third
}

TEST(PrepareSft, BadRecordNamesFileAndLineAndWritesNothing) {
  TempDir dir("sft_bad");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"a\", \"response\": \"b\"\n", "malformed JSON"},
      {"{\"prompt\": \"a\"}\n", "no \"response\" string"},
      {"{\"prompt\": \"a\", \"response\": 5}\n", "\"response\" must be a string, got an integer"},
      {"{\"messages\": [{\"role\": \"bot\", \"content\": \"b\"}]}\n", "unknown role \"bot\""},
      {"{\"prompt\": \"a\", \"response\": \"\"}\n", "empty response"},
  };
  for (const auto& [line, message] : cases) {
    write_text(dir / "r.jsonl", std::string(kRecords) + line);
    const RunResult r = run_prepare({"--sft", dir / "r.jsonl", "--tokenizer", "byte", "--out", dir / "d"}, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, dir / "r.jsonl:5: ")) << r.output;
    EXPECT_TRUE(contains(r.output, message)) << r.output;
    EXPECT_FALSE(fs::exists(dir / "d.bin") || fs::exists(dir / "d.mask")) << line;
  }
}

TEST(PrepareSft, SkipCountsBadRecords) {
  TempDir dir("sft_skip");
  write_text(dir / "r.jsonl", std::string(kRecords) + "{\"prompt\": \"a\"}\nnot json\n{\"prompt\": \"p\", \"response\": \"r\"}\n");
  for (const char* mode : {"refuse", "fail"}) {
    const RunResult r =
        run_prepare({"--sft", dir / "r.jsonl", "--tokenizer", "byte", "--out", dir / "d", "--on-error", mode}, dir);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, dir / "r.jsonl:5")) << r.output;
  }
  const RunResult r =
      run_prepare({"--sft", dir / "r.jsonl", "--tokenizer", "byte", "--out", dir / "d", "--on-error", "skip"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "4 records")) << r.output;
  EXPECT_TRUE(contains(r.output, "skipped 2 records (--on-error skip); the first: " + dir / "r.jsonl:5:")) << r.output;
  EXPECT_TRUE(contains(r.output, "prepare: skipped " + dir / "r.jsonl:6: malformed JSON")) << r.output;
  EXPECT_EQ(documents(dir / "d").back().text, "pr|");
}

TEST(PrepareSft, ChatTemplatesNeedTheTokenizersSpecialTokens) {
  TempDir dir("sft_template");
  write_text(dir / "m.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, "
                              "{\"role\": \"assistant\", \"content\": \"a\"}]}\n");
  RunResult r = run_prepare(
      {"--sft", dir / "m.jsonl", "--tokenizer", "byte", "--out", dir / "d", "--chat-template", "chatml"}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "chat template chatml writes the special token <|im_start|>, which the byte "
                                 "tokenizer does not have")) << r.output;
  // A conversation without a template: refused naming the line (one user and one assistant
  // message is a prompt and a response, which plain takes).
  r = run_prepare({"--sft", dir / "m.jsonl", "--tokenizer", "byte", "--out", dir / "d"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents(dir / "d")[0].mask, "011");
  write_text(dir / "m.jsonl", "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
                              "{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n");
  r = run_prepare({"--sft", dir / "m.jsonl", "--tokenizer", "byte", "--out", dir / "d2"}, dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, dir / "m.jsonl:1: the plain template takes a prompt and a response")) << r.output;
  r = run_prepare({"--sft", dir / "m.jsonl", "--input", dir / "m.jsonl", "--tokenizer", "byte", "--out", dir / "d"},
                  dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "excludes")) << r.output;
}

// ---- against PyTorch (tests/reference/make_sft_golden.py) ----

const char* kSftGolden = TESSERA_TEST_DATA_DIR "/sft_golden.h5";

// The fixture's records through `prepare --sft` (in process), opened as training opens them.
std::unique_ptr<TokenWindowDataset> prepared_golden_dataset(const testing::H5Reader& f, const TempDir& dir, int64_t T) {
  write_text(dir / "records.jsonl", f.attr_string("/", "records"));
  PrepareSftArgs a;
  a.inputs = {dir / "records.jsonl"};
  a.tokenizer = "byte";
  a.out = dir / "sft";
  std::ostringstream log;
  EXPECT_EQ(run_prepare_sft(a, log), 0);
  return std::make_unique<TokenWindowDataset>(open_token_segments({a.out}), T, 257);
}

// Its first B windows as the trainer batches them (data.document_mask): the tokens, the ignored
// targets and the document starts that PyTorch's script made independently.
Batch golden_batch(const TokenWindowDataset& ds, int64_t B) {
  std::vector<int64_t> indices(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) indices[size_t(i)] = i;
  Batch b = make_batch(ds, indices);
  mark_documents(b, ByteTokenizer().eot_id());
  return b;
}

std::vector<int32_t> ids_of(const testing::H5Reader& f, const std::string& name) {
  std::vector<int32_t> v = f.read<int32_t>(name).values;
  std::replace(v.begin(), v.end(), -100, kIgnoreTarget);  // PyTorch's ignore_index is tessera's -1
  return v;
}

// The mean loss over the batch's trained targets (LossSums) after a forward; with backward, its
// gradient in ps's gradients.
double masked_loss(const Gpt& gpt, ParameterStore& ps, Allocator& alloc, Batch& b, bool backward) {
  const SequenceLayout seq = SequenceLayout::contiguous(b.T).with_documents(b.B, b.doc_start);
  GptCtx ctx;
  gpt.forward(testing::kCpu, ctx, alloc, Tensor(b.tokens.data(), DType::I32, {b.B, b.T}),
              Tensor(b.targets.data(), DType::I32, {b.B, b.T}), seq);
  const LossSums sums = read_loss_sums(testing::kCpu, ctx.loss_sums);
  if (backward) {
    ps.zero_grads(testing::kCpu);
    gpt.backward(testing::kCpu, ctx, alloc, 1.0 / static_cast<double>(sums.targets));
  }
  return sums.mean();
}

// f64 throughout, so the tolerances of tests/model/test_gpt.cpp's f64 goldens (1e-12 on the loss,
// 1e-10 on the gradients relative to the largest) hold: the two differ in summation order only.
// The LLaMA-3 template with a Hugging Face tokenizer.json that has its special tokens (the
// LLaMA-3-style fixture of tests/reference/make_hf_tokenizers.py): the template's tokens are single
// special ids, and the mask covers the answer and its <|eot_id|> only.
TEST(PrepareSft, Llama3TemplateWithATokenizerJson) {
  TempDir dir("sft_llama3_json");
  const std::string tokenizer = std::string(TESSERA_TEST_DATA_DIR) + "/hf_tokenizers/llama3_style.json";
  write_text(dir / "m.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, "
                              "{\"role\": \"assistant\", \"content\": \"Four.\"}]}\n");
  const RunResult r = run_prepare(
      {"--sft", dir / "m.jsonl", "--tokenizer", tokenizer, "--out", dir / "d", "--chat-template", "llama3"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(tokenizer, "");
  IndexedDataset ds(dir / "d");
  ASSERT_EQ(ds.num_documents(), 1);
  const TokenSpan t = ds.document(0);
  std::vector<int32_t> ids(size_t(t.size()));
  for (int64_t i = 0; i < t.size(); ++i) ids[size_t(i)] = int32_t(t[i]);
  std::vector<uint8_t> flags(ids.size());
  open_loss_mask(dir / "d", ds.num_tokens())->read(0, t.size(), flags.data());
  const std::string rendered =
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nFour.<|eot_id|>";
  EXPECT_EQ(tok->decode(ids).substr(0, rendered.size()), rendered);
  EXPECT_EQ(ids.front(), *tok->special_token_id("<|begin_of_text|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok->special_token_id("<|eot_id|>")), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok->special_token_id("<|start_header_id|>")), 2);
  std::vector<int32_t> trained;
  for (size_t i = 0; i < ids.size(); ++i)
    if (flags[i]) trained.push_back(ids[i]);
  const std::string answer = tok->decode(trained);
  EXPECT_EQ(answer.substr(0, std::string("Four.<|eot_id|>").size()), "Four.<|eot_id|>") << answer;
  EXPECT_EQ(std::count(trained.begin(), trained.end(), *tok->special_token_id("<|eot_id|>")), 1);
}

TEST(PrepareSft, MaskedLossMatchesPyTorchIgnoreIndex) {
  testing::H5Reader f(kSftGolden);
  TempDir dir("sft_golden");
  for (const std::string preset : {"gpt2", "llama"}) {
    const int64_t B = f.attr_int(preset, "batch"), T = f.attr_int(preset, "seq_len");
    const auto ds = prepared_golden_dataset(f, dir, T);
    Batch b = golden_batch(*ds, B);
    ASSERT_EQ(b.tokens, ids_of(f, preset + "/tokens"));
    ASSERT_EQ(b.targets, ids_of(f, preset + "/targets"));
    ASSERT_EQ(b.doc_start, ids_of(f, preset + "/doc_start"));

    Allocator alloc;
    ParameterStore ps(alloc, DType::F64);
    Gpt gpt(testing::golden_model_config(f, preset), ps);
    ps.finalize();
    for (int id = 0; id < ps.size(); ++id) {
      const auto a = f.read<double>(preset + "/params/" + ps.entry(id).spec.name);
      ASSERT_EQ(static_cast<int64_t>(a.values.size()), ps.entry(id).local_shape.numel());
      std::copy(a.values.begin(), a.values.end(), ps.param(id).ptr<double>());
    }
    const double loss = masked_loss(gpt, ps, alloc, b, true);
    const double want = f.read<double>(preset + "/loss").values[0];
    EXPECT_NEAR(loss, want, 1e-12 * want) << preset;
    double scale = 0, diff = 0;
    for (int id = 0; id < ps.size(); ++id) {
      const auto g = f.read<double>(preset + "/grads/" + ps.entry(id).spec.name).values;
      const double* got = ps.grad(id).ptr<double>();
      for (size_t i = 0; i < g.size(); ++i) {
        scale = std::max(scale, std::abs(g[i]));
        diff = std::max(diff, std::abs(got[i] - g[i]));
      }
    }
    EXPECT_LT(diff / scale, 1e-10) << preset;
    // Validation reads the same windows and gives the same masked mean.
    const std::optional<double> val = validation_loss(testing::kCpu, gpt, alloc, *ds, 1, B, {}, {},
                                                      ByteTokenizer().eot_id());
    ASSERT_TRUE(val.has_value());
    EXPECT_NEAR(*val, want, 1e-12 * want) << preset << " validation";

    // Finite differences of the masked mean loss at three entries of each parameter: central,
    // h = 1e-5, so truncation (~h^2 times the third derivative) and rounding (~1e-16 / h) stay
    // far below 1e-6 of the largest gradient.
    for (int id = 0; id < ps.size(); ++id) {
      double* p = ps.param(id).ptr<double>();
      const double* g = ps.grad(id).ptr<double>();
      const int64_t n = ps.entry(id).local_shape.numel();
      for (int64_t i : {int64_t(0), n / 2, n - 1}) {
        const double keep = p[i], h = 1e-5;
        p[i] = keep + h;
        const double up = masked_loss(gpt, ps, alloc, b, false);
        p[i] = keep - h;
        const double down = masked_loss(gpt, ps, alloc, b, false);
        p[i] = keep;
        EXPECT_NEAR((up - down) / (2 * h), g[i], 1e-6 * scale)
            << preset << " " << ps.entry(id).spec.name << "[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace tessera
