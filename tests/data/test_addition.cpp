// Tests data/addition.h: tokenizer, problem text, the train/validation split and sample windows.
#include "data/addition.h"

#include <set>

#include "testing.h"

namespace tessera {

TEST(CharTokenizer, RoundTripsAndRejectsForeignCharacters) {
  CharTokenizer tok;
  const std::string s = "37+45=82\n";
  EXPECT_EQ(tok.decode(tok.encode(s)), s);
  EXPECT_EQ(tok.encode("0+9=\n"), (std::vector<int32_t>{0, 10, 9, 11, 12}));
  EXPECT_THROW(tok.encode("3x4"), Error);
  EXPECT_THROW(tok.decode({13}), Error);
}

TEST(AdditionTask, ProblemsAreCorrectDeterministicAndSplit) {
  AdditionTask task(2, 99), same(2, 99), other(2, 100);
  std::set<std::pair<int64_t, int64_t>> train, val;
  int differ = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    AdditionProblem p = task.problem(i, false), q = task.problem(i, true);
    EXPECT_EQ(p.text(), same.problem(i, false).text());
    differ += p.text() != other.problem(i, false).text();
    EXPECT_LT(p.a, 100);
    EXPECT_LT(p.b, 100);
    EXPECT_EQ(std::stoll(p.answer()), p.a + p.b);
    EXPECT_EQ(p.text(), p.prompt() + p.answer() + "\n");
    EXPECT_FALSE(task.held_out(p.a, p.b));
    EXPECT_TRUE(task.held_out(q.a, q.b));
    train.insert({p.a, p.b});
    val.insert({q.a, q.b});
  }
  EXPECT_GT(differ, 1500);
  for (const auto& pair : val) EXPECT_EQ(train.count(pair), 0u);
  // Roughly 1/16 of the 10,000 pairs are held out; the validation split draws from all of them.
  int held = 0;
  for (int a = 0; a < 100; ++a)
    for (int b = 0; b < 100; ++b) held += task.held_out(a, b);
  EXPECT_GT(held, 10000 / 16 - 150);
  EXPECT_LT(held, 10000 / 16 + 150);
  EXPECT_THROW(AdditionTask(0, 1), Error);
}

TEST(AdditionDataset, SamplesAreWindowsOfWholeProblemsAndBatchesShiftByOne) {
  AdditionTask task(2, 7);
  AdditionDataset ds(task, false, 16, 100);
  std::vector<int32_t> w(17);
  std::vector<uint8_t> mask(17);
  ds.get(3, w.data(), mask.data());
  const std::string text = task.problem(3 * 17, false).text() + task.problem(3 * 17 + 1, false).text() +
                           task.problem(3 * 17 + 2, false).text();
  EXPECT_EQ(task.tokenizer().decode(w), text.substr(0, 17));
  Batch b = make_batch(ds, {3, 5});
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.T, 16);
  // Only answer characters and their newline are targets: "a+b=" positions are masked.
  const std::string prefix = text.substr(0, 17);
  for (int t = 0; t < 16; ++t) {
    EXPECT_EQ(b.tokens[t], w[t]);
    EXPECT_EQ(b.targets[t], mask[t + 1] ? w[t + 1] : kIgnoreTarget);
  }
  const std::string first = task.problem(3 * 17, false).text();
  const size_t eq = first.find('=');
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(mask[i], i > eq) << "position " << i << " of " << first;
  EXPECT_THROW(make_batch(ds, {100}), Error);
}

}  // namespace tessera
