// Fuzzes the llm.c token-shard reader (data/llmc_shard.h): the input is the whole shard file. A
// shard that opens is read the way training reads it (format detection, every token, the packed
// windows of TokenWindowDataset with its vocabulary check).
#include <memory>
#include <vector>

#include "data/llmc_shard.h"
#include "data/token_dataset.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;
using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("llmc_shard");
  static const std::string path = dir / "shard.bin";
  tf::write_file(path, tf::as_text(data, size));
  (void)has_llmc_magic(path);
  std::shared_ptr<const LlmcShard> shard;
  tf::expect_clean("LlmcShard", [&] { shard = std::make_shared<const LlmcShard>(path); });
  if (!shard) return 0;
  tf::expect_clean("reading a valid shard", [&] {
    if (detect_token_format(path) != TokenFileFormat::kLlmcShard) tf::finding("a valid shard is not detected as one");
    std::vector<int32_t> ids(static_cast<size_t>(shard->num_tokens()));
    shard->tokens().copy_to(0, shard->num_tokens(), ids.data());
    for (int64_t i = 0; i < shard->num_tokens(); ++i)
      // copy_to narrows to int32 (a uint32 id above 2^31 - 1 wraps; the vocabulary check catches it).
      if (static_cast<int32_t>(shard->tokens()[i]) != ids[static_cast<size_t>(i)])
        tf::finding("TokenSpan [] and copy_to disagree");
    constexpr int64_t kSeqLen = 3, kVocab = 1000;
    TokenWindowDataset windows({whole_segment(shard)}, kSeqLen, kVocab);
    std::vector<int32_t> out(kSeqLen + 1);
    std::vector<uint8_t> mask(kSeqLen + 1);
    for (int64_t i = 0; i < windows.num_samples(); ++i) windows.get(i, out.data(), mask.data());
  });
  tf::expect_clean("open_token_dataset", [&] { (void)open_token_dataset({path}, 3, 1000); });
  return 0;
}
