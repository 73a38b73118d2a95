// plugin/shim/shim_comm.cc's destroyShimComm on the CPU: ncclCommDestroy of the members of one
// communicator in one process. Each release's finalize waits for every member (the finalize
// barrier), then takes a while to free what it holds. One thread destroying the members in turn
// (nccl-tests' default, ncclCommInitAll's pattern) gets the first ones released in the background;
// the last destroy must not return before every one of those releases has ended, since the
// application frees its buffers and may reset the device right after (nccl-tests calls
// cudaDeviceReset(), which would unmap the control blocks under releases still running, and the
// process would die at exit).
#include "tests/catch.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "plugin/shim/shim_comm.h"

namespace {

using mkernel::Result;
using mkernel::coll::CollArgs;
using mkernel::coll::CollStats;
using mkernel::coll::CommOptions;

// What the members of one communicator share: the finalize barrier and the count of releases
// that have ended.
struct Group {
  int size = 0;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::atomic<int> released{0};
};

// finalize(): arrives at the barrier, waits for every member (at most 20 s), then spends
// `afterBarrier` freeing what it holds, as KernelCommunicator's release does.
class BarrierComm final : public mkernel::coll::Communicator {
 public:
  BarrierComm(Group* g, std::chrono::milliseconds afterBarrier) : g_(g), after_(afterBarrier) {}
  Result enqueue(const CollArgs*, int, cudaStream_t) override { return Result::Success; }
  Result asyncError(bool) override { return Result::Success; }
  Result abort() override { return Result::Success; }
  Result finalize() override {
    {
      std::unique_lock<std::mutex> lock(g_->mu);
      ++g_->arrived;
      g_->cv.notify_all();
      if (!g_->cv.wait_for(lock, std::chrono::seconds(20),
                           [this] { return g_->arrived >= g_->size; }))
        return Result::InternalError;
    }
    std::this_thread::sleep_for(after_);
    g_->released.fetch_add(1);
    return Result::Success;
  }
  const CommOptions& options() const override { return opts_; }
  void stats(CollStats*) const override {}
  Result kernelTrace(std::vector<uint64_t>*) const override { return Result::InvalidUsage; }

 private:
  Group* g_;
  std::chrono::milliseconds after_;
  CommOptions opts_;
};

// Member r spends afterBarrier * (n - 1 - r) after the barrier: the last one to be destroyed
// ends its release first, the others later (the order that exposes an early return).
std::vector<mkernel::shim::ShimComm*> members(Group* g, int n, uint64_t idHash,
                                              std::chrono::milliseconds afterBarrier) {
  g->size = n;
  std::vector<mkernel::shim::ShimComm*> out;
  for (int r = 0; r < n; ++r) {
    mkernel::shim::ShimComm* c = mkernel::shim::newShimComm();
    c->rank = r;
    c->nRanks = n;
    c->idHash = idHash;
    c->mk.reset(new BarrierComm(g, afterBarrier * (n - 1 - r)));
    c->state.store(mkernel::shim::CommState::Ready);
    out.push_back(c);
  }
  return out;
}

// What ncclCommDestroy does with a live shim comm outside a group.
void destroy(mkernel::shim::ShimComm* c) {
  c->state.store(mkernel::shim::CommState::Destroyed);
  mkernel::shim::destroyShimComm(c);
}

}  // namespace

TEST_CASE(
    "shim destroy: one thread destroying the members in turn returns from the last after every "
    "release") {
  for (int n : {2, 4, 8}) {
    Group g;
    auto comms = members(&g, n, 0x1000 + static_cast<uint64_t>(n), std::chrono::milliseconds(100));
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < n - 1; ++r) {
      destroy(comms[r]);
      // The earlier members return at once: their peers are still live, so their releases wait
      // in the background (one thread would otherwise wait the grace once per member).
      CHECK(g.released.load() == 0);
    }
    destroy(comms[n - 1]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(n << " members: the last destroy returned after " << s << " s");
    CHECK(g.released.load() == n);
    CHECK(s < 5.0);
  }
}

TEST_CASE(
    "shim destroy: members destroyed by threads of their own all return after every release") {
  const int n = 4;
  Group g;
  auto comms = members(&g, n, 0x2000, std::chrono::milliseconds(100));
  std::vector<std::thread> threads;
  std::atomic<int> returned{0};
  std::atomic<int> earlyReturns{0};  // a destroy that returned while a release still ran
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      // Staggered, as threads that finish their work at different times.
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * r));
      destroy(comms[r]);
      // The destroy that returns last: every release has ended by then.
      if (returned.fetch_add(1) + 1 == n && g.released.load() != n) earlyReturns.fetch_add(1);
    });
  for (auto& t : threads) t.join();
  CHECK(earlyReturns.load() == 0);
  CHECK(g.released.load() == n);
}

TEST_CASE("shim destroy: another communicator's background releases do not hold a destroy") {
  // Communicator A: two members, one destroyed; its release waits in the background for the other.
  Group a;
  auto ca = members(&a, 2, 0x3000, std::chrono::milliseconds(0));
  destroy(ca[0]);
  // Communicator B, destroyed whole: returns although A's release still waits.
  Group b;
  auto cb = members(&b, 2, 0x3001, std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  destroy(cb[0]);
  destroy(cb[1]);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(b.released.load() == 2);
  CHECK(a.released.load() == 0);
  CHECK(s < 2.0);
  destroy(ca[1]);
  CHECK(a.released.load() == 2);
}
