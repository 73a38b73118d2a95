// collectives/algo/algo.h: partition, chunking, ring schedule, chains and reduction order.
#include "tests/catch.h"

#include <set>
#include <vector>

#include "collectives/algo/algo.h"
#include "coll_test_util.h"

using namespace mkernel::coll;

static_assert(static_cast<int>(DevRedOpKind::Sum) == 0 &&
                  static_cast<int>(DevRedOpKind::Max) == 2 &&
                  static_cast<int>(DevRedOpKind::SumPostDiv) == 5,
              "DevRedOpKind values are part of the host/device contract");

TEST_CASE("algo: rankSlice partitions any count into aligned, ordered, covering slices") {
  test::Rng rng(7);
  std::vector<size_t> counts = {0, 1, 2, 3, 15, 16, 17, 255, 256, 257, 1000, 4096, 1u << 20};
  for (int i = 0; i < 40; ++i) counts.push_back(rng.next() % 100000);
  for (size_t count : counts)
    for (int n = 1; n <= 16; ++n)
      for (size_t align : {1, 2, 4, 8, 16}) {
        size_t next = 0, maxCount = 0, minNonTail = ~size_t(0);
        for (int r = 0; r < n; ++r) {
          Slice s = rankSlice(count, n, r, align);
          INFO("count " << count << " n " << n << " r " << r << " align " << align);
          REQUIRE(s.offset == next);  // contiguous, in rank order
          CHECK((s.offset % align == 0 || s.offset == count));
          next = s.offset + s.count;
          maxCount = std::max<size_t>(maxCount, s.count);
          if (next < count) minNonTail = std::min<size_t>(minNonTail, s.count);
        }
        CHECK(next == count);
        CHECK(maxCount <= divUp(count, n) + align - 1);
        // Only the slices at the tail may be short: every slice before the end is full size.
        if (minNonTail != ~size_t(0)) CHECK(minNonTail == maxCount);
      }
}

TEST_CASE("algo: chunks cover a slice exactly, and empty chunks sit at its end") {
  for (size_t elemSize : {1, 2, 4, 8}) {
    for (size_t chunkBytes : {1, 16, 17, 100, 4096}) {
      size_t ce = chunkElemsFor(chunkBytes, elemSize);
      CHECK(ce % sliceAlignElems(elemSize) == 0);
      CHECK(ce >= 1);
      for (size_t count : {0, 1, 5, 64, 1000}) {
        Slice s{40, count};
        size_t covered = 0;
        for (size_t k = 0; k < numChunks(count, ce); ++k) {
          Slice c = chunkOf(s, ce, k);
          CHECK(c.offset == s.offset + covered);
          CHECK(c.count > 0);
          covered += c.count;
        }
        CHECK(covered == count);
        Slice past = chunkOf(s, ce, numChunks(count, ce) + 3);
        CHECK(past.count == 0);
        CHECK(past.offset == s.offset + count);
      }
    }
  }
}

TEST_CASE("algo: ring reduce-scatter and all-gather schedules are consistent") {
  for (int n = 1; n <= 16; ++n) {
    for (int r = 0; r < n; ++r) {
      std::set<int> rsSent, agReceived;
      for (int s = 0; s + 1 < n; ++s) {
        // What r receives at step s is what its previous rank sends at step s.
        CHECK(ringRsRecvSlice(r, s, n) == ringRsSendSlice(ringPrev(r, n), s, n));
        CHECK(ringAgRecvSlice(r, s, n) == ringAgSendSlice(ringPrev(r, n), s, n));
        // What r forwards at step s+1 is what it received at step s.
        if (s + 2 < n) CHECK(ringRsSendSlice(r, s + 1, n) == ringRsRecvSlice(r, s, n));
        if (s + 2 < n) CHECK(ringAgSendSlice(r, s + 1, n) == ringAgRecvSlice(r, s, n));
        rsSent.insert(ringRsSendSlice(r, s, n));
        agReceived.insert(ringAgRecvSlice(r, s, n));
      }
      if (n > 1) {
        CHECK(ringRsRecvSlice(r, n - 2, n) == r);  // the last reduce-scatter step completes slice r
        CHECK(ringAgSendSlice(r, 0, n) == r);      // the all-gather starts with it
        CHECK(rsSent.count(r) == 0);               // r never sends its own slice half-reduced
        CHECK(agReceived.count(r) == 0);           // and receives every other slice once
        CHECK(static_cast<int>(agReceived.size()) == n - 1);
      }
    }
  }
}

TEST_CASE("algo: reduction orders and chains are permutations ending where they must") {
  for (int n = 1; n <= 16; ++n)
    for (int slice = 0; slice < n; ++slice) {
      std::set<int> ring, canonical;
      for (int i = 0; i < n; ++i) {
        ring.insert(reductionPeer(Algo::Ring, i, slice, n));
        canonical.insert(reductionPeer(Algo::TwoShot, i, slice, n));
        CHECK(reductionPeer(Algo::OneShot, i, slice, n) == i);
      }
      CHECK(static_cast<int>(ring.size()) == n);
      CHECK(static_cast<int>(canonical.size()) == n);
      CHECK(reductionPeer(Algo::Ring, n - 1, slice, n) == slice);  // the owner adds last
      // The ring order is the order in which the slice travels: starting at the rank after its
      // owner, along ringNext.
      for (int i = 0; i + 1 < n; ++i)
        CHECK(reductionPeer(Algo::Ring, i + 1, slice, n) ==
              ringNext(reductionPeer(Algo::Ring, i, slice, n), n));
      std::set<int> bc, rd;
      for (int t = 0; t < n; ++t) {
        bc.insert(chainRank(CollType::Broadcast, t, slice, n));
        rd.insert(chainRank(CollType::Reduce, t, slice, n));
        CHECK(chainRank(CollType::Reduce, t, slice, n) == reductionPeer(Algo::Ring, t, slice, n));
      }
      CHECK(static_cast<int>(bc.size()) == n);
      CHECK(static_cast<int>(rd.size()) == n);
      CHECK(chainRank(CollType::Broadcast, 0, slice, n) == slice);
      CHECK(chainRank(CollType::Reduce, n - 1, slice, n) == slice);
    }
}

TEST_CASE("algo: which algorithm implements which collective") {
  CHECK(algoSupports(CollType::AllReduce, Algo::OneShot));
  CHECK(algoSupports(CollType::AllReduce, Algo::TwoShot));
  CHECK_FALSE(algoSupports(CollType::AllReduce, Algo::Direct));
  for (CollType c :
       {CollType::AllGather, CollType::ReduceScatter, CollType::Broadcast, CollType::Reduce}) {
    CHECK(algoSupports(c, Algo::Direct));
    CHECK(algoSupports(c, Algo::Ring));
    CHECK_FALSE(algoSupports(c, Algo::OneShot));
    CHECK_FALSE(algoSupports(c, Algo::TwoShot));
  }
  CHECK(numRounds(CollType::AllReduce, Algo::OneShot, 0, 4, 4, 16) == 0);
  CHECK(numRounds(CollType::AllReduce, Algo::TwoShot, 1, 4, 4, 16) == 1);
  // Ring AllReduce goes by the largest rank slice: 1000 floats / 4 ranks = 250 -> 252 aligned.
  CHECK(numRounds(CollType::AllReduce, Algo::Ring, 1000, 4, 4, 16) == divUp(252, 16));
  CHECK(stagingElemsNeeded(CollType::AllReduce, Algo::Ring, 1000, 16) == 32);
  CHECK(stagingElemsNeeded(CollType::Broadcast, Algo::Ring, 1000, 16) == 16);
  CHECK(stagingElemsNeeded(CollType::AllReduce, Algo::OneShot, 1000, 16) == 1000);
  CHECK(stagingElemsNeeded(CollType::AllGather, Algo::Direct, 1000, 16) == 0);
}
