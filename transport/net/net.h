// net::Net — the one transport interface (docs/TRANSPORT.md).
//
// It serves both the NCCL net plugin (plugin/net_v*.cc are thin adapters over it) and mkernel's own
// proxy. Its semantics are NCCL's net-plugin semantics, so the adapters stay thin:
//   - listen/connect/accept never block: connect/accept return Success with a null comm while the
//     handshake is still under way, and are called again;
//   - isend/irecv may return Success with a null request under back-pressure ("try again");
//   - at most kMaxRequests requests in flight per comm (times maxRecvs on the send side);
//   - a grouped irecv (n > 1) completes n sends under one request; each tag is the sender's
//     tag, sends may arrive in any order, each goes into the oldest pending grouped receive with a
//     free slot for its tag; posted sizes may be larger than what is sent, never smaller;
//   - requests of one comm complete in posting order; test() always writes *done;
//   - every failure is a Result with a message (MK_ERROR), never an exception or a hang: a peer
//     that closes, resets or stalls past MKERNEL_TIMEOUT_S surfaces as RemoteError/SystemError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"

namespace mkernel {
namespace net {

constexpr size_t kHandleSize = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kMaxRequests = 32;     // NCCL_NET_MAX_REQUESTS
constexpr int kMaxGroupedRecvs = 8;  // upper bound for DeviceProps::maxRecvs

enum PtrType : int { kPtrHost = 0x1, kPtrCuda = 0x2, kPtrDmaBuf = 0x4 };

struct DeviceProps {
  std::string name;     // unique across devices (NCCL keys its topology on it)
  std::string pciPath;  // /sys PCI directory; empty for a virtual NIC
  uint64_t guid = 0;
  int ptrSupport = kPtrHost;
  bool regIsGlobal = false;
  bool forceFlush = false;
  int speedMbps = 10000;
  int port = 1;
  float latencyUs = 0.0f;
  int maxComms = 65536;
  int maxRecvs = 1;
  size_t maxP2pBytes = size_t(1) << 31;
  size_t maxCollBytes = size_t(1) << 31;
};

// Opaque comm and request objects; backends derive from these.
struct Comm {
  virtual ~Comm() = default;
};
struct ListenComm : Comm {};
struct SendComm : Comm {};
struct RecvComm : Comm {};
struct Request {
  virtual ~Request() = default;
};

class Net {
 public:
  virtual ~Net() = default;

  virtual const char* name() const = 0;
  virtual int deviceCount() const = 0;
  virtual Result getProperties(int dev, DeviceProps* props) const = 0;

  // Fills `handle` (kHandleSize bytes) with what the peer needs to connect.
  virtual Result listen(int dev, void* handle, ListenComm** listenComm) = 0;
  // Non-blocking: *sendComm stays null until the connection is established.
  virtual Result connect(int dev, const void* handle, SendComm** sendComm) = 0;
  // Non-blocking: *recvComm stays null until a connection is established.
  virtual Result accept(ListenComm* listenComm, RecvComm** recvComm) = 0;

  // Memory registration. `comm` is a SendComm or RecvComm. `type` is a PtrType.
  virtual Result regMr(Comm* comm, void* data, size_t size, int type, void** mhandle) = 0;
  virtual Result regMrDmaBuf(Comm* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                             void** mhandle) = 0;
  virtual Result deregMr(Comm* comm, void* mhandle) = 0;

  // *request == nullptr on Success means "back-pressure, call again".
  virtual Result isend(SendComm* comm, void* data, size_t size, int tag, void* mhandle,
                       Request** request) = 0;
  virtual Result irecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
                       void** mhandles, Request** request) = 0;
  // Makes data received into GPU memory visible to the GPU. May set *request = nullptr when no
  // flush is needed.
  virtual Result iflush(RecvComm* comm, int n, void** data, const int* sizes, void** mhandles,
                        Request** request) = 0;
  // *done = true once complete; then `sizes` (n entries for a grouped receive, 1 for a send) holds
  // the bytes transferred and the request is freed: it must not be used again.
  virtual Result test(Request* request, bool* done, size_t* sizes) = 0;

  virtual Result closeSend(SendComm* comm) = 0;
  virtual Result closeRecv(RecvComm* comm) = 0;
  virtual Result closeListen(ListenComm* comm) = 0;
};

// Backends. Each returns nullptr (with the reason in *why) when it cannot run on this host.
std::unique_ptr<Net> createTcpNet(std::string* why);
std::unique_ptr<Net> createIbNet(std::string* why);  // verbs (rdma-core), transport/net/ib

}  // namespace net
}  // namespace mkernel
