// Compressed tensor-parallel communication (parallel.tp_comm_compression): the payload of the
// transformer blocks' region edges (parallel/tensor_parallel.h) sent as bf16, or as int8 with one
// fp32 scale per row of C, optionally with error feedback; sums are always taken in fp32.
//
// The wire format of R rows of C values (packed into I32 words, so any Communicator moves it):
//   bf16     R C bf16 values (round to nearest even)                     2 bytes an element
//   int8     R fp32 scales s_i = max_j |x_ij| / 127, then R C int8 values  1 byte an element + 4 a row
//            q_ij = round(x_ij / s_i); x_ij ~ s_i q_ij, off by at most s_i / 2 = max_j |x_ij| / 254
//
// The collectives (p ranks, b the tensor's bytes uncompressed, w the wire bytes of b):
//   all-gather      each rank encodes its shard; the wire shards are all-gathered; every rank
//                   decodes every shard (its own too, so the ranks hold identical tensors).
//                   Sent: (p - 1) / p x w (as parallel/communicator.h counts an all-gather).
//   reduce-scatter  a two-phase all-to-all: rank r encodes chunk q of its partial tensor and sends it
//                   to rank q (q != r), then sums its own chunk (exact) and the p - 1 decoded ones
//                   in fp32. Sent: (p - 1) / p x w, the ring reduce-scatter's volume, compressed.
//                   (Summing inside a ring would re-quantize a partial sum at every hop.)
//   all-reduce      that reduce-scatter over p row ranges, then each rank encodes its summed range
//                   and sends it to every other rank; every rank decodes every range (its own too).
//                   Sent: 2 (p - 1) / p x w, the ring all-reduce's volume. Two quantizations.
// The all-to-all moves as point-to-point sends (Communicator::batch_send_recv), counted under
// `send` in the tp group's counters (tp_bytes_per_step in the metrics counts every kind).
//
// Error feedback ("int8-ef"): what a rank quantizes is its input plus the residual e its last
// quantization at the same place left, e <- (x + e) - decode(encode(x + e)), kept per (layer's
// site, edge, direction, phase) in TpCompression (owned by the trainer). The residual's sum over
// steps stays bounded, so the error of a sum over steps does not grow with the steps. The
// forward's gather (sequence parallel, entering a region) has no feedback: the backward gathers
// the region's input again and must see what the forward saw, which plain int8 repeats exactly.
// The staging of the wire and the received chunks is heap memory for the call (small next to the
// (B, T, C) staging buffers of the exact collectives, which the allocator counts).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/tensor.h"
#include "parallel/communicator.h"

namespace tessera {

enum class TpCompressionMode : uint8_t { None, Bf16, Int8, Int8Ef };

// "none", "bf16", "int8", "int8-ef"; anything else throws naming `key` and the accepted values.
TpCompressionMode parse_tp_compression(const std::string& value, const std::string& key);
const char* tp_compression_name(TpCompressionMode m);

// The two directions of a region edge: forward carries activations, backward their gradients.
enum class TpDirection : uint8_t { Forward, Backward };

// What parallel.tp_comm_compression{,_forward,_backward} ask for.
struct TpCompressionModes {
  TpCompressionMode forward = TpCompressionMode::None;
  TpCompressionMode backward = TpCompressionMode::None;
  TpCompressionMode of(TpDirection d) const { return d == TpDirection::Forward ? forward : backward; }
  bool any() const { return forward != TpCompressionMode::None || backward != TpCompressionMode::None; }
};

// The modes from the config keys: `both` (parallel.tp_comm_compression) for each direction whose
// own key (parallel.tp_comm_compression_forward / _backward) is "" (unset).
TpCompressionModes resolve_tp_compression(const std::string& both, const std::string& forward,
                                          const std::string& backward);
// Throws (naming the keys) where the modes cannot run: train.device = "cuda" (no CUDA kernels
// for the codecs yet). Forward error feedback runs under recomputation: the replayed forward reuses
// what the first one received (TpReceived below).
void check_tp_compression(const TpCompressionModes& modes, const std::string& device);

// ---- The codec (F32 rows of C values) ------------------------------------------------------

// I32 words of the wire format of `rows` rows of `cols` values (mode != None).
int64_t tp_wire_words(TpCompressionMode mode, int64_t rows, int64_t cols);
// wire (tp_wire_words) = the encoding of x (rows, cols), F32.
void tp_encode(TpCompressionMode mode, const float* x, int64_t rows, int64_t cols, int32_t* wire);
// x (rows, cols) = the decoding of wire (accumulate: x += it).
void tp_decode(TpCompressionMode mode, const int32_t* wire, int64_t rows, int64_t cols, float* x,
               bool accumulate = false);
// The encoding of x + e, with e (same shape) updated to (x + e) - decoded; e null: plain encode.
void tp_encode_with_feedback(TpCompressionMode mode, const float* x, float* e, int64_t rows, int64_t cols,
                             int32_t* wire);

// ---- Error-feedback state --------------------------------------------------------------------

// Where a compressed collective sits: the layer's site (TensorParallel::site), the edge of the
// region (enter: before the column layer; leave: after the row layer), the direction, and the
// phase (an all-reduce's second quantization is phase 1).
struct TpSlot {
  int site = -1;
  bool leave = false;
  TpDirection direction = TpDirection::Forward;
  int phase = 0;
  auto key() const { return std::tuple(site, leave, direction, phase); }
  bool operator<(const TpSlot& o) const { return key() < o.key(); }
};

// The compression of one run's tp collectives and, for "int8-ef", the residuals: one F32 buffer
// per slot, allocated on first use (MemCategory::Communication) and kept for the run (their size
// is tp_feedback_elements per layer; app/memory_check.cpp counts them).
class TpCompression {
 public:
  TpCompression(TpCompressionModes modes, Allocator& alloc) : modes_(modes), alloc_(&alloc) {}
  TpCompression(const TpCompression&) = delete;
  TpCompression& operator=(const TpCompression&) = delete;

  TpCompressionMode mode(TpDirection d) const { return modes_.of(d); }
  // The residual of `slot` for a tensor of n elements, zero the first time (and when n changes);
  // null when the direction has no error feedback or feedback is paused.
  float* residual(const TpSlot& slot, int64_t n);
  // Evaluation runs forwards that are no step of training: they neither read nor move the
  // residuals (Paused is the RAII form).
  void set_paused(bool paused) { paused_ = paused; }
  bool paused() const { return paused_; }
  int64_t residual_bytes() const;  // what the residuals hold now
  Allocator& allocator() const { return *alloc_; }
  void reset() { residuals_.clear(); }

  // The probe (parallel.tp_comm_compression_probe, a measurement): every compressed collective also
  // runs the exact one on the same input and adds the squared error of its result, and the
  // forward inputs' values over their row's max |x| (what the int8 grid sees) to a histogram of
  // kProbeBins bins over [-1, 1]. The exact collectives' bytes are set aside (probe_bytes), so the
  // counters less them are the compressed run's.
  static constexpr int kProbeBins = 64;
  struct ProbeError {
    double error2 = 0, exact2 = 0;  // sums of (compressed - exact)^2 and exact^2 over the calls
    int64_t calls = 0;
    // The results summed over the calls, compressed and exact: what error feedback keeps close
    // (||sum_got - sum_exact|| / ||sum_exact||), where the per-call error above may even grow.
    std::vector<double> sum_got, sum_exact;
    double summed_relative_error() const;
  };
  void set_probe(bool on) { probe_ = on; }
  bool probing() const { return probe_; }
  void add_probe(const TpSlot& slot, const float* got, const float* exact, int64_t n);
  void add_probe_values(const float* x, int64_t rows, int64_t cols);
  void add_probe_bytes(int64_t b) { probe_bytes_ += b; }
  const std::map<TpSlot, ProbeError>& probe_errors() const { return probe_errors_; }
  const std::vector<int64_t>& probe_histogram() const { return probe_histogram_; }
  int64_t probe_bytes() const { return probe_bytes_; }

  class Paused {
   public:
    explicit Paused(TpCompression* c) : c_(c) { if (c_) c_->set_paused(true); }
    ~Paused() { if (c_) c_->set_paused(false); }
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    TpCompression* c_;
  };

 private:
  TpCompressionModes modes_;
  Allocator* alloc_;
  bool paused_ = false;
  std::map<TpSlot, Buffer> residuals_;
  bool probe_ = false;
  std::map<TpSlot, ProbeError> probe_errors_;
  std::vector<int64_t> probe_histogram_ = std::vector<int64_t>(kProbeBins, 0);
  int64_t probe_bytes_ = 0;
};

// What a forward collective with error feedback received, kept for a recomputed forward
// (model.recompute = "full", "bubble", model.recompute_layers) to replay: the replay decodes these
// words instead of communicating, so the residual moves once per forward of a micro-batch and the
// replayed output is bit-equal to the first. The block asks for it (keep) when it will replay;
// the first call with feedback fills `wire` (MemCategory::Activations: kept for the backward, as
// tp_replay_words counts it), the next one replays it. Never filled without feedback (a paused
// evaluation, plain int8, bf16): those collectives repeat exactly when run again.
//   reduce-scatter  the p - 1 other ranks' encoded chunks of this rank's rows, in rank order
//   all-reduce      the encoded ranges of the sum (phase 2), every rank's, in rank order
struct TpReceived {
  bool keep = false;
  Buffer wire;  // I32 words
  bool recorded() const { return wire.defined(); }
};

// I32 words one region's forward leave keeps in a TpReceived (0 without forward "int8-ef"), for a
// micro-batch of B sequences of T positions, C channels, over tp ranks: sequence parallel, p - 1
// encoded chunks of B T / tp rows; plain tp, the encoded sum of all B T rows.
int64_t tp_replay_words(const TpCompressionModes& modes, int64_t B, int64_t T, int64_t C, int64_t tp,
                        bool sequence_parallel);

// Elements of the residuals one layer keeps under error feedback, for a micro-batch of B sequences
// of T positions, C channels, over tp ranks, per direction with "int8-ef": sequence parallel, the
// reduce-scatter's partial (B T C, the rank's own chunk idle) and backward the gather's shard
// (B T / tp C); plain tp, the all-reduce's partial (B T C) and its summed range (B T C / tp). Two
// regions a layer (attention, MLP).
int64_t tp_feedback_elements(const TpCompressionModes& modes, int64_t B, int64_t T, int64_t C, int64_t tp,
                             bool sequence_parallel);
// The factor by which a mode scales a tp collective's bytes for rows of C values (planner, docs):
// bf16 2 / 4, int8 (C + 4) / 4 C of fp32's; none 1.
double tp_bytes_factor(TpCompressionMode mode, int64_t C);

// ---- The compressed collectives (F32, contiguous, host memory) -----------------------------
// `slot.site` < 0 or mode None: never called (the caller runs the exact collective). c is the
// run's TpCompression (residuals); its mode for slot.direction is used.

// full (p, rows, cols) = every rank's local (rows, cols), decoded.
void compressed_all_gather(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& local,
                           const Tensor& full);
// local (rows, cols) = the sum over ranks of chunk rank() of full (p, rows, cols). received (may
// be null): recorded, the sum of this rank's chunk and the kept chunks, with no communication;
// else filled when it asks (keep) and the slot has a residual.
void compressed_reduce_scatter(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& full,
                               const Tensor& local, TpReceived* received = nullptr);
// In place: t = the sum over ranks of t (identical on every rank). received: as above (recorded,
// t = the kept ranges decoded).
void compressed_all_reduce(Communicator& comm, TpCompression& c, const TpSlot& slot, const Tensor& t,
                           TpReceived* received = nullptr);

}  // namespace tessera
