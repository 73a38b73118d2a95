// collectives/runtime/post_fence.h on CPU threads: a co-located rank passes only once every member
// has posted the same collective, and every way out of the wait (stop, a member that left, a member
// driven by the waiting thread itself, the timeout) names the member waited for.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/catch.h"
#include "collectives/runtime/post_fence.h"

using mkernel::coll::PostFence;
using Outcome = PostFence::Outcome;

namespace {
double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("post fence: nobody passes before the last member posts; then everyone does") {
  const int ranks[4] = {0, 2, 4, 6};
  PostFence f(ranks, 4);
  CHECK(f.members() == 4);
  CHECK(f.rank(2) == 4);
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int m = 0; m < 3; ++m)
    threads.emplace_back([&, m] {
      f.posted(m, 1);
      int lag = -1;
      if (f.wait(m, 1, 10.0, nullptr, &lag) == Outcome::kPassed) passed.fetch_add(1);
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(passed.load() == 0);  // member 3 (rank 6) has not posted
  f.posted(3, 1);
  int lag = -1;
  CHECK(f.wait(3, 1, 10.0, nullptr, &lag) == Outcome::kPassed);
  for (auto& t : threads) t.join();
  CHECK(passed.load() == 3);
  // A member that is ahead (posted 2) satisfies a wait for 1 and does not pass 2 alone.
  f.posted(0, 2);
  CHECK(f.wait(1, 1, 1.0, nullptr, &lag) == Outcome::kPassed);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(f.wait(0, 2, 0.2, nullptr, &lag) == Outcome::kTimedOut);
  CHECK(secondsSince(t0) >= 0.19);
  CHECK(lag == 2);  // member 1 is rank 2, the first one behind
  CHECK_FALSE(f.unref());
  CHECK_FALSE(f.unref());
  CHECK_FALSE(f.unref());
  CHECK(f.unref());  // the fourth reference is the last
}

TEST_CASE("post fence: many collectives in a row, ranks arriving in any order") {
  const int ranks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  PostFence f(ranks, 8);
  // Each member may only post seq + 1 once it passed seq: the passes must never run ahead.
  std::atomic<uint64_t> maxPosted{0};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int m = 0; m < 8; ++m)
    threads.emplace_back([&, m] {
      for (uint64_t s = 1; s <= 500; ++s) {
        f.posted(m, s);
        uint64_t cur = maxPosted.load();
        while (cur < s && !maxPosted.compare_exchange_weak(cur, s)) {
        }
        int lag = -1;
        if (f.wait(m, s, 30.0, nullptr, &lag) != Outcome::kPassed) bad.fetch_add(1);
        if (maxPosted.load() > s + 1) bad.fetch_add(1);  // someone passed a fence early
        if ((s + static_cast<uint64_t>(m)) % 97 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  for (auto& t : threads) t.join();
  CHECK(bad.load() == 0);
}

TEST_CASE(
    "post fence: stop, a member that left, and the waiting thread's own member end the wait") {
  const int ranks[3] = {1, 3, 5};
  int lag = -1;
  {
    PostFence f(ranks, 3);
    f.posted(0, 1);
    std::atomic<bool> stop{false};
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      stop = true;
    });
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(f.wait(
              0, 1, 30.0, [&] { return stop.load(); }, &lag) == Outcome::kStopped);
    CHECK(secondsSince(t0) < 5.0);
    CHECK(lag == 3);
    t.join();
  }
  {
    PostFence f(ranks, 3);
    f.posted(0, 1);
    f.posted(1, 1);
    std::thread([&] { f.leave(2); }).join();
    CHECK(f.wait(0, 1, 30.0, nullptr, &lag) == Outcome::kLeft);
    CHECK(lag == 5);
  }
  {
    // Member 2 left after posting 1: a wait for 1 still passes (it had posted), one for 2 not.
    PostFence f(ranks, 3);
    for (int m = 0; m < 3; ++m) f.posted(m, 1);
    f.leave(2);
    CHECK(f.wait(0, 1, 30.0, nullptr, &lag) == Outcome::kPassed);
    f.posted(0, 2);
    f.posted(1, 2);
    CHECK(f.wait(0, 2, 30.0, nullptr, &lag) == Outcome::kLeft);
  }
  {
    // One thread posts for members 0 and 1 outside a group: waiting in member 0's call for member
    // 1, which this same thread posted last, can never end.
    PostFence f(ranks, 3);
    std::thread other([&] { f.posted(2, 1); });
    other.join();
    f.posted(1, 1);
    f.posted(1, 2);
    f.posted(0, 1);
    CHECK(f.wait(0, 1, 30.0, nullptr, &lag) == Outcome::kPassed);
    f.posted(0, 2);
    const auto t0 = std::chrono::steady_clock::now();
    // Member 1 posted 2 already; member 2 (another thread) has not: a plain wait, not SameThread.
    CHECK(f.wait(0, 2, 0.1, nullptr, &lag) == Outcome::kTimedOut);
    CHECK(lag == 5);
    f.posted(0, 3);
    std::thread([&] { f.posted(2, 3); }).join();
    CHECK(f.wait(0, 3, 30.0, nullptr, &lag) ==
          Outcome::kSameThread);  // member 1: this thread, at 2
    CHECK(lag == 3);
    CHECK(secondsSince(t0) < 5.0);
  }
}
