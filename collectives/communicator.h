// The boundary between the NCCL shim (plugin/shim) and mkernel's collectives.
//
// A Communicator is one rank's view of a group of ranks that run collectives in mkernel's
// persistent kernel. The shim owns the NCCL-facing handle, argument validation, groups and the
// fallback to the real NCCL; it hands the collectives it selected (collectives/policy.h) to a
// Communicator, which keeps the caller's stream order (docs/KERNEL.md, stream order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/types.h"
#include "common/result.h"

namespace mkernel {
namespace bootstrap {
class Bootstrap;
}
namespace coll {

struct CommOptions {
  int rank = 0;
  int nRanks = 1;
  int cudaDev = 0;
  int ranksPerNode = 0;         // 0: from the hosts (real); MKERNEL_RANKS_PER_NODE in emulation
  bool emulate = false;         // MKERNEL_EMULATE: ranks may share a GPU
  bool blocking = true;         // ncclConfig_t::blocking
  int maxCtas = 0;              // 0: default (MKERNEL_CTAS / emulation sizing)
  bool settingsAgreed = false;  // the caller ran agreeRouteSettings on this bootstrap already
  // false: the caller never sends this communicator a collective that needs the persistent
  // kernel (needsDoorbell; the shim's MKERNEL_GRAPH=auto on one node with a real NCCL), so it
  // reserves no SMs for one and never launches it (docs/KERNEL.md, "CTA sizing"). The same on
  // every rank.
  bool persistentKernel = true;
};

// One route on every rank (docs/SHIM.md, "One route on every rank"). The settings that can change
// where or how a collective runs (params.def's ROUTE column, as canonical text, and mkernel's
// version) must be the same on every rank of a communicator, or ranks would wait on different
// paths. agreeRouteSettings compares them at creation (one all-gather of a digest; on a mismatch
// a second one of the texts) and fails with InvalidUsage on every rank alike, naming each setting
// that differs and which ranks hold which value. Communicator::create runs it unless
// CommOptions::settingsAgreed; the shim runs it for every communicator, MKERNEL_DISABLE=1 included.
using RouteSettings = std::vector<std::pair<std::string, std::string>>;
RouteSettings routeSettingsInEffect();
Result agreeRouteSettings(bootstrap::Bootstrap& bs, const char* caller);
// The same for the given settings (tests).
Result agreeSettings(bootstrap::Bootstrap& bs, const RouteSettings& mine, const char* caller);

// Counters read by mkernelGetStats(): which path ran how many collectives of each kind.
struct CollStats {
  uint64_t kernelOps[kNumCollTypes] = {};  // run by mkernel's kernels (both paths)
  uint64_t launchOps[kNumCollTypes] = {};  // ... of which by the launch path (small, eager)
  uint64_t forwarded[kNumCollTypes] = {};  // handed to the real NCCL (counted by the shim)
  uint64_t kernelLaunches = 0;             // persistent-kernel (re)launches
  uint64_t launchMaxBytes = 0;             // the launch path's threshold in effect (0: off)
  uint64_t llMaxBytes = 0;     // ... its LL mode's, bytes per (source, destination) (0: off)
  uint64_t llOps = 0;          // ops issued in LL mode
  uint64_t llBatchOps = 0;     // ... of which in a batch of a group's ops (MKERNEL_LL_BATCH)
  uint64_t oneRankCopies = 0;  // one rank: ops done as a cudaMemcpyAsync (MKERNEL_ONE_RANK)
  uint64_t ringOps = 0;        // ops posted as rings (staged_ring.h: MKERNEL_ALGO=ring, PCIe boxes)
  bool ring = false;           // every collective a ring (PeerSetup::ring, agreed)
  bool ringOrdered =
      false;  // ... in ringOrder (position -> rank), else rank order (MKERNEL_RING_ORDER)
  uint8_t ringOrder[16] = {};
  bool launchDirect = false;  // ... and above it, eager ops of thread ranks (direct mode)
  int directSharing = 1;      // the most ranks on one GPU (direct mode's upper end)
  int hierCtas = 0;           // CTAs per hierarchical collective (0: not hierarchical)
  int hierWorkers = 0,
      hierReducers =
          0;         // MKERNEL_HIER_ROLES in effect: per lane of an AllReduce (0: data-parallel)
  int hierRail = 0;  // MKERNEL_HIER_RAIL in effect (HierRailAlgo: 0 direct, 1 ring, 2 rhd)
  int railMbps = 0;  // the slowest rank's rail NIC in Mb/s, agreed (0: one node)
  // The hierarchical AllReduce in turn (MKERNEL_HIER_OVERLAP=0): CTA 0's chunks, and the time they
  // spent in the node phases and in the rail phase (collectives/algo/hier_staged.h, "Phase times")
  uint64_t hierTurnChunks = 0, hierTurnNodeNs = 0, hierTurnRailNs = 0;
  // CTA 0's waits in every hierarchical collective, pipelined or in turn: for its rail transfers
  // and at its node barriers (DeviceState::hierWait)
  uint64_t hierWaitRailNs = 0, hierWaitNodeNs = 0;
  // ... and, in CTA roles (CTA 0 is lane 0's sender), for the workers' and reducers' counters
  uint64_t hierWaitRoleNs = 0;
  // ... and CTA 0's own work, by kind (HierBusy: copies, copies through its net buffers,
  // reductions, reductions through its net buffers, posts to the proxy), the same timing
  uint64_t hierBusyNs[5] = {};
  bool staged = false;  // ranks stage through IPC buffers (process ranks; agreed)
  int pdl = 0;          // MKERNEL_PDL in effect: 0 off, 1 wait, 2 early
  int directThreads =
      0;  // threads per CTA of a direct-mode op (MKERNEL_DIRECT_KERNEL; 0: no direct mode)
  int directCtas = 0;         // ... and its most CTAs (the cap agreed at creation)
  bool sharedDirect = false;  // ranks sharing a GPU: small persistent kernels, direct mode at every
                              // size (MKERNEL_SHARED_CTAS)
  int persistentCtas = 0;     // CTAs of the persistent kernel when it runs (0: made without one)
  // Copies of the launch path's device counters that missed their bound (kCounterReadBoundS,
  // 0.25 s; held in a hardware queue behind other work): the launch-path counts lag until one
  // arrives
  uint64_t countersLate = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Creates the rank's communicator. Collective over `bootstrap` (every rank calls it).
  // `bootstrap` must outlive the communicator: finalize() uses it for a closing barrier.
  static Result create(const CommOptions& opts, bootstrap::Bootstrap* bootstrap,
                       std::unique_ptr<Communicator>* out);

  // Posts n collectives (one group, or n = 1) in the order of `stream`. Returns once posted;
  // completion is ordered on `stream`. Legal during CUDA graph capture of `stream`.
  virtual Result enqueue(const CollArgs* ops, int n, cudaStream_t stream) = 0;

  // Thread ranks of this communicator sharing one GPU (emulation) hold each other back when one
  // queues what waits for a collective's end before a co-located peer has queued its start
  // (collectives/runtime/post_fence.h). Such a communicator is fenced(): each collective is posted
  // in two steps. enqueueStart() queues one collective's start and holds back what waits for its
  // end; completeStarts() waits (on the host, bounded by MKERNEL_TIMEOUT_S) until every co-located
  // rank of this process has posted as many, then queues what was held. enqueue() does both for
  // each op; a thread driving several such ranks in one group (the shim) calls enqueueStart for
  // each rank's collective before completeStarts for any. Unfenced: enqueueStart is enqueue and
  // completeStarts does nothing.
  virtual bool fenced() const { return false; }
  virtual Result enqueueStart(const CollArgs& op, cudaStream_t stream) {
    return enqueue(&op, 1, stream);
  }
  virtual Result completeStarts() { return Result::Success; }

  // Whether `op` runs on the persistent kernel's doorbell rather than on a path launched on the
  // caller's stream (the launch path's kernels, or a one-rank copy), whose captures need nothing
  // resident. A function of the op's shared arguments and of settings agreed at creation, the
  // same whether the stream is being captured or not, so the same on every rank (the shim's
  // MKERNEL_GRAPH routes on it).
  virtual bool needsDoorbell(const CollArgs& op) const {
    (void)op;
    return false;
  }

  // Ok, InProgress, or the error that stopped the communicator (RemoteError on a dead peer).
  // queryDevice = false: only what the kernels recorded in host memory, with no CUDA call, as
  // the shim needs while the caller's stream is being captured (a stream query is refused then
  // and invalidates the capture); true also asks the driver whether the kernel's context failed
  // (a lost context under MPS never reaches the host-memory record).
  virtual Result asyncError(bool queryDevice = true) = 0;
  // Stops the kernel and every wait promptly; always returns.
  virtual Result abort() = 0;
  // Waits for posted work, then releases everything. Collective.
  virtual Result finalize() = 0;

  virtual const CommOptions& options() const = 0;
  virtual void stats(CollStats* out) const = 0;

  // MKERNEL_KERNEL_TRACE=1: the persistent kernel's per-group timestamps (KernelTraceRecord of
  // collectives/algo/work.h, flattened: seq, kTracePoints times in ns, kTracePoints clock64
  // stamps), written records only, by seq. Call when the communicator is idle. InvalidUsage when
  // tracing is off.
  virtual Result kernelTrace(std::vector<uint64_t>* out) const = 0;

  // MKERNEL_TEST_STALL_BARRIER (a test hook): whether a CTA of this rank has stopped at that
  // barrier (false while the hook is off or before any CTA got there).
  virtual bool testStalled() const { return false; }
};

}  // namespace coll
}  // namespace mkernel
