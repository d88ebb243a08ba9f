// Context parallelism's wiring: the group and each rank's share of a batch (context_parallel.h).
#include "app/context_parallel.h"

#include <utility>

namespace tessera {

ContextParallel context_parallel_of(const ParallelConfig& p, const GridComms* comms) {
  ContextParallel cp;
  cp.mode = parse_cp_comm(p.cp_comm);
  if (comms && p.cp > 1) cp.comm = comms->cp.get();
  return cp;
}

Batch cp_share(const Batch& b, const ContextParallel& cp) {
  if (!cp.active()) return b;
  const SequenceLayout seq = cp.layout(b.T);
  Batch out;
  out.B = b.B;
  out.T = seq.length();
  out.tokens.reserve(static_cast<size_t>(b.B * out.T));
  out.targets.reserve(static_cast<size_t>(b.B * out.T));
  const bool docs = !b.doc_start.empty();
  for (int64_t s = 0; s < b.B; ++s)
    for (const SequenceChunk& c : seq.chunks())
      for (int64_t p = c.start; p < c.end(); ++p) {
        out.tokens.push_back(b.tokens[static_cast<size_t>(s * b.T + p)]);
        out.targets.push_back(b.targets[static_cast<size_t>(s * b.T + p)]);
        if (docs) out.doc_start.push_back(b.doc_start[static_cast<size_t>(s * b.T + p)]);
        if (!b.doc_position.empty()) out.doc_position.push_back(b.doc_position[static_cast<size_t>(s * b.T + p)]);
      }
  // Every image of the batch, at its global start: the model writes the rows this rank holds.
  out.image_shape = b.image_shape;
  out.image_tokens = b.image_tokens;
  out.images = b.images;
  out.image_sample = b.image_sample;
  out.image_start = b.image_start;
  return out;
}

SequenceLayout share_layout(const Batch& share, const ContextParallel& cp, int64_t T) {
  const SequenceLayout seq = cp.layout(T);
  return share.doc_start.empty() ? seq : seq.with_documents(share.B, share.doc_start, share.doc_position);
}

}  // namespace tessera
