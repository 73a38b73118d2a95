#include "transport/bootstrap/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/log.h"
#include "common/param.h"
#include "transport/net/socket_iface.h"

namespace mkernel {
namespace bootstrap {

int Deadline::pollMs() const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
  if (left < 0) return 0;
  return static_cast<int>(left < 100 ? left : 100);
}

std::string addrToString(const SockAddr& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a.sin.sin_addr, host, sizeof(host));
    port = ntohs(a.sin.sin_port);
  } else if (a.sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a.sin6.sin6_addr, host, sizeof(host));
    port = ntohs(a.sin6.sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

namespace {

Result waitFd(int fd, short events, const Deadline& dl, const char* what) {
  while (true) {
    if (dl.aborted()) return MK_ERROR(Result::RemoteError, "bootstrap: aborted while %s", what);
    if (dl.expired())
      return MK_ERROR(Result::RemoteError, "bootstrap: timed out after MKERNEL_TIMEOUT_S while %s",
                      what);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, dl.pollMs());
    if (r < 0 && errno != EINTR)
      return MK_ERROR(Result::SystemError, "bootstrap: poll failed while %s: %s", what,
                      std::strerror(errno));
    if (r > 0) return Result::Success;
  }
}

void setCommonOptions(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

}  // namespace

Result chooseAddress(SockAddr* addr, std::string* ifname) {
  // The same interface rules as the TCP net backend (transport/net/socket_iface.h): IPv4
  // interfaces come first in its list, loopback only as the fallback.
  std::vector<net::NetInterface> ifs;
  bool fallback = false;
  std::string why;
  MK_CHECK(net::findNetInterfaces(params::SOCKET_IFNAME(), &ifs, &fallback, &why));
  if (ifs.empty()) return MK_ERROR(Result::SystemError, "bootstrap: %s", why.c_str());
  std::memset(addr, 0, sizeof(*addr));
  std::memcpy(&addr->sa, &ifs[0].addr.sa, net::socketAddrLen(ifs[0].addr));
  if (ifname) *ifname = ifs[0].name;
  return Result::Success;
}

Result listenOn(SockAddr* addr, int* fd) {
  int s = ::socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return MK_ERROR(Result::SystemError, "bootstrap: socket(): %s", std::strerror(errno));
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s, &addr->sa, addr->len()) != 0 || ::listen(s, 16384) != 0) {
    int e = errno;
    ::close(s);
    return MK_ERROR(Result::SystemError, "bootstrap: cannot listen on %s: %s",
                    addrToString(*addr).c_str(), std::strerror(e));
  }
  socklen_t len = sizeof(SockAddr);
  getsockname(s, &addr->sa, &len);
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
  *fd = s;
  return Result::Success;
}

Result connectTo(const SockAddr& addr, const Deadline& dl, int* fd, const char* what) {
  while (true) {
    int s = ::socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
      return MK_ERROR(Result::SystemError, "bootstrap: socket(): %s", std::strerror(errno));
    setCommonOptions(s);
    int r = ::connect(s, &addr.sa, addr.len());
    if (r == 0 || errno == EINPROGRESS) {
      Result w = waitFd(s, POLLOUT, dl, what);
      if (w != Result::Success) {
        ::close(s);
        return w;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        *fd = s;
        return Result::Success;
      }
      errno = err;
    }
    int e = errno;
    ::close(s);
    if (e != ECONNREFUSED && e != ETIMEDOUT && e != ECONNRESET && e != EAGAIN)
      return MK_ERROR(Result::SystemError, "bootstrap: connect to %s failed while %s: %s",
                      addrToString(addr).c_str(), what, std::strerror(e));
    if (dl.aborted() || dl.expired())
      return MK_ERROR(Result::RemoteError, "bootstrap: could not reach %s while %s (%s)",
                      addrToString(addr).c_str(), what, std::strerror(e));
    ::usleep(20000);  // the peer may not be listening yet
  }
}

Result acceptOn(int listenFd, const Deadline& dl, int* fd, const char* what) {
  while (true) {
    MK_CHECK(waitFd(listenFd, POLLIN, dl, what));
    int s = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (s >= 0) {
      setCommonOptions(s);
      *fd = s;
      return Result::Success;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return MK_ERROR(Result::SystemError, "bootstrap: accept failed while %s: %s", what,
                      std::strerror(errno));
  }
}

Result sendAll(int fd, const void* data, size_t size, const Deadline& dl, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      MK_CHECK(waitFd(fd, POLLOUT, dl, what));
      continue;
    }
    return MK_ERROR(Result::RemoteError, "bootstrap: send failed while %s: %s", what,
                    n < 0 ? std::strerror(errno) : "connection closed");
  }
  return Result::Success;
}

Result recvAll(int fd, void* data, size_t size, const Deadline& dl, const char* what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      MK_CHECK(waitFd(fd, POLLIN, dl, what));
      continue;
    }
    return MK_ERROR(Result::RemoteError, "bootstrap: %s while %s",
                    n == 0 ? "peer closed the connection" : std::strerror(errno), what);
  }
  return Result::Success;
}

void closeFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

}  // namespace bootstrap
}  // namespace mkernel
