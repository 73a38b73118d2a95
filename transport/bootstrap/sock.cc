#include "transport/bootstrap/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/log.h"
#include "common/param.h"

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

bool isVirtualBridge(const char* name) {
  static const char* const kPrefixes[] = {"docker", "virbr", "veth", "br-", "cni", "flannel"};
  for (const char* p : kPrefixes)
    if (std::strncmp(name, p, std::strlen(p)) == 0) return true;
  return false;
}

// NCCL_SOCKET_IFNAME syntax: "^a,b" excludes, "=a" exact, otherwise prefixes.
bool matchesIfList(const char* name, const std::string& spec) {
  std::string s = spec;
  bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  bool exact = !s.empty() && s[0] == '=';
  if (exact) s.erase(0, 1);
  bool hit = false;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!tok.empty() && (exact ? tok == name : std::strncmp(name, tok.c_str(), tok.size()) == 0))
      hit = true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return exclude ? !hit : hit;
}

Result waitFd(int fd, short events, const Deadline& dl, const char* what) {
  while (true) {
    if (dl.aborted()) return MK_ERROR(Result::RemoteError, "bootstrap: aborted while %s", what);
    if (dl.expired())
      return MK_ERROR(Result::RemoteError,
                      "bootstrap: timed out after MKERNEL_TIMEOUT_S while %s", what);
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
  std::string spec = paramString("SOCKET_IFNAME");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return MK_ERROR(Result::SystemError, "bootstrap: getifaddrs failed: %s", std::strerror(errno));
  const ifaddrs* pick = nullptr;
  const ifaddrs* loopback = nullptr;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr))
      continue;
    bool isLo = (i->ifa_flags & IFF_LOOPBACK) != 0;
    if (!spec.empty()) {
      if (matchesIfList(i->ifa_name, spec) && (pick == nullptr || (pick->ifa_addr->sa_family == AF_INET6 && fam == AF_INET)))
        pick = i;
      continue;
    }
    if (isLo) {
      if (loopback == nullptr && fam == AF_INET) loopback = i;
      continue;
    }
    if (isVirtualBridge(i->ifa_name)) continue;
    if (pick == nullptr || (pick->ifa_addr->sa_family == AF_INET6 && fam == AF_INET)) pick = i;
  }
  if (pick == nullptr) pick = loopback;
  if (pick == nullptr) {
    freeifaddrs(list);
    return MK_ERROR(Result::SystemError,
                    "bootstrap: no usable network interface%s%s", spec.empty() ? "" : " matches MKERNEL_SOCKET_IFNAME=",
                    spec.c_str());
  }
  std::memset(addr, 0, sizeof(*addr));
  std::memcpy(&addr->sa, pick->ifa_addr,
              pick->ifa_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  if (ifname) *ifname = pick->ifa_name;
  freeifaddrs(list);
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
    if (s < 0) return MK_ERROR(Result::SystemError, "bootstrap: socket(): %s", std::strerror(errno));
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
