#include <dlfcn.h>

#include "common/dl.h"
#include "tools/bench/bench.h"

namespace mkernel {
namespace bench {

bool gpuPresent(std::string* why) {
  static const char* const kLibs[] = {"libcuda.so.1", "libcuda.so", nullptr};
  std::string err;
  void* lib = dlOpenFirst(kLibs, RTLD_NOW | RTLD_LOCAL, &err);
  if (lib == nullptr) {
    *why = "no CUDA driver (" + err + ")";
    return false;
  }
  using CuInit = int (*)(unsigned);
  using CuDeviceGetCount = int (*)(int*);
  CuInit cuInit = nullptr;
  CuDeviceGetCount cuDeviceGetCount = nullptr;
  DlSymbol syms[] = {{"cuInit", reinterpret_cast<void**>(&cuInit), true},
                     {"cuDeviceGetCount", reinterpret_cast<void**>(&cuDeviceGetCount), true}};
  if (dlLoadSymbols(lib, "libcuda", syms, 2, &err) != Result::Success) {
    *why = err;
    return false;
  }
  int rc = cuInit(0);
  if (rc != 0) {
    *why = "cuInit failed (CUresult " + std::to_string(rc) + ")";
    return false;
  }
  int count = 0;
  rc = cuDeviceGetCount(&count);
  if (rc != 0 || count <= 0) {
    *why = "the CUDA driver reports no device";
    return false;
  }
  *why = std::to_string(count) + " CUDA device(s)";
  return true;
}

}  // namespace bench
}  // namespace mkernel
