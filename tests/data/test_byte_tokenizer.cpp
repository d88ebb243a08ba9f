// Tests ByteTokenizer (data/tokenizer.h): the identity on any bytes, and its end-of-document id.
#include <random>

#include "data/tokenizer.h"
#include "kernels/check.h"
#include "testing.h"

namespace tessera {
namespace {

TEST(ByteTokenizer, RoundTripsRandomBytes) {
  ByteTokenizer tok;
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s(rng() % 1000, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    std::vector<int32_t> ids = tok.encode(s);
    ASSERT_EQ(ids.size(), s.size());
    for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(ids[i], static_cast<unsigned char>(s[i]));
    ASSERT_EQ(tok.decode(ids), s);
  }
}

TEST(ByteTokenizer, HasAnEndOfDocumentIdAfterTheBytes) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eot_id(), 256);
  EXPECT_EQ(tok.name(), "byte");
  EXPECT_EQ(tok.decode({'a', 256, 'b'}), "ab");  // the separator has no bytes
  EXPECT_EQ(tok.encode("<|endoftext|>", true).size(), 13u);
  EXPECT_THROW(tok.decode({257}), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
  EXPECT_EQ(make_tokenizer("byte", "ignored")->name(), "byte");
}

}  // namespace
}  // namespace tessera
