// ncclCommAbort from another thread while a thread is inside a collective of the same comm, as
// PyTorch's watchdog does while a rank waits for a stopped peer (docs/SHIM.md, "Abort"): the abort
// returns at once, the collective returns an error, and the mkernel communicator is destroyed only
// once the collective has let go of it (no use after free: the ASan and TSan tiers run this). The
// shim's sources are linked in, with a stand-in mkernel communicator whose enqueue blocks until it
// is aborted, as KernelCommunicator's does while it waits for a free slot. No GPU.
#include "tests/catch.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/policy.h"
#include "common/log.h"
#include "common/result.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/shim_comm.h"
#include "tests/plugin/shim/stand_in_comm.h"

using mkernel::Result;

namespace {

// One clock for the events the test orders: each event takes the next tick.
std::atomic<int> gClock{0};

class BlockingComm final : public StandInComm {
 public:
  BlockingComm(std::atomic<int>* returnedAt, std::atomic<int>* destroyedAt)
      : returnedAt_(returnedAt), destroyedAt_(destroyedAt), payload_(4096, 7) {}
  ~BlockingComm() override {
    destroyedAt_->store(++gClock);
    payload_.assign(payload_.size(), -1);
  }
  mkernel::Result enqueue(const mkernel::coll::CollArgs*, int, cudaStream_t) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return aborted_; });
    lock.unlock();
    // What KernelCommunicator does after its wait: reads its own state. A destroyed object here
    // is a use after free (ASan) and the poison below.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    long sum = 0;
    for (int v : payload_) sum += v;
    returnedAt_->store(++gClock);
    if (sum != 7L * 4096)
      return MK_ERROR(Result::InternalError, "the communicator was destroyed under the call");
    return MK_ERROR(Result::RemoteError, "rank 0: communicator aborted (a stand-in)");
  }
  bool waitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [this] { return entered_; });
  }
  mkernel::Result abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
    return Result::Success;
  }

 private:
  std::atomic<int>* returnedAt_;
  std::atomic<int>* destroyedAt_;
  std::vector<int> payload_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool aborted_ = false;
};

// An emulated two-rank shim comm (no real NCCL behind it) whose mkernel part is `mk`.
mkernel::shim::ShimComm* emulatedComm(BlockingComm* mk) {
  mkernel::shim::ShimComm* c = mkernel::shim::newShimComm();
  mkernel::shim::bindHandle(c, mkernel::shim::newStandInHandle());
  c->rank = 0;
  c->nRanks = 2;
  c->emulate = true;
  mkernel::coll::PolicyConfig pc;
  REQUIRE(mkernel::coll::loadPolicyConfig(&pc) == Result::Success);
  pc.emulate = true;
  c->policy.reset(new mkernel::coll::SelectionPolicy(pc));
  mkernel::shim::setKernel(c, std::shared_ptr<mkernel::coll::Communicator>(mk));
  c->state.store(mkernel::shim::CommState::Ready);
  return c;
}

}  // namespace

TEST_CASE(
    "abort: ncclCommAbort while another thread is inside a collective returns at once, and frees "
    "after it") {
  std::atomic<int> returnedAt{0}, destroyedAt{0};
  BlockingComm* mk = new BlockingComm(&returnedAt, &destroyedAt);
  mkernel::shim::ShimComm* c = emulatedComm(mk);
  const ncclComm_t h = c->handle();
  std::vector<float> buf(16, 1.0f);
  ncclResult_t collResult = ncclSuccess;
  std::thread caller([&] {
    collResult = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, h, nullptr);
  });
  REQUIRE(mk->waitEntered());
  const auto t0 = std::chrono::steady_clock::now();
  const ncclResult_t abortResult = ncclCommAbort(h);
  const double abortS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  caller.join();
  CHECK(abortResult == ncclSuccess);
  CHECK(abortS < 1.0);
  // The collective saw the abort as an error, and the communicator outlived the call.
  CHECK(collResult == ncclRemoteError);
  CHECK(returnedAt.load() > 0);
  CHECK(destroyedAt.load() > returnedAt.load());
  // The handle is gone: a second abort or a collective is an invalid argument, as in NCCL.
  CHECK(ncclCommAbort(h) == ncclInvalidArgument);
}

TEST_CASE(
    "abort: a collective queued in a group on a comm aborted before ncclGroupEnd fails the group") {
  std::atomic<int> returnedAt{0}, destroyedAt{0};
  BlockingComm* mk = new BlockingComm(&returnedAt, &destroyedAt);
  mkernel::shim::ShimComm* c = emulatedComm(mk);
  const ncclComm_t h = c->handle();
  std::vector<float> buf(16, 1.0f);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, h, nullptr) ==
          ncclSuccess);
  ncclResult_t abortResult = ncclInternalError;
  std::thread aborter(
      [&] { abortResult = ncclCommAbort(h); });  // another thread: not inside the group
  aborter.join();
  CHECK(abortResult == ncclSuccess);
  CHECK(destroyedAt.load() > 0);  // nothing held it: destroyed by the abort
  const ncclResult_t groupResult = ncclGroupEnd();
  CHECK(groupResult == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(nullptr)).find("aborted inside the group") !=
        std::string::npos);
  CHECK(returnedAt.load() == 0);  // its enqueue never ran
}
