// The TCP backend of net::Net: the shared suite, plus what only TCP has (interface selection,
// striping settings, its handshake checks).
#include "tests/catch.h"

#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "tests/transport/net/net_suite.h"
#include "transport/net/socket_iface.h"
#include "transport/net/tcp/tcp_net.h"

using mkernel::Result;
using mkernel::nettest::ScopedEnv;
namespace net = mkernel::net;

namespace {
std::unique_ptr<net::Net> tcpNet() {
  std::string why;
  auto n = net::createTcpNet(&why);
  INFO(why);
  REQUIRE(n != nullptr);
  return n;
}
// Posts one receive of in.size() bytes for `tag` into `in`.
Result postRecvInto(mkernel::nettest::CommPair& pair, std::vector<char>& in, int tag,
                    net::Request** r) {
  void* d[1] = {in.data()};
  size_t sz[1] = {in.size()};
  int tags[1] = {tag};
  *r = nullptr;
  return pair.net->irecv(pair.recv, 1, d, sz, tags, nullptr, r);
}
}  // namespace

MKERNEL_NET_SUITE("tcp", tcpNet)
// TCP buffers a send posted before its receive, so the checks that need that run here too.
MKERNEL_NET_SUITE_EARLY_SENDS("tcp", tcpNet)

TEST_CASE("tcp net: striping variants move every byte") {
  using mkernel::nettest::SendOrder;
  SECTION("one socket") {
    ScopedEnv s("MKERNEL_NET_SOCKETS", "1");
    mkernel::nettest::checkSizes(tcpNet);
    mkernel::nettest::checkSizes(tcpNet, SendOrder::kBeforeReceive);
  }
  SECTION("four sockets, 4 KiB chunks") {
    ScopedEnv s("MKERNEL_NET_SOCKETS", "4");
    ScopedEnv c("MKERNEL_NET_CHUNK_BYTES", "4096");
    mkernel::nettest::checkSizes(tcpNet);
    mkernel::nettest::checkSizes(tcpNet, SendOrder::kBeforeReceive);
    mkernel::nettest::checkGroupedReceives(tcpNet);
    mkernel::nettest::checkPostingOrderCompletion(tcpNet);
  }
  SECTION("progress threads only (no inline progress in test)") {
    ScopedEnv i("MKERNEL_NET_INLINE_PROGRESS", "0");
    ScopedEnv s("MKERNEL_NET_SOCKETS", "3");
    mkernel::nettest::checkSizes(tcpNet);
    mkernel::nettest::checkSizes(tcpNet, SendOrder::kBeforeReceive);
    mkernel::nettest::checkManyInFlightAndBackPressure(tcpNet);
  }
}

// A stall names what it waits for (docs/RELIABILITY.md: the hierarchical path's proxy stall): a
// message whose tag no posted receive has is read, kept, and reported with the posted tags.
TEST_CASE(
    "tcp net: a stalled receive describes its posted tags, the unmatched header and its sockets") {
  ScopedEnv timeout("MKERNEL_TIMEOUT_S", "1");
  mkernel::nettest::CommPair pair;
  mkernel::nettest::connectPair(tcpNet, &pair);
  std::vector<char> out(1011, 3), in(1024, 0);
  net::Request* s = nullptr;
  REQUIRE(pair.net->isend(pair.send, out.data(), out.size(), /*tag=*/5, nullptr, &s) ==
          Result::Success);
  REQUIRE(s != nullptr);
  net::Request* r = nullptr;
  REQUIRE(postRecvInto(pair, in, 7, &r) == Result::Success);
  REQUIRE(r != nullptr);
  bool sDone = false, rDone = false;
  size_t got[1];
  // The send completes: its bytes are in the receiver's socket.
  REQUIRE(mkernel::nettest::waitRequest(*pair.net, s, got, 5.0, &sDone) == Result::Success);
  REQUIRE(sDone);
  Result res = mkernel::nettest::waitRequest(*pair.net, r, got, 5.0, &rDone);
  const std::string msg = mkernel::lastError();
  INFO(msg);
  CHECK_FALSE(rDone);
  CHECK(res == Result::RemoteError);
  CHECK(msg.find("no byte moved") != std::string::npos);
  CHECK(msg.find("1 receive(s) in flight [tag 7 <=1024 B]") != std::string::npos);
  CHECK(msg.find("a header for tag 5 (1011 B) was read and no posted receive has that tag") !=
        std::string::npos);
  // The payload behind the header waits in the kernel.
  CHECK(msg.find("socket 0: 0 B to read, kernel unread 1011 B") != std::string::npos);
}

// A peer closes all the sockets of its comm together. A survivor on emulated nodes can otherwise
// wait out its whole timeout with its socket 1 closed (an event seen, nothing to read) and socket
// 0 silent (docs/RELIABILITY.md). A close seen on a data socket ends the connection once socket
// 0 has brought nothing for kCloseGraceS (1 s), and never before what the peer sent first is read.
// Here the sender's socket 1 alone is shut (SHUT_WR: its FIN goes out, socket 0 stays open).
namespace {
void shutSendersSocket1(const mkernel::nettest::CommPair& pair) {
  auto* send = static_cast<net::tcp::TcpSendComm*>(pair.send);
  REQUIRE(send->core->socks.size() >= 2);
  REQUIRE(::shutdown(send->core->socks[1].fd, SHUT_WR) == 0);
}
void exchange(mkernel::nettest::CommPair& pair, int tag) {
  std::vector<char> out(4096, static_cast<char>(tag)), in(4096, 0);
  net::Request* r = nullptr;
  net::Request* s = nullptr;
  REQUIRE(postRecvInto(pair, in, tag, &r) == Result::Success);
  REQUIRE(pair.net->isend(pair.send, out.data(), out.size(), tag, nullptr, &s) == Result::Success);
  size_t got[1] = {};
  mkernel::nettest::completeBoth(*pair.net, s, r, got);
  CHECK(got[0] == out.size());
  CHECK(in == out);
}
}  // namespace

TEST_CASE(
    "tcp net: a close seen on a data socket ends a posted receive although socket 0 stays open") {
  ScopedEnv timeout("MKERNEL_TIMEOUT_S", "20");
  ScopedEnv socks("MKERNEL_NET_SOCKETS", "2");
  auto run = [] {
    mkernel::nettest::CommPair pair;
    mkernel::nettest::connectPair(tcpNet, &pair);
    exchange(pair, 1);  // the connection works
    std::vector<char> in(4096, 0);
    net::Request* r = nullptr;
    REQUIRE(postRecvInto(pair, in, 2, &r) == Result::Success);
    shutSendersSocket1(pair);
    const auto t0 = std::chrono::steady_clock::now();
    bool done = false;
    size_t got[1];
    const Result res = mkernel::nettest::waitRequest(*pair.net, r, got, 10.0, &done);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string msg = mkernel::lastError();
    INFO(msg << " (after " << s << " s)");
    CHECK_FALSE(done);
    CHECK(res == Result::RemoteError);
    CHECK(msg.find("connection closed by peer") != std::string::npos);
    CHECK(msg.find("its socket 1 closed; socket 0, still open, brought nothing for") !=
          std::string::npos);
    CHECK(s >= 0.9);  // the grace: socket 0 might still bring what was sent first
    CHECK(s < 5.0);   // not the 20 s timeout
  };
  SECTION("inline progress") {
    run();
  }
  SECTION("progress thread only") {
    ScopedEnv inl("MKERNEL_NET_INLINE_PROGRESS", "0");
    run();
  }
}

TEST_CASE(
    "tcp net: what the peer sent before a data socket's close is still received after the grace "
    "too") {
  ScopedEnv timeout("MKERNEL_TIMEOUT_S", "20");
  ScopedEnv socks("MKERNEL_NET_SOCKETS", "2");
  mkernel::nettest::CommPair pair;
  mkernel::nettest::connectPair(tcpNet, &pair);
  exchange(pair, 1);
  // A message (on socket 0, below the chunk size) whose receive is posted only after the close
  // and the grace have passed.
  std::vector<char> out(4096, 9), in(4096, 0);
  net::Request* s = nullptr;
  REQUIRE(pair.net->isend(pair.send, out.data(), out.size(), 3, nullptr, &s) == Result::Success);
  bool done = false;
  size_t got[1] = {};
  REQUIRE(mkernel::nettest::waitRequest(*pair.net, s, got, 5.0, &done) == Result::Success);
  REQUIRE(done);  // in the receiver's socket
  shutSendersSocket1(pair);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  net::Request* r = nullptr;
  REQUIRE(postRecvInto(pair, in, 3, &r) == Result::Success);
  REQUIRE(r != nullptr);
  done = false;
  Result res = mkernel::nettest::waitRequest(*pair.net, r, got, 5.0, &done);
  INFO(mkernel::lastError());
  REQUIRE(res == Result::Success);
  REQUIRE(done);
  CHECK(got[0] == out.size());
  CHECK(in == out);
  // Nothing more can come: the next receive fails after the grace.
  res = postRecvInto(pair, in, 4, &r);
  if (res == Result::Success && r != nullptr)
    res = mkernel::nettest::waitRequest(*pair.net, r, got, 10.0, &done);
  INFO(mkernel::lastError());
  CHECK(res == Result::RemoteError);
  CHECK(std::string(mkernel::lastError()).find("its socket 1 closed") != std::string::npos);
}

TEST_CASE("tcp net: a handle with a wrong nonce is refused at the handshake") {
  auto n = tcpNet();
  char handle[net::kHandleSize];
  net::ListenComm* l = nullptr;
  REQUIRE(n->listen(0, handle, &l) == Result::Success);
  // WireHandle: magic(4) version(2) nSocks(2) nonce(8) ...
  handle[8] ^= 0x5a;
  net::SendComm* s = nullptr;
  Result r = Result::Success;
  for (int i = 0; i < 200000 && r == Result::Success && s == nullptr; ++i)
    r = n->connect(0, handle, &s);
  CHECK(r == Result::RemoteError);
  CHECK(s == nullptr);
  CHECK(std::string(mkernel::lastError()).find("nonce") != std::string::npos);
  net::RecvComm* rc = nullptr;
  CHECK(n->accept(l, &rc) == Result::Success);
  CHECK(rc == nullptr);
  CHECK(n->closeListen(l) == Result::Success);
}

TEST_CASE("tcp net: a foreign handle is rejected before any socket is made") {
  auto n = tcpNet();
  char handle[net::kHandleSize] = {};
  net::SendComm* s = reinterpret_cast<net::SendComm*>(0x1);
  CHECK(n->connect(0, handle, &s) == Result::InvalidArgument);
  CHECK(s == nullptr);
  net::ListenComm* l = reinterpret_cast<net::ListenComm*>(0x1);
  CHECK(n->listen(n->deviceCount(), handle, &l) == Result::InvalidArgument);
  CHECK(l == nullptr);
}

TEST_CASE("tcp net: host memory only") {
  mkernel::nettest::CommPair pair;
  mkernel::nettest::connectPair(tcpNet, &pair);
  char buf[64];
  void* mh = nullptr;
  CHECK(pair.net->regMr(pair.send, buf, sizeof(buf), net::kPtrHost, &mh) == Result::Success);
  CHECK(pair.net->deregMr(pair.send, mh) == Result::Success);
  CHECK(pair.net->regMr(pair.send, buf, sizeof(buf), net::kPtrCuda, &mh) ==
        Result::InvalidArgument);
  CHECK(pair.net->regMrDmaBuf(pair.recv, buf, sizeof(buf), net::kPtrDmaBuf, 0, 3, &mh) ==
        Result::InvalidArgument);
  net::Request* req = reinterpret_cast<net::Request*>(0x1);
  CHECK(pair.net->iflush(pair.recv, 1, nullptr, nullptr, nullptr, &req) == Result::Success);
  CHECK(req == nullptr);
}

TEST_CASE("tcp net: properties come from the interface") {
  auto n = tcpNet();
  for (int d = 0; d < n->deviceCount(); ++d) {
    net::DeviceProps p;
    REQUIRE(n->getProperties(d, &p) == Result::Success);
    INFO("device " << d << " = " << p.name);
    std::ifstream f("/sys/class/net/" + p.name + "/speed");
    long speed = -1;
    if (f >> speed && speed > 0) {
      CHECK(p.speedMbps == speed);
    } else {
      CHECK(p.speedMbps == net::kDefaultSpeedMbps);
    }
    CHECK(p.ptrSupport == net::kPtrHost);
    CHECK(p.maxRecvs == net::kMaxGroupedRecvs);
    CHECK(p.latencyUs == 0.0f);
    CHECK(!net::isVirtualBridgeOrLoopback(p.name));  // the default selection skips those
  }
}

TEST_CASE("tcp net: MKERNEL_SOCKET_IFNAME selects interfaces") {
  {
    ScopedEnv e("MKERNEL_SOCKET_IFNAME", "=lo");
    auto n = tcpNet();
    REQUIRE(n->deviceCount() == 1);
    net::DeviceProps p;
    REQUIRE(n->getProperties(0, &p) == Result::Success);
    CHECK(p.name == "lo");
    CHECK(p.pciPath.empty());
    mkernel::nettest::checkHandshake([] { return tcpNet(); });  // loopback carries traffic too
  }
  {
    ScopedEnv e("MKERNEL_SOCKET_IFNAME", "=no_such_interface0");
    std::string why;
    CHECK(net::createTcpNet(&why) == nullptr);
    CHECK(why.find("no_such_interface0") != std::string::npos);
  }
}

TEST_CASE("socket interfaces: NCCL_SOCKET_IFNAME syntax") {
  auto f = net::IfNameFilter::parse("eth,ib");
  CHECK(f.matches("eth0"));
  CHECK(f.matches("ib1"));
  CHECK_FALSE(f.matches("lo"));
  f = net::IfNameFilter::parse("^docker,lo");
  CHECK(f.matches("eth0"));
  CHECK_FALSE(f.matches("docker0"));
  CHECK_FALSE(f.matches("lo"));
  f = net::IfNameFilter::parse("=eth0");
  CHECK(f.matches("eth0"));
  CHECK_FALSE(f.matches("eth01"));
  f = net::IfNameFilter::parse("^=eth0");
  CHECK_FALSE(f.matches("eth0"));
  CHECK(f.matches("eth01"));
  f = net::IfNameFilter::parse("eth0:1234");
  CHECK(f.matches("eth0"));
  for (const char* v : {"lo", "docker0", "virbr0", "veth1234", "br-abcdef"})
    CHECK(net::isVirtualBridgeOrLoopback(v));
  for (const char* v : {"eth0", "ib0", "enp1s0", "bond0"})
    CHECK_FALSE(net::isVirtualBridgeOrLoopback(v));
}

TEST_CASE("socket interfaces: the default selection is never empty") {
  std::vector<net::NetInterface> ifs;
  bool fallback = false;
  std::string why;
  REQUIRE(net::findNetInterfaces("", &ifs, &fallback, &why) == Result::Success);
  REQUIRE(!ifs.empty());
  for (auto& i : ifs) CHECK(fallback == net::isVirtualBridgeOrLoopback(i.name));
}

namespace {
int threadCount() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}
}  // namespace

TEST_CASE("tcp net: destroying the Net joins its progress threads, open comms included") {
  int before = threadCount();
  REQUIRE(before > 0);
  {
    mkernel::nettest::CommPair pair;
    mkernel::nettest::connectPair(tcpNet, &pair);
    CHECK(threadCount() > before);
    // Leave the comms open: the Net's destructor must close them before it stops the threads.
    pair.net.reset();
    pair.send = nullptr;
    pair.recv = nullptr;
  }
  // A joined thread can still be counted in /proc for a moment after pthread_join returns (its
  // task is released just after it wakes the joiner): CI saw 2 == 1 once. Give it a second.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (threadCount() != before && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(threadCount() == before);
}
