// collectives/algo/staged.h, the algorithm the persistent kernel runs for process ranks, and
// collectives/algo/staged_ring.h, its ring collectives through the same regions, run by CPU
// threads: one thread per (rank, CTA), each with its own staging regions, barriers with the
// kernel's semantics (per-CTA epoch flags: a rank passes once every peer has arrived, or for a ring
// step its two neighbours, and may run ahead while slow peers are still reading), and a check that
// no staging region is overwritten while its owner reads it (tests/region_races.h). Every result is
// compared with the collective's definition (integer sums: exact), optionally with a pre() and a
// post() that must each apply exactly once per input / result (World::ops).
#include "tests/catch.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coll_test_util.h"
#include "collectives/algo/staged.h"
#include "collectives/route/launch_path.h"
#include "collectives/algo/staged_ring.h"
#include "tests/region_races.h"
#include "tests/sanitizer.h"

using namespace mkernel::coll;

namespace {

constexpr int kRegions = kStagedRegionsPerCta;

struct World {
  int nRanks = 0, nCtas = 0;
  uint64_t chunkBytes = 0;
  std::vector<std::vector<char>> staging;           // per rank: nCtas * 4 regions
  mktest::RegionRaces race;                         // per (rank, cta, region)
  std::unique_ptr<std::atomic<uint64_t>[]> arrive;  // per (rank, cta)
  std::atomic<int> timeouts{0};
  int slowRank = -1;  // this rank reads slowly (widens the window a reuse bug needs)
  std::chrono::microseconds slowRead{0};
  // With ops: pre(x) = 3x and post(x) = x + 7 (uint32, wrapping), as PreMulSum's pre() and an
  // integer Avg's post(): applied twice or not at all, they give other sums.
  bool ops = false;
  // Rings in this order (StagedCall::ringOrder: position -> rank); empty: rank order. A
  // neighbour barrier with other ranks than the order's neighbours counts in wrongNeighbours.
  std::vector<int> ringOrder;
  std::atomic<int> wrongNeighbours{0};
  int ringNeighbour(int rank, int delta) const {
    if (ringOrder.empty()) return ((rank + delta) % nRanks + nRanks) % nRanks;
    int p = 0;
    while (ringOrder[static_cast<size_t>(p)] != rank) ++p;
    return ringOrder[static_cast<size_t>(((p + delta) % nRanks + nRanks) % nRanks)];
  }
  uint32_t pre(uint32_t v) const { return ops ? 3u * v : v; }
  uint32_t post(uint32_t v) const { return ops ? v + 7u : v; }

  World(int n, int ctas, uint64_t chunk) : nRanks(n), nCtas(ctas), chunkBytes(chunk) {
    staging.assign(static_cast<size_t>(n), std::vector<char>(stagedBufferBytes(ctas, chunk)));
    race.reset([this](const char* p) { return regionOf(p); });
    arrive.reset(new std::atomic<uint64_t>[static_cast<size_t>(n * ctas)]);
    for (int i = 0; i < n * ctas; ++i) arrive[i] = 0;
  }
  // Which (rank, cta, region) a pointer falls in, or -1 for a user buffer.
  int regionOf(const char* p) const {
    for (int r = 0; r < nRanks; ++r) {
      const char* base = staging[static_cast<size_t>(r)].data();
      const uint64_t size = staging[static_cast<size_t>(r)].size();
      if (p >= base && p < base + size) {
        const uint64_t idx = static_cast<uint64_t>(p - base) / chunkBytes;  // cta * 4 + region
        return r * nCtas * kRegions + static_cast<int>(idx);
      }
    }
    return -1;
  }
};

// One (rank, CTA): the executor stagedCollective() expects.
struct CpuExecutor {
  World* w;
  int rank, cta;
  uint64_t epoch = 0;

  char* in(int r, int parity) {
    return w->staging[static_cast<size_t>(r)].data() +
           stagedRegionOffset(cta, parity, w->chunkBytes);
  }
  char* out(int r, int parity) {
    return w->staging[static_cast<size_t>(r)].data() +
           stagedRegionOffset(cta, 2 + parity, w->chunkBytes);
  }

  void slow() {
    if (rank == w->slowRank) std::this_thread::sleep_for(w->slowRead);
  }

  void copy(char* const* dsts, int nDst, const char* src, uint64_t bytes) {
    if (bytes == 0) return;
    mktest::RegionRaces::Movement m(&w->race, &src, 1, dsts, nDst, bytes);
    slow();
    for (int k = 0; k < nDst; ++k) std::memcpy(dsts[k], src, bytes);
  }
  // uint32 sums with wrap-around: exact, so any order gives the same bits.
  void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems,
              bool withPre = true, bool withPost = true) {
    if (elems == 0) return;
    mktest::RegionRaces::Movement m(&w->race, srcs, nSrc, dsts, nDst, elems * 4);
    slow();
    const World* wp = w;
    mktest::sumU32(
        dsts, nDst, srcs, nSrc, elems, [&](uint32_t v) { return withPre ? wp->pre(v) : v; },
        [&](uint32_t v) { return withPost ? wp->post(v) : v; });
  }
  bool waitFor(int p, uint64_t e) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (w->arrive[p * w->nCtas + cta].load(std::memory_order_acquire) < e) {
      if (std::chrono::steady_clock::now() > deadline) {
        w->timeouts++;
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }
  bool barrier() {
    const uint64_t e = ++epoch;
    w->arrive[rank * w->nCtas + cta].store(e, std::memory_order_release);
    for (int p = 0; p < w->nRanks; ++p)
      if (!waitFor(p, e)) return false;
    return true;
  }
  bool neighborBarrier(int prev, int next) {
    if (prev != w->ringNeighbour(rank, -1) || next != w->ringNeighbour(rank, 1))
      w->wrongNeighbours++;
    const uint64_t e = ++epoch;
    w->arrive[rank * w->nCtas + cta].store(e, std::memory_order_release);
    return waitFor(prev, e) && waitFor(next, e);
  }
};

struct Op {
  CollType coll;
  bool twoShot;
  int root;
  uint64_t count;
  bool inPlace;
  bool ring = false;  // staged_ring.h instead of stagedCollective
};

uint64_t sendElems(const Op& op, int n) {
  return op.coll == CollType::ReduceScatter ? op.count * static_cast<uint64_t>(n) : op.count;
}
uint64_t recvElems(const Op& op, int n) {
  return op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(n) : op.count;
}

// Runs `ops` on a world of n ranks x nCtas; returns the first mismatch ("" if none).
std::string runOps(World& w, const std::vector<Op>& ops, uint32_t parityMask, uint64_t seed) {
  const int n = w.nRanks;
  // Inputs and outputs per op and rank (uint32 elements), and the expected outputs.
  struct Bufs {
    std::vector<uint32_t> buf;  // in place: one buffer (recv layout); else send then recv
    std::vector<uint32_t> input;
    uint64_t sendOff = 0, recvOff = 0;
  };
  std::vector<std::vector<Bufs>> bufs(ops.size(), std::vector<Bufs>(static_cast<size_t>(n)));
  test::Rng rng(seed);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    for (int r = 0; r < n; ++r) {
      Bufs& b = bufs[i][static_cast<size_t>(r)];
      const uint64_t s = sendElems(op, n), rc = recvElems(op, n);
      b.input.resize(s);
      for (auto& v : b.input) v = static_cast<uint32_t>(rng.next());
      if (op.inPlace) {
        const uint64_t total = op.coll == CollType::ReduceScatter ? s : rc;
        b.buf.assign(total, 0xdeadbeefu);
        b.recvOff = op.coll == CollType::ReduceScatter ? op.count * static_cast<uint64_t>(r) : 0;
        b.sendOff = op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(r) : 0;
        std::copy(b.input.begin(), b.input.end(), b.buf.begin() + static_cast<long>(b.sendOff));
      } else {
        b.buf.assign(s + rc, 0xdeadbeefu);
        b.sendOff = 0;
        b.recvOff = s;
        std::copy(b.input.begin(), b.input.end(), b.buf.begin());
      }
    }
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < w.nCtas; ++c) {
      threads.emplace_back([&, r, c] {
        CpuExecutor ex{&w, r, c};
        uint64_t chunkSeq = 0;
        for (size_t i = 0; i < ops.size(); ++i) {
          const Op& op = ops[i];
          Bufs& b = bufs[i][static_cast<size_t>(r)];
          StagedCall call;
          call.coll = op.coll;
          call.twoShot = op.twoShot;
          call.nRanks = n;
          call.rank = r;
          call.root = op.root;
          call.count = op.count;
          call.elemSize = 4;
          call.send = reinterpret_cast<uint64_t>(b.buf.data() + b.sendOff);
          call.recv = reinterpret_cast<uint64_t>(b.buf.data() + b.recvOff);
          call.part = rankSlice(op.count, w.nCtas, c, sliceAlignElems(4));
          call.chunkElems = stagedChunkElems(n, 4, w.chunkBytes);
          call.parityMask = parityMask;
          if (op.ring) {
            call.chunkElems = ringStagedChunkElems(4, w.chunkBytes);
            call.hasPre = w.ops;
            call.ringOrdered = !w.ringOrder.empty();
            for (size_t p = 0; p < w.ringOrder.size(); ++p)
              call.ringOrder[p] = static_cast<uint8_t>(w.ringOrder[p]);
            if (!ringStagedCollective(ex, call, &chunkSeq)) return;
            continue;
          }
          if (!stagedCollective(ex, call, &chunkSeq)) return;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  // Expected results.
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    for (int r = 0; r < n; ++r) {
      if (op.coll == CollType::Reduce && r != op.root)
        continue;  // only the root's output is defined
      const Bufs& b = bufs[i][static_cast<size_t>(r)];
      const uint64_t rc = recvElems(op, n);
      for (uint64_t e = 0; e < rc; ++e) {
        auto input = [&](int q, uint64_t k) { return bufs[i][static_cast<size_t>(q)].input[k]; };
        const uint32_t want = mktest::expectedU32(
            op.coll, n, r, op.root, op.count, e, input, [&](uint32_t v) { return w.pre(v); },
            [&](uint32_t v) { return w.post(v); });
        const uint32_t got = b.buf[b.recvOff + e];
        if (got != want)
          return std::string(collName(op.coll)) +
                 (op.ring      ? " (ring)"
                  : op.twoShot ? " (two-shot)"
                               : "") +
                 (op.inPlace ? " in place" : "") + ": op " + std::to_string(i) + " rank " +
                 std::to_string(r) + " element " + std::to_string(e) + " of " +
                 std::to_string(op.count) + ": got " + std::to_string(got) + ", want " +
                 std::to_string(want);
      }
    }
  }
  return "";
}

// ring: 0 none, 1 some (about half), 2 all.
std::vector<Op> randomOps(test::Rng& rng, int n, int count, int ring = 0) {
  std::vector<Op> ops;
  const CollType colls[] = {CollType::AllReduce, CollType::AllGather, CollType::ReduceScatter,
                            CollType::Broadcast, CollType::Reduce};
  for (int i = 0; i < count; ++i) {
    Op op;
    op.coll = colls[rng.below(5)];
    op.twoShot = op.coll == CollType::AllReduce && n > 2 && rng.below(2) == 1;
    op.root = rng.below(n);
    const int shape = rng.below(4);
    op.count = shape == 0   ? 1 + static_cast<uint64_t>(rng.below(7))
               : shape == 1 ? 16 * (1 + static_cast<uint64_t>(rng.below(8)))
                            : static_cast<uint64_t>(rng.below(700));
    op.inPlace = rng.below(2) == 1;
    op.ring = ring == 2 || (ring == 1 && rng.below(2) == 1);
    if (op.ring) op.twoShot = false;
    ops.push_back(op);
  }
  return ops;
}

// 3 ranks, one CTA, 64-byte regions, rank 0 reading slowly: with two regions (parityMask 1) no
// read is disturbed and every result is right; with one (parityMask 0, a deliberately broken
// schedule) the race check must fire. parityMask 0 races on purpose: not under ThreadSanitizer,
// which would report it.
void checkSlowReader(const std::vector<Op>& ops, uint64_t seed) {
  if (mktest::kThreadSanitizer)
    WARN("ThreadSanitizer build: the broken schedule (parityMask 0) is left out");
  for (uint32_t mask : {1u, 0u}) {
    if (mask == 0 && mktest::kThreadSanitizer) continue;
    World w(3, 1, 64);
    w.slowRank = 0;
    w.slowRead = std::chrono::microseconds(300);
    const std::string mismatch = runOps(w, ops, mask, seed);
    INFO("parityMask " << mask << ": " << mismatch);
    if (mask == 1) {
      CHECK(mismatch == "");
      CHECK(w.race.races() == 0);
    } else {
      CHECK(w.race.races() > 0);
    }
    CHECK(w.timeouts.load() == 0);
  }
}

}  // namespace

// tests/region_races.h itself, on one thread with movements nested by hand: what it must count and
// what it must not: reductions in place (hier_staged.h's hierArKeepOwn), and byte ranges (16
// bytes at each pointer here), so that movements of different slots of one region do not race
// (MKERNEL_HIER_AHEAD=2).
TEST_CASE(
    "region races: plain reads and writes, reductions in place, and writes that overlap them") {
  std::vector<char> mem(4 * 64);
  mktest::RegionRaces r;
  auto fresh = [&] {
    r.reset([&mem](const char* p) {
      return p >= mem.data() && p < mem.data() + mem.size()
                 ? static_cast<int>((p - mem.data()) / 64)
                 : -1;
    });
  };
  char* a = mem.data();
  char* b = mem.data() + 64;
  char* outside = nullptr;
  const char* readA[1] = {a};
  const char* readB[1] = {b};
  char* writeA[2] = {a, a + 16};  // two destinations in region 0: one write of it
  char* writeB[1] = {b};
  char* writeNone[1] = {outside};
  using Movement = mktest::RegionRaces::Movement;

  fresh();
  { Movement m(&r, readA, 1, writeB, 1, 16); }
  { Movement m(&r, readB, 1, writeA, 2, 16); }
  { Movement m(&r, readA, 1, writeA, 2, 16); }  // in place, alone
  { Movement m(&r, readA, 1, writeA, 1, 16); }
  { Movement m(&r, readA, 1, writeNone, 1, 16); }
  CHECK(r.races() == 0);

  fresh();  // a plain read of a region while another movement writes it
  {
    Movement w(&r, readB, 1, writeA, 1, 16);
    Movement m(&r, readA, 1, writeB, 1, 16);
  }
  CHECK(r.races() > 0);

  fresh();  // a write of the region that begins and ends inside a reduction in place
  {
    Movement m(&r, readA, 1, writeA, 1, 16);
    { Movement w(&r, readB, 1, writeA, 1, 16); }
  }
  CHECK(r.races() > 0);

  fresh();  // a reduction in place that begins inside another movement's write of the region
  {
    Movement w(&r, readB, 1, writeA, 1, 16);
    { Movement m(&r, readA, 1, writeA, 1, 16); }
  }
  CHECK(r.races() > 0);

  fresh();  // a plain read of a region during another's reduction in place of it
  {
    Movement m(&r, readA, 1, writeA, 1, 16);
    { Movement rd(&r, readA, 1, writeB, 1, 16); }
  }
  CHECK(r.races() > 0);

  fresh();  // movements of different bytes of one region at once: a slot read, another written
  {
    const char* readSlot0[1] = {a};
    char* writeSlot2[1] = {a + 32};
    char* writeSlot0[1] = {a + 8};  // overlaps the read's 16 bytes
    const char* readNone[1] = {outside};
    Movement m(&r, readSlot0, 1, writeNone, 1, 16);
    { Movement w(&r, readNone, 1, writeSlot2, 1, 16); }
    CHECK(r.races() == 0);
    { Movement w(&r, readNone, 1, writeSlot0, 1, 16); }
  }
  CHECK(r.races() == 1);
}

TEST_CASE("staged: region layout and chunk sizes") {
  CHECK(stagedRegionOffset(0, 0, 4096) == 0);
  CHECK(stagedRegionOffset(0, 3, 4096) == 3 * 4096);
  CHECK(stagedRegionOffset(2, 1, 4096) == (2 * 4 + 1) * 4096);
  CHECK(stagedBufferBytes(16, 262144) == 16ull << 20);
  // An inbox holds one slot per rank; every slot a multiple of 16 bytes.
  for (int n : {2, 3, 5, 8, 16})
    for (uint64_t esz : {1, 2, 4, 8}) {
      const uint64_t e = stagedChunkElems(n, esz, 4096);
      CHECK(e * esz * static_cast<uint64_t>(n) <= 4096);
      CHECK((e * esz) % 16 == 0);
      CHECK(e > 0);
    }
  CHECK(stagedChunkElems(2, 4, 4096) * 4 == 2048);
  CHECK(stagedChunkElems(17, 8, 256) == 0);
  CHECK(stagedTwoShot(Algo::TwoShot, 3));
  CHECK_FALSE(stagedTwoShot(Algo::TwoShot, 2));
  CHECK_FALSE(stagedTwoShot(Algo::OneShot, 8));
}

TEST_CASE("staged: every collective, in and out of place, 2-8 ranks, several CTAs, many chunks") {
  test::Rng rng(2026);
  for (int n : {2, 3, 4, 8}) {
    for (int ctas : {1, 3}) {
      // Small chunks (64 B per rank block and up): many chunks per call, so regions are reused
      // again and again.
      const uint64_t chunk = n == 8 ? 256 : 64 * static_cast<uint64_t>(1 + rng.below(3));
      World w(n, ctas, chunk);
      const std::vector<Op> ops = randomOps(rng, n, 24);
      INFO("ranks " << n << ", CTAs " << ctas << ", chunk " << chunk << " B");
      CHECK(runOps(w, ops, 1, rng.next()) == "");
      CHECK(w.race.races() == 0);
      CHECK(w.timeouts.load() == 0);
    }
  }
}

TEST_CASE("staged: a slow reader is never overtaken (and the check sees it when parity is off)") {
  // Rank 0 reads its inbox slowly; its peers would push the chunk after next into it under the
  // read if a region were reused by the next chunk. With the parity (two regions) no read is ever
  // disturbed; with one region (parityMask 0, a deliberately broken schedule) the race check must
  // fire.
  std::vector<Op> ops;
  for (CollType c : {CollType::AllReduce, CollType::AllGather, CollType::ReduceScatter}) {
    Op op{c, false, 0, 256, false};
    ops.push_back(op);
  }
  ops.push_back(Op{CollType::AllReduce, true, 0, 256, true});
  checkSlowReader(ops, 99);
}

TEST_CASE("staged ring: MKERNEL_RING_MIN_BYTES (ringTakes)") {
  using mkernel::coll::ringTakes;
  // auto (-1): exactly what the LL mode does not take, whatever the size.
  CHECK(!ringTakes(-1, true, 8));
  CHECK(!ringTakes(-1, true, uint64_t(1) << 30));
  CHECK(ringTakes(-1, false, 8));
  CHECK(ringTakes(-1, false, uint64_t(1) << 30));
  // 0: everything; a number: from that many bytes of the whole buffer, LL or not.
  CHECK(ringTakes(0, true, 0));
  CHECK(ringTakes(0, true, 8));
  CHECK(!ringTakes(65536, false, 65535));
  CHECK(ringTakes(65536, true, 65536));
  // With the launch path's own table: 2 ranks take LL up to 256 KiB per peer, 8 ranks 64 KiB.
  using mkernel::coll::llLimit;
  using mkernel::coll::llTakes;
  for (int n : {2, 8}) {
    const uint64_t lim = llLimit(~0ull, n, 1);
    CAPTURE(n, lim);
    CHECK(lim > 0);
    CHECK(!ringTakes(-1, llTakes(lim, lim, n), lim * 2));
    CHECK(ringTakes(-1, llTakes(lim + 16, lim, n), (lim + 16) * 2));
  }
}

TEST_CASE("staged ring: step counts, chunk sizes, and the schedule's coverage") {
  CHECK(ringStagedChunkElems(4, 4096) == 1024);
  CHECK(ringStagedChunkElems(1, 4096) == 4096);
  CHECK(ringStagedChunkElems(8, 100) * 8 % 16 == 0);
  // AllReduce: rounds of 2n - 1 steps over chunks of the largest rank slice; the blocks' rings n
  // steps per chunk; the chains nChunks + n - 1.
  CHECK(ringStagedSteps(CollType::AllReduce, 4, 0, 16, 4) == 0);
  CHECK(ringStagedSteps(CollType::AllReduce, 4, 64, 16, 4) == 7);      // slices of 16: one round
  CHECK(ringStagedSteps(CollType::AllReduce, 4, 65, 16, 4) == 2 * 7);  // slices of 20: two
  CHECK(ringStagedSteps(CollType::ReduceScatter, 3, 33, 16, 4) == 3 * 3);
  CHECK(ringStagedSteps(CollType::AllGather, 3, 16, 16, 4) == 3);
  CHECK(ringStagedSteps(CollType::Broadcast, 5, 33, 16, 4) == 3 + 4);
  CHECK(ringStagedSteps(CollType::Reduce, 1, 33, 16, 4) == 3);
  // Every rank's reduce-scatter steps visit every slice once, its own last (algo.h's schedule).
  for (int n : {1, 2, 3, 8}) {
    for (int r = 0; r < n; ++r) {
      std::vector<int> seen(static_cast<size_t>(n), 0);
      for (int t = 0; t < n; ++t) seen[static_cast<size_t>(ringRsSendSlice(r, t, n))]++;
      for (int v : seen) CHECK(v == 1);
      CHECK(ringRsSendSlice(r, n - 1, n) == r);
    }
  }
}

TEST_CASE(
    "staged ring: every collective, in and out of place, 1-8 ranks, several CTAs, many chunks, "
    "pre() and post()") {
  test::Rng rng(2027);
  for (int n : {1, 2, 3, 4, 5, 8}) {
    for (int ctas : {1, 3}) {
      for (bool ops : {false, true}) {
        const uint64_t chunk = 64 * static_cast<uint64_t>(1 + rng.below(3));  // 16-48 elements
        World w(n, ctas, chunk);
        w.ops = ops;
        const std::vector<Op> list = randomOps(rng, n, 24, /*ring=*/2);
        INFO("ranks " << n << ", CTAs " << ctas << ", chunk " << chunk << " B, pre/post " << ops);
        CHECK(runOps(w, list, 1, rng.next()) == "");
        CHECK(w.race.races() == 0);
        CHECK(w.timeouts.load() == 0);
        // Every rank's CTA took the same barriers, as many as the schedule says.
        for (int c = 0; c < ctas; ++c) {
          uint64_t want = 0;
          for (const Op& op : list)
            want +=
                ringStagedSteps(op.coll, n, rankSlice(op.count, ctas, c, sliceAlignElems(4)).count,
                                ringStagedChunkElems(4, chunk), 4);
          for (int r = 0; r < n; ++r) CHECK(w.arrive[r * ctas + c].load() == want);
        }
      }
    }
  }
}

TEST_CASE("staged ring: MKERNEL_RING_ORDER's list (parseRingOrder)") {
  using mkernel::coll::parseRingOrder;
  std::vector<int> o;
  CHECK(parseRingOrder("0,2,1,3", 4, &o));
  CHECK(o == std::vector<int>{0, 2, 1, 3});
  CHECK(parseRingOrder("3,1,0,2", 4, &o));
  CHECK(o == std::vector<int>{3, 1, 0, 2});
  CHECK(parseRingOrder("0", 1, &o));
  CHECK_FALSE(parseRingOrder("", 4, &o));
  CHECK_FALSE(parseRingOrder("0,1,2", 4, &o));     // a rank missing
  CHECK_FALSE(parseRingOrder("0,1,2,2", 4, &o));   // twice
  CHECK_FALSE(parseRingOrder("0,1,2,4", 4, &o));   // out of range
  CHECK_FALSE(parseRingOrder("0,1,2,3,", 4, &o));  // trailing comma
  CHECK_FALSE(parseRingOrder("0;1;2;3", 4, &o));
  CHECK_FALSE(parseRingOrder("auto", 4, &o));
  CHECK_FALSE(parseRingOrder("-1,0,1,2", 4, &o));
  CHECK_FALSE(parseRingOrder("0,1,2,3,0", 4, &o));
}

TEST_CASE(
    "staged ring: in a given order (MKERNEL_RING_ORDER), random permutations, 2-8 ranks, every "
    "collective") {
  // The schedule runs in ring positions; blocks of ReduceScatter and AllGather stay the ranks'
  // own, and every neighbour barrier is with the order's neighbours.
  test::Rng rng(2029);
  for (int n : {2, 3, 4, 5, 8}) {
    for (int ctas : {1, 3}) {
      for (int trial = 0; trial < 2; ++trial) {
        const uint64_t chunk = 64 * static_cast<uint64_t>(1 + rng.below(3));
        World w(n, ctas, chunk);
        w.ops = trial == 1;
        w.ringOrder.resize(static_cast<size_t>(n));
        for (int p = 0; p < n; ++p) w.ringOrder[static_cast<size_t>(p)] = p;
        for (int p = n - 1; p > 0; --p)
          std::swap(w.ringOrder[static_cast<size_t>(p)],
                    w.ringOrder[static_cast<size_t>(rng.below(static_cast<uint64_t>(p + 1)))]);
        if (n > 2 && w.ringOrder == std::vector<int>([&] {
                       std::vector<int> id(static_cast<size_t>(n));
                       for (int p = 0; p < n; ++p) id[static_cast<size_t>(p)] = p;
                       return id;
                     }()))
          std::swap(w.ringOrder[0],
                    w.ringOrder[1]);  // never the identity: the test is about the order
        std::string order;
        for (int v : w.ringOrder) order += std::to_string(v) + " ";
        const std::vector<Op> list = randomOps(rng, n, 20, /*ring=*/trial == 0 ? 2 : 1);
        INFO("ranks " << n << ", CTAs " << ctas << ", chunk " << chunk << " B, order " << order
                      << ", pre/post " << w.ops);
        CHECK(runOps(w, list, 1, rng.next()) == "");
        CHECK(w.race.races() == 0);
        CHECK(w.timeouts.load() == 0);
        CHECK(w.wrongNeighbours.load() == 0);
      }
    }
  }
}

TEST_CASE("staged ring: rings and staged collectives interleaved on the same regions") {
  // The chunk counter runs on from one form to the other; a ring ends with a barrier of every
  // rank, so a staged collective's pushes after it find every region read.
  test::Rng rng(2028);
  for (int n : {2, 3, 4, 8}) {
    for (int ctas : {1, 2}) {
      const uint64_t chunk = n == 8 ? 256 : 64 * static_cast<uint64_t>(1 + rng.below(3));
      World w(n, ctas, chunk);
      w.ops = rng.below(2) == 1;
      const std::vector<Op> list = randomOps(rng, n, 32, /*ring=*/1);
      INFO("ranks " << n << ", CTAs " << ctas << ", chunk " << chunk << " B, pre/post " << w.ops);
      CHECK(runOps(w, list, 1, rng.next()) == "");
      CHECK(w.race.races() == 0);
      CHECK(w.timeouts.load() == 0);
    }
  }
}

TEST_CASE(
    "staged ring: a slow reader is never overtaken (and the check sees it when parity is off)") {
  // Rank 0 reads its inbox slowly; its previous rank would push the step after next into it
  // under the read if a region were reused by the next step. Two regions: no read is ever
  // disturbed; one (parityMask 0, a deliberately broken schedule): the race check must fire.
  std::vector<Op> list;
  for (CollType c : {CollType::AllReduce, CollType::AllGather, CollType::ReduceScatter,
                     CollType::Broadcast, CollType::Reduce}) {
    Op op{c, false, 1, 256, false};
    op.ring = true;
    list.push_back(op);
  }
  checkSlowReader(list, 77);
}
