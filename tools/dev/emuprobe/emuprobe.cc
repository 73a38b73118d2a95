// mkernel-emuprobe: the first collective of several thread ranks on one GPU, through the NCCL API
// of libmkernel.so, set up the way patched nccl-tests sets it up, with each of those ways of
// setting up switchable. Patched nccl-tests (-g 1 -t 4) stalls at its first collective in about
// half its runs while mkernel's own tests, set up differently, do not (docs/RELIABILITY.md); this
// finds which difference matters, without nccl-tests.
//
// One run = one process: the stall is at a process's first collectives. Per run:
//   1. the application's streams (non-blocking, made by the shared CUDA runtime, before the
//      communicators, as nccl-tests does);
//   2. the communicators: --init group (one thread, ncclCommInitRankConfig inside a group:
//      nccl-tests -p 0), all (ncclCommInitAll), threads (each rank thread its own: -p 1);
//   3. the buffers: --alloc nccl (the real NCCL's ncclMemAlloc: cuMem, what nccl-tests 2.19 gets
//      when libnccl is loaded), cuda (cudaMalloc);
//   4. every rank thread: cudaMemGetInfo, a barrier, then --iters collectives (--coll, --bytes)
//      on its stream, each followed by nccl-tests' wait: cudaStreamQuery and
//      ncclCommGetAsyncError in a loop, up to --timeout-s;
//   5. one line: passed, or which ranks' collectives did not finish.
// --data-init: before each collective, a cudaMemset of the send buffer on the legacy default
// stream and a wait for that stream (the patched nccl-tests' data setup).
// --alloc cumem: the buffers mapped as ncclMemAlloc maps them (cuMemCreate, cuMemAddressReserve,
// cuMemMap, cuMemSetAccess) but by this program, without the real NCCL loaded; cumem-gdr: also
// GPUDirect-RDMA capable where the device supports it, as ncclMemAlloc asks.
// --setenv VAR=VALUE (repeatable): set before anything else (e.g. NCCL_CUMEM_ENABLE=0, with which
// the real ncclMemAlloc falls back to cudaMalloc while NCCL is still loaded and initialized).
// --sync-after-alloc: the main thread waits for the whole device once the buffers are made.
// --flush: every rank thread, before the barrier, sets 4 bytes of its send buffer on its stream
// (cudaMemsetAsync) and waits for that stream: GPU work on each rank's stream after the buffers
// are mapped and before any collective.
// Exit status: 0 passed, 1 a collective did not finish or failed, 2 usage or setup error.
//   mkernel-emuprobe [--ranks 4] [--coll broadcast|allreduce|allgather|reducescatter|reduce]
//                    [--bytes 8] [--iters 2] [--init group|all|threads] [--alloc nccl|cuda|cumem]
//                    [--data-init] [--sync-after-alloc] [--flush] [--setenv VAR=VALUE] [--timeout-s
//                    10]
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tools/cli.h"

namespace {

struct Options {
  int ranks = 4;
  std::string coll = "broadcast";
  size_t bytes = 8;
  int iters = 2;
  std::string init = "group";
  std::string alloc = "nccl";
  bool dataInit = false;
  bool syncAfterAlloc = false;
  bool flush = false;
  double timeoutS = 10;
};

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen != gen_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

// The command line into *o (--setenv's variables are set as they are parsed). -1: run; otherwise
// the exit status (tools/cli.h).
int parse(int argc, char** argv, Options* o) {
  CLI::App app(
      "The first collective of several thread ranks on one GPU through libmkernel.so's NCCL API, "
      "set up as\n"
      "patched nccl-tests sets it up, each difference switchable. Exit status: 0 passed, 1 a "
      "collective did\n"
      "not finish or failed, 2 usage or setup error.",
      "mkernel-emuprobe");
  mktools::setupApp(app);
  app.add_option("--ranks", o->ranks, "thread ranks (1 to 64)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--coll", o->coll, "the collective")
      ->check(CLI::IsMember({"broadcast", "allreduce", "allgather", "reducescatter", "reduce"}))
      ->capture_default_str();
  app.add_option("--bytes", o->bytes, "size (K, M, G accepted; at least 4)")
      ->transform(mktools::kSize)
      ->check(CLI::Range(uint64_t(4), uint64_t(1) << 40).description(""))
      ->capture_default_str();
  app.add_option("--iters", o->iters, "collectives per rank")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--init", o->init, "how the communicators are made")
      ->check(CLI::IsMember({"group", "all", "threads"}))
      ->capture_default_str();
  app.add_option("--alloc", o->alloc, "how the buffers are allocated")
      ->check(CLI::IsMember({"nccl", "cuda", "cumem", "cumem-gdr"}))
      ->capture_default_str();
  app.add_flag("--data-init", o->dataInit, "fill the buffers before the collective");
  app.add_flag("--sync-after-alloc", o->syncAfterAlloc,
               "the main thread waits for the whole device once the buffers are made");
  app.add_flag("--flush", o->flush,
               "every rank sets 4 bytes of its send buffer on its stream and waits for it first");
  app.add_option("--setenv", "set VAR to VALUE before anything else (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("VAR=VALUE")
      ->each([](const std::string& kv) {
        const size_t eq = kv.find('=');
        setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
      })
      ->check([](const std::string& kv) {
        const size_t eq = kv.find('=');
        return eq == std::string::npos || eq == 0 ? "'" + kv + "': want VAR=VALUE" : std::string();
      });
  app.add_option("--timeout-s", o->timeoutS, "seconds a collective may take")
      ->check(mktools::kPositiveReal)
      ->capture_default_str();
  return mktools::parseArgs(app, argc, argv);
}

// The real NCCL's ncclMemAlloc (what nccl-tests calls when libnccl is loaded beside the shim).
using MemAllocFn = ncclResult_t (*)(void**, size_t);
MemAllocFn realMemAlloc(std::string* why) {
  const char* lib = std::getenv("MKERNEL_NCCL_LIBRARY");
  void* h = dlopen(lib != nullptr ? lib : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    *why = dlerror();
    return nullptr;
  }
  auto fn = reinterpret_cast<MemAllocFn>(dlsym(h, "ncclMemAlloc"));
  if (fn == nullptr) *why = "libnccl has no ncclMemAlloc";
  return fn;
}

// ncclMemAlloc's mapping, by this program (--alloc cumem): the driver's VMM calls through libcuda.
bool cuMemAlloc(void** out, size_t bytes, bool gdr) {
  static void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  auto get = [](const char* name) { return dlsym(h, name); };
  auto ctxGetDevice = reinterpret_cast<CUresult (*)(CUdevice*)>(get("cuCtxGetDevice"));
  auto granularity = reinterpret_cast<CUresult (*)(size_t*, const CUmemAllocationProp*,
                                                   CUmemAllocationGranularity_flags)>(
      get("cuMemGetAllocationGranularity"));
  auto create = reinterpret_cast<CUresult (*)(CUmemGenericAllocationHandle*, size_t,
                                              const CUmemAllocationProp*, unsigned long long)>(
      get("cuMemCreate"));
  auto reserve =
      reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
          get("cuMemAddressReserve"));
  auto map =
      reinterpret_cast<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                    unsigned long long)>(get("cuMemMap"));
  auto access = reinterpret_cast<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>(
      get("cuMemSetAccess"));
  if (!ctxGetDevice || !granularity || !create || !reserve || !map || !access) return false;
  CUdevice dev = 0;
  if (ctxGetDevice(&dev) != CUDA_SUCCESS) return false;
  auto attribute = reinterpret_cast<CUresult (*)(int*, CUdevice_attribute, CUdevice)>(
      get("cuDeviceGetAttribute"));
  int gdrOk = 0;
  if (gdr && attribute != nullptr)
    (void)attribute(&gdrOk, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
  CUmemAllocationProp prop = {};
  if (gdrOk) prop.allocFlags.gpuDirectRDMACapable = 1;
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  if (granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || gran == 0)
    return false;
  const size_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;
  if (create(&handle, size, &prop, 0) != CUDA_SUCCESS ||
      reserve(&ptr, size, gran, 0, 0) != CUDA_SUCCESS ||
      map(ptr, size, 0, handle, 0) != CUDA_SUCCESS)
    return false;
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (access(ptr, size, &desc, 1) != CUDA_SUCCESS) return false;
  *out = reinterpret_cast<void*>(ptr);
  return true;
}

ncclResult_t runColl(const Options& o, void* send, void* recv, ncclComm_t comm, cudaStream_t s) {
  const size_t count = o.bytes / sizeof(float);
  const size_t part =
      count / static_cast<size_t>(o.ranks) > 0 ? count / static_cast<size_t>(o.ranks) : 1;
  if (o.coll == "broadcast") return ncclBroadcast(send, recv, count, ncclFloat, 0, comm, s);
  if (o.coll == "allreduce") return ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, s);
  if (o.coll == "allgather") return ncclAllGather(send, recv, part, ncclFloat, comm, s);
  if (o.coll == "reducescatter")
    return ncclReduceScatter(send, recv, part, ncclFloat, ncclSum, comm, s);
  return ncclReduce(send, recv, count, ncclFloat, ncclSum, 0, comm, s);
}

// nccl-tests' testStreamSynchronize: stream query and the communicator's asynchronous error.
// Returns "" when the stream is done, else why not.
std::string waitStream(cudaStream_t s, ncclComm_t comm, double timeoutS) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return "";
    if (q != cudaErrorNotReady) return std::string("cudaStreamQuery: ") + cudaGetErrorString(q);
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclSuccess)
      return std::string("asynchronous error: ") + ncclGetLastError(comm);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeoutS)
      return "not finished after " + std::to_string(timeoutS) + " s";
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  if (std::getenv("MKERNEL_EMULATE") == nullptr) setenv("MKERNEL_EMULATE", "1", 1);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    std::fprintf(stderr, "mkernel-emuprobe: no CUDA device\n");
    return 2;
  }
  const int n = o.ranks;
  // 1. The application's streams, before the communicators (nccl-tests' order).
  std::vector<cudaStream_t> streams(static_cast<size_t>(n), nullptr);
  cudaSetDevice(0);
  for (auto& s : streams)
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      std::fprintf(stderr, "mkernel-emuprobe: cudaStreamCreate failed\n");
      return 2;
    }
  // 2. The communicators.
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    std::fprintf(stderr, "mkernel-emuprobe: ncclGetUniqueId: %s\n", ncclGetLastError(nullptr));
    return 2;
  }
  std::vector<ncclResult_t> initRes(static_cast<size_t>(n), ncclSuccess);
  if (o.init == "all") {
    std::vector<int> devs(static_cast<size_t>(n), 0);
    initRes[0] = ncclCommInitAll(comms.data(), n, devs.data());
  } else if (o.init == "group") {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclGroupStart();
    for (int r = 0; r < n; ++r)
      initRes[static_cast<size_t>(r)] =
          ncclCommInitRankConfig(&comms[static_cast<size_t>(r)], n, id, r, &config);
    const ncclResult_t g = ncclGroupEnd();
    if (g != ncclSuccess) initRes[0] = g;
  }
  for (ncclResult_t r : initRes)
    if (r != ncclSuccess) {
      std::fprintf(stderr, "mkernel-emuprobe: communicator creation (%s) failed: %s\n",
                   o.init.c_str(), ncclGetLastError(nullptr));
      return 2;
    }
  // 3. The buffers (threads mode: each thread makes its comm first, then its buffers, as -p 1).
  MemAllocFn memAlloc = nullptr;
  if (o.alloc == "nccl") {
    std::string why;
    memAlloc = realMemAlloc(&why);
    if (memAlloc == nullptr) {
      std::fprintf(stderr, "mkernel-emuprobe: --alloc nccl: %s\n", why.c_str());
      return 2;
    }
  }
  const size_t bufBytes = o.bytes < 4096 ? 4096 : o.bytes;
  auto allocate = [&](void** p) {
    if (o.alloc == "cumem" || o.alloc == "cumem-gdr")
      return cuMemAlloc(p, bufBytes, o.alloc == "cumem-gdr");
    return memAlloc != nullptr ? memAlloc(p, bufBytes) == ncclSuccess
                               : cudaMalloc(p, bufBytes) == cudaSuccess;
  };
  std::vector<void*> send(static_cast<size_t>(n), nullptr), recv(static_cast<size_t>(n), nullptr);
  if (o.init != "threads")
    for (int r = 0; r < n; ++r)
      if (!allocate(&send[static_cast<size_t>(r)]) || !allocate(&recv[static_cast<size_t>(r)])) {
        std::fprintf(stderr, "mkernel-emuprobe: buffer allocation (%s) failed\n", o.alloc.c_str());
        return 2;
      }
  if (o.syncAfterAlloc && cudaDeviceSynchronize() != cudaSuccess) {
    std::fprintf(stderr, "mkernel-emuprobe: cudaDeviceSynchronize after the buffers failed\n");
    return 2;
  }
  // 4. The rank threads.
  Barrier barrier(n);
  std::vector<std::string> failures(static_cast<size_t>(n));
  std::vector<double> ms(static_cast<size_t>(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      const size_t k = static_cast<size_t>(r);
      cudaSetDevice(0);
      if (o.init == "threads") {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        if (ncclCommInitRankConfig(&comms[k], n, id, r, &config) != ncclSuccess) {
          failures[k] = std::string("init: ") + ncclGetLastError(nullptr);
          barrier.wait();
          return;
        }
        if (!allocate(&send[k]) || !allocate(&recv[k])) failures[k] = "buffer allocation failed";
      }
      size_t freeMem = 0, total = 0;
      cudaMemGetInfo(&freeMem, &total);
      if (o.flush && failures[k].empty() &&
          (cudaMemsetAsync(send[k], 0, 4, streams[k]) != cudaSuccess ||
           cudaStreamSynchronize(streams[k]) != cudaSuccess))
        failures[k] = "flush failed";
      barrier.wait();
      if (!failures[k].empty()) return;
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < o.iters; ++it) {
        if (o.dataInit) {
          cudaMemset(send[k], r + 1, o.bytes);
          cudaStreamSynchronize(0);
        }
        const ncclResult_t cr = runColl(o, send[k], recv[k], comms[k], streams[k]);
        if (cr != ncclSuccess) {
          failures[k] = "iteration " + std::to_string(it) + ": " + ncclGetLastError(comms[k]);
          return;
        }
        const std::string w = waitStream(streams[k], comms[k], o.timeoutS);
        if (!w.empty()) {
          failures[k] = "iteration " + std::to_string(it) + ": " + w;
          return;
        }
      }
      ms[k] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  // 5. The verdict.
  int failed = 0;
  std::string detail;
  for (int r = 0; r < n; ++r)
    if (!failures[static_cast<size_t>(r)].empty()) {
      ++failed;
      detail += " [rank " + std::to_string(r) + ": " + failures[static_cast<size_t>(r)] + "]";
    }
  double worst = 0;
  for (double m : ms) worst = m > worst ? m : worst;
  std::printf("mkernel-emuprobe: %d ranks, %s %zu B x %d, init %s, alloc %s%s%s%s: %s", n,
              o.coll.c_str(), o.bytes, o.iters, o.init.c_str(), o.alloc.c_str(),
              o.dataInit ? ", data init" : "", o.syncAfterAlloc ? ", device sync" : "",
              o.flush ? ", flush" : "", failed == 0 ? "passed" : "FAILED");
  if (failed == 0)
    std::printf(" (slowest rank %.1f ms)\n", worst);
  else
    std::printf(", %d rank(s) did not finish:%s\n", failed, detail.c_str());
  std::fflush(stdout);
  if (failed != 0) {
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommAbort(c);
    return 1;
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return 0;
}
