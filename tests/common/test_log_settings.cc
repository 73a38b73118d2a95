// common/log: the timestamp prefix (MKERNEL_DEBUG_TIMESTAMP_FORMAT / _LEVELS, as NCCL's), the
// startup line's levels, mkernel's error texts, and the WARN for each log setting the log does not
// understand. The log reads its settings once per process, at its first line, so each setting is
// a case of its own, hidden ([.name]) and run by ctest with its environment (CMakeLists.txt);
// each such case first checks that its environment is there.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "common/log.h"
#include "common/result.h"

namespace {

using mktest::StderrCapture;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// 2026-12-04 15:43:30, and 123456789 ns.
std::tm fixedTime() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 11;
  tm.tm_mday = 4;
  tm.tm_hour = 15;
  tm.tm_min = 43;
  tm.tm_sec = 30;
  tm.tm_wday = 5;
  tm.tm_yday = 337;
  return tm;
}

std::string stamp(const char* format, long nsec = 123456789) {
  char out[128];
  const size_t n = mkernel::formatLogTimestamp(format, fixedTime(), nsec, out, sizeof(out));
  REQUIRE(n == std::string(out).size());
  return out;
}

}  // namespace

TEST_CASE("log timestamp: NCCL's default format, strftime's conversions") {
  CHECK(stamp("[%F %T] ") == "[2026-12-04 15:43:30] ");
  CHECK(stamp("%H:%M") == "15:43");
}

TEST_CASE("log timestamp: %<n>f gives n digits of the second's fraction, truncated") {
  CHECK(stamp("%T.%3f ") == "15:43:30.123 ");
  CHECK(stamp("%T.%6f") == "15:43:30.123456");
  CHECK(stamp("%9f") == "123456789");
  CHECK(stamp("%1f", 999999999) == "9");
  CHECK(stamp("%3f", 5000000) == "005");
  CHECK(stamp("%3f", 0) == "000");
}

TEST_CASE("log timestamp: %% is a percent sign, also before a digit; _ is a space") {
  CHECK(stamp("%%3f") == "%3f");
  CHECK(stamp("100%%") == "100%");
  CHECK(stamp("[%F_%T]_") == "[2026-12-04 15:43:30] ");
}

TEST_CASE("log timestamp: an empty format gives no prefix; one that does not fit gives none") {
  char out[8] = "x";
  CHECK(mkernel::formatLogTimestamp("", fixedTime(), 0, out, sizeof(out)) == 0);
  CHECK(std::string(out).empty());
  CHECK(mkernel::formatLogTimestamp("[%F %T] ", fixedTime(), 0, out, sizeof(out)) == 0);
  CHECK(std::string(out).empty());
}

TEST_CASE(
    "errors: mkernel's result texts point at MKERNEL_DEBUG and at mkernel, never at NCCL's log") {
  using mkernel::Result;
  for (Result r : {Result::UnhandledCudaError, Result::SystemError}) {
    const std::string s = mkernel::resultString(r);
    CHECK(s.find("MKERNEL_DEBUG=INFO") != std::string::npos);
    CHECK(s.find("MKERNEL_DEBUG_SUBSYS") != std::string::npos);
    CHECK(s.find("NCCL_DEBUG") == std::string::npos);
  }
  for (Result r : {Result::InvalidArgument, Result::InvalidUsage})
    CHECK(std::string(mkernel::resultString(r)).find("MKERNEL_DEBUG=WARN") != std::string::npos);
  const std::string internal = mkernel::resultString(Result::InternalError);
  CHECK(internal.find("report this issue to the mkernel developers") != std::string::npos);
  CHECK(internal.find("NCCL") == std::string::npos);
  CHECK(std::string(mkernel::resultString(Result::Success)) == "no error");
}

// --- one process per setting (ctest sets the environment) -----------------------------------

TEST_CASE("log: WARN lines carry the default timestamp; INFO lines none", "[.ts-default]") {
  REQUIRE(env("MKERNEL_DEBUG") == "INFO");
  REQUIRE(env("MKERNEL_DEBUG_TIMESTAMP_FORMAT").empty());
  REQUIRE(env("MKERNEL_DEBUG_TIMESTAMP_LEVELS").empty());
  StderrCapture cap;
  MK_WARN("a warning %d", 1);
  MK_INFO(mkernel::kLogInit, "an info line %d", 2);
  const std::string out = cap.text();
  INFO(out);
  CHECK(std::regex_search(
      out,
      std::regex(
          R"((^|\n)\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] [^ \n]+:\d+:\d+ MKERNEL WARN [^ ]+:\d+ a warning 1\n)")));
  CHECK(std::regex_search(
      out, std::regex(R"((^|\n)[^\[ \n][^ \n]*:\d+:\d+ MKERNEL INFO an info line 2\n)")));
}

TEST_CASE("log: MKERNEL_DEBUG_TIMESTAMP_FORMAT and _LEVELS choose the prefix and its lines",
          "[.ts-custom]") {
  REQUIRE(env("MKERNEL_DEBUG") == "INFO");
  REQUIRE(env("MKERNEL_DEBUG_TIMESTAMP_FORMAT") == "<%Y_%3f>_");
  REQUIRE(env("MKERNEL_DEBUG_TIMESTAMP_LEVELS") == "INFO");
  StderrCapture cap;
  MK_WARN("a warning %d", 1);
  MK_INFO(mkernel::kLogInit, "an info line %d", 2);
  const std::string out = cap.text();
  INFO(out);
  CHECK(std::regex_search(
      out, std::regex(R"((^|\n)<\d{4} \d{3}> [^ \n]+:\d+:\d+ MKERNEL INFO an info line 2\n)")));
  CHECK(std::regex_search(
      out, std::regex(R"((^|\n)[^< \n][^ \n]*:\d+:\d+ MKERNEL WARN [^ ]+:\d+ a warning 1\n)")));
}

TEST_CASE("log: MKERNEL_DEBUG_TIMESTAMP_LEVELS=NONE turns timestamps off", "[.ts-none]") {
  REQUIRE(env("MKERNEL_DEBUG_TIMESTAMP_LEVELS") == "NONE");
  StderrCapture cap;
  MK_WARN("a warning %d", 1);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL WARN") == 1);
  CHECK(std::regex_search(
      out, std::regex(R"(^[^\[ \n][^ \n]*:\d+:\d+ MKERNEL WARN [^ ]+:\d+ a warning 1\n)")));
}

TEST_CASE("log: an unknown MKERNEL_DEBUG is said once, and the log runs at WARN", "[.bad-level]") {
  REQUIRE(env("MKERNEL_DEBUG") == "LOUD");
  StderrCapture cap;
  MK_WARN("first %d", 1);
  MK_INFO(mkernel::kLogInit, "not at WARN %d", 2);
  MK_WARN("second %d", 3);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL_DEBUG=LOUD is not a log level") == 1);
  CHECK(out.find("using WARN") != std::string::npos);
  CHECK(out.find("first 1") != std::string::npos);
  CHECK(out.find("second 3") != std::string::npos);
  CHECK(out.find("not at WARN") == std::string::npos);
  CHECK(out.find("MKERNEL_DEBUG=LOUD") < out.find("first 1"));
}

TEST_CASE("log: an unknown subsystem in MKERNEL_DEBUG_SUBSYS is said once; the known ones apply",
          "[.bad-subsys]") {
  REQUIRE(env("MKERNEL_DEBUG") == "INFO");
  REQUIRE(env("MKERNEL_DEBUG_SUBSYS") == "INIT,BOGUS");
  StderrCapture cap;
  MK_INFO(mkernel::kLogInit, "init line %d", 1);
  MK_INFO(mkernel::kLogColl, "coll line %d", 2);
  MK_WARN("a warning %d", 3);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "unknown subsystem(s) BOGUS") == 1);
  CHECK(out.find("MKERNEL_DEBUG_SUBSYS=INIT,BOGUS") != std::string::npos);
  CHECK(out.find("init line 1") != std::string::npos);
  CHECK(out.find("coll line 2") == std::string::npos);
  CHECK(out.find("a warning 3") != std::string::npos);
}

TEST_CASE("log: an unknown level in MKERNEL_DEBUG_TIMESTAMP_LEVELS is said once",
          "[.bad-ts-levels]") {
  REQUIRE(env("MKERNEL_DEBUG_TIMESTAMP_LEVELS") == "WARN,SOMETIMES");
  StderrCapture cap;
  MK_WARN("a warning %d", 1);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL_DEBUG_TIMESTAMP_LEVELS=WARN,SOMETIMES: unknown level(s) SOMETIMES") ==
        1);
  CHECK(out.find("a warning 1") != std::string::npos);
}

TEST_CASE("log: a MKERNEL_DEBUG_FILE that cannot be opened is said, and the log goes to stderr",
          "[.bad-file]") {
  REQUIRE(env("MKERNEL_DEBUG_FILE") == "/nonexistent-mkernel-dir/log.%p");
  StderrCapture cap;
  MK_WARN("a warning %d", 1);
  MK_WARN("another %d", 2);
  const std::string out = cap.text();
  INFO(out);
  const std::string expanded = "/nonexistent-mkernel-dir/log." + std::to_string(getpid());
  CHECK(count(out, "cannot open " + expanded) == 1);
  CHECK(out.find("logging to stderr instead") != std::string::npos);
  CHECK(out.find("a warning 1") != std::string::npos);
  CHECK(out.find("another 2") != std::string::npos);
}

TEST_CASE("log: the startup line is bare at MKERNEL_DEBUG=VERSION, and WARNs are not printed",
          "[.startup-version]") {
  REQUIRE(env("MKERNEL_DEBUG") == "VERSION");
  StderrCapture cap;
  CHECK(mkernel::logStartupEnabled());
  mkernel::logStartupLine("mkernel 9.9.9 loaded as %s", "a test");
  MK_WARN("a warning %d", 1);
  const std::string out = cap.text();
  INFO(out);
  CHECK(out == "mkernel 9.9.9 loaded as a test\n");
}

TEST_CASE("log: the startup line is an INFO line at MKERNEL_DEBUG=INFO", "[.startup-info]") {
  REQUIRE(env("MKERNEL_DEBUG") == "INFO");
  REQUIRE(env("MKERNEL_DEBUG_SUBSYS") == "COLL");  // the line is shown whatever the subsystems
  StderrCapture cap;
  mkernel::logStartupLine("mkernel 9.9.9 loaded as %s", "a test");
  const std::string out = cap.text();
  INFO(out);
  CHECK(std::regex_search(
      out, std::regex(R"(^[^ \n]+:\d+:\d+ MKERNEL INFO mkernel 9\.9\.9 loaded as a test\n$)")));
}

TEST_CASE("log: no startup line at MKERNEL_DEBUG=WARN", "[.startup-warn]") {
  REQUIRE(env("MKERNEL_DEBUG") == "WARN");
  StderrCapture cap;
  CHECK_FALSE(mkernel::logStartupEnabled());
  mkernel::logStartupLine("mkernel 9.9.9 loaded as %s", "a test");
  MK_WARN("a warning %d", 1);
  const std::string out = cap.text();
  INFO(out);
  CHECK(out.find("loaded as") == std::string::npos);
  CHECK(out.find("a warning 1") != std::string::npos);
}

TEST_CASE("log: a requested line (MKERNEL_STATS) is printed at WARN, whatever the subsystems",
          "[.requested-warn]") {
  REQUIRE(env("MKERNEL_DEBUG") == "WARN");
  StderrCapture cap;
  mkernel::logRequested("STATS", "comm %d: %s", 7, "a summary");
  const std::string out = cap.text();
  INFO(out);
  CHECK(
      std::regex_search(out, std::regex(R"(^[^ \n]+:\d+:\d+ MKERNEL STATS comm 7: a summary\n$)")));
}

TEST_CASE("log: nothing at all at MKERNEL_DEBUG=NONE, not even a requested line", "[.none]") {
  REQUIRE(env("MKERNEL_DEBUG") == "NONE");
  StderrCapture cap;
  mkernel::logRequested("STATS", "comm %d: %s", 7, "a summary");
  mkernel::logStartupLine("mkernel 9.9.9 loaded as %s", "a test");
  MK_WARN("a warning %d", 1);
  CHECK(cap.text().empty());
}
