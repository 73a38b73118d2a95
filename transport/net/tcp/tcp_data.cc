// Data path of the TCP backend: moving message bytes between user buffers and sockets, matching
// headers to grouped receives, and failure bookkeeping.
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/log.h"
#include "transport/net/tcp/tcp_net.h"

namespace mkernel {
namespace net {
namespace tcp {

namespace {
constexpr int kMaxIov = 64;
}  // namespace

TcpComm::TcpComm(bool sender, std::vector<int> fds, std::string peerName, int maxInflight)
    : isSender(sender), peer(std::move(peerName)), pool(static_cast<size_t>(maxInflight)) {
  socks.resize(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) socks[i].fd = fds[i];
  freeList.reserve(pool.size());
  for (size_t i = pool.size(); i-- > 0;) freeList.push_back(&pool[i]);
  lastActivity = Clock::now();
}

TcpComm::~TcpComm() {
  shutdown();
}

void TcpComm::shutdown() {
  // Detach from the engine first: once remove() returns, the engine thread cannot be inside
  // onEvents for these sockets (remove takes the engine mutex the thread holds while dispatching).
  for (DataSocket& s : socks) {
    if (engine != nullptr && s.token != 0) engine->remove(s.token);
    s.token = 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  for (DataSocket& s : socks) {
    if (s.fd >= 0) close(s.fd);
    s.fd = -1;
    s.queue.clear();
  }
  for (TcpRequest* r : inflight) r->live = 0;
  inflight.clear();
}

void TcpComm::fail(Result r, const std::string& msg) {
  if (failure != Result::Success) return;  // the first cause is the one worth reporting
  failure = r;
  failureMsg = msg;
  MK_INFO(kLogNet, "TCP net: %s", msg.c_str());
}

void TcpComm::onEvents(int index, uint32_t events) {
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0 || index >= static_cast<int>(socks.size())) return;
  DataSocket& s = socks[static_cast<size_t>(index)];
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) s.readable = true;
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) s.writable = true;
  progressLocked();
}

TcpRequest* TcpComm::allocRequestLocked() {
  if (freeList.empty()) return nullptr;
  TcpRequest* r = freeList.back();
  freeList.pop_back();
  r->live = TcpRequest::kLiveMagic;
  r->comm = this;
  r->isSend = isSender;
  r->complete = false;
  r->bytesLeft = 0;
  r->n = 0;
  r->nMatched = 0;
  r->seq = nextSeq++;
  if (inflight.empty()) touch();  // the stall clock starts when there is something to wait for
  inflight.push_back(r);
  return r;
}

void TcpComm::freeRequestLocked(TcpRequest* req) {
  auto it = std::find(inflight.begin(), inflight.end(), req);
  if (it != inflight.end()) inflight.erase(it);
  req->live = 0;
  freeList.push_back(req);
}

// Both sides must deal a message's bytes to sockets identically: small messages whole on socket 0
// (behind their header), large ones in chunks round-robin from socket 0.
void TcpComm::queueSegmentsLocked(char* data, size_t size, TcpRequest* req) {
  size_t nSocks = socks.size();
  if (size == 0) return;
  if (size <= chunkBytes || nSocks == 1) {
    socks[0].queue.push_back(Segment{data, size, req});
    return;
  }
  size_t i = 0;
  for (size_t off = 0; off < size; off += chunkBytes, ++i) {
    socks[i % nSocks].queue.push_back(Segment{data + off, std::min(chunkBytes, size - off), req});
  }
}

void TcpComm::progressLocked() {
  if (failure == Result::Success) {
    if (isSender) {
      progressSendLocked();
    } else {
      progressRecvLocked();
    }
  }
  uint64_t firstIncomplete = nextSeq;
  for (TcpRequest* r : inflight) {
    if (!r->complete) {
      firstIncomplete = r->seq;
      break;
    }
  }
  orderedDone.store(firstIncomplete, std::memory_order_release);
}

void TcpComm::progressSendLocked() {
  // A send comm's sockets never carry data towards us: readable means the peer closed or reset.
  for (DataSocket& s : socks) {
    if (!s.readable) continue;
    char byte;
    ssize_t r = recv(s.fd, &byte, 1, MSG_DONTWAIT);
    if (r == 0) {
      fail(Result::RemoteError, "connection closed by peer " + peer);
      return;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      s.readable = false;
    } else if (r < 0 && errno != EINTR) {
      fail(Result::RemoteError, "connection to peer " + peer + " failed: " + strerror(errno));
      return;
    } else if (r > 0) {
      fail(Result::InternalError, "protocol error: unexpected bytes from receiver " + peer);
      return;
    }
  }
  for (DataSocket& s : socks) {
    while (s.writable && !s.queue.empty()) {
      iovec iov[kMaxIov];
      int niov = 0;
      for (auto it = s.queue.begin(); it != s.queue.end() && niov < kMaxIov; ++it, ++niov) {
        iov[niov].iov_base = it->p;
        iov[niov].iov_len = it->len;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(niov);
      ssize_t w = sendmsg(s.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          s.writable = false;
          break;
        }
        if (errno == EINTR) continue;
        fail(errno == EPIPE || errno == ECONNRESET ? Result::RemoteError : Result::SystemError,
             "send to peer " + peer + " failed: " + strerror(errno));
        return;
      }
      touch();
      size_t left = static_cast<size_t>(w);
      while (left > 0) {
        Segment& seg = s.queue.front();
        size_t take = std::min(left, seg.len);
        seg.p += take;
        seg.len -= take;
        left -= take;
        seg.req->bytesLeft -= take;
        if (seg.req->bytesLeft == 0) seg.req->complete = true;
        if (seg.len == 0) s.queue.pop_front();
      }
    }
  }
}

bool TcpComm::matchHeaderLocked() {
  const MsgHeader& h = pendingHeader;
  for (TcpRequest* r : inflight) {
    if (r->nMatched == r->n) continue;
    for (int i = 0; i < r->n; ++i) {
      TcpRequest::Slot& slot = r->slots[i];
      if (slot.matched || slot.tag != h.tag) continue;
      if (h.size > slot.posted) {
        fail(Result::InvalidUsage, "message of " + std::to_string(h.size) + " bytes (tag " +
                                       std::to_string(h.tag) + ") from peer " + peer +
                                       " is larger than the " + std::to_string(slot.posted) +
                                       " bytes posted for it");
        return false;
      }
      slot.matched = true;
      slot.received = h.size;
      r->nMatched++;
      r->bytesLeft += h.size;
      queueSegmentsLocked(slot.data, h.size, r);
      if (r->nMatched == r->n && r->bytesLeft == 0) r->complete = true;
      headerReady = false;
      headerGot = 0;
      return true;
    }
  }
  return false;
}

bool TcpComm::tailInFlightLocked() const {
  for (const DataSocket& o : socks)
    if (!o.peerClosed && !o.queue.empty()) return true;
  return false;
}

void TcpComm::progressRecvLocked() {
  bool moved = true;
  while (moved && failure == Result::Success) {
    moved = false;
    if (headerReady && matchHeaderLocked()) moved = true;
    for (size_t i = 0; i < socks.size() && failure == Result::Success; ++i) {
      DataSocket& s = socks[i];
      if (s.peerClosed) {
        // Deferred close (below): once no other socket has bytes due, the connection is over.
        if (!tailInFlightLocked()) {
          fail(Result::RemoteError, std::string("connection closed by peer ") + peer);
          return;
        }
        continue;
      }
      if (!s.readable) continue;
      char* dst;
      size_t want;
      if (!s.queue.empty()) {
        dst = s.queue.front().p;
        want = s.queue.front().len;
      } else if (i == 0 && !headerReady) {
        dst = reinterpret_cast<char*>(&pendingHeader) + headerGot;
        want = sizeof(MsgHeader) - headerGot;
      } else if (i > 0 && !s.closedAhead) {
        // Nothing is due on this data socket: bytes that arrived ahead of their header stay in
        // the kernel for now. But an event may have come from the peer's close: peek for it.
        char byte;
        const ssize_t p = recv(s.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (p == 0) {
          s.closedAhead = true;
          s.readable = false;
          if (closedAheadSock < 0) {
            closedAheadSock = static_cast<int>(i);
            closedAheadAt = Clock::now();
          }
        } else if (p < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          s.readable = false;
        } else if (p < 0 && errno != EINTR) {
          fail(errno == ECONNRESET ? Result::RemoteError : Result::SystemError,
               "receive from peer " + peer + " failed: " + strerror(errno));
          return;
        }
        continue;
      } else {
        continue;  // bytes that arrived ahead of their header stay in the kernel for now
      }
      ssize_t r = recv(s.fd, dst, want, MSG_DONTWAIT);
      if (r == 0) {
        bool midMessage = !s.queue.empty() || headerGot > 0;
        if (!midMessage && tailInFlightLocked()) {
          // The peer closed right after its last send completed: this socket sits between
          // messages while the tail of that send still arrives on another socket. Let it land.
          s.peerClosed = true;
          s.readable = false;
          moved = true;
          continue;
        }
        fail(Result::RemoteError, std::string("connection closed by peer ") + peer +
                                      (midMessage ? " in the middle of a message" : ""));
        return;
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          s.readable = false;
          continue;
        }
        if (errno == EINTR) continue;
        fail(errno == ECONNRESET ? Result::RemoteError : Result::SystemError,
             "receive from peer " + peer + " failed: " + strerror(errno));
        return;
      }
      touch();
      moved = true;
      size_t got = static_cast<size_t>(r);
      if (!s.queue.empty()) {
        Segment& seg = s.queue.front();
        seg.p += got;
        seg.len -= got;
        TcpRequest* req = seg.req;
        req->bytesLeft -= got;
        if (seg.len == 0) s.queue.pop_front();
        if (req->bytesLeft == 0 && req->nMatched == req->n) req->complete = true;
      } else {
        headerGot += got;
        if (headerGot == sizeof(MsgHeader)) {
          if (pendingHeader.magic != kMsgMagic) {
            fail(Result::InternalError, "protocol error: bad message header from peer " + peer);
            return;
          }
          headerReady = true;
          matchHeaderLocked();
        }
      }
    }
  }
  checkClosedAheadLocked();
}

void TcpComm::checkClosedAheadLocked() {
  if (isSender || closedAheadSock < 0 || failure != Result::Success) return;
  // A header assigned bytes to a socket that had closed: they can never come.
  for (size_t i = 1; i < socks.size(); ++i)
    if (socks[i].closedAhead && !socks[i].queue.empty()) {
      fail(Result::RemoteError, "connection closed by peer " + peer +
                                    " in the middle of a message (its socket " + std::to_string(i) +
                                    " closed first)");
      return;
    }
  // What the peer sent before closing is still read first: a header pending, a message's tail,
  // or bytes unread on socket 0.
  if (headerReady || headerGot > 0 || tailInFlightLocked() || socks[0].peerClosed) return;
  int unread = 0;
  if (socks[0].fd >= 0 && ioctl(socks[0].fd, SIOCINQ, &unread) == 0 && unread > 0) return;
  const Clock::time_point since = std::max(closedAheadAt, lastActivity);
  const double silent = std::chrono::duration<double>(Clock::now() - since).count();
  if (silent < kCloseGraceS) return;
  char why[160];
  std::snprintf(why, sizeof(why),
                " (its socket %d closed; socket 0, still open, brought nothing for %.1f s since)",
                closedAheadSock, silent);
  fail(Result::RemoteError, "connection closed by peer " + peer + why);
}

std::string TcpComm::describeLocked() const {
  std::string out =
      std::to_string(inflight.size()) + (isSender ? " send(s)" : " receive(s)") + " in flight";
  int shown = 0;
  for (const TcpRequest* r : inflight) {
    if (shown++ == 4) {
      out += " ...";
      break;
    }
    if (r->isSend) {
      out += " [tag " + std::to_string(r->header.tag) + ", " + std::to_string(r->header.size) +
             " B, " + std::to_string(r->bytesLeft) + " B unsent]";
      continue;
    }
    out += " [";
    for (int i = 0; i < r->n; ++i)
      out += (i ? ", tag " : "tag ") + std::to_string(r->slots[i].tag) +
             (r->slots[i].matched ? " matched" : "") + " <=" + std::to_string(r->slots[i].posted) +
             " B";
    out += "]";
  }
  if (!isSender) {
    if (headerReady) {
      out += "; a header for tag " + std::to_string(pendingHeader.tag) + " (" +
             std::to_string(pendingHeader.size) + " B) was read and no posted receive has that tag";
    } else if (headerGot > 0) {
      out += "; " + std::to_string(headerGot) + " of " + std::to_string(sizeof(MsgHeader)) +
             " header bytes read";
    } else {
      out += "; no header pending";
    }
  }
  for (size_t i = 0; i < socks.size(); ++i) {
    const DataSocket& s = socks[i];
    size_t queued = 0;
    for (const Segment& seg : s.queue) queued += seg.len;
    int kernelBytes = -1;
    if (s.fd >= 0 && ioctl(s.fd, isSender ? SIOCOUTQ : SIOCINQ, &kernelBytes) != 0)
      kernelBytes = -1;
    out += "; socket " + std::to_string(i) + ": " + std::to_string(queued) + " B to " +
           (isSender ? "write" : "read") + ", kernel " +
           (isSender ? "unacknowledged " : "unread ") +
           (kernelBytes < 0 ? std::string("?") : std::to_string(kernelBytes)) + " B, " +
           (isSender ? (s.writable ? "writable" : "not writable")
                     : (s.readable ? "readable" : "not readable")) +
           (s.peerClosed ? ", peer closed" : "");
  }
  return out;
}

}  // namespace tcp
}  // namespace net
}  // namespace mkernel
