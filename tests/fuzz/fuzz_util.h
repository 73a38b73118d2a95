// Helpers shared by the libFuzzer targets (tests/fuzz, docs/RELIABILITY.md). A target reports a
// bug by calling fuzzFail(), which prints the reason and traps: libFuzzer then saves the input.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/param.h"

namespace mkernel {
namespace fuzz {

[[noreturn]] inline void fuzzFail(const char* what) {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s\n", what);
  __builtin_trap();
}

#define FUZZ_CHECK(cond)                           \
  do {                                             \
    if (!(cond)) ::mkernel::fuzz::fuzzFail(#cond); \
  } while (0)

// Quiet, short-fused settings for every target: MKERNEL_DEBUG=VERSION keeps the expected
// rejections from flooding stderr (and slowing the fuzzer down).
inline void quietEnvironment(const char* timeoutS) {
  setenv("MKERNEL_DEBUG", "VERSION", 0);
  setenv("MKERNEL_TIMEOUT_S", timeoutS, 0);
  mkernel::params::resetForTesting();
}

// Descriptors the code under test can leak: sockets, epoll and eventfd instances. Pipes and files
// are left out: the sanitizers' symbolizer and libFuzzer open those on their own.
inline int openFdCount() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[64], target[64] = {};
    std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    if (readlink(path, target, sizeof(target) - 1) <= 0) continue;
    if (std::strncmp(target, "socket:", 7) == 0 || std::strncmp(target, "anon_inode:", 11) == 0)
      ++n;
  }
  closedir(d);
  return n;
}

// Prints what each open descriptor is (socket:[inode], anon_inode:[eventpoll], ...).
inline void printOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[64], target[256] = {};
    std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    std::fprintf(stderr, "  fd %s -> %s\n", e->d_name, n > 0 ? target : "?");
  }
  closedir(d);
}

inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A blocking TCP connection to `sa` whose reads and writes give up after `timeoutMs`.
// The connect itself may take up to 15 s: a listener whose backlog is momentarily full drops the
// SYN, and the kernel retries after 1 s, then 3 s (a 2 s bound is not enough under load). The
// reads and writes afterwards are bounded by timeoutMs.
inline int rawConnect(const sockaddr* sa, socklen_t len, int timeoutMs, int* lastErrno = nullptr) {
  // A loopback connect to a live listener can still fail for a moment (a full accept queue drops
  // the SYN; a burst of short connections can leave no ephemeral port free until TIME_WAIT ends):
  // retried with a fresh socket for 15 s (about one such failure in 3,000 inputs under CI load).
  const auto t0 = std::chrono::steady_clock::now();
  int err = 0;
  while (true) {
    int fd = ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
    } else {
      timeval connectTv{15, 0};
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &connectTv, sizeof(connectTv));
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (::connect(fd, sa, len) == 0) {
        timeval tv{timeoutMs / 1000, (timeoutMs % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        return fd;
      }
      err = errno;
      ::close(fd);
    }
    if (secondsSince(t0) > 15) break;
    usleep(10000);
  }
  if (lastErrno != nullptr) *lastErrno = err;
  return -1;
}

// libFuzzer's -timeout arms a periodic SIGALRM whose handler is installed without SA_RESTART, so
// a blocking send or recv in a target can return EINTR (or short, even with MSG_WAITALL) at any
// moment. The helpers below retry; a bare recv(MSG_WAITALL) fails a correct handshake
// this way (reproduced in seconds with -timeout=1).

// Writes what the peer will take (a peer that closes early is fine: that is its right).
inline void sendSome(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t w = ::send(fd, p, size, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    size -= static_cast<size_t>(w);
  }
}

// Reads exactly `size` bytes unless the peer closes, errs, or the socket's SO_RCVTIMEO passes;
// returns the number of bytes read.
inline size_t recvExactly(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < size) {
    ssize_t r = ::recv(fd, p + got, size - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

// Reads until the peer closes or `timeoutMs` passes; returns whether the peer closed.
inline bool drainUntilClosed(int fd, int timeoutMs) {
  auto t0 = std::chrono::steady_clock::now();
  char buf[4096];
  while (secondsSince(t0) * 1000 < timeoutMs) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r == 0) return true;
    if (r < 0 && errno != EAGAIN && errno != EINTR) return true;  // reset counts as closed
  }
  return false;
}

}  // namespace fuzz
}  // namespace mkernel
