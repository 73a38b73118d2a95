// Drives the built library's ncclNetPlugin_v12/_v11/_v10/_v9/_v8 tables the way NCCL's proxy does:
// dlopen the .so, dlsym the table, call through its function pointers. One version-neutral
// wrapper (NetPlugin) so that every test body runs against every ABI version.
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "plugin/abi/net_v10.h"
#include "plugin/abi/net_v12.h"
#include "plugin/abi/net_v8.h"
#include "plugin/abi/net_v9.h"

namespace mktest {

constexpr int kVersions[] = {12, 11, 10, 9, 8};

// The library NCCL would load: <build>/lib/libnccl-net-mkernel.so.
std::string netPluginPath();
// dlopen(RTLD_NOW|RTLD_LOCAL) of netPluginPath(), once per process; FAILs the test if it cannot.
void* pluginLibrary();
// Sets what the tests need before the plugin creates its backend: loopback for TCP.
void prepareTestEnvironment();

// Every member of any version's properties, in one struct. Members a version lacks keep the
// marker values below so a test can tell "absent" from "wrong".
struct Props {
  const char* name = nullptr;
  const char* pciPath = nullptr;
  uint64_t guid = 0;
  int ptrSupport = 0, regIsGlobal = 0, forceFlush = -1, speed = 0, port = 0;
  float latency = 0;
  int maxComms = 0, maxRecvs = 0, netDeviceType = -1, netDeviceVersion = -1;
  int vNdevs = -1, vDev0 = -1;
  size_t maxP2pBytes = 0, maxCollBytes = 0;
  int maxMultiRequestSize = -1;
  int railId = 0, planeId = 0;  // v12 only
};

// Log lines NCCL's logger would have received from the plugin.
struct CapturedLog {
  int level;
  unsigned long flags;
  std::string text;
};
std::vector<CapturedLog> capturedLog();
void clearCapturedLog();

class NetPlugin {
 public:
  explicit NetPlugin(int version);  // dlsym's ncclNetPlugin_v<version>
  int version() const { return version_; }
  const char* name() const;
  const void* rawTable() const { return table_; }

  // init as NCCL does for one communicator (v11: with a fresh context; v8-v10: the process-wide
  // init), with a logger that records lines into capturedLog(). finalize: v11 only; else no-op.
  ncclResult_t init();
  ncclResult_t finalize();
  void* ctx() const { return ctx_; }

  ncclResult_t devices(int* ndev);
  // Fills the version's struct pre-poisoned with 0xA5 bytes, then converts it to Props.
  ncclResult_t properties(int dev, Props* out);

  ncclResult_t listen(int dev, void* handle, void** listenComm);
  ncclResult_t connect(int dev, void* handle, void** sendComm, void** devCommSeen);
  ncclResult_t accept(void* listenComm, void** recvComm, void** devCommSeen);
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t deregMr(void* comm, void* mhandle);
  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request);
  ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                     void** mhandles, void** request);
  ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request);
  ncclResult_t test(void* request, int* done, int* sizes);
  ncclResult_t closeSend(void* comm);
  ncclResult_t closeRecv(void* comm);
  ncclResult_t closeListen(void* comm);
  ncclResult_t irecvConsumed(void* recvComm, int n, void* request);

 private:
  int version_;
  const void* table_;
  void* ctx_ = nullptr;
};

// A connected pair on one device: listen, then connect/accept polled alternately (neither may
// block), listen comm closed right after accept as NCCL does. Empty comms on failure.
struct Connection {
  void* sendComm = nullptr;
  void* recvComm = nullptr;
  void* sendMr = nullptr;  // registrations of the two buffers below
  void* recvMr = nullptr;
  std::vector<unsigned char> sendBuf, recvBuf;
};
// Connects and registers `bytes`-sized host buffers on both sides. Returns "" or what failed.
std::string connectPair(NetPlugin& p, int dev, size_t bytes, Connection* c);
std::string closePair(NetPlugin& p, Connection* c);

// Polls test() until done, an error, or `seconds`. Returns the last result; *done says which.
ncclResult_t waitRequest(NetPlugin& p, void* request, int* sizes, double seconds, bool* done);
// Repeats isend/irecv while they report back-pressure (NULL request), for at most `seconds`.
// 30 s, like waitRequest's callers: on verbs a send waits for the receiver's clear-to-send, and
// in the Soft-RoCE VM (emulated CPUs) on a loaded 2-core host that can take more than 10 s
// (test_net_plugin_proc, v8 parent / v11 child).
ncclResult_t postSend(NetPlugin& p, void* comm, void* data, size_t size, int tag, void* mh,
                      void** request, double seconds = 30);
ncclResult_t postRecv(NetPlugin& p, void* comm, int n, void** data, const size_t* sizes,
                      const int* tags, void** mhs, void** request, double seconds = 30);

void fillPattern(unsigned char* p, size_t n, uint32_t seed);
// Index of the first byte that differs from the pattern, or SIZE_MAX when all match.
size_t checkPattern(const unsigned char* p, size_t n, uint32_t seed);

// Threads of this process (/proc/self/task).
int threadCount();

}  // namespace mktest
