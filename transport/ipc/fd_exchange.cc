#include "transport/ipc/fd_exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "common/text.h"

namespace mkernel {
namespace ipc {
namespace {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  char name[64];  // abstract socket name, without the leading NUL
  int32_t pid;
  int32_t nFds;
  uint64_t nonce;
};

// What a caller sends first, and what the answer carries beside the descriptors.
struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t nonce;  // the listener's, as gathered
};
struct Answer {
  uint32_t magic;
  int32_t rank;
  int32_t nFds;
  int32_t pad;
};
constexpr uint32_t kHelloMagic = 0x6d6b6664;   // "mkfd"
constexpr uint32_t kAnswerMagic = 0x6d6b6661;  // "mkfa"

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd_ = o.fd_;
    o.fd_ = -1;
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

socklen_t abstractAddr(const char* name, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  const size_t n = std::min(std::strlen(name), sizeof(a->sun_path) - 1);
  std::memcpy(a->sun_path + 1, name, n);  // sun_path[0] == 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

int msLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 100));
}

// Waits for `events` on fd until the deadline; Result::RemoteError when it passes.
// "rank 3", or for a caller not yet identified (peer < 0) "a caller".
struct PeerText {
  char s[32];
  explicit PeerText(int peer) {
    if (peer >= 0)
      std::snprintf(s, sizeof(s), "rank %d", peer);
    else
      std::snprintf(s, sizeof(s), "a caller");
  }
};

Result waitFor(int fd, short events, Clock::time_point deadline, int rank, const char* what,
               int peer) {
  const PeerText who(peer);
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, msLeft(deadline));
    if (r > 0) return Result::Success;
    if (r < 0 && errno != EINTR)
      return MK_ERROR(Result::SystemError, "rank %d: passing memory descriptors, %s %s: poll: %s",
                      rank, what, who.s, std::strerror(errno));
    if (Clock::now() >= deadline)
      return MK_ERROR(
          Result::RemoteError,
          "rank %d: passing memory descriptors, %s %s: nothing within the timeout (are those "
          "processes alive, and in this host's network namespace?)",
          rank, what, who.s);
  }
}

Result sendBytes(int fd, const void* data, size_t size, Clock::time_point deadline, int rank,
                 const char* what, int peer) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    MK_CHECK(waitFor(fd, POLLOUT, deadline, rank, what, peer));
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return MK_ERROR(Result::RemoteError, "rank %d: passing memory descriptors, %s %s: send: %s",
                      rank, what, PeerText(peer).s, std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Result::Success;
}

Result recvBytes(int fd, void* data, size_t size, Clock::time_point deadline, int rank,
                 const char* what, int peer) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    MK_CHECK(waitFor(fd, POLLIN, deadline, rank, what, peer));
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n == 0)
      return MK_ERROR(Result::RemoteError,
                      "rank %d: passing memory descriptors, %s %s: connection closed", rank, what,
                      PeerText(peer).s);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return MK_ERROR(Result::RemoteError, "rank %d: passing memory descriptors, %s %s: recv: %s",
                      rank, what, PeerText(peer).s, std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Result::Success;
}

Result sendFds(int fd, const Answer& ans, const int* fds, int nFds, Clock::time_point deadline,
               int rank, int peer) {
  char ctl[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  std::memset(ctl, 0, sizeof(ctl));
  Answer copy = ans;
  iovec iov{&copy, sizeof(copy)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<size_t>(nFds));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<size_t>(nFds));
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<size_t>(nFds));
  for (;;) {
    MK_CHECK(waitFor(fd, POLLOUT, deadline, rank, "answering", peer));
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(copy))) return Result::Success;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    return MK_ERROR(Result::RemoteError,
                    "rank %d: passing memory descriptors, answering rank %d: sendmsg: %s", rank,
                    peer, n < 0 ? std::strerror(errno) : "short write");
  }
}

// Receives an Answer with exactly nFds descriptors into out[0..nFds).
Result recvFds(int fd, int peer, int nFds, Clock::time_point deadline, int rank, int* out) {
  Answer ans{};
  char ctl[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  std::memset(ctl, 0, sizeof(ctl));
  iovec iov{&ans, sizeof(ans)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  ssize_t n = -1;
  for (;;) {
    MK_CHECK(waitFor(fd, POLLIN, deadline, rank, "receiving from", peer));
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    break;
  }
  // Whatever arrived is ours to close if it is not what was asked for.
  std::vector<int> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int v = -1;
      std::memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      got.push_back(v);
    }
  }
  auto fail = [&](const char* why) {
    for (int v : got) ::close(v);
    return MK_ERROR(Result::RemoteError,
                    "rank %d: passing memory descriptors, rank %d's answer: %s", rank, peer, why);
  };
  if (n == 0) return fail("connection closed before it");
  if (n < 0) return fail(std::strerror(errno));
  if (n != static_cast<ssize_t>(sizeof(ans)) || ans.magic != kAnswerMagic || ans.rank != peer)
    return fail("malformed");
  if ((msg.msg_flags & MSG_CTRUNC) != 0) return fail("descriptors truncated (out of descriptors?)");
  if (ans.nFds != nFds || static_cast<int>(got.size()) != nFds)
    return fail("wrong number of descriptors");
  for (int i = 0; i < nFds; ++i) out[i] = got[static_cast<size_t>(i)];
  return Result::Success;
}

}  // namespace

Result exchangeFds(const AllGatherFn& allGather, int rank, int nRanks,
                   const std::vector<char>& want, const int* fds, int nFds, double timeoutS,
                   std::vector<int>* got) {
  got->assign(static_cast<size_t>(nRanks) * static_cast<size_t>(std::max(nFds, 0)), -1);
  if (nFds < 1 || nFds > kMaxPassedFds || static_cast<int>(want.size()) != nRanks || rank < 0 ||
      rank >= nRanks)
    return MK_ERROR(Result::InvalidArgument,
                    "rank %d: exchangeFds: %d descriptors for %zu of %d ranks", rank, nFds,
                    want.size(), nRanks);
  const auto deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeoutS * 1e6));

  // 1. Listen, and gather every rank's socket name.
  std::vector<Endpoint> eps(static_cast<size_t>(nRanks));
  Endpoint& me = eps[static_cast<size_t>(rank)];
  std::memset(&me, 0, sizeof(me));
  me.pid = static_cast<int32_t>(::getpid());
  me.nFds = nFds;
  me.nonce = randomNonce();
  std::snprintf(me.name, sizeof(me.name), "mkernel-fd-%d-%d-%016llx", me.pid, rank,
                static_cast<unsigned long long>(me.nonce));
  int expected = 0;  // connections to accept: ranks that want ours (want is symmetric)
  for (int r = 0; r < nRanks; ++r)
    if (r != rank && want[static_cast<size_t>(r)]) ++expected;
  Fd listener;
  Result setup = Result::Success;
  if (expected > 0) {
    listener = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_un a;
    const socklen_t len = abstractAddr(me.name, &a);
    if (listener.get() < 0 || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listener.get(), SOMAXCONN) != 0)  // callers queue until step 3 accepts them
      setup = MK_ERROR(Result::SystemError,
                       "rank %d: passing memory descriptors: a Unix socket @%s: %s", rank, me.name,
                       std::strerror(errno));
  }
  if (setup != Result::Success) me.nFds = -1;  // the others learn of it in the gather, and stop too
  MK_CHECK(allGather(eps.data(), sizeof(Endpoint)));
  if (setup != Result::Success) return setup;
  for (int r = 0; r < nRanks; ++r) {
    const Endpoint& e = eps[static_cast<size_t>(r)];
    if (r != rank && want[static_cast<size_t>(r)] && e.nFds != nFds)
      return MK_ERROR(
          Result::RemoteError, "rank %d: passing memory descriptors: rank %d %s", rank, r,
          e.nFds < 0 ? "could not listen for them" : "passes a different number of them");
  }

  // 2. Connect to every rank whose descriptors we want, and say who we are. A failure here is not
  // returned at once: every rank learns it in the gather below, so that nobody waits out the
  // deadline for a connection that will not come (peers in different network namespaces cannot
  // reach each other's abstract sockets).
  std::vector<Fd> out(static_cast<size_t>(nRanks));
  Result connectRes = Result::Success;
  for (int r = 0; r < nRanks && connectRes == Result::Success; ++r) {
    if (r == rank || !want[static_cast<size_t>(r)]) continue;
    const Endpoint& e = eps[static_cast<size_t>(r)];
    Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_un a;
    const socklen_t len = abstractAddr(e.name, &a);
    if (s.get() < 0) {
      connectRes = MK_ERROR(Result::SystemError, "rank %d: passing memory descriptors: socket: %s",
                            rank, std::strerror(errno));
      break;
    }
    // A Unix socket's connect completes at once while the listener's backlog (SOMAXCONN) has room;
    // EAGAIN (full) is retried until the deadline.
    while (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
      if ((errno != EAGAIN && errno != EINTR) || Clock::now() >= deadline) {
        connectRes = MK_ERROR(
            Result::RemoteError,
            "rank %d: passing memory descriptors: connecting to rank %d (pid %d) at @%s: %s (are "
            "the two processes in different network namespaces?)",
            rank, r, e.pid, e.name, std::strerror(errno));
        break;
      }
      ::usleep(1000);
    }
    if (connectRes != Result::Success) break;
    const Hello hello{kHelloMagic, rank, e.nonce};
    connectRes = sendBytes(s.get(), &hello, sizeof(hello), deadline, rank, "greeting", r);
    out[static_cast<size_t>(r)] = std::move(s);
  }
  std::vector<int32_t> connected(static_cast<size_t>(nRanks), 0);
  connected[static_cast<size_t>(rank)] = connectRes == Result::Success ? 1 : 0;
  MK_CHECK(allGather(connected.data(), sizeof(int32_t)));
  if (connectRes != Result::Success) return connectRes;
  for (int r = 0; r < nRanks; ++r)
    if (!connected[static_cast<size_t>(r)])
      return MK_ERROR(
          Result::RemoteError,
          "rank %d: passing memory descriptors: rank %d could not reach its peers' sockets", rank,
          r);

  // 3. Answer every rank that wants ours, once each, after checking who it is.
  std::vector<char> answered(static_cast<size_t>(nRanks), 0);
  for (int served = 0; served < expected;) {
    MK_CHECK(waitFor(listener.get(), POLLIN, deadline, rank, "waiting for", -1));
    Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (c.get() < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return MK_ERROR(Result::SystemError, "rank %d: passing memory descriptors: accept: %s", rank,
                      std::strerror(errno));
    }
    // A rank's greeting is already there (it was sent before the gather above); a caller that
    // sends none within a second, or closes, is not one of ours and is dropped, not waited for.
    Hello hello{};
    const auto greetBy = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    if (recvBytes(c.get(), &hello, sizeof(hello), greetBy, rank, "reading a greeting from", -1) !=
        Result::Success) {
      MK_WARN("rank %d: passing memory descriptors: dropped a caller without a greeting (%s)", rank,
              lastError());
      continue;
    }
    ucred cred{};
    socklen_t cl = sizeof(cred);
    const int who = hello.rank;
    const bool known = hello.magic == kHelloMagic && who >= 0 && who < nRanks && who != rank &&
                       want[static_cast<size_t>(who)] && !answered[static_cast<size_t>(who)] &&
                       hello.nonce == me.nonce;
    if (!known || ::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        cred.pid != eps[static_cast<size_t>(who)].pid) {
      // Not one of ours (or a second greeting): not served, and not counted.
      MK_WARN("rank %d: passing memory descriptors: refused a caller claiming rank %d (pid %d)",
              rank, who, static_cast<int>(cred.pid));
      continue;
    }
    const Answer ans{kAnswerMagic, rank, nFds, 0};
    MK_CHECK(sendFds(c.get(), ans, fds, nFds, deadline, rank, who));
    answered[static_cast<size_t>(who)] = 1;
    ++served;
  }

  // 4. Our answers.
  for (int r = 0; r < nRanks; ++r) {
    if (out[static_cast<size_t>(r)].get() < 0) continue;
    const Result res = recvFds(out[static_cast<size_t>(r)].get(), r, nFds, deadline, rank,
                               got->data() + static_cast<size_t>(r) * static_cast<size_t>(nFds));
    if (res != Result::Success) {
      for (int& v : *got) {
        if (v >= 0) ::close(v);
        v = -1;
      }
      return res;
    }
  }
  return Result::Success;
}

}  // namespace ipc
}  // namespace mkernel
