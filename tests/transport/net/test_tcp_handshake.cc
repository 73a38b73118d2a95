// The TCP listener's handshake deadline (docs/RELIABILITY.md): a connector that sends part of its
// Hello and stalls is dropped at the next accept() after min(10 s, MKERNEL_TIMEOUT_S), and the
// listener keeps serving real connections.
#include "tests/catch.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "transport/net/net.h"
#include "transport/net/tcp/tcp_net.h"
#include "common/param.h"

using mkernel::Result;
namespace net = mkernel::net;

namespace {

// What a read on the raw socket sees within `ms`: 1 data, 0 EOF/reset (closed by the peer), -1
// nothing yet.
int peerState(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return -1;
  char c;
  ssize_t r = ::recv(fd, &c, 1, MSG_DONTWAIT);
  return r > 0 ? 1 : 0;
}

}  // namespace

TEST_CASE(
    "tcp listener: a stalled partial Hello is dropped after the handshake deadline; real "
    "connections still work") {
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  setenv("MKERNEL_TIMEOUT_S", "1", 1);
  mkernel::params::resetForTesting();
  std::string why;
  auto tcp = net::createTcpNet(&why);
  INFO(why);
  REQUIRE(tcp != nullptr);
  unsigned char handle[net::kHandleSize] = {};
  net::ListenComm* lc = nullptr;
  REQUIRE(tcp->listen(0, handle, &lc) == Result::Success);
  net::tcp::WireHandle wh;
  std::memcpy(&wh, handle, sizeof(wh));

  int raw = ::socket(wh.addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(raw >= 0);
  REQUIRE(::connect(raw, &wh.addr.sa, net::socketAddrLen(wh.addr)) == 0);
  const char partial[5] = {1, 2, 3, 4, 5};
  REQUIRE(::send(raw, partial, sizeof(partial), MSG_NOSIGNAL) == 5);

  net::RecvComm* rc = nullptr;
  REQUIRE(tcp->accept(lc, &rc) == Result::Success);
  CHECK(rc == nullptr);
  CHECK(peerState(raw, 200) == -1);  // within the deadline: still open

  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  REQUIRE(tcp->accept(lc, &rc) == Result::Success);
  CHECK(rc == nullptr);
  CHECK(peerState(raw, 2000) == 0);  // dropped: the stalled connector sees its socket closed
  ::close(raw);

  // A real connection after that.
  net::SendComm* sc = nullptr;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((sc == nullptr || rc == nullptr) && std::chrono::steady_clock::now() < until) {
    if (sc == nullptr) REQUIRE(tcp->connect(0, handle, &sc) == Result::Success);
    if (rc == nullptr) REQUIRE(tcp->accept(lc, &rc) == Result::Success);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(sc != nullptr);
  REQUIRE(rc != nullptr);
  CHECK(tcp->closeSend(sc) == Result::Success);
  CHECK(tcp->closeRecv(rc) == Result::Success);
  CHECK(tcp->closeListen(lc) == Result::Success);
  unsetenv("MKERNEL_TIMEOUT_S");
  mkernel::params::resetForTesting();
}
