// Peer memory of the persistent kernel: every rank's DeviceState (doorbells, barrier flags,
// mailboxes) addressed from every other rank, and the CTA budget all ranks agree on.
//
// Thread ranks of one process use each other's device pointers directly (a CUDA IPC handle cannot
// be opened by the process that made it), with peer access enabled when they sit on different
// GPUs. Process ranks would need CUDA IPC not only for DeviceState but for every user buffer of
// every call (the kernel moves data directly between user buffers), so they are refused with a
// clear message for now (docs/KERNEL.md, "What is left").
#pragma once

#include <cstdint>

#include "collectives/work.h"
#include "common/result.h"

namespace mkernel {
namespace bootstrap {
class Bootstrap;
}
namespace coll {

struct PeerSetup {
  DeviceState* peers[kMaxRanks] = {};  // index = rank
  int nCtas = 0;            // CTAs per kernel, identical on every rank
  int ranksOnMyDevice = 0;  // ranks of this communicator sharing this rank's GPU
};

// Collective over `bs`. `local` is this rank's DeviceState; `wantCtas` the CTAs it would like;
// `smCount` the SMs its GPU has left for this communicator's kernels (SmBudget::available: the
// SMs, less those kept free, less what this process's other communicators hold). With `emulate`
// false, two ranks on one GPU are an error (NCCL's "Duplicate GPU detected"); with it, those SMs
// are divided among the ranks sharing the GPU (one CTA per SM: every rank's kernel must be
// resident at once or they deadlock).
Result exchangePeers(bootstrap::Bootstrap* bs, int rank, int nRanks, int cudaDev,
                     DeviceState* local, int wantCtas, int smCount, bool emulate, PeerSetup* out);

}  // namespace coll
}  // namespace mkernel
