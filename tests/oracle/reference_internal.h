// What the CPU reference executors (reference.cc, hierarchical_ref.cc) share: race detection over
// the user-buffer bytes each simulated rank touches in one phase (the work between two cross-rank
// barriers; two ranks touching overlapping bytes in one phase, one of them writing, would race on
// the GPU), and counted, tracked access to the ranks' buffers. Internal to collectives/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cstring>
#include <string>
#include <utility>

#include "tests/oracle/reference.h"
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
          Result r = MK_ERROR(
              Result::InternalError,
              "reference: %s: rank %d %s and rank %d %s overlapping bytes "
              "(%#zx..%#zx) in the same phase: a race on the GPU",
              what, a.rank, a.write ? "writes" : "reads", b.rank, b.write ? "writes" : "reads",
              static_cast<size_t>(std::max(a.lo, b.lo)), static_cast<size_t>(std::min(a.hi, b.hi)));
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

// The simulated ranks' user buffers, every access counted (ReferenceStats) and, for user memory,
// recorded in the phase's AccessTracker; plus the accumulator standing in for the kernel's
// registers. An executor derives from it and calls endPhase() at every cross-rank barrier.
class ExecutorBase {
 protected:
  ExecutorBase(const RankBuffers* bufs, size_t elemSize, std::string desc)
      : es_(elemSize), bufs_(bufs), desc_(std::move(desc)) {}

  const char* sendAt(int r, size_t off) const {
    return static_cast<const char*>(bufs_[r].send) + off * es_;
  }
  char* recvAt(int r, size_t off) const { return static_cast<char*>(bufs_[r].recv) + off * es_; }
  // `actor` reads n elements of a user buffer / writes n elements to one.
  const void* userRead(int actor, const void* p, size_t n) {
    tracker_.record(actor, p, n * es_, false);
    read_ += n;
    return p;
  }
  void userWrite(int actor, void* dst, const void* src, size_t n) {
    tracker_.record(actor, dst, n * es_, true);
    if (n != 0 && dst != src) std::memmove(dst, src, n * es_);
    written_ += n;
  }
  // Ends the phase: checks it for races and counts it.
  Result endPhase() {
    ++phases_;
    return tracker_.endPhase(desc_.c_str());
  }
  uint8_t* acc(size_t n) {
    if (acc_.size() < n * es_) acc_.resize(n * es_);
    return acc_.data();
  }
  void fillStats(uint64_t rounds, ReferenceStats* stats) const {
    if (stats == nullptr) return;
    stats->bytesRead = read_ * es_;
    stats->bytesWritten = written_ * es_;
    stats->rounds = rounds;
    stats->phases = phases_;
  }

  const size_t es_;
  const RankBuffers* bufs_;
  const std::string desc_;
  AccessTracker tracker_;
  std::vector<uint8_t> acc_;  // the kernel's registers
  uint64_t read_ = 0;         // elements, user buffers and staging
  uint64_t written_ = 0;
  uint64_t phases_ = 0;
};

}  // namespace coll
}  // namespace mkernel
