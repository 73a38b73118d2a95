// The shim's communicator: what an ncclComm_t handed out by libmkernel.so points to.
//
// Re-entry (NCCL-ABI.md): libnccl calls its own exported names through the PLT, so under
// LD_PRELOAD the shim's entry points also receive the REAL NCCL's handles. Every entry that takes
// a comm first asks findShimComm(): a registry of every shim comm ever made answers without
// reading the handle's memory (a foreign pointer is never dereferenced), and the magic word at
// the start of the struct is checked as a second guard. Foreign handles go straight to the real
// function.
//
// Shells are never freed: ncclCommDestroy/Abort release everything the comm holds (kernel,
// bootstrap, real NCCL comm) but keep the few hundred bytes of the struct, marked Destroyed. So
// a destroyed handle is still recognised as ours (an error, not a forward of a dangling pointer
// into NCCL), and the address can never be reused for a real NCCL comm the registry would then
// misclassify.
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

constexpr uint64_t kShimCommMagic = 0x316c656e72656b6dull;  // "mkernel1"

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
struct CustomOp {
  bool live = false;
  ncclDataType_t dtype = ncclFloat32;
  bool hostScalar = true;  // ncclScalarHostImmediate: `scalar` holds the value
  double scalar = 1.0;
  const void* scalarDev = nullptr;  // ncclScalarDevice: read while the collective runs
  bool hasRealOp = false;
  ncclRedOp_t realOp = ncclSum;  // the same op created on the real comm (forwarded calls)
};

// MKERNEL_GRAPH: where collectives captured into a CUDA graph run (shim_select.h, graphRoute).
enum class GraphPath { Auto, Nccl, Mkernel };

struct ShimComm {
  uint64_t magic = kShimCommMagic;  // first member, on purpose
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
  ncclComm_t real = nullptr;               // the real NCCL comm beside it (null when emulating)
  std::unique_ptr<coll::Communicator> mk;  // null: everything is forwarded
  std::string mkUnavailable;               // why mk is null
  std::unique_ptr<coll::SelectionPolicy>
      policy;             // per call: mkernel or NCCL (collectives/policy.h)
  GraphPath graphPath = GraphPath::Auto;  // MKERNEL_GRAPH (shim_select.h)
  uint32_t splitSeq = 0;  // split/shrink count, for unique bootstrap tags
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

  ncclComm_t handle() { return reinterpret_cast<ncclComm_t>(this); }
};

// Allocates a shell in state Initializing and registers it.
ShimComm* newShimComm();
// The shim comm behind `comm`, or nullptr when `comm` is not one of ours (foreign or null).
ShimComm* findShimComm(const void* comm);

// Releases what a comm holds (kernel, real comm, bootstrap); `abortive`: without waiting.
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
    if (s == CommState::Ready || s == CommState::Finalized || s == CommState::Revoked || s == CommState::Initializing)
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
