// The version-neutral core of the NCCL net plugin: backend choice and lifetime, handle registries,
// argument checks, bounded request pools. See net_core.h for the design and docs/NET_PLUGIN.md.
#include "plugin/net/net_core.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/singleton.h"
#include "common/param.h"
#include "transport/net/backend.h"
#include "transport/net/net.h"

namespace mkernel {
namespace netplugin {
static_assert(kMaxGroupedRecvs == net::kMaxGroupedRecvs,
              "the plugin's grouped-receive bound is net::Net's");

namespace {

enum class CommKind { Listen, Send, Recv };

const char* kindName(CommKind k) {
  switch (k) {
    case CommKind::Listen:
      return "listen";
    case CommKind::Send:
      return "send";
    case CommKind::Recv:
      return "recv";
  }
  return "?";
}

struct CommRecord;

enum SlotState : int { kSlotFree = 0, kSlotPosting = 1, kSlotLive = 2 };

// One outstanding isend/irecv/iflush. The pointer NCCL holds as its request.
struct RequestRecord {
  CommRecord* comm = nullptr;
  net::Request* backend = nullptr;
  int nSizes = 0;  // sizes test() reports: 1 for a send, n for a receive, 0 for a flush
  // Free -> Posting (reserved under the registry mutex) -> Live (published to NCCL by the posting
  // thread) -> Free (test() reported it done, or its comm closed).
  std::atomic<int> state{kSlotFree};
};

struct CommRecord {
  CommKind kind;
  int dev;
  net::Net* net;       // alive while this comm is open (the core's open-comm count holds it)
  net::Comm* backend;  // a net::ListenComm, SendComm or RecvComm
  int maxRecvs;        // the device's grouped-receive width
  int ptrSupport;
  size_t maxBytes;  // the device's maxP2pBytes as reported
  // Request pool, sized once: NCCL's bound (32 in flight, times maxRecvs on the send side, plus as
  // many flushes on the receive side). Pointers into it are stable.
  int capacity;
  std::unique_ptr<RequestRecord[]> slots;
  std::vector<RequestRecord*> freeSlots;
};

struct InitContext {
  uint64_t commId;
  int trafficClass;
};

// Live handles. One mutex, held only for lookups and pool bookkeeping, never across a backend
// call: the proxy threads of several GPUs use the plugin at once. A request is validated by
// finding the slot array it points into (keyed by the array's first slot; arrays change only when
// comms open and close) and checking the slot's state, so posting and completing a request
// allocate nothing.
struct Registry {
  std::mutex mutex;
  std::unordered_set<const CommRecord*> comms;
  std::map<const RequestRecord*, CommRecord*> slotArrays;
};

// Backend lifetime. Held across listen/connect/accept (setup path only) so that the backend cannot
// be torn down under a handshake.
struct Lifecycle {
  std::mutex mutex;
  std::unique_ptr<net::Net> net;
  std::string backendName;
  int liveContexts = 0;  // v11 init() without finalize()
  int openComms = 0;     // listen + send + recv comms
  std::unordered_set<const InitContext*> contexts;
  std::vector<DeviceInfo> devices;  // cache of the current backend's properties
  std::set<std::string> interned;   // names/paths handed to NCCL: never freed before unload
};

// Never destroyed by a static destructor (the plugin may be called from NCCL's threads while
// static destructors run); freed by stopBackendAtUnload() when nothing is open, so that each
// dlopen/dlclose cycle NCCL makes leaves nothing behind (LeakSanitizer saw them leaked per cycle).
LazySingleton<Registry> gRegistry;
LazySingleton<Lifecycle> gLifecycle;
Registry& registry() {
  return gRegistry.get();
}
Lifecycle& lifecycle() {
  return gLifecycle.get();
}

const char* intern(Lifecycle& lc, const std::string& s) {
  return lc.interned.insert(s).first->c_str();
}

// Chooses and creates the backend (MKERNEL_NET_BACKEND, transport/net/backend.h) and logs one
// INFO line saying which and why. NCCL maps GPUs to NICs itself, so no NIC order is preferred.
// Caller holds lc.mutex.
Result ensureNetLocked(Lifecycle& lc) {
  if (lc.net) return Result::Success;
  net::BackendChoice choice;
  Result r = net::createNetBackend({}, &choice);
  if (r != Result::Success)
    return r;  // the message (already logged) names the setting and the reason
  MK_INFO(kLogInit | kLogNet, "NET/%s: %s", kPluginName, choice.why.c_str());
  lc.backendName = choice.net->name();
  lc.net = std::move(choice.net);
  return Result::Success;
}

// Stops the backend (its destructor joins its threads) once nothing can use it any more.
void releaseNetIfIdleLocked(Lifecycle& lc) {
  if (!lc.net || lc.liveContexts > 0 || lc.openComms > 0) return;
  MK_INFO(kLogInit | kLogNet, "NET/%s: last context and comm closed: stopping the %s backend",
          kPluginName, lc.backendName.c_str());
  lc.net.reset();
  lc.devices.clear();
}

// Properties as NCCL must see them, whatever the backend reported. Read once per backend instance
// (connect/accept are polled, and NCCL asks for properties often).
Result deviceInfoLocked(Lifecycle& lc, int dev, DeviceInfo* info) {
  MK_CHECK(ensureNetLocked(lc));
  int n = lc.net->deviceCount();
  if (dev < 0 || dev >= n)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: device %d out of range [0, %d)", kPluginName,
                    dev, n);
  if (lc.devices.size() != static_cast<size_t>(n)) {
    std::vector<DeviceInfo> all(n);
    for (int d = 0; d < n; ++d) {
      net::DeviceProps p;
      MK_CHECK(lc.net->getProperties(d, &p));
      DeviceInfo& i = all[d];
      if (p.name.empty()) p.name = lc.backendName + "-" + std::to_string(d);
      i.name = intern(lc, p.name);
      i.pciPath = p.pciPath.empty() ? nullptr : intern(lc, p.pciPath);
      // NCCL treats devices with equal GUIDs as one port: 0 ("none") becomes the device index.
      i.guid = p.guid != 0 ? p.guid : static_cast<uint64_t>(d);
      i.ptrSupport = p.ptrSupport != 0 ? p.ptrSupport : net::kPtrHost;
      i.regIsGlobal = p.regIsGlobal;
      i.forceFlush = p.forceFlush;
      i.speedMbps = p.speedMbps > 0 ? p.speedMbps : kDefaultSpeedMbps;
      i.port = p.port;
      i.latencyUs = p.latencyUs >= 0 ? p.latencyUs : 0.0f;
      i.maxComms = p.maxComms > 0 ? p.maxComms : 1;
      i.maxRecvs = std::min(std::max(p.maxRecvs, 1), kMaxGroupedRecvs);
      i.maxP2pBytes = std::min(std::max(p.maxP2pBytes, size_t(1)), kMaxTransferBytes);
      i.maxCollBytes = std::min(std::max(p.maxCollBytes, size_t(1)), kMaxTransferBytes);
    }
    lc.devices = std::move(all);
  }
  *info = lc.devices[dev];
  return Result::Success;
}

// Wraps a new backend comm and counts it open. Caller holds lc.mutex.
CommRecord* addCommLocked(Lifecycle& lc, CommKind kind, int dev, net::Comm* backend,
                          const DeviceInfo& info) {
  auto* c = new CommRecord;
  c->kind = kind;
  c->dev = dev;
  c->net = lc.net.get();
  c->backend = backend;
  c->maxRecvs = info.maxRecvs;
  c->ptrSupport = info.ptrSupport;
  c->maxBytes = info.maxP2pBytes;
  int capacity = 0;
  if (kind == CommKind::Send) capacity = net::kMaxRequests * info.maxRecvs;
  if (kind == CommKind::Recv) capacity = 2 * net::kMaxRequests;  // receives + their flushes
  c->capacity = capacity;
  c->slots.reset(new RequestRecord[capacity]);
  c->freeSlots.reserve(capacity);
  for (int i = capacity - 1; i >= 0; --i) c->freeSlots.push_back(&c->slots[i]);
  Registry& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.comms.insert(c);
    if (capacity > 0) reg.slotArrays.emplace(&c->slots[0], c);
  }
  ++lc.openComms;
  return c;
}

// Looks a caller's comm up. An unknown pointer is never dereferenced. Caller holds reg.mutex.
Result findCommLocked(Registry& reg, void* handle, CommKind want, bool anyData, const char* caller,
                      CommRecord** out) {
  if (handle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: %s on a NULL comm", kPluginName, caller);
  auto* c = static_cast<CommRecord*>(handle);
  if (reg.comms.count(c) == 0)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/%s: %s on unknown comm %p (closed, or not from this plugin)", kPluginName,
                    caller, handle);
  bool ok = anyData ? c->kind != CommKind::Listen : c->kind == want;
  if (!ok)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: %s on a %s comm", kPluginName, caller,
                    kindName(c->kind));
  *out = c;
  return Result::Success;
}

Result findComm(void* handle, CommKind want, bool anyData, const char* caller, CommRecord** out) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return findCommLocked(reg, handle, want, anyData, caller, out);
}

// The slot a caller's request pointer designates, if it is a live request; never dereferences a
// pointer that is not inside one of the plugin's slot arrays. Caller holds reg.mutex.
RequestRecord* findRequestLocked(Registry& reg, const void* request) {
  auto* r = static_cast<const RequestRecord*>(request);
  auto it = reg.slotArrays.upper_bound(r);
  if (it == reg.slotArrays.begin()) return nullptr;
  --it;
  CommRecord* c = it->second;
  uintptr_t offset = reinterpret_cast<uintptr_t>(request) - reinterpret_cast<uintptr_t>(it->first);
  if (offset >= c->capacity * sizeof(RequestRecord) || offset % sizeof(RequestRecord) != 0)
    return nullptr;
  RequestRecord* slot = &c->slots[offset / sizeof(RequestRecord)];
  return slot->state.load(std::memory_order_acquire) == kSlotLive ? slot : nullptr;
}

// Validates the comm and reserves a request slot in one critical section (the hot path takes the
// mutex once per post). *slot is nullptr when NCCL's in-flight bound is reached.
Result reserveSlot(void* handle, CommKind kind, const char* caller, CommRecord** comm,
                   RequestRecord** slot) {
  *slot = nullptr;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  MK_CHECK(findCommLocked(reg, handle, kind, false, caller, comm));
  CommRecord* c = *comm;
  if (c->freeSlots.empty()) return Result::Success;
  RequestRecord* r = c->freeSlots.back();
  c->freeSlots.pop_back();
  r->state.store(kSlotPosting, std::memory_order_relaxed);
  *slot = r;
  return Result::Success;
}

void releaseSlot(CommRecord* c, RequestRecord* r) {
  if (r == nullptr) return;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  r->state.store(kSlotFree, std::memory_order_relaxed);
  c->freeSlots.push_back(r);
}

// Publishes a slot the backend accepted (*request = the slot), or returns it to the pool
// (*request = NULL: back-pressure or error).
void settleSlot(CommRecord* c, RequestRecord* r, Result res, net::Request* backend, int nSizes,
                void** request) {
  if (r == nullptr) return;
  if (res != Result::Success || backend == nullptr) {
    releaseSlot(c, r);
    *request = nullptr;
    return;
  }
  r->comm = c;
  r->backend = backend;
  r->nSizes = nSizes;
  r->state.store(kSlotLive, std::memory_order_release);
  *request = r;
}

Result closeComm(void* handle, CommKind kind, const char* caller) {
  CommRecord* c = nullptr;
  MK_CHECK(findComm(handle, kind, false, caller, &c));
  Registry& reg = registry();
  {
    // Outstanding requests die with their comm (NCCL closes comms with requests pending on abort).
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.comms.erase(c);
    if (c->capacity > 0) reg.slotArrays.erase(&c->slots[0]);
  }
  Result res = Result::Success;
  switch (kind) {
    case CommKind::Listen:
      res = c->net->closeListen(static_cast<net::ListenComm*>(c->backend));
      break;
    case CommKind::Send:
      res = c->net->closeSend(static_cast<net::SendComm*>(c->backend));
      break;
    case CommKind::Recv:
      res = c->net->closeRecv(static_cast<net::RecvComm*>(c->backend));
      break;
  }
  delete c;
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  --lc.openComms;
  releaseNetIfIdleLocked(lc);
  return res;
}

}  // namespace

Result initContext(uint64_t commId, int trafficClass, NcclLogger logger, void** ctx) {
  if (ctx == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: init with a NULL ctx", kPluginName);
  *ctx = nullptr;
  if (logger != nullptr) setNcclLogger(logger);
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  MK_CHECK(ensureNetLocked(lc));
  auto* c = new InitContext{commId, trafficClass};
  lc.contexts.insert(c);
  ++lc.liveContexts;
  MK_INFO(kLogInit | kLogNet, "NET/%s: init comm 0x%llx: %s backend, %d device(s)%s", kPluginName,
          static_cast<unsigned long long>(commId), lc.backendName.c_str(), lc.net->deviceCount(),
          trafficClass >= 0 ? " (trafficClass recorded; the backends do not set one yet)" : "");
  *ctx = c;
  return Result::Success;
}

Result finalizeContext(void* ctx) {
  if (ctx == nullptr) return Result::Success;  // what a failed init() leaves for NCCL to finalize
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  auto* c = static_cast<InitContext*>(ctx);
  if (lc.contexts.erase(c) == 0)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: finalize of unknown context %p", kPluginName,
                    ctx);
  delete c;
  --lc.liveContexts;
  releaseNetIfIdleLocked(lc);
  return Result::Success;
}

Result checkContext(void* ctx, const char* caller, int* trafficClass) {
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  auto* c = static_cast<InitContext*>(ctx);
  if (ctx == nullptr || lc.contexts.count(c) == 0)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/%s: %s with unknown context %p (init not called, or finalized)",
                    kPluginName, caller, ctx);
  if (trafficClass != nullptr) *trafficClass = c->trafficClass;
  return Result::Success;
}

Result initProcess(NcclLogger logger, const char* version) {
  if (logger != nullptr) setNcclLogger(logger);
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  MK_CHECK(ensureNetLocked(lc));
  MK_INFO(kLogInit | kLogNet, "NET/%s: init (%s ABI): %s backend, %d device(s)", kPluginName,
          version, lc.backendName.c_str(), lc.net->deviceCount());
  return Result::Success;
}

Result deviceCount(int* ndev) {
  if (ndev == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: devices(NULL)", kPluginName);
  *ndev = 0;
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  MK_CHECK(ensureNetLocked(lc));
  *ndev = lc.net->deviceCount();
  return Result::Success;
}

Result deviceInfo(int dev, DeviceInfo* info) {
  if (info == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: getProperties(%d, NULL)", kPluginName, dev);
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  return deviceInfoLocked(lc, dev, info);
}

Result listen(int dev, void* handle, void** listenComm) {
  if (handle == nullptr || listenComm == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: listen with a NULL handle or listenComm",
                    kPluginName);
  *listenComm = nullptr;
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  DeviceInfo info;
  MK_CHECK(deviceInfoLocked(lc, dev, &info));
  net::ListenComm* backend = nullptr;
  MK_CHECK(lc.net->listen(dev, handle, &backend));
  if (backend == nullptr)
    return MK_ERROR(Result::InternalError,
                    "NET/%s: backend %s returned no listen comm for device %d", kPluginName,
                    lc.backendName.c_str(), dev);
  *listenComm = addCommLocked(lc, CommKind::Listen, dev, backend, info);
  return Result::Success;
}

Result connect(int dev, const void* handle, int trafficClass, void** sendComm) {
  if (handle == nullptr || sendComm == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: connect with a NULL handle or sendComm",
                    kPluginName);
  *sendComm = nullptr;
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  DeviceInfo info;
  MK_CHECK(deviceInfoLocked(lc, dev, &info));
  net::SendComm* backend = nullptr;
  MK_CHECK(lc.net->connect(dev, handle, &backend));
  if (backend == nullptr) return Result::Success;  // handshake under way: NCCL calls again
  *sendComm = addCommLocked(lc, CommKind::Send, dev, backend, info);
  MK_TRACE(kLogNet, "NET/%s: connected send comm %p on device %d (trafficClass %d)", kPluginName,
           *sendComm, dev, trafficClass);
  return Result::Success;
}

Result accept(void* listenComm, void** recvComm) {
  if (recvComm == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: accept with a NULL recvComm", kPluginName);
  *recvComm = nullptr;
  CommRecord* l = nullptr;
  MK_CHECK(findComm(listenComm, CommKind::Listen, false, "accept", &l));
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mutex);
  DeviceInfo info;
  MK_CHECK(deviceInfoLocked(lc, l->dev, &info));
  net::RecvComm* backend = nullptr;
  MK_CHECK(l->net->accept(static_cast<net::ListenComm*>(l->backend), &backend));
  if (backend == nullptr) return Result::Success;  // no peer yet: NCCL calls again
  *recvComm = addCommLocked(lc, CommKind::Recv, l->dev, backend, info);
  return Result::Success;
}

Result regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (mhandle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: regMr with a NULL mhandle", kPluginName);
  *mhandle = nullptr;
  CommRecord* c = nullptr;
  MK_CHECK(findComm(comm, CommKind::Send, true, "regMr", &c));
  if ((type & c->ptrSupport) == 0 || (type != net::kPtrHost && type != net::kPtrCuda))
    return MK_ERROR(Result::InvalidArgument,
                    "NET/%s: regMr of type 0x%x on device %d (ptrSupport 0x%x)", kPluginName, type,
                    c->dev, c->ptrSupport);
  if (data == nullptr && size > 0)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: regMr of %zu bytes at NULL", kPluginName,
                    size);
  return c->net->regMr(c->backend, data, size, type, mhandle);
}

Result regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                   void** mhandle) {
  if (mhandle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: regMrDmaBuf with a NULL mhandle",
                    kPluginName);
  *mhandle = nullptr;
  CommRecord* c = nullptr;
  MK_CHECK(findComm(comm, CommKind::Send, true, "regMrDmaBuf", &c));
  if ((c->ptrSupport & net::kPtrDmaBuf) == 0)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/%s: regMrDmaBuf on device %d, which has no DMA-BUF support", kPluginName,
                    c->dev);
  return c->net->regMrDmaBuf(c->backend, data, size, type, offset, fd, mhandle);
}

Result deregMr(void* comm, void* mhandle) {
  CommRecord* c = nullptr;
  MK_CHECK(findComm(comm, CommKind::Send, true, "deregMr", &c));
  if (mhandle == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: deregMr(NULL)", kPluginName);
  return c->net->deregMr(c->backend, mhandle);
}

Result isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  if (request == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: isend with a NULL request", kPluginName);
  *request = nullptr;
  CommRecord* c = nullptr;
  RequestRecord* slot = nullptr;
  MK_CHECK(reserveSlot(sendComm, CommKind::Send, "isend", &c, &slot));
  Result bad = Result::Success;
  if (size > c->maxBytes)
    bad = MK_ERROR(Result::InvalidArgument, "NET/%s: isend of %zu bytes exceeds maxP2pBytes %zu",
                   kPluginName, size, c->maxBytes);
  else if (data == nullptr && size > 0)
    bad = MK_ERROR(Result::InvalidArgument, "NET/%s: isend of %zu bytes from NULL", kPluginName,
                   size);
  if (bad != Result::Success) {
    releaseSlot(c, slot);
    return bad;
  }
  if (slot == nullptr) return Result::Success;  // NCCL's in-flight bound reached: back-pressure
  net::Request* backend = nullptr;
  Result res =
      c->net->isend(static_cast<net::SendComm*>(c->backend), data, size, tag, mhandle, &backend);
  settleSlot(c, slot, res, backend, 1, request);
  return res;
}

namespace {

Result checkRecvArgs(const CommRecord* c, int n, void** data, const size_t* sizes, const int* tags,
                     void** mhandles) {
  if (n < 1 || n > c->maxRecvs)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: irecv of %d buffers; device %d groups 1..%d",
                    kPluginName, n, c->dev, c->maxRecvs);
  if (data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/%s: irecv with a NULL data, sizes, tags or mhandles array", kPluginName);
  for (int i = 0; i < n; ++i) {
    if (sizes[i] > c->maxBytes)
      return MK_ERROR(Result::InvalidArgument,
                      "NET/%s: irecv buffer %d of %zu bytes exceeds maxP2pBytes %zu", kPluginName,
                      i, sizes[i], c->maxBytes);
    if (data[i] == nullptr && sizes[i] > 0)
      return MK_ERROR(Result::InvalidArgument, "NET/%s: irecv buffer %d of %zu bytes at NULL",
                      kPluginName, i, sizes[i]);
  }
  return Result::Success;
}

}  // namespace

Result irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
             void** mhandles, void** request) {
  // NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION: it is an input hint only.
  if (request == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: irecv with a NULL request", kPluginName);
  *request = nullptr;
  CommRecord* c = nullptr;
  RequestRecord* slot = nullptr;
  MK_CHECK(reserveSlot(recvComm, CommKind::Recv, "irecv", &c, &slot));
  Result bad = checkRecvArgs(c, n, data, sizes, tags, mhandles);
  if (bad != Result::Success) {
    releaseSlot(c, slot);
    return bad;
  }
  if (slot == nullptr) return Result::Success;
  net::Request* backend = nullptr;
  Result res = c->net->irecv(static_cast<net::RecvComm*>(c->backend), n, data, sizes, tags,
                             mhandles, &backend);
  settleSlot(c, slot, res, backend, n, request);
  return res;
}

Result iflush(void* recvComm, int n, void** data, const int* sizes, void** mhandles,
              void** request) {
  if (request == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: iflush with a NULL request", kPluginName);
  *request = nullptr;
  CommRecord* c = nullptr;
  RequestRecord* slot = nullptr;
  MK_CHECK(reserveSlot(recvComm, CommKind::Recv, "iflush", &c, &slot));
  Result bad = Result::Success;
  if (n < 1 || n > c->maxRecvs || data == nullptr || sizes == nullptr)
    bad = MK_ERROR(Result::InvalidArgument, "NET/%s: iflush of %d buffers (device %d groups 1..%d)",
                   kPluginName, n, c->dev, c->maxRecvs);
  else if (slot == nullptr)
    bad = MK_ERROR(Result::InternalError,
                   "NET/%s: iflush with %d requests already in flight on recv comm %p", kPluginName,
                   2 * net::kMaxRequests, recvComm);
  if (bad != Result::Success) {
    releaseSlot(c, slot);
    return bad;
  }
  net::Request* backend = nullptr;
  Result res =
      c->net->iflush(static_cast<net::RecvComm*>(c->backend), n, data, sizes, mhandles, &backend);
  settleSlot(c, slot, res, backend, 0, request);  // NULL: nothing to flush
  return res;
}

Result test(void* request, int* done, int* sizes) {
  if (done == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: test with a NULL done", kPluginName);
  *done = 0;
  if (request == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/%s: test on a NULL request", kPluginName);
  Registry& reg = registry();
  RequestRecord* r = nullptr;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    r = findRequestLocked(reg, request);
  }
  if (r == nullptr)
    return MK_ERROR(Result::InternalError,
                    "NET/%s: test on unknown request %p (already reported done, its comm closed, "
                    "or never returned by isend/irecv/iflush)",
                    kPluginName, request);
  size_t got[net::kMaxGroupedRecvs] = {};
  bool finished = false;
  MK_CHECK(r->comm->net->test(r->backend, &finished, got));
  if (!finished) return Result::Success;
  int nSizes = r->nSizes;
  releaseSlot(r->comm, r);
  for (int i = 0; i < nSizes; ++i)
    if (got[i] > static_cast<size_t>(INT_MAX))
      return MK_ERROR(Result::InternalError,
                      "NET/%s: transfer of %zu bytes does not fit test()'s int size", kPluginName,
                      got[i]);
  if (sizes != nullptr)
    for (int i = 0; i < nSizes; ++i) sizes[i] = static_cast<int>(got[i]);
  *done = 1;
  return Result::Success;
}

Result irecvConsumed(void* recvComm, int n, void* request) {
  // `request` was already reported done by test(): it is gone and must not be looked at.
  CommRecord* c = nullptr;
  return findComm(recvComm, CommKind::Recv, false, "irecvConsumed", &c);
}

Result closeSend(void* sendComm) {
  return closeComm(sendComm, CommKind::Send, "closeSend");
}
Result closeRecv(void* recvComm) {
  return closeComm(recvComm, CommKind::Recv, "closeRecv");
}
Result closeListen(void* listenComm) {
  return closeComm(listenComm, CommKind::Listen, "closeListen");
}

namespace {

// NCCL dlclose()s the library after the last communicator's finalize (v11) or once no communicator
// uses it (v8-v10, which have no finalize): no backend thread may outlive the code it runs. With
// comms still open, this is a process exiting without destroying its communicators while NCCL's
// proxy threads may still call in: leave the backend alone then, the process is going away.
// Nothing open: the singletons go too (a library that was never used creates none here).
__attribute__((destructor)) void stopBackendAtUnload() {
  setNcclLogger(nullptr);
  Lifecycle* lc = gLifecycle.peek();
  if (lc == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(lc->mutex);
    if (lc->openComms != 0) return;
    lc->net.reset();
    lc->devices.clear();
  }
  gLifecycle.destroy();
  gRegistry.destroy();
}

}  // namespace
}  // namespace netplugin
}  // namespace mkernel
