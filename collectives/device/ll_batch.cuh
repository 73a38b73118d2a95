// A group's consecutive LL collectives as one launch (launchLlBatchKernel, MKERNEL_LL_BATCH).
#pragma once

#include "collectives/device/launch_kernels.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// The barrier between an LL batch's waves over every CTA of its grid. The batch's CTAs are
// resident together (at most launchCap_ of them, which agreeLaunchCap bounds by what the SMs hold
// with every co-located rank's), so a CTA may wait for the others, as grid.sync() does: each
// CTA's writes, then its arrival (thread 0: fence, add), then a wait for every CTA's arrival at
// this barrier (`target`: gridDim.x per barrier so far). ok: the CTA's answer so far (the same in
// every thread). Returns the CTA's answer; false also when the communicator stopped.
__device__ __noinline__ bool llGridBarrier(const KernelParams& p, uint32_t target, bool ok) {
  __shared__ int passed;
  ok = __syncthreads_and(ok) != 0;  // this CTA's writes of the wave done
  if (gridDim.x == 1) return ok;
  if (threadIdx.x == 0) {
    __threadfence();  // the CTA's writes (observed through the barrier) before its arrival
    atomicAdd(&p.self->batchArrive, 1u);
    int good = 1;
    for (uint32_t iter = 1; loadAcquireGpu32(&p.self->batchArrive) < target; ++iter)
      if ((iter & 255) == 0 && stopRequested(p)) {
        good = 0;
        break;
      }
    passed = good;
  }
  __syncthreads();
  return ok && passed != 0;
}

// MKERNEL_LL_BATCH=exchange: the batch's ops as one LL exchange (launch_path.h, "LL batches"):
// number e, one flag, one token per peer for the whole batch; op i's lines start at line
// b.lineBase[i] of each slot, after the earlier ops'. The ops run in waves (llPlanWaves, this
// rank's host): the ops of a wave at the same time, op i on warps [warpFirst[i], + warpCount[i])
// of the grid (push, then receive), a barrier over the grid's CTAs between waves (llGridBarrier),
// so that a later op's reads and writes of this rank's memory come after an earlier op's that
// they overlap. ok: the CTA's common answer so far. Returns the CTA's.
__device__ __forceinline__ bool llBatchExchange(const KernelParams& p, const LlBatch& b, uint64_t e,
                                                int ns, uint64_t traceSeq, bool ok, bool eager) {
  const int n = p.nRanks, r = p.rank;
  const int tid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x), warp = tid / 32;
  const uint32_t flag = llFlag(e);
  // Phase 0, the batch's token: this rank has started exchange e (so it has finished e - 1).
  if (ok && tid < n && tid != r)
    llPut(&p.peers[tid]->ll[ns].token[static_cast<int>(e & 1)][r], 0, flag);
  uint32_t barriers = 0;
  for (int first = 0; first < b.nOps;) {
    int end = first + 1;
    while (end < b.nOps && !((b.waveMask >> end) & 1u)) ++end;
    int mine = -1;
    for (int i = first; i < end; ++i)
      if (warp >= b.warpFirst[i] && warp < b.warpFirst[i] + b.warpCount[i]) mine = i;
    if (ok && mine >= 0) {
      LlArgs a = llArgs(p, b.ops[mine], e, ns, /*wholeOp=*/true);
      a.lineBase = b.lineBase[mine];
      a.tid = static_cast<uint32_t>(tid - 32 * b.warpFirst[mine]);
      a.nthr = 32u * b.warpCount[mine];
      llPush(p, b.ops[mine], a, false, false);
      if (first == 0) {  // (thread 0's op of the first wave pushed; no set-up follows)
        traceAt(p, blockIdx.x, traceSeq, kTraceLoaded);
        traceAt(p, blockIdx.x, traceSeq, kTraceStartBarrier);
      }
      ok = llReceive(p, b.ops[mine], a);
    }
    if (end < b.nOps)
      ok = llGridBarrier(p, ++barriers * gridDim.x, ok);  // this wave's reads and writes done
    first = end;
  }
  traceAt(p, blockIdx.x, traceSeq, kTraceMoved);  // (every wave received)
  if (ok) ok = llTokens(p, llArgs(p, b.ops[0], e, ns, /*wholeOp=*/true), b.ops[0].coll);
  ok = __syncthreads_and(ok) != 0;
  traceAt(p, blockIdx.x, traceSeq, kTraceEndBarrier);
  if (ok && eager && tid == 0)
    for (int i = 0; i < b.nOps; ++i)
      *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[b.ops[i].coll]) = b.opIndex[i];
  // The barrier's counters back to 0 for the next launch: by the last CTA to leave (every CTA has
  // then passed every barrier of this one).
  if (barriers > 0 && gridDim.x > 1 && threadIdx.x == 0 &&
      atomicAddAcquireGpu(&p.self->batchLeft, 1u) + 1 == gridDim.x) {
    p.self->batchArrive = 0;
    p.self->batchLeft = 0;
  }
  return ok;
}

// MKERNEL_LL_BATCH=serial: op i is number e0 + i, each its own exchange, after op i - 1 ended.
__device__ __forceinline__ void llBatchSerial(const KernelParams& p, const LlBatch& b, uint64_t e0,
                                              int ns, bool ok, bool eager) {
  for (int i = 0; i < b.nOps && ok; ++i) {
    const uint64_t e = e0 + static_cast<uint64_t>(i);
    const uint64_t traceSeq =
        eager ? b.epoch + static_cast<uint64_t>(i) - 1 : kNoTrace;  // the host's number
    traceAt(p, 0, traceSeq, kTraceSeen);
    const LlArgs a = llArgs(p, b.ops[i], e, ns);
    llPush(p, b.ops[i], a, false);
    traceAt(p, 0, traceSeq, kTraceLoaded);
    traceAt(p, 0, traceSeq, kTraceStartBarrier);
    ok = llFinish(p, b.ops[i], a, traceSeq);
    traceAt(p, 0, traceSeq, kTraceEndBarrier);
    if (ok && eager && threadIdx.x == 0)
      *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[b.ops[i].coll]) = b.opIndex[i];
    traceAt(p, 0, traceSeq, kTraceReported);
  }
}

// A group's run of LL ops in one launch (launch_path.h, "LL batches"). MKERNEL_LL_BATCH=serial
// (b.exchange 0; one CTA): op i is the communicator's launch-path op e0 + i, run after op i - 1
// has ended (its receives and its peers' tokens), which is what the LL protocol needs between
// consecutive ops of one rank. exchange (b.exchange 1): llBatchExchange, one number for the
// batch, over the grid's CTAs. Only LL code: no shared state, no other mode.
__global__ void __launch_bounds__(kLaunchThreads, 1)
    launchLlBatchKernel(const __grid_constant__ KernelParams p, const __grid_constant__ LlBatch b) {
  if (p.warmup) return;  // warmKernels
  pdlEnter(p);
  const bool captured = b.epoch == 0;
  const bool graph = captured || p.deviceNumbers != 0;  // numbered by the device (launchKernel)
  const int ns = graph ? kLaunchGraph : kLaunchEager;
  // Captured: graphSeq is the same for every thread during this launch (launchKernel). Thread 0
  // of each CTA reads it with acquire, which keeps the epilogue's counter after its read (below).
  const uint64_t e0 = !graph ? b.epoch
                             : (threadIdx.x == 0 ? loadAcquireGpu(&p.self->graphSeq)
                                                 : loadVolatile64(&p.self->graphSeq)) +
                                   1;
  const uint64_t eLast = e0 + (b.exchange ? 0 : static_cast<uint64_t>(b.nOps) - 1);
  // The launch watch (launchKernel's): the batch's last host number, which the host watches.
  if (!captured && blockIdx.x == 0 && threadIdx.x == 0 &&
      (p.launchWatch == 2 || (p.launchWatch == 1 && b.epoch == 1)))
    p.ctl->launchStarted = b.epoch + (b.exchange ? 0 : static_cast<uint64_t>(b.nOps) - 1);
  // One answer for the CTA (the exchange's waves meet at barriers every thread reaches).
  bool ok = __syncthreads_or(stopRequested(p)) == 0;
  if (b.exchange) {
    const uint64_t traceSeq = captured ? kNoTrace : b.epoch - 1;
    traceAt(p, blockIdx.x, traceSeq, kTraceSeen);
    ok = llBatchExchange(p, b, e0, ns, traceSeq, ok, !captured);
    traceAt(p, blockIdx.x, traceSeq, kTraceReported);
  } else {
    llBatchSerial(p, b, e0, ns, ok, !captured);
  }
  if (!graph || threadIdx.x != 0) return;
  // The graph epilogue (launchKernel's, for every op of the batch, run or failed, as there): the
  // batch's last number, stored by the last CTA to finish. Every thread read graphSeq before the
  // last barrier it passed (a stopped batch uses no number); thread 0's acquire read keeps its
  // CTA's add on the counter after it, and the last CTA's acquire add keeps the store after
  // every other CTA's add. One CTA needs no counter.
  if (!p.graphEpilogueLight) __threadfence();
  if (gridDim.x > 1 && atomicAddAcquireGpu(&p.self->graphCtasDone, 1u) + 1 != gridDim.x) return;
  if (gridDim.x > 1) p.self->graphCtasDone = 0;
  if (captured)
    for (int i = 0; i < b.nOps; ++i) p.self->graphOps[b.ops[i].coll] += 1;
  if (!p.graphEpilogueLight) __threadfence();
  *reinterpret_cast<volatile uint64_t*>(&p.self->graphSeq) = eLast;
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
