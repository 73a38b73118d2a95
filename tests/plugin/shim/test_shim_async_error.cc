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
#include "tests/plugin/shim/stand_in_comm.h"

using mkernel::Result;

TEST_CASE("async error: mkernel's failure is named as mkernel's") {
  mkernel::shim::ShimComm* c = mkernel::shim::newShimComm();
  mkernel::shim::bindHandle(c,
                            mkernel::shim::newStandInHandle());  // no NCCL communicator behind it
  c->rank = 0;
  c->nRanks = 2;
  c->mk.reset(new FailedComm("rank 0: peer 1 is gone (a stand-in failure)"));
  c->state.store(mkernel::shim::CommState::Ready);
  // A failure of another code first, so that the check below sees the async error's own.
  REQUIRE(ncclCommCount(nullptr, nullptr) == ncclInvalidArgument);
  ncclResult_t async = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(c->handle(), &async) == ncclSuccess);
  CHECK(async == ncclRemoteError);
  CHECK(std::string(ncclGetLastError(c->handle())) ==
        "rank 0: peer 1 is gone (a stand-in failure)");
  // The invalid argument before is no longer the last failure: NCCL's text for that code.
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) ==
        "invalid argument (run with NCCL_DEBUG=WARN for details)");
  c->mk->abort();
  c->mk.reset();
  c->state.store(mkernel::shim::CommState::Aborted);
}
