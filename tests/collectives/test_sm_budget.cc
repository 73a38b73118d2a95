// The process's ledger of SMs held by persistent kernels (collectives/runtime/sm_budget.h).
#include "tests/catch.h"

#include "collectives/runtime/sm_budget.h"

using mkernel::coll::kReservedSms;
using mkernel::coll::SmBudget;

TEST_CASE("sm budget: communicators on one GPU share its SMs; released SMs come back") {
  SmBudget& b = SmBudget::process();
  const int dev = 77;  // a device index no other test uses
  REQUIRE(b.held(dev) == 0);
  CHECK(b.available(dev, 132) == 132 - kReservedSms);
  b.reserve(dev, 2 * 64);  // a 2-rank communicator with 64 CTAs per rank
  CHECK(b.held(dev) == 128);
  CHECK(b.available(dev, 132) == 0);
  CHECK(b.available(dev + 1, 132) == 132 - kReservedSms);  // other GPUs are not affected
  b.release(dev, 64);
  CHECK(b.available(dev, 132) == 64);
  b.release(dev, 64);
  CHECK(b.held(dev) == 0);
  b.release(dev, 5);  // never negative
  CHECK(b.held(dev) == 0);
  CHECK(b.available(dev, 2) == 0);  // a GPU smaller than the SMs kept free
}
