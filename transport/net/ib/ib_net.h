// net::Net over RDMA verbs (rdma-core): the verbs backend (docs/TRANSPORT.md). docs/VERBS.md
// describes the protocol; in short:
//   - a connection is N reliable-connected QPs (MKERNEL_IB_QPS_PER_CONN) sharing one CQ, set up by
//     a non-blocking TCP handshake that carries QP numbers, GID/LID and MTU;
//   - clear-to-send: irecv RDMA-writes its buffers' address/rkey/size/tag into the sender's CTS
//     FIFO (kMaxRequests slots of up to kMaxGroupedRecvs entries), so a sender writes only into
//     posted receive buffers and never needs a receive-side copy;
//   - isend RDMA-writes the byte count into the receiver's size array, then the data split into
//     chunks over the QPs, each chunk a WRITE_WITH_IMM whose immediate names (slot, entry, chunk
//     count, sequence): the receive completes when every chunk's immediate has arrived, and the
//     completion orders the data before anything the receiver does next;
//   - small messages go inline; CQs are polled in bounded batches; every failure (a work
//     completion error, a peer whose control socket closed, a request older than
//     MKERNEL_TIMEOUT_S) is an error with the verbs status text, never a hang.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/net/ib/ib_device.h"
#include "vendor/ibverbs.h"
#include "transport/net/net.h"
#include "transport/net/socket_iface.h"

namespace mkernel {
namespace net {
namespace ib {

constexpr int kMaxQpsPerConn = 16;
constexpr size_t kMinChunkBytes = 16 << 10;  // below this a message travels on one QP
constexpr int kRecvWrsPerQp = kMaxRequests * kMaxGroupedRecvs;
constexpr int kSendWrsPerQp = 2 * kMaxRequests * kMaxGroupedRecvs + 16;
constexpr uint32_t kWantInline = 256;
constexpr uint32_t kConnMagic = 0x4d4b4942;  // "MKIB"
constexpr uint32_t kConnVersion = 2;         // 2: CtsEntry::seqTail

// One posted receive buffer as the receiver writes it into the sender's CTS FIFO.
struct CtsEntry {
  uint64_t addr;
  uint64_t size;
  uint64_t seq;  // the receive's sequence number (from 1): tells a fresh entry from a stale one
  uint32_t rkey;
  int32_t tag;
  uint32_t nreqs;    // entries in this grouped receive
  uint32_t seqTail;  // low 32 bits of seq again, the entry's last bytes: the reader trusts an entry
                     // only when both copies match (version 2; the fields between the two copies
                     // arrive in the same RDMA write and can land late, as on Soft-RoCE)
};
static_assert(sizeof(CtsEntry) == 40, "CtsEntry is part of the wire protocol");
struct CtsSlot {
  CtsEntry e[kMaxGroupedRecvs];
};

// What each side sends in the handshake (both directions use the same layout).
struct ConnInfo {
  uint32_t magic;
  uint32_t version;
  uint32_t nqps;
  uint32_t qpn[kMaxQpsPerConn];
  uint8_t gid[16];
  uint16_t lid;
  uint8_t linkLayer;
  uint8_t mtu;         // ibv_mtu
  int32_t gidIndex;    // informational (logs)
  uint64_t fifoAddr;   // sender -> receiver: the CTS FIFO
  uint64_t sizesAddr;  // receiver -> sender: the size array
  uint32_t fifoRkey;
  uint32_t sizesRkey;
};

// The handle NCCL passes from listen() to connect().
struct ListenHandle {
  uint32_t magic;
  uint32_t reserved;
  SocketAddr addr;
};

using Clock = std::chrono::steady_clock;

// Handshake states of a comm being connected or accepted.
enum ConnState : int { kConnTcp, kConnSendInfo, kConnRecvInfo, kConnReady, kConnDone };

struct IbComm;

struct IbRequest : Request {
  enum Kind { kFree, kSend, kRecv, kFlush } kind = kFree;
  IbComm* comm = nullptr;
  int pending = 0;  // send/flush: signaled work requests not yet completed
  size_t size = 0;
  int n = 0;  // recv: entries of the grouped receive
  int slot = 0;
  uint64_t seq = 0;
  int chunksExpected[kMaxGroupedRecvs] = {};
  int chunksArrived[kMaxGroupedRecvs] = {};
  size_t postedSize[kMaxGroupedRecvs] = {};  // recv: what the receiver posted, to name truncations
  int tag[kMaxGroupedRecvs] = {};
  // Registrations made for this request because the caller passed no memory handle (mkernel's
  // own proxy and tests may do that; NCCL always registers). Released when the request is.
  MrEntry* implicitMr[kMaxGroupedRecvs] = {};
  Clock::time_point posted;
};

// State shared by send and receive comms: the QPs, their CQ, the control socket.
struct IbComm {
  IbDevice* dev = nullptr;
  const IbvApi* api = nullptr;
  int fd = -1;  // TCP control socket: the handshake, then liveness of the peer
  std::string peer;
  ibv_cq* cq = nullptr;
  std::vector<ibv_qp*> qps;
  uint32_t maxInline = 0;
  Result failure = Result::Success;
  std::string failureText;
  std::vector<std::unique_ptr<IbRequest>> pool;
  std::vector<IbRequest*> freeList;
  Clock::time_point lastPeerCheck;
  Clock::time_point peerClosedAt{};
  bool peerClosed = false;

  // Requests handed out and not yet reported done, per kind, in posting order: test() reports a
  // request done only once every earlier one of its kind on this comm is complete too (net.h:
  // requests of one comm complete in posting order), even when its own work finished first.
  std::deque<IbRequest*> outstanding[4];

  IbRequest* allocRequest(IbRequest::Kind kind);
  void freeRequest(IbRequest* r);
  // Gives r its place in the comm's posting order; called when r is handed to the caller.
  void issue(IbRequest* r) { outstanding[r->kind].push_back(r); }
  void initPool(int n);
  // The caller's handle, else a registration made for this request only.
  Result memoryFor(IbRequest* r, int i, void* data, size_t size, void* mhandle, MrEntry** mr);
  Result fail(Result r, const std::string& text);
  // Drains the CQ (bounded batches); records a failure on an error completion.
  Result progress();
  virtual void onCompletion(const ibv_wc& wc) = 0;
  // Error if the peer's control socket closed more than a grace period ago, or `r` is older than
  // MKERNEL_TIMEOUT_S.
  Result checkLiveness(const IbRequest* r, const char* what);
  void destroyVerbs();
  virtual ~IbComm();
};

struct IbSendComm : SendComm, IbComm {
  CtsSlot* fifo = nullptr;  // written by the receiver
  ibv_mr* fifoMr = nullptr;
  uint64_t* sizeStaging = nullptr;  // source of the size writes when they cannot go inline
  ibv_mr* sizeStagingMr = nullptr;
  uint64_t remSizesAddr = 0;
  uint32_t remSizesRkey = 0;
  uint64_t sendSeq = 1;                  // the oldest receive not yet fully matched by sends
  uint32_t slotUsed[kMaxRequests] = {};  // per FIFO slot: entries already matched by a send
  bool slotFull[kMaxRequests] = {};
  void markUsed(int slot, int entry, int nreqs);
  int nextQp = 0;
  // Handshake.
  ListenHandle handle{};
  int state = kConnTcp;
  ConnInfo local{}, remote{};
  size_t ioDone = 0;
  Clock::time_point started;
  void onCompletion(const ibv_wc& wc) override;
  ~IbSendComm() override;
};

struct IbRecvComm : RecvComm, IbComm {
  uint64_t* sizes = nullptr;  // [slot][entry] byte counts, written by the sender
  ibv_mr* sizesMr = nullptr;
  CtsSlot* ctsStaging = nullptr;  // source of the CTS writes when they cannot go inline
  ibv_mr* ctsStagingMr = nullptr;
  uint64_t remFifoAddr = 0;
  uint32_t remFifoRkey = 0;
  uint64_t recvSeq = 1;
  int outstanding = 0;
  IbRequest* slots[kMaxRequests] = {};
  // Flush (GPU memory): an RDMA READ through a QP connected to itself.
  ibv_qp* flushQp = nullptr;
  uint64_t* flushScratch = nullptr;
  ibv_mr* flushMr = nullptr;
  // Handshake.
  int state = kConnRecvInfo;
  ConnInfo local{}, remote{};
  size_t ioDone = 0;
  Clock::time_point started;
  void onCompletion(const ibv_wc& wc) override;
  ~IbRecvComm() override;
};

struct IbListenComm : ListenComm {
  IbDevice* dev = nullptr;
  int fd = -1;
  IbRecvComm* pending = nullptr;  // the connection being accepted
  ~IbListenComm() override;
};

class IbNet : public Net {
 public:
  IbNet(const IbvApi* api, std::vector<IbDevice*> devs);
  ~IbNet() override;

  const char* name() const override { return "IB"; }
  int deviceCount() const override { return int(devs_.size()); }
  Result getProperties(int dev, DeviceProps* props) const override;
  Result listen(int dev, void* handle, ListenComm** listenComm) override;
  Result connect(int dev, const void* handle, SendComm** sendComm) override;
  Result accept(ListenComm* listenComm, RecvComm** recvComm) override;
  Result regMr(Comm* comm, void* data, size_t size, int type, void** mhandle) override;
  Result regMrDmaBuf(Comm* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                     void** mhandle) override;
  Result deregMr(Comm* comm, void* mhandle) override;
  Result isend(SendComm* comm, void* data, size_t size, int tag, void* mhandle,
               Request** request) override;
  Result irecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
               void** mhandles, Request** request) override;
  Result iflush(RecvComm* comm, int n, void** data, const int* sizes, void** mhandles,
                Request** request) override;
  Result test(Request* request, bool* done, size_t* sizes) override;
  Result closeSend(SendComm* comm) override;
  Result closeRecv(RecvComm* comm) override;
  Result closeListen(ListenComm* comm) override;

  // The registration cache of device `dev` (tests, diagnostics).
  RegCacheStats regCacheStats(int dev) const { return devs_[dev]->cache.stats(); }
  // Tests: make iflush issue its RDMA READ for host memory too (it otherwise flushes only
  // registrations of GPU memory).
  void setFlushHostMemoryForTesting(bool on) { flushHostMemory_ = on; }

 private:
  Result progressConnect(IbSendComm* c);
  Result progressAccept(IbRecvComm* c);
  Result setupFlush(IbRecvComm* c);
  static IbDevice* deviceOf(Comm* comm);

  const IbvApi* api_;
  std::vector<IbDevice*> devs_;
  int ptrSupport_ = kPtrHost;
  bool useDmabuf_ = false;
  bool peermem_ = false;
  bool flushHostMemory_ = false;
  std::mutex connectMu_;
  std::map<const void*, IbSendComm*> pendingConnects_;  // keyed by the caller's handle buffer
};

// Verbs-level helpers shared by the connect and data files.
Result createCommQps(IbComm* c, int nqps, bool postRecvs);
Result connectCommQps(IbComm* c, const ConnInfo& remote);
void fillLocalInfo(const IbComm& c, ConnInfo* info);

// The order in which the verbs backend numbers its devices: names listed here come first (the
// topology's placement puts each GPU's nearest NIC first); the rest keep discovery order. Read by
// createIbNet(); empty by default.
void setIbPreferredDevices(const std::vector<std::string>& names);

}  // namespace ib
}  // namespace net
}  // namespace mkernel
