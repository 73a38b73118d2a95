#include "plugin/shim/shim_comm.h"

#include <cstdlib>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collectives/stats.h"
#include "common/log.h"
#include "common/param.h"
#include "common/singleton.h"
#include "plugin/shim/real_nccl.h"

namespace mkernel {
namespace shim {
namespace {

// The side table: handle -> ShimComm, in shards (each its own read-mostly lock and map) so that
// threads running collectives on different communicators do not share one lock's cache line.
// Never destroyed: entries may run during exit.
class SideTable {
 public:
  static constexpr size_t kShards = 16;
  ShimComm* find(const void* h) {
    Shard& s = shard(h);
    std::shared_lock<std::shared_mutex> lock(s.mu);
    auto it = s.map.find(h);
    return it == s.map.end() ? nullptr : it->second;
  }
  // Returns the ShimComm the handle mapped to before (nullptr if none).
  ShimComm* insert(const void* h, ShimComm* c) {
    Shard& s = shard(h);
    std::unique_lock<std::shared_mutex> lock(s.mu);
    ShimComm*& slot = s.map[h];
    ShimComm* before = slot;
    slot = c;
    return before;
  }
  void erase(const void* h, const ShimComm* c) {
    Shard& s = shard(h);
    std::unique_lock<std::shared_mutex> lock(s.mu);
    auto it = s.map.find(h);
    if (it != s.map.end() && it->second == c) s.map.erase(it);
  }

 private:
  struct alignas(64) Shard {
    std::shared_mutex mu;
    std::unordered_map<const void*, ShimComm*> map;
  };
  static size_t index(const void* h) {
    // NCCL's comms and the stand-ins are heap allocations: mix the bits above the alignment.
    uint64_t x = reinterpret_cast<uintptr_t>(h) >> 4;
    x ^= x >> 17;
    x *= 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(x >> 60) % kShards;
  }
  Shard& shard(const void* h) { return shards_[index(h)]; }
  Shard shards_[kShards];
};
SideTable& sideTable() {
  static SideTable* t = new SideTable;
  return *t;
}

// Every shell ever made (ShimComms are never freed): destroyShimComm's search for co-members.
struct Shells {
  std::mutex mu;
  std::vector<ShimComm*> all;
};
Shells& shells() {
  static Shells* s = new Shells;
  return *s;
}

// A stand-in's memory: what it holds is never read (the handle is only a key).
struct StandIn {
  uint64_t tag = 0x6e6974736b6d2eull;  // ".mkstin", for whoever looks at one in a debugger
};

// Releases that outlived their grace period (destroyShimComm). Never destroyed: a release thread
// may still be finishing while the process exits, and it uses the mutex and the condition.
struct Reaper {
  std::mutex mu;
  std::condition_variable cv;
  struct Job {
    ShimComm* comm;
    std::thread thread;
    bool done = false;
  };
  std::vector<std::unique_ptr<Job>> jobs;

  // Process exit or library unload: nobody will come for those peers now. Stop their waits and
  // give the releases a moment. Returns true when every release finished (their threads are
  // joined: the Reaper may go); otherwise never joins (joining a thread that is inside CUDA while
  // the process tears CUDA down can deadlock), and the rest ends with the process.
  bool abortPending() {
    std::unique_lock<std::mutex> lock(mu);
    for (auto& j : jobs) {
      if (j->done) continue;
      // The release thread may be destroying them right now: only what it has not taken out yet.
      std::lock_guard<std::mutex> teardown(j->comm->teardownMu);
      if (const std::shared_ptr<coll::Communicator> mk = kernelOf(j->comm)) mk->abort();
      if (j->comm->bootstrap) j->comm->bootstrap->abort();
    }
    const bool allDone = cv.wait_for(lock, std::chrono::seconds(5), [this] {
      for (auto& j : jobs)
        if (!j->done) return false;
      return true;
    });
    for (auto& j : jobs) {
      if (!j->thread.joinable()) continue;
      if (allDone)
        j->thread.join();  // done: only its return is left
      else
        j->thread.detach();
    }
    return allDone;
  }
};
// Created by the first background release.
LazySingleton<Reaper> gReaper;
// Process exit or unload: aborts and reaps what is still pending, once. Never creates the Reaper
// (a library that released nothing in the background has none); frees it when every release
// finished, so that a dlopen/dlclose cycle leaves nothing behind.
std::atomic<bool> gReaped{false};
void reapAtExit() {
  if (gReaped.exchange(true)) return;
  Reaper* r = gReaper.peek();
  if (r != nullptr && r->abortPending()) gReaper.destroy();
}
// It should run while CUDA is still up: the releases free CUDA memory, and abortPending() writes
// into their pinned control blocks. As a static destructor alone it runs from _dl_fini, after
// every exit handler (an LD_PRELOAD library's destructors are registered before the program's
// own start-up registers _dl_fini; a core dump shows it there). Exit handlers run in the
// reverse order of their registration, so it is registered with atexit when the first background
// release begins (CUDA is up by then: the communicator used it) and runs from exit() before any
// handler registered earlier, CUDA's among them. atexit in a shared library also runs at dlclose.
// (What it cannot help: an application that resets the device while releases still run;
// destroyShimComm makes the last member's destroy wait for them.)
std::once_flag gAtExitOnce;
Reaper& reaper() {
  std::call_once(gAtExitOnce, [] {
    if (std::atexit(reapAtExit) != 0)
      MK_WARN(
          "shim: atexit refused the release reaper; releases still pending at exit are aborted "
          "late");
  });
  return gReaper.get();
}
// The fallback, for a registration that failed: a no-op once reapAtExit ran.
struct ReaperAtExit {
  ~ReaperAtExit() { reapAtExit(); }
} gReaperAtExit;
constexpr auto kDestroyGrace = std::chrono::seconds(2);
// How long the last member's destroy waits for the others' releases once past the barrier.
constexpr auto kSiblingGrace = std::chrono::seconds(10);

// Joins and drops the finished releases. Under r.mu.
void reapDone(Reaper& r) {
  for (auto it = r.jobs.begin(); it != r.jobs.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = r.jobs.erase(it);
    } else {
      ++it;
    }
  }
}

enum class FailureSource : int { None, Shim, Real };
std::atomic<FailureSource> gLastFailure{FailureSource::None};
std::atomic<int> gLastShimFailure{ncclSuccess};  // the code of the shim's last failure

}  // namespace

const char* commStateName(CommState s) {
  switch (s) {
    case CommState::Initializing:
      return "initializing";
    case CommState::Ready:
      return "ready";
    case CommState::InitFailed:
      return "failed to initialize";
    case CommState::Finalized:
      return "finalized";
    case CommState::Revoked:
      return "revoked";
    case CommState::Destroyed:
      return "destroyed";
    case CommState::Aborted:
      return "aborted";
  }
  return "?";
}

ShimComm* newShimComm() {
  ShimComm* c = new ShimComm;
  const char* check = std::getenv("NCCL_CHECK_POINTERS");
  c->checkPointers = check != nullptr && std::atoi(check) == 1;
  Shells& s = shells();
  std::lock_guard<std::mutex> lock(s.mu);
  s.all.push_back(c);
  return c;
}

ncclComm_t newStandInHandle() {
  return reinterpret_cast<ncclComm_t>(new StandIn);  // never freed: its address is never reused
}

void bindHandle(ShimComm* c, ncclComm_t handle) {
  c->appHandle.store(handle, std::memory_order_release);
  ShimComm* stale = sideTable().insert(handle, c);
  if (stale != nullptr && stale != c)
    MK_WARN(
        "shim: comm %p: the side table still held it for an earlier communicator (rank %d/%d, %s): "
        "NCCL "
        "destroyed that one without the shim (a call that bypassed it?); the entry now names the "
        "new one",
        static_cast<void*>(handle), stale->rank, stale->nRanks, commStateName(stale->state.load()));
}

void unbindHandle(ShimComm* c) {
  const ncclComm_t h = c->handle();
  if (h != nullptr) sideTable().erase(h, c);
}

ShimComm* findShimComm(const void* handle) {
  if (handle == nullptr) return nullptr;
  return sideTable().find(handle);
}

void announceReady(ShimComm* c) {
  const ncclComm_t h = c->handle();
  if (h == nullptr || c->state.load(std::memory_order_acquire) != CommState::Ready) return;
  MK_INFO(kLogInit, "shim: comm %p rank %d/%d on device %d ready (%s%s)", static_cast<void*>(h),
          c->rank, c->nRanks, c->cudaDev, kernelOf(c) ? "mkernel" : "NCCL only",
          c->emulate ? ", emulated" : "");
}

void releaseKernelPart(ShimComm* c, bool abortive) {
  if (std::shared_ptr<coll::Communicator> mk = kernelOf(c)) {
    if (abortive) {
      keepCommStats(c);
      mk->abort();  // first: a call blocked inside it (a free slot, a peer) returns now
    } else {
      Result r = mk->finalize();
      if (r != Result::Success)
        MK_WARN("shim: rank %d: finalizing the mkernel communicator failed (%s); aborting it",
                c->rank, resultString(r));
      if (r != Result::Success) mk->abort();
      keepCommStats(c);  // after the finalize: it counted every collective posted
    }
    {
      std::lock_guard<std::mutex> teardown(
          c->teardownMu);  // the exit handler may abort it meanwhile
      takeKernel(c);
    }
    // The last reference destroys it: here, or in a call still inside it (runCall), when it
    // returns.
    mk.reset();
  }
  if (c->bootstrap) {
    if (abortive) c->bootstrap->abort();
    std::unique_ptr<bootstrap::Bootstrap> gone;
    {
      std::lock_guard<std::mutex> teardown(c->teardownMu);
      gone = std::move(c->bootstrap);
    }
    gone.reset();
  }
}

void releaseShimComm(ShimComm* c, bool abortive) {
  releaseKernelPart(c, abortive);
  if (c->real != nullptr) {
    // Out of the side table first: once NCCL frees the comm, its address may come back as another
    // communicator's, which must not be taken for this one. Calls NCCL makes back into the shim
    // while it tears the comm down come from NCCL's code and go straight back to it.
    unbindHandle(c);
    const RealNccl& real = realNccl(false);
    if (real.available) {
      ncclResult_t r = abortive ? real.ncclCommAbort(c->real) : real.ncclCommDestroy(c->real);
      if (r != ncclSuccess)
        MK_WARN("shim: rank %d: the real NCCL's %s returned %d", c->rank,
                abortive ? "ncclCommAbort" : "ncclCommDestroy", static_cast<int>(r));
    }
    c->real = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(c->opsMutex);
    c->ops.clear();
  }
  // c->policy stays: it is immutable, and a call racing with destruction may still read it.
  printCommStats(c);
}

void noteCrossHostFallback(ShimComm* c, int rank) {
  c->mkUnavailable = "ranks on " + std::to_string(c->nNodes) + " hosts and MKERNEL_MULTI_NODE=0";
  // A user who preloaded mkernel expects it to run: the first time at WARN, then at INFO.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    MK_WARN(
        "shim: rank %d: %s: mkernel runs on one host only unless MKERNEL_MULTI_NODE=1; every call "
        "of this "
        "communicator goes to NCCL (said once; later communicators at INFO)",
        rank, c->mkUnavailable.c_str());
  else
    MK_INFO(kLogInit, "shim: rank %d: %s; every call goes to NCCL", rank, c->mkUnavailable.c_str());
}

void keepCommStats(ShimComm* c) {
  const std::shared_ptr<coll::Communicator> mk = kernelOf(c);
  if (!mk || c->haveFinalStats || !params::STATS()) return;
  mk->stats(&c->finalStats);
  c->haveFinalStats = true;
}

void printCommStats(ShimComm* c) {
  const CommState s = c->state.load();
  if (s != CommState::Destroyed && s != CommState::Aborted)
    return;  // a failed creation has no summary
  if (!params::STATS() || c->statsPrinted.exchange(true)) return;
  uint64_t fwd[coll::kNumCollTypes];
  for (int i = 0; i < coll::kNumCollTypes; ++i)
    fwd[i] = c->forwarded[i].load(std::memory_order_relaxed);
  const std::string line = coll::commStatsLine(c->haveFinalStats ? &c->finalStats : nullptr, fwd,
                                               c->mkUnavailable.c_str());
  logRequested("STATS", "comm %p rank %d/%d%s%s: %s", static_cast<void*>(c->handle()), c->rank,
               c->nRanks, c->emulate ? " (emulated)" : "",
               s == CommState::Aborted ? " (aborted)" : "", line.c_str());
}

void destroyShimComm(ShimComm* c) {
  if (!kernelOf(c)) {  // nothing that waits for peers
    releaseShimComm(c, /*abortive=*/false);
    return;
  }
  std::vector<CommState> coMembers;
  {
    Shells& all = shells();
    std::lock_guard<std::mutex> lock(all.mu);
    for (const ShimComm* o : all.all)
      if (o != c && o->idHash == c->idHash)
        coMembers.push_back(
            o->state.load());  // seq_cst: of two racing destroys, the later sees the earlier
  }
  const bool wait = destroyWaitsForRelease(coMembers);
  Reaper& r = reaper();
  auto job = std::unique_ptr<Reaper::Job>(new Reaper::Job{c, std::thread(), false});
  Reaper::Job* j = job.get();
  std::unique_lock<std::mutex> lock(r.mu);
  try {
    j->thread = std::thread([&r, j] {
      (void)cudaSetDevice(
          j->comm->cudaDev);  // the kernel's and NCCL's teardown use the current device
      releaseShimComm(j->comm, /*abortive=*/false);
      std::lock_guard<std::mutex> guard(r.mu);
      j->done = true;
      r.cv.notify_all();
    });
  } catch (const std::exception& e) {
    lock.unlock();
    MK_WARN("shim: rank %d: no thread for the release (%s); releasing inline", c->rank, e.what());
    releaseShimComm(c, /*abortive=*/false);
    return;
  }
  if (wait && r.cv.wait_for(lock, kDestroyGrace, [j] { return j->done; })) {
    // The last member of this communicator in this process. Its release passed the finalize
    // barrier, so every other member's release (in the background, since this one was still live
    // then) is past it too and ends soon: wait for them as well, so that nothing of the
    // communicator is left when this returns. Applications free their buffers and may even reset
    // the device right after destroying their communicators (nccl-tests calls cudaDeviceReset(),
    // which would unmap the control blocks under releases still running: SIGSEGV at exit).
    const uint64_t id = c->idHash;
    auto siblingsDone = [&r, id] {
      for (auto& o : r.jobs)
        if (!o->done && o->comm->idHash == id) return false;
      return true;
    };
    if (!r.cv.wait_for(lock, kSiblingGrace, siblingsDone))
      MK_WARN(
          "shim: rank %d: ncclCommDestroy returns while releases of other ranks of this "
          "communicator in this "
          "process still run after %lld s; they complete in the background",
          c->rank, static_cast<long long>(kSiblingGrace.count()));
    reapDone(r);
    lock.unlock();
    j->thread.join();
    return;
  }
  if (wait && static_cast<int>(coMembers.size()) + 1 == c->nRanks) {
    // Every rank is in this process and destroyed: no peer is left to wait for, so the release is
    // held inside a CUDA call (e.g. a free, waiting for another communicator's kernel while
    // that kernel waits for a thread held behind the free; docs/RELIABILITY.md).
    MK_WARN(
        "shim: rank %d: ncclCommDestroy returns after %lld s with the release unfinished, though "
        "every rank of "
        "this communicator is in this process and destroyed: a CUDA call in it is waiting for the "
        "GPU (a kernel "
        "of another communicator still waiting for its peers?); it completes in the background",
        c->rank, static_cast<long long>(kDestroyGrace.count()));
  } else {
    MK_INFO(kLogInit,
            "shim: rank %d: ncclCommDestroy returns%s; the release completes when the peers "
            "destroy theirs",
            c->rank,
            wait ? "" : " at once (members of this communicator in this process are still live)");
  }
  r.jobs.push_back(std::move(job));
  reapDone(r);  // now and then, so that the list stays short
}

ncclResult_t toNccl(Result r) {
  if (r != Result::Success && r != Result::InProgress) {
    gLastShimFailure.store(static_cast<int>(r), std::memory_order_relaxed);
    gLastFailure.store(FailureSource::Shim, std::memory_order_relaxed);
  }
  return static_cast<ncclResult_t>(r);
}

ncclResult_t fromReal(ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress)
    gLastFailure.store(FailureSource::Real, std::memory_order_relaxed);
  return r;
}

bool lastFailureWasOurs() {
  return gLastFailure.load(std::memory_order_relaxed) != FailureSource::Real;
}

bool failureIsMkernels(ncclResult_t r) {
  return gLastFailure.load(std::memory_order_relaxed) == FailureSource::Shim &&
         gLastShimFailure.load(std::memory_order_relaxed) == static_cast<int>(r);
}

}  // namespace shim
}  // namespace mkernel
