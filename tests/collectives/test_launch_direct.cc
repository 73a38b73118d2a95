// The launch path's direct mode (docs/KERNEL.md, "The launch path's direct mode"), its protocol
// run by CPU threads: one thread per (rank, CTA) per collective, each rank's collectives in order
// (its next one starts once all its CTAs ended: stream order), ranks free-running against each
// other with random delays. CTA c of rank r publishes its buffers in mailbox[r][c] (with the op's
// sequence number), stores arrive[r][c] = e, waits for every peer's arrive, reads the peers'
// mailboxes and moves data directly between the ranks' buffers as the direct algorithms do
// (pulls from every peer's input, TwoShot / Broadcast / Reduce also push into peers' outputs),
// then stores end[r][c] = e and waits for every peer's end flag. As an application does, every
// rank reuses its buffers: right after an op it checks its output and writes the next op's
// inputs. Without the end flags a peer still reading the old inputs, or still pushing into our
// output, gives a wrong or a missing element, which the mutation case below requires.
#include "tests/catch.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/algo/algo.h"
#include "collectives/route/launch_path.h"
#include "collectives/algo/work.h"
#include "tests/collectives/launch_sim.h"

using namespace mkernel::coll;

namespace {

using launchsim::input;
using launchsim::Op;

// A rank's buffers: two pairs, so that the mailbox's contents change (pair (e / 2) % 2 for op e)
// while consecutive ops also reuse the same buffers.
// Atomic (relaxed) elements: the mutation case below races on purpose, and a race on atomics is
// defined behaviour.
struct Buffers {
  std::unique_ptr<std::atomic<uint64_t>[]> send, recv;
  std::unique_ptr<std::atomic<int>[]> writes;  // per recv element, in the current op
};

struct Mailbox {
  std::atomic<uint64_t> epoch{0};
  std::atomic<int> pair{0};
};

struct World {
  int n = 0, nCtas = 1;
  bool endFlags = true;
  std::vector<Op> ops;
  std::vector<Buffers> buf;                         // [rank * 2 + pair]
  std::unique_ptr<Mailbox[]> mailbox;               // [rank * kLaunchMaxCtas + cta]
  std::unique_ptr<std::atomic<uint64_t>[]> arrive;  // same index
  std::unique_ptr<std::atomic<uint64_t>[]> end;     // same index
  launchsim::Failures failures;
  size_t at(int r, int c) const { return static_cast<size_t>(r * kLaunchMaxCtas + c); }
};

int pairOf(uint64_t epoch) {
  return static_cast<int>((epoch / 2) % 2);
}

void runCta(World& w, int r, int cta, uint64_t epoch, unsigned seed) {
  std::mt19937 rng(seed);
  const Op& op = w.ops[epoch - 1];
  const int n = w.n;
  Mailbox& mine = w.mailbox[w.at(r, cta)];
  mine.pair.store(pairOf(epoch), std::memory_order_relaxed);
  mine.epoch.store(epoch, std::memory_order_relaxed);
  launchsim::jitter(rng, 300);
  w.arrive[w.at(r, cta)].store(epoch, std::memory_order_release);
  if (!launchsim::waitFlags(w.failures, w.arrive.get(), n, r, cta, epoch, "arrive")) return;
  std::vector<Buffers*> peer(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    const Mailbox& mb = w.mailbox[w.at(k, cta)];
    const uint64_t e = mb.epoch.load(std::memory_order_relaxed);
    if (e != epoch) {
      w.failures.fail("rank " + std::to_string(r) + " op " + std::to_string(epoch) + ": rank " +
                      std::to_string(k) + "'s mailbox holds op " + std::to_string(e));
      return;
    }
    peer[static_cast<size_t>(k)] =
        &w.buf[static_cast<size_t>(k * 2 + mb.pair.load(std::memory_order_relaxed))];
  }
  auto put = [&](int k, uint64_t o, uint64_t v) {
    peer[static_cast<size_t>(k)]->recv[o].store(v, std::memory_order_relaxed);
    peer[static_cast<size_t>(k)]->writes[o]++;
  };
  // The direct algorithms' split (planCollective): the rank's slice for AllReduce (TwoShot),
  // Broadcast and Reduce, the whole block otherwise, then this CTA's part of it.
  const bool sliced = op.coll == CollType::AllReduce || op.coll == CollType::Broadcast ||
                      op.coll == CollType::Reduce;
  const Slice slice = sliced ? rankSlice(op.count, n, r, 1) : Slice{0, op.count};
  const Slice part = rankSlice(slice.count, w.nCtas, cta, 1);
  for (uint64_t j = 0; j < part.count; ++j) {
    if (j % 256 == 0) launchsim::jitter(rng, 300);
    const uint64_t i = slice.offset + part.offset + j;
    uint64_t s = 0;
    switch (op.coll) {
      case CollType::AllReduce:
        for (int k = 0; k < n; ++k)
          s += peer[static_cast<size_t>(k)]->send[i].load(std::memory_order_relaxed);
        for (int k = 0; k < n; ++k) put(k, i, s);
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k)
          s += peer[static_cast<size_t>(k)]->send[static_cast<uint64_t>(r) * op.count + i].load(
              std::memory_order_relaxed);
        put(r, i, s);
        break;
      case CollType::AllGather:
        for (int k = 0; k < n; ++k)
          put(r, static_cast<uint64_t>(k) * op.count + i,
              peer[static_cast<size_t>(k)]->send[i].load(std::memory_order_relaxed));
        break;
      case CollType::Broadcast:
        for (int k = 0; k < n; ++k)
          put(k, i, peer[static_cast<size_t>(op.root)]->send[i].load(std::memory_order_relaxed));
        break;
      case CollType::Reduce:
        for (int k = 0; k < n; ++k)
          s += peer[static_cast<size_t>(k)]->send[i].load(std::memory_order_relaxed);
        put(op.root, i, s);
        break;
    }
  }
  if (!w.endFlags) return;
  w.end[w.at(r, cta)].store(epoch, std::memory_order_release);
  launchsim::waitFlags(w.failures, w.end.get(), n, r, cta, epoch, "end");
}

uint64_t sendCount(const Op& op, int n) {
  return op.coll == CollType::ReduceScatter ? op.count * static_cast<uint64_t>(n) : op.count;
}
uint64_t recvCount(const Op& op, int n) {
  return op.coll == CollType::AllGather ? op.count * static_cast<uint64_t>(n) : op.count;
}

void runRank(World& w, int r) {
  for (uint64_t epoch = 1; epoch <= w.ops.size() && !w.failures.stop; ++epoch) {
    const Op& op = w.ops[epoch - 1];
    // The application: this op's inputs into the buffers it passes, its output cleared.
    Buffers& b = w.buf[static_cast<size_t>(r * 2 + pairOf(epoch))];
    for (uint64_t i = 0; i < sendCount(op, w.n); ++i)
      b.send[i].store(input(epoch, r, i), std::memory_order_relaxed);
    for (uint64_t o = 0; o < recvCount(op, w.n); ++o) {
      b.recv[o].store(~0ull, std::memory_order_relaxed);
      b.writes[o] = 0;
    }
    launchsim::runThreads(w.nCtas, [&](int c) {  // stream order: all CTAs end before the next op
      runCta(w, r, c, epoch,
             static_cast<unsigned>(epoch * 131 + static_cast<uint64_t>(r) * 17 +
                                   static_cast<uint64_t>(c)));
    });
    if (w.failures.stop) return;
    const bool written = !(op.coll == CollType::Reduce && r != op.root);
    for (uint64_t o = 0; o < recvCount(op, w.n); ++o) {
      uint64_t want = 0;
      switch (op.coll) {
        case CollType::AllGather:
          want = input(epoch, static_cast<int>(o / op.count), o % op.count);
          break;
        case CollType::Broadcast:
          want = input(epoch, op.root, o);
          break;
        case CollType::ReduceScatter:
          for (int k = 0; k < w.n; ++k)
            want += input(epoch, k, static_cast<uint64_t>(r) * op.count + o);
          break;
        default:
          for (int k = 0; k < w.n; ++k) want += input(epoch, k, o);
      }
      const int times = b.writes[o].load();
      const uint64_t got = b.recv[o].load(std::memory_order_relaxed);
      if (times != (written ? 1 : 0) || (written && got != want)) {
        w.failures.fail("op " + std::to_string(epoch) + " (" + collName(op.coll) + " count " +
                        std::to_string(op.count) + ") rank " + std::to_string(r) + ": element " +
                        std::to_string(o) + " written " + std::to_string(times) + " times, " +
                        std::to_string(got) + " (want " + std::to_string(want) + ")");
        return;
      }
    }
  }
}

std::vector<std::string> runWorld(int n, int nCtas, int nOps, unsigned seed, bool endFlags) {
  World w;
  w.n = n;
  w.nCtas = nCtas;
  w.endFlags = endFlags;
  std::mt19937 rng(seed);
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  uint64_t maxSend = 1, maxRecv = 1;
  for (int i = 0; i < nOps; ++i) {
    Op op;
    op.coll = colls[rng() % 5];
    op.count = rng() % 3 == 0 ? 1 + rng() % 16 : 1 + rng() % 6000;
    op.root = static_cast<int>(rng() % static_cast<unsigned>(n));
    maxSend = std::max(maxSend, sendCount(op, n));
    maxRecv = std::max(maxRecv, recvCount(op, n));
    w.ops.push_back(op);
  }
  w.buf.resize(static_cast<size_t>(n * 2));
  for (Buffers& b : w.buf) {
    b.send.reset(new std::atomic<uint64_t>[maxSend]);
    b.recv.reset(new std::atomic<uint64_t>[maxRecv]);
    b.writes.reset(new std::atomic<int>[maxRecv]);
  }
  w.mailbox.reset(new Mailbox[static_cast<size_t>(n * kLaunchMaxCtas)]);
  w.arrive = launchsim::makeFlags(n);
  w.end = launchsim::makeFlags(n);
  launchsim::runThreads(n, [&](int r) { runRank(w, r); });
  return w.failures.list;
}

}  // namespace

TEST_CASE(
    "launch path, direct mode: CPU ranks and CTAs, random collectives, buffers reused at once") {
  struct Cfg {
    int n, ctas, ops;
  };
  for (Cfg c : {Cfg{2, 1, 150}, Cfg{2, 4, 150}, Cfg{3, 2, 100}, Cfg{4, 3, 80}, Cfg{8, 2, 60}}) {
    INFO("ranks " << c.n << ", CTAs " << c.ctas);
    const std::vector<std::string> failures =
        runWorld(c.n, c.ctas, c.ops, static_cast<unsigned>(c.n * 100 + c.ctas), true);
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

// The end flags are what makes buffer reuse safe: without them a rank checks its output and
// rewrites its inputs while peers still read or write them, and some run of these must show it.
TEST_CASE("launch path, direct mode: without the end flags the reuse race is seen") {
  bool seen = false;
  for (unsigned seed = 1; seed <= 8 && !seen; ++seed)
    seen = !runWorld(4, 2, 60, seed, false).empty();
  CHECK(seen);
}

TEST_CASE("launch path, direct mode: its upper end (MKERNEL_DIRECT_MAX_BYTES)") {
  const uint64_t MiB = uint64_t(1) << 20;
  // The whole buffer, as nccl-tests sizes it: AllGather and ReduceScatter count x ranks.
  CHECK(directWholeBytes(CollType::ReduceScatter, 1000, 4, 4) == 16000);
  CHECK(directWholeBytes(CollType::AllGather, 1000, 4, 2) == 8000);
  CHECK(directWholeBytes(CollType::AllReduce, 1000, 4, 8) == 8000);
  // auto: ReduceScatter leaves from 32 MiB, AllGather from 128 MiB, the others never.
  CHECK(directTakes(CollType::ReduceScatter, 32 * MiB - 1, kDirectAuto));
  CHECK_FALSE(directTakes(CollType::ReduceScatter, 32 * MiB, kDirectAuto));
  CHECK(directTakes(CollType::AllGather, 128 * MiB - 1, kDirectAuto));
  CHECK_FALSE(directTakes(CollType::AllGather, 128 * MiB, kDirectAuto));
  for (CollType c : {CollType::AllReduce, CollType::Broadcast, CollType::Reduce})
    CHECK(directTakes(c, uint64_t(8) << 30, kDirectAuto));
  // A number applies to every collective; 0 is no limit.
  CHECK_FALSE(directTakes(CollType::AllReduce, 4 * MiB, 4 * MiB));
  CHECK(directTakes(CollType::AllReduce, 4 * MiB - 1, 4 * MiB));
  CHECK(directTakes(CollType::ReduceScatter, uint64_t(8) << 30, 0));
  // Ranks sharing a GPU (emulation), auto: 2 per GPU up to 32 MiB, more up to 1 MiB; a number
  // set by the user still applies as it is.
  CHECK(directTakes(CollType::AllReduce, 32 * MiB - 1, kDirectAuto, 2));
  CHECK_FALSE(directTakes(CollType::AllReduce, 32 * MiB, kDirectAuto, 2));
  CHECK(directTakes(CollType::AllGather, MiB - 1, kDirectAuto, 8));
  CHECK_FALSE(directTakes(CollType::AllGather, MiB, kDirectAuto, 4));
  CHECK_FALSE(directTakes(CollType::ReduceScatter, 32 * MiB, kDirectAuto, 2));
  CHECK(directTakes(CollType::AllReduce, uint64_t(1) << 30, 0, 8));
  // ... with their persistent kernels kept small (MKERNEL_SHARED_CTAS): auto has no upper end; a
  // number still applies.
  for (CollType c : {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather})
    CHECK(directTakes(c, uint64_t(8) << 30, kDirectAuto, 2, true));
  CHECK(directTakes(CollType::AllGather, uint64_t(1) << 30, kDirectAuto, 4, true));
  CHECK_FALSE(directTakes(CollType::AllReduce, 4 * MiB, 4 * MiB, 2, true));
  // Eight and sixteen ranks on a GPU too, and MKERNEL_DIRECT_MAX_BYTES=0: with either
  // no eager op of such ranks takes the doorbell, which agreeLaunchCap relies on to give the
  // direct-mode kernels every SM.
  for (int sharing : {8, 16})
    for (CollType c : {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                       CollType::Broadcast, CollType::Reduce}) {
      CHECK(directTakes(c, uint64_t(8) << 30, kDirectAuto, sharing, true));
      CHECK(directTakes(c, uint64_t(8) << 30, 0, sharing, true));
    }
  // sharedPersistentCtas (auto): 4 SMs for the persistent kernels of 2 to 4 ranks, 1 CTA each for
  // more, off for one rank on a GPU.
  CHECK(sharedPersistentCtas(1) == 0);
  CHECK(sharedPersistentCtas(2) == 2);
  CHECK(sharedPersistentCtas(3) == 1);
  CHECK(sharedPersistentCtas(4) == 1);
  CHECK(sharedPersistentCtas(5) == 1);
  CHECK(sharedPersistentCtas(8) == 1);
  CHECK(sharedPersistentCtas(16) == 1);
  // ... with a numeric MKERNEL_DIRECT_MAX_BYTES, more than 4 ranks keep the full persistent kernel.
  CHECK(sharedPersistentCtas(2, false) == 2);
  CHECK(sharedPersistentCtas(4, false) == 1);
  CHECK(sharedPersistentCtas(5, false) == 0);
  CHECK(sharedPersistentCtas(8, false) == 0);
}
