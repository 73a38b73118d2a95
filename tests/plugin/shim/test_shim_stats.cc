// MKERNEL_STATS=1 on the CPU: the line a shim communicator leaves at ncclCommDestroy and
// ncclCommAbort (plugin/shim/shim_comm.cc: keepCommStats, printCommStats; the text is
// collectives/runtime/stats.cc's commStatsLine), with a stand-in mkernel Communicator reporting
// fixed counters, as the persistent-kernel communicator reports its own.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/stats.h"
#include "common/param.h"
#include "plugin/shim/shim_comm.h"

namespace {

using mktest::StderrCapture;

using mkernel::Result;
using mkernel::coll::CollArgs;
using mkernel::coll::CollStats;
using mkernel::coll::CommOptions;
using mkernel::shim::CommState;
using mkernel::shim::ShimComm;

// Broadcast 2 (persistent kernel), AllGather 5 (launch path), AllReduce 10 (8 launch path, 2
// persistent kernel, 1 of them a ring); 6 in LL mode, 2 of those batched; 3 kernel launches.
CollStats fixedStats() {
  CollStats st;
  st.kernelOps[0] = 2;
  st.kernelOps[2] = 5;
  st.kernelOps[4] = 10;
  st.launchOps[2] = 5;
  st.launchOps[4] = 8;
  st.ringOps = 1;
  st.llOps = 6;
  st.llBatchOps = 2;
  st.kernelLaunches = 3;
  return st;
}

class FixedComm final : public mkernel::coll::Communicator {
 public:
  explicit FixedComm(std::atomic<int>* statsCalls) : calls_(statsCalls) {}
  Result enqueue(const CollArgs*, int, cudaStream_t) override { return Result::Success; }
  Result asyncError(bool) override { return Result::Success; }
  Result abort() override { return Result::Success; }
  Result finalize() override { return Result::Success; }
  const CommOptions& options() const override { return opts_; }
  void stats(CollStats* out) const override {
    calls_->fetch_add(1);
    *out = fixedStats();
  }
  Result kernelTrace(std::vector<uint64_t>*) const override { return Result::InvalidUsage; }

 private:
  std::atomic<int>* calls_;
  CommOptions opts_;
};

ShimComm* liveComm(std::atomic<int>* statsCalls, int rank, int nRanks) {
  ShimComm* c = mkernel::shim::newShimComm();
  mkernel::shim::bindHandle(c, mkernel::shim::newStandInHandle());  // the line names the handle
  c->rank = rank;
  c->nRanks = nRanks;
  c->idHash = 0x5700 + static_cast<uint64_t>(rank);
  if (statsCalls != nullptr) c->mk.reset(new FixedComm(statsCalls));
  c->forwarded[4].store(4);  // AllReduce: 4 forwarded to NCCL
  c->state.store(CommState::Ready);
  return c;
}

struct StatsEnv {
  explicit StatsEnv(const char* v) {
    if (v != nullptr)
      setenv("MKERNEL_STATS", v, 1);
    else
      unsetenv("MKERNEL_STATS");
    mkernel::params::resetForTesting();  // the registry reads each setting once
  }
  ~StatsEnv() {
    unsetenv("MKERNEL_STATS");
    mkernel::params::resetForTesting();
  }
};

const char* const kFixedLine =
    "21 collectives: persistent kernel 4 (rings 1), launch path 13 (LL mode 6, of them batched 2; "
    "one-rank copies 0), "
    "forwarded to NCCL 4; persistent-kernel launches 3; mkernel/NCCL: Broadcast 2/0, AllGather "
    "5/0, AllReduce 10/4";

}  // namespace

TEST_CASE("stats line: per path, then mkernel/NCCL per collective that ran") {
  const CollStats st = fixedStats();
  const uint64_t fwd[5] = {0, 0, 0, 0, 4};
  CHECK(mkernel::coll::commStatsLine(&st, fwd, "") == kFixedLine);
}

TEST_CASE("stats line: a communicator without mkernel says why, and what NCCL ran") {
  const uint64_t fwd[5] = {0, 1, 0, 0, 3};
  CHECK(mkernel::coll::commStatsLine(nullptr, fwd, "MKERNEL_DISABLE=1") ==
        "4 collectives: none in mkernel (MKERNEL_DISABLE=1), forwarded to NCCL 4; mkernel/NCCL: "
        "Reduce 0/1, "
        "AllReduce 0/3");
  const uint64_t none[5] = {};
  CHECK(mkernel::coll::commStatsLine(nullptr, none, "") ==
        "0 collectives: none in mkernel (no mkernel communicator), forwarded to NCCL 0");
}

TEST_CASE("stats line: late counter reads are said") {
  CollStats st = fixedStats();
  st.countersLate = 2;
  const uint64_t fwd[5] = {};
  CHECK(mkernel::coll::commStatsLine(&st, fwd, "").find("; 2 late counter read(s)") !=
        std::string::npos);
}

TEST_CASE(
    "MKERNEL_STATS=1: ncclCommDestroy's release prints the communicator's line once, at WARN") {
  StatsEnv on("1");
  std::atomic<int> calls{0};
  ShimComm* c = liveComm(&calls, 1, 2);
  StderrCapture cap;
  c->state.store(CommState::Destroyed);  // as ncclCommDestroy, before the release
  mkernel::shim::destroyShimComm(c);
  mkernel::shim::printCommStats(c);  // a second call prints nothing
  const std::string out = cap.text();
  INFO(out);
  CHECK(calls.load() == 1);
  const std::regex line(
      std::string(R"((^|\n)[^ \n]+:\d+:\d+ MKERNEL STATS comm 0x[0-9a-f]+ rank 1/2: )") +
      std::regex_replace(kFixedLine, std::regex(R"([()\[\];.+*?^$|\\/])"), R"(\$&)") + "\n");
  CHECK(std::regex_search(out, line));
  size_t n = 0;
  for (size_t p = out.find("MKERNEL STATS"); p != std::string::npos;
       p = out.find("MKERNEL STATS", p + 1))
    ++n;
  CHECK(n == 1);
  char named[64];  // the handle the application holds
  std::snprintf(named, sizeof(named),
                "MKERNEL STATS comm %p rank 1/2: ", static_cast<void*>(c->handle()));
  CHECK(out.find(named) != std::string::npos);
}

TEST_CASE("MKERNEL_STATS=1: ncclCommAbort's release says the communicator was aborted") {
  StatsEnv on("1");
  std::atomic<int> calls{0};
  ShimComm* c = liveComm(&calls, 0, 2);
  StderrCapture cap;
  c->state.store(CommState::Aborted);
  mkernel::shim::releaseShimComm(c, /*abortive=*/true);
  const std::string out = cap.text();
  INFO(out);
  CHECK(calls.load() == 1);
  CHECK(out.find("MKERNEL STATS comm ") != std::string::npos);
  CHECK(out.find(" rank 0/2 (aborted): 21 collectives: ") != std::string::npos);
}

TEST_CASE("MKERNEL_STATS=1: a communicator that never had mkernel's says why") {
  StatsEnv on("1");
  ShimComm* c = liveComm(nullptr, 0, 1);
  c->mkUnavailable = "MKERNEL_DISABLE=1";
  StderrCapture cap;
  c->state.store(CommState::Destroyed);
  mkernel::shim::destroyShimComm(c);
  const std::string out = cap.text();
  INFO(out);
  CHECK(
      out.find("rank 0/1: 4 collectives: none in mkernel (MKERNEL_DISABLE=1), forwarded to NCCL 4; "
               "mkernel/NCCL: AllReduce 0/4\n") != std::string::npos);
}

TEST_CASE("MKERNEL_STATS unset or 0: no line, and the counters are not even read") {
  for (const char* v : {static_cast<const char*>(nullptr), "0"}) {
    StatsEnv off(v);
    std::atomic<int> calls{0};
    ShimComm* c = liveComm(&calls, 0, 2);
    StderrCapture cap;
    c->state.store(CommState::Destroyed);
    mkernel::shim::destroyShimComm(c);
    const std::string out = cap.text();
    INFO(out);
    CHECK(out.find("MKERNEL STATS") == std::string::npos);
    CHECK(calls.load() == 0);
  }
}

TEST_CASE("MKERNEL_STATS=1: a creation that failed leaves no line") {
  StatsEnv on("1");
  std::atomic<int> calls{0};
  ShimComm* c = liveComm(&calls, 0, 2);
  c->state.store(CommState::Initializing);  // setupComm releases a failed comm before InitFailed
  StderrCapture cap;
  mkernel::shim::releaseShimComm(c, /*abortive=*/true);
  CHECK(cap.text().find("MKERNEL STATS") == std::string::npos);
}
