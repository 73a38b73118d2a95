// transport/bootstrap: rendezvous, collectives over it, and its failure modes, with ranks as
// threads of this process on loopback.
#include "tests/catch.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/sock.h"
#include "transport/bootstrap/wire.h"
#include "common/param.h"

using mkernel::Result;
using mkernel::bootstrap::Bootstrap;
using mkernel::bootstrap::UniqueId;

namespace {

// Every log line of this test binary goes to a file that a test reads back (set before the first
// line is logged: the log's settings are read once).
std::string logPath() {
  return "/tmp/mk-test-bootstrap-" + std::to_string(getpid()) + ".log";
}
struct LogToFile {
  LogToFile() { setenv("MKERNEL_DEBUG_FILE", logPath().c_str(), 1); }
  ~LogToFile() { std::remove(logPath().c_str()); }
} gLogToFile;

std::string logText() {
  std::string text;
  if (FILE* f = std::fopen(logPath().c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

struct LoopbackEnv {
  LoopbackEnv() {
    setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
    mkernel::params::resetForTesting();
  }
  ~LoopbackEnv() {
    unsetenv("MKERNEL_SOCKET_IFNAME");
    unsetenv("MKERNEL_TIMEOUT_S");
    mkernel::params::resetForTesting();
  }
};

// Runs fn(rank, bootstrap) on n threads after a rendezvous; returns each rank's create result.
template <typename Fn>
std::vector<Result> runRanks(int n, Fn fn) {
  UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  std::vector<Result> res(n, Result::InternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Bootstrap> b;
      res[r] = Bootstrap::create(id, r, n, &b);
      if (res[r] == Result::Success) res[r] = fn(r, *b);
    });
  }
  for (auto& t : threads) t.join();
  return res;
}

// Ranks 0 and 1 of a fresh two-rank bootstrap, connected: rank 1 has sent `value` with `tag` and
// rank 0 has received it.
void connectedPair(std::unique_ptr<Bootstrap>* b0, std::unique_ptr<Bootstrap>* b1, int tag,
                   int value) {
  UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  // Catch2's assertions are not thread-safe (ThreadSanitizer sees two at once): the
  // thread keeps its result, checked after the join.
  Result r1 = Result::InternalError;
  std::thread t([&] { r1 = Bootstrap::create(id, 1, 2, b1); });
  const Result r0 = Bootstrap::create(id, 0, 2, b0);
  t.join();
  REQUIRE(r0 == Result::Success);
  REQUIRE(r1 == Result::Success);
  REQUIRE((*b1)->send(0, tag, &value, sizeof(value)) == Result::Success);
  int got = 0;
  REQUIRE((*b0)->recv(1, tag, &got, sizeof(got)) == Result::Success);
  CHECK(got == value);
}

}  // namespace

TEST_CASE("bootstrap: ids are recognised, foreign ids refused") {
  LoopbackEnv env;
  UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  CHECK(mkernel::bootstrap::isMkernelId(id));
  UniqueId foreign;
  std::memset(foreign.bytes, 0x5a, sizeof(foreign.bytes));
  CHECK_FALSE(mkernel::bootstrap::isMkernelId(foreign));
  std::unique_ptr<Bootstrap> b;
  CHECK(Bootstrap::create(foreign, 0, 1, &b) == Result::InvalidArgument);
  CHECK(Bootstrap::create(id, 2, 2, &b) == Result::InvalidArgument);
  // Let the root of `id` serve: a single rank completes it.
  CHECK(Bootstrap::create(id, 0, 1, &b) == Result::Success);
}

TEST_CASE("bootstrap: allGather, broadcast, barrier and tagged send/recv") {
  LoopbackEnv env;
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<Result> res = runRanks(n, [n](int rank, Bootstrap& b) -> Result {
      std::vector<uint64_t> slots(n, 0);
      slots[rank] = 1000 + rank;
      MK_CHECK(b.allGather(slots.data(), sizeof(uint64_t)));
      for (int i = 0; i < n; ++i)
        if (slots[i] != 1000u + i) return Result::InternalError;
      uint64_t v = rank == n - 1 ? 42 : 0;
      MK_CHECK(b.broadcast(&v, sizeof(v), n - 1));
      if (v != 42) return Result::InternalError;
      MK_CHECK(b.barrier());
      // Two tags interleaved to the next rank; the receiver reads them in the opposite order.
      int next = (rank + 1) % n, prev = (rank - 1 + n) % n;
      int a = rank * 10 + 1, c = rank * 10 + 2;
      MK_CHECK(b.send(next, 7, &a, sizeof(a)));
      MK_CHECK(b.send(next, 9, &c, sizeof(c)));
      int ra = 0, rc = 0;
      MK_CHECK(b.recv(prev, 9, &rc, sizeof(rc)));
      MK_CHECK(b.recv(prev, 7, &ra, sizeof(ra)));
      if (ra != prev * 10 + 1 || rc != prev * 10 + 2) return Result::InternalError;
      // A size mismatch is an error, not a silent truncation.
      MK_CHECK(b.send(next, 11, &a, sizeof(a)));
      char small = 0;
      if (b.recv(prev, 11, &small, 1) != Result::InternalError) return Result::InternalError;
      return b.barrier();
    });
    for (int r = 0; r < n; ++r) {
      INFO("n=" << n << " rank=" << r);
      CHECK(res[r] == Result::Success);
    }
  }
}

TEST_CASE("bootstrap: a missing rank is a timeout error, not a hang") {
  LoopbackEnv env;
  setenv("MKERNEL_TIMEOUT_S", "1", 1);
  mkernel::params::resetForTesting();
  UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Bootstrap> b;
  Result r = Bootstrap::create(id, 0, 2, &b);  // rank 1 never comes
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r == Result::RemoteError);
  CHECK(s < 5.0);
}

TEST_CASE("bootstrap: a peer that goes away makes recv fail; abort makes it return") {
  LoopbackEnv env;
  std::unique_ptr<Bootstrap> b0, b1;
  connectedPair(&b0, &b1, 1, 5);
  int y = 0;
  b1.reset();  // the peer's process "dies": its connections close
  auto t0 = std::chrono::steady_clock::now();
  CHECK(b0->recv(1, 1, &y, sizeof(y)) == Result::RemoteError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));

  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b0->abort();
  });
  t0 = std::chrono::steady_clock::now();
  CHECK(b0->recv(0, 3, &y, sizeof(y)) == Result::RemoteError);  // nothing will come from self
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  aborter.join();
}

TEST_CASE(
    "bootstrap: a peer that closes between frames has left: an error for whoever waits on it, no "
    "warning") {
  // Every communicator's destruction closes its connections: a WARN for each would fill every
  // job's exit with "peer closed the connection while reading a frame header".
  LoopbackEnv env;
  std::unique_ptr<Bootstrap> b0, b1;
  connectedPair(&b0, &b1, 5, 7);
  int y = 0;
  b1.reset();
  CHECK(b0->recv(1, 5, &y, sizeof(y)) == Result::RemoteError);
  const std::string why = mkernel::lastError();
  CHECK(why.find("peer 1 closed its connection") != std::string::npos);
  b0.reset();
  const std::string log = logText();
  INFO("log:\n" << log);
  CHECK(log.find("peer 1 closed its connection") !=
        std::string::npos);  // the waiter's error: logged
  CHECK(log.find("while reading a frame header") ==
        std::string::npos);  // the close itself: not a warning
}

TEST_CASE("bootstrap: the root rejects malformed hellos and still completes") {
  LoopbackEnv env;
  UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  mkernel::bootstrap::IdWire w;
  std::memcpy(&w, id.bytes, sizeof(w));
  // A stranger connects and sends garbage, another sends a truncated hello and closes.
  for (size_t bytes : {sizeof(mkernel::bootstrap::HelloWire), size_t(7)}) {
    int fd = -1;
    REQUIRE(mkernel::bootstrap::connectTo(w.root, mkernel::bootstrap::Deadline::in(5), &fd,
                                          "test") == Result::Success);
    std::vector<char> junk(bytes, 0x7f);
    REQUIRE(mkernel::bootstrap::sendAll(fd, junk.data(), junk.size(),
                                        mkernel::bootstrap::Deadline::in(5),
                                        "test") == Result::Success);
    mkernel::bootstrap::closeFd(&fd);
  }
  std::unique_ptr<Bootstrap> b0, b1;
  Result r1 = Result::InternalError;
  std::thread t([&] { r1 = Bootstrap::create(id, 1, 2, &b1); });
  CHECK(Bootstrap::create(id, 0, 2, &b0) == Result::Success);
  t.join();
  CHECK(r1 == Result::Success);
  CHECK(Bootstrap::hostHash() != 0);
}

TEST_CASE(
    "bootstrap: MKERNEL_HOSTID stands for the host (processes of one machine as several hosts)") {
  unsetenv("MKERNEL_HOSTID");
  mkernel::params::resetForTesting();
  const uint64_t machine = Bootstrap::hostHash();
  setenv("MKERNEL_HOSTID", "node-a", 1);
  mkernel::params::resetForTesting();
  const uint64_t a = Bootstrap::hostHash();
  setenv("MKERNEL_HOSTID", "node-b", 1);
  mkernel::params::resetForTesting();
  const uint64_t b = Bootstrap::hostHash();
  setenv("MKERNEL_HOSTID", "node-a", 1);
  mkernel::params::resetForTesting();
  CHECK(Bootstrap::hostHash() == a);
  unsetenv("MKERNEL_HOSTID");
  mkernel::params::resetForTesting();
  CHECK(Bootstrap::hostHash() == machine);
  CHECK(a != b);
  CHECK(a != machine);
  CHECK(b != machine);
}

TEST_CASE("bootstrap: a client that connects to the root and sends nothing delays nobody") {
  LoopbackEnv env;
  UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  mkernel::bootstrap::IdWire w;
  std::memcpy(&w, id.bytes, sizeof(w));
  // Two silent clients, one with a partial hello, both kept open through the rendezvous.
  int silent = -1, partial = -1;
  REQUIRE(mkernel::bootstrap::connectTo(w.root, mkernel::bootstrap::Deadline::in(5), &silent,
                                        "test") == Result::Success);
  REQUIRE(mkernel::bootstrap::connectTo(w.root, mkernel::bootstrap::Deadline::in(5), &partial,
                                        "test") == Result::Success);
  const char some[9] = {};
  REQUIRE(mkernel::bootstrap::sendAll(partial, some, sizeof(some),
                                      mkernel::bootstrap::Deadline::in(5),
                                      "test") == Result::Success);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Bootstrap> b0, b1;
  Result r1 = Result::InternalError;
  std::thread t([&] { r1 = Bootstrap::create(id, 1, 2, &b1); });
  CHECK(Bootstrap::create(id, 0, 2, &b0) == Result::Success);
  t.join();
  CHECK(r1 == Result::Success);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 2.0);  // a root serving one connection at a time would take 10 s for each
  mkernel::bootstrap::closeFd(&silent);
  mkernel::bootstrap::closeFd(&partial);
}
