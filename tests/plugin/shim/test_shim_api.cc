// The NCCL API of libmkernel.so as an application linked to it sees it (the same resolution as
// LD_PRELOAD: the shim's nccl* names come first). Hardware-free: on a machine without a GPU,
// creating a communicator must fail cleanly.
#include "tests/catch.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/param.h"
#include "plugin/mkernel_api.h"
#include "plugin/shim/nccl_api.h"
#include "transport/bootstrap/bootstrap.h"

namespace {

const std::vector<std::string>& shimNames() {
  static const std::vector<std::string> names = {
#define MKERNEL_NCCL_API(name, role, what) #name,
#include "plugin/shim/nccl_api.def"
#undef MKERNEL_NCCL_API
  };
  return names;
}

// The nccl* functions of each NCCL in tests/plugin/shim/fixtures (nccl-<version>.txt), together.
std::set<std::string> knownNcclNames() {
  std::set<std::string> names;
  for (const char* v : {"2.28.9", "2.29.7", "2.30.7", "2.32.3"}) {
    std::ifstream in(std::string(MKERNEL_SOURCE_DIR) + "/tests/plugin/shim/fixtures/nccl-" + v +
                     ".txt");
    REQUIRE(in.good());
    std::string line;
    while (std::getline(in, line))
      if (!line.empty() && line[0] != '#') names.insert(line);
  }
  return names;
}

// The functions PyTorch 2.11 calls.
const char* const kTorchNames[] = {"ncclAllGather",
                                   "ncclAllReduce",
                                   "ncclAlltoAll",
                                   "ncclBcast",
                                   "ncclBroadcast",
                                   "ncclCommAbort",
                                   "ncclCommCount",
                                   "ncclCommDeregister",
                                   "ncclCommDestroy",
                                   "ncclCommFinalize",
                                   "ncclCommGetAsyncError",
                                   "ncclCommInitAll",
                                   "ncclCommInitRank",
                                   "ncclCommInitRankConfig",
                                   "ncclCommInitRankScalable",
                                   "ncclCommRegister",
                                   "ncclCommShrink",
                                   "ncclCommSplit",
                                   "ncclCommUserRank",
                                   "ncclCommWindowRegister",
                                   "ncclCommWindowDeregister",
                                   "ncclDevCommCreate",
                                   "ncclDevCommDestroy",
                                   "ncclGetErrorString",
                                   "ncclGetLastError",
                                   "ncclGetUniqueId",
                                   "ncclGetVersion",
                                   "ncclGroupStart",
                                   "ncclGroupEnd",
                                   "ncclGroupSimulateEnd",
                                   "ncclMemAlloc",
                                   "ncclMemFree",
                                   "ncclRecv",
                                   "ncclRedOpCreatePreMulSum",
                                   "ncclRedOpDestroy",
                                   "ncclReduce",
                                   "ncclReduceScatter",
                                   "ncclSend"};

std::string run(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p.get())) > 0) out.append(buf, n);
  return out;
}

// Defined FUNC symbols starting with "nccl" in a library's dynamic symbol table.
std::set<std::string> exportedNcclFunctions(const std::string& lib) {
  std::set<std::string> names;
  std::istringstream in(run("readelf -W --dyn-syms '" + lib + "' 2>/dev/null"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string num, value, size, type, bind, vis, ndx, name;
    if (!(f >> num >> value >> size >> type >> bind >> vis >> ndx >> name)) continue;
    if (type == "FUNC" && ndx != "UND" && name.rfind("nccl", 0) == 0) names.insert(name);
  }
  return names;
}

// Whether dlsym(handle, name) resolves into libmkernel.so itself (not into some libnccl).
bool definedByShim(void* handle, const char* name) {
  void* sym = dlsym(handle, name);
  void* anchor = dlsym(handle, "mkernelGetStats");
  Dl_info a{}, b{};
  return sym != nullptr && anchor != nullptr && dladdr(sym, &a) != 0 && dladdr(anchor, &b) != 0 &&
         a.dli_fbase == b.dli_fbase;
}

void* shimHandle() {
  static void* h = dlopen(MKERNEL_SO_PATH, RTLD_NOW | RTLD_LOCAL);
  return h;
}

std::string lastError() {
  return ncclGetLastError(nullptr);
}

}  // namespace

TEST_CASE(
    "exports: libmkernel.so defines every nccl* function of nccl_api.def, with default "
    "visibility") {
  void* h = shimHandle();
  INFO(dlerror());
  REQUIRE(h != nullptr);
  CHECK(shimNames().size() == 56);
  for (const std::string& n : shimNames()) {
    INFO(n);
    CHECK(definedByShim(h, n.c_str()));
  }
}

TEST_CASE("exports: every function PyTorch 2.11 calls is exported by libmkernel.so") {
  void* h = shimHandle();
  REQUIRE(h != nullptr);
  for (const char* n : kTorchNames) {
    INFO(n);
    CHECK(definedByShim(h, n));
  }
}

// The handle the application holds is NCCL's own communicator, so the shim exports only what it
// routes or must see (nccl_api.def); every other name reaches NCCL directly (docs/SHIM.md's table,
// checked by test_shim_entry_points).
TEST_CASE(
    "exports: libmkernel.so exports exactly nccl_api.def's nccl* functions, each one some NCCL "
    "exports") {
  const std::set<std::string> ours = exportedNcclFunctions(MKERNEL_SO_PATH);
  const std::set<std::string> listed(shimNames().begin(), shimNames().end());
  CHECK(ours == listed);
  const std::set<std::string> known = knownNcclNames();
  for (const std::string& n : ours) {
    INFO(n << " is exported by libmkernel.so but by no NCCL in tests/plugin/shim/fixtures");
    CHECK(known.count(n) == 1);
  }
  // Names of NCCL's own aliases and handle-less helpers stay NCCL's.
  for (const char* n :
       {"pncclAllReduce", "ncclResetDebugInit", "ncclLLA2ACalcSlots", "ncclCommSuspend"}) {
    INFO(n);
    CHECK(ours.count(n) == 0);
  }
}

TEST_CASE(
    "exports: every nccl* function of the real libnccl.so.2 found at build time is in "
    "tests/plugin/shim/fixtures") {
  const std::string real = MKERNEL_REAL_NCCL_SO;
  if (real.empty()) {
    WARN("no libnccl.so.2 found at configure time: nothing to compare");
    return;
  }
  const std::set<std::string> theirs = exportedNcclFunctions(real);
  REQUIRE(theirs.size() >= 50);
  const std::set<std::string> known = knownNcclNames();
  for (const std::string& n : theirs) {
    INFO(n << " is exported by " << real
           << " but listed in no tests/plugin/shim/fixtures/nccl-<version>.txt: add that NCCL's "
              "list, then decide what the "
              "shim does with it (plugin/shim/nccl_api.def, tests/plugin/shim/entry_points.py)");
    CHECK(known.count(n) == 1);
  }
}

TEST_CASE("exports: the SONAME is libmkernel.so.0, never libnccl.so.2") {
  std::string dyn = run(std::string("readelf -d '") + MKERNEL_SO_PATH + "'");
  CHECK(dyn.find("Library soname: [libmkernel.so.0]") != std::string::npos);
  CHECK(dyn.find("libnccl") == std::string::npos);  // not linked: dlopen'd at run time
}

TEST_CASE("api: ncclGetVersion answers the real NCCL's version, or the headers' without one") {
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  int expected = NCCL_VERSION_CODE;
  if (void* real = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) {
    auto getVersion = reinterpret_cast<ncclResult_t (*)(int*)>(dlsym(real, "pncclGetVersion"));
    REQUIRE(getVersion != nullptr);
    REQUIRE(getVersion(&expected) == ncclSuccess);
    dlclose(real);
  }
  CHECK(v == expected);
  CHECK(v >= 22800);
  CHECK(ncclGetVersion(nullptr) == ncclInvalidArgument);
  CHECK(lastError().find("version argument is NULL") != std::string::npos);
}

TEST_CASE("api: ncclGetUniqueId hands out an mkernel id") {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  mkernel::bootstrap::UniqueId mine;
  std::memcpy(mine.bytes, id.internal, sizeof(mine.bytes));
  CHECK(mkernel::bootstrap::isMkernelId(mine));
  ncclUniqueId second;
  REQUIRE(ncclGetUniqueId(&second) == ncclSuccess);
  CHECK(std::memcmp(&id, &second, sizeof(id)) != 0);  // a fresh nonce each time
  CHECK(ncclGetUniqueId(nullptr) == ncclInvalidArgument);
}

TEST_CASE("api: a NULL comm is ncclInvalidArgument with a message, at every entry that takes one") {
  int x = 0;
  ncclResult_t async;
  void* handle = nullptr;
  ncclComm_t child = nullptr;
  ncclRedOp_t op;
  float scalar = 1.0f;
  struct Case {
    const char* name;
    ncclResult_t r;
  };
  Case cases[] = {
      {"AllReduce", ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr)},
      {"ncclAllReduceConfig",
       ncclAllReduceConfig(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr, nullptr)},
      {"ncclAllGatherConfig", ncclAllGatherConfig(&x, &x, 1, ncclInt, nullptr, nullptr, nullptr)},
      {"ncclReduceScatterConfig",
       ncclReduceScatterConfig(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr, nullptr)},
      {"ncclBroadcastConfig",
       ncclBroadcastConfig(&x, &x, 1, ncclInt, 0, nullptr, nullptr, nullptr)},
      {"ncclReduceConfig",
       ncclReduceConfig(&x, &x, 1, ncclInt, ncclSum, 0, nullptr, nullptr, nullptr)},
      {"ncclAlltoAllConfig", ncclAlltoAllConfig(&x, &x, 1, ncclInt, nullptr, nullptr, nullptr)},
      {"ncclGatherConfig", ncclGatherConfig(&x, &x, 1, ncclInt, 0, nullptr, nullptr, nullptr)},
      {"ncclScatterConfig", ncclScatterConfig(&x, &x, 1, ncclInt, 0, nullptr, nullptr, nullptr)},
      {"AllGather", ncclAllGather(&x, &x, 1, ncclInt, nullptr, nullptr)},
      {"ReduceScatter", ncclReduceScatter(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr)},
      {"Broadcast", ncclBroadcast(&x, &x, 1, ncclInt, 0, nullptr, nullptr)},
      {"Bcast", ncclBcast(&x, 1, ncclInt, 0, nullptr, nullptr)},
      {"Reduce", ncclReduce(&x, &x, 1, ncclInt, ncclSum, 0, nullptr, nullptr)},
      {"AlltoAll", ncclAlltoAll(&x, &x, 1, ncclInt, nullptr, nullptr)},
      {"Gather", ncclGather(&x, &x, 1, ncclInt, 0, nullptr, nullptr)},
      {"Scatter", ncclScatter(&x, &x, 1, ncclInt, 0, nullptr, nullptr)},
      {"Send", ncclSend(&x, 1, ncclInt, 0, nullptr, nullptr)},
      {"Recv", ncclRecv(&x, 1, ncclInt, 0, nullptr, nullptr)},
      {"ncclCommCount", ncclCommCount(nullptr, &x)},
      {"ncclCommCuDevice", ncclCommCuDevice(nullptr, &x)},
      {"ncclCommUserRank", ncclCommUserRank(nullptr, &x)},
      {"ncclCommGetAsyncError", ncclCommGetAsyncError(nullptr, &async)},
      {"ncclCommFinalize", ncclCommFinalize(nullptr)},
      {"ncclCommRevoke", ncclCommRevoke(nullptr, 0)},
      {"ncclCommSplit", ncclCommSplit(nullptr, 0, 0, &child, nullptr)},
      {"ncclCommShrink", ncclCommShrink(nullptr, nullptr, 0, &child, nullptr, 0)},
      {"ncclCommRegister", ncclCommRegister(nullptr, &x, 4, &handle)},
      {"ncclCommDeregister", ncclCommDeregister(nullptr, handle)},
      {"ncclCommWindowDeregister", ncclCommWindowDeregister(nullptr, nullptr)},
      {"ncclRedOpCreatePreMulSum",
       ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, nullptr)},
      {"ncclRedOpDestroy", ncclRedOpDestroy(static_cast<ncclRedOp_t>(ncclNumOps), nullptr)},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(c.r == ncclInvalidArgument);
  }
  CHECK(ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
  CHECK(lastError() == "AllReduce : comm argument is NULL");
  // As NCCL: destroying or aborting NULL is a no-op.
  CHECK(ncclCommDestroy(nullptr) == ncclSuccess);
  CHECK(ncclCommAbort(nullptr) == ncclSuccess);
}

TEST_CASE("api: communicator creation rejects bad arguments before touching the GPU") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(nullptr, 1, id, 0) == ncclInvalidArgument);
  CHECK(ncclCommInitRank(&comm, 0, id, 0) == ncclInvalidArgument);
  CHECK(lastError().find("invalid rank requested : 0/0") != std::string::npos);
  CHECK(ncclCommInitRank(&comm, 2, id, 2) == ncclInvalidArgument);
  CHECK(ncclCommInitRank(&comm, 2, id, -1) == ncclInvalidArgument);
  ncclConfig_t bad;
  std::memset(&bad, 0, sizeof(bad));
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &bad) == ncclInvalidArgument);
  CHECK(lastError().find("NCCL_CONFIG_INITIALIZER") != std::string::npos);
  ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
  blocking.blocking = 7;
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &blocking) == ncclInvalidArgument);
  CHECK(ncclCommInitRankScalable(&comm, 1, 0, 0, &id, nullptr) == ncclInvalidArgument);
  CHECK(ncclCommInitRankScalable(&comm, 1, 0, 1, nullptr, nullptr) == ncclInvalidArgument);
  ncclComm_t comms[2];
  CHECK(ncclCommInitAll(nullptr, 1, nullptr) == ncclInvalidArgument);
  CHECK(ncclCommInitAll(comms, 0, nullptr) == ncclInvalidArgument);
  CHECK(comm == nullptr);
}

TEST_CASE("api: creating a communicator without a GPU fails cleanly with an error, not a crash") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  if (r == ncclSuccess) {
    // This host has a GPU: the comm works, so take it down again.
    WARN("a CUDA device is present: the no-GPU path was not exercised");
    int n = 0;
    CHECK(ncclCommCount(comm, &n) == ncclSuccess);
    CHECK(n == 1);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
    return;
  }
  CHECK(r == ncclUnhandledCudaError);
  CHECK(comm == nullptr);
  CHECK(lastError().find("no CUDA device") != std::string::npos);
  ncclComm_t comms[1] = {nullptr};
  CHECK(ncclCommInitAll(comms, 1, nullptr) == ncclUnhandledCudaError);
  CHECK(comms[0] == nullptr);
  // Inside a group the failure is also the group's.
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclUnhandledCudaError);
  CHECK(ncclGroupEnd() == ncclUnhandledCudaError);
}

TEST_CASE("api: groups nest; an unmatched ncclGroupEnd is ncclInvalidUsage") {
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  CHECK(lastError().find("not in a group") != std::string::npos);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  // An error inside a group also fails the group's end.
  int x = 0;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.magic = 0;
  CHECK(ncclGroupSimulateEnd(&sim) == ncclInvalidArgument);
  CHECK(ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidArgument);  // as NCCL: the group reports its calls' failure
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);  // and the next group starts clean
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclGroupSimulateEnd(nullptr) == ncclSuccess);  // NULL simInfo: a plain ncclGroupEnd
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
}

TEST_CASE("api: error strings, last error and version info") {
  CHECK(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)).find("invalid argument") !=
        std::string::npos);
  CHECK(std::string(ncclGetErrorString(ncclRemoteError)).find("remote") != std::string::npos);
  CHECK(std::string(ncclGetErrorString(static_cast<ncclResult_t>(99))) == "unknown result code");
  CHECK(ncclCommCount(nullptr, nullptr) == ncclInvalidArgument);
  CHECK(lastError() == "ncclCommCount : comm argument is NULL");
  CHECK(std::string(mkernelVersionString()).rfind("mkernel ", 0) == 0);
}

// Callers carry their own copy of mkernelStats_t (nccl-tests' patch, torch_check.py's ctypes
// struct), made before later fields were appended (launchOps, countersLate): `size` bounds what
// is written, so an older caller's memory past its struct stays untouched.
TEST_CASE("api: mkernelGetStats writes no more than the caller's size says") {
  struct Older {  // the struct before countersLate, and a guard word after it
    uint64_t size;
    uint64_t kernelOps[5], forwardedOps[5], kernelLaunches, commsCreated, launchOps[5];
    uint64_t guard;
  } older;
  static_assert(offsetof(Older, guard) == offsetof(mkernelStats_t, countersLate),
                "the older layout is the prefix");
  std::memset(&older, 0xab, sizeof(older));
  older.size = offsetof(Older, guard);
  REQUIRE(mkernelGetStats(reinterpret_cast<mkernelStats_t*>(&older)) == 0);
  CHECK(older.size == offsetof(Older, guard));
  CHECK(older.guard == 0xababababababababull);
  CHECK(older.kernelOps[0] != 0xababababababababull);  // written
  mkernelStats_t s;
  std::memset(&s, 0xab, sizeof(s));
  s.size = sizeof(s);
  REQUIRE(mkernelGetStats(&s) == 0);
  CHECK(s.countersLate == 0);  // no communicator has read its device counters here
  s.size = offsetof(mkernelStats_t, kernelOps) - 1;
  CHECK(mkernelGetStats(&s) != 0);  // too small for any field
  CHECK(mkernelGetStats(nullptr) != 0);
}

TEST_CASE("api: custom-op and p2p entries reject their own bad arguments on NULL comms first") {
  // NCCL checks the comm before anything else; so does the shim.
  ncclRedOp_t op;
  CHECK(ncclRedOpCreatePreMulSum(&op, nullptr, static_cast<ncclDataType_t>(99),
                                 ncclScalarHostImmediate, nullptr) == ncclInvalidArgument);
  CHECK(lastError().find("comm argument is NULL") != std::string::npos);
}

// In emulation the shim serves ncclMemAlloc itself, even with the real NCCL loaded: the real one
// starts NCCL's own CUDA runtime, after which co-located thread ranks stall at their first
// collective on the H200 (docs/RELIABILITY.md). Ours maps the memory with cuMem as
// NCCL does; without a GPU it fails with its own message; without emulation the call goes to the
// real NCCL. The GPU tier runs this case alone as test_shim_api_gpu, where the mapping is made.
TEST_CASE("api: in emulation ncclMemAlloc and ncclMemFree never reach the real NCCL",
          "[memalloc]") {
  const std::string realPath = MKERNEL_REAL_NCCL_SO;
  void* real = realPath.empty() ? nullptr : dlopen(realPath.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (real == nullptr) WARN("no real libnccl.so.2 to load: checking the emulated path alone");
  setenv("MKERNEL_EMULATE", "1", 1);
  mkernel::params::resetForTesting();
  void* p = nullptr;
  const ncclResult_t r = ncclMemAlloc(&p, 4096);
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  INFO("ncclMemAlloc: " << r << " " << lastError());
  CHECK((r == ncclSuccess) == gpu);  // a GPU machine: ours must allocate
  if (gpu && r == ncclSuccess) {
    CHECK(p != nullptr);
    cudaPointerAttributes attr = {};
    CHECK(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice);
    CHECK(cudaMemset(p, 0x5a, 4096) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(ncclMemFree(p) == ncclSuccess);
    // Not one of its mappings: NCCL's error, with a message, and nothing freed.
    void* plain = nullptr;
    REQUIRE(cudaMalloc(&plain, 4096) == cudaSuccess);
    CHECK(ncclMemFree(plain) == ncclUnhandledCudaError);
    CHECK(lastError().find("is not a mapping of ncclMemAlloc") != std::string::npos);
    CHECK(cudaFree(plain) == cudaSuccess);
  } else if (!gpu) {
    CHECK(r == ncclUnhandledCudaError);
    CHECK(lastError().find("ncclMemAlloc : mapping 4096 bytes failed") != std::string::npos);
  }
  CHECK(ncclMemFree(nullptr) == ncclSuccess);
  unsetenv("MKERNEL_EMULATE");
  mkernel::params::resetForTesting();
  if (real != nullptr && !gpu) {
    // Not emulating: forwarded, so the shim's own cudaMalloc message is not what it says.
    const ncclResult_t fr = ncclMemAlloc(&p, 4096);
    CHECK(fr != ncclSuccess);
    CHECK(lastError().find("ncclMemAlloc : mapping 4096 bytes failed") == std::string::npos);
  }
}
