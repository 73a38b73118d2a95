// The launch path's kernels: one collective per launch (launchKernel, launchDirectKernel,
// launchLlKernel), with programmatic dependent launch and the CUDA-graph epilogue.
#pragma once

#include "collectives/device/ll.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// One launch-path collective, this CTA's share (the kernel below adds the captured launches'
// sequence numbers around it). ns: the namespace of flags and inboxes (kLaunchEager/kLaunchGraph).
// False when the communicator had failed or a wait failed.
// kDirectOnly: launchDirectKernel's instance, direct mode only (n > 1: launchDirect_ needs peers).
template <bool kDirectOnly>
__device__ __forceinline__ bool launchRun(const KernelParams& p, SharedState& sh, const WorkDesc& d,
                                          uint64_t epoch, int ns, int mode, uint64_t traceSeq) {
  const bool direct = mode == kLaunchModeDirect;
  const int cta = blockIdx.x;
  const int n = p.nRanks, r = p.rank;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const bool reduce =
      coll == CollType::AllReduce || coll == CollType::ReduceScatter || coll == CollType::Reduce;
  if (sh.stop) return false;
  if (kDirectOnly) return launchDirect(p, sh, d, cta, epoch, ns);
  if (mode == kLaunchModeLl && n > 1) return launchLl(p, d, epoch, ns, traceSeq);
  if (direct && n > 1) return launchDirect(p, sh, d, cta, epoch, ns);
  const LaunchPart lp = launchPart(coll, d.count, n, r, d.root, gridDim.x, cta, esz);
  const char* send = reinterpret_cast<const char*>(d.sendbuff);
  char* recv = reinterpret_cast<char*>(d.recvbuff);
  const char* srcs[kMaxRanks];
  if (n == 1) {
    // Nothing to wait for: the op's own copy or reduction (pre/post ops included) in place.
    srcs[0] = send + lp.part.offset * esz;
    launchMove(sh, d, reduce, srcs, 1, recv + lp.part.offset * esz, lp.part.count, esz);
  } else {
    const int parity = static_cast<int>(epoch & 1);
    char* inbox = p.self->launch[ns].inbox[parity];
    for (int b = 0; b < lp.publishBlocks; ++b) {
      const uint64_t off = static_cast<uint64_t>(b) * d.count + lp.part.offset;
      srcs[0] = send + off * esz;
      launchMove(sh, d, false, srcs, 1, inbox + off * esz, lp.part.count, esz);
    }
    // Arrive (the CTA's inbox writes are ordered before thread 0's release by bar.sync), then
    // wait for every peer's CTA of the same index.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      storeRelease(&p.self->launch[ns].arrive[cta].epoch, epoch);
    }
    bool ok = true;
    const int peer = static_cast<int>(threadIdx.x);
    if (peer < n && peer != r)
      ok = waitGeq(p, &sh.peers[peer]->launch[ns].arrive[cta].epoch, epoch, cta, peer,
                   kWaitLaunchPeer, d.coll);
    if (!__syncthreads_and(ok)) return false;
    if (lp.compute && lp.part.count > 0) {
      if (coll == CollType::AllGather) {
        for (int k = 0; k < n; ++k) {
          srcs[0] = sh.peers[k]->launch[ns].inbox[parity] + lp.readOffset * esz;
          launchMove(sh, d, false, srcs, 1,
                     recv + (static_cast<uint64_t>(k) * d.count + lp.part.offset) * esz,
                     lp.part.count, esz);
        }
      } else if (coll == CollType::Broadcast) {
        srcs[0] = sh.peers[d.root]->launch[ns].inbox[parity] + lp.readOffset * esz;
        launchMove(sh, d, false, srcs, 1, recv + lp.part.offset * esz, lp.part.count, esz);
      } else {
        for (int k = 0; k < n; ++k)
          srcs[k] = sh.peers[k]->launch[ns].inbox[parity] + lp.readOffset * esz;
        launchMove(sh, d, true, srcs, n, recv + lp.part.offset * esz, lp.part.count, esz);
      }
    }
  }
  return true;
}

// MKERNEL_PDL (launchPath): a launch-path kernel launched with programmatic stream serialization
// may start before the work ahead of it on the stream (the previous collective's kernel, or the
// application's) has completed; griddepcontrol.wait returns once that work has completed and its
// memory is visible, so it comes before anything the kernel reads: after it, the kernel sees
// what a plain launch would see at its start (every comment below that says "this launch started
// after that one ended" holds). pdl 2 then lets the stream's next programmatic launch (our next
// collective) become resident at once, to wait in its own pdlEnter instead of being launched
// after this kernel ends: what it saves is the launch latency between consecutive collectives.
// A kernel launched without the attribute passes griddepcontrol.wait at once.
__device__ __forceinline__ void pdlEnter(const KernelParams& p) {
#if __CUDA_ARCH__ >= 900
  if (p.pdl != 0) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p.pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
}

// The launch-path kernels' trace record and first stamp (MKERNEL_KERNEL_TRACE): eager ops, record
// epoch - 1; with MKERNEL_KERNEL_TRACE=2 or 3 captured ops instead, record their graph number - 1,
// which CTA 0's thread 0 reads here (its start stamp taken before that read). kNoTrace otherwise.
__device__ __forceinline__ uint64_t launchTraceBegin(const KernelParams& p, bool graph,
                                                     uint64_t epoch) {
  if (p.trace == nullptr || (p.traceGraph != 0) != graph) return kNoTrace;
  if (!graph) {
    traceAt(p, blockIdx.x, epoch - 1, kTraceSeen);
    return epoch - 1;
  }
  if (blockIdx.x != 0 || threadIdx.x != 0) return kNoTrace;
  const uint64_t t0 = globalTimerNs(), c0 = clock64();
  const uint64_t seq = loadVolatile64(&p.self->graphSeq);
  KernelTraceRecord* r = &p.trace[seq % kTraceDepth];
  r->t[kTraceSeen] = t0;
  r->c[kTraceSeen] = c0;
  r->seq = seq + 1;
  return seq;
}

// A captured launch-path op's numbering at its end (thread 0 of each CTA, after every thread of its
// CTA has read graphSeq): the last CTA to finish counts the op in graphOps and stores its number e.
// MKERNEL_GRAPH_EPILOGUE=light: the only order the numbering needs within this launch is that every
// CTA read graphSeq before the last CTA stores the new value. fenceFirst: the CTA read it with a
// plain load, and a fence keeps that read before its add (several CTAs); otherwise it was an
// acquire load, which does. The last CTA's acquire add keeps its store after every other CTA's add.
// The next launch sees the stores without fences: it starts after this kernel has completed (stream
// order, or an event across streams). One CTA (every LL op up to 8 KiB) needs no counter at all:
// its store follows the reads of the same word. fenced: two __threadfence and a plain atomic.
// captured: the op counts in graphOps (an eager op numbered by the device counts in launchDone).
__device__ __forceinline__ void graphEpilogue(const KernelParams& p, int coll, uint64_t e,
                                              bool fenceFirst, bool captured) {
  if (p.graphEpilogueLight) {
    if (gridDim.x > 1 && fenceFirst) __threadfence();
    if (gridDim.x == 1 || atomicAddAcquireGpu(&p.self->graphCtasDone, 1u) + 1 == gridDim.x) {
      if (gridDim.x > 1) p.self->graphCtasDone = 0;
      if (captured) p.self->graphOps[coll] += 1;
      *reinterpret_cast<volatile uint64_t*>(&p.self->graphSeq) = e;
    }
    return;
  }
  __threadfence();
  if (atomicAdd(&p.self->graphCtasDone, 1u) + 1 == gridDim.x) {
    p.self->graphCtasDone = 0;
    if (captured) p.self->graphOps[coll] += 1;
    __threadfence();
    *reinterpret_cast<volatile uint64_t*>(&p.self->graphSeq) = e;
  }
}

// epoch 0: a launch captured into a CUDA graph. Its sequence number is graphSeq + 1, read by each
// CTA at its start; the last CTA to finish stores it back (by then every CTA of this launch has
// read the old value, and the next launch of this communicator starts after this one ended:
// stream order, launch_path.h). Its flags and inbox are the graph namespace's.
// p and d are __grid_constant__: the callees take them by reference, and a plain kernel parameter
// whose address is taken is first copied to local memory (27-47 local stores at every op,
// measured); a grid constant's address is its place in the constant bank.
// The body of launchKernel and of launchDirectKernel (kDirectOnly: mode is kLaunchModeDirect).
template <bool kDirectOnly>
__device__ __forceinline__ void launchBody(const KernelParams& p, const WorkDesc& d, uint64_t epoch,
                                           uint64_t opIndex, int mode, SharedState& sh) {
  if (p.warmup) return;  // warmKernels
  pdlEnter(p);
  // captured: no host number (epoch 0). graph: numbered by the device, in the graph namespace
  // (captured ops, and eager ones with p.deviceNumbers; launch_path.h, "One numbering").
  const bool captured = epoch == 0;
  const bool graph = captured || p.deviceNumbers != 0;
  // MKERNEL_KERNEL_TRACE, eager ops (record epoch - 1): start, set up, [LL: pushed, received],
  // collective done, reported (collbench --trace; docs/KERNEL.md, "Kernel trace").
  const uint64_t traceSeq = launchTraceBegin(p, captured, epoch);
  // Every thread reads the stop flag and (captured) the sequence number itself, so that an LL op
  // can push before the CTA's first barrier (llPush); plain volatile loads, which the input's
  // loads need not wait for. graphSeq holds the same value for every thread of every CTA during
  // this launch: only the previous launch wrote it, this one started after that one ended, and
  // this one's last CTA stores the next value only after every CTA passed its end barrier.
  const bool stop = stopRequested(p);  // a failed communicator: release the stream
  if (!kDirectOnly && mode == kLaunchModeLl && p.nRanks > 1) {
    const uint64_t e0 = !graph ? epoch : loadVolatile64(&p.self->graphSeq) + 1;
    llPush(p, d, llArgs(p, d, e0, graph ? kLaunchGraph : kLaunchEager), stop);
  }
  traceAt(p, blockIdx.x, traceSeq, kTraceLoaded);  // (LL: this thread's pushes issued)
  if (threadIdx.x == 0) {
    sh.stop = stop ? 1 : 0;
    // The value the epilogue numbers this launch with: with the light epilogue an acquire load,
    // which keeps this CTA's atomicAdd on graphCtasDone after it (launchKernel's end).
    sh.epoch = !graph ? epoch
                      : (p.graphEpilogueLight ? loadAcquireGpu(&p.self->graphSeq)
                                              : loadVolatile64(&p.self->graphSeq)) +
                            1;
    // The launch watch (MKERNEL_LAUNCH_WATCH), for the watched ops only: a posted store into host
    // memory, whose flush would hold back the kernel's end at every op.
    if (!captured && blockIdx.x == 0 && (p.launchWatch == 2 || (p.launchWatch == 1 && epoch == 1)))
      p.ctl->launchStarted = epoch;
  }
  if (threadIdx.x < kMaxRanks)
    sh.peers[threadIdx.x] = threadIdx.x < p.nRanks ? p.peers[threadIdx.x] : nullptr;
  __syncthreads();
  const uint64_t e = sh.epoch;
  traceAt(p, blockIdx.x, traceSeq, kTraceStartBarrier);  // (set up)
  const bool ran =
      launchRun<kDirectOnly>(p, sh, d, e, graph ? kLaunchGraph : kLaunchEager, mode, traceSeq);
  traceAt(p, blockIdx.x, traceSeq, kTraceEndBarrier);
  // Statistics and finalize of eager ops: device memory (the host copies it when it needs it).
  if (!captured && ran && blockIdx.x == 0 && threadIdx.x == 0)
    *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[d.coll]) = opIndex;
  if (!graph) {
    traceAt(p, blockIdx.x, traceSeq, kTraceReported);
    return;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // (light: thread 0 read graphSeq with acquire, above)
  graphEpilogue(p, d.coll, e, /*fenceFirst=*/false, captured);
  traceAt(p, blockIdx.x, traceSeq, kTraceReported);
}

__global__ void __launch_bounds__(kLaunchThreads, 1)
    launchKernel(const __grid_constant__ KernelParams p, const __grid_constant__ WorkDesc d,
                 uint64_t epoch, uint64_t opIndex, int mode) {
  __shared__ SharedState sh;
  launchBody<false>(p, d, epoch, opIndex, mode, sh);
}

// MKERNEL_DIRECT_KERNEL=own (the default): a direct-mode op (the large collectives of
// thread ranks, launch_path.h) in a kernel of its own with kDirectThreads threads per CTA, twice
// launchKernel's: direct mode moves whole buffers, and a CTA's loads in flight are what its rate
// is bound by (reduceCopy, copyBytes: kUnroll 16-byte vectors per thread and source). launchKernel
// carries the LL and inbox modes too, whose registers (152 per thread) allow 256 threads per SM.
// The same protocol, flags, mailboxes and numbering as launchKernel's direct mode.
__global__ void __launch_bounds__(kDirectThreads, 1)
    launchDirectKernel(const __grid_constant__ KernelParams p, const __grid_constant__ WorkDesc d,
                       uint64_t epoch, uint64_t opIndex) {
  __shared__ SharedState sh;
  launchBody<true>(p, d, epoch, opIndex, kLaunchModeDirect, sh);
}

// MKERNEL_LL_KERNEL=own (the default): a launch-path LL op in a kernel of its own,
// without launchKernel's frame (the shared state, the peers' table copied into it, the mode
// dispatch, a second llArgs): the token and pushes first, one barrier that agrees on the stop flag,
// the receive and the tokens (llFinish), the numbering. The same protocol, slots, flags and
// numbers as launchKernel's LL mode (the two may follow each other on a communicator).
// launchKernel's LL op takes 5.0-5.2 us from start to end on one H200 with two emulated
// ranks, where a bare kernel doing the same exchange takes under 1 us (mkernel-latbench exch-ll,
// docs/PERFORMANCE.md).
__global__ void __launch_bounds__(kLaunchThreads, 1)
    launchLlKernel(const __grid_constant__ KernelParams p, const __grid_constant__ WorkDesc d,
                   uint64_t epoch, uint64_t opIndex) {
  if (p.warmup) return;  // warmKernels
  pdlEnter(p);
  const bool captured = epoch == 0;
  const bool graph = captured || p.deviceNumbers != 0;  // (launchBody)
  const int ns = graph ? kLaunchGraph : kLaunchEager;
  // The trace as launchKernel's (eager ops, or captured ones with MKERNEL_KERNEL_TRACE=2 or 3).
  const uint64_t traceSeq = launchTraceBegin(p, captured, epoch);
  // Captured: the number graphSeq + 1, the same for every thread of every CTA (launchKernel). A
  // plain volatile load, so that the input's loads (llPush) need not wait for it as they would for
  // an acquire; the epilogue's counter (several CTAs) has a fence before it instead.
  const bool stop = stopRequested(p);
  const uint64_t e = !graph ? epoch : loadVolatile64(&p.self->graphSeq) + 1;
  LlArgs a = llArgs(p, d, e, ns, /*wholeOp=*/gridDim.x == 1);
  // At most a line per thread (up to 2 KiB per source with 256 threads): the loops without
  // kLlBatch's unrolling, a quarter of the code to run (with them an 8-byte op spends most of
  // its time between consecutive stamps of a few instructions, the code the CTA's SM has to fetch).
  const bool tiny = a.range.count <= a.nthr;
  if (tiny)
    llPush<1>(p, d, a, stop);
  else
    llPush(p, d, a, stop);
  // MKERNEL_KERNEL_TRACE=3: the receive's own stamps (llReduceLines, llTakeBatch) instead of the
  // stages'; only seen and reported stay.
  const uint64_t stageSeq = p.traceGraph == 2 ? kNoTrace : traceSeq;
  if (p.traceGraph == 2) a.detailSeq = traceSeq;
  traceAt(p, blockIdx.x, stageSeq, kTraceLoaded);  // (this thread's pushes issued)
  if (!captured && blockIdx.x == 0 && threadIdx.x == 0 &&
      (p.launchWatch == 2 || (p.launchWatch == 1 && epoch == 1)))
    p.ctl->launchStarted = epoch;
  // One answer for the CTA: a thread that saw the stop flag pushed nothing.
  bool ok = __syncthreads_or(stop) == 0;
  traceAt(p, blockIdx.x, stageSeq, kTraceStartBarrier);
  if (ok) ok = tiny ? llFinish<1>(p, d, a, stageSeq) : llFinish(p, d, a, stageSeq);
  traceAt(p, blockIdx.x, stageSeq, kTraceEndBarrier);
  if (!captured && ok && blockIdx.x == 0 && threadIdx.x == 0)
    *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[d.coll]) = opIndex;
  if (!graph) {
    traceAt(p, blockIdx.x, traceSeq, kTraceReported);
    return;
  }
  // launchKernel's graph epilogue, after every thread's last use of e (llFinish's barrier; a
  // stopped CTA passed the barrier above).
  if (threadIdx.x != 0) return;
  graphEpilogue(p, d.coll, e, /*fenceFirst=*/true,
                captured);  // (graphSeq read with a plain load, above)
  traceAt(p, blockIdx.x, traceSeq, kTraceReported);
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
