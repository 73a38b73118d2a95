// Stand-in mkernel communicators for the shim's CPU tests (no GPU): StandInComm answers every call
// with success and holds no resources; a test overrides what it exercises. FailedComm's
// asynchronous error is always a failure (`what`): what the shim answers for a comm of its own,
// never what NCCL answers.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/communicator.h"
#include "common/log.h"

class StandInComm : public mkernel::coll::Communicator {
 public:
  mkernel::Result enqueue(const mkernel::coll::CollArgs*, int, cudaStream_t) override {
    return mkernel::Result::Success;
  }
  mkernel::Result asyncError(bool) override { return mkernel::Result::Success; }
  mkernel::Result abort() override { return mkernel::Result::Success; }
  mkernel::Result finalize() override { return mkernel::Result::Success; }
  const mkernel::coll::CommOptions& options() const override { return opts_; }
  void stats(mkernel::coll::CollStats*) const override {}
  mkernel::Result kernelTrace(std::vector<uint64_t>*) const override {
    return mkernel::Result::InvalidUsage;
  }

 private:
  mkernel::coll::CommOptions opts_;
};

class FailedComm final : public StandInComm {
 public:
  explicit FailedComm(const char* what) : what_(what) {}
  mkernel::Result asyncError(bool) override {
    return MK_ERROR(mkernel::Result::RemoteError, "%s", what_);
  }

 private:
  const char* what_;
};
