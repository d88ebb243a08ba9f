// Shared by the pipeline schedule and simulator tests: every schedule kind, and whether a
// (pp, vpp, micro-batches, kind) combination is one the generator accepts.
#pragma once

#include <cstdint>

#include "kernels/check.h"
#include "parallel/pipeline_schedule.h"

namespace tessera::testing {

inline constexpr PipelineKind kKinds[] = {PipelineKind::GPipe, PipelineKind::OneFOneB, PipelineKind::Interleaved,
                                          PipelineKind::ZeroBubbleH1};

inline bool valid(int64_t pp, int64_t vpp, int64_t m, PipelineKind kind) {
  try {
    check_pipeline_schedule(pp, vpp, m, kind);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace tessera::testing
