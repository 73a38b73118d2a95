#include "collectives/peer_memory.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "collectives/sm_budget.h"
#include "common/log.h"
#include "transport/bootstrap/bootstrap.h"

namespace mkernel {
namespace coll {
namespace {

struct RankInfo {
  uint64_t hostHash;
  uint64_t statePtr;
  int32_t pid;
  int32_t cudaDev;
  int32_t wantCtas;
  int32_t smCount;
};


bool sameGpu(const RankInfo& a, const RankInfo& b) {
  return a.hostHash == b.hostHash && a.pid == b.pid && a.cudaDev == b.cudaDev;
}

}  // namespace

Result exchangePeers(bootstrap::Bootstrap* bs, int rank, int nRanks, int cudaDev,
                     DeviceState* local, int wantCtas, int smCount, bool emulate, PeerSetup* out) {
  std::vector<RankInfo> info(static_cast<size_t>(nRanks));
  RankInfo& me = info[static_cast<size_t>(rank)];
  me.hostHash = bootstrap::Bootstrap::hostHash();
  me.statePtr = reinterpret_cast<uint64_t>(local);
  me.pid = static_cast<int32_t>(getpid());
  me.cudaDev = cudaDev;
  me.wantCtas = wantCtas;
  me.smCount = smCount;
  MK_CHECK(bs->allGather(info.data(), sizeof(RankInfo)));

  int agreed = kMaxCtas;
  for (int r = 0; r < nRanks; ++r) {
    const RankInfo& ri = info[static_cast<size_t>(r)];
    if (ri.hostHash != me.hostHash || ri.pid != me.pid)
      return MK_ERROR(Result::InvalidUsage,
                      "rank %d: rank %d is another process (pid %d%s); the persistent kernel "
                      "supports ranks that are threads of one process only",
                      rank, r, ri.pid, ri.hostHash != me.hostHash ? " on another host" : "");
    int sharing = 0;
    for (int q = 0; q < nRanks; ++q) sharing += sameGpu(info[static_cast<size_t>(q)], ri) ? 1 : 0;
    if (sharing > 1 && !emulate) {
      for (int q = 0; q < nRanks; ++q)
        if (q != r && sameGpu(info[static_cast<size_t>(q)], ri))
          return MK_ERROR(Result::InvalidUsage,
                          "rank %d and rank %d both use GPU %d (duplicate GPU); set "
                          "MKERNEL_EMULATE=1 to run several ranks on one GPU",
                          r, q, ri.cudaDev);
    }
    // smCount is what the rank's GPU has left for this communicator (SmBudget: the SMs, less
    // the few kept free for callers' own kernels, less what this process's other communicators
    // hold there); the ranks sharing it split it.
    int fit = ri.smCount / sharing;
    if (fit < 1)
      return MK_ERROR(Result::InvalidUsage,
                      "%d rank(s) of this communicator use GPU %d, which has %d SMs left for persistent "
                      "kernels (after %d kept free and those of this process's other communicators): "
                      "their kernels (at least one CTA each, all resident at once) cannot fit; "
                      "destroy a communicator or lower MKERNEL_CTAS",
                      sharing, ri.cudaDev, ri.smCount, kReservedSms);
    agreed = std::min(agreed, std::min(ri.wantCtas, fit));
    if (r == rank) out->ranksOnMyDevice = sharing;
  }
  out->nCtas = std::max(1, agreed);

  for (int r = 0; r < nRanks; ++r) {
    const RankInfo& ri = info[static_cast<size_t>(r)];
    out->peers[r] = reinterpret_cast<DeviceState*>(ri.statePtr);
    if (ri.cudaDev == cudaDev) continue;
    int can = 0;
    cudaError_t err = cudaDeviceCanAccessPeer(&can, cudaDev, ri.cudaDev);
    if (err != cudaSuccess || !can)
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: GPU %d cannot access GPU %d of rank %d (%s)",
                      rank, cudaDev, ri.cudaDev, r, err != cudaSuccess ? cudaGetErrorString(err) : "no P2P");
    err = cudaDeviceEnablePeerAccess(ri.cudaDev, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else if (err != cudaSuccess) {
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: enabling peer access GPU %d -> %d failed: %s",
                      rank, cudaDev, ri.cudaDev, cudaGetErrorString(err));
    }
  }
  MK_INFO(kLogInit, "rank %d: %d peers exchanged, %d CTAs per kernel, %d ranks on GPU %d", rank,
          nRanks, out->nCtas, out->ranksOnMyDevice, cudaDev);
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
