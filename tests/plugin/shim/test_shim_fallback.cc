// The cross-host fallback to NCCL is not silent: a communicator whose ranks span hosts without
// MKERNEL_MULTI_NODE=1 gets no mkernel part (plugin/shim/shim_init.cc calls noteCrossHostFallback,
// shim_comm.cc), said at WARN by the process's first such communicator and at INFO by the later
// ones. On the CPU, with shells standing for the communicators.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "plugin/shim/shim_comm.h"

namespace {

using mktest::StderrCapture;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("cross-host fallback: a WARN for the first communicator, INFO for the later ones") {
  const char* level = std::getenv("MKERNEL_DEBUG");
  REQUIRE((level == nullptr || std::string(level) == "INFO"));  // ctest runs it at INFO
  const bool info = level != nullptr;
  StderrCapture cap;
  for (int i = 0; i < 3; ++i) {
    mkernel::shim::ShimComm* c = mkernel::shim::newShimComm();
    c->nNodes = 2;
    mkernel::shim::noteCrossHostFallback(c, i);
    CHECK(c->mkUnavailable == "ranks on 2 hosts and MKERNEL_MULTI_NODE=0");
  }
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL WARN") == 1);
  CHECK(count(out,
              "shim: rank 0: ranks on 2 hosts and MKERNEL_MULTI_NODE=0: mkernel runs on one host "
              "only unless "
              "MKERNEL_MULTI_NODE=1; every call of this communicator goes to NCCL") == 1);
  CHECK(out.find("MKERNEL WARN") < out.find("shim: rank 0:"));
  CHECK(count(out,
              "MKERNEL INFO shim: rank 1: ranks on 2 hosts and MKERNEL_MULTI_NODE=0; every call "
              "goes to NCCL") == (info ? 1u : 0u));
  CHECK(count(out, "MKERNEL INFO shim: rank 2:") == (info ? 1u : 0u));
}
