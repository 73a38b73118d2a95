// libFuzzer target: the TCP net backend (transport/net/tcp) as a black box, through net::Net and a
// real loopback socket playing the peer. Input byte 0 picks the mode:
//   0: raw bytes at a fresh listen comm (a stranger / port scanner / garbage handshake);
//   1: a Hello with the right nonce whose other fields (version, socket index/count, connId) and
//      trailing bytes come from the input: the listener must refuse or accept it cleanly;
//   2: a correct handshake, then the input as the message stream on socket 0, against receives
//      (1..8 grouped, sizes and tags from the input) posted by the backend's user;
//   3: the same over two sockets (4 KiB chunks: larger messages stripe over both), the stream
//      cut in two by the input, one part per socket; then socket 1 closes first while socket 0
//      stays open and silent (a half-closed peer: docs/TRANSPORT.md, "Failures").
// The peer then closes. The backend must finish every request with done or an error within
// kSettleSeconds (never hang), never crash, and after close hold no more descriptors than before.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "transport/net/net.h"
#include "transport/net/tcp/tcp_net.h"
#include "common/param.h"

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
  int fd = mkernel::fuzz::rawConnect(&h.addr.sa, len, 10000,
                                     &err);  // answers come at once; 10 s: a loaded host
  if (fd < 0) {
    char msg[160];
    std::snprintf(msg, sizeof(msg),
                  "cannot connect to the TCP listen comm for 15 s (last error: %s)",
                  std::strerror(err));
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
  bool valid = hello.version == tcp::kWireVersion && hello.nSocks == h.nSocks &&
               hello.sockIndex < hello.nSocks;
  mkernel::fuzz::sendSome(fd, &hello, sizeof(hello));
  mkernel::fuzz::sendSome(fd, in.p, in.n);
  tcp::HelloAck ack{};
  if (mkernel::fuzz::recvExactly(fd, &ack, sizeof(ack)) != sizeof(ack))
    fuzzFail("the listener did not answer a Hello carrying its nonce");
  if ((ack.status == tcp::kHelloOk) != valid) fuzzFail("the listener judged a Hello wrongly");
  net::RecvComm* rc = valid && h.nSocks == 1 ? acceptFor(lc, 2.0) : nullptr;
  if (valid && h.nSocks == 1 && rc == nullptr) fuzzFail("a valid handshake gave no recv comm");
  ::close(fd);
  if (rc != nullptr && gNet->closeRecv(rc) != Result::Success) fuzzFail("closeRecv failed");
  if (gNet->closeListen(lc) != Result::Success) fuzzFail("closeListen failed");
}

// One peer socket through the handshake: sockIndex of nSocks, connection connId.
int helloPeer(const tcp::WireHandle& h, uint16_t sockIndex, uint16_t nSocks, uint64_t connId) {
  int fd = connectPeer(h);
  tcp::Hello hello{tcp::kHelloMagic, tcp::kWireVersion, sockIndex, nSocks, 0, 0, h.nonce, connId};
  mkernel::fuzz::sendSome(fd, &hello, sizeof(hello));
  tcp::HelloAck ack{};
  if (mkernel::fuzz::recvExactly(fd, &ack, sizeof(ack)) != sizeof(ack) ||
      ack.status != tcp::kHelloOk)
    fuzzFail("a correct handshake was refused");
  return fd;
}

// The user's side of modes 2 and 3: receives (1..maxRecvs grouped, sizes and tags from the input).
struct Posted {
  int n = 0;
  std::vector<std::vector<uint8_t>> bufs;
  size_t sizes[net::kMaxGroupedRecvs] = {};
  net::Request* req = nullptr;
  Result result = Result::Success;
};

void postReceives(net::RecvComm* rc, Input* in, Posted* p) {
  net::DeviceProps props;
  gNet->getProperties(0, &props);
  p->n = 1 + in->byte() % (props.maxRecvs < 1 ? 1 : props.maxRecvs);
  p->bufs.resize(static_cast<size_t>(p->n));
  void* ptrs[net::kMaxGroupedRecvs];
  void* mh[net::kMaxGroupedRecvs] = {};
  int tags[net::kMaxGroupedRecvs];
  for (int j = 0; j < p->n; ++j) {
    p->sizes[j] = in->u16() % (kMaxPosted + 1);
    tags[j] = static_cast<int8_t>(in->byte());
    p->bufs[j].resize(p->sizes[j] + 1);
    ptrs[j] = p->bufs[j].data();
  }
  p->result = gNet->irecv(rc, p->n, ptrs, p->sizes, tags, mh, &p->req);
}

// Once the peer has gone (or half gone), the receive must complete or fail within settleS.
void settle(Posted* p, double settleS, const char* what) {
  if (p->result != Result::Success || p->req == nullptr) return;
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
    r = gNet->test(p->req, &done, got);
    double waited = mkernel::fuzz::secondsSince(t0);
    if (!fullWait && waited > kQuickSeconds) {
      if (++stalled % kFullWaitEvery != 0) break;
      fullWait = true;
    }
    if (waited > settleS) fuzzFail(what);
  }
  if (done && r == Result::Success)
    for (int j = 0; j < p->n; ++j)
      if (got[j] > p->sizes[j]) fuzzFail("a receive reported more bytes than were posted");
}

void modeStream(Input in) {
  tcp::WireHandle h;
  net::ListenComm* lc = listenHere(&h);
  if (h.nSocks != 1) fuzzFail("fuzz_tcp_net expects MKERNEL_NET_SOCKETS=1");
  int fd = helloPeer(h, 0, 1, 42);
  net::RecvComm* rc = acceptFor(lc, 2.0);
  if (rc == nullptr) fuzzFail("a correct handshake gave no recv comm");
  if (gNet->closeListen(lc) != Result::Success) fuzzFail("closeListen failed");
  Posted p;
  postReceives(rc, &in, &p);
  mkernel::fuzz::sendSome(fd, in.p, in.n);
  ::close(fd);  // the peer goes away: the receive must now complete or fail, promptly
  settle(&p, kSettleSeconds, "a receive neither completed nor failed after the peer closed");
  if (gNet->closeRecv(rc) != Result::Success) fuzzFail("closeRecv failed");
}

void modeHalfClosed(Input in) {
  tcp::WireHandle h;
  setenv("MKERNEL_NET_SOCKETS", "2", 1);  // read by listen(): the listener's count wins
  mkernel::params::resetForTesting();
  net::ListenComm* lc = listenHere(&h);
  setenv("MKERNEL_NET_SOCKETS", "1", 1);
  mkernel::params::resetForTesting();
  if (h.nSocks != 2) fuzzFail("a listener asked for two sockets per connection made another count");
  int fds[2] = {helloPeer(h, 0, 2, 43), helloPeer(h, 1, 2, 43)};
  setenv("MKERNEL_NET_CHUNK_BYTES", "4096", 1);  // read by accept(): messages above 4 KiB stripe
  mkernel::params::resetForTesting();
  net::RecvComm* rc = acceptFor(lc, 2.0);
  unsetenv("MKERNEL_NET_CHUNK_BYTES");
  mkernel::params::resetForTesting();
  if (rc == nullptr) fuzzFail("a correct two-socket handshake gave no recv comm");
  if (gNet->closeListen(lc) != Result::Success) fuzzFail("closeListen failed");
  Posted p;
  postReceives(rc, &in, &p);
  const size_t on1 =
      std::min<size_t>(in.u16(), in.n);  // the stream's last on1 bytes go to socket 1
  mkernel::fuzz::sendSome(fds[0], in.p, in.n - on1);
  mkernel::fuzz::sendSome(fds[1], in.p + (in.n - on1), on1);
  ::shutdown(fds[1], SHUT_WR);
  ::close(fds[1]);  // socket 0 stays open and silent: the close seen on socket 1 must end it
  settle(&p, kSettleSeconds + tcp::kCloseGraceS,
         "a receive neither completed nor failed after the peer's socket 1 closed (socket 0 open)");
  ::close(fds[0]);
  if (gNet->closeRecv(rc) != Result::Success) fuzzFail("closeRecv failed");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mkernel::fuzz::quietEnvironment("1");  // an unmatched message legitimately waits: this bounds it
  setenv("MKERNEL_NET_SOCKETS", "1", 1);
  setenv("MKERNEL_NET_THREADS", "1", 1);
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);
  mkernel::params::resetForTesting();
  std::string why;
  gNet = net::createTcpNet(&why);
  if (gNet == nullptr) fuzzFail(why.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Input in{data + 1, size - 1};
  switch (data[0] % 4) {
    case 0:
      modeRaw(in);
      break;
    case 1:
      modeHello(in);
      break;
    case 2:
      modeStream(in);
      break;
    default:
      modeHalfClosed(in);
      break;
  }
  // Every comm of this input is closed: the backend must hold the same descriptors as after the
  // first input (the engine's epoll fds appear on first use).
  int fds = mkernel::fuzz::openFdCount();
  if (gFdBaseline < 0) gFdBaseline = fds;
  if (fds != gFdBaseline) {
    usleep(20000);  // a close racing the engine thread settles within a poll
    if (mkernel::fuzz::openFdCount() != gFdBaseline) {
      std::fprintf(stderr, "open descriptors: %d, after the first input: %d\n",
                   mkernel::fuzz::openFdCount(), gFdBaseline);
      mkernel::fuzz::printOpenFds();
      fuzzFail("file descriptors leaked");
    }
  }
  return 0;
}
