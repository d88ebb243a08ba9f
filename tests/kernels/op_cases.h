// One list of op test cases, run on every available backend against the CPU's double reference
// (ggml's test-backend-ops): a case draws its inputs on the host, runs its op(s) through an
// OpRunner (a device, its context and a float dtype) and returns its outputs; test_op_cases.cpp
// runs each case once on the reference (CPU, F64) and once on each backend under test, and holds
// the backend to the case's tolerance. A new backend (CUDA) adds a line to backends_under_test(),
// not new tests. The per-op tests (test_<family>.cpp) keep what is specific to an op: known
// values, finite differences of the double path, edge cases, errors.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "testing.h"

namespace tessera::testing {

// Where a case runs: ops on `ex` (its device), memory from an allocator of that device, and the
// floating dtype of every float tensor.
class OpRunner {
 public:
  OpRunner(const Exec& ex, Allocator& alloc, DType dtype) : ex_(ex), alloc_(alloc), dtype_(dtype) {}
  const Exec& ex() const { return ex_; }
  DType dtype() const { return dtype_; }

  // An input in dtype() on the device, from host values rounded to float first, so that a float
  // backend and the double reference start from identical values.
  Tensor in(const HostTensor<double>& x);
  // Ids (I32) on the device, as they are.
  Tensor ids(const HostTensor<int32_t>& x);
  // A zero-filled tensor on the device: dtype() (accumulated outputs), or F64.
  Tensor zeros(Shape s);
  Tensor f64_zeros(Shape s);
  // A written output: filled with NaN, so that an element the op leaves unwritten shows as an
  // infinite error (max_rel_error), on every backend. dtype(), or F64 (the reductions' outputs).
  Tensor out(Shape s);
  Tensor f64_out(Shape s);
  // A device tensor's values, read back to the host as doubles.
  HostTensor<double> read(const Tensor& t);

 private:
  Exec ex_;
  Allocator& alloc_;
  DType dtype_;
  std::vector<Buffer> buffers_;  // everything this runner put on the device
};

struct OpOutput {
  std::string name;  // as in the op's header: "dx", "lse", ...
  HostTensor<double> values;
};

struct OpCase {
  std::string name;  // the op(s) and variant: "attention_backward", "cross_entropy_vocab_shards"
  // The normwise relative error (max |got - want| / max |want|, per output) a float backend may
  // show against the double reference; each is justified where the case is defined. 0: exact.
  double tolerance;
  // Draws fixed (seeded) inputs, runs the op(s) on r and returns every output, read back.
  std::function<std::vector<OpOutput>(OpRunner& r)> run;
};

// Every case, in a fixed order.
const std::vector<OpCase>& op_cases();

// attention_merge of a running out, lse (shape: (B, T, H, D)) with a further key block's, with rows
// whose lse, block_lse or both are -inf: one of op_cases(), and the CUDA backend's larger one.
OpCase attention_merge_case(const std::string& name, Shape shape, uint64_t seed);

// A backend to hold to the reference: its device and the dtype it computes in.
struct BackendUnderTest {
  std::string name;  // "cpu_f32"
  Device device;
  DType dtype;
};

// The CPU's float path. The CUDA backend runs the same cases in its own test binary
// (tests/kernels/cuda/test_cuda_op_cases.cpp, CTest label gpu), skipped where no GPU is visible.
std::vector<BackendUnderTest> backends_under_test();

// The CUDA backend's f32 path on device 0.
BackendUnderTest cuda_backend();

// The reference every backend is compared with: the CPU's double path.
BackendUnderTest reference_backend();

// Runs case c on backend b (fresh allocator and context for the backend's device).
std::vector<OpOutput> run_case(const OpCase& c, const BackendUnderTest& b);

}  // namespace tessera::testing
