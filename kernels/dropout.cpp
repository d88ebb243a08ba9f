// Dropout's front and its CPU loop: the mask drawn element by element from the coordinates
// (kernels/dropout.h), four features per Philox call.
#include "kernels/dropout.h"

#include <algorithm>
#include <cmath>

#include "kernels/check.h"
#include "kernels/front.h"

namespace tessera {
namespace {

constexpr double kTwo32 = 4294967296.0;

// The 32-bit threshold a word must reach to keep its element: ceil(p 2^32), so that
// P(word >= threshold) = 1 - p up to 2^-32.
uint64_t keep_threshold(double p) { return static_cast<uint64_t>(std::ceil(p * kTwo32)); }

uint32_t word32(const char* what, int64_t v) {
  TESSERA_CHECK(v >= 0 && v < (int64_t{1} << 32), "dropout: ", what, " = ", v, " does not fit the mask's 32-bit counter");
  return static_cast<uint32_t>(v);
}

// The four words of the counter (feature / 4, position, sample, step); coordinates checked by the caller.
philox::Counter draw(philox::Key key, uint64_t step, int64_t sample, int64_t position, int64_t feature4) {
  return philox::philox4x32_10({static_cast<uint32_t>(feature4), static_cast<uint32_t>(position),
                                static_cast<uint32_t>(sample), static_cast<uint32_t>(step)},
                               key);
}

// Every coordinate the largest of the (step, sample, position, feature) it draws fits its word.
void check_coords(uint64_t step, int64_t max_sample, int64_t max_position, int64_t max_feature) {
  word32("step", static_cast<int64_t>(step));
  word32("sample", max_sample);
  word32("position", max_position);
  word32("feature / 4", max_feature / 4);
}

template <typename T>
void apply(T* y, const T* x, int64_t N, int64_t C, double p, const DropoutCoords& c) {
  const int64_t seq_len = static_cast<int64_t>(c.positions.size());
  const uint64_t threshold = keep_threshold(p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t sample = c.sample0 + n / seq_len, position = c.positions[static_cast<size_t>(n % seq_len)];
    const T* xr = x + n * C;
    T* yr = y + n * C;
    int64_t col = 0;
    while (col < C) {
      const int64_t f = c.feature0 + col, group = f / 4;
      const philox::Counter w = draw(c.key, c.step, sample, position, group);
      for (int64_t k = f % 4; k < 4 && col < C; ++k, ++col)
        yr[col] = w[static_cast<size_t>(k)] >= threshold ? xr[col] * scale : T(0);
    }
  }
}

void run(const char* op, const Exec& ex, const Tensor& y, const Tensor& x, double p, const DropoutCoords& c) {
  const Device d = front::device_of(op, ex, {{"y", y}, {"x", x}});
  front::check_float(op, "x", x);
  TESSERA_CHECK(y.dtype == x.dtype && y.numel() == x.numel() && x.ndim() >= 1, op, ": y ", y.shape.str(), " and x ",
                x.shape.str(), " must have the same size and dtype");
  TESSERA_CHECK(p >= 0.0 && p < 1.0, op, ": p = ", p, " must be in [0, 1)");
  TESSERA_CHECK(!c.positions.empty(), op, ": no positions (the coordinates of the rows)");
  const int64_t C = x.dim(x.ndim() - 1), N = x.numel() / C, T = static_cast<int64_t>(c.positions.size());
  TESSERA_CHECK(N % T == 0, op, ": ", N, " rows are not whole sequences of ", T, " positions");
  int64_t max_position = 0;
  for (int64_t q : c.positions) max_position = std::max(max_position, q);
  TESSERA_CHECK(c.sample0 >= 0 && c.feature0 >= 0, op, ": negative sample0 ", c.sample0, " or feature0 ", c.feature0);
  check_coords(c.step, c.sample0 + N / T - 1, max_position, c.feature0 + C - 1);
  if (!d.is_cpu()) front::no_cuda_implementation(op);
  if (x.dtype == DType::F32) apply(y.ptr<float>(), x.ptr<float>(), N, C, p, c);
  else apply(y.ptr<double>(), x.ptr<double>(), N, C, p, c);
}

}  // namespace

bool dropout_keep(philox::Key key, uint64_t step, int64_t sample, int64_t position, int64_t feature, double p) {
  TESSERA_CHECK(sample >= 0 && position >= 0 && feature >= 0, "dropout_keep: negative coordinate (sample ", sample,
                ", position ", position, ", feature ", feature, ")");
  check_coords(step, sample, position, feature);
  const philox::Counter w = draw(key, step, sample, position, feature / 4);
  return w[static_cast<size_t>(feature % 4)] >= keep_threshold(p);
}

void dropout_forward(const Exec& ex, const Tensor& y, const Tensor& x, double p, const DropoutCoords& coords) {
  run("dropout_forward", ex, y, x, p, coords);
}

void dropout_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, double p, const DropoutCoords& coords) {
  run("dropout_backward", ex, dx, dy, p, coords);
}

}  // namespace tessera
