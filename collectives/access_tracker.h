// Race detection of the CPU reference executors (reference.cc, hierarchical_ref.cc): the
// user-buffer bytes each simulated rank touched in one phase (the work between two cross-rank
// barriers). Two ranks touching overlapping bytes in one phase, one of them writing, would race
// on the GPU. Internal to collectives/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/result.h"

namespace mkernel {
namespace coll {

// The user-buffer bytes each rank touched in the current phase. Two ranks touching overlapping
// bytes in one phase, one of them writing, would race on the GPU.
class AccessTracker {
 public:
  void record(int rank, const void* p, size_t bytes, bool write) {
    if (bytes == 0) return;
    uintptr_t lo = reinterpret_cast<uintptr_t>(p);
    accesses_.push_back(Access{lo, lo + bytes, rank, write});
  }
  // Checks the phase that just ended and starts the next one.
  Result endPhase(const char* what) {
    std::sort(accesses_.begin(), accesses_.end(),
              [](const Access& a, const Access& b) { return a.lo < b.lo; });
    for (size_t i = 0; i < accesses_.size(); ++i) {
      const Access& a = accesses_[i];
      for (size_t j = i + 1; j < accesses_.size() && accesses_[j].lo < a.hi; ++j) {
        const Access& b = accesses_[j];
        if (a.rank != b.rank && (a.write || b.write)) {
          Result r = MK_ERROR(Result::InternalError,
                              "reference: %s: rank %d %s and rank %d %s overlapping bytes "
                              "(%#zx..%#zx) in the same phase: a race on the GPU", what, a.rank,
                              a.write ? "writes" : "reads", b.rank, b.write ? "writes" : "reads",
                              static_cast<size_t>(std::max(a.lo, b.lo)),
                              static_cast<size_t>(std::min(a.hi, b.hi)));
          accesses_.clear();
          return r;
        }
      }
    }
    accesses_.clear();
    return Result::Success;
  }

 private:
  struct Access {
    uintptr_t lo, hi;
    int rank;
    bool write;
  };
  std::vector<Access> accesses_;
};

}  // namespace coll
}  // namespace mkernel
