// Catches a read of a staging region that overlaps a write of it, for the CPU tests of the staged
// algorithms (tests/collectives/test_staged.cc, tests/proxy/test_hier_staged.cc): a generation
// counter per region, odd while a write lasts; a read that starts on an odd value, or ends on a
// different one than it started on, overlapped a write. A movement that reads and writes the same
// region (a reduction in place) overlapped another's write if the counter moved between its read
// and its own write's start, or away from its own write's value before that write ended.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/types.h"

namespace mktest {

class RegionRaces {
 public:
  // regionOf(p): the region p points into, or -1 (not a checked region).
  void reset(int nRegions, std::function<int(const char*)> regionOf) {
    gen_.reset(new std::atomic<uint64_t>[static_cast<size_t>(nRegions)]);
    for (int i = 0; i < nRegions; ++i) gen_[i] = 0;
    regionOf_ = std::move(regionOf);
    races_ = 0;
  }
  int races() const { return races_.load(); }

  // One data movement's reads and writes, for as long as it lives.
  class Movement {
   public:
    Movement(RegionRaces* r, const char* const* srcs, int nSrc, char* const* dsts, int nDst) : r_(r) {
      for (int k = 0; k < nSrc; ++k) {
        const int region = r_->regionOf_(srcs[k]);
        if (region < 0) continue;
        const uint64_t g = r_->gen_[region].load(std::memory_order_acquire);
        if (g & 1) r_->races_++;
        reads_.push_back({region, g});
      }
      for (int k = 0; k < nDst; ++k) {
        const int region = r_->regionOf_(dsts[k]);
        if (region < 0) continue;
        bool counted = false;  // a second destination in the same region: one write of it
        for (int w : writes_) counted = counted || w == region;
        if (counted) continue;
        const uint64_t g = r_->gen_[region].fetch_add(1, std::memory_order_acq_rel);
        for (Read& rd : reads_)
          if (rd.region == region) {
            if (g != rd.before) r_->races_++;
            rd.before = g + 1;  // in place: what the counter must still be when the write ends
          }
        writes_.push_back(region);
      }
    }
    ~Movement() {
      for (const auto& rd : reads_)
        if (r_->gen_[rd.region].load(std::memory_order_acquire) != rd.before) r_->races_++;
      for (int region : writes_) r_->gen_[region].fetch_add(1, std::memory_order_acq_rel);
    }
    Movement(const Movement&) = delete;
    Movement& operator=(const Movement&) = delete;

   private:
    struct Read {
      int region;
      uint64_t before;
    };
    RegionRaces* r_;
    std::vector<Read> reads_;
    std::vector<int> writes_;
  };

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> gen_;
  std::function<int(const char*)> regionOf_;
  std::atomic<int> races_{0};
};

// The tests' reduction: dsts[d][i] = post(sum over s of pre(srcs[s][i])) on uint32 elements, with
// wrap-around (exact in any order, so results compare bit for bit).
template <typename Pre, typename Post>
void sumU32(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems, Pre pre, Post post) {
  for (uint64_t i = 0; i < elems; ++i) {
    uint32_t acc = 0;
    for (int k = 0; k < nSrc; ++k) {
      uint32_t v;
      std::memcpy(&v, srcs[k] + i * 4, 4);
      acc += pre(v);
    }
    acc = post(acc);
    for (int k = 0; k < nDst; ++k) std::memcpy(dsts[k] + i * 4, &acc, 4);
  }
}

// The definition the staged tests compare with: element e of rank r's output of collective c
// over n ranks (count: NCCL's count), where input(q, i) is element i of rank q's send buffer and
// the reduction is post(sum of pre(x)) in uint32. Reduce: the root's output.
template <typename Input, typename Pre, typename Post>
uint32_t expectedU32(mkernel::coll::CollType c, int n, int r, int root, uint64_t count, uint64_t e, Input input, Pre pre,
                     Post post) {
  using mkernel::coll::CollType;
  uint32_t acc = 0;
  switch (c) {
    case CollType::AllReduce:
    case CollType::Reduce:
      for (int q = 0; q < n; ++q) acc += pre(input(q, e));
      return post(acc);
    case CollType::ReduceScatter:
      for (int q = 0; q < n; ++q) acc += pre(input(q, static_cast<uint64_t>(r) * count + e));
      return post(acc);
    case CollType::AllGather:
      return input(static_cast<int>(e / count), e % count);
    case CollType::Broadcast:
      return input(root, e);
  }
  return 0;
}

}  // namespace mktest
