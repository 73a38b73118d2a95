// TcpNet: devices, posting and testing requests, closing, and createTcpNet().
#include "transport/net/tcp/tcp_net.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/param.h"

namespace mkernel {
namespace net {
namespace tcp {

namespace {

TcpComm* coreOf(Comm* comm) {
  if (auto* s = dynamic_cast<TcpSendComm*>(comm)) return s->core;
  if (auto* r = dynamic_cast<TcpRecvComm*>(comm)) return r->core;
  return nullptr;
}

template <typename T>
bool eraseLive(std::vector<T*>* v, T* item) {
  auto it = std::find(v->begin(), v->end(), item);
  if (it == v->end()) return false;
  v->erase(it);
  return true;
}

}  // namespace

TcpNet::TcpNet(std::vector<NetInterface> ifs, int nThreads) : ifs_(std::move(ifs)) {
  for (int i = 0; i < nThreads; ++i) engines_.push_back(std::make_unique<Engine>());
}

TcpNet::~TcpNet() {
  // Comms the application did not close die with the Net, before the engines stop.
  for (TcpSendComm* c : liveSend_) {
    delete c->core;
    delete c;
  }
  for (TcpRecvComm* c : liveRecv_) {
    delete c->core;
    delete c;
  }
  for (TcpListenComm* c : liveListen_) delete c;
  for (auto& pc : pendingConnects_)
    for (auto& s : pc.second.socks)
      if (s.fd >= 0) close(s.fd);
  engines_.clear();  // joins the threads
}

Result TcpNet::getProperties(int dev, DeviceProps* props) const {
  if (dev < 0 || dev >= deviceCount())
    return MK_ERROR(Result::InvalidArgument, "TCP net: device %d does not exist (%d devices)", dev,
                    deviceCount());
  const NetInterface& itf = ifs_[static_cast<size_t>(dev)];
  *props = DeviceProps{};
  props->name = itf.name;
  props->pciPath = itf.pciPath;
  props->guid = static_cast<uint64_t>(dev);
  props->ptrSupport = kPtrHost;
  props->regIsGlobal = false;
  props->forceFlush = false;
  props->speedMbps = itf.speedMbps;
  props->port = 0;
  props->latencyUs = 0.0f;
  props->maxComms = 65536;
  props->maxRecvs = kMaxGroupedRecvs;
  props->maxP2pBytes = size_t(1) << 31;  // NCCL's socket transport limit; sizes travel as 64 bits
  props->maxCollBytes = size_t(1) << 31;
  return Result::Success;
}

Result TcpNet::pickEngine(Engine** engine) {
  std::lock_guard<std::mutex> lock(mu_);
  Engine* e = engines_[nextEngine_++ % engines_.size()].get();
  MK_CHECK(e->start());
  *engine = e;
  return Result::Success;
}

Result TcpNet::attachComm(TcpComm* core) {
  core->chunkBytes = static_cast<size_t>(params::NET_CHUNK_BYTES());
  core->timeoutS = params::timeoutSeconds();
  core->inlineProgress = params::NET_INLINE_PROGRESS();
  for (auto& s : core->socks) {
    if (!setNonBlocking(s.fd))
      return MK_ERROR(Result::SystemError, "TCP net: cannot make a socket non-blocking: %s",
                      strerror(errno));
    setNoDelay(s.fd);
  }
  MK_CHECK(pickEngine(&core->engine));
  for (size_t i = 0; i < core->socks.size(); ++i)
    MK_CHECK(
        core->engine->add(core->socks[i].fd, core, static_cast<int>(i), &core->socks[i].token));
  return Result::Success;
}

Result TcpNet::regMr(Comm* comm, void* data, size_t size, int type, void** mhandle) {
  if (type != kPtrHost)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: only host memory can be registered (type %d)", type);
  // Nothing to pin: the kernel copies from the user's pages. A non-null handle keeps callers that
  // test for null happy.
  *mhandle = coreOf(comm);
  return Result::Success;
}

Result TcpNet::regMrDmaBuf(Comm*, void*, size_t, int, uint64_t, int, void** mhandle) {
  *mhandle = nullptr;
  return MK_ERROR(Result::InvalidArgument,
                  "TCP net: DMA-BUF registration is not supported (host memory only)");
}

Result TcpNet::deregMr(Comm*, void*) {
  return Result::Success;
}

Result TcpNet::isend(SendComm* comm, void* data, size_t size, int tag, void*, Request** request) {
  *request = nullptr;
  auto* sc = dynamic_cast<TcpSendComm*>(comm);
  if (sc == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: isend on a comm that is not a TCP send comm");
  if (data == nullptr && size > 0)
    return MK_ERROR(Result::InvalidArgument, "TCP net: isend of %zu bytes from null", size);
  TcpComm* c = sc->core;
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->failure != Result::Success)
    return MK_ERROR(c->failure, "TCP net: %s", c->failureMsg.c_str());
  TcpRequest* req = c->allocRequestLocked();
  if (req == nullptr) return Result::Success;  // back-pressure
  req->header = MsgHeader{kMsgMagic, tag, size};
  req->bytesLeft = sizeof(MsgHeader) + size;
  c->socks[0].queue.push_back(
      Segment{reinterpret_cast<char*>(&req->header), sizeof(MsgHeader), req});
  c->queueSegmentsLocked(static_cast<char*>(data), size, req);
  c->progressLocked();  // small messages leave right here, without a thread hop
  *request = req;
  return Result::Success;
}

Result TcpNet::irecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
                     void**, Request** request) {
  *request = nullptr;
  auto* rc = dynamic_cast<TcpRecvComm*>(comm);
  if (rc == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: irecv on a comm that is not a TCP recv comm");
  if (n < 1 || n > kMaxGroupedRecvs)
    return MK_ERROR(Result::InvalidArgument, "TCP net: grouped receive of %d buffers (1..%d)", n,
                    kMaxGroupedRecvs);
  for (int i = 0; i < n; ++i)
    if (data[i] == nullptr && sizes[i] > 0)
      return MK_ERROR(Result::InvalidArgument, "TCP net: irecv buffer %d of %zu bytes is null", i,
                      sizes[i]);
  TcpComm* c = rc->core;
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->failure != Result::Success)
    return MK_ERROR(c->failure, "TCP net: %s", c->failureMsg.c_str());
  TcpRequest* req = c->allocRequestLocked();
  if (req == nullptr) return Result::Success;  // back-pressure
  req->n = n;
  for (int i = 0; i < n; ++i)
    req->slots[i] = TcpRequest::Slot{static_cast<char*>(data[i]), sizes[i], tags[i], false, 0};
  c->progressLocked();  // a header waiting for this receive is matched now
  *request = req;
  return Result::Success;
}

Result TcpNet::iflush(RecvComm*, int, void**, const int*, void**, Request** request) {
  *request = nullptr;  // host memory: the CPU already sees what recv() wrote
  return Result::Success;
}

Result TcpNet::test(Request* request, bool* done, size_t* sizes) {
  *done = false;
  auto* req = static_cast<TcpRequest*>(request);
  if (req == nullptr || req->live != TcpRequest::kLiveMagic)
    return MK_ERROR(Result::InvalidUsage,
                    "TCP net: test on a request that is null, completed or closed");
  TcpComm* c = req->comm;
  std::unique_lock<std::mutex> lock(c->mu, std::defer_lock);
  if (req->seq < c->orderedDone.load(std::memory_order_acquire)) {
    lock.lock();  // done for sure: only the bookkeeping below needs the comm
  } else {
    // While the engine thread holds the comm it is moving this comm's bytes: answer "not yet"
    // instead of sleeping on the mutex (a futex wake-up costs more than the caller's next poll).
    if (!lock.try_lock()) return Result::Success;
    if (!req->complete && c->inlineProgress && c->failure == Result::Success) {
      // Look at the sockets ourselves instead of waiting for the engine thread to wake up: this
      // is what makes small round trips fast.
      for (size_t i = 0; i < c->socks.size(); ++i) {
        DataSocket& s = c->socks[i];
        if (c->isSender) {
          if (!s.queue.empty()) s.writable = true;
        } else if (!s.queue.empty() || (i == 0 && !c->headerReady)) {
          s.readable = true;
        }
      }
      c->progressLocked();
    }
  }
  if (req->seq < c->orderedDone.load(std::memory_order_relaxed)) {
    if (sizes != nullptr) {
      if (req->isSend) {
        sizes[0] = req->header.size;
      } else {
        for (int i = 0; i < req->n; ++i) sizes[i] = req->slots[i].received;
      }
    }
    c->freeRequestLocked(req);
    *done = true;
    return Result::Success;
  }
  c->checkClosedAheadLocked();  // also without inline progress: its grace ends without an event
  if (c->failure != Result::Success)
    return MK_ERROR(c->failure, "TCP net: %s", c->failureMsg.c_str());
  double idle = std::chrono::duration<double>(Clock::now() - c->lastActivity).count();
  if (idle > c->timeoutS) {
    std::string what = req->isSend ? "send of " + std::to_string(req->header.size) +
                                         " bytes (tag " + std::to_string(req->header.tag) + ")"
                                   : "receive of " + std::to_string(req->n) + " message(s)";
    c->fail(Result::RemoteError,
            "no byte moved to or from peer " + c->peer + " for " +
                std::to_string(static_cast<int>(idle)) + " s while waiting for a " + what +
                " (MKERNEL_TIMEOUT_S=" + std::to_string(static_cast<int>(c->timeoutS)) + "); " +
                c->describeLocked());
    return MK_ERROR(c->failure, "TCP net: %s", c->failureMsg.c_str());
  }
  return Result::Success;
}

Result TcpNet::closeSend(SendComm* comm) {
  auto* sc = dynamic_cast<TcpSendComm*>(comm);
  if (sc == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: closeSend on a comm that is not a TCP send comm");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!eraseLive(&liveSend_, sc))
      return MK_ERROR(Result::InvalidArgument, "TCP net: closeSend on an unknown or closed comm");
  }
  delete sc->core;
  delete sc;
  return Result::Success;
}

Result TcpNet::closeRecv(RecvComm* comm) {
  auto* rc = dynamic_cast<TcpRecvComm*>(comm);
  if (rc == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: closeRecv on a comm that is not a TCP recv comm");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!eraseLive(&liveRecv_, rc))
      return MK_ERROR(Result::InvalidArgument, "TCP net: closeRecv on an unknown or closed comm");
  }
  delete rc->core;
  delete rc;
  return Result::Success;
}

Result TcpNet::closeListen(ListenComm* comm) {
  auto* lc = dynamic_cast<TcpListenComm*>(comm);
  if (lc == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "TCP net: closeListen on a comm that is not a TCP listen comm");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!eraseLive(&liveListen_, lc))
      return MK_ERROR(Result::InvalidArgument, "TCP net: closeListen on an unknown or closed comm");
  }
  delete lc;
  return Result::Success;
}

}  // namespace tcp

std::unique_ptr<Net> createTcpNet(std::string* why) {
  std::vector<NetInterface> ifs;
  bool fallback = false;
  std::string reason;
  const std::string& spec = params::SOCKET_IFNAME();
  if (findNetInterfaces(spec, &ifs, &fallback, &reason) != Result::Success || ifs.empty()) {
    if (why != nullptr) *why = "TCP net: " + reason;
    return nullptr;
  }
  if (fallback)
    MK_INFO(
        kLogNet | kLogInit,
        "TCP net: no interface other than loopback; using %s (set MKERNEL_SOCKET_IFNAME to choose)",
        ifs[0].name.c_str());
  for (size_t i = 0; i < ifs.size(); ++i)
    MK_INFO(kLogNet | kLogInit, "TCP net: device %zu = %s %s, %d Mbps%s%s", i, ifs[i].name.c_str(),
            socketAddrToString(ifs[i].addr).c_str(), ifs[i].speedMbps,
            ifs[i].pciPath.empty() ? "" : ", ", ifs[i].pciPath.c_str());
  int threads =
      static_cast<int>(std::min<int64_t>(std::max<int64_t>(params::NET_THREADS(), 1), 64));
  return std::make_unique<tcp::TcpNet>(std::move(ifs), threads);
}

}  // namespace net
}  // namespace mkernel
