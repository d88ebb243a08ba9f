// TokenWindowDataset and the file helpers: windows are copied out segment by segment, ids checked
// as they are copied; globs via glob(3); format decided by the .idx beside a file and its magic.
#include "data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "kernels/check.h"

namespace tessera {

// ---- segments ----

TokenSegment whole_segment(std::shared_ptr<const IndexedDataset> ds) {
  return document_segment(ds, 0, ds->num_documents());
}

TokenSegment whole_segment(std::shared_ptr<const LlmcShard> shard) {
  TokenSpan t = shard->tokens();
  std::string path = shard->path();
  return TokenSegment{std::move(shard), t, std::move(path), 0};
}

TokenSegment document_segment(std::shared_ptr<const IndexedDataset> ds, int64_t first, int64_t last) {
  TESSERA_CHECK(0 <= first && first <= last && last <= ds->num_documents(), "documents [", first, ", ", last,
                ") outside ", ds->prefix(), " (", ds->num_documents(), " documents)");
  const int64_t begin = ds->document_token_offset(first), end = ds->document_token_offset(last);
  TokenSpan t = ds->tokens().subspan(begin, end - begin);
  std::string path = ds->bin_path();
  std::shared_ptr<const LossMaskFile> mask = open_loss_mask(ds->prefix(), ds->num_tokens());
  return TokenSegment{std::move(ds), t, std::move(path), begin, std::move(mask)};
}

// ---- TokenWindowDataset ----

TokenWindowDataset::TokenWindowDataset(std::vector<TokenSegment> segments, int64_t seq_len, int64_t vocab_size,
                                       int64_t eager_check_bytes)
    : segments_(std::move(segments)), seq_len_(seq_len), vocab_size_(vocab_size) {
  TESSERA_CHECK(!segments_.empty(), "token dataset: no files given");
  TESSERA_CHECK(seq_len > 0, "token dataset ", source_name(), ": sequence length must be positive, got ", seq_len);
  TESSERA_CHECK(vocab_size > 0, "token dataset ", source_name(), ": vocabulary size must be positive, got ",
                vocab_size);
  starts_.push_back(0);
  int64_t bytes = 0;
  for (const auto& s : segments_) {
    starts_.push_back(starts_.back() + s.tokens.size());
    bytes += s.tokens.size() * token_dtype_size(s.tokens.dtype());
  }
  const int64_t n = num_tokens();
  TESSERA_CHECK(n > 0, "token dataset ", source_name(), " holds no tokens");
  TESSERA_CHECK(n >= seq_len + 1, "sequence length ", seq_len, " needs at least ", seq_len + 1, " tokens; ",
                source_name(), " has ", n);
  num_samples_ = (n - 1) / seq_len;
  if (bytes <= eager_check_bytes) check_all_ids();
}

std::string TokenWindowDataset::source_name() const {
  if (segments_.empty()) return "(none)";
  std::string s = segments_[0].path;
  if (segments_.size() > 1) s += " and " + std::to_string(segments_.size() - 1) + " more files";
  return s;
}

size_t TokenWindowDataset::segment_of(int64_t stream_position) const {
  // The last segment whose start is <= position (empty segments are skipped over by upper_bound).
  return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), stream_position) - starts_.begin() - 1);
}

void TokenWindowDataset::fail_bad_id(int64_t stream_position, int64_t id) const {
  const TokenSegment& s = segments_[segment_of(stream_position)];
  const int64_t pos = s.first_position + (stream_position - starts_[segment_of(stream_position)]);
  detail::fail("token id ", id, " at token position ", pos, " of ", s.path, " is outside the model vocabulary [0, ",
               vocab_size_, ") (data prepared with another tokenizer, or model.vocab_size too small?)");
}

void TokenWindowDataset::check_all_ids() const {
  for (size_t k = 0; k < segments_.size(); ++k) {
    const TokenSpan& t = segments_[k].tokens;
    if (const auto at = t.find_out_of_range(vocab_size_)) fail_bad_id(starts_[k] + *at, t[*at]);
  }
}

void TokenWindowDataset::get(int64_t index, int32_t* out, uint8_t* loss_mask) const {
  TESSERA_CHECK(index >= 0 && index < num_samples_, "sample index ", index, " outside ", describe());
  read(index * seq_len_, seq_len_ + 1, out, loss_mask);
}

void TokenWindowDataset::read(int64_t begin, int64_t count, int32_t* out, uint8_t* loss_mask) const {
  TESSERA_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens(), "tokens [", begin, ", ", begin + count,
                ") outside ", describe());
  int64_t done = 0;
  for (size_t k = segment_of(begin); done < count; ++k) {
    const int64_t from = begin + done - starts_[k];  // position within segment k
    const int64_t n = std::min(count - done, segments_[k].tokens.size() - from);
    segments_[k].tokens.copy_to(from, n, out + done);
    done += n;
  }
  for (int64_t i = 0; i < count; ++i)
    if (out[i] < 0 || out[i] >= vocab_size_) fail_bad_id(begin + i, out[i]);
  if (loss_mask) copy_loss_mask(begin, count, loss_mask);
}

void TokenWindowDataset::copy_loss_mask(int64_t begin, int64_t count, uint8_t* out) const {
  int64_t done = 0;
  for (size_t k = segment_of(begin); done < count; ++k) {
    const TokenSegment& s = segments_[k];
    const int64_t from = begin + done - starts_[k];
    const int64_t n = std::min(count - done, s.tokens.size() - from);
    if (s.mask)
      s.mask->read(s.first_position + from, n, out + done);
    else
      std::fill(out + done, out + done + n, uint8_t{1});
    done += n;
  }
}

std::string TokenWindowDataset::describe() const {
  std::ostringstream os;
  os << source_name() << " (" << num_tokens() << " tokens; " << num_samples_ << " windows of " << seq_len_
     << " + 1)";
  return os.str();
}

// ---- finding and opening files ----

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  ::globfree(&g);
  TESSERA_CHECK(rc != GLOB_NOSPACE && rc != GLOB_ABORTED, "cannot expand ", pattern, ": read error");
  TESSERA_CHECK(!paths.empty(), "no files match ", pattern);
  std::sort(paths.begin(), paths.end());
  return paths;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }
}  // namespace

TokenFileFormat detect_token_format(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string prefix = indexed_dataset_prefix(path);
  if (ends_with(path, ".idx") || fs::exists(prefix + ".idx")) return TokenFileFormat::kIndexed;
  if (fs::is_regular_file(path) && has_llmc_magic(path)) return TokenFileFormat::kLlmcShard;
  TESSERA_CHECK(fs::exists(path) || fs::exists(prefix + ".bin"), "missing data file ", path);
  detail::fail(path, " is neither an llm.c token shard (int32 ", kLlmcMagic, " or ", kLlmcLlama3Magic,
               " in its first 4 bytes) nor an ",
               "indexed dataset (", prefix, ".idx is missing)");
}

std::vector<TokenSegment> open_token_segments(const std::vector<std::string>& paths) {
  std::vector<TokenSegment> segments;
  std::set<std::string> seen;  // indexed prefixes and shard paths already opened
  for (const auto& arg : paths) {
    const std::vector<std::string> files = is_glob(arg) ? expand_glob(arg) : std::vector<std::string>{arg};
    for (const auto& f : files) {
      const TokenFileFormat format = detect_token_format(f);
      const std::string key = format == TokenFileFormat::kIndexed ? indexed_dataset_prefix(f) : f;
      if (!seen.insert(key).second) continue;
      if (format == TokenFileFormat::kIndexed)
        segments.push_back(whole_segment(std::make_shared<const IndexedDataset>(f)));
      else
        segments.push_back(whole_segment(std::make_shared<const LlmcShard>(f)));
    }
  }
  return segments;
}

std::unique_ptr<TokenWindowDataset> open_token_dataset(const std::vector<std::string>& paths, int64_t seq_len,
                                                       int64_t vocab_size) {
  return std::make_unique<TokenWindowDataset>(open_token_segments(paths), seq_len, vocab_size);
}

// ---- validation split ----

int64_t validation_first_document(int64_t num_documents, double fraction, const std::string& what) {
  TESSERA_CHECK(fraction >= 0 && fraction < 1, what, ": validation fraction must be in [0, 1), got ", fraction);
  if (fraction == 0) return num_documents;
  TESSERA_CHECK(num_documents >= 2, what, ": a validation fraction of ", fraction, " needs at least 2 documents, ",
                "there are ", num_documents, " (split the input into documents, e.g. with --separator)");
  // The tolerance makes e.g. (1 - 0.9) * 10 = 0.99999... count as 1.
  auto first = static_cast<int64_t>(std::floor((1.0 - fraction) * double(num_documents) + 1e-6));
  return std::clamp<int64_t>(first, 1, num_documents - 1);
}

TrainValSegments split_documents(std::shared_ptr<const IndexedDataset> ds, double val_fraction) {
  const int64_t n = ds->num_documents();
  const int64_t first = validation_first_document(n, val_fraction, ds->prefix());
  return {document_segment(ds, 0, first), document_segment(ds, first, n)};
}

}  // namespace tessera
