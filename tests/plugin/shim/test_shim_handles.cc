// The shim's handles on the CPU (plugin/shim/shim_comm.cc, real_nccl.h; docs/SHIM.md, "Handles"):
// the side table that maps the real NCCL communicator the application holds to mkernel's state,
// and what the real NCCL sees. The shim's sources are linked into this executable and exported
// from it; the real NCCL is a stand-in (fake_nccl.cc, 2.30.7, through MKERNEL_NCCL_LIBRARY), whose
// calls to its own names through its PLT land in the shim, as NCCL's do under LD_PRELOAD.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "common/param.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/real_nccl.h"
#include "plugin/shim/shim_comm.h"
#include "tests/plugin/shim/stand_in_comm.h"
#include "plugin/shim/shim_init.h"

namespace {

using mkernel::Result;
using mkernel::shim::CommState;
using mkernel::shim::findShimComm;
using mkernel::shim::ShimComm;

// The stand-in NCCL the shim loaded, and its hooks.
void* fakeLib() {
  static void* h = [] {
    const mkernel::shim::RealNccl& real = mkernel::shim::realNccl(true);
    INFO(real.why);
    REQUIRE(real.available);
    const char* path = std::getenv("MKERNEL_NCCL_LIBRARY");
    REQUIRE(path != nullptr);
    return dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  }();
  REQUIRE(h != nullptr);
  return h;
}

template <typename Fn>
Fn hook(const char* name) {
  Fn f = reinterpret_cast<Fn>(dlsym(fakeLib(), name));
  INFO(name);
  REQUIRE(f != nullptr);
  return f;
}

// A communicator as the shim makes it outside emulation: the stand-in NCCL's comm is the handle.
ShimComm* realComm(int rank, int nRanks) {
  const mkernel::shim::RealNccl& real = mkernel::shim::realNccl(true);
  REQUIRE(real.available);
  ncclUniqueId id{};
  ncclComm_t h = nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  REQUIRE(real.ncclCommInitRankConfig(&h, nRanks, id, rank, &cfg) == ncclSuccess);
  ShimComm* c = mkernel::shim::newShimComm();
  c->rank = rank;
  c->nRanks = nRanks;
  c->real = h;
  mkernel::shim::bindHandle(c, h);
  c->state.store(CommState::Ready);
  return c;
}

// What the destroy hook saw: the comm NCCL destroyed, and whether the side table still held it.
std::atomic<void*> gDestroyed{nullptr};
std::atomic<int> gStillInTable{-1};
void onDestroy(void* comm) {
  gDestroyed.store(comm);
  gStillInTable.store(findShimComm(comm) != nullptr ? 1 : 0);
}

}  // namespace

TEST_CASE(
    "side table: a bound handle finds its comm; NULL, unknown and unbound handles find none") {
  ShimComm* c = mkernel::shim::newShimComm();
  const ncclComm_t h = mkernel::shim::newStandInHandle();
  CHECK(findShimComm(h) == nullptr);
  mkernel::shim::bindHandle(c, h);
  CHECK(c->handle() == h);
  CHECK(findShimComm(h) == c);
  CHECK(findShimComm(nullptr) == nullptr);
  int unknown = 0;  // an address the table never held
  CHECK(findShimComm(&unknown) == nullptr);
  // A stale entry for an address (NCCL destroyed that comm without the shim) is replaced, and said.
  ShimComm* next = mkernel::shim::newShimComm();
  {
    mktest::StderrCapture cap;
    mkernel::shim::bindHandle(next, h);
    const std::string out = cap.text();
    INFO(out);
    CHECK(out.find("the side table still held it for an earlier communicator") !=
          std::string::npos);
  }
  CHECK(findShimComm(h) == next);
  mkernel::shim::unbindHandle(c);  // no longer c's: nothing happens
  CHECK(findShimComm(h) == next);
  mkernel::shim::unbindHandle(next);
  CHECK(findShimComm(h) == nullptr);
}

TEST_CASE(
    "side table: the handle leaves it before NCCL destroys or aborts the comm; the address NCCL "
    "reuses is not "
    "taken for the old comm") {
  hook<void (*)(void (*)(void*))>("fakeNcclSetDestroyHook")(&onDestroy);
  for (bool abortive : {false, true}) {
    INFO((abortive ? "ncclCommAbort's release" : "ncclCommDestroy's release"));
    ShimComm* c = realComm(0, 1);
    const ncclComm_t h = c->handle();
    REQUIRE(findShimComm(h) == c);
    gDestroyed.store(nullptr);
    gStillInTable.store(-1);
    c->state.store(abortive ? CommState::Aborted : CommState::Destroyed);
    mkernel::shim::releaseShimComm(c, abortive);
    CHECK(gDestroyed.load() == static_cast<void*>(h));
    CHECK(gStillInTable.load() == 0);  // out of the table when NCCL freed it
    CHECK(c->real == nullptr);
    // The stand-in NCCL hands the freed address out again, as an allocator may: the new comm is
    // NCCL's alone until the shim enters it, never the destroyed one.
    const mkernel::shim::RealNccl& real = mkernel::shim::realNccl(false);
    ncclUniqueId id{};
    ncclComm_t again = nullptr;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    REQUIRE(real.ncclCommInitRankConfig(&again, 1, id, 0, &cfg) == ncclSuccess);
    CHECK(again == h);
    CHECK(findShimComm(again) == nullptr);
    // ... and a call on it reaches NCCL with its handle.
    int before = hook<int (*)()>("fakeNcclAsyncErrorCalls")();
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(again, &async) == ncclSuccess);
    CHECK(async == ncclSuccess);
    CHECK(hook<int (*)()>("fakeNcclAsyncErrorCalls")() == before + 1);
    REQUIRE(real.ncclCommDestroy(again) == ncclSuccess);
  }
  hook<void (*)(void (*)(void*))>("fakeNcclSetDestroyHook")(nullptr);
}

TEST_CASE(
    "side table: an emulated comm's stand-in stays in it after the release, marked destroyed") {
  ShimComm* c = mkernel::shim::newShimComm();
  c->emulate = true;
  mkernel::shim::bindHandle(c, mkernel::shim::newStandInHandle());
  c->state.store(CommState::Destroyed);
  mkernel::shim::releaseShimComm(c, /*abortive=*/false);
  REQUIRE(findShimComm(c->handle()) == c);
  int n = 0;
  CHECK(ncclCommCount(c->handle(), &n) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(c->handle())) ==
        "ncclCommCount : the communicator was destroyed");
  CHECK(ncclCommDestroy(c->handle()) == ncclInvalidArgument);
}

TEST_CASE("side table: lookups from several threads while others enter and remove handles") {
  // Stable comms must always be found; churning handles found either as their own comm or not at
  // all, never as another one. (Under ASan and TSan: scripts/test.sh's sanitizer builds.)
  constexpr int kStable = 64, kChurn = 64, kReaders = 3, kWriters = 2;
  std::vector<ShimComm*> stable, churn;
  std::vector<ncclComm_t> stableH, churnH;
  for (int i = 0; i < kStable; ++i) {
    stable.push_back(mkernel::shim::newShimComm());
    stableH.push_back(mkernel::shim::newStandInHandle());
    mkernel::shim::bindHandle(stable.back(), stableH.back());
  }
  for (int i = 0; i < kChurn; ++i) {
    churn.push_back(mkernel::shim::newShimComm());
    churnH.push_back(mkernel::shim::newStandInHandle());
    churn.back()->appHandle.store(churnH.back());
  }
  std::atomic<bool> stop{false};
  std::atomic<long> lookups{0}, missingStable{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kReaders; ++t)
    threads.emplace_back([&, t] {
      long n = 0;
      for (unsigned i = static_cast<unsigned>(t); !stop.load(std::memory_order_relaxed);
           ++i, n += 2) {
        const size_t s = i % kStable, k = (i * 7u) % kChurn;
        if (findShimComm(stableH[s]) != stable[s]) missingStable.fetch_add(1);
        ShimComm* got = findShimComm(churnH[k]);
        if (got != nullptr && got != churn[k]) wrong.fetch_add(1);
      }
      lookups.fetch_add(n);
    });
  for (int t = 0; t < kWriters; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; !stop.load(std::memory_order_relaxed); ++round)
        for (int k = t; k < kChurn; k += kWriters) {
          if (round % 2 == 0)
            mkernel::shim::bindHandle(churn[static_cast<size_t>(k)],
                                      churnH[static_cast<size_t>(k)]);
          else
            mkernel::shim::unbindHandle(churn[static_cast<size_t>(k)]);
        }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop.store(true);
  for (auto& th : threads) th.join();
  INFO(lookups.load() << " lookups");
  CHECK(lookups.load() > 0);
  CHECK(missingStable.load() == 0);
  CHECK(wrong.load() == 0);
  for (ShimComm* c : stable) mkernel::shim::unbindHandle(c);
  for (ShimComm* c : churn) mkernel::shim::unbindHandle(c);
}

TEST_CASE("side table: the cost of a lookup (printed)") {
  // The lookup every collective makes: one shared lock of one of 16 shards and a hash probe.
  // Measured with 1000 comms in the table, one thread, then two threads on different comms.
  std::vector<ncclComm_t> handles;
  std::vector<ShimComm*> comms;
  for (int i = 0; i < 1000; ++i) {
    comms.push_back(mkernel::shim::newShimComm());
    handles.push_back(mkernel::shim::newStandInHandle());
    mkernel::shim::bindHandle(comms.back(), handles.back());
  }
  auto perLookup = [&](int threads) {
    constexpr long kPerThread = 2000000;
    std::atomic<long> found{0};
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        long n = 0;
        const ncclComm_t h = handles[static_cast<size_t>(t) * 17];  // one comm per thread, as ranks
        for (long i = 0; i < kPerThread; ++i) n += findShimComm(h) != nullptr;
        found.fetch_add(n);
      });
    for (auto& th : ts) th.join();
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
        static_cast<double>(kPerThread);
    CHECK(found.load() == kPerThread * threads);
    return ns;
  };
  const double one = perLookup(1), two = perLookup(2);
  WARN("findShimComm: " << one << " ns per lookup on one thread; " << two
                        << " ns per lookup per thread with two threads on different comms");
  CHECK(one < 1000.0);  // a collective's host cost is microseconds: the lookup must stay far below
  for (ShimComm* c : comms) mkernel::shim::unbindHandle(c);
}

TEST_CASE(
    "re-entry: a call NCCL makes through its own PLT goes back to NCCL, not to the shim's comm") {
  ShimComm* c = realComm(0, 2);
  c->mk.reset(new FailedComm("a stand-in failure"));
  const ncclComm_t h = c->handle();
  // The application's call: the shim's answer (mkernel's communicator has failed).
  ncclResult_t async = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(h, &async) == ncclSuccess);
  CHECK(async == ncclRemoteError);
  // NCCL's own call (its enqueue asking its comm): NCCL's answer.
  const int before = hook<int (*)()>("fakeNcclAsyncErrorCalls")();
  async = ncclInternalError;
  REQUIRE(hook<ncclResult_t (*)(ncclComm_t, ncclResult_t*)>("fakeNcclReenterAsyncError")(
              h, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);
  CHECK(hook<int (*)()>("fakeNcclAsyncErrorCalls")() == before + 1);
  c->mk->abort();
  c->mk.reset();
  c->state.store(CommState::Aborted);
  mkernel::shim::releaseShimComm(c, /*abortive=*/true);
}

TEST_CASE(
    "re-entry: a forwarded collective reaches NCCL with NCCL's handle, and NCCL's own calls come "
    "back to it") {
  ShimComm* c = realComm(0, 2);  // no mkernel communicator: every call goes to NCCL
  c->mkUnavailable = "a test";
  const int before = hook<int (*)()>("fakeNcclAllReduceCalls")();
  float x = 1.0f;
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, c->handle(), nullptr) == ncclSuccess);
  CHECK(hook<int (*)()>("fakeNcclAllReduceCalls")() == before + 1);
  CHECK(hook<int (*)()>("fakeNcclReentered")() == ncclSuccess);
  CHECK(c->forwarded[4].load() == 1);  // AllReduce, counted as forwarded
  // Inside a group the shim opens NCCL's group at once and closes it at the end.
  const int depth = hook<int (*)()>("fakeNcclGroupDepth")();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(hook<int (*)()>("fakeNcclGroupDepth")() == depth + 1);
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, c->handle(), nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  CHECK(hook<int (*)()>("fakeNcclGroupDepth")() == depth);
  c->state.store(CommState::Destroyed);
  mkernel::shim::releaseShimComm(c, /*abortive=*/false);
  CHECK(findShimComm(c->handle()) == nullptr);
}

TEST_CASE("custom ops: the number the application gets is NCCL's, and NCCL gets it back") {
  ShimComm* c = realComm(0, 2);
  c->mkUnavailable = "a test";
  float scalar = 0.5f;
  ncclRedOp_t op = ncclSum;
  REQUIRE(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c->handle()) ==
          ncclSuccess);
  CHECK(static_cast<int>(op) >=
        ncclNumOps + 7);  // the stand-in NCCL numbers its ops from ncclNumOps + 7
  {
    std::lock_guard<std::mutex> lock(c->opsMutex);
    const size_t ix = static_cast<size_t>(static_cast<int>(op) - ncclNumOps);
    REQUIRE(ix < c->ops.size());
    CHECK(c->ops[ix].live);
    CHECK(c->ops[ix].scalar == 0.5);
  }
  float x = 1.0f;
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, op, c->handle(), nullptr) == ncclSuccess);
  CHECK(hook<int (*)()>("fakeNcclLastOp")() == static_cast<int>(op));  // forwarded as it came
  CHECK(ncclAllReduce(&x, &x, 1, ncclHalf, op, c->handle(), nullptr) ==
        ncclInvalidArgument);  // its dtype only
  REQUIRE(ncclRedOpDestroy(op, c->handle()) == ncclSuccess);
  CHECK(hook<int (*)()>("fakeNcclLastOp")() == static_cast<int>(op));
  CHECK(ncclRedOpDestroy(op, c->handle()) == ncclInvalidArgument);  // no longer in mkernel's table
  c->state.store(CommState::Destroyed);
  mkernel::shim::releaseShimComm(c, /*abortive=*/false);
}

TEST_CASE("unique ids: the shim's id carries the real NCCL's, which the shim takes out again") {
  ncclUniqueId id{};
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclUniqueId real{};
  REQUIRE(mkernel::shim::realIdOf(id, &real));
  CHECK(std::string(real.internal, 12) == "fake-nccl-id");
  // An NCCL id that uses more than the room beside mkernel's does not fit.
  ncclUniqueId big{};
  big.internal[100] = 1;
  CHECK_FALSE(mkernel::shim::embedRealId(&id, big));
  ncclUniqueId plain{};
  CHECK_FALSE(mkernel::shim::realIdOf(plain, &real));
}
