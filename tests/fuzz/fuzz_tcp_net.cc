// libFuzzer target: the TCP net backend (transport/net/tcp) as a black box, through net::Net and a
// real loopback socket playing the peer. Input byte 0 picks the mode:
//   0: raw bytes at a fresh listen comm (a stranger / port scanner / garbage handshake);
//   1: a Hello with the right nonce whose other fields (version, socket index/count, connId) and
//      trailing bytes come from the input: the listener must refuse or accept it cleanly;
//   2: a correct handshake, then the input as the message stream on socket 0, against receives
//      (1..8 grouped, sizes and tags from the input) posted by the backend's user.
// The peer then closes. The backend must finish every request with done or an error within
// kSettleSeconds (never hang), never crash, and after close hold no more descriptors than before.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "transport/net/net.h"
#include "transport/net/tcp/tcp_net.h"

using namespace mkernel;
namespace tcp = mkernel::net::tcp;
using mkernel::fuzz::fuzzFail;

namespace {

constexpr double kSettleSeconds = 2.5;  // MKERNEL_TIMEOUT_S (1 s here) plus slack
constexpr double kQuickSeconds = 0.05;
constexpr unsigned kFullWaitEvery = 32;
constexpr size_t kMaxPosted = 1 << 16;  // keeps a 64-bit size field from asking for real memory

std::unique_ptr<net::Net> gNet;
int gFdBaseline = -1;

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() | (byte() << 8)); }
};

// Listens; returns the decoded handle.
net::ListenComm* listenHere(tcp::WireHandle* h) {
  char handle[net::kHandleSize] = {};
  net::ListenComm* lc = nullptr;
  if (gNet->listen(0, handle, &lc) != Result::Success || lc == nullptr) fuzzFail("listen failed");
  std::memcpy(h, handle, sizeof(*h));
  return lc;
}

// Calls accept() until a comm appears or `seconds` pass; an error is a clean outcome.
net::RecvComm* acceptFor(net::ListenComm* lc, double seconds) {
  net::RecvComm* rc = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  while (rc == nullptr && mkernel::fuzz::secondsSince(t0) < seconds) {
    if (gNet->accept(lc, &rc) != Result::Success) return nullptr;
    if (rc == nullptr) usleep(200);
  }
  return rc;
}

int connectPeer(const tcp::WireHandle& h) {
  socklen_t len = h.addr.sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  int err = 0;
  int fd = mkernel::fuzz::rawConnect(&h.addr.sa, len, 10000, &err);  // answers come at once; 10 s: a loaded host
  if (fd < 0) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "cannot connect to the TCP listen comm for 15 s (last error: %s)", std::strerror(err));
    fuzzFail(msg);
  }
  return fd;
}

void modeRaw(Input in) {
  tcp::WireHandle h;
  net::ListenComm* lc = listenHere(&h);
  int fd = connectPeer(h);
  mkernel::fuzz::sendSome(fd, in.p, in.n);
  ::shutdown(fd, SHUT_WR);
  // Less than a Hello then EOF, or a Hello that cannot carry our nonce: never a comm.
  if (acceptFor(lc, 0.002) != nullptr) fuzzFail("a garbage handshake produced a recv comm");
  ::close(fd);
  if (gNet->closeListen(lc) != Result::Success) fuzzFail("closeListen failed");
}

void modeHello(Input in) {
  tcp::WireHandle h;
  net::ListenComm* lc = listenHere(&h);
  int fd = connectPeer(h);
  tcp::Hello hello{tcp::kHelloMagic, in.u16(), in.u16(), in.u16(), 0, 0, h.nonce, in.u16()};
  bool valid = hello.version == tcp::kWireVersion && hello.nSocks == h.nSocks && hello.sockIndex < hello.nSocks;
  mkernel::fuzz::sendSome(fd, &hello, sizeof(hello));
  mkernel::fuzz::sendSome(fd, in.p, in.n);
  tcp::HelloAck ack{};
  if (mkernel::fuzz::recvExactly(fd, &ack, sizeof(ack)) != sizeof(ack)) fuzzFail("the listener did not answer a Hello carrying its nonce");
  if ((ack.status == tcp::kHelloOk) != valid) fuzzFail("the listener judged a Hello wrongly");
  net::RecvComm* rc = valid && h.nSocks == 1 ? acceptFor(lc, 2.0) : nullptr;
  if (valid && h.nSocks == 1 && rc == nullptr) fuzzFail("a valid handshake gave no recv comm");
  ::close(fd);
  if (rc != nullptr && gNet->closeRecv(rc) != Result::Success) fuzzFail("closeRecv failed");
  if (gNet->closeListen(lc) != Result::Success) fuzzFail("closeListen failed");
}

void modeStream(Input in) {
  tcp::WireHandle h;
  net::ListenComm* lc = listenHere(&h);
  if (h.nSocks != 1) fuzzFail("fuzz_tcp_net expects MKERNEL_NET_SOCKETS=1");
  int fd = connectPeer(h);
  tcp::Hello hello{tcp::kHelloMagic, tcp::kWireVersion, 0, 1, 0, 0, h.nonce, 42};
  mkernel::fuzz::sendSome(fd, &hello, sizeof(hello));
  tcp::HelloAck ack{};
  if (mkernel::fuzz::recvExactly(fd, &ack, sizeof(ack)) != sizeof(ack) || ack.status != tcp::kHelloOk)
    fuzzFail("a correct handshake was refused");
  net::RecvComm* rc = acceptFor(lc, 2.0);
  if (rc == nullptr) fuzzFail("a correct handshake gave no recv comm");
  if (gNet->closeListen(lc) != Result::Success) fuzzFail("closeListen failed");

  net::DeviceProps props;
  gNet->getProperties(0, &props);
  int n = 1 + in.byte() % (props.maxRecvs < 1 ? 1 : props.maxRecvs);
  std::vector<std::vector<uint8_t>> bufs(n);
  void* ptrs[net::kMaxGroupedRecvs];
  void* mh[net::kMaxGroupedRecvs] = {};
  size_t sizes[net::kMaxGroupedRecvs];
  int tags[net::kMaxGroupedRecvs];
  for (int j = 0; j < n; ++j) {
    sizes[j] = in.u16() % (kMaxPosted + 1);
    tags[j] = static_cast<int8_t>(in.byte());
    bufs[j].resize(sizes[j] + 1);
    ptrs[j] = bufs[j].data();
  }
  net::Request* req = nullptr;
  Result posted = gNet->irecv(rc, n, ptrs, sizes, tags, mh, &req);
  mkernel::fuzz::sendSome(fd, in.p, in.n);
  ::close(fd);  // the peer goes away: the receive must now complete or fail, promptly
  if (posted == Result::Success && req != nullptr) {
    auto t0 = std::chrono::steady_clock::now();
    bool done = false;
    size_t got[net::kMaxGroupedRecvs] = {};
    Result r = Result::Success;
    // A message whose tag matches no posted receive legitimately waits (a later irecv could take
    // it) until MKERNEL_TIMEOUT_S. Waiting that long on every such input would cut executions/s
    // by 100x, so most inputs give up after kQuickSeconds and close the comm with the receive
    // outstanding (which must be clean, too); every kFullWaitEvery-th one waits for the error.
    static unsigned stalled = 0;
    bool fullWait = false;
    while (!done && r == Result::Success) {
      r = gNet->test(req, &done, got);
      double waited = mkernel::fuzz::secondsSince(t0);
      if (!fullWait && waited > kQuickSeconds) {
        if (++stalled % kFullWaitEvery != 0) break;
        fullWait = true;
      }
      if (waited > kSettleSeconds) fuzzFail("a receive neither completed nor failed after the peer closed");
    }
    if (done && r == Result::Success)
      for (int j = 0; j < n; ++j)
        if (got[j] > sizes[j]) fuzzFail("a receive reported more bytes than were posted");
  }
  if (gNet->closeRecv(rc) != Result::Success) fuzzFail("closeRecv failed");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mkernel::fuzz::quietEnvironment("1");  // an unmatched message legitimately waits: this bounds it
  setenv("MKERNEL_NET_SOCKETS", "1", 1);
  setenv("MKERNEL_NET_THREADS", "1", 1);
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);
  std::string why;
  gNet = net::createTcpNet(&why);
  if (gNet == nullptr) fuzzFail(why.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Input in{data + 1, size - 1};
  switch (data[0] % 3) {
    case 0: modeRaw(in); break;
    case 1: modeHello(in); break;
    default: modeStream(in); break;
  }
  // Every comm of this input is closed: the backend must hold the same descriptors as after the
  // first input (the engine's epoll fds appear on first use).
  int fds = mkernel::fuzz::openFdCount();
  if (gFdBaseline < 0) gFdBaseline = fds;
  if (fds != gFdBaseline) {
    usleep(20000);  // a close racing the engine thread settles within a poll
    if (mkernel::fuzz::openFdCount() != gFdBaseline) {
      std::fprintf(stderr, "open descriptors: %d, after the first input: %d\n", mkernel::fuzz::openFdCount(), gFdBaseline);
      mkernel::fuzz::printOpenFds();
      fuzzFail("file descriptors leaked");
    }
  }
  return 0;
}
