// Network interfaces for the socket-based transports: which interfaces to use (NCCL's rules and
// NCCL_SOCKET_IFNAME syntax through MKERNEL_SOCKET_IFNAME), their addresses, speeds and PCI paths,
// plus the small fd helpers every non-blocking socket of the TCP net backend needs.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace mkernel {
namespace net {

// An IPv4 or IPv6 socket address (with the IPv6 scope id, needed for link-local addresses).
union SocketAddr {
  sockaddr sa;
  sockaddr_in sin;
  sockaddr_in6 sin6;
};
socklen_t socketAddrLen(const SocketAddr& a);
std::string socketAddrToString(const SocketAddr& a);  // "1.2.3.4:5" or "[fe80::1%2]:5"

struct NetInterface {
  std::string name;     // e.g. "eth0"; unique in a list
  SocketAddr addr{};    // first usable address of the interface (port 0)
  int speedMbps = 0;    // /sys/class/net/<if>/speed, or kDefaultSpeedMbps
  std::string pciPath;  // realpath of /sys/class/net/<if>/device, "" for a virtual NIC
};

// What /sys/class/net/<if>/speed reads -1 or nothing for (virtual NICs, many cloud VMs): NCCL
// assumes 10 Gbps there too.
constexpr int kDefaultSpeedMbps = 10000;

// NCCL_SOCKET_IFNAME syntax: comma-separated entries; a leading '^' excludes the listed
// interfaces, a leading '=' (after any '^') makes the entries exact names instead of prefixes.
struct IfNameFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
  static IfNameFilter parse(const std::string& spec);
  bool matches(const std::string& ifname) const;  // whether the interface is selected
};

// Interfaces whose name looks like loopback or a container/virtual bridge; skipped unless
// MKERNEL_SOCKET_IFNAME names them.
bool isVirtualBridgeOrLoopback(const std::string& ifname);

// Interfaces for the TCP net backend, in getifaddrs() order, one entry per interface (its first
// IPv4 address, else its first non-link-local IPv6 address). With MKERNEL_SOCKET_IFNAME set
// (`spec`), exactly the interfaces it selects; otherwise every running interface except loopback
// and container/virtual bridges, falling back to loopback when nothing else exists (*usedFallback
// is then true). The result is empty only when even loopback is missing or the spec selects
// nothing; *why says so.
Result findNetInterfaces(const std::string& spec, std::vector<NetInterface>* out,
                         bool* usedFallback, std::string* why);

// fd helpers (return false and set errno on failure).
bool setNonBlocking(int fd);
bool setNoDelay(int fd);

}  // namespace net
}  // namespace mkernel
