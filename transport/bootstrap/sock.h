// Small blocking-socket helpers for the bootstrap: every call is bounded by a deadline and polls
// an abort flag, so that no bootstrap wait can hang.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "common/result.h"
#include "transport/bootstrap/wire.h"

namespace mkernel {
namespace bootstrap {

using Clock = std::chrono::steady_clock;

struct Deadline {
  Clock::time_point at;
  const std::atomic<bool>* abort = nullptr;
  static Deadline in(double seconds, const std::atomic<bool>* abortFlag = nullptr) {
    return Deadline{Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)),
                    abortFlag};
  }
  bool expired() const { return Clock::now() >= at; }
  bool aborted() const { return abort != nullptr && abort->load(std::memory_order_acquire); }
  int pollMs() const;  // ms to wait in one poll() step: at most 100 ms, so aborts are seen
};

// Chooses the address to advertise: MKERNEL_SOCKET_IFNAME (NCCL_SOCKET_IFNAME syntax), else the
// first IPv4 interface that is up and is neither loopback nor a container/virtual bridge, else
// loopback. *ifname receives the interface name.
Result chooseAddress(SockAddr* addr, std::string* ifname);
std::string addrToString(const SockAddr& a);

Result listenOn(SockAddr* addr /* in: address, port 0 ok; out: bound address */, int* fd);
// Connects, retrying refused connections until the deadline (the peer may not listen yet).
Result connectTo(const SockAddr& addr, const Deadline& dl, int* fd, const char* what);
// Accepts one connection on a listening fd.
Result acceptOn(int listenFd, const Deadline& dl, int* fd, const char* what);
Result sendAll(int fd, const void* data, size_t size, const Deadline& dl, const char* what);
Result recvAll(int fd, void* data, size_t size, const Deadline& dl, const char* what);
void closeFd(int* fd);

}  // namespace bootstrap
}  // namespace mkernel
