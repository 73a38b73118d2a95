// common/text.h: trim and randomNonce.
#include "tests/catch.h"

#include <set>
#include <string>

#include "common/text.h"

using mkernel::randomNonce;
using mkernel::trim;

TEST_CASE("text: trim removes leading and trailing white space only") {
  CHECK(trim("") == "");
  CHECK(trim(" \t\r\n") == "");
  CHECK(trim("x") == "x");
  CHECK(trim("  allreduce , 4 ") == "allreduce , 4");
  CHECK(trim("\tnet\r") == "net");
  CHECK(trim("a b") == "a b");
}

TEST_CASE("text: randomNonce is never 0 and differs from call to call") {
  std::set<uint64_t> seen;
  for (int i = 0; i < 64; ++i) {
    const uint64_t v = randomNonce();
    CHECK(v != 0);
    seen.insert(v);
  }
  CHECK(seen.size() == 64);
}
