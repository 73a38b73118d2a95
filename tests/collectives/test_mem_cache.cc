// collectives/runtime/mem_cache.h: the ledger that keeps communicators' blocks for reuse instead of
// freeing them while other communicators live (a free stops every other thread's CUDA calls until
// every kernel ends: docs/KERNEL.md, "Frees that stop the process"). A fake allocator on the CPU.
#include "tests/catch.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "collectives/runtime/mem_cache.h"

using mkernel::coll::BlockCache;
using mkernel::coll::BlockKind;

namespace {

// Hands out distinct heap blocks and records every call.
struct FakeMemory {
  std::mutex mu;
  std::set<void*> live;  // allocated and not yet freed for real
  int allocs = 0, frees = 0, clears = 0;
  bool failClear = false;
  std::map<void*, BlockKind> kinds;

  BlockCache::Ops ops() {
    return BlockCache::Ops{
        [this](const BlockKind& k, size_t bytes, void** p) {
          std::lock_guard<std::mutex> lock(mu);
          *p = new char[bytes];
          live.insert(*p);
          kinds[*p] = k;
          ++allocs;
          return true;
        },
        [this](const BlockKind&, void* p) {
          std::lock_guard<std::mutex> lock(mu);
          REQUIRE(live.erase(p) == 1);  // (main thread only in the tests that free)
          delete[] static_cast<char*>(p);
          ++frees;
        },
        [this](const BlockKind&, void* p, size_t bytes) {
          std::lock_guard<std::mutex> lock(mu);
          ++clears;
          if (failClear) return false;
          std::fill(static_cast<char*>(p), static_cast<char*>(p) + bytes, 0);
          return true;
        }};
  }
  ~FakeMemory() {
    for (void* p : live) delete[] static_cast<char*>(p);
  }
};

BlockKind dev(int d) {
  BlockKind k;
  k.device = d;
  return k;
}
BlockKind host(unsigned flags) {
  BlockKind k;
  k.host = true;
  k.flags = flags;
  return k;
}

// A block from the cache, which must have one to give.
void* takeOne(BlockCache& c, const BlockKind& k, size_t bytes) {
  void* p = nullptr;
  REQUIRE(c.take(k, bytes, &p));
  return p;
}

}  // namespace

TEST_CASE(
    "mem cache: a block given back while communicators live is reused, cleared, for the same kind "
    "and size") {
  FakeMemory m;
  BlockCache c(m.ops(), 0.0);
  c.enter();
  void* a = takeOne(c, dev(0), 4096);
  static_cast<char*>(a)[7] = 42;
  c.give(dev(0), a, /*defer=*/true);
  CHECK(m.frees == 0);
  CHECK(c.stats().cachedBlocks == 1);
  CHECK(c.stats().cachedBytes == 4096);
  CHECK(takeOne(c, dev(1), 4096) != a);   // another GPU: fresh
  CHECK(takeOne(c, dev(0), 8192) != a);   // another size: fresh
  CHECK(takeOne(c, host(0), 4096) != a);  // host memory: fresh
  CHECK(m.allocs == 4);
  void* b = takeOne(c, dev(0), 4096);
  CHECK(b == a);
  CHECK(m.clears == 1);
  CHECK(static_cast<char*>(b)[7] == 0);
  CHECK(c.stats().reused == 1);
  CHECK(c.stats().cachedBlocks == 0);
  c.leave();
}

TEST_CASE("mem cache: a returned block rests for the grace before it is reused") {
  FakeMemory m;
  BlockCache c(m.ops(), 3600.0);  // never within the test
  c.enter();
  void* a = takeOne(c, dev(0), 256);
  c.give(dev(0), a, true);
  void* b = takeOne(c, dev(0), 256);
  CHECK(b != a);
  CHECK(m.allocs == 2);
  CHECK(c.stats().cachedBlocks == 1);
  c.give(dev(0), b, true);
  c.leave();
  CHECK(m.frees == 2);
}

TEST_CASE(
    "mem cache: the last user's leave frees what is cached; nothing is cached without users") {
  FakeMemory m;
  BlockCache c(m.ops(), 0.0);
  c.enter();
  c.enter();
  void *a = nullptr, *b = nullptr, *h = nullptr;
  REQUIRE(c.take(dev(0), 100, &a));
  REQUIRE(c.take(dev(0), 100, &b));
  REQUIRE(c.take(host(3), 64, &h));
  c.give(dev(0), a, true);
  c.give(host(3), h, true);
  c.leave();  // one user left: still cached
  CHECK(m.frees == 0);
  CHECK(c.stats().cachedBlocks == 2);
  c.leave();  // the last: both freed, b is still handed out
  CHECK(m.frees == 2);
  CHECK(c.stats().cachedBlocks == 0);
  CHECK(c.stats().users == 0);
  CHECK(m.live.count(b) == 1);
  c.give(dev(0), b, true);  // no users: freed now
  CHECK(m.frees == 3);
  CHECK(m.live.empty());
}

TEST_CASE(
    "mem cache: MKERNEL_DEFER_FREES=0 (defer false) frees at once; unknown pointers are freed as "
    "given") {
  FakeMemory m;
  BlockCache c(m.ops(), 0.0);
  c.enter();
  void* a = takeOne(c, dev(2), 512);
  c.give(dev(2), a, /*defer=*/false);
  CHECK(m.frees == 1);
  CHECK(c.stats().cachedBlocks == 0);
  // A pointer the cache did not hand out (the caller's own): freed now, with the kind given.
  void* foreign = nullptr;
  m.ops().alloc(host(1), 16, &foreign);
  c.give(host(1), foreign, true);
  CHECK(m.frees == 2);
  c.give(dev(0), nullptr, true);  // nothing
  CHECK(m.frees == 2);
  c.leave();
  CHECK(c.stats().freed == 2);
}

TEST_CASE("mem cache: a reused block that cannot be cleared is not handed out") {
  FakeMemory m;
  BlockCache c(m.ops(), 0.0);
  c.enter();
  void* a = takeOne(c, dev(0), 64);
  c.give(dev(0), a, true);
  m.failClear = true;
  void* b = reinterpret_cast<void*>(0x1);
  CHECK_FALSE(c.take(dev(0), 64, &b));
  CHECK(b == nullptr);
  CHECK(c.stats().cachedBlocks == 1);  // kept, freed with the rest
  m.failClear = false;
  REQUIRE(c.take(dev(0), 64, &b));
  CHECK(b == a);
  c.give(dev(0), b, true);
  c.leave();
  CHECK(m.live.empty());
}

TEST_CASE("mem cache: threads taking and giving at once never share a block") {
  FakeMemory m;
  BlockCache c(m.ops(), 0.0);
  c.enter();
  std::mutex mu;
  std::set<void*> held;  // handed out right now
  std::atomic<int> clashes{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 32 * static_cast<size_t>(1 + (i + t) % 3);
        void* p = nullptr;
        if (!c.take(dev(0), bytes, &p)) continue;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!held.insert(p).second) ++clashes;
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          held.erase(p);
        }
        c.give(dev(0), p, true);
      }
    });
  for (auto& th : ts) th.join();
  CHECK(clashes == 0);
  const BlockCache::Stats s = c.stats();
  CHECK(s.allocated + s.reused == 8000);
  CHECK(s.allocated <= 12);  // at most 4 threads x 3 sizes ever live at once
  c.leave();
  CHECK(m.live.empty());
}
