// collectives/route/launch_path.h, the protocol of the launch-path kernel, run by CPU threads: one
// thread per (rank, CTA) per collective, every rank's collectives in order (a rank's next
// collective starts once all its CTAs of the previous one ended: its stream's order), the ranks
// running freely against each other with random delays. Each rank publishes into a
// double-buffered inbox and passes one flag per CTA, exactly as the kernel does. Inputs encode
// the collective's sequence number, so an inbox overwritten before a peer finished reading it
// (the reuse the single barrier must exclude) gives a wrong result; every output element is
// compared with the collective's definition and must be written exactly once.
//
// Graph mode (MKERNEL_GRAPH_LAUNCH): the op list is replayed several times, as a captured graph
// is, and no CTA is told its sequence number: each reads the rank's device counter (graphSeq)
// at its start, some CTAs late, and the last CTA of an op to finish advances it, as
// launchKernel does. A variant where every CTA advances it at its own end (wrong: a late
// starter then reads the next op's number) must fail.
#include "tests/catch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/route/launch_path.h"
#include "tests/collectives/launch_sim.h"
#include "tests/sanitizer.h"

using namespace mkernel::coll;

namespace {

using launchsim::input;
using launchsim::Op;

struct World {
  int n = 0, cap = 1;
  std::vector<Op> ops;
  // Graph mode: the op list replays `replays` times; every CTA takes its epoch from graphSeq.
  bool graph = false;
  bool graphEachCtaAdvances = false;  // the wrong scheme, for the test that must fail
  int replays = 1;
  std::unique_ptr<std::atomic<uint64_t>[]> graphSeq;       // [rank]
  std::unique_ptr<std::atomic<uint32_t>[]> graphCtasDone;  // [rank]
  std::vector<std::vector<uint64_t>> inbox[2];             // [parity][rank]
  std::unique_ptr<std::atomic<uint64_t>[]> arrive;         // [rank * kLaunchMaxCtas + cta]
  launchsim::Failures failures;
};

using launchsim::jitter;

// CTA `cta` of rank `r` running op number `epoch` (1-based) into `out` (with write counts).
void runCta(World& w, int r, int cta, int nCtas, uint64_t epoch, std::vector<uint64_t>& out,
            std::vector<std::atomic<int>>& writes, unsigned seed) {
  std::mt19937 rng(seed);
  const Op& op = w.ops[(epoch - 1) % w.ops.size()];
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

void check(World& w, int r, uint64_t epoch, const std::vector<uint64_t>& out,
           const std::vector<std::atomic<int>>& writes) {
  const Op& op = w.ops[(epoch - 1) % w.ops.size()];
  const int n = w.n;
  const bool writes_ = !(op.coll == CollType::Reduce && r != op.root);
  const uint64_t outCount =
      op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(n) : op.count;
  for (uint64_t o = 0; o < outCount; ++o) {
    const int want = writes_ ? 1 : 0;
    if (writes[o] != want) {
      w.failures.fail("op " + std::to_string(epoch) + " (" + collName(op.coll) + " count " +
                      std::to_string(op.count) + ") rank " + std::to_string(r) + ": element " +
                      std::to_string(o) + " written " + std::to_string(writes[o].load()) +
                      " times");
      return;
    }
    if (!writes_) continue;
    uint64_t expect = 0;
    switch (op.coll) {
      case CollType::AllGather:
        expect = input(epoch, static_cast<int>(o / op.count), o % op.count);
        break;
      case CollType::Broadcast:
        expect = input(epoch, op.root, o);
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k)
          expect += input(epoch, k, static_cast<uint64_t>(r) * op.count + o);
        break;
      default:
        for (int k = 0; k < n; ++k) expect += input(epoch, k, o);
    }
    if (out[o] != expect) {
      w.failures.fail("op " + std::to_string(epoch) + " (" + collName(op.coll) + " count " +
                      std::to_string(op.count) + ") rank " + std::to_string(r) + ": element " +
                      std::to_string(o) + " is " + std::to_string(out[o]) + ", want " +
                      std::to_string(expect) + " (an inbox reused too early, or a slicing error)");
      return;
    }
  }
}

// Graph mode, CTA `cta` of rank r: the epoch launchKernel would compute (0 after a failure).
uint64_t graphEpochAtStart(World& w, int r, int cta, uint64_t want, std::mt19937& rng) {
  // Some CTAs start late (a CTA of a launch may begin after another has finished).
  if (cta % 2 == 1 && rng() % 4 == 0) {
    const auto pause = std::chrono::microseconds(300 + rng() % 700);
    if (!w.graphEachCtaAdvances) {
      std::this_thread::sleep_for(pause);
    } else {
      // The negative case: start once another CTA of the launch has ended (it advanced the
      // sequence), at most 200 ms later. A fixed pause is not enough where every CTA runs slower
      // than it (ThreadSanitizer on two cores: the wrong epoch went unseen).
      const uint64_t seen = w.graphSeq[r].load(std::memory_order_acquire);
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (w.graphSeq[r].load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    }
  }
  const uint64_t e = w.graphSeq[r].load(std::memory_order_acquire) + 1;
  if (e != want) {
    w.failures.fail("rank " + std::to_string(r) + " CTA " + std::to_string(cta) +
                    ": the device sequence gave epoch " + std::to_string(e) + " for op " +
                    std::to_string(want));
    return 0;
  }
  return e;
}

void graphCtaEnd(World& w, int r, int nCtas, uint64_t e) {
  if (w.graphEachCtaAdvances) {
    w.graphSeq[r].store(e, std::memory_order_release);
    return;
  }
  if (w.graphCtasDone[r].fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(nCtas)) {
    w.graphCtasDone[r].store(0, std::memory_order_relaxed);
    w.graphSeq[r].store(e, std::memory_order_release);
  }
}

void runRank(World& w, int r) {
  const uint64_t total = w.ops.size() * static_cast<uint64_t>(w.replays);
  for (uint64_t epoch = 1; epoch <= total && !w.failures.stop; ++epoch) {
    const Op& op = w.ops[(epoch - 1) % w.ops.size()];
    const uint64_t bytes = launchPublishElems(op.coll, op.count, w.n) * op.esz;
    const int nCtas = launchCtas(bytes, w.cap);
    const uint64_t outCount =
        op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(w.n) : op.count;
    std::vector<uint64_t> out(outCount, ~0ull);
    std::vector<std::atomic<int>> writes(outCount);
    for (auto& x : writes) x = 0;
    // Stream order: the next op starts after every CTA ended.
    launchsim::runThreads(nCtas, [&](int c) {
      const unsigned seed = static_cast<unsigned>(epoch * 131 + static_cast<uint64_t>(r) * 17 +
                                                  static_cast<uint64_t>(c));
      if (!w.graph) {
        runCta(w, r, c, nCtas, epoch, out, writes, seed);
        return;
      }
      std::mt19937 rng(seed ^ 0x9e3779b9u);
      const uint64_t e = graphEpochAtStart(w, r, c, epoch, rng);
      if (e != 0) runCta(w, r, c, nCtas, e, out, writes, seed);
      graphCtaEnd(w, r, nCtas, e);
    });
    if (!w.failures.stop) check(w, r, epoch, out, writes);
  }
}

std::vector<std::string> runWorld(int n, int cap, int nOps, unsigned seed, int replays = 0,
                                  bool eachCtaAdvances = false) {
  World w;
  w.n = n;
  w.cap = cap;
  w.graph = replays > 0;
  w.replays = replays > 0 ? replays : 1;
  w.graphEachCtaAdvances = eachCtaAdvances;
  w.graphSeq.reset(new std::atomic<uint64_t>[static_cast<size_t>(n)]);
  w.graphCtasDone.reset(new std::atomic<uint32_t>[static_cast<size_t>(n)]);
  for (int r = 0; r < n; ++r) {
    w.graphSeq[r] = 0;
    w.graphCtasDone[r] = 0;
  }
  std::mt19937 rng(seed);
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  const size_t eszs[] = {1, 2, 4, 8};
  uint64_t maxElems = 0;
  for (int i = 0; i < nOps; ++i) {
    Op op;
    op.coll = colls[rng() % 5];
    op.esz = eszs[rng() % 4];
    // Up to the inbox (kLaunchInboxBytes per parity), small counts and odd ones favoured.
    const uint64_t maxCount = kLaunchInboxBytes / op.esz /
                              (op.coll == CollType::ReduceScatter ? static_cast<uint64_t>(n) : 1);
    const uint64_t pick = rng() % 4;
    op.count = pick == 0   ? 1 + rng() % 8
               : pick == 1 ? 1 + rng() % 5000
               : pick == 2 ? maxCount
                           : 1 + rng() % (maxCount / 64 + 1);
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
  for (Cfg c : {Cfg{1, 4, 40}, Cfg{2, 16, 120}, Cfg{3, 2, 120}, Cfg{4, 16, 80}, Cfg{8, 1, 80},
                Cfg{8, 4, 40}}) {
    INFO("ranks " << c.n << ", CTA cap " << c.cap);
    const std::vector<std::string> failures =
        runWorld(c.n, c.cap, mktest::tsanScaled(c.ops), static_cast<unsigned>(c.n * 1000 + c.cap));
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

TEST_CASE(
    "launch path: captured collectives replayed, the device numbering them (graph namespace)") {
  struct Cfg {
    int n, cap, ops, replays;
  };
  for (Cfg c : {Cfg{2, 16, 12, 5}, Cfg{3, 4, 10, 4}, Cfg{4, 16, 8, 4}}) {
    INFO("ranks " << c.n << ", CTA cap " << c.cap << ", " << c.ops << " ops x " << c.replays
                  << " replays");
    const std::vector<std::string> failures =
        runWorld(c.n, c.cap, mktest::tsanScaled(c.ops), static_cast<unsigned>(c.n * 7000 + c.cap),
                 c.replays);
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("launch path: every CTA advancing the graph sequence at its own end is caught") {
  // A late-starting CTA then reads the number its launch's first CTAs already stored: the wrong
  // epoch (flags and inbox parity of the next op). The simulation must see it.
  const std::vector<std::string> failures = runWorld(2, 16, 16, 4242u, 4, /*eachCtaAdvances=*/true);
  REQUIRE(!failures.empty());
  CHECK(failures.front().find("the device sequence gave epoch") != std::string::npos);
}
