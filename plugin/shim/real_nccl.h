// The real NCCL beside the shim (NCCL-ABI.md, "The NCCL API under LD_PRELOAD").
//
// Reached with dlopen("libnccl.so.2", RTLD_NOW|RTLD_NOLOAD) first (PyTorch's wheel loads it in a
// local scope, where dlsym(RTLD_NEXT) finds nothing), then a plain dlopen of MKERNEL_NCCL_LIBRARY
// or libnccl.so.2; every entry point is dlsym'd on that handle. Loaded once, thread-safe.
#pragma once

#include <string>

#include "plugin/shim/nccl_api.h"

namespace mkernel {
namespace shim {

// Suppress the deprecation of ncclResetDebugInit for its typed pointer only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct RealNccl {
  bool available = false;
  std::string why;   // why it is not available
  std::string path;  // the file it was loaded from
  void* handle = nullptr;
  const void* base = nullptr;  // load address (dladdr's dli_fbase)
#define MKERNEL_NCCL_API(name) decltype(&::name) name = nullptr;
#define MKERNEL_NCCL_API_SIG(name, ret, params) ret(*name) params = nullptr;
#include "plugin/shim/nccl_api.def"
#undef MKERNEL_NCCL_API_SIG
#undef MKERNEL_NCCL_API
};
#pragma GCC diagnostic pop

// The table. `allowLoad` false (emulation): only an NCCL the process already loaded is used.
const RealNccl& realNccl(bool allowLoad = true);

// The shim's startup line (MKERNEL_DEBUG=VERSION or more), once per process, at the first entry an
// application makes (ncclGetVersion, ncclGetUniqueId, communicator creation): mkernel's version
// and library, and the real NCCL's version and file, or emulation. Never call it while realNccl()
// is being filled (it may load the real NCCL).
void announceShimOnce();

// The text of an NCCL version code (2.28.9 for 22809; 2.8.4 for the old 2804 form).
std::string ncclVersionText(int code);

// Whether `returnAddress` lies inside the real libnccl (a call it made through its own PLT).
bool calledFromRealNccl(const void* returnAddress);

}  // namespace shim
}  // namespace mkernel
