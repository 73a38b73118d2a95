#include "collectives/fused_launch.h"

#include <chrono>
#include <thread>

#include "common/log.h"

namespace mkernel {
namespace coll {

Result FusedLaunch::create(int members, FusedLaunch** out) {
  *out = nullptr;
  if (members < 2 || members > kMaxFused)
    return MK_ERROR(Result::InternalError, "fused launch of %d ranks (2 to %d)", members, kMaxFused);
  FusedLaunch* f = new FusedLaunch(members);
  for (Slot& s : f->slots_) {
    const cudaError_t err = cudaEventCreateWithFlags(&s.out, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      delete f;
      return MK_ERROR(Result::UnhandledCudaError, "fused launch: cudaEventCreate: %s", cudaGetErrorString(err));
    }
  }
  *out = f;
  return Result::Success;
}

FusedLaunch::~FusedLaunch() {
  // The last member is gone; streams that waited for these events keep what they waited for.
  for (Slot& s : slots_)
    if (s.out != nullptr) (void)cudaEventDestroy(s.out);
}

FusedLaunch::Decision FusedLaunch::arrive(int m, uint64_t round, bool able, const Entry& e, double waitUs,
                                          bool* launcher, const std::function<bool()>& stop) {
  *launcher = false;
  Slot& s = slots_[round % kSlots];
  if (able) s.entries[m] = e;  // published by the release below
  // Arrive: a slot still holding an older round is this round's, fresh (every member left that
  // round before any arrives here: a member is at most one round ahead of another, since each
  // round ends for a member only after every member arrived at it: the fused kernel needs them
  // all, and a separate round passes the post fence, which does).
  uint64_t cur = s.state.load(std::memory_order_acquire);
  uint64_t decision = kUndecided;
  for (;;) {
    const uint64_t r = cur >> 16;
    const uint64_t arrived = r == round ? (cur >> 8) & 0xff : 0;
    const uint64_t d = r == round ? cur & 0xff : kUndecided;
    uint64_t nd = d;
    if (!able && d == kUndecided) nd = kSeparateBit;
    if (able && d == kUndecided && arrived + 1 == static_cast<uint64_t>(n_)) nd = kFusedBit;
    if (s.state.compare_exchange_weak(cur, pack(round, arrived + 1, nd), std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      decision = nd;
      *launcher = able && d == kUndecided && nd == kFusedBit;
      break;
    }
  }
  if (decision == kSeparateBit || !able) return Decision::kSeparate;
  if (decision == kFusedBit) return Decision::kFused;
  // Undecided: wait for the others (they call within microseconds in a loop of collectives), or
  // give up and make the round separate (a peer busy elsewhere, a thread driving several ranks).
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double, std::micro>(waitUs));
  for (uint32_t iter = 1;; ++iter) {
    cur = s.state.load(std::memory_order_acquire);
    const uint64_t d = cur & 0xff;
    if (d == kFusedBit) return Decision::kFused;
    if (d == kSeparateBit) return Decision::kSeparate;
    if ((iter & 63) == 0) {
      if ((stop && stop()) || Clock::now() > deadline) {
        // Undecided still: this member decides (a CAS, so a last arrival racing with it wins or loses whole).
        if (s.state.compare_exchange_strong(cur, (cur & ~uint64_t{0xff}) | kSeparateBit, std::memory_order_acq_rel,
                                            std::memory_order_acquire))
          return Decision::kSeparate;
        continue;  // it changed: read the decision again
      }
      std::this_thread::yield();
    }
  }
}

Result FusedLaunch::launch(int m, uint64_t round) {
  Slot& s = slots_[round % kSlots];
  LlFused f{};
  const cudaStream_t stream = s.entries[m].stream;
  cudaError_t err = cudaSuccess;
  for (int q = 0; q < n_; ++q) {
    const Entry& e = s.entries[q];
    f.p[q] = *e.params;
    f.d[q] = e.desc;
    f.epoch[q] = e.epoch;
    f.opIndex[q] = e.opIndex;
    if (q != m && err == cudaSuccess) err = cudaStreamWaitEvent(stream, e.in, 0);
  }
  f.n = n_;
  Result r = err == cudaSuccess ? Result::Success
                                : MK_ERROR(Result::UnhandledCudaError, "fused launch: cudaStreamWaitEvent: %s",
                                           cudaGetErrorString(err));
  if (r == Result::Success) r = launchLlFused(f, stream);
  if (r == Result::Success) {
    err = cudaEventRecord(s.out, stream);
    if (err != cudaSuccess)
      r = MK_ERROR(Result::UnhandledCudaError, "fused launch: cudaEventRecord: %s", cudaGetErrorString(err));
  }
  if (r != Result::Success) {
    s.failed.store(round, std::memory_order_release);
    return r;
  }
  s.launched.store(round, std::memory_order_release);
  return Result::Success;
}

Result FusedLaunch::join(int m, uint64_t round, double timeoutS) {
  Slot& s = slots_[round % kSlots];
  if (s.launched.load(std::memory_order_acquire) != round) {
    using Clock = std::chrono::steady_clock;
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutS));
    for (uint32_t iter = 1; s.launched.load(std::memory_order_acquire) != round; ++iter) {
      if (s.failed.load(std::memory_order_acquire) == round)
        return MK_ERROR(Result::UnhandledCudaError, "member %d: the fused launch of round %llu failed", m,
                        static_cast<unsigned long long>(round));
      if ((iter & 1023) == 0) {
        if (Clock::now() > deadline)
          return MK_ERROR(Result::InternalError, "member %d: the fused launch of round %llu was not made within %.0f s",
                          m, static_cast<unsigned long long>(round), timeoutS);
        std::this_thread::yield();
      }
    }
  }
  const cudaError_t err = cudaStreamWaitEvent(s.entries[m].stream, s.out, 0);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "member %d: waiting for the fused launch: %s", m, cudaGetErrorString(err));
  return Result::Success;
}

bool FusedLaunch::unref() {
  return refs_.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

}  // namespace coll
}  // namespace mkernel
