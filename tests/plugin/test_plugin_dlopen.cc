// Every shared object the build produces loads with dlopen(RTLD_NOW) — every symbol resolved, no
// vendor library (libcuda, libibverbs, libnccl) needed at load time — and the three names are one
// and the same library, so LD_PRELOAD and NCCL's dlopen share one copy (docs/DESIGN.md, one
// library).
#include <dlfcn.h>

#include "tests/catch.h"

#include <string>

namespace {

void* openNow(const std::string& name) {
  std::string path = std::string(MKERNEL_LIB_DIR) + "/" + name;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO("dlopen(" << path << ", RTLD_NOW): " << (h ? "ok" : dlerror()));
  CHECK(h != nullptr);
  return h;
}

}  // namespace

TEST_CASE(
    "dlopen(RTLD_NOW) of libmkernel.so, libnccl-net-mkernel.so and libnccl-tuner-mkernel.so") {
  void* core = openNow("libmkernel.so");
  void* net = openNow("libnccl-net-mkernel.so");
  void* tuner = openNow("libnccl-tuner-mkernel.so");
  REQUIRE(core != nullptr);
  REQUIRE(net != nullptr);
  REQUIRE(tuner != nullptr);
  CHECK(dlsym(core, "mkernelGetStats") != nullptr);
  CHECK(dlsym(core, "mkernelVersionString") != nullptr);
  for (const char* sym :
       {"ncclNetPlugin_v12", "ncclNetPlugin_v11", "ncclNetPlugin_v10", "ncclNetPlugin_v9",
        "ncclNetPlugin_v8", "ncclTunerPlugin_v6", "ncclTunerPlugin_v5"}) {
    INFO(sym);
    void* viaNet = dlsym(net, sym);
    CHECK(viaNet != nullptr);
    CHECK(dlsym(core, sym) == viaNet);  // one copy behind every name
    CHECK(dlsym(tuner, sym) == viaNet);
  }
  // Internal symbols stay hidden: only the C entry points are exported.
  CHECK(dlsym(net, "_ZN7mkernel10netplugin4testEPvPiS2_") == nullptr);
#if defined(__SANITIZE_THREAD__)
  // Left loaded under ThreadSanitizer (scripts/test.sh tsan): its atexit interceptor registers
  // the exit handler that the static CUDA runtime installs at load with no DSO handle, so
  // dlclose does not run or drop it and exit() then calls into the unmapped library (SEGV in
  // libcudart_static's code). Without TSan, atexit in a shared object runs at dlclose.
  (void)tuner;
  (void)net;
  (void)core;
#else
  dlclose(tuner);
  dlclose(net);
  dlclose(core);
#endif
}
