// Connection setup of the TCP backend: listen, the non-blocking connect state machine, and the
// listener side of the handshake (run by the engine thread, so that a connector is acknowledged
// whether or not the application is calling accept() at that moment).
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "common/log.h"
#include "common/param.h"
#include "transport/net/tcp/tcp_net.h"

namespace mkernel {
namespace net {
namespace tcp {

const char* helloStatusString(uint32_t status) {
  switch (status) {
    case kHelloOk:
      return "accepted";
    case kHelloBadNonce:
      return "unknown nonce (a stale handle, or a listener that was closed and replaced)";
    case kHelloBadVersion:
      return "wire version mismatch (different mkernel builds)";
    case kHelloBadSockets:
      return "socket index or count out of range";
    default:
      return "unknown status";
  }
}

namespace {

uint64_t randomU64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::string peerNameOf(int fd) {
  SocketAddr a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, &a.sa, &len) != 0) return "(unknown peer)";
  return socketAddrToString(a);
}

}  // namespace

// ----- listener side ---------------------------------------------------------------------------

TcpListenComm::~TcpListenComm() {
  shutdown();
}

void TcpListenComm::shutdown() {
  if (engine != nullptr) {
    // Lock order is engine, then comm: take the tokens under our mutex, drop it, then remove.
    // Once the listening socket is removed the engine adds no new pending sockets.
    if (token != 0) engine->remove(token);
    std::vector<uint64_t> tokens;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& p : pending) tokens.push_back(p.second.token);
    }
    for (uint64_t t : tokens) engine->remove(t);
  }
  token = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& p : pending) close(p.second.fd);
  pending.clear();
  for (auto& g : groups)
    for (int f : g.second.fds)
      if (f >= 0) close(f);
  groups.clear();
  for (auto& g : ready)
    for (int f : g.fds)
      if (f >= 0) close(f);
  ready.clear();
  if (fd >= 0) close(fd);
  fd = -1;
}

void TcpListenComm::onEvents(int index, uint32_t events) {
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0) {
    acceptNewLocked();
  } else if (pending.count(index)) {
    readHelloLocked(index);
  }
}

void TcpListenComm::acceptNewLocked() {
  for (;;) {
    int c = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        error =
            std::string("accept on ") + socketAddrToString(addr) + " failed: " + strerror(errno);
        MK_WARN("TCP net: %s", error.c_str());
      }
      return;
    }
    setNoDelay(c);
    int id = nextPendingId++;
    Pending p{c, 0, Hello{}, 0, Clock::now()};
    if (engine->add(c, this, id, &p.token) != Result::Success) {
      close(c);
      continue;
    }
    pending[id] = p;
    readHelloLocked(id);  // the Hello may already be there; edge-triggered, so look now
  }
}

std::vector<TcpListenComm::Pending> TcpListenComm::takeStaleLocked(Clock::duration deadline) {
  std::vector<Pending> stale;
  const Clock::time_point now = Clock::now();
  for (auto it = pending.begin(); it != pending.end();) {
    if (now - it->second.since > deadline) {
      stale.push_back(it->second);
      it = pending.erase(it);  // an event still queued for it finds no entry and is ignored
    } else {
      ++it;
    }
  }
  return stale;
}

void TcpListenComm::readHelloLocked(int id) {
  Pending& p = pending[id];
  while (p.got < sizeof(Hello)) {
    ssize_t r =
        recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, MSG_DONTWAIT);
    if (r > 0) {
      p.got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r < 0 && errno == EINTR) continue;
    // The connector went away (or a port scanner said hello): drop this socket only.
    MK_INFO(kLogNet, "TCP net: dropping an incoming socket from %s before its handshake completed",
            peerNameOf(p.fd).c_str());
    engine->remove(p.token);
    close(p.fd);
    pending.erase(id);
    return;
  }
  const Hello h = p.hello;  // a copy: the pending entry is erased below
  HelloAck ack{kHelloMagic, kHelloOk, h.connId};
  if (h.magic != kHelloMagic) {
    MK_WARN("TCP net: a stranger connected to %s (bad magic 0x%x): dropped",
            socketAddrToString(addr).c_str(), h.magic);
    engine->remove(p.token);
    close(p.fd);
    pending.erase(id);
    return;
  }
  if (h.version != kWireVersion) {
    ack.status = kHelloBadVersion;
  } else if (h.nonce != nonce) {
    ack.status = kHelloBadNonce;
  } else if (h.nSocks != nSocks || h.sockIndex >= h.nSocks) {
    ack.status = kHelloBadSockets;
  }
  // A 16-byte write into a fresh socket's empty buffer does not come back short.
  ssize_t w = send(p.fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT);
  int fdDone = p.fd;
  std::string who = peerNameOf(fdDone);
  engine->remove(p.token);
  pending.erase(id);
  if (ack.status != kHelloOk || w != static_cast<ssize_t>(sizeof(ack))) {
    MK_WARN("TCP net: refused a connection from %s to %s: %s", who.c_str(),
            socketAddrToString(addr).c_str(), helloStatusString(ack.status));
    close(fdDone);
    return;
  }
  Group& g = groups[h.connId];
  if (g.nSocks == 0) {
    g.connId = h.connId;
    g.nSocks = h.nSocks;
    g.fds.assign(h.nSocks, -1);
    g.peer = who;
  }
  if (g.fds[h.sockIndex] >= 0)
    close(g.fds[h.sockIndex]);  // a duplicate index: keep the newest
  else
    g.count++;
  g.fds[h.sockIndex] = fdDone;
  if (g.count == g.nSocks) {
    ready.push_back(g);
    groups.erase(h.connId);
  }
}

Result TcpNet::listen(int dev, void* handle, ListenComm** listenComm) {
  *listenComm = nullptr;
  if (dev < 0 || dev >= deviceCount())
    return MK_ERROR(Result::InvalidArgument, "TCP net: listen on device %d, but there are %d", dev,
                    deviceCount());
  if (handle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "TCP net: listen with a null handle");
  const NetInterface& itf = ifs_[static_cast<size_t>(dev)];
  auto lc = std::make_unique<TcpListenComm>();
  lc->addr = itf.addr;
  lc->addr.sin.sin_port = 0;  // same offset in sin and sin6
  lc->nonce = randomU64();
  lc->nSocks =
      static_cast<int>(std::min<int64_t>(std::max<int64_t>(params::NET_SOCKETS(), 1), kMaxSockets));
  lc->fd = socket(lc->addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (lc->fd < 0)
    return MK_ERROR(Result::SystemError, "TCP net: socket() failed: %s", strerror(errno));
  int one = 1;
  setsockopt(lc->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(lc->fd, &lc->addr.sa, socketAddrLen(lc->addr)) != 0)
    return MK_ERROR(Result::SystemError, "TCP net: bind to %s (%s) failed: %s",
                    socketAddrToString(lc->addr).c_str(), itf.name.c_str(), strerror(errno));
  if (::listen(lc->fd, SOMAXCONN) != 0)
    return MK_ERROR(Result::SystemError, "TCP net: listen on %s failed: %s",
                    socketAddrToString(lc->addr).c_str(), strerror(errno));
  socklen_t len = sizeof(lc->addr);
  if (getsockname(lc->fd, &lc->addr.sa, &len) != 0)
    return MK_ERROR(Result::SystemError, "TCP net: getsockname failed: %s", strerror(errno));
  MK_CHECK(pickEngine(&lc->engine));
  MK_CHECK(lc->engine->add(lc->fd, lc.get(), -1, &lc->token));

  WireHandle h{};
  h.magic = kHandleMagic;
  h.version = kWireVersion;
  h.nSocks = static_cast<uint16_t>(lc->nSocks);
  h.nonce = lc->nonce;
  h.addr = lc->addr;
  std::memset(handle, 0, kHandleSize);
  std::memcpy(handle, &h, sizeof(h));
  MK_INFO(kLogNet, "TCP net: listening on %s (%s), %d socket(s) per connection",
          socketAddrToString(lc->addr).c_str(), itf.name.c_str(), lc->nSocks);
  std::lock_guard<std::mutex> lock(mu_);
  liveListen_.push_back(lc.get());
  *listenComm = lc.release();
  return Result::Success;
}

Result TcpNet::accept(ListenComm* listenComm, RecvComm** recvComm) {
  *recvComm = nullptr;
  auto* lc = dynamic_cast<TcpListenComm*>(listenComm);
  if (lc == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: accept on a comm that is not a TCP listen comm");
  TcpListenComm::Group g;
  // A connector that sends part of its Hello and stalls must not hold a socket forever: pending
  // sockets older than the handshake deadline (10 s, or MKERNEL_TIMEOUT_S if smaller; like the
  // bootstrap root's) are dropped here, where NCCL keeps calling.
  const auto deadline = std::chrono::seconds(std::min<int64_t>(10, params::TIMEOUT_S()));
  std::vector<TcpListenComm::Pending> stale;
  bool haveReady = false;
  {
    std::lock_guard<std::mutex> lock(lc->mu);
    if (!lc->error.empty()) return MK_ERROR(Result::SystemError, "TCP net: %s", lc->error.c_str());
    stale = lc->takeStaleLocked(deadline);
    if (!lc->ready.empty()) {
      g = lc->ready.front();
      lc->ready.pop_front();
      haveReady = true;
    }
  }
  for (const TcpListenComm::Pending& p : stale) {  // lock order: engine, then comm; so without mu
    MK_WARN(
        "TCP net: an incoming socket from %s sent %zu of %zu handshake bytes in %lld s: dropped",
        peerNameOf(p.fd).c_str(), p.got, sizeof(Hello), static_cast<long long>(deadline.count()));
    lc->engine->remove(p.token);
    close(p.fd);
  }
  if (!haveReady) return Result::Success;  // not yet: the caller calls again
  auto* core = new TcpComm(false, g.fds, g.peer, kMaxRequests);
  Result r = attachComm(core);
  if (r != Result::Success) {
    delete core;
    return r;
  }
  auto* rc = new TcpRecvComm();
  rc->core = core;
  std::lock_guard<std::mutex> lock(mu_);
  liveRecv_.push_back(rc);
  *recvComm = rc;
  MK_INFO(kLogNet, "TCP net: accepted a connection from %s (%d sockets)", g.peer.c_str(), g.nSocks);
  return Result::Success;
}

// ----- connector side --------------------------------------------------------------------------

// One step of the connect state machine for every socket; never blocks.
Result TcpNet::progressConnect(PendingConnect* pc, bool* established, std::vector<int>* fds) {
  *established = false;
  const WireHandle& h = pc->handle;
  std::string to = socketAddrToString(h.addr);
  int nDone = 0;
  for (size_t i = 0; i < pc->socks.size(); ++i) {
    PendingConnect::Sock& s = pc->socks[i];
    if (s.stage == 0) {
      if (s.fd < 0) {
        s.fd = socket(h.addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s.fd < 0)
          return MK_ERROR(Result::SystemError, "TCP net: socket() failed: %s", strerror(errno));
        setNoDelay(s.fd);
        if (::connect(s.fd, &h.addr.sa, socketAddrLen(h.addr)) != 0 && errno != EINPROGRESS) {
          if (errno == ECONNREFUSED || errno == EAGAIN) {  // the listener's backlog is full: retry
            close(s.fd);
            s.fd = -1;
            continue;
          }
          return MK_ERROR(Result::SystemError, "TCP net: connect to %s failed: %s", to.c_str(),
                          strerror(errno));
        }
      }
      pollfd p{s.fd, POLLOUT, 0};
      if (poll(&p, 1, 0) <= 0) continue;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == ECONNREFUSED) {
        close(s.fd);
        s.fd = -1;
        continue;
      }
      if (err != 0)
        return MK_ERROR(Result::SystemError, "TCP net: connect to %s failed: %s", to.c_str(),
                        strerror(err));
      s.stage = 1;
      s.done = 0;
    }
    if (s.stage == 1) {
      Hello hello{kHelloMagic, kWireVersion, static_cast<uint16_t>(i), h.nSocks, 0, 0,
                  h.nonce,     pc->connId};
      ssize_t w = send(s.fd, reinterpret_cast<char*>(&hello) + s.done, sizeof(hello) - s.done,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return MK_ERROR(Result::RemoteError, "TCP net: handshake with %s failed: %s", to.c_str(),
                        strerror(errno));
      if (w > 0) s.done += static_cast<size_t>(w);
      if (s.done < sizeof(hello)) continue;
      s.stage = 2;
      s.done = 0;
    }
    if (s.stage == 2) {
      ssize_t r = recv(s.fd, reinterpret_cast<char*>(&s.ack) + s.done, sizeof(s.ack) - s.done,
                       MSG_DONTWAIT);
      if (r == 0)
        return MK_ERROR(Result::RemoteError,
                        "TCP net: %s closed the connection during the handshake", to.c_str());
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return MK_ERROR(Result::RemoteError, "TCP net: handshake with %s failed: %s", to.c_str(),
                        strerror(errno));
      if (r > 0) s.done += static_cast<size_t>(r);
      if (s.done < sizeof(s.ack)) continue;
      if (s.ack.magic != kHelloMagic || s.ack.connId != pc->connId)
        return MK_ERROR(Result::RemoteError, "TCP net: %s answered the handshake with garbage",
                        to.c_str());
      if (s.ack.status != kHelloOk)
        return MK_ERROR(Result::RemoteError, "TCP net: %s refused the connection: %s", to.c_str(),
                        helloStatusString(s.ack.status));
      s.stage = 3;
    }
    if (s.stage == 3) nDone++;
  }
  if (nDone < static_cast<int>(pc->socks.size())) {
    double waited = std::chrono::duration<double>(Clock::now() - pc->start).count();
    const double limit = params::timeoutSeconds();
    if (waited > limit)
      return MK_ERROR(
          Result::SystemError,
          "TCP net: connect to %s: only %d of %zu sockets connected and acknowledged after "
          "%.0f s (MKERNEL_TIMEOUT_S=%.0f)",
          to.c_str(), nDone, pc->socks.size(), waited, limit);
    return Result::Success;
  }
  for (auto& s : pc->socks) {
    fds->push_back(s.fd);
    s.fd = -1;
  }
  *established = true;
  return Result::Success;
}

Result TcpNet::connect(int dev, const void* handle, SendComm** sendComm) {
  *sendComm = nullptr;
  if (handle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "TCP net: connect with a null handle");
  WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: connect with a handle that TCP listen() did not make (magic 0x%x)",
                    h.magic);
  if (h.version != kWireVersion)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: handle of wire version %u, this build speaks %u", h.version,
                    kWireVersion);
  if (h.nSocks < 1 || h.nSocks > kMaxSockets)
    return MK_ERROR(Result::InvalidArgument, "TCP net: handle asks for %u sockets (1..%d)",
                    h.nSocks, kMaxSockets);

  // The state between calls is keyed by the handle's address (NCCL passes the same buffer until
  // it gets a comm); a different handle at that address starts over.
  std::vector<int> fds;
  std::string peer = socketAddrToString(h.addr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pendingConnects_.find(handle);
    if (it != pendingConnects_.end() && std::memcmp(&it->second.handle, &h, sizeof(h)) != 0) {
      for (auto& s : it->second.socks)
        if (s.fd >= 0) close(s.fd);
      pendingConnects_.erase(it);
      it = pendingConnects_.end();
    }
    if (it == pendingConnects_.end()) {
      PendingConnect pc;
      pc.handle = h;
      pc.connId = randomU64();
      pc.start = Clock::now();
      pc.socks.resize(h.nSocks);
      it = pendingConnects_.emplace(handle, std::move(pc)).first;
    }
    bool established = false;
    Result r = progressConnect(&it->second, &established, &fds);
    if (r != Result::Success || established) {
      for (auto& s : it->second.socks)
        if (s.fd >= 0) close(s.fd);
      pendingConnects_.erase(it);
    }
    if (r != Result::Success) return r;
    if (!established) return Result::Success;
  }
  auto* core = new TcpComm(true, fds, peer, kMaxRequests * kMaxGroupedRecvs);
  Result r = attachComm(core);
  if (r != Result::Success) {
    delete core;
    return r;
  }
  auto* sc = new TcpSendComm();
  sc->core = core;
  std::lock_guard<std::mutex> lock(mu_);
  liveSend_.push_back(sc);
  *sendComm = sc;
  MK_INFO(kLogNet, "TCP net: connected to %s (%zu sockets)", peer.c_str(), fds.size());
  return Result::Success;
}

}  // namespace tcp
}  // namespace net
}  // namespace mkernel
