// Tests `tessera ckpt inspect` and `tessera ckpt export` through the binary, on checkpoints of
// tiny GPT-2 and LLaMA models written from a real ParameterStore. The exported safetensors file is
// checked by an independent reader (tests/reference/read_safetensors.py: numpy + json), which
// applies the documented Hugging Face mapping to tessera's tensors (saved here as .npy) itself;
// the exported tokenizer by tests/reference/check_hf_tokenizer.py (transformers' AutoTokenizer
// where installed, else a re-implementation of its GPT2Tokenizer) against tiktoken's ids.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/hdf5.h"
#include "kernels/allocator.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "app/checkpoint/checkpoint_testing.h"
#include "app/cli_testing.h"
#include "mpi_testing.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

namespace fs = std::filesystem;
using testing::temp_dir;
using testing::test_world;

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs a shell command line with stdout and stderr captured in dir.
CommandResult run(const std::string& command, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const int status = std::system((command + " > " + out.string() + " 2> " + err.string()).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_file(out), testing::read_file(err)};
}

CommandResult tessera(const std::string& args, const fs::path& dir) {
  return run(std::string(TESSERA_BINARY) + " " + args, dir);
}

// A .npy file (format 1.0): magic, header dict padded to 64 bytes, little-endian float32 data.
void write_npy(const fs::path& path, const Shape& shape, const float* data) {
  std::string dims;
  for (int i = 0; i < shape.ndim(); ++i) dims += std::to_string(shape[i]) + ",";
  if (shape.ndim() > 1) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.resize(((10 + header.size() + 1 + 63) / 64) * 64 - 10 - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(magic), 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(shape.numel() * 4));
}

// A tiny model with every parameter distinct (biases and norms too, so that a swapped or
// misplaced tensor shows), written as a checkpoint and as one .npy per parameter.
class TinyCheckpoint {
 public:
  TinyCheckpoint(const ModelConfig& cfg, const std::string& config_toml, const fs::path& dir)
      : ps_(alloc_, DType::F32), model_(cfg, ps_) {
    ps_.finalize();
    ps_.initialize(kCpu, 1234);
    float* p = ps_.flat_params().ptr<float>();
    for (int64_t i = 0; i < ps_.numel(); ++i) p[i] += 0.001f * static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    file_ = dir / "step_000010.h5";
    npy_dir_ = dir / "npy";
    fs::create_directories(npy_dir_);
    std::vector<TensorSlice> slices;
    for (int id = 0; id < ps_.size(); ++id) {
      const ParamEntry& e = ps_.entry(id);
      const float* data = ps_.param(id).ptr<float>();
      slices.push_back({"/model/" + e.spec.name, e.spec.global_shape, -1, 0, e.spec.global_shape, data, true});
      write_npy(npy_dir_ / (e.spec.name + ".npy"), e.spec.global_shape, data);
    }
    CheckpointMeta meta;
    meta.step = 10;
    meta.tokens_seen = 1920;
    meta.consumed_samples = 80;
    meta.config_toml = config_toml;
    meta.extra["train_seed"] = int64_t{1234};
    write_checkpoint_file(file_.string(), meta, slices, test_world(), {{"/optim", {{"step", int64_t{10}}}}});
  }
  const fs::path& file() const { return file_; }
  const fs::path& npy_dir() const { return npy_dir_; }
  const ParameterStore& params() const { return ps_; }

 private:
  Allocator alloc_;
  ParameterStore ps_;
  Gpt model_;
  fs::path file_, npy_dir_;
};

ModelConfig gpt2_config() {
  ModelConfig c;
  c.preset = "gpt2";
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.max_seq_len = 12;
  return c;
}

// vocab_size and max_seq_len = 0: the export takes them from wte.weight and wpe.weight.
const char* kGpt2Toml = R"([model]
preset = "gpt2"
vocab_size = 0
n_layer = 2
n_head = 2
n_embd = 16
max_seq_len = 0
)";

ModelConfig llama_config() {
  ModelConfig c;
  c.preset = "llama";
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.max_seq_len = 24;
  return c;
}

// max_seq_len = 0 means train.seq_len; ffn_hidden = 0 the preset default (8/3 x 16 -> 64).
const char* kLlamaToml = R"([model]
preset = "llama"
vocab_size = 40
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 16
max_seq_len = 0
rope_theta = 500000.0

[train]
seq_len = 24
)";

std::string format_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

TEST(CkptCommands, InspectPrintsMetadataAndEveryTensor) {
  const fs::path dir = temp_dir("ckpt_inspect");
  TinyCheckpoint ckpt(gpt2_config(), kGpt2Toml, dir);
  const CommandResult r = tessera("ckpt inspect " + ckpt.file().string(), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("format version    1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step              10\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens seen       1,920\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("consumed samples  80\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/meta train_seed  1234\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/optim step       10\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[model]"), std::string::npos) << "config shown without --config";
  const ParameterStore& ps = ckpt.params();
  for (int id = 0; id < ps.size(); ++id) {
    const ParamEntry& e = ps.entry(id);
    double sum = 0;
    const float* p = ps.param(id).ptr<float>();
    for (int64_t i = 0; i < e.local_shape.numel(); ++i) sum += static_cast<double>(p[i]) * p[i];
    // One line per tensor: its name, shape, dtype and norm, in that order.
    const size_t at = r.out.find("/model/" + e.spec.name + " ");
    ASSERT_NE(at, std::string::npos) << e.spec.name << "\n" << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(e.spec.global_shape.str() + " "), std::string::npos) << line;
    EXPECT_NE(line.find("float32"), std::string::npos) << line;
    EXPECT_NE(line.find(" " + format_g(std::sqrt(sum))), std::string::npos) << line;
  }
  ASSERT_EQ(ps.numel(), 7424);
  EXPECT_NE(r.out.find("/model parameters: 7,424 (7.4K)\n"), std::string::npos) << r.out;

  const CommandResult with_config = tessera("ckpt inspect --config " + ckpt.file().string(), dir);
  EXPECT_NE(with_config.out.find(kGpt2Toml), std::string::npos) << with_config.out;
}

TEST(CkptCommands, InspectReportsABadFileInOneLine) {
  const fs::path dir = temp_dir("ckpt_inspect_bad");
  std::ofstream(dir / "bad.h5") << "garbage";
  const CommandResult r = tessera("ckpt inspect " + (dir / "bad.h5").string(), dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("tessera: error: " + (dir / "bad.h5").string() +
                            " is not a readable HDF5 file (truncated or not a checkpoint)",
                        0),
            0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A checkpoint whose one tensor, /model/long (rows, cols), is declared (chunked as tessera writes)
// but never written: HDF5 reads fill values (zeros), so a huge tensor costs no disk.
void write_unwritten_checkpoint(const fs::path& file, hsize_t rows, hsize_t cols) {
  H5PropList fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110);
  H5File f(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  ASSERT_TRUE(f.valid());
  H5Group meta(H5Gcreate2(f.get(), "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  for (const char* key : {"format_version", "step", "tokens_seen", "consumed_samples"})
    h5_write_attribute(meta.get(), key, int64_t{1}, "/meta");
  h5_write_attribute(meta.get(), "tessera_version", std::string(TESSERA_VERSION), "/meta");
  h5_write_attribute(meta.get(), "config", std::string("[train]\n"), "/meta");
  H5Group model(H5Gcreate2(f.get(), "/model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  const hsize_t dims[2] = {rows, cols}, chunk[2] = {1, std::min<hsize_t>(cols, hsize_t{1} << 18)};
  H5Space space(H5Screate_simple(2, dims, nullptr));
  H5PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl.get(), 2, chunk);
  H5Dataset ds(H5Dcreate2(f.get(), "/model/long", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  ASSERT_TRUE(ds.valid());
}

// inspect reads in blocks of at most 64 MiB, also when one row is longer than that (then in flat
// ranges): here one row of 2^28 floats (1 GiB), and the largest resident size of any child this
// test binary has waited for (getrusage(RUSAGE_CHILDREN): the tiny training runs of other tests
// stay far below) must stay under 600 MiB. It used to read a whole row at once (found by
// tests/fuzz's checkpoint_objects target: a declared (3, 2^30) tensor made inspect allocate
// 12 GiB). Resident, not address-space, size: a CUDA build maps several hundred MiB of libraries.
TEST(CkptCommands, InspectReadsRowsLongerThanItsBlockInBoundedMemory) {
  const fs::path dir = temp_dir("ckpt_inspect_long_rows");
  const fs::path file = dir / "long.h5";
  write_unwritten_checkpoint(file, 1, hsize_t{1} << 28);
  const CommandResult r = run(std::string(TESSERA_BINARY) + " ckpt inspect " + file.string(), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("/model/long  (1, 268435456)  float32  0\n"), std::string::npos) << r.out;
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &usage), 0);
  EXPECT_LT(usage.ru_maxrss, 600 * 1024) << "KiB resident at most in a child";
}

// Runs the independent reader; skips when Debian's python3-numpy is not installed.
void check_with_python(const fs::path& export_dir, const TinyCheckpoint& ckpt, const std::string& preset,
                       const std::string& expected_config, const fs::path& dir) {
  if (!fs::exists("/usr/bin/python3") || run("/usr/bin/python3 -c 'import numpy'", dir).exit_code != 0)
    GTEST_SKIP() << "/usr/bin/python3 with numpy is needed for the independent safetensors check";
  const std::string script = std::string(TESSERA_TEST_DATA_DIR) + "/read_safetensors.py";
  const CommandResult r = run("/usr/bin/python3 " + script + " " + export_dir.string() + " " + ckpt.npy_dir().string() +
                                  " " + preset + " 2 '" + expected_config + "'",
                              dir);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// The independent tokenizer check with $TESSERA_HF_PYTHON (a Python that has transformers, where
// there is one) or /usr/bin/python3; it prints which reader ran.
void check_tokenizer_with_python(const fs::path& export_dir, const std::string& kind, const fs::path& dir) {
  const char* env = std::getenv("TESSERA_HF_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
  if (!fs::exists(python)) GTEST_SKIP() << python << " is needed for the independent tokenizer check";
  const std::string data = TESSERA_TEST_DATA_DIR;
  const CommandResult r = run(python + " " + data + "/check_hf_tokenizer.py " + export_dir.string() + " " + kind +
                                  (kind == "gpt2" ? " " + data + "/gpt2/tokenizer_cases.json" : ""),
                              dir);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::cout << r.out;
}

TEST(CkptCommands, ExportsGpt2ToHuggingFaceSafetensors) {
  const fs::path dir = temp_dir("ckpt_export_gpt2");
  TinyCheckpoint ckpt(gpt2_config(), kGpt2Toml, dir);
  const CommandResult r =
      tessera("ckpt export " + ckpt.file().string() + " --format safetensors --out " + (dir / "hf").string(), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GPT2LMHeadModel, 28 tensors"), std::string::npos) << r.out;
  check_with_python(dir / "hf", ckpt, "gpt2",
                    R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 40,
                        "n_positions": 12, "n_embd": 16, "n_layer": 2, "n_head": 2, "n_inner": 64,
                        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
                        "tie_word_embeddings": true, "bos_token_id": 12, "eos_token_id": 12,
                        "torch_dtype": "float32"})",
                    dir);
  // The stored config has no [data]: the default task, addition, whose "\n" (id 12) ends an answer.
  check_tokenizer_with_python(dir / "hf", "addition", dir);
}

TEST(CkptCommands, ExportsLlamaToHuggingFaceSafetensors) {
  const fs::path dir = temp_dir("ckpt_export_llama");
  TinyCheckpoint ckpt(llama_config(), kLlamaToml, dir);
  const CommandResult r = tessera("ckpt export " + ckpt.file().string() + " --out " + (dir / "hf").string(), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("LlamaForCausalLM, 21 tensors"), std::string::npos) << r.out;
  check_with_python(dir / "hf", ckpt, "llama",
                    R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 40,
                        "hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 24,
                        "rms_norm_eps": 1e-05, "rope_theta": 500000, "tie_word_embeddings": false,
                        "hidden_act": "silu", "bos_token_id": 12, "eos_token_id": 12, "torch_dtype": "float32"})",
                    dir);
  check_tokenizer_with_python(dir / "hf", "addition", dir);
}

// LLaMA on GPT-2 tokens: config.json says <|endoftext|> (50256) is bos and eos (Hugging Face
// assumed 1 and 2 without them, and generate() stopped on "#"), and GPT-2's files are written
// beside the weights as vocab.json and merges.txt, so AutoTokenizer loads the folder.
TEST(CkptCommands, ExportsTheGpt2TokenizerTheModelWasTrainedWith) {
  const fs::path dir = temp_dir("ckpt_export_gpt2_tokens");
  ModelConfig cfg = llama_config();
  cfg.vocab_size = 50257;
  const std::string gpt2 = std::string(TESSERA_TEST_DATA_DIR) + "/gpt2";
  const std::string toml = std::string(kLlamaToml) + "\n[data]\ntask = \"tokens\"\ntokenizer = \"gpt2\"\n";
  const TinyCheckpoint ckpt(cfg, std::string(toml).replace(toml.find("vocab_size = 40"), 15, "vocab_size = 50257"), dir);
  const std::string nowhere = "TESSERA_DATA_DIR=" + (dir / "no_data").string() + " ";
  // Nowhere to find GPT-2's files: refused before anything is written, saying how to get them.
  CommandResult r = run(nowhere + TESSERA_BINARY + " ckpt export " + ckpt.file().string() + " --out " + (dir / "hf").string(), dir);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("run scripts/get_data.sh"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "hf" / "model.safetensors"));
  r = run(nowhere + TESSERA_BINARY + " ckpt export " + ckpt.file().string() + " --vocab " + gpt2 + " --out " +
              (dir / "hf").string(),
          dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("the gpt2 tokenizer (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(testing::read_file(dir / "hf" / "vocab.json"), testing::read_file(gpt2 + "/encoder.json"));
  EXPECT_EQ(testing::read_file(dir / "hf" / "merges.txt"), testing::read_file(gpt2 + "/vocab.bpe"));
  check_tokenizer_with_python(dir / "hf", "gpt2", dir);
}

TEST(CkptCommands, ExportsTheByteTokenizerAndRefusesAVocabularyThatCannotHoldIt) {
  const fs::path dir = temp_dir("ckpt_export_byte");
  ModelConfig cfg = gpt2_config();
  cfg.vocab_size = 260;  // a padded embedding: more rows than the tokenizer's 257
  const std::string data = "\n[data]\ntask = \"tokens\"\ntokenizer = \"byte\"\n";
  const TinyCheckpoint ckpt(cfg, kGpt2Toml + data, dir);
  CommandResult r = tessera("ckpt export " + ckpt.file().string() + " --out " + (dir / "hf").string(), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  check_tokenizer_with_python(dir / "hf", "byte", dir);
  const fs::path small = dir / "small";
  fs::create_directories(small);
  const TinyCheckpoint narrow(gpt2_config(), kGpt2Toml + data, small);  // 40 rows for 257 tokens
  r = tessera("ckpt export " + narrow.file().string() + " --out " + (small / "hf").string(), small);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the model's vocabulary (40) is smaller than its tokenizer's (byte, 257)"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(small / "hf" / "model.safetensors"));
}

// The stored config says 3 layers and a wider MLP; the file holds 2 layers: every difference is
// listed, and nothing is written.
TEST(CkptCommands, ExportListsShapeMismatchesWithTheConfig) {
  const fs::path dir = temp_dir("ckpt_export_mismatch");
  const std::string toml = std::string(kGpt2Toml).replace(std::string(kGpt2Toml).find("n_layer = 2"), 11, "n_layer = 3") +
                           "ffn_hidden = 32\n";
  TinyCheckpoint ckpt(gpt2_config(), toml, dir);
  const CommandResult r = tessera("ckpt export " + ckpt.file().string() + " --out " + (dir / "hf").string(), dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("does not match the model (22 mismatches):"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing /model/blocks.2.attn.q.weight (expected (16, 16))"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/model/blocks.0.mlp.fc.weight has shape (64, 16) in the checkpoint, expected (32, 16)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "hf" / "model.safetensors"));
}

// A checkpoint holding NaN or inf (a diverged run's) used to export silently into a model that
// produces NaN: refused naming each tensor and its count, unless --allow-non-finite.
TEST(CkptCommands, ExportRefusesNonFiniteTensorsUnlessAllowed) {
  const fs::path dir = temp_dir("ckpt_export_nan");
  TinyCheckpoint ckpt(gpt2_config(), kGpt2Toml, dir);
  testing::set_first_value(ckpt.file().string(), "/model/wte.weight", std::nanf(""));
  testing::set_first_value(ckpt.file().string(), "/model/blocks.1.ln2.bias", HUGE_VALF);
  const std::string out = (dir / "hf").string();
  CommandResult r = tessera("ckpt export " + ckpt.file().string() + " --out " + out, dir);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(ckpt.file().string() + " holds non-finite values (NaN or inf) in /model/"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("/model/wte.weight (1 value)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/model/blocks.1.ln2.bias (1 value)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--allow-non-finite"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "hf" / "model.safetensors"));
  r = tessera("ckpt export " + ckpt.file().string() + " --out " + out + " --allow-non-finite", dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "hf" / "model.safetensors"));
  fs::remove_all(dir);
}

TEST(CkptCommands, ExportRefusesUnknownFormats) {
  const fs::path dir = temp_dir("ckpt_export_format");
  const CommandResult r = tessera("ckpt export x.h5 --format gguf --out " + (dir / "hf").string(), dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("gguf"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
