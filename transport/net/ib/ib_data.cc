// The data path of the verbs backend: clear-to-send FIFO, chunked WRITE_WITH_IMM over several
// QPs, completion polling, flush, and failure detection (docs/VERBS.md, "Protocol").
#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/param.h"
#include "transport/net/ib/ib_net.h"

namespace mkernel {
namespace net {
namespace ib {
namespace {

constexpr uint64_t kCtsWrId = 1;  // wr_id of a CTS write (requests are 8-byte aligned pointers)
constexpr int kPollBatch = 16;    // completions per ibv_poll_cq call
constexpr int kPollRounds = 4;    // bounded batches per progress() call
// How long a request may stay pending after the peer's control socket closed: the peer's last
// completions may be acknowledged before our CQ shows them.
constexpr auto kPeerGoneGrace = std::chrono::milliseconds(500);
constexpr auto kPeerCheckEvery = std::chrono::milliseconds(10);

// Immediate data of a chunk: slot (5 bits) | entry (3) | chunk count (5) | low sequence bits (19).
uint32_t encodeImm(int slot, int entry, int nchunks, uint64_t seq) {
  return uint32_t(slot) | uint32_t(entry) << 5 | uint32_t(nchunks) << 8 |
         uint32_t(seq & 0x7ffff) << 13;
}

bool isRemoteStatus(ibv_wc_status s) {
  return s == IBV_WC_RETRY_EXC_ERR || s == IBV_WC_RNR_RETRY_EXC_ERR || s == IBV_WC_REM_ACCESS_ERR ||
         s == IBV_WC_REM_INV_REQ_ERR || s == IBV_WC_REM_OP_ERR || s == IBV_WC_REM_ABORT_ERR ||
         s == IBV_WC_RESP_TIMEOUT_ERR;
}

}  // namespace

// ---- IbComm
// ---------------------------------------------------------------------------------------

IbRequest* IbComm::allocRequest(IbRequest::Kind kind) {
  if (freeList.empty()) return nullptr;
  IbRequest* r = freeList.back();
  freeList.pop_back();
  *r = IbRequest();
  r->kind = kind;
  r->comm = this;
  r->posted = Clock::now();
  return r;
}

void IbComm::freeRequest(IbRequest* r) {
  for (MrEntry*& mr : r->implicitMr)
    if (mr != nullptr) {
      dev->cache.dereg(*api, mr);
      mr = nullptr;
    }
  r->kind = IbRequest::kFree;
  freeList.push_back(r);
}

void IbComm::initPool(int n) {
  pool.clear();
  freeList.clear();
  for (int i = 0; i < n; ++i) {
    pool.emplace_back(new IbRequest());
    freeList.push_back(pool.back().get());
  }
}

Result IbComm::memoryFor(IbRequest* r, int i, void* data, size_t size, void* mhandle,
                         MrEntry** mr) {
  *mr = static_cast<MrEntry*>(mhandle);
  if (*mr != nullptr || size == 0) return Result::Success;
  MK_CHECK(dev->cache.reg(*api, dev->pd, data, size, kPtrHost, false, false, &r->implicitMr[i]));
  *mr = r->implicitMr[i];
  return Result::Success;
}

Result IbComm::fail(Result r, const std::string& text) {
  if (failure == Result::Success) {
    failure = r;
    failureText = text;
  }
  return MK_ERROR(failure, "%s", failureText.c_str());
}

Result IbComm::progress() {
  if (failure != Result::Success) return MK_ERROR(failure, "%s", failureText.c_str());
  ibv_wc wcs[kPollBatch];
  for (int round = 0; round < kPollRounds; ++round) {
    int n = ibv_poll_cq(cq, kPollBatch, wcs);
    if (n < 0) return fail(Result::SystemError, "NET/IB: " + dev->name + ": ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) {
        char text[320];
        snprintf(text, sizeof(text),
                 "NET/IB: %s: work completion error on QP %u (peer %s): %s (status %d, vendor "
                 "error 0x%x)%s",
                 dev->name.c_str(), wc.qp_num, peer.c_str(), api->statusText(wc.status),
                 int(wc.status), wc.vendor_err,
                 wc.status == IBV_WC_RETRY_EXC_ERR
                     ? ": the peer stopped answering (gone, or the link is down)"
                     : "");
        return fail(isRemoteStatus(wc.status) ? Result::RemoteError : Result::SystemError, text);
      }
      onCompletion(wc);
      if (failure != Result::Success) return MK_ERROR(failure, "%s", failureText.c_str());
    }
    if (n < kPollBatch) break;
  }
  return Result::Success;
}

Result IbComm::checkLiveness(const IbRequest* r, const char* what) {
  Clock::time_point now = Clock::now();
  if (!peerClosed && now - lastPeerCheck > kPeerCheckEvery) {
    lastPeerCheck = now;
    char b;
    ssize_t k = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      peerClosed = true;
      peerClosedAt = now;
    }
  }
  if (peerClosed && now - peerClosedAt > kPeerGoneGrace)
    return fail(Result::RemoteError, "NET/IB: " + dev->name + ": peer " + peer +
                                         " closed the connection with a " + what +
                                         " pending (the peer process exited or was killed)");
  if (r != nullptr && now - r->posted > std::chrono::seconds(params::TIMEOUT_S()))
    return fail(Result::RemoteError, "NET/IB: " + dev->name + ": " + what + " with peer " + peer +
                                         " not complete after " +
                                         std::to_string(params::TIMEOUT_S()) +
                                         " s (MKERNEL_TIMEOUT_S)");
  return Result::Success;
}

void IbSendComm::markUsed(int slot, int entry, int nreqs) {
  slotUsed[slot] |= 1u << entry;
  slotFull[slot] = slotUsed[slot] == (1u << nreqs) - 1;
  // Retire fully matched receives from the head of the FIFO, in order.
  while (slotFull[sendSeq % kMaxRequests]) {
    slotUsed[sendSeq % kMaxRequests] = 0;
    slotFull[sendSeq % kMaxRequests] = false;
    ++sendSeq;
  }
}

void IbSendComm::onCompletion(const ibv_wc& wc) {
  if (wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id != 0) {
    auto* r = reinterpret_cast<IbRequest*>(wc.wr_id);
    --r->pending;
  }
}

void IbRecvComm::onCompletion(const ibv_wc& wc) {
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    uint32_t imm = ntohl(wc.imm_data);
    int slot = int(imm & 31), entry = int((imm >> 5) & 7), nchunks = int((imm >> 8) & 31);
    IbRequest* r = slots[slot];
    if (r == nullptr || (r->seq & 0x7ffff) != (imm >> 13) || entry >= r->n) {
      fail(Result::InternalError, "NET/IB: " + dev->name + ": unexpected immediate 0x" +
                                      std::to_string(imm) + " from " + peer +
                                      " (no matching receive)");
      return;
    }
    r->chunksExpected[entry] = nchunks;
    ++r->chunksArrived[entry];
    // Give the QP its receive WR back.
    ibv_recv_wr wr{};
    wr.wr_id = wc.wr_id;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qps[wc.wr_id], &wr, &bad))
      fail(Result::SystemError, "NET/IB: " + dev->name + ": ibv_post_recv failed: " + strerror(rc));
  } else if (wc.opcode == IBV_WC_RDMA_READ && wc.wr_id != 0) {
    --reinterpret_cast<IbRequest*>(wc.wr_id)->pending;  // flush
  }
  // IBV_WC_RDMA_WRITE with kCtsWrId: a CTS write went out; nothing to track (its slot is reused
  // only after the receive it announced has completed).
}

// ---- isend / irecv / iflush / test
// ---------------------------------------------------------------

Result IbNet::isend(SendComm* comm, void* data, size_t size, int tag, void* mhandle,
                    Request** request) {
  *request = nullptr;
  auto* c = dynamic_cast<IbSendComm*>(comm);
  if (c == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/IB: isend on a comm that is not a verbs send comm");
  MK_CHECK(c->progress());
  // The oldest posted receive with a free entry for this tag takes the send: look from the head
  // of the CTS FIFO forward over every receive the peer has posted.
  int slot = -1, match = -1, nreqs = 0;
  uint64_t seq = c->sendSeq;
  volatile CtsEntry* entries = nullptr;
  for (; seq < c->sendSeq + kMaxRequests && match < 0; ++seq) {
    slot = int(seq % kMaxRequests);
    entries = c->fifo[slot].e;
    // One RDMA write carries the whole slot, but its bytes may land in any order: an entry is
    // trusted only once both copies of its sequence number (at its start and at its end) have
    // arrived, and the slot only once every entry has. Until then it is "not posted (yet)". On
    // Soft-RoCE a reader can see seq before nreqs has landed ("corrupt CTS entry").
    if (entries[0].seq != seq || entries[0].seqTail != uint32_t(seq)) break;
    std::atomic_thread_fence(std::memory_order_acquire);
    nreqs = int(entries[0].nreqs);
    if (nreqs < 1 || nreqs > kMaxGroupedRecvs)
      return c->fail(Result::RemoteError, "NET/IB: corrupt CTS entry from " + c->peer);
    bool whole = true;
    for (int i = 1; i < nreqs; ++i)
      whole = whole && entries[i].seq == seq && entries[i].seqTail == uint32_t(seq);
    if (!whole) break;
    std::atomic_thread_fence(std::memory_order_acquire);
    for (int i = 0; i < nreqs && match < 0; ++i)
      if (!(c->slotUsed[slot] & (1u << i)) && entries[i].tag == tag) match = i;
  }
  if (match < 0) {
    // No CTS for this tag yet: back-pressure, unless the peer is gone.
    return seq == c->sendSeq ? c->checkLiveness(nullptr, "send") : Result::Success;
  }
  --seq;  // the loop stepped past the matching slot
  uint64_t remAddr = entries[match].addr, remSize = entries[match].size;
  uint32_t remKey = entries[match].rkey;
  IbRequest* r = c->allocRequest(IbRequest::kSend);
  if (r == nullptr) return Result::Success;  // kMaxRequests * kMaxGroupedRecvs in flight
  r->size = size;
  bool truncated = size > remSize;
  bool inlineData = size <= c->maxInline;
  MrEntry* mr = nullptr;
  if (!truncated && !inlineData) {
    Result reg = c->memoryFor(r, 0, data, size, mhandle, &mr);
    if (reg != Result::Success) {
      c->freeRequest(r);
      return reg;
    }
  }
  int nqps = int(c->qps.size());
  int nchunks = 1;
  size_t chunk = size;
  if (size >= kMinChunkBytes && nqps > 1) {
    nchunks = int(std::min<size_t>(size_t(nqps), size / (kMinChunkBytes / 2)));
    chunk = ((size + size_t(nchunks) - 1) / size_t(nchunks) + 127) & ~size_t(127);
    nchunks = int((size + chunk - 1) / chunk);
  }
  // The byte count goes first, on the QP of chunk 0: that chunk's immediate completes after it.
  uint64_t* sizeSrc = &c->sizeStaging[slot * kMaxGroupedRecvs + match];
  *sizeSrc = size;
  ibv_sge sizeSge{reinterpret_cast<uintptr_t>(sizeSrc), sizeof(uint64_t), c->sizeStagingMr->lkey};
  ibv_send_wr sizeWr{};
  sizeWr.opcode = IBV_WR_RDMA_WRITE;
  sizeWr.sg_list = &sizeSge;
  sizeWr.num_sge = 1;
  sizeWr.send_flags = c->maxInline >= sizeof(uint64_t) ? IBV_SEND_INLINE : 0;
  sizeWr.wr.rdma.remote_addr =
      c->remSizesAddr + uint64_t(slot * kMaxGroupedRecvs + match) * sizeof(uint64_t);
  sizeWr.wr.rdma.rkey = c->remSizesRkey;
  uint32_t imm = htonl(encodeImm(slot, match, nchunks, seq));
  if (truncated) {
    // Tell the receiver too (its receive fails naming both sizes instead of waiting for data that
    // never comes): the real byte count, then an empty WRITE_WITH_IMM.
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(encodeImm(slot, match, 1, seq));
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remAddr;
    wr.wr.rdma.rkey = remKey;
    sizeWr.next = &wr;
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(c->qps[0], &sizeWr, &bad);
    c->freeRequest(r);
    c->markUsed(slot, match, nreqs);
    if (rc != 0)
      return c->fail(Result::SystemError, "NET/IB: " + c->dev->name + ": ibv_post_send to " +
                                              c->peer + " failed: " + strerror(rc));
    return MK_ERROR(Result::InvalidUsage,
                    "NET/IB: send of %zu bytes (tag %d) to %s is larger than the posted "
                    "receive of %lu bytes",
                    size, tag, c->peer.c_str(), static_cast<unsigned long>(remSize));
  }
  for (int k = 0; k < nchunks; ++k) {
    size_t off = size_t(k) * chunk;
    size_t len = std::min(chunk, size - std::min(size, off));
    ibv_sge sge{reinterpret_cast<uintptr_t>(data) + off, uint32_t(len),
                mr != nullptr && mr->mr ? mr->mr->lkey : 0};
    ibv_send_wr wr{};
    wr.wr_id = reinterpret_cast<uintptr_t>(r);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = imm;
    wr.sg_list = &sge;
    wr.num_sge = len > 0 ? 1 : 0;
    wr.send_flags = IBV_SEND_SIGNALED | (inlineData && nchunks == 1 ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = remAddr + off;
    wr.wr.rdma.rkey = remKey;
    ibv_send_wr* first = &wr;
    if (k == 0) {
      sizeWr.next = &wr;
      first = &sizeWr;
    }
    ibv_qp* qp = c->qps[size_t(c->nextQp + k) % c->qps.size()];
    ibv_send_wr* bad = nullptr;
    ++r->pending;
    if (int rc = ibv_post_send(qp, first, &bad))
      return c->fail(Result::SystemError, "NET/IB: " + c->dev->name + ": ibv_post_send to " +
                                              c->peer + " failed: " + strerror(rc));
  }
  c->nextQp = (c->nextQp + nchunks) % nqps;
  c->markUsed(slot, match, nreqs);
  c->issue(r);
  *request = r;
  return Result::Success;
}

Result IbNet::irecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
                    void** mhandles, Request** request) {
  *request = nullptr;
  auto* c = dynamic_cast<IbRecvComm*>(comm);
  if (c == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/IB: irecv on a comm that is not a verbs recv comm");
  if (n < 1 || n > kMaxGroupedRecvs)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: grouped receive of %d buffers (1..%d)", n,
                    kMaxGroupedRecvs);
  MK_CHECK(c->progress());
  if (c->outstanding >= kMaxRequests) return Result::Success;
  int slot = int(c->recvSeq % kMaxRequests);
  if (c->slots[slot] != nullptr) return Result::Success;
  IbRequest* r = c->allocRequest(IbRequest::kRecv);
  if (r == nullptr) return Result::Success;
  r->n = n;
  r->slot = slot;
  r->seq = c->recvSeq;
  CtsEntry* e = c->ctsStaging[slot].e;
  for (int i = 0; i < n; ++i) {
    MrEntry* mr = nullptr;
    Result reg = c->memoryFor(r, i, data[i], sizes[i], mhandles ? mhandles[i] : nullptr, &mr);
    if (reg != Result::Success) {
      c->freeRequest(r);
      return reg;
    }
    r->postedSize[i] = sizes[i];
    r->tag[i] = tags[i];
    e[i] = CtsEntry{reinterpret_cast<uintptr_t>(data[i]),
                    sizes[i],
                    c->recvSeq,
                    mr && mr->mr ? mr->mr->rkey : 0,
                    tags[i],
                    uint32_t(n),
                    uint32_t(c->recvSeq)};
    c->sizes[slot * kMaxGroupedRecvs + i] = 0;
  }
  uint32_t bytes = uint32_t(sizeof(CtsEntry) * size_t(n));
  ibv_sge sge{reinterpret_cast<uintptr_t>(e), bytes, c->ctsStagingMr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kCtsWrId;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  // Signal every 8th CTS write only: send queue slots of unsignaled writes are recycled by the
  // next signaled one.
  wr.send_flags =
      (bytes <= c->maxInline ? IBV_SEND_INLINE : 0) | (c->recvSeq % 8 == 0 ? IBV_SEND_SIGNALED : 0);
  wr.wr.rdma.remote_addr = c->remFifoAddr + uint64_t(slot) * sizeof(CtsSlot);
  wr.wr.rdma.rkey = c->remFifoRkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(c->qps[0], &wr, &bad)) {
    c->freeRequest(r);
    return c->fail(Result::SystemError, "NET/IB: " + c->dev->name + ": posting the CTS to " +
                                            c->peer + " failed: " + strerror(rc));
  }
  c->slots[slot] = r;
  ++c->outstanding;
  ++c->recvSeq;
  c->issue(r);
  *request = r;
  return Result::Success;
}

Result IbNet::iflush(RecvComm* comm, int n, void** data, const int* sizes, void** mhandles,
                     Request** request) {
  *request = nullptr;
  auto* c = dynamic_cast<IbRecvComm*>(comm);
  if (c == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/IB: iflush on a comm that is not a verbs recv comm");
  // Only data the NIC wrote into GPU memory needs a flush: a read through the NIC orders the
  // earlier writes before the completion the GPU-side consumer waits for.
  int last = -1;
  for (int i = 0; i < n; ++i) {
    auto* mr = static_cast<MrEntry*>(mhandles ? mhandles[i] : nullptr);
    if (mr != nullptr && mr->mr != nullptr && sizes[i] > 0 &&
        (mr->type == kPtrCuda || mr->type == -1 || flushHostMemory_))
      last = i;
  }
  if (last < 0) return Result::Success;
  MK_CHECK(c->progress());
  if (c->flushQp == nullptr) MK_CHECK(setupFlush(c));
  IbRequest* r = c->allocRequest(IbRequest::kFlush);
  if (r == nullptr) return Result::Success;
  auto* mr = static_cast<MrEntry*>(mhandles[last]);
  ibv_sge sge{reinterpret_cast<uintptr_t>(c->flushScratch), 1, c->flushMr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = reinterpret_cast<uintptr_t>(r);
  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(data[last]);
  wr.wr.rdma.rkey = mr->mr->rkey;
  ibv_send_wr* bad = nullptr;
  r->pending = 1;
  if (int rc = ibv_post_send(c->flushQp, &wr, &bad)) {
    c->freeRequest(r);
    return c->fail(Result::SystemError,
                   "NET/IB: " + c->dev->name + ": posting the flush read failed: " + strerror(rc));
  }
  c->issue(r);
  *request = r;
  return Result::Success;
}

namespace {

// Whether r's own transfer is over (its data sent, flushed, or every entry received).
bool transferComplete(const IbRequest* r) {
  if (r->kind != IbRequest::kRecv) return r->pending == 0;
  for (int i = 0; i < r->n; ++i)
    if (r->chunksExpected[i] == 0 || r->chunksArrived[i] < r->chunksExpected[i]) return false;
  return true;
}

// Whether every request of r's kind posted before r on its comm is complete.
bool earlierComplete(const IbComm* c, const IbRequest* r) {
  for (const IbRequest* e : c->outstanding[r->kind]) {
    if (e == r) return true;
    if (!transferComplete(e)) return false;
  }
  return true;
}

}  // namespace

Result IbNet::test(Request* request, bool* done, size_t* sizes) {
  *done = false;
  auto* r = dynamic_cast<IbRequest*>(request);
  if (r == nullptr || r->kind == IbRequest::kFree)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/IB: test of a request that is not a live verbs request");
  IbComm* c = r->comm;
  MK_CHECK(c->progress());
  // An earlier request of the same kind is still in flight: this one is not reported yet, even
  // if its own transfer finished (the caller sees completions in posting order).
  const bool itsTurn = earlierComplete(c, r);
  switch (r->kind) {
    case IbRequest::kSend:
    case IbRequest::kFlush:
      if (r->pending > 0)
        return c->checkLiveness(r, r->kind == IbRequest::kSend ? "send" : "flush");
      if (!itsTurn) return Result::Success;
      if (sizes) sizes[0] = r->size;
      break;
    case IbRequest::kRecv: {
      auto* rc = static_cast<IbRecvComm*>(c);
      const volatile uint64_t* recvd = rc->sizes + r->slot * kMaxGroupedRecvs;
      bool complete = true;
      for (int i = 0; i < r->n; ++i) {
        if (r->chunksExpected[i] == 0 || r->chunksArrived[i] < r->chunksExpected[i]) {
          complete = false;
          continue;
        }
        if (recvd[i] > r->postedSize[i])
          return c->fail(Result::InvalidUsage, "NET/IB: " + c->dev->name + ": message of " +
                                                   std::to_string(recvd[i]) + " bytes (tag " +
                                                   std::to_string(r->tag[i]) + ") from " + c->peer +
                                                   " is larger than the posted receive of " +
                                                   std::to_string(r->postedSize[i]) + " bytes");
      }
      if (!complete) return c->checkLiveness(r, "receive");
      if (!itsTurn) return Result::Success;
      if (sizes)
        for (int i = 0; i < r->n; ++i) sizes[i] = size_t(recvd[i]);
      rc->slots[r->slot] = nullptr;
      --rc->outstanding;
      break;
    }
    case IbRequest::kFree:
      break;
  }
  auto& q = c->outstanding[r->kind];
  q.erase(std::find(q.begin(), q.end(), r));
  c->freeRequest(r);
  *done = true;
  return Result::Success;
}

}  // namespace ib
}  // namespace net
}  // namespace mkernel
