// Shared by the CPU simulations of the launch path's protocols (test_launch_path.cc: the inbox;
// test_launch_direct.cc: the direct mode): ranks and CTAs as threads, random delays, per-CTA
// flags waited on with a deadline, failures collected once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/types.h"
#include "collectives/algo/work.h"

namespace launchsim {

// One collective of a simulated run.
struct Op {
  mkernel::coll::CollType coll;
  uint64_t count;
  int root;
  size_t esz = 8;  // element size: only the inbox slicing's alignment depends on it
};

// Element i of rank `rank`'s input to op number `epoch`: distinct per op, so data of another op
// (a buffer reused too early) shows in the results.
inline uint64_t input(uint64_t epoch, int rank, uint64_t i) {
  return (epoch * 1000003ull + static_cast<uint64_t>(rank) * 7919ull + i * 31ull) & 0xffffffffull;
}

// The first failures of a run; any failure stops every thread.
struct Failures {
  std::vector<std::string> list;
  std::mutex mu;
  std::atomic<bool> stop{false};
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (list.size() < 10) list.push_back(what);
    stop = true;
  }
};

// A random pause: mostly none, sometimes a yield, now and then up to maxUs microseconds.
inline void jitter(std::mt19937& rng, unsigned maxUs = 200) {
  const unsigned r = rng() % 16;
  if (r == 0)
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % maxUs));
  else if (r < 4)
    std::this_thread::yield();
}

// Per-(rank, CTA) flags, indexed rank * kLaunchMaxCtas + cta, all zero.
inline std::unique_ptr<std::atomic<uint64_t>[]> makeFlags(int nRanks) {
  const size_t count = static_cast<size_t>(nRanks) * mkernel::coll::kLaunchMaxCtas;
  std::unique_ptr<std::atomic<uint64_t>[]> flags(new std::atomic<uint64_t>[count]);
  for (size_t i = 0; i < count; ++i) flags[i] = 0;
  return flags;
}

// CTA `cta` of rank `r` waits until every rank's flag of that CTA is >= epoch (acquire). False
// when the run stopped or after 20 s (recorded, naming `what`).
inline bool waitFlags(Failures& f, const std::atomic<uint64_t>* flags, int nRanks, int r, int cta,
                      uint64_t epoch, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int k = 0; k < nRanks; ++k) {
    while (flags[static_cast<size_t>(k) * mkernel::coll::kLaunchMaxCtas + static_cast<size_t>(cta)]
               .load(std::memory_order_acquire) < epoch) {
      if (f.stop) return false;
      if (std::chrono::steady_clock::now() > deadline) {
        f.fail("rank " + std::to_string(r) + " CTA " + std::to_string(cta) + " op " +
               std::to_string(epoch) + ": rank " + std::to_string(k) + " never reached the " +
               what + " flag");
        return false;
      }
      std::this_thread::yield();
    }
  }
  return true;
}

// Runs body(i) on n threads and joins them.
inline void runThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
  for (auto& t : threads) t.join();
}

}  // namespace launchsim
