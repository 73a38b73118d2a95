// PostFence: the rule that keeps thread ranks sharing one GPU from holding each other back.
//
// A collective's kernels (or the persistent kernel's doorbell) wait for every rank's to start.
// Each caller stream is fed to the GPU through one of the process's hardware work queues, and
// several streams can share a queue (CUDA_DEVICE_MAX_CONNECTIONS of them, default 8, handed out
// round-robin). A queue is in order: a command that must wait for an earlier one of its own stream
// (the application's next kernel behind a collective's kernel, a stream wait behind a doorbell)
// also holds back every command queued behind it for the other streams of that queue. If a
// co-located peer's start for the same collective is among them, the two wait for each other
// until the timeout. mkernel-queueprobe shows it (docs/RELIABILITY.md): with one queue, a kernel
// queued behind each waiting kernel stalled 8 of 8 rounds for 2, 4 and 8 ranks, and 0 of 8 once
// every rank passed a host barrier before queueing it.
//
// So ranks of one communicator on one GPU in one process (thread emulation) each queue only the
// start of a collective, pass this fence (every co-located member has queued its start of the
// same collective), and only then queue what waits for its end. One rank per GPU never fences.
// Host-only, no CUDA: tested on the CPU (tests/collectives/test_post_fence.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "collectives/algo/work.h"

namespace mkernel {
namespace coll {

class PostFence {
 public:
  // members: the co-located ranks, in rank order (member index = position); each holds one
  // reference from the start and drops it with unref().
  PostFence(const int* ranks, int members);

  int members() const { return n_; }
  int rank(int member) const { return ranks_[member]; }

  // Member m has queued the start of its seq-th fenced collective (seq counts from 1).
  void posted(int m, uint64_t seq);

  enum class Outcome { kPassed, kStopped, kLeft, kSameThread, kTimedOut };
  // Waits until every member has posted seq. stop() is polled (abort, a kernel failure): true ends
  // the wait with kStopped. A member that left (finalized, destroyed) and had not posted seq ends
  // it with kLeft; one whose last collective came from this very thread can only post seq from
  // here, after this wait (ranks on one GPU driven by one thread must call inside a group, as
  // NCCL requires): kSameThread at once. *laggard: the rank of the member waited for last.
  Outcome wait(int m, uint64_t seq, double timeoutS, const std::function<bool()>& stop,
               int* laggard) const;

  // Member m is gone: nobody waits for it any more.
  void leave(int m);
  // Drops one reference; true for the last (the caller deletes the fence).
  bool unref();

 private:
  int n_;
  int ranks_[kMaxRanks];
  std::atomic<uint64_t> posted_[kMaxRanks];
  std::atomic<uint64_t> thread_[kMaxRanks];  // hash of the thread that posted last (0: none yet)
  std::atomic<bool> left_[kMaxRanks];
  std::atomic<int> refs_;
};

}  // namespace coll
}  // namespace mkernel
