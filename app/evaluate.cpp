// Validation loss and greedy-answer accuracy. Prompts are grouped by length so each group runs
// as one batch.
#include "app/evaluate.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>

#include "app/context_parallel.h"
#include "data/tokenizer.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/tensor.h"
#include "parallel/host_sums.h"

namespace tessera {

namespace {
// Host ids (B, T) copied to the model's device.
Buffer device_ids(const Exec& ex, Allocator& alloc, std::vector<int32_t>& v, int64_t B, int64_t T) {
  return upload(ex, alloc, Tensor(v.data(), DType::I32, {B, T}), MemCategory::Activations);
}

template <typename T>
int32_t argmax_row(const T* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

// The argmax of every row of logits (B, V) on ex's device, read to the host first.
std::vector<int32_t> argmax_rows(const Exec& ex, const Tensor& logits) {
  const int64_t B = logits.dim(0), V = logits.dim(1);
  std::vector<int32_t> best;
  auto on_host = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> host(static_cast<size_t>(B * V));
    copy(ex, Tensor(host.data(), dtype_of<T>(), {B, V}), logits);
    synchronize(ex);
    for (int64_t b = 0; b < B; ++b) best.push_back(argmax_row(host.data() + b * V, V));
  };
  if (logits.dtype == DType::F64)
    on_host(double{});
  else
    on_host(float{});
  return best;
}

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Reads a batch and asks the gate; nothing when it gives up. Without a gate a read error is thrown.
std::optional<Batch> gated_batch(const Dataset& ds, const std::vector<int64_t>& idx, const EvalGate& gate) {
  if (!gate) return make_batch(ds, idx);
  std::optional<Batch> batch;
  std::string error;
  try {
    batch = make_batch(ds, idx);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!gate(error)) return std::nullopt;
  TESSERA_CHECK(error.empty(), error);  // a gate that went on despite the error: report it here
  return batch;
}

// The chunks a rank runs: link.chunks, or the one model given.
std::vector<const Gpt*> chunks_of(const Gpt& model, const PipelineLink& link) {
  return link.chunks.empty() ? std::vector<const Gpt*>{&model} : link.chunks;
}

// One batch's forward, ids (B, T) on the host at the positions seq (this cp rank's share, or the
// whole sequence, which every model attends locally), through this rank's chunks in virtual-stage order:
// the chunk with the embedding reads the ids, every other one the previous virtual stage's
// activations (B, T / link.sequence_shards, C), received over link.pp (tag: the receiving virtual
// stage) and its output sent on; the chunk with the head (targets uploaded when given) calls
// at_head(chunk, ctx) instead. On a whole model (no link.pp) that is the model's forward.
void pipeline_forward(const Exec& ex, const Gpt& model, Allocator& alloc, const PipelineLink& link,
                      std::vector<int32_t>& ids, std::vector<int32_t>* targets, int64_t B, int64_t T,
                      const SequenceLayout& seq, const std::function<void(const Gpt& head, GptCtx& ctx)>& at_head,
                      const ImageInput* images = nullptr) {
  const std::vector<const Gpt*> chunks = chunks_of(model, link);
  const int64_t pp = link.pp ? link.pp->size() : 1, rank = link.pp ? link.pp->rank() : 0;
  const int64_t stages = pp * static_cast<int64_t>(chunks.size());
  for (int64_t v = rank; v < stages; v += pp) {
    const Gpt& chunk = *chunks[static_cast<size_t>(v / pp)];
    const StageSpec& stage = chunk.stage();
    Buffer tokens, input, target_ids;
    if (stage.embedding) {
      tokens = device_ids(ex, alloc, ids, B, T);
    } else {
      input = Buffer(alloc, DType::F32, {B, T / link.sequence_shards, chunk.config().n_embd}, MemCategory::Activations);
      link.pp->recv(input, static_cast<int>((v - 1) % pp), static_cast<int>(v));
    }
    if (stage.head && targets) target_ids = device_ids(ex, alloc, *targets, B, T);
    GptCtx ctx;
    const Tensor out = chunk.forward(ex, ctx, alloc, stage.embedding ? tokens.tensor() : input.tensor(), target_ids, seq,
                                     stage.embedding ? images : nullptr);
    if (stage.head)
      at_head(chunk, ctx);
    else
      link.pp->send(out, static_cast<int>((v + 1) % pp), static_cast<int>(v + 1));
  }
}
}  // namespace

DeviceImages upload_images(const Exec& ex, Allocator& alloc, const Batch& b, const ModelConfig& cfg, DType dt) {
  DeviceImages d;
  if (b.num_images() == 0) return d;
  TESSERA_CHECK(cfg.is_vlm(), "the batch holds ", b.num_images(), " images but model.kind = \"", cfg.kind,
                "\" has no vision encoder; set model.kind = \"vlm\"");
  const VisionConfig& v = cfg.vision;
  TESSERA_CHECK(b.image_shape == (ImageShape{v.image_size, v.image_size, v.channels}), "the data's images are ",
                b.image_shape.height, "x", b.image_shape.width, "x", b.image_shape.channels, " but the vision encoder reads ",
                v.image_size, "x", v.image_size, "x", v.channels, " (vision.image_size, vision.channels)");
  TESSERA_CHECK(b.image_tokens == v.num_patches(), "the data gives each image ", b.image_tokens,
                " placeholder tokens but the vision encoder makes ", v.num_patches(),
                " patch embeddings ((vision.image_size / vision.patch_size)^2)");
  const int64_t N = b.num_images(), P = v.num_patches(), K = v.patch_dim();
  const Shape shape{N, P, K};
  if (dt == DType::F64) {
    std::vector<double> host(static_cast<size_t>(N * P * K));
    patchify(b.images.data(), N, b.image_shape, v.patch_size, host.data());
    d.patches = upload(ex, alloc, Tensor(host.data(), DType::F64, shape), MemCategory::Activations);
  } else {
    std::vector<float> host(static_cast<size_t>(N * P * K));
    patchify(b.images.data(), N, b.image_shape, v.patch_size, host.data());
    d.patches = upload(ex, alloc, Tensor(host.data(), DType::F32, shape), MemCategory::Activations);
  }
  d.input = ImageInput{d.patches, b.image_sample, b.image_start};
  return d;
}

std::optional<double> validation_loss(const Exec& ex, const Gpt& model, Allocator& alloc, const Dataset& val,
                                      int64_t batches, int64_t micro_batch, const EvalGate& gate,
                                      const PipelineLink& link, int32_t document_eot) {
  bool head = false;  // this rank holds the last chunk
  const Buffer sums(alloc, DType::F64, {2}, MemCategory::Workspace);  // loss sum, targets: read once
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> idx(static_cast<size_t>(micro_batch));
    std::iota(idx.begin(), idx.end(), b * micro_batch);
    for (auto& i : idx) i %= val.num_samples();
    std::optional<Batch> gated = gated_batch(val, idx, gate);
    if (!gated) return std::nullopt;
    if (document_eot >= 0) mark_documents(*gated, document_eot);
    const DeviceImages images = gated->num_images() > 0 ? upload_images(ex, alloc, *gated, model.config(),
                                                                         model.dtype()) : DeviceImages{};
    Batch batch = cp_share(*gated, link.cp);
    const SequenceLayout seq = share_layout(batch, link.cp, gated->T);  // this cp rank's positions
    pipeline_forward(ex, model, alloc, link, batch.tokens, &batch.targets, batch.B, batch.T, seq,
                     [&](const Gpt&, GptCtx& ctx) {
                       accumulate(ex, sums, ctx.loss_sums);
                       head = true;
                     }, images.get());
  }
  if (!link.pp && !link.cp.active()) return read_loss_sums(ex, sums).mean();
  const LossSums mine = head ? read_loss_sums(ex, sums) : LossSums{};
  std::vector<double> total = {mine.loss_sum, static_cast<double>(mine.targets)};
  if (link.pp) sum_over_group(total, link.pp);
  if (link.cp.active()) sum_over_group(total, link.cp.comm);
  return total[1] > 0 ? total[0] / total[1] : 0.0;
}

std::optional<std::vector<std::vector<int32_t>>> greedy_generate(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                                 int64_t max_new, const EvalGate& gate,
                                                                 const PipelineLink& link) {
  std::vector<std::vector<int32_t>> seqs = prompts;
  if (seqs.empty()) return seqs;
  const int64_t B = static_cast<int64_t>(seqs.size());
  const int64_t V = model.config().vocab_size;
  for (int64_t step = 0; step < max_new; ++step) {
    if (gate && !gate("")) return std::nullopt;
    // Sequence parallelism needs a length divisible by tp: pad on the right (token 0), which
    // causal attention hides from the positions before it.
    const int64_t T = static_cast<int64_t>(seqs[0].size()), Tp = round_up(T, model.seq_multiple());
    std::vector<int32_t> tokens;
    tokens.reserve(static_cast<size_t>(B * Tp));
    for (const auto& s : seqs) {
      tokens.insert(tokens.end(), s.begin(), s.end());
      tokens.insert(tokens.end(), static_cast<size_t>(Tp - T), 0);
    }
    // The stage with the head picks the next ids; under a pipeline they reach every stage as a sum
    // over the pipeline group (the other stages add zeros; ids are exact in a double).
    std::vector<double> next(static_cast<size_t>(B), 0.0);
    pipeline_forward(ex, model, alloc, link, tokens, nullptr, B, Tp, SequenceLayout::contiguous(Tp), [&](const Gpt& head, GptCtx& ctx) {
      Buffer last(alloc, ctx.logits.tensor().dtype, {B, V}, MemCategory::Workspace);
      head.logits_at(ex, ctx, alloc, T - 1, last);
      const std::vector<int32_t> best = argmax_rows(ex, last);
      for (int64_t b = 0; b < B; ++b) next[static_cast<size_t>(b)] = best[static_cast<size_t>(b)];
    });
    sum_over_group(next, link.pp);
    for (int64_t b = 0; b < B; ++b) seqs[b].push_back(static_cast<int32_t>(next[static_cast<size_t>(b)]));
  }
  return seqs;
}

std::optional<AccuracyResult> addition_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                const AdditionTask& task, int64_t examples, const EvalGate& gate,
                                                const PipelineLink& link) {
  const CharTokenizer& tok = task.tokenizer();
  std::map<size_t, std::vector<AdditionProblem>> by_length;
  for (int64_t i = 0; i < examples; ++i) {
    AdditionProblem p = task.problem(static_cast<uint64_t>(i), /*validation=*/true);
    by_length[p.prompt().size()].push_back(p);
  }
  AccuracyResult r;
  const int64_t max_new = task.digits() + 2;  // the longest answer plus its newline
  for (const auto& [length, problems] : by_length) {
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& p : problems) prompts.push_back(tok.encode(p.prompt()));
    const auto generated = greedy_generate(ex, model, alloc, prompts, max_new, gate, link);
    if (!generated) return std::nullopt;
    const auto& outs = *generated;
    for (size_t i = 0; i < problems.size(); ++i) {
      std::vector<int32_t> tail(outs[i].begin() + static_cast<int64_t>(length), outs[i].end());
      std::string answer = tok.decode(tail);
      answer = answer.substr(0, answer.find('\n'));
      const bool ok = answer == problems[i].answer();
      r.correct += ok;
      ++r.total;
      if (r.examples.size() < 3)
        r.examples.push_back(problems[i].prompt() + answer + (ok ? "" : " (expected " + problems[i].answer() + ")"));
    }
  }
  return r;
}

}  // namespace tessera

namespace tessera {

std::optional<AccuracyResult> caption_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc,
                                               const SceneTask& task, int64_t examples, int64_t micro_batch,
                                               const EvalGate& gate, const PipelineLink& link) {
  const ModelConfig& cfg = model.config();
  const SceneTokenizer& tok = task.tokenizer();
  // Sequence parallelism needs a length divisible by tp: the padding (end-of-text ids) comes after
  // every position read, which causal attention hides it from. train.seq_len (a multiple of tp
  // there, at least P + kMaxCaptionTokens) bounds the padded length.
  const int64_t P = cfg.vision.num_patches(), Tc = P + SceneTask::kMaxCaptionTokens, V = cfg.vocab_size;
  const int64_t T = round_up(Tc, model.seq_multiple());
  const DType dt = model.dtype();
  AccuracyResult r;
  for (int64_t first = 0; first < examples; first += micro_batch) {
    const int64_t B = std::min(micro_batch, examples - first);
    Batch b;
    b.B = B;
    b.T = T;
    b.image_shape = {task.image_size(), task.image_size(), 3};
    b.image_tokens = P;
    b.tokens.assign(static_cast<size_t>(B * T), tok.eos_id());
    std::vector<std::string> want;
    for (int64_t i = 0; i < B; ++i) {
      const Scene sc = task.scene(static_cast<uint64_t>(first + i), /*validation=*/true);
      want.push_back(sc.caption);
      b.images.insert(b.images.end(), sc.image.begin(), sc.image.end());
      b.image_sample.push_back(i);
      b.image_start.push_back(0);
      std::fill(b.tokens.begin() + i * T, b.tokens.begin() + i * T + P, tok.placeholder_id());
    }
    // The patches go to the rank whose chunks hold the embedding (the encoder's).
    const std::vector<const Gpt*> chunks = chunks_of(model, link);
    const bool encoder = std::any_of(chunks.begin(), chunks.end(), [](const Gpt* c) { return c->stage().embedding; });
    const DeviceImages images = encoder ? upload_images(ex, alloc, b, cfg, dt) : DeviceImages{};
    std::vector<bool> done(static_cast<size_t>(B), false);
    for (int64_t k = 0; k < SceneTask::kMaxCaptionTokens; ++k) {
      if (gate && !gate("")) return std::nullopt;
      // The stage with the head picks the next ids; under a pipeline they reach every stage as a
      // sum over the pipeline group (as greedy_generate).
      std::vector<double> next(static_cast<size_t>(B), 0.0);
      pipeline_forward(ex, model, alloc, link, b.tokens, nullptr, B, T, SequenceLayout::contiguous(T),
                       [&](const Gpt& head, GptCtx& ctx) {
                         Buffer logits(alloc, dt, {B, V}, MemCategory::Workspace);
                         head.logits_at(ex, ctx, alloc, P - 1 + k, logits);
                         const std::vector<int32_t> best = argmax_rows(ex, logits);
                         for (int64_t i = 0; i < B; ++i) next[static_cast<size_t>(i)] = best[static_cast<size_t>(i)];
                       },
                       images.get());
      sum_over_group(next, link.pp);
      bool all = true;
      for (int64_t i = 0; i < B; ++i) {
        if (done[static_cast<size_t>(i)]) continue;
        b.tokens[static_cast<size_t>(i * T + P + k)] = static_cast<int32_t>(next[static_cast<size_t>(i)]);
        done[static_cast<size_t>(i)] = next[static_cast<size_t>(i)] == tok.eos_id();
        all = all && done[static_cast<size_t>(i)];
      }
      if (all) break;
    }
    for (int64_t i = 0; i < B; ++i) {
      const std::vector<int32_t> gen(b.tokens.begin() + i * T + P, b.tokens.begin() + i * T + Tc);
      const std::string got = tok.decode(gen);
      const bool ok = done[static_cast<size_t>(i)] && got == want[static_cast<size_t>(i)];
      r.correct += ok ? 1 : 0;
      ++r.total;
      if (r.examples.size() < 2) r.examples.push_back(got + (ok ? "" : " (" + want[static_cast<size_t>(i)] + ")"));
    }
  }
  return r;
}

std::optional<AccuracyResult> image_text_caption_accuracy(const Exec& ex, const Gpt& model, Allocator& alloc,
                                                          const ImageTextDataset& val, int64_t examples,
                                                          int64_t micro_batch, const CaptionDecoder& decode,
                                                          const EvalGate& gate) {
  const ImageTextData& d = val.data();
  const ModelConfig& cfg = model.config();
  const int64_t P = cfg.vision.num_patches(), V = cfg.vocab_size, window = val.seq_len() + 1;
  const DType dt = model.dtype();
  // Each scored sample: its prompt (up to its last placeholder) and the caption ids after it
  // (without the closing pad id), grouped by prompt length.
  struct Item {
    int64_t sample;
    std::vector<int32_t> prompt, want;
  };
  std::map<size_t, std::vector<Item>> by_length;
  for (int64_t s = 0, taken = 0; s < d.num_samples() && taken < examples; ++s) {
    if (d.image_index[s] < 0) continue;
    const auto begin = d.tokens.begin() + d.offsets[s], end = d.tokens.begin() + d.offsets[s + 1];
    const auto last = std::find(std::make_reverse_iterator(end), std::make_reverse_iterator(begin), d.placeholder_id).base();
    Item it{s, std::vector<int32_t>(begin, last), std::vector<int32_t>(last, end)};
    if (!it.want.empty() && it.want.back() == d.pad_id) it.want.pop_back();
    by_length[it.prompt.size()].push_back(std::move(it));
    ++taken;
  }
  auto text = [&](const std::vector<int32_t>& ids) {
    if (decode) return decode(ids);
    std::string s;
    for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
    return s;
  };
  AccuracyResult r;
  for (const auto& [L, items] : by_length) {
    const int64_t len = static_cast<int64_t>(L), max_new = window - len;
    if (max_new <= 0) continue;
    const int64_t T = round_up(window - 1, model.seq_multiple());  // the last position read is window - 2
    for (size_t first = 0; first < items.size(); first += static_cast<size_t>(micro_batch)) {
      const int64_t B = std::min<int64_t>(micro_batch, static_cast<int64_t>(items.size() - first));
      Batch b;
      b.B = B;
      b.T = T;
      b.image_shape = d.image_shape;
      b.image_tokens = P;
      b.tokens.assign(static_cast<size_t>(B * T), d.pad_id);
      for (int64_t i = 0; i < B; ++i) {
        const Item& it = items[first + static_cast<size_t>(i)];
        std::copy(it.prompt.begin(), it.prompt.end(), b.tokens.begin() + i * T);
        b.images.resize(static_cast<size_t>((i + 1) * d.image_shape.numel()));
        val.get_image(it.sample, b.images.data() + i * d.image_shape.numel());
        b.image_sample.push_back(i);
        b.image_start.push_back(std::find(it.prompt.begin(), it.prompt.end(), d.placeholder_id) - it.prompt.begin());
      }
      const DeviceImages images = upload_images(ex, alloc, b, cfg, dt);
      std::vector<bool> done(static_cast<size_t>(B), false);
      std::vector<std::vector<int32_t>> got(static_cast<size_t>(B));
      for (int64_t k = 0; k < max_new; ++k) {
        if (gate && !gate("")) return std::nullopt;
        Buffer ids = device_ids(ex, alloc, b.tokens, B, T);
        GptCtx ctx;
        model.forward(ex, ctx, alloc, ids, Tensor(), {}, images.get());
        Buffer logits(alloc, dt, {B, V}, MemCategory::Workspace);
        model.logits_at(ex, ctx, alloc, len - 1 + k, logits);
        const std::vector<int32_t> next = argmax_rows(ex, logits);
        bool all = true;
        for (int64_t i = 0; i < B; ++i) {
          const size_t u = static_cast<size_t>(i);
          if (done[u]) continue;
          done[u] = next[u] == d.pad_id;
          if (!done[u]) {
            got[u].push_back(next[u]);
            if (len + k < T) b.tokens[static_cast<size_t>(i * T + len + k)] = next[u];
          }
          all = all && done[u];
        }
        if (all) break;
      }
      for (int64_t i = 0; i < B; ++i) {
        const Item& it = items[first + static_cast<size_t>(i)];
        const bool ok = done[static_cast<size_t>(i)] && got[static_cast<size_t>(i)] == it.want;
        r.correct += ok ? 1 : 0;
        ++r.total;
        r.outcomes.push_back({it.sample, text(got[static_cast<size_t>(i)]), text(it.want), ok});
        if (r.examples.size() < 2)
          r.examples.push_back(r.outcomes.back().generated + (ok ? "" : " (" + r.outcomes.back().expected + ")"));
      }
    }
  }
  std::sort(r.outcomes.begin(), r.outcomes.end(),
            [](const CaptionOutcome& x, const CaptionOutcome& y) { return x.sample < y.sample; });
  return r;
}

CaptionDecoder known_ids_decoder(const Tokenizer& tok) {
  return [&tok](const std::vector<int32_t>& ids) {
    std::vector<int32_t> known;
    for (int32_t id : ids)
      if (id >= 0 && id < tok.vocab_size()) known.push_back(id);
    return tok.decode(known);
  };
}

}  // namespace tessera
