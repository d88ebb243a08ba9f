// Fuzzes the Megatron indexed-dataset reader (data/indexed_dataset.h) on both files: the input is
// a uint32 length n, n bytes of PREFIX.idx, the rest PREFIX.bin (fuzz_common.h). A dataset that
// opens is then read the way training reads it: every sequence and document, the validation
// split, and the packed windows of TokenWindowDataset (which also checks ids against a vocabulary).
#include <memory>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;
using namespace tessera;

namespace {

// Wraps around (int64 files hold any value): only equality matters.
uint64_t checksum(const TokenSpan& span) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < span.size(); ++i) sum += static_cast<uint64_t>(span[i]);
  return sum;
}

void read_everything(const std::shared_ptr<const IndexedDataset>& ds) {
  uint64_t total = 0;
  for (int64_t s = 0; s < ds->num_sequences(); ++s) total += checksum(ds->sequence(s));
  uint64_t by_document = 0;
  for (int64_t d = 0; d < ds->num_documents(); ++d) by_document += checksum(ds->document(d));
  if (total != by_document || total != checksum(ds->tokens()))
    tf::finding("the sequences, the documents and tokens() of a valid dataset hold different tokens");
  std::vector<int32_t> ids(static_cast<size_t>(ds->num_tokens()));
  ds->tokens().copy_to(0, ds->num_tokens(), ids.data());
  (void)ds->tokens().find_out_of_range(1000);
}

// The training path: windows of T + 1 tokens over the whole file and over a validation split.
void read_windows(std::vector<TokenSegment> segments) {
  constexpr int64_t kSeqLen = 3, kVocab = 1000;
  TokenWindowDataset windows(std::move(segments), kSeqLen, kVocab);
  std::vector<int32_t> out(kSeqLen + 1);
  std::vector<uint8_t> mask(kSeqLen + 1);
  for (int64_t i = 0; i < windows.num_samples(); ++i) windows.get(i, out.data(), mask.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("indexed_dataset");
  static const std::string prefix = dir / "ds";
  const auto files = tf::split_length_prefixed(tf::as_text(data, size));
  tf::write_file(prefix + ".idx", files.first);
  tf::write_file(prefix + ".bin", files.second);
  std::shared_ptr<const IndexedDataset> ds;
  tf::expect_clean("IndexedDataset", [&] { ds = std::make_shared<const IndexedDataset>(prefix); });
  if (!ds) return 0;
  tf::expect_clean("reading a valid dataset", [&] { read_everything(ds); });
  tf::expect_clean("TokenWindowDataset", [&] { read_windows({whole_segment(ds)}); });
  tf::expect_clean("split_documents", [&] {
    const TrainValSegments split = split_documents(ds, 0.25);
    read_windows({split.train});
    read_windows({split.val});
  });
  tf::expect_clean("open_token_dataset", [&] { (void)open_token_dataset({prefix + ".bin"}, 3, 1000); });
  return 0;
}
