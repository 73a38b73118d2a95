// Bounded waits and cross-rank barriers of the persistent kernel.
//
// Every spin-wait polls the host-mapped abort / failed flags and gives up after
// MKERNEL_TIMEOUT_S (measured with %globaltimer, nanoseconds, so that the bound does not depend
// on the SM clock the way clock64() does); on timeout it records {rank, peer, CTA, what} in the
// CTA's own ErrorRecord in host memory and raises HostControl::failed. It never traps: a trap
// would destroy the CUDA context of the whole process (every other rank and the user's work).
#pragma once

#include <cstdint>

#include "collectives/device/launch.h"
#include "collectives/algo/work.h"

namespace mkernel {
namespace coll {
namespace dev {

__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// System scope: peers may be other GPUs of this process, and the host reads some of these words.
__device__ __forceinline__ uint64_t loadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// GPU scope: words only this GPU's kernels use (the launch path's graph numbering).
__device__ __forceinline__ uint64_t loadAcquireGpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t loadAcquireGpu32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t atomicAddAcquireGpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acquire.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}
__device__ __forceinline__ void storeRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint32_t loadVolatile(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}
__device__ __forceinline__ uint64_t loadVolatile64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}

// Hot-path check: device memory only (DeviceState::stop, set on any failure and by the leader
// once it has seen the host's abort flag).
__device__ __forceinline__ bool stopRequested(const KernelParams& p) {
  return loadVolatile(&p.self->stop) != 0;
}

// Cold-path check of the host-mapped flags (a PCIe round trip): the host's abort, or a failure
// another CTA recorded. Mirrors the answer into DeviceState::stop.
__device__ inline bool hostStopRequested(const KernelParams& p) {
  if (p.ctl->abortFlag != 0 || p.ctl->failed != 0) {
    *reinterpret_cast<volatile uint32_t*>(&p.self->stop) = 1;
    return true;
  }
  return false;
}

__device__ inline void recordError(const KernelParams& p, int cta, int peer, WaitKind what,
                                   int coll, uint64_t epoch, uint64_t observed = 0) {
  volatile ErrorRecord* e = &p.ctl->errors[cta];
  e->rank = p.rank;
  e->peer = peer;
  e->cta = cta;
  e->coll = coll;
  e->observed = static_cast<uint32_t>(observed);
  e->epoch = epoch;
  __threadfence_system();
  e->what = what;
  __threadfence_system();
  p.ctl->failed = 1;
  *reinterpret_cast<volatile uint32_t*>(&p.self->stop) = 1;
  __threadfence_system();
}

// Waits of a CTA for another CTA of the same rank (the leader for its workers' slot, a role for
// its lane's sender, workers or reducers) only follow from a wait elsewhere: for a peer or for the
// proxy. They get this many times MKERNEL_TIMEOUT_S, so that the wait naming the cause times out
// first and is what the communicator reports (kernelError; the first record stops every CTA, and
// a CTA that sees the stop records nothing).
constexpr uint64_t kInternalWaitFactor = 2;

// Single-thread wait for *addr >= target. False on abort, on another CTA's failure, or on timeout
// (then recorded): after timeoutNs, or MKERNEL_TIMEOUT_S when 0.
__device__ inline bool waitGeq(const KernelParams& p, const uint64_t* addr, uint64_t target,
                               int cta, int peer, WaitKind what, int coll, uint64_t timeoutNs = 0) {
  const uint64_t limit = timeoutNs != 0 ? timeoutNs : p.timeoutNs;
  uint64_t start = 0;
  for (uint32_t iter = 1;; ++iter) {
    if (loadAcquire(addr) >= target) return true;
    if ((iter & 255) == 0) {
      if (stopRequested(p)) return false;
      if ((iter & 8191) == 0 && hostStopRequested(p)) return false;  // the host's abort
      uint64_t now = globalTimerNs();
      if (start == 0) {
        start = now;
      } else if (now - start > limit) {
        recordError(p, cta, peer, what, coll, target, loadAcquire(addr));
        return false;
      }
      if (iter > (1u << 16)) __nanosleep(500);  // long waits: stop hammering the peer's line
    }
  }
}

// Barrier of CTA `cta` of every rank (all threads of the CTA call it). Writes of this CTA before
// the barrier are visible to every peer's CTA `cta` after it. False if the wait failed.
// Only ranks first .. first + count - 1 are waited for (a node's ranks, for the hierarchical
// path's node barriers); every rank still counts every barrier, so epochs stay equal everywhere.
__device__ inline bool ctaBarrier(const KernelParams& p, DeviceState* const* peers, int cta,
                                  uint64_t* epoch, WaitKind what, int coll, int first = 0,
                                  int count = -1) {
  __syncthreads();
  const uint64_t e = ++*epoch;
  if (threadIdx.x == 0) {
    __threadfence_system();  // cumulativity: the other threads' writes are ordered by bar.sync
    storeRelease(&p.self->arrive[cta].epoch, e);
  }
  bool ok = true;
  const int peer = first + static_cast<int>(threadIdx.x);
  const int end = count < 0 ? p.nRanks : first + count;
  if (peer < end && peer != p.rank)
    ok = waitGeq(p, &peers[peer]->arrive[cta].epoch, e, cta, peer, what, coll);
  return __syncthreads_and(ok) != 0;
}

// The same barrier with two ranks only, `a` and `b` (a ring's neighbours,
// collectives/algo/staged_ring.h): this CTA's writes before it are visible to theirs after it.
// Every rank still counts it, so epochs stay equal everywhere and a later barrier of every rank
// works as before.
__device__ inline bool ctaBarrierPair(const KernelParams& p, DeviceState* const* peers, int cta,
                                      uint64_t* epoch, WaitKind what, int coll, int a, int b) {
  __syncthreads();
  const uint64_t e = ++*epoch;
  if (threadIdx.x == 0) {
    __threadfence_system();
    storeRelease(&p.self->arrive[cta].epoch, e);
  }
  bool ok = true;
  const int peer = threadIdx.x == 0 ? a : threadIdx.x == 1 && b != a ? b : -1;
  if (peer >= 0 && peer != p.rank)
    ok = waitGeq(p, &peers[peer]->arrive[cta].epoch, e, cta, peer, what, coll);
  return __syncthreads_and(ok) != 0;
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
