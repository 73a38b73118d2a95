// The TCP backend of net::Net (docs/TRANSPORT.md). Internal to transport/net/tcp.
//
// Shape: a connection is MKERNEL_NET_SOCKETS TCP sockets. Socket 0 carries a 16-byte header
// {magic, tag, size} before every message, so the receiver can match grouped receives; a message
// of at most MKERNEL_NET_CHUNK_BYTES travels whole on socket 0 behind its header, a larger one is
// cut into chunks dealt round-robin over all sockets. Both sides derive the chunk-to-socket
// assignment from (size, nSocks, chunk) alone, so striped chunks need no headers of their own.
// Bytes move straight between the user's buffers and the kernel (no staging copy); a receiver
// reads a socket only while it has a matched destination, so TCP's own flow control is the
// back-pressure. Sockets are non-blocking and registered edge-triggered with a progress Engine
// (an epoll thread); isend/irecv/test also move bytes inline under the comm's mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/net/net.h"
#include "transport/net/socket_iface.h"

namespace mkernel {
namespace net {
namespace tcp {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHandleMagic = 0x4d4b5443;  // "MKTC"
constexpr uint32_t kHelloMagic = 0x4d4b4845;   // "MKHE"
constexpr uint32_t kMsgMagic = 0x4d4b4d53;     // "MKMS"
constexpr uint16_t kWireVersion = 1;
constexpr int kMaxSockets = 16;
// TcpComm::checkClosedAheadLocked: how long socket 0 may stay silent after a data socket's close.
constexpr double kCloseGraceS = 1.0;

// What listen() writes into the 128-byte handle.
struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t nSocks;  // the listener's MKERNEL_NET_SOCKETS; the connector follows it
  uint64_t nonce;   // per listen: a stale or foreign handle is refused at the handshake
  SocketAddr addr;
};
static_assert(sizeof(WireHandle) <= kHandleSize, "handle must fit NCCL's 128 bytes");

// First bytes on every socket of a connection (connector -> listener).
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t sockIndex;
  uint16_t nSocks;
  uint16_t reserved;
  uint32_t reserved2;
  uint64_t nonce;
  uint64_t connId;  // groups the sockets of one connection at the listener
};
static_assert(sizeof(Hello) == 32, "wire format");

enum HelloStatus : uint32_t {
  kHelloOk = 0,
  kHelloBadNonce = 1,
  kHelloBadVersion = 2,
  kHelloBadSockets = 3
};
// Listener -> connector, one per socket, after checking its Hello.
struct HelloAck {
  uint32_t magic;
  uint32_t status;
  uint64_t connId;
};
static_assert(sizeof(HelloAck) == 16, "wire format");

// Precedes every message on socket 0.
struct MsgHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t size;
};
static_assert(sizeof(MsgHeader) == 16, "wire format");

// Something an Engine delivers epoll events to. `index` is what it was registered with.
// Called on the engine thread with the engine's mutex held.
struct EventTarget {
  virtual ~EventTarget() = default;
  virtual void onEvents(int index, uint32_t events) = 0;
};

// One progress thread with an epoll set. Idle, it sleeps in epoll_wait (no timeout): it never
// spins. Registrations are looked up by a never-reused token under the engine mutex, so an event
// fetched just before a comm closes is dropped instead of touching freed memory.
class Engine {
 public:
  Engine() = default;
  ~Engine();  // stops and joins the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Result start();  // idempotent
  // Adds fd (edge-triggered, in+out+rdhup). Returns its token in *token.
  Result add(int fd, EventTarget* target, int index, uint64_t* token);
  void remove(uint64_t token);  // also fine from inside onEvents (recursive mutex)
  int registrations();

 private:
  struct Registration {
    int fd;
    EventTarget* target;
    int index;
  };
  void loop();

  std::recursive_mutex mu_;
  std::unordered_map<uint64_t, Registration> regs_;
  uint64_t nextToken_ = 1;
  int epfd_ = -1;
  int wakeFd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct TcpComm;

// A posted isend or irecv. Requests live in a fixed pool per comm (the bound on requests in
// flight) and are handed out in posting order.
struct TcpRequest : Request {
  static constexpr uint32_t kLiveMagic = 0x52455131;  // catches tests of a freed request
  uint32_t live = 0;
  TcpComm* comm = nullptr;
  bool isSend = false;
  bool complete = false;
  uint64_t seq = 0;      // posting order within the comm
  size_t bytesLeft = 0;  // payload (and, for a send, header) bytes still to move
  // send
  MsgHeader header{};
  // recv
  struct Slot {
    char* data;
    size_t posted;
    int tag;
    bool matched;
    size_t received;
  };
  int n = 0;
  int nMatched = 0;
  Slot slots[kMaxGroupedRecvs];
};

struct Segment {
  char* p;
  size_t len;
  TcpRequest* req;
};

struct DataSocket {
  int fd = -1;
  uint64_t token = 0;
  bool readable = true;  // edge-triggered bookkeeping: false after EAGAIN until the next event
  bool writable = true;
  bool peerClosed = false;  // EOF seen between messages while another socket still had bytes due
  bool closedAhead =
      false;  // EOF seen on a data socket with nothing due on it (checkClosedAheadLocked)
  std::deque<Segment> queue;  // bytes to move on this socket, in wire order
};

// State shared by send and receive comms.
struct TcpComm : EventTarget {
  TcpComm(bool sender, std::vector<int> fds, std::string peerName, int maxInflight);
  ~TcpComm() override;

  // Detaches from the engine and closes the sockets; requests die with the comm.
  void shutdown();
  void onEvents(int index, uint32_t events) override;

  // All of these need mu held.
  void progressLocked();  // moves what it can, then refreshes orderedDone
  void progressSendLocked();
  void progressRecvLocked();
  bool tailInFlightLocked() const;  // some open socket still has bytes of a message due
  // Receive side. A peer closes all the sockets of its comm together, so a close seen on a data
  // socket while nothing was due on it means the connection is over, even if socket 0's own
  // close has not been seen: fails the comm once nothing is left to read on socket 0 (no header
  // pending, no unread byte) for kCloseGraceS. Without it a survivor can wait out its timeout
  // with its socket 1 closed and socket 0 silent (docs/RELIABILITY.md).
  void checkClosedAheadLocked();
  bool matchHeaderLocked();  // routes pendingHeader to a receive slot; false if none is posted
  void queueSegmentsLocked(char* data, size_t size, TcpRequest* req);
  void fail(Result r, const std::string& msg);
  void touch() { lastActivity = Clock::now(); }
  TcpRequest* allocRequestLocked();
  void freeRequestLocked(TcpRequest* req);
  // What a stalled comm is waiting for, for the stall error: the requests in flight (tags and
  // sizes), a receive header read but matched to no posted receive, and per socket the bytes
  // queued here, the bytes the kernel holds (unread, or sent but not acknowledged) and the
  // edge-triggered flags.
  std::string describeLocked() const;

  const bool isSender;
  const std::string peer;  // "addr:port" of the other side, for error messages
  std::mutex mu;
  Engine* engine = nullptr;
  std::vector<DataSocket> socks;
  size_t chunkBytes = 0;
  double timeoutS = 0;
  bool inlineProgress = true;

  std::vector<TcpRequest> pool;
  std::vector<TcpRequest*> freeList;
  std::deque<TcpRequest*> inflight;  // posting order
  uint64_t nextSeq = 0;
  // Every request with seq below this is complete (so may be reported done, in posting order).
  // Written under mu; test() reads it without the lock to answer "done" even while the engine
  // thread holds the comm.
  std::atomic<uint64_t> orderedDone{0};
  Clock::time_point lastActivity;
  int closedAheadSock = -1;  // the first data socket whose close was seen ahead of socket 0's
  Clock::time_point closedAheadAt;

  // Receive side: the header being read on socket 0.
  MsgHeader pendingHeader{};
  size_t headerGot = 0;
  bool headerReady = false;

  Result failure = Result::Success;
  std::string failureMsg;
};

struct TcpSendComm : SendComm {
  TcpComm* core = nullptr;
};
struct TcpRecvComm : RecvComm {
  TcpComm* core = nullptr;
};

// A listening socket plus the connections whose handshakes are under way. The engine thread
// accepts sockets, checks their Hello, acknowledges, and groups them by connId; accept() takes
// complete groups.
struct TcpListenComm : ListenComm, EventTarget {
  ~TcpListenComm() override;
  void onEvents(int index, uint32_t events) override;
  void shutdown();

  struct Pending {
    int fd;
    uint64_t token;
    Hello hello;
    size_t got;
    Clock::time_point since;  // accepted at; a Hello not complete by the deadline is dropped
  };
  // Takes the pending sockets whose Hello did not arrive within `deadline` out of `pending`
  // (caller holds mu); the caller removes them from the engine and closes them without mu.
  std::vector<Pending> takeStaleLocked(Clock::duration deadline);
  struct Group {
    uint64_t connId = 0;
    int nSocks = 0;
    int count = 0;
    std::vector<int> fds;  // by socket index
    std::string peer;
  };

  std::mutex mu;
  Engine* engine = nullptr;
  int fd = -1;
  uint64_t token = 0;
  uint64_t nonce = 0;
  int nSocks = 1;
  SocketAddr addr{};
  int nextPendingId = 0;
  std::map<int, Pending> pending;  // key = index given to the engine
  std::map<uint64_t, Group> groups;
  std::deque<Group> ready;
  std::string error;  // a failure of the listening socket itself

 private:
  void acceptNewLocked();
  void readHelloLocked(int id);
};

// connect() is called repeatedly with the same handle until it yields a comm; this is the state
// between calls.
struct PendingConnect {
  WireHandle handle{};
  uint64_t connId = 0;
  Clock::time_point start;
  struct Sock {
    int fd = -1;
    int stage = 0;  // 0 connecting, 1 sending Hello, 2 reading the ack, 3 done
    size_t done = 0;
    HelloAck ack{};
  };
  std::vector<Sock> socks;
};

class TcpNet : public Net {
 public:
  TcpNet(std::vector<NetInterface> ifs, int nThreads);
  ~TcpNet() override;

  const char* name() const override { return "TCP"; }
  int deviceCount() const override { return static_cast<int>(ifs_.size()); }
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

 private:
  Result pickEngine(Engine** engine);
  Result progressConnect(PendingConnect* pc, bool* established, std::vector<int>* fds);
  Result attachComm(TcpComm* core);

  std::vector<NetInterface> ifs_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::mutex mu_;  // engines_ choice, pendingConnects_, live comms
  unsigned nextEngine_ = 0;
  std::map<const void*, PendingConnect> pendingConnects_;
  std::vector<TcpSendComm*> liveSend_;
  std::vector<TcpRecvComm*> liveRecv_;
  std::vector<TcpListenComm*> liveListen_;
};

const char* helloStatusString(uint32_t status);

}  // namespace tcp
}  // namespace net
}  // namespace mkernel
