#include "collectives/runtime/post_fence.h"

#include <chrono>
#include <functional>
#include <thread>

namespace mkernel {
namespace coll {
namespace {

uint64_t thisThread() {
  const uint64_t h =
      static_cast<uint64_t>(std::hash<std::thread::id>()(std::this_thread::get_id()));
  return h == 0 ? 1 : h;  // 0 means "none yet"
}

}  // namespace

PostFence::PostFence(const int* ranks, int members) : n_(members), refs_(members) {
  for (int m = 0; m < kMaxRanks; ++m) {
    ranks_[m] = m < members ? ranks[m] : -1;
    posted_[m].store(0, std::memory_order_relaxed);
    thread_[m].store(0, std::memory_order_relaxed);
    left_[m].store(false, std::memory_order_relaxed);
  }
}

void PostFence::posted(int m, uint64_t seq) {
  thread_[m].store(thisThread(), std::memory_order_relaxed);
  posted_[m].store(seq, std::memory_order_release);
}

PostFence::Outcome PostFence::wait(int m, uint64_t seq, double timeoutS,
                                   const std::function<bool()>& stop, int* laggard) const {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutS));
  const uint64_t me = thisThread();
  // Co-located ranks arrive within microseconds of each other in a busy loop (nccl-tests), and
  // the fence is on the latency path of every op: spin (yielding) for the first millisecond,
  // then poll every 50 us.
  const auto spinUntil = t0 + std::chrono::milliseconds(1);
  for (int q = 0; q < n_; ++q) {
    if (q == m) continue;
    for (;;) {
      if (posted_[q].load(std::memory_order_acquire) >= seq) break;
      if (laggard != nullptr) *laggard = ranks_[q];
      if (left_[q].load(std::memory_order_acquire)) {
        if (posted_[q].load(std::memory_order_acquire) >= seq) break;
        return Outcome::kLeft;
      }
      if (thread_[q].load(std::memory_order_relaxed) == me) return Outcome::kSameThread;
      if (stop && stop()) return Outcome::kStopped;
      const auto now = Clock::now();
      if (now > deadline) return Outcome::kTimedOut;
      if (now < spinUntil) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  return Outcome::kPassed;
}

void PostFence::leave(int m) {
  left_[m].store(true, std::memory_order_release);
}

bool PostFence::unref() {
  return refs_.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

}  // namespace coll
}  // namespace mkernel
