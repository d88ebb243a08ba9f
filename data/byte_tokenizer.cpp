// ByteTokenizer: the identity on bytes, plus one end-of-document id.
#include <string>

#include "data/tokenizer.h"
#include "kernels/check.h"

namespace tessera {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id == eot_id()) continue;  // the document separator has no bytes
    TESSERA_CHECK(id >= 0 && id < 256, "byte tokenizer: id ", id, " is outside [0, 257)");
    out.push_back(static_cast<char>(id));
  }
  return out;
}

}  // namespace tessera
