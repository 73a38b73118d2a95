// common/: the settings registry, errors, logging through NCCL's logger, and the generated settings
// tables against params.def.
#include "tests/catch.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
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
void captureNccl(int level, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
                 const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gNcclLines.emplace_back(level, buf);
}

}  // namespace

TEST_CASE(
    "log: through NCCL's logger, only the lines NCCL_DEBUG lets through are formatted and handed "
    "over") {
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

namespace params = mkernel::params;

// Sets (value non-null) or clears MKERNEL_/NCCL_ variables for one case, then restores them; the
// registry re-reads the environment on both sides.
class Env {
 public:
  Env& set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
    params::resetForTesting();
    return *this;
  }
  ~Env() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
    }
    params::resetForTesting();
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The WARN lines logged while `f` runs.
template <class F>
std::vector<std::string> warnings(F f) {
  gNcclLines.clear();
  mkernel::setNcclLogger(captureNccl);
  f();
  mkernel::setNcclLogger(nullptr);
  std::vector<std::string> out;
  for (const auto& l : gNcclLines)
    if (l.first == static_cast<int>(mkernel::LogLevel::Warn)) out.push_back(l.second);
  return out;
}

bool mentions(const std::vector<std::string>& lines, const std::string& a,
              const std::string& b = "") {
  for (const std::string& l : lines)
    if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
  return false;
}

TEST_CASE(
    "params: default, override, and an invalid value warned once that falls back to the default") {
  Env env;
  env.set("MKERNEL_TIMEOUT_S", nullptr);
  CHECK(params::TIMEOUT_S() == 300);
  CHECK_FALSE(params::TIMEOUT_S.isSet());
  env.set("MKERNEL_TIMEOUT_S", "7");
  CHECK(params::TIMEOUT_S() == 7);
  CHECK(params::TIMEOUT_S.isSet());
  CHECK(params::timeoutSeconds() == 7.0);
  env.set("MKERNEL_TIMEOUT_S", "7x");
  std::vector<std::string> w = warnings([] {
    CHECK(params::TIMEOUT_S() == 300);
    CHECK(params::TIMEOUT_S() == 300);
  });
  REQUIRE(w.size() == 1);
  CHECK(mentions(w, "MKERNEL_TIMEOUT_S=7x", "an integer"));
  CHECK(mentions(w, "default '300'"));
  env.set("MKERNEL_TIMEOUT_S", "0");  // outside 1..
  w = warnings([] { CHECK(params::TIMEOUT_S() == 300); });
  CHECK(mentions(w, "MKERNEL_TIMEOUT_S=0", "1.."));
}

TEST_CASE("params: values are read once, until a test resets the registry") {
  Env env;
  env.set("MKERNEL_CTAS", "16");
  CHECK(params::CTAS() == 16);
  setenv("MKERNEL_CTAS", "8", 1);
  CHECK(params::CTAS() == 16);
  params::resetForTesting();
  CHECK(params::CTAS() == 8);
}

TEST_CASE("params: sizes take K, M and G; auto settings give nullopt for auto") {
  Env env;
  env.set("MKERNEL_LAUNCH_MAX_BYTES", nullptr);
  CHECK(params::LAUNCH_MAX_BYTES() == 1048576);
  env.set("MKERNEL_LAUNCH_MAX_BYTES", "64K");
  CHECK(params::LAUNCH_MAX_BYTES() == 65536);
  env.set("MKERNEL_LAUNCH_MAX_BYTES", "1MiB");
  CHECK(params::LAUNCH_MAX_BYTES() == 1048576);
  env.set("MKERNEL_LAUNCH_MAX_BYTES", "2g");
  CHECK(params::LAUNCH_MAX_BYTES() == (int64_t(2) << 30));
  env.set("MKERNEL_LAUNCH_MAX_BYTES", "12Q");
  std::vector<std::string> w = warnings([] { CHECK(params::LAUNCH_MAX_BYTES() == 1048576); });
  CHECK(mentions(w, "MKERNEL_LAUNCH_MAX_BYTES=12Q", "a byte count"));
  env.set("MKERNEL_LAUNCH_MAX_BYTES", "-1");
  w = warnings([] { CHECK(params::LAUNCH_MAX_BYTES() == 1048576); });
  CHECK(w.size() == 1);

  env.set("MKERNEL_LL_MAX_BYTES", nullptr);
  CHECK_FALSE(params::LL_MAX_BYTES().has_value());
  CHECK(std::string(params::LL_MAX_BYTES.text()) == "auto");
  env.set("MKERNEL_LL_MAX_BYTES", "8K");
  REQUIRE(params::LL_MAX_BYTES().has_value());
  CHECK(*params::LL_MAX_BYTES() == 8192);
  env.set("MKERNEL_LL_MAX_BYTES", "AUTO");
  CHECK_FALSE(params::LL_MAX_BYTES().has_value());
  env.set("MKERNEL_SHARED_CTAS", "0");
  REQUIRE(params::SHARED_CTAS().has_value());
  CHECK(*params::SHARED_CTAS() == 0);
}

TEST_CASE("params: enums, booleans and lists") {
  Env env;
  env.set("MKERNEL_PDL", nullptr);
  CHECK(params::PDL.is("wait"));
  CHECK(params::PDL() == 1);  // off, wait, early
  env.set("MKERNEL_PDL", "Early");
  CHECK(params::PDL.is("early"));
  CHECK(std::string(params::PDL.text()) == "early");
  env.set("MKERNEL_PDL", "sometimes");
  std::vector<std::string> w = warnings([] { CHECK(params::PDL.is("wait")); });
  CHECK(mentions(w, "MKERNEL_PDL=sometimes", "one of off,wait,early"));

  env.set("MKERNEL_LAUNCH_DIRECT", "off");
  CHECK_FALSE(params::LAUNCH_DIRECT());
  env.set("MKERNEL_LAUNCH_DIRECT", "yes");
  CHECK(params::LAUNCH_DIRECT());
  env.set("MKERNEL_LAUNCH_DIRECT", "2");
  w = warnings([] { CHECK(params::LAUNCH_DIRECT()); });
  CHECK(mentions(w, "MKERNEL_LAUNCH_DIRECT=2", "0 or 1"));

  env.set("MKERNEL_COLLECTIVES", " allreduce, Broadcast ");
  CHECK(params::COLLECTIVES() == std::vector<std::string>{"allreduce", "broadcast"});
  CHECK(std::string(params::COLLECTIVES.text()) == "allreduce,broadcast");
  env.set("MKERNEL_COLLECTIVES", "allreduce,alltoall");
  w = warnings([] { CHECK(params::COLLECTIVES() == std::vector<std::string>{"all"}); });
  CHECK(mentions(w, "MKERNEL_COLLECTIVES=allreduce,alltoall", "a comma list of"));
}

// Each NCCL twin: the MKERNEL_ variable wins when both are set, the NCCL one holds alone, and the
// default holds when neither is set.
TEST_CASE("params: NCCL twins") {
  struct Twin {
    const char* mk;
    const char* nccl;
    const char* mkValue;
    const char* ncclValue;
    std::function<std::string()> get;
    const char* def;
  };
  const Twin twins[] = {
      {"MKERNEL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "ib0", "eth0",
       [] { return params::SOCKET_IFNAME(); }, ""},
      {"MKERNEL_IB_HCA", "NCCL_IB_HCA", "mlx5_0", "=mlx5_1:1", [] { return params::IB_HCA(); }, ""},
      {"MKERNEL_IB_GID_INDEX", "NCCL_IB_GID_INDEX", "3", "1",
       [] { return std::to_string(params::IB_GID_INDEX()); }, "-1"},
      {"MKERNEL_IB_TIMEOUT", "NCCL_IB_TIMEOUT", "18", "22",
       [] { return std::to_string(params::IB_TIMEOUT()); }, "14"},
      {"MKERNEL_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT", "5", "3",
       [] { return std::to_string(params::IB_RETRY_CNT()); }, "7"},
      {"MKERNEL_HOSTID", "NCCL_HOSTID", "node-a", "node-b", [] { return params::HOSTID(); }, ""},
  };
  for (const Twin& t : twins) {
    INFO(t.mk << " / " << t.nccl);
    Env env;
    env.set(t.mk, t.mkValue).set(t.nccl, t.ncclValue);
    CHECK(t.get() == t.mkValue);
    env.set(t.mk, nullptr);
    CHECK(t.get() == t.ncclValue);
    env.set(t.nccl, nullptr);
    CHECK(t.get() == t.def);
    env.set(t.mk, t.mkValue);
    CHECK(t.get() == t.mkValue);
  }
  // Every declared twin is tested above.
  int declared = 0;
  for (int k = 0; k < static_cast<int>(params::Id::kCount); ++k)
    if (*params::table()[k].nccl != '\0') ++declared;
  CHECK(declared == static_cast<int>(sizeof(twins) / sizeof(twins[0])));
  // The twin's invalid value is named as such.
  Env env;
  env.set("MKERNEL_IB_TIMEOUT", nullptr).set("NCCL_IB_TIMEOUT", "soon");
  std::vector<std::string> w = warnings([] { CHECK(params::IB_TIMEOUT() == 14); });
  CHECK(mentions(w, "NCCL_IB_TIMEOUT=soon"));
}

TEST_CASE("params: the route settings, with the values in effect") {
  Env env;
  env.set("MKERNEL_LAUNCH_MAX_BYTES", "64K")
      .set("MKERNEL_ALGO", "RING")
      .set("MKERNEL_LL_MAX_BYTES", nullptr);
  std::map<std::string, std::string> route;
  for (const auto& kv : params::routeSettings()) route[kv.first] = kv.second;
  CHECK(route.at("LAUNCH_MAX_BYTES") == "65536");
  CHECK(route.at("ALGO") == "ring");
  CHECK(route.at("LL_MAX_BYTES") == "auto");
  for (const char* name : {"GRAPH_LAUNCH", "LAUNCH_DIRECT", "MAX_BYTES", "COLLECTIVES",
                           "NCCL_CROSSOVER", "GRAPH", "DISABLE", "CTAS"})
    CHECK(route.count(name) == 1);
  CHECK(route.count("TIMEOUT_S") == 0);
  CHECK(route.count("DEBUG") == 0);
}

TEST_CASE(
    "params: the text accessors read the environment each time; an undeclared name returns the "
    "fallback") {
  Env env;
  env.set("MKERNEL_NET_CHUNK_BYTES", "8K");
  CHECK(mkernel::paramInt("NET_CHUNK_BYTES") == 8192);
  CHECK(mkernel::paramString("NET_CHUNK_BYTES") == "8K");
  CHECK(mkernel::paramIsSet("NET_CHUNK_BYTES"));
  setenv("MKERNEL_NET_CHUNK_BYTES", "16K", 1);
  CHECK(mkernel::paramInt("NET_CHUNK_BYTES") == 16384);
  env.set("MKERNEL_NET_CHUNK_BYTES", nullptr)
      .set("NCCL_SOCKET_IFNAME", "eth1")
      .set("MKERNEL_SOCKET_IFNAME", nullptr);
  CHECK(mkernel::paramInt("NET_CHUNK_BYTES") == 524288);
  CHECK_FALSE(mkernel::paramIsSet("NET_CHUNK_BYTES"));
  CHECK(mkernel::paramString("SOCKET_IFNAME") == "eth1");
  CHECK(mkernel::paramInt("NO_SUCH_PARAM_FOR_TEST", 42) == 42);
}

TEST_CASE("params: unknown MKERNEL_ variables are warned about once; test hooks are not") {
  Env env;
  env.set("MKERNEL_NO_SUCH_SETTING_FOR_TEST", "1").set("MKERNEL_SOAK_SECONDS", "5");
  std::vector<std::string> w = warnings([] {
    params::warnUnknownOnce();
    params::warnUnknownOnce();
  });
  CHECK(w.size() == 1);
  CHECK(mentions(w, "MKERNEL_NO_SUCH_SETTING_FOR_TEST", "not a known"));
  CHECK_FALSE(mentions(w, "SOAK_SECONDS"));
}

TEST_CASE("params.def: every default parses, and help texts are short and name no history") {
  for (int k = 0; k < static_cast<int>(params::Id::kCount); ++k) {
    const params::Info& p = params::table()[k];
    INFO("MKERNEL_" << p.name);
    CHECK(std::strlen(p.help) > 0);
    CHECK(std::strlen(p.help) <= 240);
    const std::string help = p.help;
    CHECK(help.find("session") == std::string::npos);
    if (*p.nccl != '\0') CHECK(help.find(std::string(p.nccl)) != std::string::npos);
  }
  // A default that does not parse is warned about at the first read.
  Env env;
  std::vector<std::string> w = warnings([] { (void)params::TIMEOUT_S(); });
  CHECK_FALSE(mentions(w, "declared default"));
}

TEST_CASE("errors: MK_ERROR records the message and returns the code") {
  mkernel::clearLastError();
  Result r = MK_ERROR(Result::InvalidArgument, "count %d is bad", -3);
  CHECK(r == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()) == "count -3 is bad");
  CHECK(std::string(mkernel::resultString(Result::RemoteError)).find("remote") !=
        std::string::npos);
}

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The MKERNEL_ names of a markdown table's rows (| `MKERNEL_NAME` | ...).
std::set<std::string> tableNames(const std::string& text) {
  std::regex row("\\|\\s*`MKERNEL_([A-Z0-9_]+)`\\s*\\|");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator();
       ++it)
    names.insert((*it)[1]);
  return names;
}

std::set<std::string> declared(std::initializer_list<params::Audience> audiences) {
  std::set<std::string> out;
  for (int k = 0; k < static_cast<int>(params::Id::kCount); ++k)
    for (params::Audience a : audiences)
      if (params::table()[k].audience == a) out.insert(params::table()[k].name);
  return out;
}

}  // namespace

// README.md's settings block (the fixture's while README.md has no markers) lists exactly the user
// settings; docs/TUNING.md lists exactly the user and tuning ones. scripts/param-table.py writes
// both; test_param_tables (ctest) checks that neither is stale.
TEST_CASE(
    "settings tables: README's block lists the user settings, docs/TUNING.md every documented "
    "one") {
  const std::string begin = "<!-- settings:begin -->", end = "<!-- settings:end -->";
  std::string readme = readFile(MKERNEL_SOURCE_DIR "/README.md");
  if (readme.find(begin) == std::string::npos)
    readme = readFile(MKERNEL_SOURCE_DIR "/tests/common/settings-readme.md");
  const size_t b = readme.find(begin), e = readme.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  const std::set<std::string> inReadme = tableNames(readme.substr(b, e - b));
  CHECK(inReadme == declared({params::Audience::USER}));
  CHECK(inReadme.size() >= 15);
  CHECK(inReadme.size() <= 25);

  const std::string tuning = readFile(MKERNEL_SOURCE_DIR "/docs/TUNING.md");
  REQUIRE_FALSE(tuning.empty());
  CHECK(tableNames(tuning) == declared({params::Audience::USER, params::Audience::TUNING}));
  for (const std::string& hook : declared({params::Audience::TEST})) {
    INFO("test hook MKERNEL_" << hook << " is documented");
    CHECK(tuning.find("MKERNEL_" + hook) == std::string::npos);
    CHECK(readme.find("MKERNEL_" + hook) == std::string::npos);
  }
}
