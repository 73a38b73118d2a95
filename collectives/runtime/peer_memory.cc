#include "collectives/runtime/peer_memory.h"

#include <cuda_runtime_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "vendor/cuda_driver.h"
#include "collectives/algo/hier_staged.h"
#include "collectives/algo/hierarchical.h"
#include "collectives/route/launch_path.h"
#include "collectives/runtime/mem_cache.h"
#include "collectives/runtime/sm_budget.h"
#include "collectives/algo/staged.h"
#include "collectives/algo/staged_ring.h"
#include "common/log.h"
#include "common/param.h"
#include "topology/placement.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/ipc/fd_exchange.h"

namespace mkernel {
namespace coll {
namespace {

struct RankInfo {
  uint64_t hostHash;
  int32_t pid;
  int32_t cudaDev;
  int32_t wantCtas;
  int32_t smCount;
  int32_t sharedCtas;  // MKERNEL_SHARED_CTAS: -1 auto, 0 off, N
  int32_t reserved;
  char busId[32];  // cudaDeviceGetPCIBusId: the same GPU in every process, whatever its index there
};

// Second round, once the CTA count (hence the staging size) is agreed.
struct RankMemory {
  uint64_t statePtr;    // as this rank's process addresses it
  uint64_t stagingPtr;  // staged only
  cudaIpcMemHandle_t state;
  cudaIpcMemHandle_t staging;
};

bool sameGpu(const RankInfo& a, const RankInfo& b) {
  return a.hostHash == b.hostHash && std::strncmp(a.busId, b.busId, sizeof(a.busId)) == 0;
}

bool sameProcess(const RankInfo& a, const RankInfo& b) {
  return a.hostHash == b.hostHash && a.pid == b.pid;
}

// CUDA MPS runs kernels of several processes on one GPU at the same time; without it, persistent
// kernels of two processes on one GPU take turns and their barriers never meet.
bool mpsLikely() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  struct stat st;
  return stat(dir != nullptr && *dir ? dir : "/tmp/nvidia-mps", &st) == 0;
}

Result enablePeerAccess(int rank, int cudaDev, int peerRank, int peerDev) {
  int can = 0;
  cudaError_t err = cudaDeviceCanAccessPeer(&can, cudaDev, peerDev);
  if (err != cudaSuccess || !can)
    return MK_ERROR(Result::UnhandledCudaError,
                    "rank %d: GPU %d cannot access GPU %d of rank %d (%s)", rank, cudaDev, peerDev,
                    peerRank, err != cudaSuccess ? cudaGetErrorString(err) : "no P2P");
  err = cudaDeviceEnablePeerAccess(peerDev, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else if (err != cudaSuccess) {
    return MK_ERROR(Result::UnhandledCudaError,
                    "rank %d: enabling peer access GPU %d -> %d failed: %s", rank, cudaDev, peerDev,
                    cudaGetErrorString(err));
  }
  return Result::Success;
}

// What each rank tells the others of its cuMem blocks (MKERNEL_PEER_IPC=cumem).
struct VmmInfo {
  int32_t ok;        // allocated and exported
  int32_t asked;     // MKERNEL_PEER_IPC=cumem here (else legacy: ok is 0)
  int32_t importOk;  // second round: mapped every peer's blocks
  int32_t pad;
  uint64_t statePtr;  // as this rank's process addresses them (for ranks of the same process)
  uint64_t stagingPtr;
  uint64_t stateBytes;  // the mappings' sizes (granularity-rounded), which importers map
  uint64_t stagingBytes;
};

// Undoes a cuMem attempt: the imports, then the own blocks; `out` is as before it.
void dropVmm(PeerSetup* out) {
  for (int r = 0; r < kMaxRanks; ++r) {
    if (!out->opened[r]) continue;
    if (out->peers[r] != nullptr) (void)cudrv::vmmUnmap(out->peers[r]);
    if (out->stagedBuf[r] != nullptr) (void)cudrv::vmmUnmap(out->stagedBuf[r]);
    out->opened[r] = false;
    out->peers[r] = nullptr;
    out->stagedBuf[r] = nullptr;
  }
  if (out->stagedLocal != nullptr) (void)cudrv::vmmFree(out->stagedLocal);
  if (out->vmmState != nullptr) (void)cudrv::vmmFree(out->vmmState);
  out->stagedLocal = nullptr;
  out->vmmState = nullptr;
  out->vmm = false;
}

// Process ranks over cuMem (MKERNEL_PEER_IPC=cumem): this rank's DeviceState and staging buffer
// become cuMem blocks shared by POSIX file descriptor (ipc::exchangeFds), and every rank of another
// process on this host maps them with cuMemImportFromShareableHandle. Collective, in two rounds,
// and every rank ends it the same way: *mapped true on every rank, or false on every rank with
// nothing left allocated (then the caller goes on with legacy CUDA IPC), or an error from the
// bootstrap itself. A rank that cannot allocate, export, pass or map says so in its round, and a
// WARN says why.
Result mapPeersVmm(bootstrap::Bootstrap* bs, int rank, int nRanks, int cudaDev,
                   const std::vector<RankInfo>& info, bool wanted, PeerSetup* out, bool* mapped) {
  *mapped = false;
  const RankInfo& me = info[static_cast<size_t>(rank)];
  std::vector<VmmInfo> vi(static_cast<size_t>(nRanks));
  VmmInfo& mine = vi[static_cast<size_t>(rank)];
  std::memset(&mine, 0, sizeof(mine));
  int fds[2] = {-1, -1};
  auto closeOwn = [&] {
    for (int& f : fds) {
      if (f >= 0) ::close(f);
      f = -1;
    }
  };
  std::string why;
  mine.asked = wanted ? 1 : 0;
  if (wanted) {
    void* state = nullptr;
    void* staging = nullptr;
    size_t stateBytes = 0, stagingBytes = 0;
    Result r = cudrv::vmmAlloc(&state, sizeof(DeviceState));
    if (r == Result::Success) out->vmmState = static_cast<DeviceState*>(state);
    if (r == Result::Success) r = cudrv::vmmAlloc(&staging, out->stagedBytes);
    if (r == Result::Success) out->stagedLocal = staging;
    if (r == Result::Success) {
      // Zeroed on the legacy stream, waited for alone (a device-wide wait would wait for running
      // kernels: docs/KERNEL.md, "A product risk").
      cudaError_t err = cudaMemset(state, 0, sizeof(DeviceState));
      if (err == cudaSuccess) err = cudaMemset(staging, 0, out->stagedBytes);
      if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
      if (err != cudaSuccess)
        r = MK_ERROR(Result::UnhandledCudaError, "cudaMemset: %s", cudaGetErrorString(err));
    }
    // Thread ranks of this process on other GPUs address these blocks directly: cuMem memory is
    // reachable from another GPU only through cuMemSetAccess (peer access does not cover it).
    for (int q = 0; q < nRanks && r == Result::Success; ++q) {
      const RankInfo& rq = info[static_cast<size_t>(q)];
      if (!sameProcess(rq, me) || rq.cudaDev == cudaDev) continue;
      r = cudrv::vmmGrantAccess(state, rq.cudaDev);
      if (r == Result::Success) r = cudrv::vmmGrantAccess(staging, rq.cudaDev);
    }
    if (r == Result::Success) r = cudrv::vmmExportFd(state, &fds[0], &stateBytes);
    if (r == Result::Success) r = cudrv::vmmExportFd(staging, &fds[1], &stagingBytes);
    if (r == Result::Success) {
      mine.ok = 1;
      mine.statePtr = reinterpret_cast<uint64_t>(state);
      mine.stagingPtr = reinterpret_cast<uint64_t>(staging);
      mine.stateBytes = stateBytes;
      mine.stagingBytes = stagingBytes;
    } else {
      why = lastError();
      closeOwn();
      dropVmm(out);
    }
  }
  MK_CHECK(bs->allGather(vi.data(), sizeof(VmmInfo)));
  int refuser = -1;
  for (int r = 0; r < nRanks && refuser < 0; ++r)
    if (!vi[static_cast<size_t>(r)].ok) refuser = r;
  if (refuser >= 0) {
    if (refuser == rank && wanted)
      MK_WARN(
          "rank %d: cuMem memory for process ranks failed (%s): every rank uses legacy CUDA IPC",
          rank, why.c_str());
    else
      MK_INFO(kLogInit, "rank %d: rank %d %s: legacy CUDA IPC between process ranks", rank, refuser,
              vi[static_cast<size_t>(refuser)].asked ? "could not share cuMem memory"
                                                     : "has MKERNEL_PEER_IPC=legacy");
    closeOwn();
    dropVmm(out);
    return Result::Success;
  }
  // Round two: the descriptors, to the ranks of other processes on this host.
  std::vector<char> want(static_cast<size_t>(nRanks), 0);
  for (int r = 0; r < nRanks; ++r) {
    const RankInfo& ri = info[static_cast<size_t>(r)];
    want[static_cast<size_t>(r)] = ri.hostHash == me.hostHash && !sameProcess(ri, me) ? 1 : 0;
  }
  std::vector<int> got;
  Result res = ipc::exchangeFds([&](void* d, size_t b) { return bs->allGather(d, b); }, rank,
                                nRanks, want, fds, 2, params::timeoutSeconds(), &got);
  closeOwn();
  if (res != Result::Success) why = lastError();
  for (int r = 0; r < nRanks && res == Result::Success; ++r) {
    const RankInfo& ri = info[static_cast<size_t>(r)];
    const VmmInfo& v = vi[static_cast<size_t>(r)];
    if (ri.hostHash != me.hostHash) continue;  // another host: reached through the proxies
    if (sameProcess(ri, me)) {
      out->peers[r] = reinterpret_cast<DeviceState*>(v.statePtr);
      out->stagedBuf[r] = reinterpret_cast<char*>(v.stagingPtr);
      if (ri.cudaDev != cudaDev) res = enablePeerAccess(rank, cudaDev, r, ri.cudaDev);
      if (res != Result::Success) why = lastError();
      continue;
    }
    void* state = nullptr;
    void* staging = nullptr;
    res = cudrv::vmmImportFd(got[static_cast<size_t>(2 * r)], static_cast<size_t>(v.stateBytes),
                             cudaDev, &state);
    if (res == Result::Success) {
      res = cudrv::vmmImportFd(got[static_cast<size_t>(2 * r + 1)],
                               static_cast<size_t>(v.stagingBytes), cudaDev, &staging);
      if (res != Result::Success) (void)cudrv::vmmUnmap(state);
    }
    if (res != Result::Success) {
      why = std::string("mapping the memory of rank ") + std::to_string(r) + " (pid " +
            std::to_string(ri.pid) + "): " + lastError();
      break;
    }
    out->peers[r] = static_cast<DeviceState*>(state);
    out->stagedBuf[r] = static_cast<char*>(staging);
    out->opened[r] = true;
  }
  for (int f : got)
    if (f >= 0) ::close(f);  // the mappings hold the memory
  out->vmm = true;           // for dropVmm: the opened entries are imports
  mine.importOk = res == Result::Success ? 1 : 0;
  MK_CHECK(bs->allGather(vi.data(), sizeof(VmmInfo)));
  for (int r = 0; r < nRanks; ++r) {
    if (vi[static_cast<size_t>(r)].importOk) continue;
    if (r == rank)
      MK_WARN("rank %d: %s: every rank uses legacy CUDA IPC", rank, why.c_str());
    else
      MK_INFO(kLogInit,
              "rank %d: rank %d could not map cuMem memory: legacy CUDA IPC between process ranks",
              rank, r);
    dropVmm(out);
    for (int q = 0; q < kMaxRanks;
         ++q) {  // same-process entries too: the legacy path sets them again
      out->peers[q] = nullptr;
      out->stagedBuf[q] = nullptr;
    }
    return Result::Success;
  }
  *mapped = true;
  return Result::Success;
}

Result mapPeers(bootstrap::Bootstrap* bs, int rank, int nRanks, int cudaDev, DeviceState* local,
                const std::vector<RankInfo>& info, uint64_t stagedChunkBytes, PeerSetup* out) {
  const RankInfo& me = info[static_cast<size_t>(rank)];
  // Handles only for peers in other processes (MKERNEL_STAGED=1 with thread ranks needs none).
  // The same on every rank: whether the communicator spans more than one process.
  const bool otherProcesses = !std::all_of(info.begin(), info.end(),
                                           [&](const RankInfo& ri) { return sameProcess(ri, me); });
  if (out->staged && otherProcesses) {
    out->stagedBytes = stagedBufferBytes(out->nCtas, stagedChunkBytes);
    bool mapped = false;
    MK_CHECK(
        mapPeersVmm(bs, rank, nRanks, cudaDev, info, params::PEER_IPC.is("cumem"), out, &mapped));
    if (mapped) return Result::Success;
  }
  if (out->staged) {
    out->stagedBytes = stagedBufferBytes(out->nCtas, stagedChunkBytes);
    cudaError_t err = MemCache::deviceAlloc(cudaDev, out->stagedBytes, &out->stagedLocal);
    if (err != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError,
                      "rank %d: cudaMalloc of the %llu-byte staging buffer failed: %s", rank,
                      static_cast<unsigned long long>(out->stagedBytes), cudaGetErrorString(err));
  }
  std::vector<RankMemory> mem(static_cast<size_t>(nRanks));
  RankMemory& mine = mem[static_cast<size_t>(rank)];
  std::memset(&mine, 0, sizeof(mine));
  mine.statePtr = reinterpret_cast<uint64_t>(local);
  mine.stagingPtr = reinterpret_cast<uint64_t>(out->stagedLocal);
  if (out->staged && otherProcesses) {
    cudaError_t err = cudaIpcGetMemHandle(&mine.state, local);
    if (err == cudaSuccess) err = cudaIpcGetMemHandle(&mine.staging, out->stagedLocal);
    if (err != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: cudaIpcGetMemHandle failed: %s", rank,
                      cudaGetErrorString(err));
  }
  MK_CHECK(bs->allGather(mem.data(), sizeof(RankMemory)));
  for (int r = 0; r < nRanks; ++r) {
    const RankInfo& ri = info[static_cast<size_t>(r)];
    const RankMemory& rm = mem[static_cast<size_t>(r)];
    if (ri.hostHash != me.hostHash) continue;  // another host: reached through the proxies
    if (sameProcess(ri, me)) {
      out->peers[r] = reinterpret_cast<DeviceState*>(rm.statePtr);
      out->stagedBuf[r] = reinterpret_cast<char*>(rm.stagingPtr);
      if (ri.cudaDev != cudaDev) MK_CHECK(enablePeerAccess(rank, cudaDev, r, ri.cudaDev));
      continue;
    }
    void* state = nullptr;
    void* staging = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&state, rm.state, cudaIpcMemLazyEnablePeerAccess);
    if (err == cudaSuccess) {
      err = cudaIpcOpenMemHandle(&staging, rm.staging, cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) (void)cudaIpcCloseMemHandle(state);
    }
    if (err != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError,
                      "rank %d: mapping the memory of rank %d (pid %d, GPU %s) with "
                      "cudaIpcOpenMemHandle failed: %s",
                      rank, r, ri.pid, ri.busId, cudaGetErrorString(err));
    out->peers[r] = static_cast<DeviceState*>(state);
    out->stagedBuf[r] = static_cast<char*>(staging);
    out->opened[r] = true;
  }
  return Result::Success;
}

}  // namespace

void closePeers(PeerSetup* setup, bool freeLocal) {
  for (int r = 0; r < kMaxRanks; ++r) {
    if (!setup->opened[r]) continue;
    if (setup->vmm) {
      // cuMemUnmap waits for nothing (docs/RELIABILITY.md); cudaIpcCloseMemHandle waits
      // for every kernel of the device and holds back the process's other threads meanwhile.
      (void)cudrv::vmmUnmap(setup->peers[r]);
      (void)cudrv::vmmUnmap(setup->stagedBuf[r]);
    } else {
      (void)cudaIpcCloseMemHandle(setup->peers[r]);
      (void)cudaIpcCloseMemHandle(setup->stagedBuf[r]);
    }
    setup->opened[r] = false;
    setup->peers[r] = nullptr;
    setup->stagedBuf[r] = nullptr;
  }
  if (!freeLocal) return;
  if (setup->vmm) {
    // Peers' mappings keep the memory until they unmap it (cuMemRelease's contract).
    if (setup->stagedLocal != nullptr) (void)cudrv::vmmFree(setup->stagedLocal);
    if (setup->vmmState != nullptr) (void)cudrv::vmmFree(setup->vmmState);
    setup->vmmState = nullptr;
  } else if (setup->stagedLocal != nullptr) {
    MemCache::deviceFree(setup->stagedLocal);  // cached while communicators live (mem_cache.h)
  }
  setup->stagedLocal = nullptr;
}

// The ring's order (PeerSetup::ringOrder), once the ranks have agreed on rings: every rank proposes
// one (MKERNEL_RING_ORDER), the proposals are all-gathered, and rank 0's is taken; a rank whose
// setting cannot be read makes every rank fail alike.
struct RingOrderProposal {
  int32_t valid;
  int32_t pad;
  uint8_t order[kMaxRanks];
};

static Result agreeRingOrder(bootstrap::Bootstrap* bs, int rank, int nRanks,
                             const std::vector<RankInfo>& info, PeerSetup* out) {
  std::vector<RingOrderProposal> props(static_cast<size_t>(nRanks));
  RingOrderProposal& mine = props[static_cast<size_t>(rank)];
  std::memset(&mine, 0, sizeof(mine));
  std::vector<int> order(static_cast<size_t>(nRanks));
  for (int r = 0; r < nRanks; ++r) order[static_cast<size_t>(r)] = r;
  const std::string& setting = params::RING_ORDER();
  std::string why;
  mine.valid = 1;
  if (setting == "auto") {
    const topo::NodeModel* model = nullptr;
    if (topo::localNodeModel(&model) == Result::Success) {
      std::vector<std::string> bus;
      for (const RankInfo& ri : info) bus.emplace_back(ri.busId);
      (void)topo::ranksInRingOrder(model->topo, model->place, bus, &order, &why);
    } else {
      why = std::string("no node model (") + lastError() + "): rank order";
    }
  } else if (setting == "rank") {
    why = "MKERNEL_RING_ORDER=rank";
  } else {
    std::vector<int> list;
    const bool ok = parseRingOrder(setting, nRanks, &list);
    if (ok) {
      order = list;
      why = "MKERNEL_RING_ORDER";
    } else {
      mine.valid = 0;
    }
  }
  for (int q = 0; q < nRanks; ++q)
    mine.order[q] = static_cast<uint8_t>(order[static_cast<size_t>(q)]);
  MK_CHECK(bs->allGather(props.data(), sizeof(RingOrderProposal)));
  for (int r = 0; r < nRanks; ++r)
    if (!props[static_cast<size_t>(r)].valid)
      return MK_ERROR(Result::InvalidArgument,
                      "rank %d: MKERNEL_RING_ORDER of rank %d is not auto, rank or a list of the "
                      "%d ranks, each once "
                      "(e.g. 0,2,1,3)%s",
                      rank, r, nRanks, r == rank ? (": \"" + setting + "\"").c_str() : "");
  const RingOrderProposal& chosen = props[0];
  bool identity = true;
  std::string text;
  for (int q = 0; q < nRanks; ++q) {
    out->ringOrder[q] = chosen.order[q];
    identity = identity && chosen.order[q] == q;
    text += (q ? " " : "") + std::to_string(chosen.order[q]);
  }
  out->ringOrdered = !identity;
  if (rank == 0 || std::memcmp(chosen.order, mine.order, kMaxRanks) != 0)
    MK_INFO(kLogInit, "rank %d: ring order %s (%s%s)", rank, text.c_str(),
            rank == 0 ? "" : "rank 0's; here: ", why.empty() ? "rank order" : why.c_str());
  return Result::Success;
}

// Rings (PeerSetup::ring): every rank's mode and wish, all-gathered (each rank calls this once,
// whatever its mode, so that a mismatch is an error rather than a hang). A rank wishes for rings
// when asked to, or in mode 2 when the distinct GPUs of its host's ranks are not NVLink
// all-to-all (its node model, topo::gpusNvlinkAllToAll); one wish suffices.
static Result agreeRing(bootstrap::Bootstrap* bs, int rank, int nRanks,
                        const std::vector<RankInfo>& info, int ringMode, PeerSetup* out) {
  const RankInfo& me = info[static_cast<size_t>(rank)];
  int32_t wish = 0;
  std::string why = "MKERNEL_ALGO=ring";
  if (ringMode != 0 && out->hostPerNode == 0 && nRanks > 1) {
    if (ringMode == 1) {
      wish = 1;
    } else {
      std::vector<std::string> bus;
      for (const RankInfo& ri : info)
        if (ri.hostHash == me.hostHash &&
            std::find(bus.begin(), bus.end(), std::string(ri.busId)) == bus.end())
          bus.emplace_back(ri.busId);
      if (bus.size() > 1) {
        const topo::NodeModel* model = nullptr;
        if (topo::localNodeModel(&model) == Result::Success) {
          wish = topo::gpusNvlinkAllToAll(model->topo, bus, &why) ? 0 : 1;
        } else {
          MK_WARN(
              "rank %d: no node model to tell NVLink from PCIe between the %zu GPUs (%s): direct "
              "algorithms",
              rank, bus.size(), lastError());
        }
        MK_INFO(kLogInit, "rank %d: %zu GPUs on this host: %s", rank, bus.size(), why.c_str());
      }
    }
  }
  std::vector<int32_t> votes(static_cast<size_t>(2 * nRanks), 0);
  votes[static_cast<size_t>(2 * rank)] = ringMode;
  votes[static_cast<size_t>(2 * rank + 1)] = wish;
  MK_CHECK(bs->allGather(votes.data(), 2 * sizeof(int32_t)));
  out->ring = false;
  for (int r = 0; r < nRanks; ++r) {
    if (votes[static_cast<size_t>(2 * r)] != ringMode)
      return MK_ERROR(Result::InvalidUsage,
                      "rank %d: MKERNEL_ALGO differs between rank %d and rank %d (ring, auto or "
                      "another: set it alike)",
                      rank, rank, r);
    if (votes[static_cast<size_t>(2 * r + 1)] != 0) out->ring = true;
  }
  if (out->ring) {
    out->staged = true;
    MK_INFO(kLogInit, "rank %d: every collective a ring through staging buffers (%s)", rank,
            wish ? why.c_str() : "another rank's GPUs are not NVLink all-to-all");
    MK_CHECK(agreeRingOrder(bs, rank, nRanks, info, out));
  }
  return Result::Success;
}

Result exchangePeers(bootstrap::Bootstrap* bs, int rank, int nRanks, int cudaDev,
                     DeviceState* local, int wantCtas, int smCount, bool emulate,
                     uint64_t stagedChunkBytes, bool needStaged, int sharedCtas, PeerSetup* out,
                     int ringMode) {
  std::vector<RankInfo> info(static_cast<size_t>(nRanks));
  RankInfo& me = info[static_cast<size_t>(rank)];
  std::memset(&me, 0, sizeof(me));
  me.hostHash = bootstrap::Bootstrap::hostHash();
  me.pid = static_cast<int32_t>(getpid());
  me.cudaDev = cudaDev;
  me.wantCtas = wantCtas;
  me.sharedCtas = sharedCtas;
  me.smCount = smCount;
  cudaError_t err = cudaDeviceGetPCIBusId(me.busId, sizeof(me.busId) - 1, cudaDev);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: cudaDeviceGetPCIBusId(%d) failed: %s",
                    rank, cudaDev, cudaGetErrorString(err));
  MK_CHECK(bs->allGather(info.data(), sizeof(RankInfo)));

  int agreed = kMaxCtas;
  int mostSharing = 1;  // the most ranks on one GPU of this host
  bool mpsWarned = false;
  out->staged = false;
  out->hostPerNode = 0;
  {
    // Several hosts: the hierarchical path, one node per host (nodeLayoutOfHosts), staged.
    std::vector<uint64_t> hosts(static_cast<size_t>(nRanks));
    for (int r = 0; r < nRanks; ++r)
      hosts[static_cast<size_t>(r)] = info[static_cast<size_t>(r)].hostHash;
    NodeLayout layout;
    const char* why = "";
    if (!nodeLayoutOfHosts(hosts.data(), nRanks, &layout, &why))
      return MK_ERROR(
          Result::InvalidUsage,
          "rank %d: the %d ranks span several hosts but %s; mkernel's kernel runs several hosts "
          "only with consecutive ranks per host, the same number on each (NCCL runs this one)",
          rank, nRanks, why);
    if (layout.nNodes > 1) {
      if (layout.nNodes > kMaxHierNodes)
        return MK_ERROR(Result::InvalidUsage,
                        "rank %d: %d hosts; the hierarchical path takes at most %d", rank,
                        layout.nNodes, kMaxHierNodes);
      out->hostPerNode = layout.perNode;
      out->staged = true;
    }
  }
  for (int r = 0; r < nRanks; ++r) {
    const RankInfo& ri = info[static_cast<size_t>(r)];
    if (ri.hostHash != me.hostHash) continue;  // another host: its GPU and process are its own
    if (!sameProcess(ri, me)) out->staged = true;
    int sharing = 0;
    for (int q = 0; q < nRanks; ++q) {
      const RankInfo& rq = info[static_cast<size_t>(q)];
      if (!sameGpu(rq, ri)) continue;
      ++sharing;
      if (q != r && !emulate)
        return MK_ERROR(Result::InvalidUsage,
                        "rank %d and rank %d both use GPU %s (duplicate GPU); set "
                        "MKERNEL_EMULATE=1 to run several ranks on one GPU",
                        r, q, ri.busId);
      if (q != r && !sameProcess(rq, ri) && r == rank && !mpsWarned && !mpsLikely()) {
        MK_WARN(
            "rank %d: rank %d (pid %d) shares GPU %s from another process and no CUDA MPS pipe was "
            "found: without MPS the two persistent kernels cannot run at the same time and the "
            "first collective times out (start nvidia-cuda-mps-control -d)",
            rank, q, rq.pid, ri.busId);
        mpsWarned = true;
      }
    }
    // smCount is what the rank's GPU has left for this communicator (SmBudget: the SMs, less
    // the few kept free for callers' own kernels, less what this process's other communicators
    // hold there); the ranks sharing it split it.
    mostSharing = std::max(mostSharing, sharing);
    int fit = ri.smCount / sharing;
    if (fit < 1)
      return MK_ERROR(
          Result::InvalidUsage,
          "%d rank(s) of this communicator use GPU %s, which has %d SMs left for persistent "
          "kernels (after %d kept free and those of this process's other communicators): "
          "their kernels (at least one CTA each, all resident at once) cannot fit; "
          "destroy a communicator or lower MKERNEL_CTAS",
          sharing, ri.busId, ri.smCount, kReservedSms);
    agreed = std::min(agreed, std::min(ri.wantCtas, fit));
    if (r == rank) {
      out->ranksOnMyDevice = sharing;
      out->nLocalPeers = 0;
      for (int q = 0; q < nRanks; ++q) {
        const RankInfo& rq = info[static_cast<size_t>(q)];
        if (sameGpu(rq, me) && sameProcess(rq, me)) out->localPeers[out->nLocalPeers++] = q;
      }
    }
  }
  out->nCtas = std::max(1, agreed);
  MK_CHECK(agreeRing(bs, rank, nRanks, info, ringMode, out));
  // MKERNEL_STAGED=1: staged for thread ranks too (the same on every rank: an environment
  // variable of the job; a rank that disagrees is caught below, before any kernel runs).
  if (params::STAGED.is("1") || needStaged) out->staged = true;
  std::vector<int32_t> stagedVote(static_cast<size_t>(nRanks), 0);
  stagedVote[static_cast<size_t>(rank)] = out->staged ? 1 : 0;
  MK_CHECK(bs->allGather(stagedVote.data(), sizeof(int32_t)));
  for (int r = 0; r < nRanks; ++r)
    if (stagedVote[static_cast<size_t>(r)] != stagedVote[static_cast<size_t>(rank)])
      return MK_ERROR(Result::InvalidUsage,
                      "rank %d: MKERNEL_STAGED differs between rank %d and rank %d", rank, rank, r);
  if (out->staged && out->hostPerNode == 0 && stagedChunkElems(nRanks, 8, stagedChunkBytes) == 0)
    return MK_ERROR(
        Result::InvalidArgument,
        "MKERNEL_STAGED_CHUNK_BYTES=%llu is too small for %d ranks (at least %llu bytes)",
        static_cast<unsigned long long>(stagedChunkBytes), nRanks,
        static_cast<unsigned long long>(16ull * static_cast<unsigned long long>(nRanks)));
  // MKERNEL_SHARED_CTAS: thread ranks of one process sharing a GPU (never staged: those are process
  // ranks, emulated nodes or several hosts) keep small persistent kernels. The smallest any rank
  // asks for, off if any rank has it off; every rank computes the same from the same table.
  out->sharedDirect = false;
  if (!out->staged && mostSharing > 1) {
    int per = kMaxCtas;
    for (int r = 0; r < nRanks; ++r) {
      const int32_t s = info[static_cast<size_t>(r)].sharedCtas;
      per = std::min(per, s == -1   ? sharedPersistentCtas(mostSharing)
                          : s == -2 ? sharedPersistentCtas(mostSharing, /*directUnbounded=*/false)
                                    : static_cast<int>(s));
    }
    if (per > 0) {
      out->nCtas = std::min(out->nCtas, per);
      out->sharedDirect = true;
    }
  }
  Result res = mapPeers(bs, rank, nRanks, cudaDev, local, info, stagedChunkBytes, out);
  if (res != Result::Success) {
    closePeers(out, /*freeLocal=*/true);
    return res;
  }
  MK_INFO(kLogInit, "rank %d: %d peers exchanged, %d CTAs per kernel, %d ranks on GPU %s%s%s%s",
          rank, nRanks, out->nCtas, out->ranksOnMyDevice, me.busId,
          out->sharedDirect
              ? ", ranks sharing a GPU: large collectives in direct mode (MKERNEL_SHARED_CTAS)"
              : "",
          !out->staged ? ""
          : out->vmm
              ? ", process ranks: staged collectives through cuMem memory shared by file descriptor"
          : std::any_of(out->opened, out->opened + kMaxRanks, [](bool o) { return o; })
              ? ", process ranks: staged collectives through legacy CUDA IPC"
              : ", staged collectives",
          out->hostPerNode > 0 ? ", several hosts: hierarchical, through the proxies" : "");
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
