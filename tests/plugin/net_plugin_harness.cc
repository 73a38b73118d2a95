#include "tests/plugin/net_plugin_harness.h"
#include "common/param.h"

#include <dirent.h>
#include <dlfcn.h>

#include "tests/catch.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace mktest {
namespace {

using namespace mkernel::abi;
using Clock = std::chrono::steady_clock;

std::mutex gLogMutex;
std::vector<CapturedLog> gLog;

// The harness plays NCCL run with NCCL_DEBUG=INFO: the library formats and hands over only the
// lines NCCL would print (common/log.cc), and the tests read the INFO ones.
struct NcclDebugInfo {
  NcclDebugInfo() { setenv("NCCL_DEBUG", "INFO", /*overwrite=*/0); }
} gNcclDebugInfo;

// Stands in for NCCL's ncclDebugLog.
void captureLogger(int level, unsigned long flags, const char* /*file*/, int /*line*/,
                   const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (mkernel::params::TEST_VERBOSE()) std::fprintf(stderr, "[plugin log %d] %s\n", level, buf);
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.push_back({level, flags, buf});
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr unsigned char kPoison = 0xA5;
const char* const kPoisonPtr = reinterpret_cast<const char*>(~uintptr_t(0) / 0xff * kPoison);

template <typename T>
void poison(T* p) {
  std::memset(static_cast<void*>(p), kPoison, sizeof(*p));
}

template <typename Raw>
void copyBase(const Raw& r, Props* o) {
  o->name = r.name == kPoisonPtr ? nullptr : r.name;
  o->pciPath = r.pciPath == kPoisonPtr ? "<unwritten>" : r.pciPath;
  o->guid = r.guid;
  o->ptrSupport = r.ptrSupport;
  o->regIsGlobal = r.regIsGlobal;
  o->speed = r.speed;
  o->port = r.port;
  o->latency = r.latency;
  o->maxComms = r.maxComms;
  o->maxRecvs = r.maxRecvs;
  o->netDeviceType = r.netDeviceType;
  o->netDeviceVersion = r.netDeviceVersion;
}

template <typename Raw>
void copyV9(const Raw& r, Props* o) {
  copyBase(r, o);
  o->forceFlush = r.forceFlush;
  o->vNdevs = r.vProps.ndevs;
  o->vDev0 = r.vProps.devs[0];
  o->maxP2pBytes = r.maxP2pBytes;
  o->maxCollBytes = r.maxCollBytes;
}

uint64_t gNextCommId = 0x6d6b00000001ull;

}  // namespace

std::string netPluginPath() {
  return std::string(MKERNEL_LIB_DIR) + "/libnccl-net-mkernel.so";
}

void prepareTestEnvironment() {
  // Loopback for the TCP backend; a caller's own setting (e.g. the verbs VM's) wins.
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);
  mkernel::params::resetForTesting();
}

void* pluginLibrary() {
  static void* handle = nullptr;
  if (handle == nullptr) {
    prepareTestEnvironment();
    handle = dlopen(netPluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    INFO("dlopen(" << netPluginPath() << "): " << (handle ? "ok" : dlerror()));
    REQUIRE(handle != nullptr);
  }
  return handle;
}

std::vector<CapturedLog> capturedLog() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  return gLog;
}

void clearCapturedLog() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.clear();
}

NetPlugin::NetPlugin(int version) : version_(version) {
  std::string sym = "ncclNetPlugin_v" + std::to_string(version);
  table_ = dlsym(pluginLibrary(), sym.c_str());
  INFO("dlsym " << sym);
  REQUIRE(table_ != nullptr);
}

// Calls member `fn` of the version's table with the given arguments. v12's table is v11's with
// v12's types, which are v11's except the properties and the virtual-device list (both handled
// apart), so v12 goes through v11's members.
#define MK_CALL(fn, ...)                                                         \
  (version_ >= 11   ? static_cast<const ncclNet_v11_t*>(table_)->fn(__VA_ARGS__) \
   : version_ == 10 ? static_cast<const ncclNet_v10_t*>(table_)->fn(__VA_ARGS__) \
   : version_ == 9  ? static_cast<const ncclNet_v9_t*>(table_)->fn(__VA_ARGS__)  \
                    : static_cast<const ncclNet_v8_t*>(table_)->fn(__VA_ARGS__))

const char* NetPlugin::name() const {
  return *static_cast<const char* const*>(table_);
}

ncclResult_t NetPlugin::init() {
  switch (version_) {
    case 12:
    case 11: {
      ncclNetCommConfig_v11_t config{kNcclNetTrafficClassUndef};
      ctx_ = reinterpret_cast<void*>(0x1);  // NCCL's slot holds whatever was there before
      return static_cast<const ncclNet_v11_t*>(table_)->init(&ctx_, gNextCommId++, &config,
                                                             captureLogger, nullptr);
    }
    case 10:
      return static_cast<const ncclNet_v10_t*>(table_)->init(captureLogger, nullptr);
    case 9:
      return static_cast<const ncclNet_v9_t*>(table_)->init(captureLogger);
    default:
      return static_cast<const ncclNet_v8_t*>(table_)->init(captureLogger);
  }
}

ncclResult_t NetPlugin::finalize() {
  if (version_ < 11) return ncclSuccess;
  ncclResult_t r = static_cast<const ncclNet_v11_t*>(table_)->finalize(ctx_);
  ctx_ = nullptr;
  return r;
}

ncclResult_t NetPlugin::devices(int* ndev) {
  return MK_CALL(devices, ndev);
}

ncclResult_t NetPlugin::properties(int dev, Props* out) {
  *out = Props();
  ncclResult_t r;
  switch (version_) {
    case 12: {
      ncclNetProperties_v12_t p;
      poison(&p);
      r = static_cast<const ncclNet_v12_t*>(table_)->getProperties(dev, &p);
      copyV9(p, out);
      out->maxMultiRequestSize = p.maxMultiRequestSize;
      out->railId = p.railId;
      out->planeId = p.planeId;
      break;
    }
    case 11: {
      ncclNetProperties_v11_t p;
      poison(&p);
      r = static_cast<const ncclNet_v11_t*>(table_)->getProperties(dev, &p);
      copyV9(p, out);
      out->maxMultiRequestSize = p.maxMultiRequestSize;
      break;
    }
    case 10: {
      ncclNetProperties_v10_t p;
      poison(&p);
      r = static_cast<const ncclNet_v10_t*>(table_)->getProperties(dev, &p);
      copyV9(p, out);
      break;
    }
    case 9: {
      ncclNetProperties_v9_t p;
      poison(&p);
      r = static_cast<const ncclNet_v9_t*>(table_)->getProperties(dev, &p);
      copyV9(p, out);
      break;
    }
    default: {
      ncclNetProperties_v8_t p;
      poison(&p);
      r = static_cast<const ncclNet_v8_t*>(table_)->getProperties(dev, &p);
      copyBase(p, out);
      break;
    }
  }
  return r;
}

ncclResult_t NetPlugin::listen(int dev, void* handle, void** listenComm) {
  switch (version_) {
    case 12:
    case 11:
      return static_cast<const ncclNet_v11_t*>(table_)->listen(ctx_, dev, handle, listenComm);
    case 10:
      return static_cast<const ncclNet_v10_t*>(table_)->listen(dev, handle, listenComm);
    case 9:
      return static_cast<const ncclNet_v9_t*>(table_)->listen(dev, handle, listenComm);
    default:
      return static_cast<const ncclNet_v8_t*>(table_)->listen(dev, handle, listenComm);
  }
}

ncclResult_t NetPlugin::connect(int dev, void* handle, void** sendComm, void** devCommSeen) {
  // NCCL passes the address of its device-handle pointer; the plugin must leave it NULL (HOST).
  ncclNetDeviceHandle_v11_t* devComm = reinterpret_cast<ncclNetDeviceHandle_v11_t*>(0x2);
  ncclResult_t r;
  switch (version_) {
    case 12:
    case 11:
      r = static_cast<const ncclNet_v11_t*>(table_)->connect(ctx_, dev, handle, sendComm, &devComm);
      break;
    case 10: {
      ncclNetCommConfig_v10_t config{kNcclNetTrafficClassUndef};
      r = static_cast<const ncclNet_v10_t*>(table_)->connect(dev, &config, handle, sendComm,
                                                             &devComm);
      break;
    }
    case 9:
      r = static_cast<const ncclNet_v9_t*>(table_)->connect(dev, handle, sendComm, &devComm);
      break;
    default:
      r = static_cast<const ncclNet_v8_t*>(table_)->connect(dev, handle, sendComm, &devComm);
      break;
  }
  if (devCommSeen != nullptr) *devCommSeen = devComm;
  return r;
}

ncclResult_t NetPlugin::accept(void* listenComm, void** recvComm, void** devCommSeen) {
  ncclNetDeviceHandle_v11_t* devComm = reinterpret_cast<ncclNetDeviceHandle_v11_t*>(0x2);
  ncclResult_t r = MK_CALL(accept, listenComm, recvComm, &devComm);
  if (devCommSeen != nullptr) *devCommSeen = devComm;
  return r;
}

ncclResult_t NetPlugin::regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return MK_CALL(regMr, comm, data, size, type, mhandle);
}

ncclResult_t NetPlugin::deregMr(void* comm, void* mhandle) {
  return MK_CALL(deregMr, comm, mhandle);
}

ncclResult_t NetPlugin::isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                              void** request) {
  switch (version_) {
    case 12:
    case 11:
      return static_cast<const ncclNet_v11_t*>(table_)->isend(sendComm, data, size, tag, mhandle,
                                                              nullptr, request);
    case 10:
      return static_cast<const ncclNet_v10_t*>(table_)->isend(sendComm, data, size, tag, mhandle,
                                                              nullptr, request);
    case 9:
      return static_cast<const ncclNet_v9_t*>(table_)->isend(sendComm, data, size, tag, mhandle,
                                                             request);
    default:
      return static_cast<const ncclNet_v8_t*>(table_)->isend(sendComm, data, static_cast<int>(size),
                                                             tag, mhandle, request);
  }
}

ncclResult_t NetPlugin::irecv(void* recvComm, int n, void** data, const size_t* sizes,
                              const int* tags, void** mhandles, void** request) {
  std::vector<size_t> wide(sizes, sizes + (n > 0 ? n : 0));
  std::vector<int> narrow(wide.begin(), wide.end());
  std::vector<int> tagCopy(tags, tags + (n > 0 ? n : 0));
  void* phandles[16] = {};
  switch (version_) {
    case 12:
    case 11:
      return static_cast<const ncclNet_v11_t*>(table_)->irecv(
          recvComm, n, data, wide.data(), tagCopy.data(), mhandles, phandles, request);
    case 10:
      return static_cast<const ncclNet_v10_t*>(table_)->irecv(
          recvComm, n, data, wide.data(), tagCopy.data(), mhandles, phandles, request);
    case 9:
      return static_cast<const ncclNet_v9_t*>(table_)->irecv(recvComm, n, data, wide.data(),
                                                             tagCopy.data(), mhandles, request);
    default:
      return static_cast<const ncclNet_v8_t*>(table_)->irecv(recvComm, n, data, narrow.data(),
                                                             tagCopy.data(), mhandles, request);
  }
}

ncclResult_t NetPlugin::iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                               void** request) {
  return MK_CALL(iflush, recvComm, n, data, sizes, mhandles, request);
}

ncclResult_t NetPlugin::test(void* request, int* done, int* sizes) {
  return MK_CALL(test, request, done, sizes);
}
ncclResult_t NetPlugin::closeSend(void* comm) {
  return MK_CALL(closeSend, comm);
}
ncclResult_t NetPlugin::closeRecv(void* comm) {
  return MK_CALL(closeRecv, comm);
}
ncclResult_t NetPlugin::closeListen(void* comm) {
  return MK_CALL(closeListen, comm);
}
ncclResult_t NetPlugin::irecvConsumed(void* recvComm, int n, void* request) {
  return MK_CALL(irecvConsumed, recvComm, n, request);
}

#undef MK_CALL

std::string connectPair(NetPlugin& p, int dev, size_t bytes, Connection* c) {
  char handle[kNcclNetHandleMaxSize] = {};
  void* listenComm = nullptr;
  if (p.listen(dev, handle, &listenComm) != ncclSuccess || listenComm == nullptr)
    return "listen failed";
  auto start = Clock::now();
  int connectCalls = 0, acceptCalls = 0;
  while (c->sendComm == nullptr || c->recvComm == nullptr) {
    void* devComm = nullptr;
    if (c->sendComm == nullptr) {
      ++connectCalls;
      if (p.connect(dev, handle, &c->sendComm, &devComm) != ncclSuccess) return "connect failed";
      if (devComm != nullptr) return "connect left the device handle set";
    }
    if (c->recvComm == nullptr) {
      ++acceptCalls;
      if (p.accept(listenComm, &c->recvComm, &devComm) != ncclSuccess) return "accept failed";
      if (devComm != nullptr) return "accept left the device handle set";
      if (c->recvComm != nullptr && p.closeListen(listenComm) != ncclSuccess)
        return "closeListen failed";
    }
    if (secondsSince(start) > 20)
      return "connect/accept did not finish in 20 s (" + std::to_string(connectCalls) +
             " connect, " + std::to_string(acceptCalls) + " accept calls)";
  }
  c->sendBuf.assign(bytes, 0);
  c->recvBuf.assign(bytes, 0);
  if (p.regMr(c->sendComm, c->sendBuf.data(), bytes, kNcclPtrHost, &c->sendMr) != ncclSuccess)
    return "regMr(send) failed";
  if (p.regMr(c->recvComm, c->recvBuf.data(), bytes, kNcclPtrHost, &c->recvMr) != ncclSuccess)
    return "regMr(recv) failed";
  return "";
}

std::string closePair(NetPlugin& p, Connection* c) {
  std::string err;
  if (c->sendMr != nullptr && p.deregMr(c->sendComm, c->sendMr) != ncclSuccess)
    err += "deregMr(send) ";
  if (c->recvMr != nullptr && p.deregMr(c->recvComm, c->recvMr) != ncclSuccess)
    err += "deregMr(recv) ";
  if (c->sendComm != nullptr && p.closeSend(c->sendComm) != ncclSuccess) err += "closeSend ";
  if (c->recvComm != nullptr && p.closeRecv(c->recvComm) != ncclSuccess) err += "closeRecv ";
  *c = Connection();
  return err;
}

ncclResult_t waitRequest(NetPlugin& p, void* request, int* sizes, double seconds, bool* done) {
  auto start = Clock::now();
  *done = false;
  while (true) {
    int d = -1;
    ncclResult_t r = p.test(request, &d, sizes);
    if (d != 0 && d != 1) return ncclInternalError;  // test must always write *done
    if (r != ncclSuccess || d == 1) {
      *done = d == 1;
      return r;
    }
    if (secondsSince(start) > seconds) return ncclSuccess;
  }
}

ncclResult_t postSend(NetPlugin& p, void* comm, void* data, size_t size, int tag, void* mh,
                      void** request, double seconds) {
  auto start = Clock::now();
  while (true) {
    *request = reinterpret_cast<void*>(0x3);  // a stale slot: isend must overwrite it
    ncclResult_t r = p.isend(comm, data, size, tag, mh, request);
    if (r != ncclSuccess || *request != nullptr || secondsSince(start) > seconds) return r;
  }
}

ncclResult_t postRecv(NetPlugin& p, void* comm, int n, void** data, const size_t* sizes,
                      const int* tags, void** mhs, void** request, double seconds) {
  auto start = Clock::now();
  while (true) {
    *request = reinterpret_cast<void*>(0x3);
    ncclResult_t r = p.irecv(comm, n, data, sizes, tags, mhs, request);
    if (r != ncclSuccess || *request != nullptr || secondsSince(start) > seconds) return r;
  }
}

void fillPattern(unsigned char* p, size_t n, uint32_t seed) {
  // xorshift64, 8 bytes a step: 64 MiB patterns must not dominate the test's time.
  uint64_t x = (uint64_t(seed) + 1) * 0x9E3779B97F4A7C15ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(x >> (8 * (i % 8)));
}

size_t checkPattern(const unsigned char* p, size_t n, uint32_t seed) {
  std::vector<unsigned char> want(n);
  fillPattern(want.data(), n, seed);
  if (n == 0 || std::memcmp(p, want.data(), n) == 0) return SIZE_MAX;
  for (size_t i = 0; i < n; ++i)
    if (p[i] != want[i]) return i;
  return SIZE_MAX;
}

int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

}  // namespace mktest
