// A stand-in mkernel communicator whose asynchronous error is always a failure (`what`): what the
// shim answers for a comm of its own, never what NCCL answers. No GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/communicator.h"
#include "common/log.h"

class FailedComm final : public mkernel::coll::Communicator {
 public:
  explicit FailedComm(const char* what) : what_(what) {}
  mkernel::Result enqueue(const mkernel::coll::CollArgs*, int, cudaStream_t) override {
    return mkernel::Result::Success;
  }
  mkernel::Result asyncError(bool) override {
    return MK_ERROR(mkernel::Result::RemoteError, "%s", what_);
  }
  mkernel::Result abort() override { return mkernel::Result::Success; }
  mkernel::Result finalize() override { return mkernel::Result::Success; }
  const mkernel::coll::CommOptions& options() const override { return opts_; }
  void stats(mkernel::coll::CollStats*) const override {}
  mkernel::Result kernelTrace(std::vector<uint64_t>*) const override {
    return mkernel::Result::InvalidUsage;
  }

 private:
  const char* what_;
  mkernel::coll::CommOptions opts_;
};
