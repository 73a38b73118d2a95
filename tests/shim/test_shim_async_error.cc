// ncclCommGetAsyncError reports which side failed, as a call's failure does: an error of the
// mkernel communicator makes ncclGetErrorString point at mkernel's log and ncclGetLastError
// return mkernel's message; an error of the real NCCL keeps NCCL's texts. The shim's sources are
// linked in (no libnccl, no GPU), with a stand-in mkernel communicator that has failed.
#include "tests/catch.h"

#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/result.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/shim_comm.h"

namespace {

using mkernel::Result;
using mkernel::coll::CollArgs;
using mkernel::coll::CollStats;
using mkernel::coll::CommOptions;

class FailedComm final : public mkernel::coll::Communicator {
 public:
  Result enqueue(const CollArgs*, int, cudaStream_t) override { return Result::Success; }
  Result asyncError(bool) override {
    return MK_ERROR(Result::RemoteError, "rank 0: peer 1 is gone (a stand-in failure)");
  }
  Result abort() override { return Result::Success; }
  Result finalize() override { return Result::Success; }
  const CommOptions& options() const override { return opts_; }
  void stats(CollStats*) const override {}
  Result kernelTrace(std::vector<uint64_t>*) const override { return Result::InvalidUsage; }

 private:
  CommOptions opts_;
};

}  // namespace

TEST_CASE("async error: mkernel's failure is named as mkernel's") {
  mkernel::shim::ShimComm* c = mkernel::shim::newShimComm();
  mkernel::shim::bindHandle(c, mkernel::shim::newStandInHandle());  // no NCCL communicator behind it
  c->rank = 0;
  c->nRanks = 2;
  c->mk.reset(new FailedComm());
  c->state.store(mkernel::shim::CommState::Ready);
  // A failure of another code first, so that the check below sees the async error's own.
  REQUIRE(ncclCommCount(nullptr, nullptr) == ncclInvalidArgument);
  ncclResult_t async = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(c->handle(), &async) == ncclSuccess);
  CHECK(async == ncclRemoteError);
  CHECK(std::string(ncclGetLastError(c->handle())) == "rank 0: peer 1 is gone (a stand-in failure)");
  // The invalid argument before is no longer the last failure: NCCL's text for that code.
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) ==
        "invalid argument (run with NCCL_DEBUG=WARN for details)");
  c->mk->abort();
  c->mk.reset();
  c->state.store(mkernel::shim::CommState::Aborted);
}
