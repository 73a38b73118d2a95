#include "transport/proxy/proxy.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/cpuset.h"
#include "common/log.h"
#include "common/param.h"

namespace mkernel {
namespace proxy {

namespace {

const char* opName(uint32_t op) {
  return op == kOpSend ? "send" : op == kOpRecv ? "receive" : "?";
}

}  // namespace

Proxy::Proxy(net::Net* net, int dev, int rank, int nRanks, ProxyRing* ring, ProxyFlags* flags)
    : Proxy(net, dev, rank, nRanks, std::vector<ProxyChannel>{ProxyChannel{ring, flags}}) {}

Proxy::Proxy(net::Net* net, int dev, int rank, int nRanks, std::vector<ProxyChannel> channels)
    : net_(net),
      dev_(dev),
      rank_(rank),
      nRanks_(nRanks),
      self_("rank " + std::to_string(rank)),
      channels_(std::move(channels)),
      timeoutNs_(static_cast<uint64_t>(params::TIMEOUT_S()) * 1000000000ull) {
  const size_t links = channels_.size() * static_cast<size_t>(nRanks);
  listen_.assign(links, nullptr);
  send_.assign(links, nullptr);
  recv_.assign(links, nullptr);
  sends_.resize(links);
  recvs_.resize(links);
}

Proxy::~Proxy() {
  (void)stop();
}

void Proxy::setNames(const std::string& self, const std::string& peerNoun) {
  self_ = self;
  peerNoun_ = peerNoun;
}

std::string Proxy::peerName(int p) const {
  return peerNoun_ + " " + std::to_string(p);
}

std::string Proxy::who(int c) const {
  std::string w = self_ + ": proxy";
  if (channels_.size() > 1) w += " channel " + std::to_string(c);
  return w;
}

Result Proxy::listenHandles(std::vector<Handle>* out) {
  if (channels_.empty()) return MK_ERROR(Result::InvalidUsage, "rank %d: proxy: no channel", rank_);
  out->assign(static_cast<size_t>(nRanks_), Handle());
  for (int p = 0; p < nRanks_; ++p) {
    if (p == rank_) continue;
    Handle h(channels_.size() * net::kHandleSize, 0);
    for (int c = 0; c < channels(); ++c) {
      Result r = net_->listen(dev_, h.data() + static_cast<size_t>(c) * net::kHandleSize,
                              &listen_[link(c, p)]);
      if (r != Result::Success)
        return MK_ERROR(r, "%s: listening for %s failed: %s", who(c).c_str(), peerName(p).c_str(),
                        lastError());
    }
    (*out)[static_cast<size_t>(p)] = std::move(h);
  }
  return Result::Success;
}

Result Proxy::connectAll(const std::vector<Handle>& fromPeers) {
  if (static_cast<int>(fromPeers.size()) != nRanks_)
    return MK_ERROR(Result::InvalidArgument, "rank %d: proxy: %zu handles for %d ranks", rank_,
                    fromPeers.size(), nRanks_);
  for (int p = 0; p < nRanks_; ++p)
    if (p != rank_ &&
        fromPeers[static_cast<size_t>(p)].size() != channels_.size() * net::kHandleSize)
      return MK_ERROR(Result::InvalidArgument,
                      "rank %d: proxy: handle from rank %d has %zu bytes, expected %zu (%d "
                      "channel(s); every rank must "
                      "create the same number)",
                      rank_, p, fromPeers[static_cast<size_t>(p)].size(),
                      channels_.size() * net::kHandleSize, channels());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeoutNs_);
  for (;;) {
    bool all = true;
    for (int c = 0; c < channels(); ++c) {
      for (int p = 0; p < nRanks_; ++p) {
        if (p == rank_) continue;
        const size_t i = link(c, p);
        if (send_[i] == nullptr) {
          Result r = net_->connect(
              dev_,
              fromPeers[static_cast<size_t>(p)].data() + static_cast<size_t>(c) * net::kHandleSize,
              &send_[i]);
          if (r != Result::Success)
            return MK_ERROR(r, "%s: connecting to %s failed: %s", who(c).c_str(),
                            peerName(p).c_str(), lastError());
        }
        if (recv_[i] == nullptr) {
          Result r = net_->accept(listen_[i], &recv_[i]);
          if (r != Result::Success)
            return MK_ERROR(r, "%s: accepting %s failed: %s", who(c).c_str(), peerName(p).c_str(),
                            lastError());
        }
        all = all && send_[i] != nullptr && recv_[i] != nullptr;
      }
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int c = 0; c < channels(); ++c)
        for (int p = 0; p < nRanks_; ++p)
          if (p != rank_ && (send_[link(c, p)] == nullptr || recv_[link(c, p)] == nullptr))
            missing += (missing.empty() ? "" : ", ") + std::to_string(p) +
                       (channels_.size() > 1 ? " (channel " + std::to_string(c) + ")" : "");
      return MK_ERROR(Result::RemoteError,
                      "%s: proxy: timed out after MKERNEL_TIMEOUT_S connecting to %s(s) %s",
                      self_.c_str(), peerNoun_.c_str(), missing.c_str());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // NCCL closes listen comms once their connection is accepted; so do we.
  for (auto& l : listen_) {
    if (l != nullptr) (void)net_->closeListen(l);
    l = nullptr;
  }
  return Result::Success;
}

Result Proxy::registerRegion(void* base, size_t bytes, int ptrType) {
  if (thread_.joinable())
    return MK_ERROR(Result::InvalidUsage,
                    "rank %d: proxy: regions must be registered before start()", rank_);
  Region reg;
  reg.base = reinterpret_cast<uintptr_t>(base);
  reg.bytes = bytes;
  reg.sendMr.assign(send_.size(), nullptr);
  reg.recvMr.assign(recv_.size(), nullptr);
  regions_.push_back(std::move(reg));  // closeAll() deregisters whatever a failure left behind
  Region& r0 = regions_.back();
  for (int c = 0; c < channels(); ++c) {
    for (int p = 0; p < nRanks_; ++p) {
      if (p == rank_) continue;
      const size_t i = link(c, p);
      if (send_[i] == nullptr || recv_[i] == nullptr)
        return MK_ERROR(Result::InvalidUsage, "rank %d: proxy: registerRegion before connectAll",
                        rank_);
      Result r = net_->regMr(send_[i], base, bytes, ptrType, &r0.sendMr[i]);
      if (r == Result::Success) r = net_->regMr(recv_[i], base, bytes, ptrType, &r0.recvMr[i]);
      if (r != Result::Success)
        return MK_ERROR(r, "%s: registering %zu bytes at %p for %s failed: %s", who(c).c_str(),
                        bytes, base, peerName(p).c_str(), lastError());
    }
  }
  return Result::Success;
}

Result Proxy::start(const std::vector<int>& cpus) {
  if (thread_.joinable())
    return MK_ERROR(Result::InvalidUsage, "rank %d: proxy already started", rank_);
  stop_.store(false);
  looping_.store(true,
                 std::memory_order_release);  // before the thread: pendingSummary waits for it
  thread_ = std::thread([this] {
    loop();
    {
      std::lock_guard<std::mutex> lock(summaryMu_);
      looping_.store(false, std::memory_order_release);
    }
    summaryCv_.notify_all();
  });
  if (!cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus)
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    int err = pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set);
    if (err != 0)
      MK_WARN("%s: proxy: pinning the proxy thread failed: %s", self_.c_str(), std::strerror(err));
  }
  MK_INFO(kLogProxy, "%s: proxy started (%d %ss, %d channel(s), %zu region(s))", self_.c_str(),
          nRanks_, peerNoun_.c_str(), channels(), regions_.size());
  return Result::Success;
}

std::vector<int> Proxy::threadCpus() {
  if (!thread_.joinable()) return {};
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(thread_.native_handle(), sizeof(set), &set) != 0) return {};
  return cpuList(set);
}

Result Proxy::stop() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  closeAll();
  return Result::Success;
}

std::string Proxy::error() const {
  std::lock_guard<std::mutex> lock(errorMu_);
  return error_;
}

void Proxy::fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(errorMu_);
    if (!error_.empty()) return;
    error_ = what;
  }
  MK_WARN("%s", what.c_str());
  failed_.store(true, std::memory_order_release);
  for (ProxyChannel& ch : channels_) __atomic_store_n(&ch.flags->failed, 1u, __ATOMIC_RELEASE);
}

std::string Proxy::queueState(int c, int peer) const {
  return std::to_string(taken_.load(std::memory_order_relaxed)) + " commands taken, " +
         std::to_string(done_.load(std::memory_order_relaxed)) + " transfers done; " +
         linkState(c, peer);
}

std::string Proxy::linkState(int c, int peer) const {
  const size_t i = link(c, peer);
  std::string out;
  for (int dir = 0; dir < 2; ++dir) {
    const std::deque<Pending>& q = dir == 0 ? sends_[i] : recvs_[i];
    out += (dir == 0 ? "sends to " : "; receives from ") + peerName(peer) + ":";
    if (q.empty()) out += " none";
    int shown = 0;
    for (const Pending& p : q) {
      if (shown++ == 4) {
        out += " ... (" + std::to_string(q.size()) + " in all)";
        break;
      }
      out += " [command " + std::to_string(p.cmd.seq - 1) + ", tag " + std::to_string(p.cmd.tag) +
             ", " + std::to_string(p.cmd.bytes) + " B, " +
             (p.request != nullptr || p.arrived ? "posted" : "not posted") + "]";
    }
  }
  return out;
}

std::string Proxy::pendingNow() const {
  std::string out = std::to_string(taken_.load(std::memory_order_relaxed)) + " commands taken, " +
                    std::to_string(done_.load(std::memory_order_relaxed)) + " transfers done";
  bool any = false;
  for (int c = 0; c < channels(); ++c)
    for (int p = 0; p < nRanks_; ++p) {
      if (p == rank_ || link(c, p) >= sends_.size()) continue;
      if (sends_[link(c, p)].empty() && recvs_[link(c, p)].empty()) continue;
      out += "; " + (channels() > 1 ? "channel " + std::to_string(c) + ": " : std::string()) +
             linkState(c, p);
      any = true;
    }
  if (!any) out += "; nothing pending";
  return out;
}

uint64_t Proxy::serveSummary() {
  const uint64_t wanted = summaryWanted_.load(std::memory_order_acquire);
  std::string s = pendingNow();
  {
    std::lock_guard<std::mutex> lock(summaryMu_);
    summary_ = std::move(s);
    summaryServed_ = wanted;
  }
  summaryCv_.notify_all();
  return wanted;
}

std::string Proxy::pendingSummary(std::chrono::milliseconds wait) {
  const uint64_t id = summaryWanted_.fetch_add(1, std::memory_order_acq_rel) + 1;
  std::unique_lock<std::mutex> lock(summaryMu_);
  if (summaryCv_.wait_for(lock, wait, [&] {
        return summaryServed_ >= id || !looping_.load(std::memory_order_acquire);
      })) {
    if (summaryServed_ >= id) return summary_;
    lock.unlock();
    // The thread has left its loop (stopped, failed, or never started): the queues are still.
    return pendingNow();
  }
  return "the proxy thread did not answer within " + std::to_string(wait.count()) + " ms";
}

bool Proxy::mhandleFor(int c, const ProxyCmd& cmd, void** mh) {
  const uintptr_t a = static_cast<uintptr_t>(cmd.addr);
  for (const Region& reg : regions_) {
    if (a >= reg.base && cmd.bytes <= reg.bytes && a - reg.base <= reg.bytes - cmd.bytes) {
      *mh = cmd.op == kOpSend ? reg.sendMr[link(c, cmd.peer)] : reg.recvMr[link(c, cmd.peer)];
      return true;
    }
  }
  return false;
}

bool Proxy::takeCommands(int ch) {
  ProxyRing* ring = channels_[static_cast<size_t>(ch)].ring;
  uint64_t tail = ring->tail;  // consumer-owned
  for (int n = 0; n < 64; ++n) {
    const ProxyCmd& slot = ring->cmd[tail & (kRingSlots - 1)];
    if (loadAcquire64(&slot.seq) != tail + 1) break;
    Pending p;
    // Field by field, not the slot as a whole: seq, the producer's atomic word, is read only
    // through the acquire load above (a plain copy read it once more without it).
    p.cmd.seq = tail + 1;
    p.cmd.op = slot.op;
    p.cmd.peer = slot.peer;
    p.cmd.addr = slot.addr;
    p.cmd.bytes = slot.bytes;
    p.cmd.tag = slot.tag;
    p.cmd.flag = slot.flag;
    const ProxyCmd& c = p.cmd;
    const std::string where = who(ch) + ": command " + std::to_string(tail) + " (";
    if (c.op != kOpSend && c.op != kOpRecv) {
      fail(where + "op " + std::to_string(c.op) + "): unknown operation");
      return false;
    }
    if (c.peer < 0 || c.peer >= nRanks_ || c.peer == rank_) {
      fail(where + opName(c.op) + "): peer " + std::to_string(c.peer) +
           " is not another rank of 0.." + std::to_string(nRanks_ - 1));
      return false;
    }
    if (c.flag >= kMaxFlags) {
      fail(where + opName(c.op) + "): completion flag " + std::to_string(c.flag) +
           " >= " + std::to_string(kMaxFlags));
      return false;
    }
    if (!mhandleFor(ch, c, &p.mhandle)) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%llu bytes at 0x%llx",
                    static_cast<unsigned long long>(c.bytes),
                    static_cast<unsigned long long>(c.addr));
      fail(where + opName(c.op) + " with " + peerName(c.peer) + "): " + buf +
           " is outside every registered region");
      return false;
    }
    (c.op == kOpSend ? sends_ : recvs_)[link(ch, c.peer)].push_back(p);
    ++tail;
    storeRelease64(&ring->tail, tail);  // the slot is free: the command was copied out
    taken_.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

bool Proxy::progressLink(int ch, int peer) {
  const size_t i = link(ch, peer);
  ProxyFlags* flags = channels_[static_cast<size_t>(ch)].flags;
  for (int dir = 0; dir < 2; ++dir) {
    std::deque<Pending>& q = dir == 0 ? sends_[i] : recvs_[i];
    // Post in ring order: the first entry the transport refuses (back-pressure) stops the rest.
    for (Pending& p : q) {
      if (p.request != nullptr) continue;
      void* data = reinterpret_cast<void*>(static_cast<uintptr_t>(p.cmd.addr));
      Result r;
      if (dir == 0) {
        r = net_->isend(send_[i], data, p.cmd.bytes, p.cmd.tag, p.mhandle, &p.request);
      } else {
        size_t size = p.cmd.bytes;
        int tag = p.cmd.tag;
        r = net_->irecv(recv_[i], 1, &data, &size, &tag, &p.mhandle, &p.request);
      }
      if (r != Result::Success) {
        fail(who(ch) + ": posting a " + opName(p.cmd.op) + " of " + std::to_string(p.cmd.bytes) +
             " bytes (tag " + std::to_string(p.cmd.tag) + ") with " + peerName(peer) +
             " failed: " + lastError());
        return false;
      }
      if (p.request == nullptr) break;
    }
    // Complete in posting order (net::Net completes a comm's requests in order).
    while (!q.empty() && q.front().request != nullptr) {
      Pending& p = q.front();
      if (!p.arrived) {
        bool done = false;
        size_t size = 0;
        Result r = net_->test(p.request, &done, &size);
        if (r != Result::Success) {
          fail(who(ch) + ": " + opName(p.cmd.op) + " of " + std::to_string(p.cmd.bytes) +
               " bytes (tag " + std::to_string(p.cmd.tag) + ") with " + peerName(peer) +
               " failed: " + lastError() + " [proxy: " + queueState(ch, peer) + "]");
          return false;
        }
        if (!done) break;
        p.arrived = true;
        if (dir == 1 && flushReceives_ && size > 0) {
          // The flush reads through the NIC after the received bytes; its completion orders them
          // before the flag below (the request is null where the transport needs no flush).
          void* data = reinterpret_cast<void*>(static_cast<uintptr_t>(p.cmd.addr));
          const int bytes =
              static_cast<int>(std::min<size_t>(size, static_cast<size_t>(INT32_MAX)));
          r = net_->iflush(recv_[i], 1, &data, &bytes, &p.mhandle, &p.flush);
          if (r != Result::Success) {
            fail(who(ch) + ": flushing a receive of " + std::to_string(size) + " bytes (tag " +
                 std::to_string(p.cmd.tag) + ") from " + peerName(peer) +
                 " failed: " + lastError());
            return false;
          }
        }
      }
      if (p.flush != nullptr) {
        bool done = false;
        size_t size = 0;
        Result r = net_->test(p.flush, &done, &size);
        if (r != Result::Success) {
          fail(who(ch) + ": the flush of a receive (tag " + std::to_string(p.cmd.tag) + ") from " +
               peerName(peer) + " failed: " + lastError());
          return false;
        }
        if (!done) break;
        p.flush = nullptr;
        flushed_.fetch_add(1, std::memory_order_relaxed);
      }
      uint64_t* counter = &flags->count[p.cmd.flag];
      storeRelease64(counter, *counter + 1);  // the proxy is the only writer
      done_.fetch_add(1, std::memory_order_relaxed);
      q.pop_front();
    }
  }
  return true;
}

void Proxy::loop() {
  uint32_t idle = 0;
  uint64_t served = 0;  // the last pendingSummary request answered
  while (!stop_.load(std::memory_order_acquire) && !failed_.load(std::memory_order_acquire)) {
    if (summaryWanted_.load(std::memory_order_acquire) != served) served = serveSummary();
    const uint64_t before =
        taken_.load(std::memory_order_relaxed) + done_.load(std::memory_order_relaxed);
    bool ok = true;
    for (int c = 0; c < channels() && ok; ++c) ok = takeCommands(c);
    for (int c = 0; c < channels() && ok; ++c)
      for (int p = 0; p < nRanks_ && ok; ++p)
        if (p != rank_) ok = progressLink(c, p);
    if (!ok) break;
    const uint64_t after =
        taken_.load(std::memory_order_relaxed) + done_.load(std::memory_order_relaxed);
    if (after != before) {
      idle = 0;
    } else if (++idle > 4096) {
      // Nothing moved for a while: stop burning the core the producer or a peer may need.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      std::this_thread::yield();
    }
  }
}

void Proxy::closeAll() {
  for (Region& reg : regions_) {
    for (size_t i = 0; i < send_.size(); ++i) {
      if (reg.sendMr[i] != nullptr && send_[i] != nullptr)
        (void)net_->deregMr(send_[i], reg.sendMr[i]);
      if (reg.recvMr[i] != nullptr && recv_[i] != nullptr)
        (void)net_->deregMr(recv_[i], reg.recvMr[i]);
    }
  }
  regions_.clear();
  for (auto& q : sends_) q.clear();
  for (auto& q : recvs_) q.clear();
  for (auto& c : send_) {
    if (c != nullptr) (void)net_->closeSend(c);
    c = nullptr;
  }
  for (auto& c : recv_) {
    if (c != nullptr) (void)net_->closeRecv(c);
    c = nullptr;
  }
  for (auto& l : listen_) {
    if (l != nullptr) (void)net_->closeListen(l);
    l = nullptr;
  }
}

}  // namespace proxy
}  // namespace mkernel
