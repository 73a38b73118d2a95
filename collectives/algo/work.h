// Structs shared by the host (collectives/runtime/communicator.cc) and the persistent kernel
// (collectives/device/): work descriptors, doorbells, cross-rank flags, the host-mapped control
// block. Plain header: no CUDA intrinsics; every layout is pinned by static_assert because host
// and device compilers must agree on it byte for byte. docs/KERNEL.md describes the protocol.
//
// Where each struct lives:
//   WorkSlot[kMaxSlots]   host-mapped pinned memory: the host writes descriptors, the kernel reads
//   DeviceState           device memory, one per rank, mapped into every local peer: doorbells
//                         (written by stream memops), barrier flags and mailboxes (read by peers),
//                         the kernel's state that survives an idle exit + relaunch
//   HostControl           host-mapped pinned memory: abort/quit/resident flags (host -> kernel),
//                         kernel state, counters and error records (kernel -> host)
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/algo/algo.h"

namespace mkernel {
namespace coll {

constexpr int kMaxCtas = 64;         // CTAs of one persistent kernel
constexpr int kMaxHierCtas = 16;     // CTAs of one hierarchical collective (MKERNEL_HIER_CTAS)
constexpr int kMaxHierRoleCtas = 8;  // workers, and reducers, per lane (MKERNEL_HIER_ROLES)
constexpr int kHierNetSlots = 3;     // net slots of a lane (collectives/algo/hier_staged.h)
constexpr int kMaxRanks = 16;        // ranks of one communicator the kernel can address
constexpr int kMaxOpsPerSlot = 8;    // collectives of one group posted by one doorbell
constexpr int kEagerSlots = 64;      // ring of slots reused by eager enqueues
constexpr int kMaxSlots = 256;       // eager ring + slots dedicated to CUDA-graph captures
constexpr int kDispatchDepth = 64;   // leader CTA -> worker CTAs queue
constexpr int kKernelThreads = 512;  // threads per CTA (half an SM: user kernels still fit)
// The launch path (docs/KERNEL.md, "Small collectives: the launch path"): a short kernel on the
// caller's stream per small eager collective, one cross-rank flag per CTA, inputs published in a
// double-buffered inbox of this many bytes per parity.
constexpr int kLaunchMaxCtas = 128;     // the flag arrays' size: MKERNEL_LAUNCH_CTAS's upper bound
constexpr int kLaunchDefaultCtas = 32;  // MKERNEL_LAUNCH_CTAS's default (params.def)
constexpr int kLaunchThreads = 256;
// launchDirectKernel's threads per CTA (MKERNEL_DIRECT_KERNEL=own): direct mode's large ops, whose
// rate is the loads a CTA keeps in flight (docs/KERNEL.md, "The direct-mode kernel").
constexpr int kDirectThreads = 512;
// KernelParams::ownKernels (host only): the launch-path ops that take a kernel of their own.
constexpr uint32_t kOwnKernelLl = 1;
constexpr uint32_t kOwnKernelDirect = 2;
constexpr uint64_t kLaunchInboxBytes = 1024 * 1024;
// The launch path's LL mode (launch_path.h, "LL"): each rank pushes its data into its peers' line
// slots, 16-byte lines of 8 payload bytes and the op's flag twice. A parity's kLlSpaceLines lines
// are split evenly among the communicator's n source ranks (llSlotLines): what one exchange (an
// op, or an LL batch of ops) carries from one source to one destination, 2 MiB with 2 ranks. One
// op carries at most llMaxPayload(n) bytes, a quarter of that (kLlOpSpaceLines): 32 KiB with 16
// ranks, 256 KiB with 2 (the space is sized for batches of ops of 128 KiB).
constexpr uint64_t kLlLineBytes = 16;
constexpr uint64_t kLlLinePayload = 8;
constexpr uint64_t kLlSpaceLines = 262144;   // per parity: 4 MiB of lines, 2 MiB of payload
constexpr uint64_t kLlOpSpaceLines = 65536;  // what one op's limit is computed from

// Doorbell values. The caller's stream writes Posted and waits until the value is >= Done (only
// Done is): the same values on every call, so a captured graph replays correctly (docs/KERNEL.md).
// The next use's Posted overwrites Done; Free is the initial value (and what the opt-in gate
// kernel writes back).
enum DoorbellState : uint32_t {
  kDoorbellFree = 0,
  kDoorbellPosted = 1,
  kDoorbellRunning = 2,  // the kernel took it (so that the leader does not take it twice)
  kDoorbellDone = 3,
};

// One collective. Counts are NCCL's (per-rank block for AllGather / ReduceScatter).
struct alignas(16) WorkDesc {
  int32_t coll;   // CollType
  int32_t dtype;  // DataType
  int32_t algo;   // Algo (collectives/algo/algo.h)
  int32_t root;
  uint64_t count;
  uint64_t sendbuff;
  uint64_t recvbuff;
  int32_t nCtas;          // CTAs that take part (the same on every rank: a function of count/dtype)
  int32_t hierLanes;      // hierarchical AllReduce in CTA roles (MKERNEL_HIER_ROLES): its lanes; 0
                          // otherwise
  uint64_t scalarDevPtr;  // PreMulSum scalar as a device pointer to one element (0: redOp's)
  DevRedOp redOp;         // makeDevRedOp() (collectives/algo/reduce_host.h): NCCL's device op
};
static_assert(sizeof(WorkDesc) == 96, "WorkDesc is read by the kernel with 16-byte loads");

struct alignas(16) WorkSlot {
  WorkDesc ops[kMaxOpsPerSlot];
  uint32_t nOps;
  uint32_t ctasNeeded;  // max nCtas over ops: the CTAs that report completion of this slot
  uint32_t eager;       // 1: counted in HostControl::eagerEnqueued (idle-exit handshake)
  uint32_t reserved;
};
static_assert(sizeof(WorkSlot) == kMaxOpsPerSlot * sizeof(WorkDesc) + 16, "WorkSlot layout");

// A 128-byte line per CTA so that peers polling one CTA's flag do not share lines with another.
struct alignas(128) CtaFlag {
  uint64_t epoch;  // barriers this CTA has arrived at (monotonic over the communicator's life)
  uint64_t pad[15];
};
static_assert(sizeof(CtaFlag) == 128, "CtaFlag layout");

// What this rank's CTA c works on in the current collective, read by peers' CTA c after the
// first barrier of the op: a source (the user's sendbuff, or staging for in-place one-shot) and
// the user's recvbuff.
struct alignas(128) CtaMailbox {
  uint64_t src;
  uint64_t dst;
  uint64_t pad[14];
};
static_assert(sizeof(CtaMailbox) == 128, "CtaMailbox layout");

// One namespace of the launch path (launch_path.h): CTA c of launch-path op e stores e into
// arrive[c] once its part of the inputs is in inbox[e & 1]; peers' CTA c poll it. Direct ops
// (thread ranks, above the inbox threshold) publish CTA c's buffers in mailbox[c] before arrive[c],
// and store e into end[c] once done (peers read our buffers until then).
struct LaunchSpace {
  CtaFlag arrive[kLaunchMaxCtas];
  CtaMailbox mailbox[kLaunchMaxCtas];
  CtaFlag end[kLaunchMaxCtas];
  alignas(128) char inbox[2][kLaunchInboxBytes];
};
constexpr int kLaunchEager = 0;
constexpr int kLaunchGraph = 1;

// One LL line: two 8-byte halves, each 4 payload bytes and the op's flag (a 16-byte store is not
// guaranteed to land at once over NVLink; an aligned 8-byte half is, as NCCL's LL protocol relies
// on). The receiver zeroes each line it consumed, so a line holds 0 or the current op's flag.
struct alignas(16) LlLine {
  uint32_t lo, flagLo, hi, flagHi;
};
static_assert(sizeof(LlLine) == kLlLineBytes, "LlLine layout");

// One namespace of the LL mode: lines[parity][source] is written by `source` (a peer's push) and
// read by this rank; token[parity][source] likewise, one line per op from every peer (CTA 0):
// the per-op dependency that makes parity reuse safe even for ops where this rank receives no
// data from that peer (Broadcast, Reduce).
struct LlSpace {
  LlLine lines[2]
              [kLlSpaceLines];  // source k's slot: [k * llSlotLines(n), (k + 1) * llSlotLines(n))
  LlLine token[2][kMaxRanks];
};

// DeviceState::hierBusy's entries (CollStats::hierBusyNs).
enum HierBusy : int {
  kBusyCopy = 0,     // copies within device memory (the node's staging regions, the buffers)
  kBusyCopyNet = 1,  // copies from or into the CTA's net buffers (host-mapped unless GPUDirect)
  kBusyReduce = 2,
  kBusyReduceNet = 3,
  kBusyPost = 4,  // the rail's posts: commands written into the proxy's ring
  kHierBusyKinds = 5
};

struct alignas(128) DeviceState {
  uint32_t doorbell[kMaxSlots];  // stream memops write here; the leader CTA polls
  CtaFlag arrive[kMaxCtas];      // peers poll
  CtaMailbox mailbox[kMaxCtas];  // peers read
  // Kernel-private, kept in device memory so that a relaunched kernel continues where the last
  // one stopped (epochs must keep matching the peers').
  uint64_t ctaEpoch[kMaxCtas];
  uint64_t ctaConsumed[kMaxCtas];  // dispatch entries each CTA has consumed
  uint64_t ctaChunk[kMaxCtas];     // staged chunks each CTA has run (process ranks: region parity)
  uint64_t proxySends[kMaxHierCtas][kHierNetSlots];  // hierarchical path: sends / receives each CTA
  uint64_t proxyRecvs[kMaxHierCtas][kHierNetSlots];  // posted to its proxy channel, per net slot
                                                     // (the counters are monotonic)
  // ... and what it knows of its channel's ring (proxy::ProxyProducer: commands posted, the
  // proxy's tail as last read), so that a post reads no host memory while the ring has room.
  uint64_t proxyHead[kMaxHierCtas];
  uint64_t proxyTailSeen[kMaxHierCtas];
  // CTA roles (MKERNEL_HIER_ROLES, collectives/algo/hier_staged.h): per CTA, the chunks and the
  // collectives its lane ran in roles (the bases of the lane's counters).
  uint64_t ctaRole[kMaxCtas][2];
  uint32_t dispatchSlot[kDispatchDepth];
  uint64_t dispatchSeq;     // entries the leader has published
  uint64_t completedSeq;    // entries fully completed (all needed CTAs reported)
  uint32_t slotCtaDone;     // CTAs done with the in-flight slot
  uint32_t leaderCursor;    // next slot index the leader scans from
  uint64_t eagerCompleted;  // mirror of HostControl::eagerCompleted (device copy: no PCIe read)
  uint64_t opsDone[8];      // mirror of HostControl::opsDone
  // Device-memory mirror of "stop waiting": set by any CTA that records a failure and by the
  // leader when it sees the host's abort flag, so that spin-waits poll L2, not host memory.
  alignas(128) uint32_t stop;
  // The leader copies each dispatched slot here from host-mapped memory (one PCIe round trip per
  // group); the worker CTAs read their copy from device memory.
  alignas(128) WorkSlot dispatched[kDispatchDepth];
  // The launch path's flags and inboxes, twice: launch[kLaunchEager] for eager launches, whose
  // sequence number e comes from the host, and launch[kLaunchGraph] for launches captured into
  // CUDA graphs, whose sequence number the device keeps (graphSeq below: a replay cannot take one
  // from the host). The two never share a flag or a byte, so the two sequences stay independent.
  LaunchSpace launch[2];
  LlSpace ll[2];  // the LL mode's lines, per namespace as launch[] (2 x 2 MiB)
  // Captured launches: the sequence number of the last one that ran on this rank, how many CTAs
  // of the one running have finished (the last to finish advances graphSeq: by then every CTA of
  // it has read the old value), and how many of each CollType ran (mirrored into HostControl).
  alignas(128) uint64_t graphSeq;
  uint32_t graphCtasDone;
  uint64_t graphOps[8];
  // An LL batch's barrier between waves over its CTAs (launchLlBatchKernel): arrivals in the
  // running launch, and CTAs that left it (the last resets both: the next launch starts at 0).
  alignas(128) uint32_t batchArrive;
  uint32_t batchLeft;
  // The launch path's eager completions: the last op index of each CollType whose kernel ran to
  // its end (CTA 0). In device memory, as graphOps: a launch-path kernel writes no host memory in
  // the steady state (a posted write into host memory held each op's end back by several
  // microseconds on the H200 host, docs/KERNEL.md); the host reads both by a copy when it needs
  // them (statistics, finalize, the launch watch).
  alignas(128) uint64_t launchDone[8];
  // The hierarchical AllReduce in turn (MKERNEL_HIER_OVERLAP=0), CTA 0's phase times
  // (collectives/algo/hier_staged.h, "Phase times"): chunks timed, and their node-phase and
  // rail-phase nanoseconds (%globaltimer); hierMark is the running chunk's last mark.
  alignas(128) uint64_t hierTurn[3];
  uint64_t hierMark;
  // CTA 0's waits in every hierarchical collective, pipelined or in turn (nanoseconds, thread 0's
  // %globaltimer around them): for its rail transfers (proxy completion flags), at its node
  // barriers, and (CTA roles, where CTA 0 is lane 0's sender) for the workers' and reducers'
  // counters. What the pipeline leaves exposed (docs/PERFORMANCE.md).
  uint64_t hierWait[3];
  // ... and where CTA 0's own work goes, in every hierarchical collective (the same timing):
  // copies, copies from or into its net buffers, reductions, reductions from or into its net
  // buffers, and its posts to the proxy (HierBusy).
  uint64_t hierBusy[kHierBusyKinds];
  // CTA roles: each lane's counters (HierRoleCounter) and the targets its sender published for
  // its reduce-scatter steps (0) and its chunks' last all-gather steps (1) on net slots 0 and 1
  // (the channel's sends, receives).
  struct alignas(128) HierRoleLane {
    uint64_t counter[24];  // kHierRoleCounters (20) used
    uint64_t target[2][2][2];
  } hierRole[kMaxHierCtas];
};

// Kinds of wait that can time out (ErrorRecord::what).
enum WaitKind : uint32_t {
  kWaitNone = 0,
  kWaitPeerStart = 1,   // first barrier: the peer has not reached this collective
  kWaitPeerEnd = 2,     // last barrier: the peer has not finished this collective
  kWaitDispatch = 3,    // a worker CTA waiting for the leader
  kWaitSlotDone = 4,    // the leader waiting for worker CTAs to finish a slot
  kWaitPeerChunk = 6,   // staged (process ranks): the peer has not staged a later chunk
  kWaitProxy = 7,       // hierarchical: the proxy did not complete this rank's inter-node transfers
  kWaitLaunchPeer = 8,  // launch path: the peer has not published its inputs of this collective
  kWaitLaunchPeerEnd = 9,  // direct launch path: the peer has not finished reading our buffers
  kWaitHierRole = 10,      // hierarchical AllReduce in CTA roles: another CTA of this rank's lane
};

// Per-group timestamps of CTA 0, recorded when MKERNEL_KERNEL_TRACE=1 into a device ring of
// kTraceDepth records indexed by dispatch sequence: where a collective's time goes
// (mkernel-collbench --trace prints the medians of the intervals). Each stamp twice: %globaltimer
// (ns, comparable across kernels, but it advances in steps of about 1 us on an H200) and the SM's
// clock64 (cycles, only comparable within one CTA's kernel: the stages inside it).
enum TracePoint : int {
  kTraceSeen = 0,          // the leader found the Posted doorbell
  kTraceLoaded = 1,        // CTA 0 has the group's descriptors
  kTraceStartBarrier = 2,  // first collective of the group: start barrier passed
  kTraceMoved = 3,         // ... its data moved
  kTraceEndBarrier = 4,    // ... end barrier passed
  kTraceReported = 5,      // CTA 0 reported the group done (Done written if it was the last CTA)
  kTracePoints = 6,
};
struct KernelTraceRecord {
  uint64_t seq;              // dispatch sequence + 1 (0: never written)
  uint64_t t[kTracePoints];  // %globaltimer, ns
  uint64_t c[kTracePoints];  // clock64 of CTA 0's SM, cycles
};
constexpr int kTraceDepth = 4096;

struct alignas(16) ErrorRecord {
  uint32_t what;  // WaitKind; 0 = no error
  int32_t rank;
  int32_t peer;
  int32_t cta;
  int32_t coll;
  uint32_t observed;  // low 32 bits of what the awaited word read when the wait gave up (a peer's
                      // flag: the last barrier or launch-path op it reached)
  uint64_t epoch;     // the value waited for
};
static_assert(sizeof(ErrorRecord) == 32, "ErrorRecord layout");

// A CTA's wait for another CTA of the same rank (the leader for its workers' slot, a worker for
// the leader's dispatch, a lane in CTA roles for its sender, workers or reducers): it only
// follows from a wait elsewhere, for a peer or for the proxy.
inline bool internalWait(uint32_t what) {
  return what == kWaitDispatch || what == kWaitSlotDone || what == kWaitHierRole;
}

// Which of n per-CTA records the communicator reports (KernelCommunicator::kernelError): the
// first whose wait names a cause (a peer, the proxy), else the first internal one; -1 when none
// is set. `what` is read through a volatile load: the kernel writes the records into host memory.
inline int reportedErrorRecord(const ErrorRecord* errors, int n) {
  int internal = -1;
  for (int c = 0; c < n; ++c) {
    const uint32_t w = *reinterpret_cast<const volatile uint32_t*>(&errors[c].what);
    if (w == kWaitNone) continue;
    if (!internalWait(w)) return c;
    if (internal < 0) internal = c;
  }
  return internal;
}

enum KernelState : uint32_t {
  kKernelStopped = 0,
  kKernelRunning = 1,
  kKernelExiting = 2,  // idle exit in progress (Dekker handshake with the host, docs/KERNEL.md)
};

struct alignas(64) HostControl {
  // host -> kernel
  volatile uint32_t abortFlag;  // stop every wait now (Communicator::abort)
  volatile uint32_t quit;       // exit once idle (finalize / destroy)
  volatile uint32_t resident;   // captured into a graph: never exit on idleness
  uint32_t pad0;
  volatile uint64_t eagerEnqueued;  // eager slots the host has enqueued (may not be posted yet)
  // kernel -> host
  volatile uint32_t kernelState;     // KernelState
  volatile uint32_t failed;          // 1 once any CTA recorded an error (the kernel drains)
  volatile uint64_t eagerCompleted;  // eager slots completed (or drained)
  volatile uint64_t opsDone[8];      // collectives completed, by CollType
  ErrorRecord errors[kMaxCtas];      // one per CTA: no atomics needed on host memory
  volatile uint32_t testStalled;     // MKERNEL_TEST_STALL_BARRIER: 1 once a CTA stopped on purpose
  volatile uint64_t launchStarted;  // launch path: the epoch of the last watched eager op whose CTA
                                    // 0 started (MKERNEL_LAUNCH_WATCH: the first op, or every op)
};

}  // namespace coll
}  // namespace mkernel
