// Tests app/checkpoint/checkpoint_io.h on one rank: write then read back equal (metadata, extra attributes,
// whole tensors and slices along each dimension), hyperslab reads, and every error a user can
// meet: truncated, foreign, corrupted, newer-format and meta-less files, corrupted metadata,
// shape mismatches, a planted symlink, and a full disk (a small tmpfs), whose space the writer
// reserves from an upper bound on the file's size (checked against real files).
#include "app/checkpoint/checkpoint_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "app/checkpoint/checkpoint_plan.h"
#include "error_testing.h"
#include "h5_reader.h"
#include "app/cli_testing.h"
#include "app/disk_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::temp_dir;
using testing::test_world;

// Distinct, exactly representable values: base + i / 8.
std::vector<float> pattern(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + static_cast<float>(i) * 0.125f;
  return v;
}

// Row-major (R, C) matrix: the columns [c0, c0 + n).
std::vector<float> columns(const std::vector<float>& m, int64_t R, int64_t C, int64_t c0, int64_t n) {
  std::vector<float> out;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = c0; c < c0 + n; ++c) out.push_back(m[static_cast<size_t>(r * C + c)]);
  return out;
}

TensorSlice whole(const std::string& path, Shape shape, const std::vector<float>& data) {
  return TensorSlice{path, shape, -1, 0, shape, data.data(), true};
}

CheckpointMeta sample_meta() {
  CheckpointMeta m;
  m.step = 1200;
  m.tokens_seen = 9830400;
  m.consumed_samples = 38400;
  m.config_toml = "[model]\npreset = \"gpt2\"\nn_layer = 2\n";
  m.extra = {{"train_seed", int64_t{1337}}, {"loss_scale", 0.5}, {"run_name", std::string("tiny")}};
  return m;
}

using testing::error_of;

TEST(CheckpointIo, WholeTensorsAndMetadataRoundTrip) {
  const fs::path file = temp_dir("ckpt_whole") / "step.h5";
  const auto a = pattern(12, 1.0f), b = pattern(5, -3.0f), m = pattern(12, 0.25f);
  const CheckpointMeta meta = sample_meta();
  const GroupAttributes groups = {{"/optim", {{"step", int64_t{1200}}}},
                                  {"/data", {{"epoch", int64_t{2}}, {"sampler", std::string("feistel")}}}};
  write_checkpoint_file(file, meta,
                        {whole("/model/a", {3, 4}, a), whole("/model/b", {5}, b), whole("/optim/a/exp_avg", {3, 4}, m)},
                        test_world(), groups);

  CheckpointReader r(file, test_world());
  EXPECT_EQ(r.meta(), meta);
  EXPECT_EQ(r.meta().tessera_version, TESSERA_VERSION);
  EXPECT_EQ(r.group_attributes(), groups);
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.tensors()[0].path, "/model/a");
  EXPECT_EQ(r.tensors()[0].shape, Shape({3, 4}));
  EXPECT_EQ(r.tensors()[0].dtype, "float32");
  EXPECT_EQ(r.tensors()[2].path, "/optim/a/exp_avg");
  EXPECT_TRUE(r.has("/model/b"));
  EXPECT_FALSE(r.has("/model/c"));
  EXPECT_EQ(r.read_all("/model/a"), a);
  EXPECT_EQ(r.read_all("/model/b"), b);
  EXPECT_EQ(r.read_all("/optim/a/exp_avg"), m);
}

// The layout documented in docs/checkpoints.md, seen through an independent reader (tests/h5_reader.h)
// and the HDF5 API: attribute names and types, float32 data, chunked with the Fletcher32 filter.
TEST(CheckpointIo, FileLayoutIsAsDocumented) {
  const fs::path file = temp_dir("ckpt_layout") / "step.h5";
  const auto a = pattern(600 * 1000, 0.0f);
  write_checkpoint_file(file, sample_meta(), {whole("/model/wte.weight", {600, 1000}, a)}, test_world(),
                        {{"/optim", {{"step", int64_t{3}}}}});
  testing::H5Reader h5(file);
  EXPECT_EQ(h5.attr_int("/meta", "format_version"), 1);
  EXPECT_EQ(h5.attr_int("/meta", "step"), 1200);
  EXPECT_EQ(h5.attr_int("/meta", "tokens_seen"), 9830400);
  EXPECT_EQ(h5.attr_int("/meta", "consumed_samples"), 38400);
  EXPECT_EQ(h5.attr_string("/meta", "tessera_version"), TESSERA_VERSION);
  EXPECT_EQ(h5.attr_string("/meta", "config"), sample_meta().config_toml);
  EXPECT_EQ(h5.attr_double("/meta", "loss_scale"), 0.5);
  EXPECT_EQ(h5.attr_int("/optim", "step"), 3);
  const auto data = h5.read<double>("/model/wte.weight");
  EXPECT_EQ(data.shape, (std::vector<int64_t>{600, 1000}));
  EXPECT_EQ(data.values[123456], a[123456]);

  H5File f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5Dataset ds(H5Dopen2(f.get(), "/model/wte.weight", H5P_DEFAULT));
  H5Type type(H5Dget_type(ds.get()));
  EXPECT_GT(H5Tequal(type.get(), H5T_IEEE_F32LE), 0);
  H5PropList dcpl(H5Dget_create_plist(ds.get()));
  EXPECT_EQ(H5Pget_layout(dcpl.get()), H5D_CHUNKED);
  hsize_t chunk[2] = {0, 0};
  H5Pget_chunk(dcpl.get(), 2, chunk);
  EXPECT_EQ(chunk[0], 262u);  // 2^18 elements / 1000 per row
  EXPECT_EQ(chunk[1], 1000u);
  ASSERT_EQ(H5Pget_nfilters(dcpl.get()), 1);
  unsigned flags = 0, config = 0;
  size_t nelmts = 0;
  EXPECT_EQ(H5Pget_filter2(dcpl.get(), 0, &flags, &nelmts, nullptr, 0, nullptr, &config), H5Z_FILTER_FLETCHER32);
}

// Slices of one tensor in one call stand in for ranks: rows split along dim 0, columns along
// dim 1, and a replica (write = false) that adds nothing.
TEST(CheckpointIo, SlicesAlongEachDimensionReassemble) {
  const fs::path file = temp_dir("ckpt_slices") / "step.h5";
  const auto rows = pattern(6 * 5, 10.0f), cols = pattern(4 * 6, -7.0f);
  const auto left = columns(cols, 4, 6, 0, 2), right = columns(cols, 4, 6, 2, 4);
  std::vector<TensorSlice> slices = {
      {"/model/rows", {6, 5}, 0, 0, {2, 5}, rows.data(), true},
      {"/model/rows", {6, 5}, 0, 2, {4, 5}, rows.data() + 10, true},
      {"/model/rows", {6, 5}, 0, 2, {4, 5}, rows.data() + 10, false},  // a replica of the second half
      {"/model/cols", {4, 6}, 1, 2, {4, 4}, right.data(), true},
      {"/model/cols", {4, 6}, 1, 0, {4, 2}, left.data(), true},
  };
  write_checkpoint_file(file, sample_meta(), slices, test_world());
  CheckpointReader r(file, test_world());
  EXPECT_EQ(r.read_all("/model/rows"), rows);
  EXPECT_EQ(r.read_all("/model/cols"), cols);
}

// ZeRO-1 style: flat ranges of the row-major flattening that cut rows, in 2-D and 3-D.
TEST(CheckpointIo, FlatRangesReassemble) {
  const fs::path file = temp_dir("ckpt_flat") / "step.h5";
  const auto m = pattern(5 * 7, 3.0f), c = pattern(3 * 4 * 5, -1.0f);
  const int64_t kFlat = TensorSlice::kFlat;
  write_checkpoint_file(file, sample_meta(),
                        {{"/optim/m/exp_avg", {5, 7}, kFlat, 0, {10}, m.data(), true},
                         {"/optim/m/exp_avg", {5, 7}, kFlat, 23, {12}, m.data() + 23, true},
                         {"/optim/m/exp_avg", {5, 7}, kFlat, 10, {13}, m.data() + 10, true},
                         {"/optim/c/exp_avg", {3, 4, 5}, kFlat, 0, {7}, c.data(), true},
                         {"/optim/c/exp_avg", {3, 4, 5}, kFlat, 7, {26}, c.data() + 7, true},
                         {"/optim/c/exp_avg", {3, 4, 5}, kFlat, 33, {27}, c.data() + 33, true}},
                        test_world());
  CheckpointReader r(file, test_world());
  EXPECT_EQ(r.read_all("/optim/m/exp_avg"), m);
  EXPECT_EQ(r.read_all("/optim/c/exp_avg"), c);
  std::vector<float> part(21);
  r.read("/optim/c/exp_avg", kFlat, 9, {21}, part.data());
  EXPECT_EQ(part, std::vector<float>(c.begin() + 9, c.begin() + 30));
}

TEST(CheckpointIo, ReadsHyperslabs) {
  const fs::path file = temp_dir("ckpt_hyperslab") / "step.h5";
  const auto m = pattern(6 * 5, 1.0f);
  write_checkpoint_file(file, sample_meta(), {whole("/model/m", {6, 5}, m)}, test_world());
  CheckpointReader r(file, test_world());
  std::vector<float> part(2 * 5);
  r.read("/model/m", 0, 3, {2, 5}, part.data());
  EXPECT_EQ(part, std::vector<float>(m.begin() + 15, m.begin() + 25));
  std::vector<float> cols(6 * 3);
  r.read("/model/m", 1, 1, {6, 3}, cols.data());
  EXPECT_EQ(cols, columns(m, 6, 5, 1, 3));
}

TEST(CheckpointIo, ReadsThatDoNotFitTheTensorAreErrors) {
  const fs::path file = temp_dir("ckpt_badread") / "step.h5";
  const auto m = pattern(6 * 5, 1.0f);
  write_checkpoint_file(file, sample_meta(), {whole("/model/m", {6, 5}, m)}, test_world());
  CheckpointReader r(file, test_world());
  std::vector<float> out(64);
  EXPECT_EQ(error_of([&] { r.read("/model/m", TensorSlice::kWhole, 0, {6, 6}, out.data()); }),
            "/model/m in " + file.string() + " has shape (6, 5), but shape (6, 6) was asked for");
  EXPECT_NE(error_of([&] { r.read("/model/m", 0, 0, {2, 4}, out.data()); }).find("a slice of shape (2, 4) along dimension 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.read("/model/m", 0, 5, {2, 5}, out.data()); }).find("[5, 7) along dimension 0 is out of range"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { r.read_all("/model/x"); }), file.string() + " has no tensor /model/x");
}

TEST(CheckpointIo, InconsistentSlicesAreRejectedBeforeWriting) {
  const fs::path dir = temp_dir("ckpt_badslices");
  const auto d = pattern(8, 0.0f);
  auto write = [&](std::vector<TensorSlice> s) {
    return error_of([&] { write_checkpoint_file(dir / "x.h5", sample_meta(), s, test_world()); });
  };
  EXPECT_NE(write({{"/model/a", {8}, 0, 0, {4}, d.data(), true}}).find("cover 4 of 8 elements"), std::string::npos);
  EXPECT_NE(write({{"/model/a", {8}, 0, 0, {5}, d.data(), true}, {"/model/a", {8}, 0, 3, {5}, d.data(), true}})
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(write({whole("/model/a", {8}, d), whole("/model/a", {2, 4}, d)}).find("declared with shape (8)"),
            std::string::npos);
  EXPECT_NE(write({{"/model/a", {8}, 0, 6, {4}, d.data(), true}}).find("out of range"), std::string::npos);
  EXPECT_NE(write({{"/model/b", {2, 4}, TensorSlice::kFlat, 0, {5}, d.data(), true},
                   {"/model/b", {2, 4}, 1, 2, {2, 2}, d.data(), true}})
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(write({whole("model/a", {8}, d)}).find("must be absolute"), std::string::npos);
  EXPECT_NE(write({whole("/meta/a", {8}, d)}).find("reserved"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "x.h5"));

  CheckpointMeta m = sample_meta();
  m.extra["step"] = int64_t{1};
  EXPECT_NE(error_of([&] { write_checkpoint_file(dir / "x.h5", m, {whole("/model/a", {8}, d)}, test_world()); })
                .find("fixed /meta attribute"),
            std::string::npos);
}

TEST(CheckpointIo, LongAndEmptyStringsRoundTrip) {
  const fs::path file = temp_dir("ckpt_strings") / "step.h5";
  CheckpointMeta m = sample_meta();
  m.config_toml = std::string(200000, 'x');  // beyond the 64 KiB object-header limit
  m.extra["empty"] = std::string();
  const auto d = pattern(3, 0.0f);
  write_checkpoint_file(file, m, {whole("/model/a", {3}, d)}, test_world());
  CheckpointReader r(file, test_world());
  EXPECT_EQ(r.meta(), m);
}

TEST(CheckpointIo, MissingForeignAndTruncatedFilesAreNamed) {
  const fs::path dir = temp_dir("ckpt_truncated");
  EXPECT_EQ(error_of([&] { CheckpointReader((dir / "none.h5").string(), test_world()); }),
            "checkpoint file " + (dir / "none.h5").string() + " does not exist");

  std::ofstream(dir / "notes.h5") << "not an HDF5 file\n";
  EXPECT_EQ(error_of([&] { CheckpointReader((dir / "notes.h5").string(), test_world()); })
                .rfind((dir / "notes.h5").string() + " is not a readable HDF5 file (truncated or not a checkpoint)", 0),
            0u);

  const fs::path file = dir / "step.h5";
  const auto d = pattern(100000, 0.0f);
  write_checkpoint_file(file, sample_meta(), {whole("/model/a", {100000}, d)}, test_world());
  fs::resize_file(file, fs::file_size(file) / 2);
  EXPECT_EQ(error_of([&] { CheckpointReader(file.string(), test_world()); })
                .rfind(file.string() + " is not a readable HDF5 file (truncated or not a checkpoint)", 0),
            0u);
}

// Flips bytes in the middle of one tensor's stored data (found by its known values): reading that
// tensor fails the Fletcher32 check with a message naming it; the others still read.
TEST(CheckpointIo, CorruptedDataIsAChecksumMismatch) {
  const fs::path file = temp_dir("ckpt_corrupt") / "step.h5";
  const auto q = pattern(64 * 64, 1000.0f), other = pattern(64, 5.0f);
  write_checkpoint_file(file, sample_meta(),
                        {whole("/model/blocks.0.attn.q.weight", {64, 64}, q), whole("/model/other", {64}, other)},
                        test_world());
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string needle(reinterpret_cast<const char*>(q.data() + 2000), 16);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  for (size_t i = at; i < at + 4; ++i) bytes[i] = static_cast<char>(~bytes[i]);
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  CheckpointReader r(file, test_world());
  EXPECT_EQ(error_of([&] { r.read_all("/model/blocks.0.attn.q.weight"); }),
            "checksum mismatch reading /model/blocks.0.attn.q.weight in " + file.string() + ": the file is corrupted");
  EXPECT_EQ(r.read_all("/model/other"), other);
}

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// String attributes (config, version, ...) are fixed-length, inside checksummed HDF5 metadata.
// Variable-length ones lived in HDF5's global heap, which has no checksum: a changed character
// read back silently, and a zeroed free-space size made HDF5 1.10.8 loop forever in H5Aread
// (found by tests/fuzz's checkpoint target; docs/fuzzing.md). A text over 64 KiB (far beyond a
// config) goes to HDF5's dense attribute storage, outside the checksums, but not to the global heap.
TEST(CheckpointIo, CorruptedStringMetadataIsAnErrorNotAHang) {
  const fs::path file = temp_dir("ckpt_strings_corrupt") / "step.h5";
  CheckpointMeta m = sample_meta();
  m.config_toml = "[model]\nn_layer = 2\n";
  m.extra["long"] = std::string(200000, '#');
  const auto d = pattern(3, 0.0f);
  write_checkpoint_file(file, m, {whole("/model/a", {3}, d)}, test_world());
  std::string bytes = file_bytes(file);
  EXPECT_EQ(bytes.find("GCOL"), std::string::npos) << "a global heap collection in the file";
  const size_t at = bytes.find("n_layer = 2");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 10] = '3';
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_NE(error_of([&] { CheckpointReader(file.string(), test_world()); }).find(file.string()), std::string::npos);
}

// A valid HDF5 file may declare almost any shape (HDF5 allocates chunks only when written):
// element counts beyond 2^60 are refused, naming the tensor. A (2^40, 2^40) tensor made
// Shape::numel overflow (undefined behaviour; ckpt inspect printed 0 parameters).
TEST(CheckpointIo, ImplausibleShapesAreRefusedNamingTheTensor) {
  const fs::path dir = temp_dir("ckpt_huge_shape");
  const hsize_t huge = hsize_t{1} << 40;
  const std::vector<std::vector<hsize_t>> shapes = {{huge, huge}, {hsize_t{1} << 62, 4}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::vector<hsize_t>& dims = shapes[i];
    const fs::path file = dir / ("huge_" + std::to_string(i) + ".h5");  // checkpoints are created exclusively
    const auto d = pattern(3, 0.0f);
    write_checkpoint_file(file, sample_meta(), {whole("/model/a", {3}, d)}, test_world());
    {
      H5File f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      const std::vector<hsize_t> chunk(dims.size(), 1);
      H5Space space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
      H5PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
      H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
      H5Dataset ds(H5Dcreate2(f.get(), "/model/huge", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
      ASSERT_TRUE(ds.valid());
    }
    const std::string error = error_of([&] { CheckpointReader(file.string(), test_world()); });
    EXPECT_NE(error.find("/model/huge in " + file.string()), std::string::npos) << error;
    EXPECT_NE(error.find("2^60"), std::string::npos) << error;
  }
}

// HDF5 1.10.8 trusts the stored size of a chunk that the chunk index records (a version-1 B-tree,
// which has no checksum): a Fletcher32 chunk recorded as shorter than its 4-byte checksum made
// H5Dread run past its buffer and crash (found by tests/fuzz's checkpoint target). Now an error
// naming the tensor. The index node starts with the signature "TREE"; 24 bytes in (after type,
// level, entry count and two sibling addresses) its first key begins with the chunk's size.
TEST(CheckpointIo, CorruptedChunkIndexIsAnErrorNotACrash) {
  const fs::path file = temp_dir("ckpt_chunk_index") / "step.h5";
  const auto a = pattern(64 * 64, 1.0f);
  write_checkpoint_file(file, sample_meta(), {whole("/model/a", {64, 64}, a)}, test_world());
  std::string bytes = file_bytes(file);
  const size_t tree = bytes.find("TREE");
  ASSERT_NE(tree, std::string::npos);
  ASSERT_EQ(bytes[tree + 4], 1) << "not a chunk index node";
  uint32_t size = 0;
  std::memcpy(&size, bytes.data() + tree + 24, 4);
  ASSERT_EQ(size, 64u * 64u * 4u + 4u);  // the data and its checksum
  size = 1;
  std::memcpy(bytes.data() + tree + 24, &size, 4);
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CheckpointReader r(file, test_world());
  const std::string error = error_of([&] { r.read_all("/model/a"); });
  EXPECT_NE(error.find("/model/a in " + file.string()), std::string::npos) << error;
  EXPECT_NE(error.find("corrupted"), std::string::npos) << error;
}

TEST(CheckpointIo, NewerFormatVersionIsRefused) {
  const fs::path file = temp_dir("ckpt_newer") / "step.h5";
  CheckpointMeta m = sample_meta();
  m.format_version = 2;
  const auto d = pattern(3, 0.0f);
  write_checkpoint_file(file, m, {whole("/model/a", {3}, d)}, test_world());
  EXPECT_EQ(error_of([&] { CheckpointReader(file.string(), test_world()); }),
            file.string() + " was written by a newer tessera: format version 2, this build reads up to 1");
}

TEST(CheckpointIo, FileWithoutMetaIsNotACheckpoint) {
  const fs::path file = temp_dir("ckpt_nometa") / "plain.h5";
  {
    H5File f(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    const hsize_t n = 4;
    H5Space space(H5Screate_simple(1, &n, nullptr));
    H5Dataset ds(H5Dcreate2(f.get(), "weights", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  }
  EXPECT_EQ(error_of([&] { CheckpointReader(file.string(), test_world()); }),
            file.string() + " has no /meta group: not a tessera checkpoint");
}

TEST(CheckpointIo, CompareShapesListsEveryMismatch) {
  const fs::path file = temp_dir("ckpt_compare") / "step.h5";
  const auto d = pattern(64, 0.0f);
  write_checkpoint_file(file, sample_meta(),
                        {whole("/model/wte.weight", {16, 4}, d), whole("/model/ln_f.weight", {4}, d),
                         whole("/model/old.weight", {4}, d), whole("/optim/wte.weight/exp_avg", {16, 4}, d)},
                        test_world());
  CheckpointReader r(file, test_world());
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"/model/wte.weight", {32, 4}}, {"/model/ln_f.weight", {4}}, {"/model/lm_head.weight", {32, 4}}};
  const auto mismatches = compare_shapes(r, expected);
  EXPECT_EQ(mismatches, (std::vector<std::string>{
                            "missing /model/lm_head.weight (expected (32, 4))",
                            "/model/wte.weight has shape (16, 4) in the checkpoint, expected (32, 4)",
                            "unexpected /model/old.weight (4)",  // /optim is not compared: nothing expected there
                        }));
  const std::string e = error_of([&] { check_shapes(r, expected); });
  EXPECT_NE(e.find(file.string() + " does not match the model (3 mismatches):\n  missing /model/lm_head.weight"),
            std::string::npos);
  EXPECT_NO_THROW(check_shapes(r, {{"/model/wte.weight", {16, 4}},
                                   {"/model/ln_f.weight", {4}},
                                   {"/model/old.weight", {4}}}));
}

// The space reserved before writing (estimated_file_bytes) bounds every real file, and is not
// wildly more: many small tensors and groups (HDF5's overhead dominates), tensors of several
// chunks with partial edge chunks, a long config and many attributes.
TEST(CheckpointIo, EstimatedSizeBoundsTheFile) {
  const fs::path dir = temp_dir("ckpt_estimate");
  const auto big = pattern(1100 * 700, 0.0f), small = pattern(300, 1.0f);
  std::vector<std::vector<TensorSlice>> cases(3);
  for (int i = 0; i < 120; ++i) cases[0].push_back(whole("/optim/blocks." + std::to_string(i) + ".w/exp_avg", {300}, small));
  cases[1] = {whole("/model/wte.weight", {1100, 700}, big), whole("/model/wpe.weight", {7, 100}, small)};
  cases[2] = {whole("/model/flat", {1100 * 700}, big), whole("/model/x", {3, 10, 10}, small)};
  CheckpointMeta meta = sample_meta();
  meta.config_toml = std::string(20000, 'c');
  GroupAttributes groups = {{"/optim", {{"step", int64_t{3}}}}, {"/rng", {}}};
  for (int i = 0; i < 12; ++i) groups["/rng"]["seed" + std::to_string(i)] = std::string(100, 's');
  for (size_t c = 0; c < cases.size(); ++c) {
    const fs::path file = dir / ("case" + std::to_string(c) + ".h5");
    write_checkpoint_file(file, meta, cases[c], test_world(), groups);
    const auto bound = ckpt::estimated_file_bytes(ckpt::make_write_plan(cases[c], groups, test_world()), meta, groups);
    const auto size = static_cast<int64_t>(fs::file_size(file));
    EXPECT_LE(size, bound) << "case " << c;
    EXPECT_LE(bound, 2 * size + (256 << 10)) << "case " << c;
  }
  fs::remove_all(dir);
}

// A symlink planted where the file is to be written is refused, never followed.
TEST(CheckpointIo, APlantedSymlinkIsNeverWrittenThrough) {
  const fs::path dir = temp_dir("ckpt_symlink");
  std::ofstream(dir / "victim") << "precious\n";
  fs::create_symlink(dir / "victim", dir / "step.h5.tmp");
  const auto d = pattern(3, 0.0f);
  EXPECT_EQ(error_of([&] { write_checkpoint_file(dir / "step.h5.tmp", sample_meta(), {whole("/model/a", {3}, d)}, test_world()); }),
            "cannot create " + (dir / "step.h5.tmp").string() + ": a file or symlink with that name already exists");
  EXPECT_EQ(testing::read_file(dir / "victim"), "precious\n");
  fs::remove_all(dir);
}

// The metadata is covered by a checksum: one flipped bit in the stored config and changes made behind tessera's back to an
// attribute or a tensor's name are refused on open, naming the file.
TEST(CheckpointIo, CorruptedMetadataIsAChecksumMismatch) {
  const fs::path dir = temp_dir("ckpt_meta_checksum");
  const auto d = pattern(12, 0.0f);
  CheckpointMeta meta = sample_meta();
  meta.config_toml = "[model]\nnorm_eps = 1e-5\n";
  const GroupAttributes groups = {{"/optim", {{"step", int64_t{1200}}}}};
  auto write = [&](const std::string& name) {
    const fs::path file = dir / name;
    write_checkpoint_file(file, meta, {whole("/model/a", {3, 4}, d)}, test_world(), groups);
    EXPECT_EQ(CheckpointReader(file.string(), test_world()).meta(), meta);
    return file;
  };
  auto refusal = [](const fs::path& file) {
    return "checksum mismatch in the metadata of " + file.string() +
           " (/meta, group attributes, tensor names and shapes): the file is corrupted";
  };

  const fs::path flipped = write("flipped.h5");
  std::string bytes = testing::read_file(flipped);
  const size_t at = bytes.find("norm_eps = 1e-5");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 14] = '1';  // '5' -> '1': one bit
  std::ofstream(flipped, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  // The config is a fixed-length string in /meta's object header, which HDF5 checksums too: its
  // check or tessera's may catch the flip first; either way the same refusal, naming the file.
  EXPECT_TRUE(testing::throws_with([&] { CheckpointReader(flipped.string(), test_world()); }, {refusal(flipped)}));

  const fs::path changed = write("changed.h5");
  {
    H5File f(H5Fopen(changed.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Group g(H5Gopen2(f.get(), "/optim", H5P_DEFAULT));
    h5_write_attribute(g.get(), "step", int64_t{1201}, "/optim");
  }
  EXPECT_EQ(error_of([&] { CheckpointReader(changed.string(), test_world()); }), refusal(changed));

  const fs::path renamed = write("renamed.h5");
  {
    H5File f(H5Fopen(renamed.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_GE(H5Lmove(f.get(), "/model/a", f.get(), "/model/b", H5P_DEFAULT, H5P_DEFAULT), 0);
  }
  EXPECT_EQ(error_of([&] { CheckpointReader(renamed.string(), test_world()); }), refusal(renamed));
  fs::remove_all(dir);
}

// Files written before the checksum existed (no /meta@checksum) still load.
TEST(CheckpointIo, FilesWithoutAChecksumStillLoad) {
  const fs::path file = temp_dir("ckpt_no_checksum") / "step.h5";
  const auto d = pattern(12, 0.0f);
  write_checkpoint_file(file, sample_meta(), {whole("/model/a", {3, 4}, d)}, test_world());
  {
    H5File f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Group g(H5Gopen2(f.get(), "/meta", H5P_DEFAULT));
    ASSERT_GE(H5Adelete(g.get(), "checksum"), 0);
  }
  CheckpointReader r(file.string(), test_world());
  EXPECT_EQ(r.meta(), sample_meta());
  EXPECT_EQ(r.read_all("/model/a"), d);
}

// A disk too small for the file (a 1 MiB tmpfs, or a file size limit where mounting is not
// allowed): the write fails before HDF5 writes anything, with a message saying so, leaves no
// file, and HDF5 is left in a state to write the next file.
TEST(CheckpointIo, AFullDiskIsFoundBeforeWriting) {
  const fs::path dir = temp_dir("ckpt_full");
  const testing::RemoveAtEnd cleanup{dir};
  MPI_Comm comm = test_world();  // MPI starts before any limit: it writes shared-memory files
  testing::SmallDisk disk(dir / "disk", 1 << 20);
  std::unique_ptr<testing::FileSizeLimit> limit;
  if (!disk.mounted()) limit = std::make_unique<testing::FileSizeLimit>(1 << 20);
  const auto big = pattern(512 * 1024, 0.0f), small = pattern(1000, 0.0f);  // 2 MiB and 4 KB
  const fs::path file = disk.path() / "step.h5";
  const std::string e = error_of([&] { write_checkpoint_file(file, sample_meta(), {whole("/model/a", {512, 1024}, big)}, comm); });
  EXPECT_EQ(e.rfind("not enough space to save checkpoint " + file.string() + ": it needs up to 2.", 0), 0u) << e;
  EXPECT_EQ(testing::names_of(disk.path()), std::vector<std::string>{});
  write_checkpoint_file(file, sample_meta(), {whole("/model/a", {1000}, small)}, comm);
  EXPECT_EQ(CheckpointReader(file.string(), comm).read_all("/model/a"), small);
}

}  // namespace
}  // namespace tessera
