// The proxy across two processes (label proc): the peer process is SIGKILLed in the middle of a
// stream of transfers; the survivor's producer must see the failure within MKERNEL_TIMEOUT_S,
// with an error naming the peer, never a hang.
#include "tests/catch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/net/net.h"
#include "transport/proxy/proxy.h"
#include "common/param.h"

using mkernel::Result;
using namespace mkernel::proxy;

namespace {

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

ProxyCmd command(uint32_t op, int peer, const void* addr, uint64_t bytes, uint32_t flag) {
  ProxyCmd c{};
  c.op = op;
  c.peer = peer;
  c.addr = reinterpret_cast<uint64_t>(addr);
  c.bytes = bytes;
  c.tag = 5;
  c.flag = flag;
  return c;
}

constexpr size_t kMsg = 1 << 20;
constexpr uint64_t kLongNs = 30ull * 1000000000ull;

// One rank of the pair: its net, ring, flags, buffer and proxy, connected to the other process
// through handles exchanged over the pipes.
struct Side {
  std::unique_ptr<mkernel::net::Net> net;
  std::unique_ptr<ProxyRing> ring{new ProxyRing()};
  std::unique_ptr<ProxyFlags> flags{new ProxyFlags()};
  std::vector<uint8_t> buf = std::vector<uint8_t>(8 * kMsg, 0x5a);
  std::unique_ptr<Proxy> proxy;

  std::string setUp(int rank, int toPeer, int fromPeer) {
    std::string why;
    net = mkernel::net::createTcpNet(&why);
    if (!net) return "createTcpNet: " + why;
    std::memset(ring.get(), 0, sizeof(ProxyRing));
    std::memset(flags.get(), 0, sizeof(ProxyFlags));
    proxy.reset(new Proxy(net.get(), 0, rank, 2, ring.get(), flags.get()));
    std::vector<Handle> mine;
    if (proxy->listenHandles(&mine) != Result::Success)
      return std::string("listen: ") + mkernel::lastError();
    const int peer = 1 - rank;
    std::vector<Handle> theirs(2);
    theirs[static_cast<size_t>(peer)].resize(mkernel::net::kHandleSize);
    if (!writeAll(toPeer, mine[static_cast<size_t>(peer)].data(), mkernel::net::kHandleSize) ||
        !readAll(fromPeer, theirs[static_cast<size_t>(peer)].data(), mkernel::net::kHandleSize))
      return "handle exchange over the pipes failed";
    if (proxy->connectAll(theirs) != Result::Success)
      return std::string("connectAll: ") + mkernel::lastError();
    if (proxy->registerRegion(buf.data(), buf.size(), mkernel::net::kPtrHost) != Result::Success)
      return std::string("registerRegion: ") + mkernel::lastError();
    if (proxy->start({}) != Result::Success) return std::string("start: ") + mkernel::lastError();
    return "";
  }
};

}  // namespace

TEST_CASE(
    "proxy, two processes: the peer is SIGKILLed mid-stream; the survivor fails within the "
    "timeout") {
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  setenv("MKERNEL_TIMEOUT_S", "3", 1);
  mkernel::params::resetForTesting();
  int p2c[2], c2p[2];
  REQUIRE(::pipe(p2c) == 0);
  REQUIRE(::pipe(c2p) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Rank 1: sends 1 MiB messages to rank 0 for as long as it lives.
    Side s;
    if (!s.setUp(1, c2p[1], p2c[0]).empty()) _exit(2);
    for (uint64_t i = 0;; ++i) {
      if (proxyPost(s.ring.get(), s.flags.get(),
                    command(kOpSend, 0, s.buf.data() + (i % 8) * kMsg, kMsg, 0),
                    kLongNs) != PostStatus::kPosted)
        _exit(3);
      if (i >= 4 && proxyWaitFlag(s.flags.get(), 0, i - 3, kLongNs) != WaitStatus::kReached)
        _exit(4);
    }
  }
  Side s;
  const std::string why = s.setUp(0, p2c[1], c2p[0]);
  INFO(why);
  REQUIRE(why.empty());
  // Receive 4 messages, then kill the sender while more receives are posted.
  uint64_t posted = 0;
  auto post = [&] {
    REQUIRE(proxyPost(s.ring.get(), s.flags.get(),
                      command(kOpRecv, 1, s.buf.data() + (posted % 8) * kMsg, kMsg, 1),
                      kLongNs) == PostStatus::kPosted);
    ++posted;
  };
  for (int i = 0; i < 8; ++i) post();
  REQUIRE(proxyWaitFlag(s.flags.get(), 1, 4, kLongNs) == WaitStatus::kReached);
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  const auto t0 = std::chrono::steady_clock::now();
  // Keep receiving: the messages already in flight may still land, then a receive must fail.
  while (posted < 64) {
    post();
    if (proxyWaitFlag(s.flags.get(), 1, posted, 10ull * 1000000000ull) != WaitStatus::kReached)
      break;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s.proxy->failed());
  CHECK(secs < 3.0 + 2.0);  // MKERNEL_TIMEOUT_S bounds it; a reset connection fails at once
  INFO(s.proxy->error());
  CHECK(s.proxy->error().find("with rank 1") != std::string::npos);
  CHECK(s.proxy->stop() == Result::Success);
  unsetenv("MKERNEL_TIMEOUT_S");
  mkernel::params::resetForTesting();
}
