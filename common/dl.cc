#include "common/dl.h"

#include <dlfcn.h>

namespace mkernel {

void* dlOpenFirst(const char* const* candidates, int flags, std::string* why) {
  std::string errs;
  for (const char* const* c = candidates; *c != nullptr; ++c) {
    if (void* h = dlopen(*c, flags)) return h;
    const char* e = dlerror();
    if (!errs.empty()) errs += "; ";
    errs += e ? e : *c;
  }
  if (why) *why = errs;
  return nullptr;
}

Result dlLoadSymbols(void* handle, const char* libName, DlSymbol* syms, int n, std::string* why) {
  for (int i = 0; i < n; ++i) {
    *syms[i].slot = dlsym(handle, syms[i].name);
    if (*syms[i].slot == nullptr && syms[i].required) {
      if (why) *why = std::string(libName) + " lacks " + syms[i].name;
      return Result::SystemError;
    }
  }
  return Result::Success;
}

}  // namespace mkernel
