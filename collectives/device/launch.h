// The host API of the persistent kernel (collectives/device/kernel.cu): one launcher that takes
// pointers, counts and a stream. Plain host header: the communicator (a .cc file compiled by the
// host compiler) includes it; nothing here needs nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "collectives/algo/work.h"
#include "common/result.h"
#include "transport/proxy/proxy_ring.h"

namespace mkernel {
namespace coll {

// The kernels' parameters, read through the constant cache: the launch-path kernels' hot fields
// come first, in one 64-byte line (then the peers' table), because each launch's parameters are
// new memory to the SM's constant cache, and every line a kernel first touches is a miss it waits
// for before the branch that needs it (spread over five lines of 450 bytes, the LL path's warmup,
// pdl, trace pointer, rank and nRanks cost five such misses before the peers').
struct KernelParams {
  // ---- hot: the launch-path kernels' first reads ----
  DeviceState* self;         // == peers[rank]
  KernelTraceRecord* trace;  // kTraceDepth records in device memory, or nullptr (no tracing)
  int32_t rank;
  int32_t nRanks;
  // 1: the kernel returns at once (warmKernels: a launch made only so that the driver sizes the
  // context's local memory for it while nothing of ours runs).
  uint32_t warmup;
  // MKERNEL_PDL (programmatic dependent launch, sm_90): 0 off; 1 the launch-path kernels are
  // launched with programmatic stream serialization and wait for the work before them
  // (griddepcontrol.wait) before they read anything; 2 they also let the next such launch on the
  // stream become resident at once (griddepcontrol.launch_dependents), one rank per GPU only.
  uint32_t pdl;
  // MKERNEL_GRAPH_EPILOGUE=light: a captured launch numbers its replay without fences
  // (launchKernel).
  uint32_t graphEpilogueLight;
  uint32_t launchWatch;  // MKERNEL_LAUNCH_WATCH: 0 off, 1 the first launch-path op, 2 every op
                         // (launchStarted)
  uint32_t traceGraph;  // MKERNEL_KERNEL_TRACE=2 (1) or 3 (2: the LL receive's detail): launch-path
                        // kernels trace captured ops, not eager ones
  // 1: eager launch-path ops are numbered by the device, as captured ones are, in the same
  // namespace (launch_path.h, "One numbering"), so that an op captured on one rank and eager on
  // another meet; 0 (MKERNEL_EAGER_HOST_NUMBERS=1): by the host, in a namespace of their own.
  uint32_t deviceNumbers;
  HostControl* ctl;               // host-mapped, device address
  uint64_t timeoutNs;             // MKERNEL_TIMEOUT_S
  DeviceState* peers[kMaxRanks];  // every rank's DeviceState, as this process addresses it
  // ---- the rest ----
  // Host only: which launch-path ops take a kernel of their own rather than launchKernel, bits of
  // kOwnKernelLl (MKERNEL_LL_KERNEL=own: launchLlKernel) and kOwnKernelDirect
  // (MKERNEL_DIRECT_KERNEL=own: launchDirectKernel).
  uint32_t ownKernels;
  const WorkSlot* slots;  // host-mapped, device address
  void* staging;          // this rank's one-shot staging buffer (in-place AllReduce)
  uint64_t stagingBytes;
  uint64_t idleExitNs;  // MKERNEL_IDLE_EXIT_US
  // Process ranks (collectives/algo/staged.h): every rank's staging buffer as this process maps it
  // (CUDA IPC), all nullptr when the ranks are threads of one process.
  char* stagedBuf[kMaxRanks];
  uint64_t stagedChunkBytes;
  // Emulated nodes (MKERNEL_RANKS_PER_NODE, collectives/algo/hier_staged.h): nNodes > 1 runs every
  // collective hierarchically, split over hierCtas CTAs; CTA c posts its inter-node transfers to
  // channel c of this rank's proxy (ring and flags host-mapped) from its own net buffers
  // (host-mapped); nNodes = 1 and null pointers otherwise.
  proxy::ProxyRing* proxyRing;    // hierCtas rings, one per CTA (a channel of the rank's proxy)
  proxy::ProxyFlags* proxyFlags;  // hierCtas flag blocks
  char* netBuf;                   // hierCtas blocks of netBufBytes
  uint64_t netBufBytes;  // one CTA's net buffers: 2 slots x (nNodes + 1) x stagedChunkBytes
  int32_t hierCtas;      // MKERNEL_HIER_CTAS: CTAs a hierarchical collective is split over
  int32_t nNodes;
  int32_t perNode;
  int32_t nCtas;
  int32_t staged;  // 1: process ranks, collectives go through stagedBuf
  // Test hook (MKERNEL_TEST_STALL_BARRIER, 0 = off): every CTA of this rank stops moving data at
  // the K-th barrier of a staged collective (counted within the collective, its start barrier
  // first), reports it in HostControl::testStalled and spins until the communicator is aborted,
  // so that a test can kill the process in the middle of a collective's data movement.
  uint32_t testStallBarrier;
  uint32_t
      hierOverlap;  // MKERNEL_HIER_OVERLAP: pipelined hierarchical AllReduce (0: phases in turn)
  uint32_t hierKeepOwn;  // MKERNEL_HIER_KEEP_OWN: HierCall::keepOwn (0: the own piece through P)
  int32_t hierAhead;     // MKERNEL_HIER_AHEAD: HierCall::ahead (1 or 2 chunks)
  // MKERNEL_HIER_ROLES: workers and reducers per lane of a hierarchical AllReduce in CTA roles
  // (collectives/algo/hier_staged.h); 0, 0: the data-parallel form.
  int32_t hierWorkers;
  int32_t hierReducers;
  int32_t
      hierRail;  // MKERNEL_HIER_RAIL (coll::HierRailAlgo): the AllReduce's exchange among the rail
  // Rings (staged_ring.h): ringOrder[p] the rank at position p when ringOrdered
  // (PeerSetup::ringOrder).
  int32_t ringOrdered;
  uint8_t ringOrder[kMaxRanks];
};
static_assert(offsetof(KernelParams, peers) == 64,
              "KernelParams: the hot fields fill the first 64-byte line");

// Launches the persistent kernel with p.nCtas CTAs of kKernelThreads threads on `stream`.
Result launchPersistentKernel(const KernelParams& p, cudaStream_t stream);

// Local memory (stack) per thread the persistent kernel (or the launch-path kernel) needs: the
// device's stack limit must be at least this BEFORE kernels run, or a later launch resizes local
// memory, which waits for every running kernel, i.e. forever for a peer's persistent kernel (NCCL
// sets the limit for the same reason).
Result persistentKernelLocalBytes(size_t* out);

// Launches the persistent kernel and the launch-path kernels once each, as no-ops (KernelParams::
// warmup), on `stream`, and waits for them. The first launch of a kernel that needs more local
// memory than the context holds resizes it, and the resize waits for every kernel running in the
// context; done at creation, before any of mkernel's kernels runs, it waits for nothing
// (docs/KERNEL.md, "Local memory").
Result warmKernels(cudaStream_t stream);
// Diagnosis (the launch watch): launches an empty kernel on each of n fresh streams (new streams
// take the hardware queues in turn) and returns on how many it ran within `seconds`.
int probeFreshStreams(int n, double seconds);

// The launch path (collectives/route/launch_path.h): launches the small-collective kernel for `d`
// with nCtas CTAs on the caller's stream; `epoch` is the communicator's launch-path op counter (the
// same on every rank), `opIndex` what the kernel reports in DeviceState::launchDone[d.coll].
// `mode`: kLaunchModeInbox (publish into the own inbox, peers read it), kLaunchModeDirect (thread
// ranks only, any size: the CTAs exchange buffer addresses instead of data and run the direct
// algorithm between the user buffers, d.nCtas == nCtas, AllReduce TwoShot, with a second flag at
// the end: peers read our buffers until then), kLaunchModeLl (push 16-byte lines into the
// peers' slots, launch_path.h "LL mode").
constexpr int kLaunchModeInbox = 0;
constexpr int kLaunchModeDirect = 1;
constexpr int kLaunchModeLl = 2;
Result launchCollective(const KernelParams& p, const WorkDesc& d, int nCtas, uint64_t epoch,
                        uint64_t opIndex, int mode, cudaStream_t stream);

// A run of a group's LL ops (launch_path.h, "LL batches"), launched as one kernel of nCtas CTAs.
// exchange 0 (MKERNEL_LL_BATCH=serial; one CTA, ops of one CTA each): op i is the
// communicator's launch-path op epoch + i, each its own exchange. exchange 1 (=exchange): one
// exchange, number `epoch`, op i's lines from line lineBase[i] of each slot, the ops in waves
// (llPlanWaves, this rank's plan; a barrier over the grid between waves): bit i of waveMask
// starts a wave at op i, whose warps are [warpFirst[i], + warpCount[i]) of the grid's. epoch 0:
// captured, the device numbers from graphSeq. Op i reports opIndex[i] in
// launchDone[ops[i].coll].
struct LlBatch {
  WorkDesc ops[kMaxOpsPerSlot];
  uint64_t opIndex[kMaxOpsPerSlot];
  uint32_t lineBase[kMaxOpsPerSlot];
  uint16_t warpFirst[kMaxOpsPerSlot];
  uint16_t warpCount[kMaxOpsPerSlot];
  uint64_t epoch;
  int32_t nOps;
  uint32_t waveMask;
  int32_t exchange;
  int32_t reserved;
};
Result launchLlBatch(const KernelParams& p, const LlBatch& b, int nCtas, cudaStream_t stream);

// Largest number of CTAs of the launch-path kernels (an op's, an LL batch's) one SM can hold
// (occupancy query; the smaller of the two).
Result launchKernelCtasPerSm(int* out);
// The same for launchDirectKernel (kDirectThreads threads per CTA; MKERNEL_DIRECT_KERNEL=own).
Result directKernelCtasPerSm(int* out);

// Largest number of CTAs of the persistent kernel one SM can hold (occupancy query).
Result persistentKernelCtasPerSm(int* out);

}  // namespace coll
}  // namespace mkernel
