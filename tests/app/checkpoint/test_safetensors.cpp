// Tests app/checkpoint/safetensors.h: the writer read back by the reader; F16 (all 65,536 values,
// against the format's definition) and BF16 widened exactly; every malformed header refused naming
// the file and what is wrong; integer and 8-bit float dtypes refused by name when read; the sharded
// folder (model.safetensors.index.json) and its inconsistencies. Files are written by the test's own
// writer (safetensors_testing.h), so a header can be damaged on purpose.
#include "app/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "app/checkpoint/safetensors_testing.h"
#include "data/temp_files.h"
#include "error_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::float_tensor;
using testing::RawTensor;
using testing::safetensors_bytes;
using testing::safetensors_file;
using testing::safetensors_header;
using testing::TempDir;
using testing::throws_with;
using testing::write_binary;

std::string u16_bytes(const std::vector<uint16_t>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2); }

TEST(Safetensors, TheWriterReadsBack) {
  TempDir dir("st_write");
  const std::string path = dir / "model.safetensors";
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f}, b = {7.0f};
  write_safetensors(path,
                    {{"a.weight", Shape{2, 3}, [&] { return a; }}, {"b", Shape{}, [&] { return b; }},
                     {"empty", Shape{0, 4}, [] { return std::vector<float>{}; }}},
                    {{"format", "pt"}});
  const SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(f.tensors().size(), 3u);
  const SafetensorsTensor* t = f.find("a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "F32");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->offset % 8, 0) << "the data starts 8-byte aligned";
  const std::vector<float> got = f.read_f32(*t);
  EXPECT_EQ(std::memcmp(got.data(), a.data(), a.size() * 4), 0);
  EXPECT_EQ(f.read_f32(*f.find("b")), b);
  EXPECT_EQ(f.find("b")->shape_str(), "()");
  EXPECT_TRUE(f.read_f32(*f.find("empty")).empty());
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, EveryHalfWidensToItsExactValue) {
  TempDir dir("st_f16");
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  write_binary(dir / "h.safetensors", safetensors_bytes({{"h", "F16", {256, 256}, u16_bytes(all)}}));
  const SafetensorsFile f(dir / "h.safetensors");
  const std::vector<float> got = f.read_f32(f.tensors()[0]);
  for (uint32_t i = 0; i < all.size(); ++i) {
    const double want = testing::f16_value(static_cast<uint16_t>(i));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(got[i]), want) << "half 0x" << std::hex << i;
      ASSERT_EQ(std::signbit(got[i]), std::signbit(want)) << "half 0x" << std::hex << i;
    }
  }
  EXPECT_EQ(got[0x3C00], 1.0f);
  EXPECT_EQ(got[0xC100], -2.5f);
  EXPECT_EQ(got[0x0001], std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(got[0x7BFF], 65504.0f);
  EXPECT_EQ(got[0x7C00], INFINITY);
}

TEST(Safetensors, BFloat16WidensExactly) {
  TempDir dir("st_bf16");
  // floats whose low 16 bits are zero are bfloat16 values: they come back bit for bit.
  const std::vector<float> values = {1.0f, -2.5f, 3.140625f, std::ldexp(1.0f, -133), -0.0f, 65280.0f, INFINITY, -INFINITY};
  std::vector<uint16_t> bits;
  for (const float v : values) {
    const uint32_t b = std::bit_cast<uint32_t>(v);
    ASSERT_EQ(b & 0xFFFF, 0u) << v;
    bits.push_back(static_cast<uint16_t>(b >> 16));
  }
  bits.push_back(0x7FC1);  // a NaN
  write_binary(dir / "b.safetensors", safetensors_bytes({{"b", "BF16", {9}, u16_bytes(bits)}}));
  const SafetensorsFile f(dir / "b.safetensors");
  const std::vector<float> got = f.read_f32(f.tensors()[0]);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(values[i]));
  EXPECT_TRUE(std::isnan(got[8]));
}

TEST(Safetensors, OtherDtypesOpenButAreRefusedWhenRead) {
  TempDir dir("st_int");
  const std::string path = dir / "q.safetensors";
  write_binary(path, safetensors_bytes({{"q.qweight", "I32", {2}, std::string(8, '\1')},
                                        {"m", "BOOL", {3}, std::string(3, '\1')},
                                        {"s", "F8_E4M3", {2}, std::string(2, '\1')},
                                        {"d", "F64", {1}, std::string(8, '\0')}}));
  const SafetensorsFile f(path);  // a valid file: every dtype has its size
  EXPECT_EQ(error_of([&] { f.read_f32(*f.find("q.qweight")); }),
            path + ": tensor \"q.qweight\" is I32; tessera reads F32, F16 and BF16 tensors only (integer and 8-bit "
                   "float weights are a quantized model's: import its unquantized release)");
  EXPECT_TRUE(throws_with([&] { f.read_f32(*f.find("s")); }, {"\"s\" is F8_E4M3", "quantized"}));
  EXPECT_TRUE(throws_with([&] { f.read_f32(*f.find("d")); }, {"\"d\" is F64; tessera reads F32, F16 and BF16"}));
  EXPECT_TRUE(throws_with([&] { f.read_f32(*f.find("m")); }, {"\"m\" is BOOL"}));
}

// The file of `header` (padded) and `data`, and the error opening it.
std::string open_error(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir / "bad.safetensors";
  write_binary(path, bytes);
  return error_of([&] { SafetensorsFile f(path); });
}

TEST(Safetensors, MalformedFilesAreRefusedNamingTheFileAndTheProblem) {
  TempDir dir("st_bad");
  const std::string path = dir / "bad.safetensors";
  const std::string data8(8, '\0');
  auto header_of = [](const std::string& entry) { return "{\"t\":" + entry + "}"; };
  auto with_entry = [&](const std::string& entry, const std::string& data) { return safetensors_file(header_of(entry), data); };
  struct Case {
    std::string what, bytes, message;
  };
  uint64_t huge = 200'000'000, past = 64;
  const std::vector<Case> cases = {
      {"empty file", "", path + " is not a safetensors file: 0 bytes, shorter than the 8-byte header size"},
      {"header size over the limit", std::string(reinterpret_cast<const char*>(&huge), 8) + "{}",
       path + ": the header size is 200000000 bytes, over the format's limit of 100000000 (not a safetensors file?)"},
      {"header size past the end", std::string(reinterpret_cast<const char*>(&past), 8) + "{}      ",
       path + ": the header size is 64 bytes, but the file has only 8 after it (truncated?)"},
      {"not JSON", safetensors_file("[1, 2]", ""), path + ": the header does not start with '{' (not a safetensors file?)"},
      {"malformed JSON", safetensors_file("{\"t\": {", ""), path + " (header): malformed JSON: parse error"},
      {"repeated tensor",
       safetensors_file("{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                        "\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", ""),
       path + " (header): \"t\" appears twice in one object"},
      {"entry not an object", with_entry("[1]", ""),
       path + ": tensor \"t\" is an array, expected an object with dtype, shape and data_offsets"},
      {"no dtype", with_entry("{\"shape\":[2],\"data_offsets\":[0,8]}", data8), path + ": tensor \"t\" has no dtype"},
      {"unknown dtype", with_entry("{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}", "x"),
       path + ": tensor \"t\" has dtype \"F4\", which is not one of the format's whole-byte dtypes"},
      {"dtype not a string", with_entry("{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}", data8),
       path + ": tensor \"t\": \"dtype\" must be a string, got an integer"},
      {"no shape", with_entry("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}", data8),
       path + ": tensor \"t\" has no shape"},
      {"negative dimension", with_entry("{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}", data8),
       path + ": tensor \"t\" has a dimension -2 in its shape"},
      {"fractional dimension", with_entry("{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}", data8),
       path + ": tensor \"t\" has a dimension 2.0 in its shape"},
      {"too many elements", with_entry("{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}", data8),
       "too many elements"},
      {"unknown field", with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}", data8),
       path + ": tensor \"t\" has an unknown field \"x\""},
      {"no offsets", with_entry("{\"dtype\":\"F32\",\"shape\":[2]}", data8), "needs data_offsets [begin, end]"},
      {"negative offset", with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}", data8),
       "needs data_offsets [begin, end]"},
      {"offsets reversed", with_entry("{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}", data8),
       path + ": tensor \"t\" has data_offsets [8, 0], outside the 8 data bytes of the file"},
      {"truncated data", with_entry("{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}", data8),
       path + ": tensor \"t\" has data_offsets [0, 16], outside the 8 data bytes of the file (truncated?)"},
      {"size mismatch", with_entry("{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}", data8),
       path + ": tensor \"t\" (F32, shape (3)) needs 12 bytes, but data_offsets [0, 8] hold 8"},
      {"trailing bytes", with_entry("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", data8),
       path + ": 4 bytes after the last tensor belong to none"},
      {"gap", safetensors_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data8),
       path + ": the data has a gap of 4 bytes before tensor \"a\""},
      {"overlap",
       safetensors_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data8),
       path + ": tensor \"b\" (bytes 4..8 of the data) overlaps the tensor before it"},
      {"metadata not strings", safetensors_file("{\"__metadata__\":{\"format\":1}}", ""),
       path + ": __metadata__ \"format\" is an integer, expected a string"},
      {"metadata not an object", safetensors_file("{\"__metadata__\":[]}", ""),
       path + ": __metadata__ is an array, expected an object of strings"},
  };
  for (const Case& c : cases) {
    const std::string got = open_error(dir, c.bytes);
    EXPECT_NE(got.find(c.message), std::string::npos) << c.what << ": " << got;
  }
  // A file that does not exist names its path.
  EXPECT_TRUE(throws_with([&] { SafetensorsFile f(dir / "missing.safetensors"); }, {dir / "missing.safetensors"}));
  // An empty set of tensors, and zero-size tensors, are valid.
  write_binary(path, safetensors_file("{}", ""));
  EXPECT_TRUE(SafetensorsFile(path).tensors().empty());
}

TEST(Safetensors, ReadsATensorWithoutTheOthers) {
  // Each read takes its own bytes only: a tensor read after the file lost its tail is an error,
  // naming the file, while an earlier tensor still reads.
  TempDir dir("st_stream");
  const std::string path = dir / "m.safetensors";
  write_binary(path, safetensors_bytes({float_tensor("a", "F32", {2}, {1, 2}), float_tensor("b", "F32", {2}, {3, 4})}));
  const SafetensorsFile f(path);
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_EQ(f.read_f32(*f.find("a")), (std::vector<float>{1, 2}));
  EXPECT_TRUE(throws_with([&] { f.read_f32(*f.find("b")); }, {path}));
}

// ---- sharded folders ----

// DIR/model-0000{1,2}-of-00002.safetensors and the index naming them.
void write_sharded(const TempDir& dir, const std::string& index) {
  write_binary(dir / "model-00001-of-00002.safetensors",
               safetensors_bytes({float_tensor("a", "F32", {2}, {1, 2}), float_tensor("b", "BF16", {1}, {3})}));
  write_binary(dir / "model-00002-of-00002.safetensors", safetensors_bytes({float_tensor("c", "F16", {2}, {5, 6})}));
  write_binary(dir / "model.safetensors.index.json", index);
}

const std::string kIndex = R"({"metadata": {"total_size": 14}, "weight_map": {
  "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
  "c": "model-00002-of-00002.safetensors"}})";

TEST(SafetensorsSet, OpensShardsThroughTheIndex) {
  TempDir dir("st_shards");
  write_sharded(dir, kIndex);
  const SafetensorsSet s(dir.path().string());
  EXPECT_TRUE(s.sharded());
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s.files().size(), 2u);
  EXPECT_EQ(s.file_of("c"), dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(s.read_f32("a"), (std::vector<float>{1, 2}));
  EXPECT_EQ(s.read_f32("b"), (std::vector<float>{3}));
  EXPECT_EQ(s.read_f32("c"), (std::vector<float>{5, 6}));
  EXPECT_EQ(s.tensor("c").dtype, "F16");
  EXPECT_TRUE(throws_with([&] { s.tensor("d"); }, {"no tensor \"d\""}));
}

TEST(SafetensorsSet, OpensASingleFile) {
  TempDir dir("st_single");
  write_binary(dir / "model.safetensors", safetensors_bytes({float_tensor("w", "F32", {1}, {9})}));
  const SafetensorsSet s(dir.path().string());
  EXPECT_FALSE(s.sharded());
  EXPECT_EQ(s.read_f32("w"), (std::vector<float>{9}));
}

TEST(SafetensorsSet, RefusesAnInconsistentOrIncompleteFolder) {
  TempDir dir("st_shards_bad");
  const std::string d = dir.path().string(), idx = dir / "model.safetensors.index.json";
  auto error_with_index = [&](const std::string& index) {
    write_sharded(dir, index);
    return error_of([&] { SafetensorsSet s(d); });
  };
  // A missing shard (an interrupted download) names the index, the tensor and the file.
  write_sharded(dir, kIndex);
  fs::remove(dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(error_of([&] { SafetensorsSet s(d); }),
            idx + " puts \"c\" in model-00002-of-00002.safetensors, which is missing from " + d +
                " (an incomplete download?)");
  EXPECT_EQ(error_with_index(R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00001-of-00002.safetensors"}})"),
            idx + " puts \"c\" in model-00001-of-00002.safetensors, but " + (dir / "model-00001-of-00002.safetensors") +
                " has no such tensor");
  EXPECT_EQ(error_with_index(R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})"),
            (dir / "model-00001-of-00002.safetensors") + " holds tensor \"b\", which " + idx + " does not list there");
  EXPECT_NE(error_with_index(R"({"weight_map": {"a": "../x.safetensors"}})").find("names \"../x.safetensors\", a file outside the folder"),
            std::string::npos);
  EXPECT_NE(error_with_index(R"({"weight_map": {"a": "/etc/passwd"}})").find("a file outside the folder"), std::string::npos);
  EXPECT_EQ(error_with_index(R"({"metadata": {}})"), idx + " has no \"weight_map\" object (tensor name -> shard file)");
  EXPECT_EQ(error_with_index(R"({"weight_map": {"a": 1}})"), idx + ": weight_map \"a\" is an integer, expected a file name");
  EXPECT_EQ(error_with_index(R"({"weight_map": {}})"), idx + ": weight_map is empty");
  EXPECT_NE(error_with_index("{\"weight_map\": ").find(idx + ": malformed JSON"), std::string::npos);

  // A tensor in two shards.
  write_sharded(dir, kIndex);
  write_binary(dir / "model-00002-of-00002.safetensors",
               safetensors_bytes({float_tensor("a", "F32", {2}, {1, 2}), float_tensor("c", "F16", {2}, {5, 6})}));
  EXPECT_EQ(error_of([&] { SafetensorsSet s(d); }), "tensor \"a\" is in both " + (dir / "model-00001-of-00002.safetensors") +
                                                         " and " + (dir / "model-00002-of-00002.safetensors"));

  // No weights at all, or PyTorch's pickles.
  TempDir empty("st_empty");
  const std::string e = empty.path().string();
  EXPECT_EQ(error_of([&] { SafetensorsSet s(e); }), e + " has neither model.safetensors nor model.safetensors.index.json");
  write_binary(empty / "pytorch_model.bin", "x");
  EXPECT_TRUE(throws_with([&] { SafetensorsSet s(e); }, {"pytorch_model.bin, which tessera does not read"}));
  EXPECT_TRUE(throws_with([&] { SafetensorsSet s(e + "/nowhere"); }, {"is not a directory"}));
}

}  // namespace
}  // namespace tessera
