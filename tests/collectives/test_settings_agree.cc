// collectives/route/settings_agree.cc: the route settings compared at communicator creation, with
// ranks as threads of this process on a loopback bootstrap, each passing its own settings.
#include "tests/catch.h"

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "common/param.h"
#include "transport/bootstrap/bootstrap.h"

using mkernel::Result;
using mkernel::bootstrap::Bootstrap;
using mkernel::coll::RouteSettings;

namespace {

struct LoopbackEnv {
  LoopbackEnv() {
    setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
    setenv("MKERNEL_TIMEOUT_S", "20", 1);
    mkernel::params::resetForTesting();
  }
  ~LoopbackEnv() {
    unsetenv("MKERNEL_SOCKET_IFNAME");
    unsetenv("MKERNEL_TIMEOUT_S");
    mkernel::params::resetForTesting();
  }
};

struct Outcome {
  Result result = Result::InternalError;
  std::string error;
};

// Every rank agrees on settings[rank]; each rank's result and error text.
std::vector<Outcome> agree(const std::vector<RouteSettings>& settings) {
  const int n = static_cast<int>(settings.size());
  mkernel::bootstrap::UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  std::vector<Outcome> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Bootstrap> b;
      Outcome& o = out[static_cast<size_t>(r)];
      o.result = Bootstrap::create(id, r, n, &b);
      if (o.result == Result::Success)
        o.result = mkernel::coll::agreeSettings(*b, settings[static_cast<size_t>(r)], "test");
      if (o.result != Result::Success) o.error = mkernel::lastError();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("route settings: the same on every rank pass", "[settings]") {
  LoopbackEnv env;
  const RouteSettings s = mkernel::coll::routeSettingsInEffect();
  REQUIRE(s.size() > 10);
  CHECK(s[0].first == "mkernel version");
  for (int n : {1, 2, 4}) {
    const std::vector<Outcome> out = agree(std::vector<RouteSettings>(static_cast<size_t>(n), s));
    for (const Outcome& o : out) CHECK(o.result == Result::Success);
  }
}

TEST_CASE("route settings: one setting different on one rank fails every rank, naming it",
          "[settings]") {
  LoopbackEnv env;
  const RouteSettings base = mkernel::coll::routeSettingsInEffect();
  // Each ROUTE setting in turn, changed on the last rank, with 2 and 4 ranks.
  for (int n : {2, 4}) {
    for (size_t k = 1; k < base.size(); ++k) {
      std::vector<RouteSettings> settings(static_cast<size_t>(n), base);
      settings.back()[k].second = base[k].second + "x";
      const std::vector<Outcome> out = agree(settings);
      for (int r = 0; r < n; ++r) {
        const Outcome& o = out[static_cast<size_t>(r)];
        INFO(base[k].first << " with " << n << " ranks, rank " << r << ": " << o.error);
        CHECK(o.result == Result::InvalidUsage);
        CHECK(contains(o.error, "1 differ: " + base[k].first + ":"));
        const std::string others = n == 2 ? "rank 0" : "ranks 0-" + std::to_string(n - 2);
        CHECK(contains(o.error, "'" + base[k].second + "' on " + others));
        CHECK(contains(o.error, "'" + base[k].second + "x' on rank " + std::to_string(n - 1)));
      }
    }
  }
}

TEST_CASE("route settings: several differences, and a setting only one rank's mkernel has",
          "[settings]") {
  LoopbackEnv env;
  RouteSettings base = {
      {"mkernel version", "1.2.0"}, {"MKERNEL_DISABLE", "0"}, {"MKERNEL_ALGO", "auto"}};
  std::vector<RouteSettings> s(4, base);
  s[1][1].second = "1";  // MKERNEL_DISABLE=1 on ranks 1 and 3
  s[3][1].second = "1";
  s[2][0].second = "1.3.0";
  s[2].emplace_back("MKERNEL_NEW", "on");
  const std::vector<Outcome> out = agree(s);
  for (const Outcome& o : out) {
    INFO(o.error);
    CHECK(o.result == Result::InvalidUsage);
    CHECK(contains(o.error, "3 differ"));
    CHECK(contains(o.error, "mkernel version: '1.2.0' on ranks 0, 1, 3, '1.3.0' on rank 2"));
    CHECK(contains(o.error, "MKERNEL_DISABLE: '0' on ranks 0, 2, '1' on ranks 1, 3"));
    CHECK(contains(o.error,
                   "MKERNEL_NEW: (not a setting of its mkernel) on ranks 0, 1, 3, 'on' on rank 2"));
    CHECK_FALSE(contains(o.error, "MKERNEL_ALGO"));
  }
}

TEST_CASE("route settings: many differences are counted, not listed", "[settings]") {
  LoopbackEnv env;
  const RouteSettings base = mkernel::coll::routeSettingsInEffect();
  std::vector<RouteSettings> s(2, base);
  for (size_t k = 1; k < base.size(); ++k) s[1][k].second += "x";
  const std::vector<Outcome> out = agree(s);
  for (const Outcome& o : out) {
    CHECK(o.result == Result::InvalidUsage);
    CHECK(contains(o.error, std::to_string(base.size() - 1) + " differ"));
    CHECK(contains(o.error, "and " + std::to_string(base.size() - 5) + " more"));
  }
}

TEST_CASE("route settings: the environment's values are what is compared", "[settings]") {
  LoopbackEnv env;
  const RouteSettings defaults = mkernel::coll::routeSettingsInEffect();
  setenv("MKERNEL_LAUNCH_MAX_BYTES", "2m", 1);
  mkernel::params::resetForTesting();
  const RouteSettings set = mkernel::coll::routeSettingsInEffect();
  unsetenv("MKERNEL_LAUNCH_MAX_BYTES");
  mkernel::params::resetForTesting();
  REQUIRE(set.size() == defaults.size());
  std::vector<std::string> changed;
  for (size_t k = 0; k < set.size(); ++k)
    if (set[k] != defaults[k]) changed.push_back(set[k].first);
  CHECK(changed == std::vector<std::string>{"MKERNEL_LAUNCH_MAX_BYTES"});
  // Two ranks, one with the variable set: the agreement fails.
  const std::vector<Outcome> out = agree({defaults, set});
  for (const Outcome& o : out) CHECK(o.result == Result::InvalidUsage);
}
