// The shim as an application linked to libmkernel.so sees it, without a GPU: the startup line
// (MKERNEL_DEBUG=VERSION: bare, once, with mkernel's version and library and the real NCCL's
// version and file; none at WARN), and ncclGetErrorString's texts (mkernel's log for an error that
// arose in mkernel, NCCL's texts otherwise). The startup cases run one process each, with their
// environment (CMakeLists.txt), since the log reads its settings once.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "common/version.h"
#include "plugin/mkernel_api.h"
#include "plugin/shim/nccl_api.h"

namespace {

using mktest::StderrCapture;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string realPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) != nullptr ? std::string(buf) : p;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// The real NCCL the shim loaded, if any: its version text and file.
bool realNccl(std::string* version, std::string* path) {
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  auto get = reinterpret_cast<ncclResult_t (*)(int*)>(dlsym(h, "pncclGetVersion"));
  REQUIRE(get != nullptr);
  int v = 0;
  REQUIRE(get(&v) == ncclSuccess);
  *version = std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
             std::to_string(v % 100);
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(get), &info) != 0);
  *path = info.dli_fname;
  dlclose(h);
  return true;
}

}  // namespace

TEST_CASE("startup line: at MKERNEL_DEBUG=VERSION, once, bare, naming mkernel and the real NCCL",
          "[.startup-version]") {
  REQUIRE(env("MKERNEL_DEBUG") == "VERSION");
  REQUIRE(env("MKERNEL_EMULATE").empty());
  StderrCapture cap;
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "loaded as NCCL shim") == 1);
  std::smatch m;
  REQUIRE(std::regex_search(
      out, m, std::regex(R"((^|\n)mkernel ([0-9.]+) loaded as NCCL shim from (\S+); (.*)\n)")));
  CHECK(m[2].str() == MKERNEL_VERSION_STRING);
  CHECK(realPath(m[3].str()) == realPath(MKERNEL_SO_PATH));
  std::string version, path;
  if (realNccl(&version, &path)) {
    CHECK(m[4].str() == "forwarding to NCCL " + version + " at " + path);
    // ncclGetVersion still answers the real NCCL's number (PyTorch checks it).
    CHECK(std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
              std::to_string(v % 100) ==
          version);
  } else {
    CHECK(m[4].str().rfind("no real NCCL to forward to: ", 0) == 0);
  }
}

TEST_CASE("startup line: in emulation it says so", "[.startup-emulate]") {
  REQUIRE(env("MKERNEL_DEBUG") == "VERSION");
  REQUIRE(env("MKERNEL_EMULATE") == "1");
  StderrCapture cap;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "loaded as NCCL shim") == 1);
  CHECK(std::regex_search(
      out,
      std::regex(
          R"((^|\n)mkernel [0-9.]+ loaded as NCCL shim from \S+; emulation \(MKERNEL_EMULATE=1\): mkernel runs every communicator, nothing is forwarded)")));
}

TEST_CASE("startup line: none at MKERNEL_DEBUG=WARN", "[.startup-warn]") {
  REQUIRE(env("MKERNEL_DEBUG") == "WARN");
  StderrCapture cap;
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const std::string out = cap.text();
  INFO(out);
  CHECK(out.find("loaded as") == std::string::npos);
  // mkernel stays visible to whoever asks.
  CHECK(std::string(mkernelVersionString()) == std::string("mkernel ") + MKERNEL_VERSION_STRING);
}

TEST_CASE(
    "error strings: an error that arose in mkernel points at MKERNEL_DEBUG; other codes keep "
    "NCCL's texts") {
  // The shim's own failure: a NULL comm.
  REQUIRE(ncclCommCount(nullptr, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) ==
        "invalid argument (run with MKERNEL_DEBUG=WARN for details)");
  // Codes other than that failure's: NCCL's texts, unchanged.
  CHECK(std::string(ncclGetErrorString(ncclSystemError)) ==
        "unhandled system error (run with NCCL_DEBUG=INFO for details)");
  CHECK(std::string(ncclGetErrorString(ncclInternalError)) ==
        "internal error - please report this issue to the NCCL developers");
  CHECK(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  CHECK(std::string(ncclGetErrorString(static_cast<ncclResult_t>(99))) == "unknown result code");
  // The shim's next failure has another code: that one is now mkernel's, the earlier NCCL's.
  REQUIRE(ncclGroupEnd() == ncclInvalidUsage);  // no matching ncclGroupStart
  CHECK(std::string(ncclGetErrorString(ncclInvalidUsage)) ==
        "invalid usage (run with MKERNEL_DEBUG=WARN for details)");
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) ==
        "invalid argument (run with NCCL_DEBUG=WARN for details)");
  // Creating a communicator without a GPU fails in mkernel (no CUDA device): its text says where.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  if (r == ncclUnhandledCudaError) {
    const std::string s = ncclGetErrorString(r);
    CHECK(s.find("MKERNEL_DEBUG=INFO") != std::string::npos);
    CHECK(s.find("MKERNEL_DEBUG_SUBSYS") != std::string::npos);
  } else if (r == ncclSuccess) {
    CHECK(ncclCommDestroy(comm) == ncclSuccess);  // a machine with a GPU
  }
}
