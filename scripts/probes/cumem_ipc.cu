// Session 36's probe: does cuMem memory shared through a POSIX file descriptor (the way NCCL shares
// it, and the way collectives/peer_memory.cc now maps process ranks' staging memory) work on this
// machine, with and without CUDA MPS, and does unmapping such an imported mapping hold back other
// threads' CUDA calls while a kernel waits (cudaIpcCloseMemHandle does: docs/RELIABILITY.md)?
// Not part of the build. On the device machine:
//   nvcc -arch=sm_90 -O2 -std=c++17 -o cip scripts/probes/cumem_ipc.cu -lcuda && ./cip
// A forked child allocates 2 MiB with cuMemCreate (POSIX-FD handle type), fills it, and sends the
// exported descriptor over a Unix socket pair (SCM_RIGHTS). The parent imports and maps it, checks
// the contents with a copy, then launches a kernel that spins 500 ms; while it spins, thread A
// unmaps the import (cuMemUnmap + cuMemAddressFree) and thread B records an event 50 ms later.
// Printed: each step's result, and how long A's unmap and B's record took.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    CUresult r_ = (x);                                                         \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char* s_ = nullptr;                                                \
      cuGetErrorString(r_, &s_);                                               \
      std::printf("FAIL %s: %d %s\n", #x, static_cast<int>(r_), s_ ? s_ : ""); \
      std::fflush(stdout);                                                     \
      _exit(1);                                                                \
    }                                                                          \
  } while (0)

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static double msSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

static void sendFd(int sock, int fd, uint64_t size) {
  char ctl[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&size, sizeof(size)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(sock, &msg, 0) != static_cast<ssize_t>(sizeof(size))) std::printf("FAIL sendmsg\n");
}

static int recvFd(int sock, uint64_t* size) {
  char ctl[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{size, sizeof(*size)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  if (recvmsg(sock, &msg, 0) != static_cast<ssize_t>(sizeof(*size))) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

int main() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  const size_t want = 2u << 20;
  pid_t child = fork();
  if (child == 0) {
    close(sv[0]);
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t size = (want + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, size, &prop, 0));
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, size, gran, 0, 0));
    CK(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(va, size, &acc, 1));
    CK(cuMemsetD32(va, 0xC0FFEE01u, size / 4));
    CK(cuCtxSynchronize());
    int fd = -1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    sendFd(sv[1], fd, size);
    close(fd);
    // The exporter lets its own handle and mapping go at once: the importer's keeps the memory.
    CK(cuMemUnmap(va, size));
    CK(cuMemAddressFree(va, size));
    CK(cuMemRelease(h));
    std::printf("child: exported %zu bytes (granularity %zu), released its own handle and mapping\n", size, gran);
    std::fflush(stdout);
    char done = 0;
    (void)!read(sv[1], &done, 1);  // until the parent has finished
    _exit(0);
  }
  close(sv[1]);
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  cudaSetDevice(0);
  cudaFree(nullptr);
  uint64_t size = 0;
  const int fd = recvFd(sv[0], &size);
  if (fd < 0) {
    std::printf("FAIL: no descriptor from the child\n");
    return 1;
  }
  CUmemGenericAllocationHandle h;
  CK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CK(cuMemMap(va, size, 0, h, 0));
  CK(cuMemRelease(h));  // the mapping keeps it
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, size, &acc, 1));
  std::vector<uint32_t> host(size / 4);
  if (cudaMemcpy(host.data(), reinterpret_cast<void*>(va), size, cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("FAIL: copy from the import: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  size_t bad = 0;
  for (uint32_t v : host) bad += v != 0xC0FFEE01u;
  std::printf("parent: imported %llu bytes after the exporter released its handle; %zu words wrong\n",
              static_cast<unsigned long long>(size), bad);
  // The unmap while a kernel spins.
  int clockKhz = 0;
  cudaDeviceGetAttribute(&clockKhz, cudaDevAttrClockRate, 0);
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  const auto t0 = std::chrono::steady_clock::now();
  spin<<<1, 1, 0, s1>>>(static_cast<long long>(clockKhz) * 500);  // ~500 ms
  double unmapMs = -1, recordMs = -1, kernelMs = -1;
  std::thread a([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t = std::chrono::steady_clock::now();
    CK(cuMemUnmap(va, size));
    CK(cuMemAddressFree(va, size));
    unmapMs = msSince(t);
  });
  std::thread b([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto t = std::chrono::steady_clock::now();
    cudaEventRecord(ev, s2);
    recordMs = msSince(t);
  });
  a.join();
  b.join();
  cudaStreamSynchronize(s1);
  kernelMs = msSince(t0);
  std::printf("parent: kernel %.1f ms; unmap+addressFree of the import %.2f ms; another thread's event record %.2f ms\n",
              kernelMs, unmapMs, recordMs);
  std::printf("%s\n", bad == 0 && unmapMs < 50 && recordMs < 50 ? "RESULT ok: the import works and its unmap waits for nothing"
                                                                 : "RESULT see above");
  char done = 1;
  (void)!write(sv[0], &done, 1);
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}
