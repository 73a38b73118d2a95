// Peer memory of the persistent kernel: every rank's DeviceState (doorbells, barrier flags,
// mailboxes) addressed from every other rank, and the CTA budget all ranks agree on.
//
// Thread ranks of one process use each other's device pointers directly, with peer access
// enabled when they sit on different GPUs, and the kernel moves data directly between their user
// buffers. When any two ranks are different processes of one host (PyTorch, torchrun, MPI), the
// communicator is "staged" (collectives/algo/staged.h): each rank also allocates a staging buffer,
// and every rank maps the DeviceState and staging buffer of each rank of another process:
// cuMem blocks passed as POSIX file descriptors over a Unix socket (MKERNEL_PEER_IPC=cumem, the
// default, as NCCL shares memory; transport/ipc/fd_exchange.h), else, or where any rank cannot,
// CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle); collectives then go through staging.
// Ranks on different hosts are refused here (the caller falls back to NCCL).
#pragma once

#include <cstdint>

#include "collectives/algo/work.h"
#include "common/result.h"

namespace mkernel {
namespace bootstrap {
class Bootstrap;
}
namespace coll {

struct PeerSetup {
  DeviceState* peers[kMaxRanks] = {};  // index = rank
  int nCtas = 0;                       // CTAs per kernel, identical on every rank
  int ranksOnMyDevice = 0;             // ranks of this communicator sharing this rank's GPU
  // ... of which threads of this process, this rank included, in rank order (the members of its
  // PostFence, collectives/runtime/post_fence.h)
  int localPeers[kMaxRanks] = {};
  int nLocalPeers = 0;
  bool staged = false;  // some rank is another process: collectives go through staging
  // Thread ranks sharing a GPU with small persistent kernels (MKERNEL_SHARED_CTAS): their large
  // collectives run in direct mode at every size, on the SMs the persistent kernels leave.
  bool sharedDirect = false;
  char* stagedBuf[kMaxRanks] = {};  // staged: every rank's staging buffer, as mapped here
  void* stagedLocal =
      nullptr;  // staged: this rank's own (MemCache, or vmmAlloc with vmm), freed by closePeers
  uint64_t stagedBytes = 0;
  bool opened[kMaxRanks] =
      {};  // peers[r] / stagedBuf[r] were mapped here (vmm: cuMem imports; else CUDA IPC)
  // Process ranks share cuMem memory through POSIX file descriptors (MKERNEL_PEER_IPC=cumem, the
  // default, when every rank could): then stagedLocal and vmmState are cudrv::vmmAlloc blocks, and
  // every opened entry a cudrv::vmmImportFd mapping. Unmapping and freeing those waits for no
  // kernel, where cudaIpcCloseMemHandle waits like cudaFree (docs/RELIABILITY.md).
  bool vmm = false;
  DeviceState* vmmState =
      nullptr;  // vmm: this rank's DeviceState, zeroed; the caller uses it instead of `local`
  // Ranks on several hosts (nodeLayoutOfHosts): ranks per host, 0 when all share one. Peers on
  // other hosts are not mapped (peers[r], stagedBuf[r] null): the hierarchical path reaches them
  // through the proxies.
  int hostPerNode = 0;
  // Every collective a ring through the staging buffers (staged_ring.h; then `staged` too):
  // MKERNEL_ALGO=ring, or auto on a host whose GPUs are not NVLink all-to-all (a PCIe box,
  // topo::gpusNvlinkAllToAll). Agreed by every rank.
  bool ring = false;
  // The ring's order (ring only; staged_ring.h): ringOrder[p] is the rank at position p, the same
  // on every rank. MKERNEL_RING_ORDER: auto (the default) the placement's ring of the host's GPUs
  // (topo::ranksInRingOrder: PCIe nearest neighbour, sockets together; rank order where the model
  // lacks a GPU), rank, or a list of ranks; rank 0's proposal wins. ringOrdered false: rank order.
  bool ringOrdered = false;
  uint8_t ringOrder[kMaxRanks] = {};
};

// Collective over `bs`. `local` is this rank's DeviceState (cudaMalloc'ed: CUDA IPC exports whole
// allocations; with out->vmm set on return, out->vmmState replaces it); `wantCtas` the CTAs it
// would like; `smCount` the SMs its GPU has left for this communicator's kernels
// (SmBudget::available: the SMs, less those kept free, less what this process's other communicators
// hold). With `emulate` false, two ranks on one GPU are an error (NCCL's "Duplicate GPU detected");
// with it, those SMs are divided among the ranks sharing the GPU (one CTA per SM: every rank's
// kernel must be resident at once or they deadlock; ranks of different processes sharing a GPU need
// MPS for that). `stagedChunkBytes` sizes the staging buffer of a staged communicator
// (stagedBufferBytes(nCtas, stagedChunkBytes)). `ringMode` (the same on every rank, else an error):
// 0 no rings, 1 rings (MKERNEL_ALGO=ring), 2 rings when this host's GPUs are not NVLink all-to-all;
// one host only (never with several). On failure everything it allocated or opened is released.
// `needStaged`: staged even for thread ranks (emulated nodes: the node-local phases of the
// hierarchical path use the staging buffers). Ranks on several hosts must be grouped by host,
// the same number on each (hostPerNode); they are staged too.
// `sharedCtas` (MKERNEL_SHARED_CTAS, collectives/runtime/communicator_kernel.cc): thread ranks of
// one process sharing a GPU, whose large collectives take the launch path's direct mode, keep their
// persistent kernels at this many CTAs each (-1: auto, sharedPersistentCtas of launch_path.h; -2:
// auto with an upper end to direct mode, sharedPersistentCtas(.., false); 0: off), leaving the
// SMs to the direct-mode kernels; then `sharedDirect` is set. The smallest any rank asks for.
Result exchangePeers(bootstrap::Bootstrap* bs, int rank, int nRanks, int cudaDev,
                     DeviceState* local, int wantCtas, int smCount, bool emulate,
                     uint64_t stagedChunkBytes, bool needStaged, int sharedCtas, PeerSetup* out,
                     int ringMode = 0);

// Closes the IPC mappings of a staged communicator and frees its staging buffer, and with vmm its
// DeviceState (vmmState) too (no-op for thread ranks). Only once no kernel of this process uses
// them and, for the local buffer, once no peer does (after the finalize barrier).
void closePeers(PeerSetup* setup, bool freeLocal);

}  // namespace coll
}  // namespace mkernel
