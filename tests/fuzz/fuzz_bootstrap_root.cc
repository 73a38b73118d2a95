// libFuzzer target: the bootstrap root as a black box. A real root (createUniqueId) listens in
// this process; every input is sent over a fresh TCP connection, which is then half-closed. The
// root must drop the connection (never crash, never hang on it); every kCheckEvery inputs (or
// kCheckSeconds) a real two-rank rendezvous + allGather runs against the same root, proving it
// still serves, and a fresh root takes its place (a root serves one rendezvous).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "tests/fuzz/fuzz_util.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/validate.h"
#include "common/param.h"

using namespace mkernel;
using namespace mkernel::bootstrap;

namespace {

constexpr int kCheckEvery = 256;
constexpr double kCheckSeconds = 2.0;  // well inside the root's MKERNEL_TIMEOUT_S (20 s here)

UniqueId gId;
IdWire gWire;
int gSinceCheck = 0;
auto gLastCheck = std::chrono::steady_clock::now();

void newRoot() {
  if (createUniqueId(&gId) != Result::Success) mkernel::fuzz::fuzzFail("createUniqueId failed");
  std::string why;
  if (!parseUniqueId(gId.bytes, sizeof(gId.bytes), &gWire, &why))
    mkernel::fuzz::fuzzFail("createUniqueId made an id that does not parse");
}

// Two ranks (threads) rendezvous at the root and allGather their ranks.
void checkRootServes() {
  std::atomic<int> ok{0};
  auto rankMain = [&](int rank) {
    std::unique_ptr<Bootstrap> b;
    if (Bootstrap::create(gId, rank, 2, &b) != Result::Success) return;
    int slots[2] = {-1, -1};
    slots[rank] = 100 + rank;
    if (b->allGather(slots, sizeof(int)) == Result::Success && slots[0] == 100 && slots[1] == 101)
      ok.fetch_add(1);
  };
  std::thread t0(rankMain, 0), t1(rankMain, 1);
  t0.join();
  t1.join();
  if (ok.load() != 2)
    mkernel::fuzz::fuzzFail("the root no longer serves a rendezvous after fuzz input");
  newRoot();
  gSinceCheck = 0;
  gLastCheck = std::chrono::steady_clock::now();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mkernel::fuzz::quietEnvironment("20");
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);  // keep the fuzz traffic on loopback
  mkernel::params::resetForTesting();
  newRoot();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = mkernel::fuzz::rawConnect(&gWire.root.sa, gWire.root.len(), 2000);
  if (fd < 0) mkernel::fuzz::fuzzFail("cannot connect to the bootstrap root");
  mkernel::fuzz::sendSome(fd, data, size);
  ::shutdown(fd, SHUT_WR);
  // The root handles one connection at a time: wait until it dropped ours, so that the next input
  // meets a root that is back in accept(). A root that keeps a malformed connection is a bug.
  if (!mkernel::fuzz::drainUntilClosed(fd, 3000))
    mkernel::fuzz::fuzzFail("the root kept a malformed connection open");
  ::close(fd);
  if (++gSinceCheck >= kCheckEvery || mkernel::fuzz::secondsSince(gLastCheck) > kCheckSeconds)
    checkRootServes();
  return 0;
}
