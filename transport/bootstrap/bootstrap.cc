#include "transport/bootstrap/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/param.h"
#include "common/text.h"
#include "transport/bootstrap/sock.h"
#include "transport/bootstrap/validate.h"
#include "transport/bootstrap/wire.h"

namespace mkernel {
namespace bootstrap {
namespace {

constexpr int kTagAllGather = -1;
constexpr int kTagBroadcast = -2;
constexpr int kTagBarrier = -3;
constexpr double kHandshakeSeconds = 10.0;  // one hello must arrive this fast once connected

// The root of one rendezvous: collects every rank's hello, then sends each the address table.
// Runs on a detached thread that ends when the rendezvous is done or times out. Connections are
// served concurrently (one poll over the listening socket and every connection still sending its
// hello), so a client that connects and sends nothing delays nobody; each connection must finish
// its hello within kHandshakeSeconds of being accepted or it is dropped.
void serveRendezvous(int listenFd, uint64_t nonce) {
  using Clock = std::chrono::steady_clock;
  struct Incoming {
    int fd;
    HelloWire hello;
    size_t got;
    Clock::time_point since;
  };
  Deadline dl = Deadline::in(params::timeoutSeconds());
  int nRanks = -1;
  std::vector<int> fds;
  std::vector<uint8_t> taken;
  std::vector<SockAddr> table;
  std::vector<Incoming> incoming;
  int arrived = 0;
  Result res = Result::Success;
  auto drop = [](Incoming& c, const std::string& why) {
    MK_WARN("bootstrap root: rejected a connection: %s", why.c_str());
    closeFd(&c.fd);
  };
  while (nRanks < 0 || arrived < nRanks) {
    if (dl.aborted() || dl.expired()) {
      res = MK_ERROR(Result::RemoteError,
                     "bootstrap: timed out after MKERNEL_TIMEOUT_S while the bootstrap root "
                     "waited for ranks to connect");
      break;
    }
    std::vector<pollfd> pfds;
    pfds.push_back(pollfd{listenFd, POLLIN, 0});
    for (const Incoming& c : incoming) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    const int n = ::poll(pfds.data(), pfds.size(), dl.pollMs());
    if (n < 0 && errno != EINTR) {
      res = MK_ERROR(Result::SystemError, "bootstrap root: poll failed: %s", std::strerror(errno));
      break;
    }
    const Clock::time_point now = Clock::now();
    // Hellos first (pfds[1..] match incoming[] as it was when polled).
    for (size_t i = 0; i < incoming.size(); ++i) {
      Incoming& c = incoming[i];
      if (n > 0 && (pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t r = ::recv(c.fd, reinterpret_cast<char*>(&c.hello) + c.got,
                           sizeof(HelloWire) - c.got, MSG_DONTWAIT);
        if (r > 0) {
          c.got += static_cast<size_t>(r);
        } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          drop(c, "the connection closed before a whole hello arrived");
          continue;
        }
      }
      if (c.got == sizeof(HelloWire)) {
        std::string why;
        if (!validateHello(c.hello, nonce, nRanks, taken.data(), &why)) {
          drop(c, why);
          continue;
        }
        if (nRanks < 0) {
          nRanks = c.hello.nRanks;
          fds.assign(nRanks, -1);
          taken.assign(nRanks, 0);
          table.resize(nRanks);
        }
        taken[c.hello.rank] = 1;
        fds[c.hello.rank] = c.fd;
        table[c.hello.rank] = c.hello.listen;
        c.fd = -1;  // owned by fds[] now
        ++arrived;
      } else if (std::chrono::duration<double>(now - c.since).count() > kHandshakeSeconds) {
        drop(c, "no whole hello within " + std::to_string(static_cast<int>(kHandshakeSeconds)) +
                    " s of connecting (" + std::to_string(c.got) + " of " +
                    std::to_string(sizeof(HelloWire)) + " bytes)");
      }
    }
    incoming.erase(std::remove_if(incoming.begin(), incoming.end(),
                                  [](const Incoming& c) { return c.fd < 0; }),
                   incoming.end());
    if (n > 0 && (pfds[0].revents & POLLIN)) {
      for (;;) {
        int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN: all taken; other errors: the next poll tells
        incoming.push_back(Incoming{fd, HelloWire{}, 0, now});
      }
    }
  }
  for (Incoming& c : incoming) closeFd(&c.fd);
  if (res == Result::Success) {
    for (int r = 0; r < nRanks; ++r)
      sendAll(fds[r], table.data(), table.size() * sizeof(SockAddr),
              Deadline::in(kHandshakeSeconds), "the bootstrap root sent the address table");
    MK_INFO(kLogBootstrap, "bootstrap root: rendezvous of %d ranks done", nRanks);
  } else {
    MK_WARN("bootstrap root: %d of %d ranks arrived before the rendezvous ended", arrived, nRanks);
  }
  for (int& fd : fds) closeFd(&fd);
  ::close(listenFd);
}

}  // namespace

bool isMkernelId(const UniqueId& id) {
  IdWire w;
  std::memcpy(&w, id.bytes, sizeof(w));
  return w.magic == kIdMagic && w.version == kWireVersion;
}

Result createUniqueId(UniqueId* id) {
  if (id == nullptr) return MK_ERROR(Result::InvalidArgument, "bootstrap: null unique id");
  IdWire w{};
  w.magic = kIdMagic;
  w.version = kWireVersion;
  w.nonce = randomNonce();
  std::string ifname;
  MK_CHECK(chooseAddress(&w.root, &ifname));
  if (w.root.sa.sa_family == AF_INET)
    w.root.sin.sin_port = 0;
  else
    w.root.sin6.sin6_port = 0;
  int fd = -1;
  MK_CHECK(listenOn(&w.root, &fd));
  std::memset(id->bytes, 0, sizeof(id->bytes));
  std::memcpy(id->bytes, &w, sizeof(w));
  MK_INFO(kLogBootstrap, "bootstrap: root listening on %s (%s)", addrToString(w.root).c_str(),
          ifname.c_str());
  std::thread(serveRendezvous, fd, w.nonce).detach();
  return Result::Success;
}

uint64_t Bootstrap::hostHash() {
  // MKERNEL_HOSTID (as NCCL_HOSTID): the host's identity instead of its name and boot id, so
  // that processes of one machine can stand for several hosts (tests of the multi-host path).
  std::string s = params::HOSTID();
  if (s.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    s = host;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string bootId;
    std::getline(boot, bootId);
    s += bootId;
  } else {
    s = "hostid:" + s;
  }
  return fnv1a(s);
}

// ---------------------------------------------------------------------------------------------
struct Bootstrap::Impl {
  uint64_t nonce = 0;
  int listenFd = -1;
  int wake[2] = {-1, -1};
  std::vector<SockAddr> peers;
  std::vector<int> sendFds;
  std::vector<std::unique_ptr<std::mutex>> sendMutex;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> inbox;  // (peer, tag) -> messages
  std::vector<bool> peerGone;
  bool stop = false;
  std::thread io;

  void ioLoop(int myRank);
  void deliver(int peer, int tag, std::vector<char> msg) {
    std::lock_guard<std::mutex> lock(mu);
    inbox[{peer, tag}].push_back(std::move(msg));
    cv.notify_all();
  }
};

// The receive side: accepts peers' connections, checks their hello, reads frames into the inbox.
void Bootstrap::Impl::ioLoop(int myRank) {
  struct Incoming {
    int fd;
    int rank;
  };
  std::vector<Incoming> in;
  while (true) {
    std::vector<pollfd> pfds;
    pfds.push_back({wake[0], POLLIN, 0});
    pfds.push_back({listenFd, POLLIN, 0});
    for (const Incoming& c : in) pfds.push_back({c.fd, POLLIN, 0});
    int r = ::poll(pfds.data(), pfds.size(), 1000);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stop) break;
    }
    if (r <= 0) continue;
    if (pfds[1].revents & POLLIN) {
      int fd = -1;
      if (acceptOn(listenFd, Deadline::in(1.0), &fd, "accepting a peer") == Result::Success) {
        PeerHelloWire h{};
        std::string why = "the connection closed before a whole hello arrived";
        if (recvAll(fd, &h, sizeof(h), Deadline::in(kHandshakeSeconds), "reading a peer hello") ==
                Result::Success &&
            validatePeerHello(h, nonce, static_cast<int>(peers.size()), &why)) {
          in.push_back({fd, h.rank});
        } else {
          MK_WARN("bootstrap rank %d: rejected a connection: %s", myRank, why.c_str());
          closeFd(&fd);
        }
      }
    }
    // Only the connections that were polled: one accepted just above has no pollfd entry yet
    // (reading pfds for it overflowed the vector; found by tests/fuzz/fuzz_bootstrap_root).
    const size_t polled = pfds.size() - 2;
    for (size_t i = 0; i < polled; ++i) {
      short ev = pfds[i + 2].revents;
      if (!(ev & (POLLIN | POLLHUP | POLLERR))) continue;
      FrameHeader fh{};
      Deadline dl = Deadline::in(params::timeoutSeconds());
      // A peer that closes between frames has left (its communicator is being destroyed): the
      // end of its stream, not an error worth a warning at every job's exit. A close inside a
      // frame still is one.
      char first = 0;
      ssize_t peeked = ::recv(in[i].fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked == 0) {
        MK_INFO(kLogBootstrap, "bootstrap rank %d: peer %d closed its connection", myRank,
                in[i].rank);
        {
          std::lock_guard<std::mutex> lock(mu);
          peerGone[in[i].rank] = true;
          cv.notify_all();
        }
        closeFd(&in[i].fd);
        continue;
      }
      Result res = recvAll(in[i].fd, &fh, sizeof(fh), dl, "reading a frame header");
      std::vector<char> msg;
      std::string why;
      if (res == Result::Success && !validateFrameHeader(fh, &why)) {
        res = MK_ERROR(Result::RemoteError, "bootstrap rank %d: peer %d sent a malformed frame: %s",
                       myRank, in[i].rank, why.c_str());
      }
      if (res == Result::Success) {
        msg.resize(fh.size);
        res = recvAll(in[i].fd, msg.data(), msg.size(), dl, "reading a frame");
      }
      if (res == Result::Success) {
        deliver(in[i].rank, fh.tag, std::move(msg));
      } else {
        {
          std::lock_guard<std::mutex> lock(mu);
          peerGone[in[i].rank] = true;
          cv.notify_all();
        }
        closeFd(&in[i].fd);
      }
    }
    in.erase(std::remove_if(in.begin(), in.end(), [](const Incoming& c) { return c.fd < 0; }),
             in.end());
  }
  for (Incoming& c : in) closeFd(&c.fd);
}

Bootstrap::Bootstrap(int rank, int nRanks) : rank_(rank), nRanks_(nRanks), impl_(new Impl) {}

Bootstrap::~Bootstrap() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  if (impl_->wake[1] >= 0) {
    char c = 1;
    (void)!::write(impl_->wake[1], &c, 1);
  }
  if (impl_->io.joinable()) impl_->io.join();
  for (int& fd : impl_->sendFds) closeFd(&fd);
  closeFd(&impl_->listenFd);
  closeFd(&impl_->wake[0]);
  closeFd(&impl_->wake[1]);
}

Result Bootstrap::create(const UniqueId& id, int rank, int nRanks,
                         std::unique_ptr<Bootstrap>* out) {
  IdWire w;
  std::string idWhy;
  if (!parseUniqueId(id.bytes, sizeof(id.bytes), &w, &idWhy))
    return MK_ERROR(Result::InvalidArgument, "bootstrap: unusable unique id: %s", idWhy.c_str());
  if (nRanks <= 0 || nRanks > kMaxRanks || rank < 0 || rank >= nRanks)
    return MK_ERROR(Result::InvalidArgument, "bootstrap: invalid rank %d of %d", rank, nRanks);
  std::unique_ptr<Bootstrap> b(new Bootstrap(rank, nRanks));
  Impl& im = *b->impl_;
  im.nonce = w.nonce;
  Deadline dl = Deadline::in(params::timeoutSeconds(), &b->aborted_);

  int rootFd = -1;
  MK_CHECK(connectTo(w.root, dl, &rootFd, "connecting to the bootstrap root"));
  // Listen on the address that reaches the root, so peers can reach us the same way.
  SockAddr mine{};
  socklen_t len = sizeof(mine);
  getsockname(rootFd, &mine.sa, &len);
  if (mine.sa.sa_family == AF_INET)
    mine.sin.sin_port = 0;
  else
    mine.sin6.sin6_port = 0;
  Result res = listenOn(&mine, &im.listenFd);
  HelloWire h{};
  h.magic = kHelloMagic;
  h.version = kWireVersion;
  h.rank = rank;
  h.nRanks = nRanks;
  h.nonce = w.nonce;
  h.listen = mine;
  if (res == Result::Success)
    res = sendAll(rootFd, &h, sizeof(h), dl, "sending the hello to the root");
  im.peers.resize(nRanks);
  if (res == Result::Success)
    res = recvAll(rootFd, im.peers.data(), nRanks * sizeof(SockAddr), dl,
                  "waiting for all ranks at the bootstrap root");
  closeFd(&rootFd);
  if (res != Result::Success) return res;
  std::string why;
  if (!validateAddressTable(im.peers.data(), nRanks, &why))
    return MK_ERROR(Result::RemoteError,
                    "bootstrap rank %d: the root sent a malformed address table: %s", rank,
                    why.c_str());

  im.sendFds.assign(nRanks, -1);
  for (int i = 0; i < nRanks; ++i) im.sendMutex.emplace_back(new std::mutex);
  im.peerGone.assign(nRanks, false);
  if (::pipe2(im.wake, O_CLOEXEC) != 0)
    return MK_ERROR(Result::SystemError, "bootstrap: pipe2: %s", std::strerror(errno));
  im.io = std::thread(&Impl::ioLoop, &im, rank);
  MK_INFO(kLogBootstrap, "bootstrap rank %d/%d: up, listening on %s", rank, nRanks,
          addrToString(mine).c_str());
  *out = std::move(b);
  return Result::Success;
}

void Bootstrap::abort() {
  aborted_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cv.notify_all();
}

Result Bootstrap::send(int peer, int tag, const void* data, size_t size) {
  if (peer < 0 || peer >= nRanks_)
    return MK_ERROR(Result::InvalidArgument, "bootstrap: send to invalid peer %d", peer);
  if (size > kMaxMessageBytes)
    return MK_ERROR(Result::InvalidArgument, "bootstrap: message of %zu bytes is too large", size);
  if (peer == rank_) {
    const char* p = static_cast<const char*>(data);
    impl_->deliver(peer, tag, std::vector<char>(p, p + size));
    return Result::Success;
  }
  Deadline dl = Deadline::in(params::timeoutSeconds(), &aborted_);
  std::lock_guard<std::mutex> lock(*impl_->sendMutex[peer]);
  int& fd = impl_->sendFds[peer];
  if (fd < 0) {
    char what[96];
    std::snprintf(what, sizeof(what), "rank %d connecting to peer %d", rank_, peer);
    MK_CHECK(connectTo(impl_->peers[peer], dl, &fd, what));
    PeerHelloWire h{kPeerMagic, impl_->nonce, rank_, 0};
    Result r = sendAll(fd, &h, sizeof(h), dl, what);
    if (r != Result::Success) {
      closeFd(&fd);
      return r;
    }
  }
  FrameHeader fh{tag, 0, size};
  char what[96];
  std::snprintf(what, sizeof(what), "rank %d sending %zu bytes to peer %d", rank_, size, peer);
  Result r = sendAll(fd, &fh, sizeof(fh), dl, what);
  if (r == Result::Success) r = sendAll(fd, data, size, dl, what);
  if (r != Result::Success) closeFd(&fd);
  return r;
}

Result Bootstrap::recv(int peer, int tag, void* data, size_t size) {
  if (peer < 0 || peer >= nRanks_)
    return MK_ERROR(Result::InvalidArgument, "bootstrap: recv from invalid peer %d", peer);
  Deadline dl = Deadline::in(params::timeoutSeconds());
  std::unique_lock<std::mutex> lock(impl_->mu);
  auto key = std::make_pair(peer, tag);
  while (true) {
    auto it = impl_->inbox.find(key);
    if (it != impl_->inbox.end() && !it->second.empty()) {
      std::vector<char> msg = std::move(it->second.front());
      it->second.pop_front();
      if (msg.size() != size)
        return MK_ERROR(Result::InternalError,
                        "bootstrap rank %d: expected %zu bytes from peer %d (tag %d), got %zu",
                        rank_, size, peer, tag, msg.size());
      if (size > 0) std::memcpy(data, msg.data(), size);
      return Result::Success;
    }
    if (aborted())
      return MK_ERROR(Result::RemoteError, "bootstrap rank %d: aborted while waiting for peer %d",
                      rank_, peer);
    if (impl_->peerGone[peer])
      return MK_ERROR(Result::RemoteError,
                      "bootstrap rank %d: peer %d closed its connection (process gone?)", rank_,
                      peer);
    if (dl.expired())
      return MK_ERROR(Result::RemoteError,
                      "bootstrap rank %d: timed out after %.0f s (MKERNEL_TIMEOUT_S) waiting for "
                      "%zu bytes from peer %d (tag %d)",
                      rank_, params::timeoutSeconds(), size, peer, tag);
    impl_->cv.wait_for(lock, std::chrono::milliseconds(100));
  }
}

Result Bootstrap::allGather(void* data, size_t size) {
  char* base = static_cast<char*>(data);
  int next = (rank_ + 1) % nRanks_;
  int prev = (rank_ - 1 + nRanks_) % nRanks_;
  for (int step = 0; step < nRanks_ - 1; ++step) {
    int sendSlot = (rank_ - step + nRanks_) % nRanks_;
    int recvSlot = (rank_ - step - 1 + nRanks_) % nRanks_;
    MK_CHECK(send(next, kTagAllGather, base + sendSlot * size, size));
    MK_CHECK(recv(prev, kTagAllGather, base + recvSlot * size, size));
  }
  return Result::Success;
}

Result Bootstrap::broadcast(void* data, size_t size, int root) {
  if (root < 0 || root >= nRanks_)
    return MK_ERROR(Result::InvalidArgument, "bootstrap: broadcast from invalid root %d", root);
  if (rank_ == root) {
    for (int p = 0; p < nRanks_; ++p)
      if (p != root) MK_CHECK(send(p, kTagBroadcast, data, size));
    return Result::Success;
  }
  return recv(root, kTagBroadcast, data, size);
}

Result Bootstrap::barrier() {
  // Dissemination barrier: log2(n) rounds.
  char token = 0;
  for (int dist = 1; dist < nRanks_; dist <<= 1) {
    MK_CHECK(send((rank_ + dist) % nRanks_, kTagBarrier, &token, 1));
    MK_CHECK(recv((rank_ - dist + nRanks_) % nRanks_, kTagBarrier, &token, 1));
  }
  return Result::Success;
}

}  // namespace bootstrap
}  // namespace mkernel
