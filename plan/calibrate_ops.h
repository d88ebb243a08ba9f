// Timing the op families besides the GEMMs (cluster.h OpKind) for `tessera plan --calibrate`
// (plan/calibrate.h): each op through the kernel the trainer calls, on buffers of its shape.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"

namespace tessera::plan {

// Tensors for timing ops on ex's device, each filled with a fixed pattern, held until this is
// destroyed: on the CPU host blocks, on a CUDA device blocks of an allocator of its own on ex's
// stream, the pattern uploaded (the trainer's path: kernels/elementwise.h copy). The destructor
// waits for ex's queued work before the blocks go.
class CalibrationBuffers {
 public:
  explicit CalibrationBuffers(const Exec& ex);
  ~CalibrationBuffers();
  CalibrationBuffers(const CalibrationBuffers&) = delete;
  CalibrationBuffers& operator=(const CalibrationBuffers&) = delete;
  Tensor f(Shape shape, float scale = 1);       // F32: scale x (i mod 97 - 48) / 48
  Tensor ids(Shape shape, int64_t bound);      // I32: (i x 7919) mod bound
  Tensor bf16(Shape shape);                    // BF16 zeros
  Tensor f64(Shape shape);                     // F64 zeros

 private:
  Tensor zeros(DType dtype, Shape shape);
  Exec ex_;
  Allocator alloc_;
  std::vector<Buffer> buffers_;
};

// A function that runs op once at shape (cluster.h gives each op's dims) on buffers it allocates
// on ex's device (CalibrationBuffers) and `keep` holds; the op has run once (its saved tensors written) when this returns.
std::function<void()> op_runner(OpKind op, const std::vector<int64_t>& shape, bool bf16, const Exec& ex,
                                 std::shared_ptr<void>& keep);

// Fills in each op's seconds: `timed` (the calibration's mean over >= min_seconds, every rank
// together) of op_runner at the op's shape, or, when that shape's largest tensor exceeds
// o.max_op_elements (the attention's FLOPs o.max_gemm_flops), at a shape with a smaller leading
// dim, scaled back by op_work.
void time_ops(const Exec& ex, const CalibrationOptions& o, std::vector<OpTime>& ops,
              const std::function<double(const std::function<void()>&)>& timed);

}  // namespace tessera::plan
