// The launch path's direct mode: one small collective per launch on the caller's stream,
// ranks reading each other's buffers (collectives/route/launch_path.h, "Direct mode").
#pragma once

#include "collectives/device/persistent.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// ---- the launch path: one small collective per launch, on the caller's stream ------------------
//
// collectives/route/launch_path.h describes the protocol (one flag per CTA, double-buffered inbox).
// Bounded like the persistent kernel's waits: a peer that never publishes is recorded
// (kWaitLaunchPeer) after MKERNEL_TIMEOUT_S, and abort or an earlier failure ends the wait.

// Sets up sh.plan for one copy or reduction (thread 0), then the whole CTA runs it.
__device__ void launchMove(SharedState& sh, const WorkDesc& d, bool reduce, const char* const* srcs,
                           int nSrc, char* dst, uint64_t elems, uint64_t esz) {
  if (elems == 0) return;
  if (threadIdx.x == 0) {
    bool al = aligned16(reinterpret_cast<uint64_t>(dst));
    for (int k = 0; k < nSrc; ++k) {
      sh.plan.src[k] = srcs[k];
      al = al && aligned16(reinterpret_cast<uint64_t>(srcs[k]));
    }
    sh.plan.dst[0] = dst;
    sh.plan.nSrc = nSrc;
    sh.plan.nDst = 1;
    sh.plan.count = reduce ? elems : elems * esz;
    sh.plan.aligned = al;
  }
  __syncthreads();
  if (reduce) {
    reduceDispatch(sh.plan, d);
  } else {
    copyBytes(sh.plan);
  }
  __syncthreads();
}

// Direct mode (thread ranks: every rank's buffers are addressable): CTA c publishes its op's
// buffers in launchMailbox[c] before storing launchArrive[c] = e, then runs the persistent
// kernel's direct algorithm (planCollective) over the peers' buffers, and stores launchEnd[c] = e
// and waits for every peer's launchEnd[c] >= e: until then peers may still read our input or write
// our output. The mailbox of op e is overwritten only at a later op, which starts after this
// rank's op e passed the end flags, i.e. after every peer's CTA c finished op e.
__device__ bool launchDirect(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta,
                             uint64_t epoch, int ns) {
  const int n = p.nRanks, r = p.rank;
  if (threadIdx.x == 0) {
    CtaMailbox* mb = &p.self->launch[ns].mailbox[cta];
    mb->src = d.sendbuff;
    mb->dst = d.recvbuff;
    __threadfence_system();
    storeRelease(&p.self->launch[ns].arrive[cta].epoch, epoch);
  }
  const int peer = static_cast<int>(threadIdx.x);
  bool ok = true;
  if (peer < n && peer != r)
    ok = waitGeq(p, &sh.peers[peer]->launch[ns].arrive[cta].epoch, epoch, cta, peer,
                 kWaitLaunchPeer, d.coll);
  if (!__syncthreads_and(ok)) return false;
  if (peer < n) {
    const CtaMailbox* mb = &sh.peers[peer]->launch[ns].mailbox[cta];
    sh.peerSrc[peer] = __ldcg(&mb->src);
    sh.peerDst[peer] = __ldcg(&mb->dst);
  }
  __syncthreads();
  if (threadIdx.x == 0) sh.stop = planCollective(p, sh, d, cta) ? 0 : 1;
  __syncthreads();
  const CollType coll = static_cast<CollType>(d.coll);
  if (!sh.stop) {
    if (coll == CollType::Broadcast || coll == CollType::AllGather) {
      if (threadIdx.x == 0) sh.plan.count *= elemSize(d.dtype);  // copyBytes counts bytes
      __syncthreads();
      copyBytes(sh.plan);
    } else {
      reduceDispatch(sh.plan, d);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // our remote stores (TwoShot, Broadcast, Reduce) before the flag
    storeRelease(&p.self->launch[ns].end[cta].epoch, epoch);
  }
  ok = true;
  if (peer < n && peer != r)
    ok = waitGeq(p, &sh.peers[peer]->launch[ns].end[cta].epoch, epoch, cta, peer,
                 kWaitLaunchPeerEnd, d.coll);
  return __syncthreads_and(ok) != 0;
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
