// collectives/algo/work.h: which per-CTA error record the communicator reports
// (reportedErrorRecord, KernelCommunicator::kernelError): the first that names a cause (a peer,
// the proxy) before any CTA's wait for another CTA of its rank.
#include "tests/catch.h"

#include <initializer_list>
#include <vector>

#include "collectives/algo/work.h"

using namespace mkernel::coll;

namespace {

std::vector<ErrorRecord> records(std::initializer_list<uint32_t> whats) {
  std::vector<ErrorRecord> r;
  for (uint32_t w : whats) {
    ErrorRecord e{};
    e.what = w;
    r.push_back(e);
  }
  return r;
}

int pick(std::initializer_list<uint32_t> whats) {
  const std::vector<ErrorRecord> r = records(whats);
  return reportedErrorRecord(r.data(), static_cast<int>(r.size()));
}

}  // namespace

TEST_CASE("error records: the cause before the waits that follow from it") {
  CHECK(pick({}) == -1);
  CHECK(pick({kWaitNone, kWaitNone, kWaitNone}) == -1);
  // One record: whatever it is.
  CHECK(pick({kWaitPeerStart}) == 0);
  CHECK(pick({kWaitNone, kWaitHierRole}) == 1);
  CHECK(pick({kWaitSlotDone, kWaitNone}) == 0);
  // CTA roles: the sender (CTA 0) timed out on its worker, the worker (CTA 1) on the peer.
  CHECK(pick({kWaitHierRole, kWaitPeerChunk, kWaitNone}) == 1);
  // ... or on the proxy, recorded by the reducer (CTA 2).
  CHECK(pick({kWaitHierRole, kWaitNone, kWaitProxy}) == 2);
  // The leader's wait for its workers' slot, and a worker's for the dispatch, are internal too.
  CHECK(pick({kWaitSlotDone, kWaitDispatch, kWaitLaunchPeer}) == 2);
  // Among causes, the first CTA's.
  CHECK(pick({kWaitNone, kWaitProxy, kWaitPeerEnd}) == 1);
  // Only internal ones: the first.
  CHECK(pick({kWaitNone, kWaitDispatch, kWaitHierRole}) == 1);
  CHECK(internalWait(kWaitHierRole));
  CHECK(internalWait(kWaitSlotDone));
  CHECK(internalWait(kWaitDispatch));
  for (uint32_t w : {kWaitPeerStart, kWaitPeerEnd, kWaitPeerChunk, kWaitProxy, kWaitLaunchPeer,
                     kWaitLaunchPeerEnd})
    CHECK_FALSE(internalWait(w));
}
