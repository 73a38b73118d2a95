// common/: parameters, errors, and the README's variable table against params.def.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/log.h"
#include "common/param.h"
#include "common/result.h"

using mkernel::Result;

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
