// Catches a read of staging memory that overlaps a write of the same bytes, for the CPU tests of
// the staged algorithms (tests/collectives/test_staged.cc,
// tests/transport/proxy/test_hier_staged.cc): every movement (a copy or a reduction) registers the
// byte ranges it reads and writes while it lasts; one that starts while another live movement
// writes bytes it reads or writes, or reads or writes bytes it writes, overlapped it in time: a
// race. A movement's own reads and writes (a reduction in place) do not race with each other. Only
// memory in the checked regions counts (regionOf). Byte ranges, not whole regions: several ranks
// write their own slots of one inbox while its owner reads another slot (hier_staged.h,
// MKERNEL_HIER_AHEAD=2), which is no race.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/types.h"

namespace mktest {

class RegionRaces {
  struct Range {
    const char* b;
    const char* e;
  };
  struct Live {
    std::vector<Range> reads, writes;
  };
  static bool overlaps(const std::vector<Range>& a, const std::vector<Range>& b) {
    for (const Range& x : a)
      for (const Range& y : b)
        if (x.b < y.e && y.b < x.e) return true;
    return false;
  }

 public:
  // regionOf(p): the region p points into, or -1 (not checked memory); the check itself works on
  // byte ranges.
  void reset(std::function<int(const char*)> regionOf) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.clear();
    regionOf_ = std::move(regionOf);
    races_ = 0;
  }
  int races() const { return races_.load(); }

  // One data movement's reads and writes, `bytes` at each pointer, for as long as it lives.
  class Movement {
   public:
    Movement(RegionRaces* r, const char* const* srcs, int nSrc, char* const* dsts, int nDst,
             uint64_t bytes)
        : r_(r) {
      Live me;
      for (int k = 0; k < nSrc; ++k)
        if (r_->regionOf_(srcs[k]) >= 0) me.reads.push_back({srcs[k], srcs[k] + bytes});
      for (int k = 0; k < nDst; ++k)
        if (r_->regionOf_(dsts[k]) >= 0) me.writes.push_back({dsts[k], dsts[k] + bytes});
      std::lock_guard<std::mutex> lock(r_->mu_);
      for (const Live& o : r_->live_) {
        if (overlaps(me.writes, o.reads) || overlaps(me.writes, o.writes) ||
            overlaps(me.reads, o.writes))
          r_->races_++;
      }
      it_ = r_->live_.insert(r_->live_.end(), std::move(me));
    }
    ~Movement() {
      std::lock_guard<std::mutex> lock(r_->mu_);
      r_->live_.erase(it_);
    }
    Movement(const Movement&) = delete;
    Movement& operator=(const Movement&) = delete;

   private:
    RegionRaces* r_;
    std::list<Live>::iterator it_;
  };

 private:
  std::mutex mu_;
  std::list<Live> live_;
  std::function<int(const char*)> regionOf_;
  std::atomic<int> races_{0};
};

// The tests' reduction: dsts[d][i] = post(sum over s of pre(srcs[s][i])) on uint32 elements, with
// wrap-around (exact in any order, so results compare bit for bit).
template <typename Pre, typename Post>
void sumU32(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems, Pre pre,
            Post post) {
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
uint32_t expectedU32(mkernel::coll::CollType c, int n, int r, int root, uint64_t count, uint64_t e,
                     Input input, Pre pre, Post post) {
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
