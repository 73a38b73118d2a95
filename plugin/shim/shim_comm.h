// The shim's state for one communicator (ShimComm), and the side table that finds it from the
// handle the application holds (docs/SHIM.md, "Handles").
//
// The ncclComm_t an application holds is the real NCCL communicator: every name of libnccl.so.2
// the shim does not export reaches NCCL with NCCL's own handle. In emulation (MKERNEL_EMULATE=1)
// it is a stand-in the shim allocates and never frees or passes to NCCL. The side table maps a
// handle to its ShimComm; a handle it does not hold is NCCL's alone and goes to NCCL.
//
// A handle enters the table when its communicator exists (creation, split, shrink; bindHandle)
// and leaves it before NCCL destroys or aborts the communicator (releaseShimComm), so that an
// address NCCL reuses for another communicator is never taken for the old one. A stand-in never
// leaves it (its memory is never reused): a destroyed emulated handle stays recognised.
//
// ShimComm shells are never freed: a release frees what a comm holds (kernel, bootstrap, NCCL's
// communicator) and keeps the few hundred bytes of the struct, marked Destroyed, so that a call
// racing with the destroy reads a destroyed comm, never freed memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/policy.h"
#include "common/result.h"
#include "plugin/shim/nccl_api.h"
#include "transport/bootstrap/bootstrap.h"

namespace mkernel {
namespace shim {

enum class CommState : int {
  Initializing,  // created inside a group; the init runs at ncclGroupEnd
  Ready,
  InitFailed,  // initResult holds why
  Finalized,
  Revoked,
  Destroyed,
  Aborted,
};
const char* commStateName(CommState s);

// A user-defined reduction (ncclRedOpCreatePreMulSum), per comm as in NCCL.
// The op's number is NCCL's own (the real ncclRedOpCreatePreMulSum's answer, so that an entry
// point the shim does not export gets a value NCCL knows); in emulation the shim numbers its ops
// as NCCL does (ncclNumOps + the first free slot). Its slot in ShimComm::ops is number -
// ncclNumOps.
struct CustomOp {
  bool live = false;
  ncclDataType_t dtype = ncclFloat32;
  bool hostScalar = true;  // ncclScalarHostImmediate: `scalar` holds the value
  double scalar = 1.0;
  const void* scalarDev = nullptr;  // ncclScalarDevice: read while the collective runs
  bool hasRealOp = false;           // NCCL knows the op (not in emulation)
};

// MKERNEL_GRAPH: where the collectives run that only mkernel's persistent kernel would run
// (shim_select.h, doorbellRoute).
enum class GraphPath { Auto, Nccl, Mkernel };

struct ShimComm {
  std::atomic<CommState> state{CommState::Initializing};
  std::atomic<int> initResult{ncclInProgress};
  int rank = 0;
  int nRanks = 0;
  int cudaDev = -1;
  int nNodes = 1;
  bool emulate = false;
  bool blocking = true;
  // NCCL_CHECK_POINTERS=1 at creation, as NCCL's comm->checkPointers: every collective's buffers
  // are checked with cudaPointerGetAttributes (two driver calls per collective, so off by
  // default, as in NCCL).
  bool checkPointers = false;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;  // the user's, kept for split/shrink inheritance
  std::unique_ptr<bootstrap::Bootstrap> bootstrap;
  // What the application holds, the side table's key: the real NCCL comm, or the stand-in in
  // emulation; null until known (a split or shrink inside a group learns it at ncclGroupEnd).
  std::atomic<ncclComm_t> appHandle{nullptr};
  ncclComm_t real = nullptr;  // the real NCCL comm (the handle; null when emulating)
  // The mkernel communicator (null: everything is forwarded). Shared, and only read or changed
  // through kernelOf / takeKernel / setKernel (atomic): a call that uses it holds a reference, so
  // that ncclCommAbort, a revoke or a release on another thread, which take it out, never destroy
  // it under that call; the last reference destroys it (docs/SHIM.md, "Abort").
  std::shared_ptr<coll::Communicator> mk;
  std::string mkUnavailable;  // why mk is null
  std::unique_ptr<coll::SelectionPolicy>
      policy;                             // per call: mkernel or NCCL (collectives/policy.h)
  GraphPath graphPath = GraphPath::Auto;  // MKERNEL_GRAPH (shim_select.h)
  uint32_t splitSeq = 0;                  // split/shrink count, for unique bootstrap tags
  // A hash of the unique id the comm was made from: equal for the members of one communicator
  // (destroyShimComm: co-members in this process).
  uint64_t idHash = 0;
  std::mutex opsMutex;
  std::vector<CustomOp> ops;  // index = op - ncclNumOps
  // Held while mk or bootstrap is taken out for destruction (releaseShimComm) and while the exit
  // handler aborts a release still in progress (the Reaper), so that it never calls into one
  // that a release thread is destroying (seen on the H200: SIGSEGV in abort at exit, 1 run in 10).
  std::mutex teardownMu;
  // MKERNEL_STATS=1: the collectives this comm forwarded to the real NCCL (per CollType), what its
  // mkernel Communicator reported before it went (keepCommStats), and whether the summary line
  // was printed (at destroy or abort: printCommStats).
  std::atomic<uint64_t> forwarded[coll::kNumCollTypes] = {};
  coll::CollStats finalStats;
  bool haveFinalStats = false;
  std::atomic<bool> statsPrinted{false};

  ncclComm_t handle() const { return appHandle.load(std::memory_order_acquire); }
};

// The mkernel communicator of `c` (ShimComm::mk), a reference the caller holds while it uses it.
inline std::shared_ptr<coll::Communicator> kernelOf(const ShimComm* c) {
  return std::atomic_load(&c->mk);
}
// Takes it out of `c` (later kernelOf calls see none): what the caller then aborts or finalizes;
// in-flight users keep theirs.
inline std::shared_ptr<coll::Communicator> takeKernel(ShimComm* c) {
  return std::atomic_exchange(&c->mk, std::shared_ptr<coll::Communicator>());
}
inline void setKernel(ShimComm* c, std::shared_ptr<coll::Communicator> k) {
  std::atomic_store(&c->mk, std::move(k));
}

// Allocates a shell in state Initializing, kept for the life of the process; not in the side
// table until bindHandle.
ShimComm* newShimComm();
// A stand-in handle for an emulated communicator: a small allocation of the shim's, never freed,
// never passed to NCCL.
ncclComm_t newStandInHandle();
// Enters `handle` in the side table for `c` (and sets c->appHandle). A stale entry for the same
// address (a communicator NCCL destroyed without the shim: a call that bypassed it) is replaced.
void bindHandle(ShimComm* c, ncclComm_t handle);
// Removes c's handle from the side table (if it still maps to c).
void unbindHandle(ShimComm* c);
// The shim comm behind `handle`, or nullptr when the side table holds no such handle: NULL, a
// communicator NCCL made without the shim, or one already destroyed. Shared locks on one of
// sharded maps: the cost of every collective's lookup.
ShimComm* findShimComm(const void* handle);

// Logs the comm's "ready" line (INFO, INIT) when its handle and mkernel's part are both there.
void announceReady(ShimComm* c);

// Releases mkernel's part of a comm (kernel, bootstrap); `abortive`: without waiting.
void releaseKernelPart(ShimComm* c, bool abortive);
// Releases what a comm holds: mkernel's part, then (its handle first removed from the side table)
// the real NCCL comm, destroyed or aborted; `abortive`: without waiting.
void releaseShimComm(ShimComm* c, bool abortive);

// A communicator whose ranks span c->nNodes hosts without MKERNEL_MULTI_NODE=1: no mkernel part,
// every call goes to NCCL (c->mkUnavailable says so). Said at WARN by the first such communicator
// of the process, at INFO by the later ones.
void noteCrossHostFallback(ShimComm* c, int rank);

// MKERNEL_STATS=1 only (nothing otherwise): takes what c->mk ran (CollStats) before the shim
// drops it; call after its finalize or before its abort, while c->mk is set.
void keepCommStats(ShimComm* c);
// MKERNEL_STATS=1 only: the comm's summary line (collectives/stats.h, commStatsLine), once, when
// it is destroyed or aborted; releaseShimComm calls it.
void printCommStats(ShimComm* c);

// ncclCommDestroy's release. NCCL's destroy is local, so one thread may destroy several ranks one
// after another (nccl-tests does); but the mkernel Communicator's finalize waits for its peers
// (they may still read this rank's buffers). So the release runs on a thread of its own: if it
// completes within a short grace period the call returns after it, otherwise it returns and the
// release completes in the background once the peers arrive. Background releases still running
// when the library unloads are aborted and joined.
void destroyShimComm(ShimComm* c);

// Whether ncclCommDestroy should wait (a short grace) for its release: not while another member
// of the same communicator in this process is still live, since one thread destroying the members
// in turn (NCCL's single-process pattern: ncclCommInitAll, nccl-tests -t/-g) would otherwise wait
// the grace once per member while the first member's finalize barrier waits for the last.
// `coMemberStates`: the states of the other comms of this process with the same idHash.
inline bool destroyWaitsForRelease(const std::vector<CommState>& coMemberStates) {
  for (CommState s : coMemberStates)
    if (s == CommState::Ready || s == CommState::Finalized || s == CommState::Revoked ||
        s == CommState::Initializing)
      return false;
  return true;
}

// --- errors ---------------------------------------------------------------------------------
// Converts a shim result, remembering that the last failure was the shim's own (its message is
// in mkernel::lastError()).
ncclResult_t toNccl(Result r);
// Passes a real NCCL result through, remembering that the last failure was NCCL's.
ncclResult_t fromReal(ncclResult_t r);
// Whether the last failure the application saw came from the shim (not from the real NCCL).
bool lastFailureWasOurs();
// Whether `r` is the code of the last failure the application saw and that failure arose in
// mkernel (ncclGetErrorString then points at mkernel's log instead of NCCL's).
bool failureIsMkernels(ncclResult_t r);

}  // namespace shim
}  // namespace mkernel
