// common/: parameters, errors, logging through NCCL's logger, and the README's variable table
// against params.def.
#include "tests/catch.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/param.h"
#include "common/result.h"

using mkernel::Result;

namespace {

// NCCL_DEBUG as NCCL runs without it (its default level, WARN), for the logging case: the log's
// settings are read once per process, at its first line.
struct NoNcclDebug {
  NoNcclDebug() { unsetenv("NCCL_DEBUG"); }
} gNoNcclDebug;

std::vector<std::pair<int, std::string>> gNcclLines;
// Stands in for NCCL's ncclDebugLog.
void captureNccl(int level, unsigned long /*flags*/, const char* /*file*/, int /*line*/, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gNcclLines.emplace_back(level, buf);
}

}  // namespace

TEST_CASE("log: through NCCL's logger, only the lines NCCL_DEBUG lets through are formatted and handed over") {
  // A plugin loaded by NCCL logs through NCCL. Lines above NCCL's level would be dropped by NCCL
  // anyway; formatting and handing them over cost every collective time (the shim's TRACE lines).
  gNcclLines.clear();
  mkernel::setNcclLogger(captureNccl);
  CHECK_FALSE(mkernel::logEnabled(mkernel::LogLevel::Info, mkernel::kLogInit));
  CHECK_FALSE(mkernel::logEnabled(mkernel::LogLevel::Trace, mkernel::kLogColl));
  CHECK(mkernel::logEnabled(mkernel::LogLevel::Warn, mkernel::kLogInit));
  MK_INFO(mkernel::kLogInit, "an info line %d", 1);
  MK_TRACE(mkernel::kLogColl, "a trace line %d", 2);
  MK_WARN("a warning %d", 3);
  mkernel::setNcclLogger(nullptr);
  REQUIRE(gNcclLines.size() == 1);
  CHECK(gNcclLines[0].first == static_cast<int>(mkernel::LogLevel::Warn));
  CHECK(gNcclLines[0].second.find("a warning 3") != std::string::npos);
}

TEST_CASE("params: default, override, bad value falls back to the default") {
  unsetenv("MKERNEL_TIMEOUT_S");
  CHECK(mkernel::paramInt("TIMEOUT_S") == 300);
  setenv("MKERNEL_TIMEOUT_S", "7", 1);
  CHECK(mkernel::paramInt("TIMEOUT_S") == 7);
  CHECK(mkernel::paramIsSet("TIMEOUT_S"));
  setenv("MKERNEL_TIMEOUT_S", "7x", 1);
  CHECK(mkernel::paramInt("TIMEOUT_S") == 300);
  unsetenv("MKERNEL_TIMEOUT_S");
  CHECK_FALSE(mkernel::paramIsSet("TIMEOUT_S"));
}

TEST_CASE("params: an undeclared name is a programming error that returns the fallback") {
  CHECK(mkernel::paramInt("NO_SUCH_PARAM_FOR_TEST", 42) == 42);
}

TEST_CASE("errors: MK_ERROR records the message and returns the code") {
  mkernel::clearLastError();
  Result r = MK_ERROR(Result::InvalidArgument, "count %d is bad", -3);
  CHECK(r == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()) == "count -3 is bad");
  CHECK(std::string(mkernel::resultString(Result::RemoteError)).find("remote") != std::string::npos);
}

TEST_CASE("README documents exactly the variables declared in common/params.def") {
  std::ifstream f(MKERNEL_SOURCE_DIR "/README.md");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  std::string readme = ss.str();
  // Rows of the variables table look like: | `MKERNEL_NAME` | default | meaning |
  std::regex row("\\|\\s*`MKERNEL_([A-Z0-9_]+)`\\s*\\|");
  std::set<std::string> documented;
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), row); it != std::sregex_iterator(); ++it)
    documented.insert((*it)[1]);
  int n = 0;
  const mkernel::ParamInfo* table = mkernel::paramTable(&n);
  std::set<std::string> declared;
  for (int i = 0; i < n; ++i) declared.insert(table[i].name);
  for (const std::string& d : declared) {
    INFO("MKERNEL_" << d << " is declared in common/params.def but missing from README.md's table");
    CHECK(documented.count(d) == 1);
  }
  for (const std::string& d : documented) {
    INFO("MKERNEL_" << d << " is in README.md's table but not declared in common/params.def");
    CHECK(declared.count(d) == 1);
  }
}
