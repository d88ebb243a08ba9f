// Tests data/dataset.h's packed-document marking (data.document_mask): each token's document start
// from the end-of-text ids of a window, per sequence of a batch.
#include "data/dataset.h"

#include <gtest/gtest.h>

#include <vector>

#include "error_testing.h"

namespace tessera {
namespace {

TEST(DocumentStarts, EotBelongsToTheDocumentItEnds) {
  const std::vector<int32_t> ids = {5, 9, 7, 7, 9, 9, 3};  // eot = 9
  EXPECT_EQ(document_starts(ids.data(), 7, 9), (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 6}));
  // No eot: one document; an eot first: the next token starts a document; an eot last ends one.
  const std::vector<int32_t> none = {1, 2, 3};
  EXPECT_EQ(document_starts(none.data(), 3, 9), (std::vector<int32_t>{0, 0, 0}));
  const std::vector<int32_t> edges = {9, 1, 9};
  EXPECT_EQ(document_starts(edges.data(), 3, 9), (std::vector<int32_t>{0, 1, 1}));
}

TEST(DocumentStarts, MarksEachSequenceOfABatch) {
  Batch b;
  b.B = 2;
  b.T = 4;
  b.tokens = {0, 9, 1, 1, /**/ 1, 1, 1, 9};
  b.targets = b.tokens;
  mark_documents(b, 9);
  EXPECT_EQ(b.doc_start, (std::vector<int32_t>{0, 0, 2, 2, 0, 0, 0, 0}));
  b.tokens.pop_back();
  EXPECT_TRUE(testing::throws_with([&] { mark_documents(b, 9); }, {"mark_documents: 7 token ids", "2 x 4"}));
}

}  // namespace
}  // namespace tessera
