// plugin/shim/shim_group.cc on the CPU, with communicators that record what they are asked:
// the order in which ncclGroupEnd posts collected collectives. Fenced communicators (thread ranks
// sharing a GPU, collectives/runtime/post_fence.h) must be posted in lockstep, every such rank's
// k-th start before any rank's k-th completion and before any (k+1)-th start, whatever the order of
// the calls; the others get one enqueue per run of ops on one stream, in call order.
#include "tests/catch.h"

#include <mutex>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_group.h"

namespace {

using mkernel::Result;
using mkernel::coll::CollArgs;
using mkernel::coll::CollStats;
using mkernel::coll::CommOptions;

std::mutex gMu;
std::vector<std::string> gLog;
void note(const std::string& s) {
  std::lock_guard<std::mutex> lock(gMu);
  gLog.push_back(s);
}

// Records each call as "<name>:<what>[:<count>...]"; enqueueStart answers `startResult`.
class Recorder final : public mkernel::coll::Communicator {
 public:
  Recorder(std::string name, bool fenced, Result startResult = Result::Success)
      : name_(std::move(name)), fenced_(fenced), startResult_(startResult) {}
  Result enqueue(const CollArgs* ops, int n, cudaStream_t) override {
    std::string s = name_ + ":enqueue";
    for (int i = 0; i < n; ++i) s += ":" + std::to_string(ops[i].count);
    note(s);
    return Result::Success;
  }
  bool fenced() const override { return fenced_; }
  Result enqueueStart(const CollArgs& op, cudaStream_t) override {
    note(name_ + ":start:" + std::to_string(op.count));
    return startResult_;
  }
  Result completeStarts() override {
    note(name_ + ":complete");
    return Result::Success;
  }
  Result asyncError(bool) override { return Result::Success; }
  Result abort() override { return Result::Success; }
  Result finalize() override { return Result::Success; }
  const CommOptions& options() const override { return opts_; }
  void stats(CollStats*) const override {}
  Result kernelTrace(std::vector<uint64_t>*) const override { return Result::InvalidUsage; }

 private:
  std::string name_;
  bool fenced_;
  Result startResult_;
  CommOptions opts_;
};

mkernel::shim::ShimComm* comm(const std::string& name, bool fenced,
                              Result startResult = Result::Success) {
  mkernel::shim::ShimComm* c = mkernel::shim::newShimComm();
  c->mk.reset(new Recorder(name, fenced, startResult));
  c->state.store(mkernel::shim::CommState::Ready);
  return c;
}

CollArgs op(size_t count) {
  CollArgs a{};
  a.count = count;
  return a;
}

}  // namespace

TEST_CASE(
    "shim group: fenced ranks driven by one thread are posted in lockstep, the others batched") {
  using namespace mkernel::shim;
  ShimComm* a = comm("A", true);
  ShimComm* b = comm("B", true);
  ShimComm* c = comm("C", false);
  cudaStream_t s1 = reinterpret_cast<cudaStream_t>(0x10), s2 = reinterpret_cast<cudaStream_t>(0x20);
  {
    std::lock_guard<std::mutex> lock(gMu);
    gLog.clear();
  }
  groupStart();
  // Rank by rank, as an application that loops over its ranks writes it: A has three
  // collectives, B two, C three (the last on another stream).
  for (size_t k = 1; k <= 3; ++k) groupAddKernelOp(a, op(10 + k), s1);
  for (size_t k = 1; k <= 2; ++k) groupAddKernelOp(b, op(20 + k), s1);
  groupAddKernelOp(c, op(31), s1);
  groupAddKernelOp(c, op(32), s1);
  groupAddKernelOp(c, op(33), s2);
  REQUIRE(groupEnd() == ncclSuccess);
  const std::vector<std::string> want = {
      "A:start:11",      "B:start:21",   "A:complete", "B:complete",  // round 1
      "A:start:12",      "B:start:22",   "A:complete", "B:complete",  // round 2
      "A:start:13",      "A:complete",                                // round 3: A alone
      "C:enqueue:31:32", "C:enqueue:33",  // unfenced: one enqueue per stream run
  };
  std::lock_guard<std::mutex> lock(gMu);
  CHECK(gLog == want);
}

TEST_CASE(
    "shim group: a fenced communicator's failed start still gets its completion, and the group "
    "fails") {
  using namespace mkernel::shim;
  ShimComm* f = comm("F", true, Result::RemoteError);
  ShimComm* a = comm("A", true);
  {
    std::lock_guard<std::mutex> lock(gMu);
    gLog.clear();
  }
  groupStart();
  groupAddKernelOp(f, op(1), nullptr);
  groupAddKernelOp(a, op(2), nullptr);
  CHECK(groupEnd() == ncclRemoteError);
  const std::vector<std::string> want = {"F:start:1", "A:start:2", "F:complete", "A:complete"};
  std::lock_guard<std::mutex> lock(gMu);
  CHECK(gLog == want);
}
