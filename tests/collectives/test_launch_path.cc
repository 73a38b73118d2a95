// collectives/launch_path.h, the protocol of the launch-path kernel, run by CPU threads: one
// thread per (rank, CTA) per collective, every rank's collectives in order (a rank's next
// collective starts once all its CTAs of the previous one ended: its stream's order), the ranks
// running freely against each other with random delays. Each rank publishes into a
// double-buffered inbox and passes one flag per CTA, exactly as the kernel does. Inputs encode
// the collective's sequence number, so an inbox overwritten before a peer finished reading it
// (the reuse the single barrier must exclude) gives a wrong result; every output element is
// compared with the collective's definition and must be written exactly once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/launch_path.h"
#include "tests/collectives/launch_sim.h"

using namespace mkernel::coll;

namespace {

using launchsim::input;
using launchsim::Op;

struct World {
  int n = 0, cap = 1;
  std::vector<Op> ops;
  std::vector<std::vector<uint64_t>> inbox[2];             // [parity][rank]
  std::unique_ptr<std::atomic<uint64_t>[]> arrive;         // [rank * kLaunchMaxCtas + cta]
  launchsim::Failures failures;
};

using launchsim::jitter;

// CTA `cta` of rank `r` running op number `epoch` (1-based) into `out` (with write counts).
void runCta(World& w, int r, int cta, int nCtas, uint64_t epoch, std::vector<uint64_t>& out,
            std::vector<std::atomic<int>>& writes, unsigned seed) {
  std::mt19937 rng(seed);
  const Op& op = w.ops[epoch - 1];
  const int n = w.n, parity = static_cast<int>(epoch & 1);
  const LaunchPart lp = launchPart(op.coll, op.count, n, r, op.root, nCtas, cta, op.esz);
  std::vector<uint64_t>& mine = w.inbox[parity][static_cast<size_t>(r)];
  for (int b = 0; b < lp.publishBlocks; ++b)
    for (uint64_t i = 0; i < lp.part.count; ++i) {
      const uint64_t idx = static_cast<uint64_t>(b) * op.count + lp.part.offset + i;
      mine[idx] = input(epoch, r, idx);
    }
  jitter(rng);
  w.arrive[static_cast<size_t>(r * kLaunchMaxCtas + cta)].store(epoch, std::memory_order_release);
  if (!launchsim::waitFlags(w.failures, w.arrive.get(), n, r, cta, epoch, "arrive")) return;
  if (!lp.compute) return;
  for (uint64_t i = 0; i < lp.part.count; ++i) {
    if (i % 512 == 0) jitter(rng);
    const uint64_t at = lp.readOffset + i;
    auto peerVal = [&](int k) { return w.inbox[parity][static_cast<size_t>(k)][at]; };
    switch (op.coll) {
      case CollType::AllGather:
        for (int k = 0; k < n; ++k) {
          const uint64_t o = static_cast<uint64_t>(k) * op.count + lp.part.offset + i;
          out[o] = peerVal(k);
          writes[o]++;
        }
        break;
      case CollType::Broadcast:
        out[lp.part.offset + i] = peerVal(op.root);
        writes[lp.part.offset + i]++;
        break;
      default: {
        uint64_t s = 0;
        for (int k = 0; k < n; ++k) s += peerVal(k);
        out[lp.part.offset + i] = s;
        writes[lp.part.offset + i]++;
      }
    }
  }
}

void check(World& w, int r, uint64_t epoch, const std::vector<uint64_t>& out, const std::vector<std::atomic<int>>& writes) {
  const Op& op = w.ops[epoch - 1];
  const int n = w.n;
  const bool writes_ = !(op.coll == CollType::Reduce && r != op.root);
  const uint64_t outCount = op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(n) : op.count;
  for (uint64_t o = 0; o < outCount; ++o) {
    const int want = writes_ ? 1 : 0;
    if (writes[o] != want) {
      w.failures.fail("op " + std::to_string(epoch) + " (" + collName(op.coll) + " count " + std::to_string(op.count) + ") rank " +
             std::to_string(r) + ": element " + std::to_string(o) + " written " + std::to_string(writes[o].load()) +
             " times");
      return;
    }
    if (!writes_) continue;
    uint64_t expect = 0;
    switch (op.coll) {
      case CollType::AllGather: expect = input(epoch, static_cast<int>(o / op.count), o % op.count); break;
      case CollType::Broadcast: expect = input(epoch, op.root, o); break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k) expect += input(epoch, k, static_cast<uint64_t>(r) * op.count + o);
        break;
      default:
        for (int k = 0; k < n; ++k) expect += input(epoch, k, o);
    }
    if (out[o] != expect) {
      w.failures.fail("op " + std::to_string(epoch) + " (" + collName(op.coll) + " count " + std::to_string(op.count) + ") rank " +
             std::to_string(r) + ": element " + std::to_string(o) + " is " + std::to_string(out[o]) + ", want " +
             std::to_string(expect) + " (an inbox reused too early, or a slicing error)");
      return;
    }
  }
}

void runRank(World& w, int r) {
  for (uint64_t epoch = 1; epoch <= w.ops.size() && !w.failures.stop; ++epoch) {
    const Op& op = w.ops[epoch - 1];
    const uint64_t bytes = launchPublishElems(op.coll, op.count, w.n) * op.esz;
    const int nCtas = launchCtas(bytes, w.cap);
    const uint64_t outCount = op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(w.n) : op.count;
    std::vector<uint64_t> out(outCount, ~0ull);
    std::vector<std::atomic<int>> writes(outCount);
    for (auto& x : writes) x = 0;
    // Stream order: the next op starts after every CTA ended.
    launchsim::runThreads(nCtas, [&](int c) {
      runCta(w, r, c, nCtas, epoch, out, writes,
             static_cast<unsigned>(epoch * 131 + static_cast<uint64_t>(r) * 17 + static_cast<uint64_t>(c)));
    });
    if (!w.failures.stop) check(w, r, epoch, out, writes);
  }
}

std::vector<std::string> runWorld(int n, int cap, int nOps, unsigned seed) {
  World w;
  w.n = n;
  w.cap = cap;
  std::mt19937 rng(seed);
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather, CollType::Broadcast,
                            CollType::Reduce};
  const size_t eszs[] = {1, 2, 4, 8};
  uint64_t maxElems = 0;
  for (int i = 0; i < nOps; ++i) {
    Op op;
    op.coll = colls[rng() % 5];
    op.esz = eszs[rng() % 4];
    // Up to the inbox (kLaunchInboxBytes per parity), small counts and odd ones favoured.
    const uint64_t maxCount = kLaunchInboxBytes / op.esz / (op.coll == CollType::ReduceScatter ? static_cast<uint64_t>(n) : 1);
    const uint64_t pick = rng() % 4;
    op.count = pick == 0 ? 1 + rng() % 8 : pick == 1 ? 1 + rng() % 5000 : pick == 2 ? maxCount : 1 + rng() % (maxCount / 64 + 1);
    op.count = std::min<uint64_t>(op.count, maxCount);
    op.root = static_cast<int>(rng() % static_cast<unsigned>(n));
    maxElems = std::max(maxElems, launchPublishElems(op.coll, op.count, n));
    w.ops.push_back(op);
  }
  for (auto& par : w.inbox) par.assign(static_cast<size_t>(n), std::vector<uint64_t>(maxElems, 0));
  w.arrive = launchsim::makeFlags(n);
  launchsim::runThreads(n, [&](int r) { runRank(w, r); });
  return w.failures.list;
}

}  // namespace

TEST_CASE("launch path: slicing and CTA counts") {
  CHECK(launchCtas(8, 16) == 1);
  CHECK(launchCtas(kLaunchBytesPerCta, 16) == 1);
  CHECK(launchCtas(kLaunchBytesPerCta + 1, 16) == 2);
  CHECK(launchCtas(kLaunchInboxBytes, 16) == 16);
  CHECK(launchCtas(kLaunchInboxBytes, 3) == 3);
  CHECK(launchPublishElems(CollType::ReduceScatter, 10, 4) == 40);
  CHECK(launchPublishElems(CollType::AllGather, 10, 4) == 10);
  // Broadcast: only the root publishes; Reduce: only the root writes.
  CHECK(launchPart(CollType::Broadcast, 100, 4, 1, 2, 1, 0, 4).publishBlocks == 0);
  CHECK(launchPart(CollType::Broadcast, 100, 4, 2, 2, 1, 0, 4).publishBlocks == 1);
  CHECK(!launchPart(CollType::Reduce, 100, 4, 1, 2, 1, 0, 4).compute);
  CHECK(launchPart(CollType::ReduceScatter, 100, 4, 3, 0, 2, 1, 4).readOffset == 300 + 52);
  // The CTAs' parts tile the block, at 16-byte boundaries.
  for (uint64_t count : {1ull, 7ull, 4099ull, 65536ull}) {
    for (int nCtas : {1, 3, 16}) {
      uint64_t next = 0;
      for (int c = 0; c < nCtas; ++c) {
        const LaunchPart lp = launchPart(CollType::AllReduce, count, 2, 0, 0, nCtas, c, 2);
        if (lp.part.count == 0) continue;
        CHECK(lp.part.offset == next);
        CHECK(lp.part.offset % 8 == 0);
        next = lp.part.offset + lp.part.count;
      }
      CHECK(next == count);
    }
  }
}

TEST_CASE("launch path: CPU ranks and CTAs, random collectives back to back, one barrier each") {
  struct Cfg {
    int n, cap, ops;
  };
  for (Cfg c : {Cfg{1, 4, 40}, Cfg{2, 16, 120}, Cfg{3, 2, 120}, Cfg{4, 16, 80}, Cfg{8, 1, 80}, Cfg{8, 4, 40}}) {
    INFO("ranks " << c.n << ", CTA cap " << c.cap);
    const std::vector<std::string> failures = runWorld(c.n, c.cap, c.ops, static_cast<unsigned>(c.n * 1000 + c.cap));
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}
