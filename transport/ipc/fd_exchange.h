// Passing file descriptors between the ranks of one host that are different processes.
//
// Process ranks of a staged communicator map each other's DeviceState and staging buffer. That
// memory is a cuMem allocation shared through a POSIX file descriptor
// (collectives/runtime/peer_memory.cc, MKERNEL_PEER_IPC), as NCCL shares its buffers: the
// descriptor of one process means nothing in another, so it travels over a Unix socket as
// SCM_RIGHTS ancillary data. (pidfd_getfd would need ptrace rights over the peer, which Yama's
// default scope of 1 refuses between sibling processes.)
//
// exchangeFds is collective over the communicator's ranks (every rank calls it, the same number
// of descriptors each):
//   1. each rank listens on an abstract-namespace Unix socket, "mkernel-fd-<pid>-<rank>-<nonce>"
//      (no file to clean up; the nonce, from /dev/urandom, keeps names of successive communicators
//      apart), and the names are all-gathered with the ranks' pids;
//   2. each rank connects to every rank it wants descriptors from and sends its rank and the
//      listener's nonce (a connect to a listening Unix socket completes without an accept), and
//      whether all its connections were made is all-gathered: a rank that cannot reach a peer
//      (another network namespace) makes every rank fail at once, not at the deadline;
//   3. each rank accepts as many connections as ranks want its descriptors, checks each caller's
//      pid (SO_PEERCRED) and rank against the gathered ones, and answers with its descriptors; a
//      caller that is not a rank (no greeting within a second, a closed connection, a wrong pid,
//      nonce or rank) is dropped with a WARN and not counted, so that it cannot stop the exchange;
//   4. each rank receives the answers on its own connections.
// Every wait is bounded by the deadline, and an error names the peer and the step. `want` must be
// symmetric (rank a wants b's descriptors if and only if b wants a's), as "another process on my
// host" is. Ranks that want none still take part in the all-gather.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/result.h"

namespace mkernel {
namespace ipc {

constexpr int kMaxPassedFds = 4;

// All-gathers `bytesPerRank` bytes: rank r's are at data + r * bytesPerRank (Bootstrap::allGather).
using AllGatherFn = std::function<Result(void* data, size_t bytesPerRank)>;

// `fds`: this rank's nFds (1..kMaxPassedFds) descriptors, sent to each rank r with want[r] != 0
// (duplicated by the kernel: the caller keeps and closes its own). On success (*got)[r * nFds + i]
// is rank r's i-th descriptor as received here for each wanted r (the caller's to close), -1
// elsewhere. On failure every received descriptor has been closed.
Result exchangeFds(const AllGatherFn& allGather, int rank, int nRanks,
                   const std::vector<char>& want, const int* fds, int nFds, double timeoutS,
                   std::vector<int>* got);

}  // namespace ipc
}  // namespace mkernel
