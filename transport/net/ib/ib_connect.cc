// Connection setup of the verbs backend: the non-blocking TCP handshake (listen / connect /
// accept) and the QP state machine (RESET -> INIT -> RTR -> RTS).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "common/param.h"
#include "transport/net/ib/ib_net.h"

namespace mkernel {
namespace net {
namespace ib {
namespace {

constexpr int kQpAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// Moves `done` bytes further through a fixed-size message. *complete once all `n` are through.
Result sendSome(int fd, const void* buf, size_t n, size_t* done, bool* complete,
                const std::string& peer) {
  while (*done < n) {
    ssize_t k =
        ::send(fd, static_cast<const char*>(buf) + *done, n - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      *done += size_t(k);
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    return MK_ERROR(Result::RemoteError, "NET/IB: handshake with %s: send failed: %s", peer.c_str(),
                    strerror(errno));
  }
  *complete = *done == n;
  return Result::Success;
}

Result recvSome(int fd, void* buf, size_t n, size_t* done, bool* complete,
                const std::string& peer) {
  while (*done < n) {
    ssize_t k = ::recv(fd, static_cast<char*>(buf) + *done, n - *done, MSG_DONTWAIT);
    if (k > 0) {
      *done += size_t(k);
      continue;
    }
    if (k == 0)
      return MK_ERROR(Result::RemoteError,
                      "NET/IB: handshake with %s: the peer closed the connection", peer.c_str());
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
    return MK_ERROR(Result::RemoteError, "NET/IB: handshake with %s: recv failed: %s", peer.c_str(),
                    strerror(errno));
  }
  *complete = *done == n;
  return Result::Success;
}

Result checkInfo(const ConnInfo& info, const std::string& peer) {
  if (info.magic != kConnMagic || info.version != kConnVersion)
    return MK_ERROR(Result::RemoteError,
                    "NET/IB: handshake with %s: bad magic/version 0x%x/%u "
                    "(not an mkernel verbs peer, or another version)",
                    peer.c_str(), info.magic, info.version);
  if (info.nqps == 0 || info.nqps > uint32_t(kMaxQpsPerConn))
    return MK_ERROR(Result::RemoteError, "NET/IB: handshake with %s: %u QPs announced",
                    peer.c_str(), info.nqps);
  return Result::Success;
}

Result timedOut(const Clock::time_point& started, const char* what, const std::string& peer) {
  if (Clock::now() - started > std::chrono::seconds(params::TIMEOUT_S()))
    return MK_ERROR(Result::RemoteError,
                    "NET/IB: %s %s not complete after %lld s (MKERNEL_TIMEOUT_S)", what,
                    peer.c_str(), static_cast<long long>(params::TIMEOUT_S()));
  return Result::Success;
}

// The address peers reach us at: the IPv4 address of a RoCE GID is on the RDMA netdev itself;
// InfiniBand (or an IPv6-only GID) falls back to the interfaces the TCP backend would use.
Result listenAddress(const IbDevice& dev, SocketAddr* addr) {
  std::memset(addr, 0, sizeof(*addr));
  if (!dev.ipAddress.empty()) {
    addr->sin.sin_family = AF_INET;
    inet_pton(AF_INET, dev.ipAddress.c_str(), &addr->sin.sin_addr);
    return Result::Success;
  }
  std::vector<NetInterface> ifs;
  bool fallback = false;
  std::string why;
  MK_CHECK(findNetInterfaces(params::SOCKET_IFNAME(), &ifs, &fallback, &why));
  if (ifs.empty())
    return MK_ERROR(Result::SystemError,
                    "NET/IB: %s: no interface for the connection handshake (%s)", dev.name.c_str(),
                    why.c_str());
  *addr = ifs[0].addr;
  return Result::Success;
}

}  // namespace

// ---- QPs
// ------------------------------------------------------------------------------------------

Result createCommQps(IbComm* c, int nqps, bool postRecvs) {
  const IbvApi& api = *c->api;
  c->initPool(postRecvs ? 2 * kMaxRequests : kMaxRequests * kMaxGroupedRecvs);
  int cqDepth = nqps * (kRecvWrsPerQp + kSendWrsPerQp) + 64;
  if (c->dev->maxCqe > 0 && cqDepth > c->dev->maxCqe) cqDepth = c->dev->maxCqe;
  c->cq = api.createCq(c->dev->ctx, cqDepth, nullptr, nullptr, 0);
  if (c->cq == nullptr)
    return MK_ERROR(Result::SystemError, "NET/IB: %s: ibv_create_cq(%d) failed: %s",
                    c->dev->name.c_str(), cqDepth, strerror(errno));
  for (int i = 0; i < nqps; ++i) {
    ibv_qp_init_attr init{};
    init.send_cq = c->cq;
    init.recv_cq = c->cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = uint32_t(kSendWrsPerQp);
    init.cap.max_recv_wr = uint32_t(kRecvWrsPerQp);
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = kWantInline;
    ibv_qp* qp = api.createQp(c->dev->pd, &init);
    if (qp == nullptr) {  // some devices refuse inline data of that size: try without
      init.cap.max_inline_data = 0;
      qp = api.createQp(c->dev->pd, &init);
    }
    if (qp == nullptr)
      return MK_ERROR(Result::SystemError, "NET/IB: %s: ibv_create_qp(RC) failed: %s",
                      c->dev->name.c_str(), strerror(errno));
    c->qps.push_back(qp);
    c->maxInline =
        i == 0 ? init.cap.max_inline_data : std::min(c->maxInline, init.cap.max_inline_data);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = uint8_t(c->dev->port);
    attr.qp_access_flags = kQpAccess;
    if (int rc = api.modifyQp(qp, &attr,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return MK_ERROR(Result::SystemError, "NET/IB: %s: QP %u to INIT failed: %s",
                      c->dev->name.c_str(), qp->qp_num, strerror(rc));
    if (!postRecvs) continue;
    // WRITE_WITH_IMM consumes a receive WR: keep one posted for every chunk that may be in flight.
    ibv_recv_wr wrs[32];
    for (int posted = 0; posted < kRecvWrsPerQp;) {
      int batch = std::min(32, kRecvWrsPerQp - posted);
      for (int k = 0; k < batch; ++k) {
        wrs[k] = ibv_recv_wr{};
        wrs[k].wr_id = uint64_t(i);
        wrs[k].next = k + 1 < batch ? &wrs[k + 1] : nullptr;
      }
      ibv_recv_wr* bad = nullptr;
      if (int rc = ibv_post_recv(qp, wrs, &bad))
        return MK_ERROR(Result::SystemError, "NET/IB: %s: ibv_post_recv failed: %s",
                        c->dev->name.c_str(), strerror(rc));
      posted += batch;
    }
  }
  return Result::Success;
}

void fillLocalInfo(const IbComm& c, ConnInfo* info) {
  info->magic = kConnMagic;
  info->version = kConnVersion;
  info->nqps = uint32_t(c.qps.size());
  for (size_t i = 0; i < c.qps.size(); ++i) info->qpn[i] = c.qps[i]->qp_num;
  std::memcpy(info->gid, c.dev->gid.raw, 16);
  info->lid = c.dev->lid;
  info->linkLayer = c.dev->linkLayer;
  info->mtu = uint8_t(c.dev->mtu);
  info->gidIndex = c.dev->gidIndex;
}

// RTR + RTS of QP i against the peer's QP i.
static Result connectQp(IbComm* c, ibv_qp* qp, uint32_t remoteQpn, const ConnInfo& remote) {
  const IbvApi& api = *c->api;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = std::min(c->dev->mtu, ibv_mtu(remote.mtu));
  attr.dest_qp_num = remoteQpn;
  attr.rq_psn = 0;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  if (c->dev->linkLayer == IBV_LINK_LAYER_ETHERNET || remote.lid == 0) {
    // RoCE (and global IB routes): GRH addressing with the peer's GID.
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
    attr.ah_attr.grh.sgid_index = uint8_t(c->dev->gidIndex);
    attr.ah_attr.grh.hop_limit = 255;
    attr.ah_attr.grh.traffic_class = 0;
  } else {
    // InfiniBand within a subnet: LID routing.
    attr.ah_attr.is_global = 0;
    attr.ah_attr.dlid = remote.lid;
  }
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = uint8_t(c->dev->port);
  if (int rc = api.modifyQp(qp, &attr,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return MK_ERROR(Result::SystemError, "NET/IB: %s: QP %u to RTR (peer QP %u) failed: %s",
                    c->dev->name.c_str(), qp->qp_num, remoteQpn, strerror(rc));
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = static_cast<uint8_t>(params::IB_TIMEOUT());
  attr.retry_cnt = static_cast<uint8_t>(params::IB_RETRY_CNT());
  attr.rnr_retry = 7;
  attr.sq_psn = 0;
  attr.max_rd_atomic = 1;
  if (int rc = api.modifyQp(qp, &attr,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    return MK_ERROR(Result::SystemError, "NET/IB: %s: QP %u to RTS failed: %s",
                    c->dev->name.c_str(), qp->qp_num, strerror(rc));
  return Result::Success;
}

Result connectCommQps(IbComm* c, const ConnInfo& remote) {
  if (remote.nqps != c->qps.size())
    return MK_ERROR(Result::RemoteError, "NET/IB: %s: peer %s has %u QPs, we have %zu",
                    c->dev->name.c_str(), c->peer.c_str(), remote.nqps, c->qps.size());
  for (size_t i = 0; i < c->qps.size(); ++i)
    MK_CHECK(connectQp(c, c->qps[i], remote.qpn[i], remote));
  return Result::Success;
}

Result IbNet::setupFlush(IbRecvComm* c) {
  const IbvApi& api = *api_;
  ibv_qp_init_attr init{};
  init.send_cq = c->cq;
  init.recv_cq = c->cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = uint32_t(kMaxRequests);
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  c->flushQp = api.createQp(c->dev->pd, &init);
  if (c->flushQp == nullptr)
    return MK_ERROR(Result::SystemError, "NET/IB: %s: flush QP: ibv_create_qp failed: %s",
                    c->dev->name.c_str(), strerror(errno));
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = uint8_t(c->dev->port);
  attr.qp_access_flags = kQpAccess;
  if (int rc = api.modifyQp(c->flushQp, &attr,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return MK_ERROR(Result::SystemError, "NET/IB: flush QP to INIT failed: %s", strerror(rc));
  ConnInfo self{};
  fillLocalInfo(*c, &self);
  MK_CHECK(connectQp(c, c->flushQp, c->flushQp->qp_num, self));
  c->flushScratch = static_cast<uint64_t*>(std::calloc(1, 64));
  c->flushMr = api.regMr(c->dev->pd, c->flushScratch, 64, kQpAccess);
  if (c->flushMr == nullptr)
    return MK_ERROR(Result::SystemError, "NET/IB: flush buffer registration failed: %s",
                    strerror(errno));
  return Result::Success;
}

// ---- listen / connect / accept ------------------------------------------------------------------

Result IbNet::listen(int devIndex, void* handle, ListenComm** listenComm) {
  *listenComm = nullptr;
  if (devIndex < 0 || devIndex >= int(devs_.size()))
    return MK_ERROR(Result::InvalidArgument, "NET/IB: listen on device %d of %zu", devIndex,
                    devs_.size());
  IbDevice* dev = devs_[devIndex];
  SocketAddr addr;
  MK_CHECK(listenAddress(*dev, &addr));
  int fd = ::socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return MK_ERROR(Result::SystemError, "NET/IB: socket() failed: %s", strerror(errno));
  if (::bind(fd, &addr.sa, socketAddrLen(addr)) != 0 || ::listen(fd, 64) != 0) {
    int err = errno;
    ::close(fd);
    return MK_ERROR(Result::SystemError, "NET/IB: %s: cannot listen on %s: %s", dev->name.c_str(),
                    socketAddrToString(addr).c_str(), strerror(err));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, &addr.sa, &len);
  static_assert(sizeof(ListenHandle) <= kHandleSize, "the handle must fit NCCL's 128 bytes");
  std::memset(handle, 0, kHandleSize);
  ListenHandle h{};
  h.magic = kConnMagic;
  h.addr = addr;
  std::memcpy(handle, &h, sizeof(h));
  auto* l = new IbListenComm();
  l->dev = dev;
  l->fd = fd;
  *listenComm = l;
  MK_INFO(kLogNet, "NET/IB: %s listening on %s", dev->name.c_str(),
          socketAddrToString(addr).c_str());
  return Result::Success;
}

Result IbNet::connect(int devIndex, const void* handle, SendComm** sendComm) {
  *sendComm = nullptr;
  if (handle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: connect with a null handle");
  if (devIndex < 0 || devIndex >= int(devs_.size()))
    return MK_ERROR(Result::InvalidArgument, "NET/IB: connect on device %d of %zu", devIndex,
                    devs_.size());
  ListenHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kConnMagic)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/IB: connect: the handle is not an mkernel verbs handle "
                    "(magic 0x%x)",
                    h.magic);
  // The state between calls is keyed by the handle's address (NCCL passes the same buffer until it
  // gets a comm); a different handle at that address starts over.
  std::lock_guard<std::mutex> lock(connectMu_);
  auto it = pendingConnects_.find(handle);
  if (it != pendingConnects_.end() && std::memcmp(&it->second->handle, &h, sizeof(h)) != 0) {
    delete it->second;
    pendingConnects_.erase(it);
    it = pendingConnects_.end();
  }
  if (it == pendingConnects_.end()) {
    auto* c = new IbSendComm();
    c->dev = devs_[devIndex];
    c->api = api_;
    c->handle = h;
    c->peer = socketAddrToString(h.addr);
    c->started = Clock::now();
    c->fd = ::socket(h.addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
      delete c;
      return MK_ERROR(Result::SystemError, "NET/IB: socket() failed: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(c->fd, &h.addr.sa, socketAddrLen(h.addr)) != 0 && errno != EINPROGRESS) {
      int err = errno;
      std::string peer = c->peer;
      delete c;
      return MK_ERROR(Result::RemoteError, "NET/IB: connect to %s failed: %s", peer.c_str(),
                      strerror(err));
    }
    it = pendingConnects_.emplace(handle, c).first;
  }
  IbSendComm* c = it->second;
  Result r = progressConnect(c);
  if (r != Result::Success || c->state == kConnDone) pendingConnects_.erase(it);
  if (r != Result::Success) {
    delete c;
    return r;
  }
  if (c->state == kConnDone) {
    *sendComm = c;
    MK_INFO(kLogNet, "NET/IB: %s connected to %s: %zu QP(s), inline %u B, MTU %d",
            c->dev->name.c_str(), c->peer.c_str(), c->qps.size(), c->maxInline,
            128 << int(std::min(c->dev->mtu, ibv_mtu(c->remote.mtu))));
  }
  return Result::Success;
}

// Sender side: TCP connect -> create QPs, FIFO -> send our info -> receive the receiver's info
// -> RTR/RTS -> send one "ready" byte (the receiver then knows our QPs accept its CTS writes).
Result IbNet::progressConnect(IbSendComm* c) {
  if (c->state == kConnTcp) {
    pollfd p{c->fd, POLLOUT, 0};
    int n = ::poll(&p, 1, 0);
    if (n == 0) return timedOut(c->started, "connect to", c->peer);
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (n < 0 || err != 0)
      return MK_ERROR(Result::RemoteError, "NET/IB: connect to %s failed: %s", c->peer.c_str(),
                      strerror(n < 0 ? errno : err));
    int nqps = static_cast<int>(params::IB_QPS_PER_CONN());
    nqps = std::max(1, std::min(nqps, kMaxQpsPerConn));
    MK_CHECK(createCommQps(c, nqps, false));
    size_t fifoBytes = sizeof(CtsSlot) * kMaxRequests;
    c->fifo = static_cast<CtsSlot*>(std::aligned_alloc(4096, fifoBytes));
    c->sizeStaging = static_cast<uint64_t*>(std::aligned_alloc(4096, 4096));
    if (c->fifo == nullptr || c->sizeStaging == nullptr)
      return MK_ERROR(Result::SystemError, "NET/IB: out of host memory for the CTS FIFO");
    std::memset(c->fifo, 0, fifoBytes);
    std::memset(c->sizeStaging, 0, 4096);
    c->fifoMr = api_->regMr(c->dev->pd, c->fifo, fifoBytes, kQpAccess);
    c->sizeStagingMr = api_->regMr(c->dev->pd, c->sizeStaging, 4096, kQpAccess);
    if (c->fifoMr == nullptr || c->sizeStagingMr == nullptr)
      return MK_ERROR(Result::SystemError, "NET/IB: %s: registering the CTS FIFO failed: %s",
                      c->dev->name.c_str(), strerror(errno));
    fillLocalInfo(*c, &c->local);
    c->local.fifoAddr = reinterpret_cast<uintptr_t>(c->fifo);
    c->local.fifoRkey = c->fifoMr->rkey;
    c->ioDone = 0;
    c->state = kConnSendInfo;
  }
  bool complete = false;
  if (c->state == kConnSendInfo) {
    MK_CHECK(sendSome(c->fd, &c->local, sizeof(c->local), &c->ioDone, &complete, c->peer));
    if (!complete) return timedOut(c->started, "connect to", c->peer);
    c->ioDone = 0;
    c->state = kConnRecvInfo;
  }
  if (c->state == kConnRecvInfo) {
    MK_CHECK(recvSome(c->fd, &c->remote, sizeof(c->remote), &c->ioDone, &complete, c->peer));
    if (!complete) return timedOut(c->started, "connect to", c->peer);
    MK_CHECK(checkInfo(c->remote, c->peer));
    MK_CHECK(connectCommQps(c, c->remote));
    c->remSizesAddr = c->remote.sizesAddr;
    c->remSizesRkey = c->remote.sizesRkey;
    c->ioDone = 0;
    c->state = kConnReady;
  }
  if (c->state == kConnReady) {
    static const char kReady = 'R';
    MK_CHECK(sendSome(c->fd, &kReady, 1, &c->ioDone, &complete, c->peer));
    if (!complete) return timedOut(c->started, "connect to", c->peer);
    c->state = kConnDone;
    c->lastPeerCheck = Clock::now();
  }
  return Result::Success;
}

Result IbNet::accept(ListenComm* listenComm, RecvComm** recvComm) {
  *recvComm = nullptr;
  auto* l = dynamic_cast<IbListenComm*>(listenComm);
  if (l == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: accept on a listen comm that is not ours");
  if (l->pending == nullptr) {
    SocketAddr from;
    socklen_t len = sizeof(from);
    int fd = ::accept4(l->fd, &from.sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Result::Success;
      return MK_ERROR(Result::SystemError, "NET/IB: accept failed: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto* c = new IbRecvComm();
    c->dev = l->dev;
    c->api = api_;
    c->fd = fd;
    c->peer = socketAddrToString(from);
    c->started = Clock::now();
    c->state = kConnRecvInfo;
    l->pending = c;
  }
  IbRecvComm* c = l->pending;
  Result r = progressAccept(c);
  if (r != Result::Success || c->state == kConnDone) l->pending = nullptr;
  if (r != Result::Success) {
    delete c;
    return r;
  }
  if (c->state == kConnDone) {
    *recvComm = c;
    MK_INFO(kLogNet, "NET/IB: %s accepted %s: %zu QP(s)", c->dev->name.c_str(), c->peer.c_str(),
            c->qps.size());
  }
  return Result::Success;
}

// Receiver side: receive the sender's info -> create QPs (with receive WRs posted), size array,
// CTS staging -> RTR/RTS -> send our info -> wait for the sender's "ready" byte.
Result IbNet::progressAccept(IbRecvComm* c) {
  bool complete = false;
  if (c->state == kConnRecvInfo) {
    MK_CHECK(recvSome(c->fd, &c->remote, sizeof(c->remote), &c->ioDone, &complete, c->peer));
    if (!complete) return timedOut(c->started, "accept from", c->peer);
    MK_CHECK(checkInfo(c->remote, c->peer));
    MK_CHECK(createCommQps(c, int(c->remote.nqps), true));
    MK_CHECK(connectCommQps(c, c->remote));
    c->remFifoAddr = c->remote.fifoAddr;
    c->remFifoRkey = c->remote.fifoRkey;
    size_t sizesBytes = sizeof(uint64_t) * kMaxRequests * kMaxGroupedRecvs;
    size_t ctsBytes = sizeof(CtsSlot) * kMaxRequests;
    c->sizes = static_cast<uint64_t*>(std::aligned_alloc(4096, 4096));
    c->ctsStaging =
        static_cast<CtsSlot*>(std::aligned_alloc(4096, (ctsBytes + 4095) & ~size_t(4095)));
    if (c->sizes == nullptr || c->ctsStaging == nullptr)
      return MK_ERROR(Result::SystemError, "NET/IB: out of host memory for the size array");
    std::memset(c->sizes, 0, sizesBytes);
    std::memset(c->ctsStaging, 0, ctsBytes);
    c->sizesMr = api_->regMr(c->dev->pd, c->sizes, sizesBytes, kQpAccess);
    c->ctsStagingMr = api_->regMr(c->dev->pd, c->ctsStaging, ctsBytes, kQpAccess);
    if (c->sizesMr == nullptr || c->ctsStagingMr == nullptr)
      return MK_ERROR(Result::SystemError, "NET/IB: %s: registering the size array failed: %s",
                      c->dev->name.c_str(), strerror(errno));
    fillLocalInfo(*c, &c->local);
    c->local.sizesAddr = reinterpret_cast<uintptr_t>(c->sizes);
    c->local.sizesRkey = c->sizesMr->rkey;
    c->ioDone = 0;
    c->state = kConnSendInfo;
  }
  if (c->state == kConnSendInfo) {
    MK_CHECK(sendSome(c->fd, &c->local, sizeof(c->local), &c->ioDone, &complete, c->peer));
    if (!complete) return timedOut(c->started, "accept from", c->peer);
    c->ioDone = 0;
    c->state = kConnReady;
  }
  if (c->state == kConnReady) {
    char ready = 0;
    MK_CHECK(recvSome(c->fd, &ready, 1, &c->ioDone, &complete, c->peer));
    if (!complete) return timedOut(c->started, "accept from", c->peer);
    if (ready != 'R')
      return MK_ERROR(Result::RemoteError, "NET/IB: accept from %s: bad ready byte 0x%x",
                      c->peer.c_str(), ready);
    c->state = kConnDone;
    c->lastPeerCheck = Clock::now();
  }
  return Result::Success;
}

}  // namespace ib
}  // namespace net
}  // namespace mkernel
