// Fused launches (MKERNEL_FUSED_LAUNCH, docs/KERNEL.md "Fused launches"): thread ranks of one
// communicator that share a GPU in this process run a small eager collective (an LL op of one
// CTA) as ONE kernel launch, made by the last of them to call, instead of a launch each.
//
// Why: CUDA serialises the launches of one context, about 3.5-4 us of host time each on the
// H200 hosts. n threads that each launch a kernel on their own stream, in step, take 6 / 11 / 20
// us per round for n = 2 / 4 / 8 (docs/PERFORMANCE.md), so 8 emulated ranks could not get near
// issue 5's 8 us whatever the kernel did. An event record or a stream's wait for an event costs
// 0.2-0.3 us.
//
// The order of each member's stream, as with a kernel of its own on it:
//   member m:  records its event in_m on its stream (after its earlier work), arrives;
//   launcher (the last to arrive): its stream waits for every other member's in_m, then the
//              fused kernel (CTA m = member m's op), then out[round] recorded; "launched";
//   member m:  waits on the host until "launched" (the launcher's calls: microseconds), then
//              its stream waits for out[round].
// So the kernel starts after every member's earlier work and every member's later work starts
// after the kernel, and no call waits for the GPU. A member that is capturing, or that calls
// inside a group driving several co-located ranks (it cannot wait for them), makes the round take
// the usual launch per rank; so does a member that does not arrive within MKERNEL_FUSED_WAIT_US of
// the first. The round's decision is one compare-and-swap on one word, so every member sees the
// same one.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "collectives/device/launch.h"
#include "collectives/work.h"
#include "common/result.h"

namespace mkernel {
namespace coll {

class FusedLaunch {
 public:
  // On the calling thread's current device (the members' GPU): the rounds' out events.
  // members: 2 to kMaxFused.
  static Result create(int members, FusedLaunch** out);
  ~FusedLaunch();

  int members() const { return n_; }

  // What member m brings to a round: its kernel parameters (the communicator's, which outlive the
  // round), its op, its launch-path number and report index, its stream and the event it
  // recorded on it just before arriving.
  struct Entry {
    const KernelParams* params;
    WorkDesc desc;
    uint64_t epoch;
    uint64_t opIndex;
    cudaStream_t stream;
    cudaEvent_t in;
  };
  enum class Decision { kFused, kSeparate };

  // Member m arrives at its round-th fusable op (rounds count from 1 on every member alike).
  // able: it can take part; otherwise the round is separate at once. A member that can waits for
  // the others up to waitUs (MKERNEL_FUSED_WAIT_US) or until stop(), then makes the round separate
  // if nobody decided it. kFused: *launcher is true for exactly one member, which calls
  // launch(m, round), every other member join(m, round).
  Decision arrive(int m, uint64_t round, bool able, const Entry& e, double waitUs, bool* launcher,
                  const std::function<bool()>& stop);

  // The launcher m: its stream waits for the others' in events, runs the kernel, records the
  // round's out event. A failure ends every member's join with an error.
  Result launch(int m, uint64_t round);
  // Member m: its stream waits for the round's kernel (once the launcher has queued it: a wait
  // on the host bounded by timeoutS).
  Result join(int m, uint64_t round, double timeoutS);

  // Reference count, as PostFence's: one per member.
  bool unref();

 private:
  explicit FusedLaunch(int members) : n_(members), refs_(members) {}

  // state = round << 16 | arrivals << 8 | decision (0 undecided, 1 fused, 2 separate)
  static constexpr uint64_t kUndecided = 0, kFusedBit = 1, kSeparateBit = 2;
  static uint64_t pack(uint64_t round, uint64_t arrived, uint64_t decision) {
    return round << 16 | arrived << 8 | decision;
  }
  // A member is at most one round ahead of another (arrive), so a slot is reused only after every
  // member has left the round that used it before.
  static constexpr int kSlots = 4;
  struct Slot {
    std::atomic<uint64_t> state{0};
    std::atomic<uint64_t> launched{0};  // the round whose kernel and out event are queued
    std::atomic<uint64_t> failed{0};    // the round whose launch failed
    Entry entries[kMaxFused];
    cudaEvent_t out = nullptr;
  };

  int n_;
  std::atomic<int> refs_;
  Slot slots_[kSlots];
};

}  // namespace coll
}  // namespace mkernel
