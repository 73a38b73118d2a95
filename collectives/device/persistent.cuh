// The persistent mKernel (docs/KERNEL.md).
//
// CTA 0's first warp is the leader: it scans the doorbells, takes a Posted slot (-> Running) and
// publishes it in the dispatch queue; every CTA (the leader's too) consumes the queue in order,
// runs its part of each collective of the slot, and the last CTA to finish marks the doorbell
// Done, which releases the caller's stream (cuStreamWaitValue32). One slot is in flight at a time,
// so every rank's CTA c sees the same sequence of collectives and cross-rank barriers of CTA c
// (per-CTA epochs) match without any grid-wide barrier.
//
// Collectives move data directly between the ranks' user buffers (thread ranks of one process
// address each other's device memory): each rank's CTA c publishes its {src, dst} pointers in a
// mailbox, a first barrier makes them (and the inputs) ready, the CTA moves its share, and a
// second barrier keeps every rank's buffers untouched by peers once its stream moves on.
#pragma once

#include "collectives/device/hier.cuh"

namespace mkernel {
namespace coll {
namespace dev {

__device__ bool runCollective(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta,
                              uint64_t* epoch, uint64_t traceSeq, uint64_t* chunkSeq) {
  if (cta >= d.nCtas) return true;
  if (p.nNodes > 1) return runHier(p, sh, d, cta, epoch, chunkSeq);
  if (p.staged) return runStaged(p, sh, d, cta, epoch, chunkSeq);
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  // In-place one-shot AllReduce: peers read our input while we overwrite it, so they read a copy
  // in staging instead (each CTA copies the part it will also read back: the same split).
  const bool staged = coll == CollType::AllReduce && static_cast<Algo>(d.algo) == Algo::OneShot &&
                      d.sendbuff == d.recvbuff;
  if (staged) {
    if (threadIdx.x == 0) {
      Slice part = rankSlice(d.count, d.nCtas, cta, sliceAlignElems(esz));
      sh.plan.src[0] = reinterpret_cast<const char*>(d.sendbuff + part.offset * esz);
      sh.plan.dst[0] =
          reinterpret_cast<char*>(reinterpret_cast<uint64_t>(p.staging) + part.offset * esz);
      sh.plan.nSrc = sh.plan.nDst = 1;
      sh.plan.count = part.count * esz;
      sh.plan.aligned = aligned16(d.sendbuff) && aligned16(reinterpret_cast<uint64_t>(p.staging));
    }
    __syncthreads();
    moveCopy(sh.plan);
  }
  if (threadIdx.x == 0) {
    CtaMailbox* mb = &p.self->mailbox[cta];
    mb->src = staged ? reinterpret_cast<uint64_t>(p.staging) : d.sendbuff;
    mb->dst = d.recvbuff;
  }
  if (!ctaBarrier(p, sh.peers, cta, epoch, kWaitPeerStart, d.coll)) return false;
  traceAt(p, cta, traceSeq, kTraceStartBarrier);
  if (threadIdx.x < p.nRanks) {
    const CtaMailbox* mb = &sh.peers[threadIdx.x]->mailbox[cta];
    sh.peerSrc[threadIdx.x] = __ldcg(&mb->src);
    sh.peerDst[threadIdx.x] = __ldcg(&mb->dst);
  }
  __syncthreads();
  if (threadIdx.x == 0) sh.stop = planCollective(p, sh, d, cta) ? 0 : 1;
  __syncthreads();
  if (!sh.stop) {
    if (coll == CollType::Broadcast || coll == CollType::AllGather) {
      if (threadIdx.x == 0) sh.plan.count *= esz;  // copyBytes counts bytes
      __syncthreads();
      moveCopy(sh.plan);
    } else {
      moveReduce(sh.plan, d);
    }
  }
  if (p.trace != nullptr) __syncthreads();  // the whole CTA's share moved (uniform condition)
  traceAt(p, cta, traceSeq, kTraceMoved);
  const bool ok = ctaBarrier(p, sh.peers, cta, epoch, kWaitPeerEnd, d.coll);
  traceAt(p, cta, traceSeq, kTraceEndBarrier);
  return ok;
}

// ---- leader
// ---------------------------------------------------------------------------------------

// Marks every Posted/Running slot Done without running it: after an abort or a failure, so that
// callers' streams never hang on a dead communicator. Counts drained eager slots.
__device__ void drainDoorbells(const KernelParams& p) {
  for (int s = 0; s < kMaxSlots; ++s) {
    volatile uint32_t* db = &p.self->doorbell[s];
    uint32_t v = *db;
    if (v == kDoorbellPosted || v == kDoorbellRunning) {
      if (p.slots[s].eager) {
        p.self->eagerCompleted += 1;
        p.ctl->eagerCompleted = p.self->eagerCompleted;
      }
      __threadfence_system();
      *db = kDoorbellDone;
    }
  }
  __threadfence_system();
}

// After a failure or abort the leader thread stays to drain doorbells until the host says quit
// (or, when nothing was captured, until no eager work is outstanding for the idle time).
__device__ void leaderDrain(const KernelParams& p) {
  uint64_t idleSince = globalTimerNs();
  while (true) {
    drainDoorbells(p);
    if (p.ctl->quit) return;
    const bool pending = p.ctl->eagerEnqueued != p.self->eagerCompleted;
    if (pending || p.ctl->resident) idleSince = globalTimerNs();
    if (globalTimerNs() - idleSince > p.idleExitNs) return;
    __nanosleep(2000);
  }
}

// Warp 0 of CTA 0: waits for the slot in flight to complete, then finds the next Posted slot and
// publishes it (or kDispatchExit). Returns false when the kernel must drain instead.
__device__ bool leaderDispatch(const KernelParams& p, SharedState& sh) {
  DeviceState* self = p.self;
  const int lane = threadIdx.x & 31;
  const uint64_t seq = loadVolatile64(&self->dispatchSeq);
  bool ok = true;
  if (lane == 0)
    ok = waitGeq(p, &self->completedSeq, seq, 0, p.rank, kWaitSlotDone, -1,
                 kInternalWaitFactor * p.timeoutNs);
  if (!__all_sync(0xffffffffu, ok)) return false;
  uint64_t idleSince = globalTimerNs();
  uint32_t cursor = self->leaderCursor;
  bool backoff = false;
  for (uint32_t iter = 1;; ++iter) {
    if (backoff) __nanosleep(1000);  // idle > 100 us: poll every few microseconds
    // Ballot over all doorbells: word j, bit l = slot 32 j + l is Posted.
    uint32_t posted[kMaxSlots / 32];
#pragma unroll
    for (int j = 0; j < kMaxSlots / 32; ++j)
      posted[j] = __ballot_sync(0xffffffffu,
                                loadVolatile(&self->doorbell[32 * j + lane]) == kDoorbellPosted);
    int found = -1;
    for (int k = 0; k < kMaxSlots && found < 0; ++k) {  // first Posted slot from the cursor on
      int s = (cursor + k) % kMaxSlots;
      if ((posted[s / 32] >> (s % 32)) & 1u) found = s;
    }
    if (found >= 0) {
      // Copy the slot's descriptors from host-mapped memory into device memory: one PCIe round
      // trip (two 16-byte loads per lane) instead of one per CTA.
      constexpr int kSlotVecs = sizeof(WorkSlot) / 16;
      const uint4* from = reinterpret_cast<const uint4*>(&p.slots[found]);
      uint4* to = reinterpret_cast<uint4*>(&self->dispatched[seq % kDispatchDepth]);
      for (int v = lane; v < kSlotVecs; v += 32) __stcg(to + v, __ldcv(from + v));
      __threadfence();
      __syncwarp();
      if (lane == 0) {
        traceAt(p, 0, seq, kTraceSeen);
        self->doorbell[found] = kDoorbellRunning;
        self->dispatchSlot[seq % kDispatchDepth] = static_cast<uint32_t>(found);
        self->leaderCursor = static_cast<uint32_t>(found + 1) % kMaxSlots;
        __threadfence();
        *reinterpret_cast<volatile uint64_t*>(&self->dispatchSeq) = seq + 1;
      }
      __syncwarp();
      return true;
    }
    if ((iter & 63) == 0) {
      if (stopRequested(p) || hostStopRequested(p)) return false;
      const uint64_t now = globalTimerNs();
      const bool idleLong = now - idleSince > p.idleExitNs;
      if ((idleLong && !p.ctl->resident) || p.ctl->quit) {
        // Dekker handshake with the host's enqueue (docs/KERNEL.md): announce Exiting, then look
        // for work the host enqueued meanwhile; the host, after counting its work, looks at the
        // state. At least one of the two sees the other.
        bool exitNow = false;
        if (lane == 0) {
          p.ctl->kernelState = kKernelExiting;
          __threadfence_system();
          exitNow =
              p.ctl->eagerEnqueued == self->eagerCompleted && (p.ctl->quit || !p.ctl->resident);
          if (!exitNow) {
            p.ctl->kernelState = kKernelRunning;
          } else {
            self->dispatchSlot[seq % kDispatchDepth] = kDispatchExit;
            self->completedSeq = seq + 1;
            __threadfence();
            *reinterpret_cast<volatile uint64_t*>(&self->dispatchSeq) = seq + 1;
          }
        }
        if (__shfl_sync(0xffffffffu, exitNow, 0)) return true;
        idleSince = now;
      }
      backoff = now - idleSince > 100000;
    }
  }
}

// ---- the kernel -------------------------------------------------------------------------------

__global__ void __launch_bounds__(kKernelThreads, 1) persistentKernel(KernelParams p) {
  __shared__ SharedState sh;
  if (p.warmup) return;  // warmKernels
  const int cta = blockIdx.x;
  DeviceState* self = p.self;
  if (threadIdx.x < kMaxRanks)
    sh.peers[threadIdx.x] = threadIdx.x < p.nRanks ? p.peers[threadIdx.x] : nullptr;
  uint64_t consumed = self->ctaConsumed[cta];
  uint64_t epoch = self->ctaEpoch[cta];
  uint64_t chunkSeq = self->ctaChunk[cta];
  if (cta == 0 && threadIdx.x == 0) p.ctl->kernelState = kKernelRunning;
  __syncthreads();
  bool failed = false;
  while (true) {
    if (cta == 0 && threadIdx.x < 32) {
      bool ok = leaderDispatch(p, sh);
      if (threadIdx.x == 0) sh.stop = ok ? 0 : 1;
    }
    if (threadIdx.x == 0) {
      if (cta != 0) sh.stop = 0;
      // Wait for the next dispatch entry. Idle waiting is legitimate: no timeout, but abort and
      // failure end it.
      for (uint32_t iter = 1; !sh.stop && loadVolatile64(&self->dispatchSeq) <= consumed; ++iter) {
        if ((iter & 255) == 0 && stopRequested(p)) sh.stop = 1;
        if (iter > (1u << 14)) __nanosleep(1000);
      }
      if (!sh.stop) {
        sh.slotIndex = loadVolatile(&self->dispatchSlot[consumed % kDispatchDepth]);
        __threadfence();  // acquire: the leader's copy of the slot is read after its dispatchSeq
      }
    }
    __syncthreads();
    if (sh.stop) {
      failed = true;
      break;
    }
    ++consumed;
    if (sh.slotIndex == kDispatchExit) break;
    // Load the slot's descriptors: the leader's copy in device memory (L2), all at once.
    constexpr int kSlotVecs = sizeof(WorkSlot) / 16;
    if (threadIdx.x < kSlotVecs)
      reinterpret_cast<uint4*>(&sh.slot)[threadIdx.x] = __ldcg(
          reinterpret_cast<const uint4*>(&self->dispatched[(consumed - 1) % kDispatchDepth]) +
          threadIdx.x);
    __syncthreads();
    traceAt(p, cta, consumed - 1, kTraceLoaded);
    if (cta >= static_cast<int>(sh.slot.ctasNeeded)) continue;
    bool ok = true;
    for (uint32_t i = 0; i < sh.slot.nOps && ok; ++i)
      ok = runCollective(p, sh, sh.slot.ops[i], cta, &epoch, i == 0 ? consumed - 1 : kNoTrace,
                         &chunkSeq);
    if (!ok) {
      failed = true;
      break;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      if (atomicAdd(&self->slotCtaDone, 1u) + 1 == sh.slot.ctasNeeded) {
        self->slotCtaDone = 0;
        // Host-mapped counters: stores only (a read-modify-write would cost PCIe round trips).
        for (uint32_t i = 0; i < sh.slot.nOps; ++i) {
          const int c = sh.slot.ops[i].coll;
          p.ctl->opsDone[c] = ++self->opsDone[c];
        }
        if (sh.slot.eager) {
          self->eagerCompleted += 1;
          p.ctl->eagerCompleted = self->eagerCompleted;
        }
        __threadfence_system();
        *reinterpret_cast<volatile uint32_t*>(&self->doorbell[sh.slotIndex]) = kDoorbellDone;
        __threadfence();
        *reinterpret_cast<volatile uint64_t*>(&self->completedSeq) = consumed;
      }
      traceAt(p, cta, consumed - 1, kTraceReported);
    }
  }
  if (threadIdx.x == 0) {
    self->ctaConsumed[cta] = consumed;
    self->ctaEpoch[cta] = epoch;
    self->ctaChunk[cta] = chunkSeq;
  }
  if (failed && cta == 0 && threadIdx.x == 0) {
    // The failure is recorded (or the host aborted): keep callers' streams moving until quit.
    leaderDrain(p);
    p.ctl->kernelState = kKernelExiting;
  }
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
