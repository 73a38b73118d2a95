#include "transport/net/socket_iface.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace mkernel {
namespace net {

socklen_t socketAddrLen(const SocketAddr& a) {
  return a.sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

std::string socketAddrToString(const SocketAddr& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a.sin.sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a.sin.sin_port));
  }
  if (a.sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a.sin6.sin6_addr, host, sizeof(host));
    std::string s = "[" + std::string(host);
    if (a.sin6.sin6_scope_id != 0) s += "%" + std::to_string(a.sin6.sin6_scope_id);
    return s + "]:" + std::to_string(ntohs(a.sin6.sin6_port));
  }
  return "(no address)";
}

IfNameFilter IfNameFilter::parse(const std::string& spec) {
  IfNameFilter f;
  size_t pos = 0;
  if (pos < spec.size() && spec[pos] == '^') {
    f.exclude = true;
    ++pos;
  }
  if (pos < spec.size() && spec[pos] == '=') {
    f.exact = true;
    ++pos;
  }
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string entry =
        spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    // NCCL allows "name:port"; the port part only matters to NCCL's bootstrap: drop it.
    size_t colon = entry.find(':');
    if (colon != std::string::npos) entry.resize(colon);
    if (!entry.empty()) f.names.push_back(entry);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return f;
}

bool IfNameFilter::matches(const std::string& ifname) const {
  bool listed = false;
  for (const std::string& n : names) {
    if (exact ? ifname == n : ifname.compare(0, n.size(), n) == 0) {
      listed = true;
      break;
    }
  }
  return listed != exclude;
}

bool isVirtualBridgeOrLoopback(const std::string& ifname) {
  static const char* const kPrefixes[] = {"lo", "docker", "virbr", "veth", "br-", "cni", "flannel"};
  for (const char* p : kPrefixes)
    if (ifname.compare(0, strlen(p), p) == 0) return true;
  return false;
}

namespace {

int readSpeedMbps(const std::string& ifname) {
  std::ifstream f("/sys/class/net/" + ifname + "/speed");
  long speed = -1;
  if (!(f >> speed) || speed <= 0 || speed > INT_MAX) return kDefaultSpeedMbps;
  return static_cast<int>(speed);
}

std::string readPciPath(const std::string& ifname) {
  std::string link = "/sys/class/net/" + ifname + "/device";
  char resolved[PATH_MAX];
  if (realpath(link.c_str(), resolved) == nullptr) return "";  // virtual NIC: no device link
  return resolved;
}

// Collects running interfaces accepted by `accept`, one address each (IPv4 preferred).
template <typename Accept>
void collect(ifaddrs* list, Accept accept, std::vector<NetInterface>* out) {
  for (int pass = 0; pass < 2; ++pass) {  // pass 0: IPv4, pass 1: IPv6
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING))
        continue;
      int family = i->ifa_addr->sa_family;
      if (family != (pass == 0 ? AF_INET : AF_INET6)) continue;
      if (family == AF_INET6) {
        const in6_addr& a6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
        // Link-local addresses need a scope on the peer's side too; NCCL skips them as well.
        if (IN6_IS_ADDR_LINKLOCAL(&a6)) continue;
        if (IN6_IS_ADDR_LOOPBACK(&a6) && !(i->ifa_flags & IFF_LOOPBACK)) continue;
      }
      std::string name = i->ifa_name;
      if (!accept(name)) continue;
      bool seen = false;
      for (const NetInterface& n : *out) seen = seen || n.name == name;
      if (seen) continue;
      NetInterface n;
      n.name = name;
      std::memcpy(&n.addr, i->ifa_addr,
                  family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
      n.speedMbps = readSpeedMbps(name);
      n.pciPath = readPciPath(name);
      out->push_back(n);
    }
  }
}

}  // namespace

Result findNetInterfaces(const std::string& spec, std::vector<NetInterface>* out,
                         bool* usedFallback, std::string* why) {
  out->clear();
  *usedFallback = false;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    *why = std::string("getifaddrs failed: ") + strerror(errno);
    return MK_ERROR(Result::SystemError, "%s", why->c_str());
  }
  if (!spec.empty()) {
    IfNameFilter filter = IfNameFilter::parse(spec);
    collect(
        list, [&](const std::string& n) { return filter.matches(n); }, out);
    if (out->empty()) *why = "no running interface matches MKERNEL_SOCKET_IFNAME=" + spec;
  } else {
    collect(
        list, [](const std::string& n) { return !isVirtualBridgeOrLoopback(n); }, out);
    if (out->empty()) {
      collect(
          list, [](const std::string& n) { return n.compare(0, 2, "lo") == 0; }, out);
      *usedFallback = !out->empty();
      if (out->empty()) *why = "no running network interface, not even loopback";
    }
  }
  freeifaddrs(list);
  return Result::Success;
}

bool setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

bool setNoDelay(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0;
}

}  // namespace net
}  // namespace mkernel
