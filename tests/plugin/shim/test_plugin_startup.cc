// The startup line of libmkernel.so loaded by NCCL as its net and tuner plugin (dlopen'd here as
// NCCL does, with a logger standing for NCCL's ncclDebugLog): under NCCL_DEBUG=INFO it goes
// through NCCL's logger as an INFO line; under NCCL's default level, MKERNEL_DEBUG=VERSION prints
// it on mkernel's own output, and MKERNEL_DEBUG=WARN does not. One process per setting (ctest
// sets the environment); no GPU.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/version.h"
#include "plugin/abi/net_v10.h"
#include "plugin/abi/tuner_v5.h"

using namespace mkernel::abi;

namespace {

using mktest::StderrCapture;

std::vector<std::pair<int, std::string>> gLog;
void captureLog(int level, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
                const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gLog.emplace_back(level, buf);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string realPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) != nullptr ? std::string(buf) : p;
}

void* lib() {
  static void* h = dlopen(MKERNEL_SO_PATH, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) FAIL("dlopen " MKERNEL_SO_PATH ": " << dlerror());
  return h;
}

// What NCCL does first with each plugin: net init() and devices(), tuner init() and finalize().
void loadBoth() {
  auto* net = static_cast<ncclNet_v10_t*>(dlsym(lib(), "ncclNetPlugin_v10"));
  auto* tuner = static_cast<ncclTuner_v5_t*>(dlsym(lib(), "ncclTunerPlugin_v5"));
  REQUIRE(net != nullptr);
  REQUIRE(tuner != nullptr);
  REQUIRE(net->init(captureLog, nullptr) == ncclSuccess);
  int ndev = 0;
  REQUIRE(net->devices(&ndev) == ncclSuccess);
  REQUIRE(net->devices(&ndev) == ncclSuccess);
  for (uint64_t comm = 1; comm <= 2; ++comm) {
    void* ctx = nullptr;
    ncclNvlDomainInfo_v5_t nvl{1, 8, 8};
    REQUIRE(tuner->init(&ctx, comm, 8, 1, captureLog, &nvl, nullptr) == ncclSuccess);
    REQUIRE(tuner->finalize(ctx) == ncclSuccess);
  }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

const std::regex kNetLine(
    R"(mkernel ([0-9.]+) loaded as NCCL net plugin \(NET/mkernel, MKERNEL_NET_BACKEND=tcp\) from (\S+))");
const std::regex kTunerLine(
    R"(mkernel ([0-9.]+) loaded as NCCL tuner plugin from (\S+); stays neutral, NCCL's choices unchanged \(.*\))");

}  // namespace

TEST_CASE("plugin startup lines: through NCCL's logger at NCCL_DEBUG=INFO, once each",
          "[.plugin-nccl-info]") {
  REQUIRE(env("NCCL_DEBUG") == "INFO");
  REQUIRE(env("MKERNEL_NET_BACKEND") == "tcp");
  loadBoth();
  int net = 0, tuner = 0;
  for (const auto& l : gLog) {
    INFO(l.first << " " << l.second);
    std::smatch m;
    if (std::regex_search(l.second, m, kNetLine)) {
      ++net;
      CHECK(l.first == 3);  // NCCL_LOG_INFO
      CHECK(l.second.rfind("MKERNEL mkernel ", 0) == 0);
      CHECK(m[1].str() == MKERNEL_VERSION_STRING);
      CHECK(realPath(m[2].str()) == realPath(MKERNEL_SO_PATH));
    }
    if (std::regex_search(l.second, m, kTunerLine)) {
      ++tuner;
      CHECK(l.first == 3);
      CHECK(m[1].str() == MKERNEL_VERSION_STRING);
      CHECK(realPath(m[2].str()) == realPath(MKERNEL_SO_PATH));
    }
  }
  CHECK(net == 1);
  CHECK(tuner == 1);
}

TEST_CASE(
    "plugin startup lines: MKERNEL_DEBUG=VERSION prints them on mkernel's output when NCCL would "
    "not",
    "[.plugin-mk-version]") {
  REQUIRE(env("NCCL_DEBUG").empty());
  REQUIRE(env("MKERNEL_DEBUG") == "VERSION");
  StderrCapture cap;
  loadBoth();
  const std::string out = cap.text();
  INFO(out);
  for (const auto& l : gLog) CHECK(l.second.find("loaded as") == std::string::npos);
  CHECK(count(out, "loaded as NCCL net plugin") == 1);
  CHECK(count(out, "loaded as NCCL tuner plugin") == 1);
  CHECK(std::regex_search(
      out, std::regex(std::string("(^|\n)") + R"(mkernel [0-9.]+ loaded as NCCL net plugin )")));
}

TEST_CASE("plugin startup lines: none at MKERNEL_DEBUG=WARN under NCCL's default level",
          "[.plugin-mk-warn]") {
  REQUIRE(env("NCCL_DEBUG").empty());
  REQUIRE(env("MKERNEL_DEBUG") == "WARN");
  StderrCapture cap;
  loadBoth();
  const std::string out = cap.text();
  INFO(out);
  CHECK(out.find("loaded as") == std::string::npos);
  for (const auto& l : gLog) CHECK(l.second.find("loaded as") == std::string::npos);
}
