// The real NCCL beside the shim (docs/SHIM.md, "Reaching the real NCCL").
//
// Reached with dlopen("libnccl.so.2", RTLD_NOW|RTLD_NOLOAD) first (PyTorch's wheel loads it in a
// local scope, where dlsym(RTLD_NEXT) finds nothing), then a plain dlopen of MKERNEL_NCCL_LIBRARY
// or libnccl.so.2; every entry point is dlsym'd on that handle. Loaded once, thread-safe. Its
// version is read once it is loaded (ncclGetVersion) and said at INFO (INIT); a version newer than
// the newest the shim was tested with is a WARN, once per process; one older than the oldest it
// supports fails communicator creation (checkRealNcclVersion).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "plugin/shim/nccl_api.h"

namespace mkernel {
namespace shim {

// The oldest NCCL the shim runs beside (its ncclConfig_t, registration and device-API entry
// points are 2.28's), and the newest whose entry points it was checked against (docs/SHIM.md's
// table of entry points, tests/plugin/shim/fixtures).
constexpr int kOldestSupportedNccl = 22800;  // 2.28.0
constexpr int kNewestTestedNccl = 23203;     // 2.32.3

struct RealNccl {
  bool available = false;
  std::string why;   // why it is not available
  std::string path;  // the file it was loaded from
  void* handle = nullptr;
  const void* base = nullptr;  // load address (dladdr's dli_fbase)
  // Its ncclGetVersion (0 until read: realNccl() reads it after loading, outside the load's lock).
  std::atomic<int> version{0};
#define MKERNEL_NCCL_API(name, role, what) decltype(&::name) name = nullptr;
#define MKERNEL_NCCL_API_SIG(name, role, what, ret, params) ret(*name) params = nullptr;
#include "plugin/shim/nccl_api.def"
#undef MKERNEL_NCCL_API_SIG
#undef MKERNEL_NCCL_API
};

// The table. `allowLoad` false (emulation): only an NCCL the process already loaded is used.
const RealNccl& realNccl(bool allowLoad = true);

// ncclInvalidUsage, naming `caller` and both versions, when the real NCCL is older than
// kOldestSupportedNccl; success otherwise (a version that could not be read is not held against
// it).
Result checkRealNcclVersion(const RealNccl& real, const char* caller);

// The shim's startup line (MKERNEL_DEBUG=VERSION or more), once per process, at the first entry an
// application makes (ncclGetVersion, ncclGetUniqueId, communicator creation): mkernel's version
// and library, and the real NCCL's version and file, or emulation. Never call it while realNccl()
// is being filled (it may load the real NCCL).
void announceShimOnce();

// The text of an NCCL version code (2.28.9 for 22809; 2.8.4 for the old 2804 form).
std::string ncclVersionText(int code);

// Whether `returnAddress` lies inside the real libnccl (a call it made through its own PLT).
// Any copy of NCCL in the process; dladdr and dlopen per call (ncclGetUniqueId's use).
bool calledFromRealNccl(const void* returnAddress);

// The same for the real NCCL the table was loaded from, in two comparisons with the bounds of its
// code: every entry that takes a communicator asks it first, and a call NCCL makes through its
// own PLT (re-entry, docs/SHIM.md) goes straight back to NCCL.
extern std::atomic<uintptr_t> gRealCodeBegin, gRealCodeEnd;
inline bool fromRealNccl(const void* returnAddress) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(returnAddress);
  return a < gRealCodeEnd.load(std::memory_order_acquire) &&
         a >= gRealCodeBegin.load(std::memory_order_relaxed);
}

}  // namespace shim
}  // namespace mkernel

// The caller of the exported function this appears in is the real NCCL.
#define MKERNEL_FROM_NCCL() ::mkernel::shim::fromRealNccl(__builtin_return_address(0))
