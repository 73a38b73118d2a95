// mkernel-freeprobe: which CUDA runtime calls of one host thread wait while another thread's free
// (or other teardown call) waits for a kernel that itself waits for the host?
//
// Thread-emulated ranks (MKERNEL_EMULATE=1, several ranks of one process on one GPU) have kernels
// that wait for each other: rank 1's kernel waits until rank 0's thread posts its part. If a third
// thread then tears a communicator down with a call that waits for the whole device (cudaFree
// does), that call waits for rank 1's kernel; if rank 0's thread is held back by the pending call,
// the three wait for each other until the kernel's timeout (docs/RELIABILITY.md, the
// split-communicator stall).
//
// Each trial: a one-thread kernel spins on a host-mapped word (it stands for rank 1's kernel);
// 50 ms later thread B starts the teardown call (the "blocker"); 100 ms after that thread C makes
// the "victim" call and times it; at 1,000 ms the main thread sets the word and the kernel ends.
// A victim that took about 850 ms waited for the kernel through the blocker (or by itself: the
// "none" blocker row). The blocker's own time says whether it waits for the kernel at all.
// Prints one table row per (blocker, victim): both times in ms and "WAITS" where the victim waited.
// The cudaIpcCloseMemHandle blocker (what a process rank's release does with its peers' memory)
// closes memory that a child process exports; the child is forked before this process starts CUDA.
//   mkernel-freeprobe [--blockers none,cudaFree,...] [--victims none,cudaMalloc,...] [--hold-ms
//   1000]
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "tools/cli.h"
#include "tools/dev/probe_util.cuh"

namespace {

using mktools::globalNs;

// Waits until the host sets *word, or gives up after timeoutNs (the probe must never hang).
__global__ void spin(const volatile unsigned* word, unsigned long long timeoutNs,
                     unsigned* gaveUp) {
  const unsigned long long t0 = globalNs();
  while (*word == 0) {
    if (globalNs() - t0 > timeoutNs) {
      *gaveUp = 1;
      return;
    }
  }
}

__global__ void empty() {}

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// A virtual-memory allocation (cuMemCreate/cuMemMap), freed with cuMemUnmap/cuMemRelease.
struct VmmBuf {
  CUdeviceptr va = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle h = 0;
};
VmmBuf vmmAlloc(size_t want) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  FP_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  VmmBuf b;
  b.size = (want + gran - 1) / gran * gran;
  FP_CU(cuMemCreate(&b.h, b.size, &prop, 0));
  FP_CU(cuMemAddressReserve(&b.va, b.size, 0, 0, 0));
  FP_CU(cuMemMap(b.va, b.size, 0, b.h, 0));
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  FP_CU(cuMemSetAccess(b.va, b.size, &acc, 1));
  return b;
}
void vmmFree(VmmBuf& b) {
  FP_CU(cuMemUnmap(b.va, b.size));
  FP_CU(cuMemRelease(b.h));
  FP_CU(cuMemAddressFree(b.va, b.size));
}

// What a trial's calls use, made before the kernel starts (so that making them waits for nothing).
struct Prepared {
  void* dev = nullptr;         // cudaFree
  void* pinned = nullptr;      // cudaFreeHost
  void* registered = nullptr;  // cudaHostUnregister (then free())
  void* poolBuf = nullptr;     // cudaFreeAsync
  VmmBuf vmm;                  // cuMemUnmap/cuMemRelease
  void* ipcPeer = nullptr;     // cudaIpcCloseMemHandle: another process's buffer, opened here
  cudaStream_t blockerStream = nullptr;
  cudaStream_t victimStream = nullptr;
  cudaEvent_t event = nullptr;
  void* victimDev = nullptr;     // the cudaMalloc victim's
  void* victimBuf = nullptr;     // 4 KiB of device memory the victims copy and set
  void* victimPinned = nullptr;  // 4 KiB mapped host memory
  void* victimHost = nullptr;    // the cudaHostAlloc victim's
  std::vector<char> pageable = std::vector<char>(256, 1);
};

// The cudaIpcCloseMemHandle blocker needs memory of another process (a process cannot open its own
// handle), as process ranks map their peers' state and staging: a child forked before this
// process starts CUDA exports 1 MiB and keeps it until `done` is closed.
struct Exporter {
  pid_t pid = -1;
  int done = -1;  // closing it ends the child
  cudaIpcMemHandle_t handle{};
  bool ok = false;
};
Exporter startExporter() {
  Exporter e;
  int toParent[2], toChild[2];
  if (pipe(toParent) != 0 || pipe(toChild) != 0) return e;
  e.pid = fork();
  if (e.pid == 0) {
    close(toParent[0]);
    close(toChild[1]);
    void* buf = nullptr;
    cudaIpcMemHandle_t h{};
    const bool ok = cudaSetDevice(0) == cudaSuccess && cudaMalloc(&buf, 1 << 20) == cudaSuccess &&
                    cudaIpcGetMemHandle(&h, buf) == cudaSuccess;
    if (ok && write(toParent[1], &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h))) {
      char c;
      while (read(toChild[0], &c, 1) > 0) {
      }
    }
    _exit(ok ? 0 : 3);
  }
  close(toParent[1]);
  close(toChild[0]);
  e.done = toChild[1];
  size_t got = 0;
  auto* bytes = reinterpret_cast<char*>(&e.handle);
  while (e.pid > 0 && got < sizeof(e.handle)) {
    const ssize_t n = read(toParent[0], bytes + got, sizeof(e.handle) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(toParent[0]);
  e.ok = e.pid > 0 && got == sizeof(e.handle);
  return e;
}
void stopExporter(Exporter& e) {
  if (e.done >= 0) close(e.done);
  if (e.pid > 0) waitpid(e.pid, nullptr, 0);
  e = Exporter{};
}

struct Call {
  const char* name;
  const char* what;
  std::function<void(Prepared&)> run;
};

const std::vector<Call>& blockers() {
  static const std::vector<Call> v = {
      {"none", "nothing", [](Prepared&) {}},
      {"cudaFree", "cudaFree of a 1 MiB cudaMalloc buffer",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaFree(p.dev));
         p.dev = nullptr;
       }},
      {"cudaFreeHost", "cudaFreeHost of 64 KiB from cudaHostAlloc(mapped)",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaFreeHost(p.pinned));
         p.pinned = nullptr;
       }},
      {"cudaHostUnregister",
       "cudaHostUnregister of 64 KiB registered with cudaHostRegister(mapped)",
       [](Prepared& p) { MK_CUDA_OR_EXIT(cudaHostUnregister(p.registered)); }},
      {"cudaFreeAsync", "cudaFreeAsync of a 1 MiB cudaMallocAsync buffer on a non-blocking stream",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaFreeAsync(p.poolBuf, p.blockerStream));
         p.poolBuf = nullptr;
       }},
      {"cuMemRelease", "cuMemUnmap + cuMemRelease + cuMemAddressFree of a cuMemCreate mapping",
       [](Prepared& p) {
         vmmFree(p.vmm);
         p.vmm = VmmBuf{};
       }},
      {"cudaIpcCloseMemHandle",
       "cudaIpcCloseMemHandle of 1 MiB of another process (cudaMalloc there)",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaIpcCloseMemHandle(p.ipcPeer));
         p.ipcPeer = nullptr;
       }},
      {"cudaStreamDestroy", "cudaStreamDestroy of an idle non-blocking stream",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaStreamDestroy(p.blockerStream));
         p.blockerStream = nullptr;
       }},
      {"cudaDeviceSynchronize", "cudaDeviceSynchronize",
       [](Prepared&) { MK_CUDA_OR_EXIT(cudaDeviceSynchronize()); }},
      {"legacySync", "cudaStreamSynchronize(cudaStreamLegacy)",
       [](Prepared&) { MK_CUDA_OR_EXIT(cudaStreamSynchronize(cudaStreamLegacy)); }},
  };
  return v;
}

const std::vector<Call>& victims() {
  static const std::vector<Call> v = {
      {"none", "nothing", [](Prepared&) {}},
      {"cudaMalloc", "cudaMalloc(256 B)",
       [](Prepared& p) { MK_CUDA_OR_EXIT(cudaMalloc(&p.victimDev, 256)); }},
      {"memcpyPageable", "cudaMemcpy of 256 B host to device from pageable memory (legacy stream)",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaMemcpy(p.victimBuf, p.pageable.data(), 256, cudaMemcpyHostToDevice));
       }},
      {"memcpyAsyncSync",
       "cudaMemcpyAsync 256 B pinned to device on a non-blocking stream, then its sync",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaMemcpyAsync(p.victimBuf, p.victimPinned, 256, cudaMemcpyHostToDevice,
                                         p.victimStream));
         MK_CUDA_OR_EXIT(cudaStreamSynchronize(p.victimStream));
       }},
      {"launch", "an empty kernel launched on a non-blocking stream (the call alone)",
       [](Prepared& p) {
         empty<<<1, 32, 0, p.victimStream>>>();
         MK_CUDA_OR_EXIT(cudaGetLastError());
       }},
      {"launchSync", "an empty kernel on a non-blocking stream, then that stream's sync",
       [](Prepared& p) {
         empty<<<1, 32, 0, p.victimStream>>>();
         MK_CUDA_OR_EXIT(cudaStreamSynchronize(p.victimStream));
       }},
      {"streamCreate", "cudaStreamCreateWithFlags(non-blocking)",
       [](Prepared&) {
         cudaStream_t s;
         MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
         MK_CUDA_OR_EXIT(cudaStreamDestroy(s));
       }},
      {"eventRecord", "cudaEventRecord on a non-blocking stream",
       [](Prepared& p) { MK_CUDA_OR_EXIT(cudaEventRecord(p.event, p.victimStream)); }},
      {"hostAlloc", "cudaHostAlloc(4 KiB, mapped)",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaHostAlloc(&p.victimHost, 4096, cudaHostAllocMapped));
       }},
      {"memsetLegacy", "cudaMemset (legacy stream) of 256 B, then the legacy stream's sync",
       [](Prepared& p) {
         MK_CUDA_OR_EXIT(cudaMemset(p.victimBuf, 0, 256));
         MK_CUDA_OR_EXIT(cudaStreamSynchronize(cudaStreamLegacy));
       }},
  };
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> wantB, wantV;
  double holdMs = 1000;
  CLI::App app(
      "Which CUDA calls of one thread wait while another thread's free (cudaFree, cudaFreeHost, "
      "...)\n"
      "waits for a kernel that itself waits for the host. One row per (blocker, victim).",
      "mkernel-freeprobe");
  mktools::setupApp(app);
  mktools::listOf(app.add_option("--blockers", wantB, "the teardown calls to try (default: all)"))
      ->type_name("none,cudaFree,...");
  mktools::listOf(
      app.add_option("--victims", wantV, "the calls timed while a blocker waits (default: all)"))
      ->type_name("none,cudaMalloc,...");
  app.add_option("--hold-ms", holdMs, "how long the kernel spins, ms")
      ->check(mktools::kPositiveReal)
      ->capture_default_str();
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  auto picked = [](const std::vector<std::string>& want, const char* name) {
    if (want.empty()) return true;
    for (const std::string& w : want)
      if (w == name) return true;
    return false;
  };
  // Before this process touches CUDA: a forked child must start its own.
  Exporter exporter;
  if (picked(wantB, "cudaIpcCloseMemHandle")) {
    exporter = startExporter();
    if (!exporter.ok)
      std::fprintf(stderr,
                   "mkernel-freeprobe: no exporter process: cudaIpcCloseMemHandle skipped\n");
  }
  MK_CUDA_OR_EXIT(cudaSetDevice(0));
  FP_CU(cuInit(0));
  MK_CUDA_OR_EXIT(cudaFree(nullptr));
  unsigned* word = nullptr;
  unsigned* gaveUp = nullptr;
  MK_CUDA_OR_EXIT(cudaHostAlloc(reinterpret_cast<void**>(&word), 64, cudaHostAllocMapped));
  MK_CUDA_OR_EXIT(cudaHostAlloc(reinterpret_cast<void**>(&gaveUp), 64, cudaHostAllocMapped));
  cudaStream_t kernelStream;
  MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&kernelStream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  MK_CUDA_OR_EXIT(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  MK_CUDA_OR_EXIT(cudaDriverGetVersion(&driver));
  std::printf(
      "# mkernel-freeprobe: %s, driver %d.%d; a kernel waits for the host for %.0f ms; the blocker "
      "starts at "
      "50 ms, the victim at 150 ms; WAITS: the victim returned after the kernel ended\n",
      prop.name, driver / 1000, driver % 1000 / 10, holdMs);
  std::printf("| blocker | victim | blocker ms | victim ms | victim |\n|---|---|---|---|---|\n");
  int waits = 0;
  for (const Call& b : blockers()) {
    if (!picked(wantB, b.name)) continue;
    const bool ipc = std::strcmp(b.name, "cudaIpcCloseMemHandle") == 0;
    if (ipc && !exporter.ok) continue;
    for (const Call& v : victims()) {
      if (!picked(wantV, v.name)) continue;
      if (std::strcmp(b.name, "none") == 0 && std::strcmp(v.name, "none") == 0) continue;
      Prepared p;
      MK_CUDA_OR_EXIT(cudaMalloc(&p.dev, 1 << 20));
      MK_CUDA_OR_EXIT(cudaHostAlloc(&p.pinned, 65536, cudaHostAllocMapped));
      p.registered = std::aligned_alloc(4096, 65536);
      MK_CUDA_OR_EXIT(cudaHostRegister(p.registered, 65536, cudaHostRegisterMapped));
      MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&p.blockerStream, cudaStreamNonBlocking));
      MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&p.victimStream, cudaStreamNonBlocking));
      MK_CUDA_OR_EXIT(cudaMallocAsync(&p.poolBuf, 1 << 20, p.blockerStream));
      MK_CUDA_OR_EXIT(cudaStreamSynchronize(p.blockerStream));
      p.vmm = vmmAlloc(1 << 20);
      if (ipc)
        MK_CUDA_OR_EXIT(
            cudaIpcOpenMemHandle(&p.ipcPeer, exporter.handle, cudaIpcMemLazyEnablePeerAccess));
      MK_CUDA_OR_EXIT(cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming));
      MK_CUDA_OR_EXIT(cudaHostAlloc(&p.victimPinned, 4096, cudaHostAllocMapped));
      MK_CUDA_OR_EXIT(cudaMalloc(&p.victimBuf, 4096));
      MK_CUDA_OR_EXIT(cudaDeviceSynchronize());
      *word = 0;
      *gaveUp = 0;
      const unsigned long long timeoutNs = static_cast<unsigned long long>((holdMs + 5000) * 1e6);
      unsigned* devWord = nullptr;
      unsigned* devGave = nullptr;
      MK_CUDA_OR_EXIT(cudaHostGetDevicePointer(reinterpret_cast<void**>(&devWord), word, 0));
      MK_CUDA_OR_EXIT(cudaHostGetDevicePointer(reinterpret_cast<void**>(&devGave), gaveUp, 0));
      const Clock::time_point t0 = Clock::now();
      spin<<<1, 1, 0, kernelStream>>>(devWord, timeoutNs, devGave);
      MK_CUDA_OR_EXIT(cudaGetLastError());
      double bMs = 0, vMs = 0, bEnd = 0, vEnd = 0;
      // A thread that makes call c at atMs after the kernel's launch: its time, and when it ended.
      auto timedAt = [&](int atMs, const Call& c, double* ms, double* end) {
        return std::thread([&p, &c, t0, atMs, ms, end] {
          std::this_thread::sleep_until(t0 + std::chrono::milliseconds(atMs));
          cudaSetDevice(0);
          const Clock::time_point s = Clock::now();
          c.run(p);
          *ms = msSince(s);
          *end = msSince(t0);
        });
      };
      std::thread tb = timedAt(50, b, &bMs, &bEnd);
      std::thread tv = timedAt(150, v, &vMs, &vEnd);
      std::this_thread::sleep_until(
          t0 + std::chrono::microseconds(static_cast<long long>(holdMs * 1000)));
      __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST);
      tb.join();
      tv.join();
      MK_CUDA_OR_EXIT(cudaStreamSynchronize(kernelStream));
      if (*gaveUp != 0)
        std::fprintf(stderr, "mkernel-freeprobe: the kernel timed out (%s, %s)\n", b.name, v.name);
      const bool waited = vEnd >= holdMs - 1.0 && vMs > 0.5 * (holdMs - 150);
      waits += waited ? 1 : 0;
      std::printf("| %s | %s | %.1f | %.1f | %s |\n", b.name, v.name, bMs, vMs,
                  waited ? "WAITS" : "free");
      std::fflush(stdout);
      MK_CUDA_OR_EXIT(cudaDeviceSynchronize());
      if (p.dev) MK_CUDA_OR_EXIT(cudaFree(p.dev));
      if (p.pinned) MK_CUDA_OR_EXIT(cudaFreeHost(p.pinned));
      if (std::strcmp(b.name, "cudaHostUnregister") != 0)
        MK_CUDA_OR_EXIT(cudaHostUnregister(p.registered));
      std::free(p.registered);
      if (p.poolBuf) MK_CUDA_OR_EXIT(cudaFreeAsync(p.poolBuf, p.blockerStream));
      if (p.blockerStream) {
        MK_CUDA_OR_EXIT(cudaStreamSynchronize(p.blockerStream));
        MK_CUDA_OR_EXIT(cudaStreamDestroy(p.blockerStream));
      }
      MK_CUDA_OR_EXIT(cudaStreamDestroy(p.victimStream));
      if (p.vmm.va) vmmFree(p.vmm);
      if (p.ipcPeer) MK_CUDA_OR_EXIT(cudaIpcCloseMemHandle(p.ipcPeer));
      MK_CUDA_OR_EXIT(cudaEventDestroy(p.event));
      MK_CUDA_OR_EXIT(cudaFreeHost(p.victimPinned));
      if (p.victimDev) MK_CUDA_OR_EXIT(cudaFree(p.victimDev));
      if (p.victimHost) MK_CUDA_OR_EXIT(cudaFreeHost(p.victimHost));
      MK_CUDA_OR_EXIT(cudaFree(p.victimBuf));
    }
  }
  stopExporter(exporter);
  std::printf("# %d pair(s) where the victim waited for the kernel\n", waits);
  for (const Call& b : blockers()) std::printf("#   blocker %-22s %s\n", b.name, b.what);
  for (const Call& v : victims()) std::printf("#   victim  %-22s %s\n", v.name, v.what);
  return 0;
}
