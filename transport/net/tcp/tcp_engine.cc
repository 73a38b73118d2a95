// The progress Engine: one epoll thread that sleeps until a socket of one of its comms changes
// state, then lets that comm move bytes.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "transport/net/tcp/tcp_net.h"

namespace mkernel {
namespace net {
namespace tcp {

namespace {
constexpr uint64_t kWakeToken = 0;
constexpr int kMaxEventsPerWait = 64;
}  // namespace

Engine::~Engine() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(wakeFd_, &one, sizeof(one));
    (void)w;  // the eventfd cannot be full: a failed wake would only be EINTR-like noise
    thread_.join();
  }
  if (wakeFd_ >= 0) close(wakeFd_);
  if (epfd_ >= 0) close(epfd_);
}

Result Engine::start() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (thread_.joinable()) return Result::Success;
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0)
    return MK_ERROR(Result::SystemError, "TCP net: epoll_create1 failed: %s", strerror(errno));
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0)
    return MK_ERROR(Result::SystemError, "TCP net: eventfd failed: %s", strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0)
    return MK_ERROR(Result::SystemError, "TCP net: epoll_ctl(eventfd) failed: %s", strerror(errno));
  thread_ = std::thread([this] { loop(); });
  return Result::Success;
}

Result Engine::add(int fd, EventTarget* target, int index, uint64_t* token) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  uint64_t t = nextToken_++;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = t;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0)
    return MK_ERROR(Result::SystemError, "TCP net: epoll_ctl(ADD fd %d) failed: %s", fd,
                    strerror(errno));
  regs_[t] = Registration{fd, target, index};
  *token = t;
  return Result::Success;
}

void Engine::remove(uint64_t token) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = regs_.find(token);
  if (it == regs_.end()) return;
  epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  regs_.erase(it);
}

int Engine::registrations() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return static_cast<int>(regs_.size());
}

void Engine::loop() {
  epoll_event events[kMaxEventsPerWait];
  while (!stop_.load(std::memory_order_acquire)) {
    int n = epoll_wait(epfd_, events, kMaxEventsPerWait, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      MK_WARN("TCP net: epoll_wait failed (%s); progress thread stops, transfers will time out",
              strerror(errno));
      return;
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (int i = 0; i < n; ++i) {
      // epoll_event is packed: copy its fields out instead of binding references to them.
      const uint64_t token = events[i].data.u64;
      const uint32_t mask = events[i].events;
      if (token == kWakeToken) {
        uint64_t v;
        while (read(wakeFd_, &v, sizeof(v)) > 0) {
        }
        continue;
      }
      auto it = regs_.find(token);
      if (it == regs_.end()) continue;  // closed after epoll_wait returned
      it->second.target->onEvents(it->second.index, mask);
    }
  }
}

}  // namespace tcp
}  // namespace net
}  // namespace mkernel
