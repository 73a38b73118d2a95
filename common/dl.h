// One small helper for the dlopen'd vendor libraries (libcuda, libnvidia-ml, libibverbs, the real
// libnccl): each wrapper keeps a table of function pointers filled by loadSymbols(), and a missing
// library or symbol is an error message, never a crash.
#pragma once

#include <string>

#include "common/result.h"

namespace mkernel {

struct DlSymbol {
  const char* name;
  void** slot;
  bool required;
};

// dlopen()s the first name in `candidates` (nullptr-terminated) that loads; fills every slot.
// On failure *why says which library or symbol was missing.
void* dlOpenFirst(const char* const* candidates, int flags, std::string* why);
Result dlLoadSymbols(void* handle, const char* libName, DlSymbol* syms, int n, std::string* why);

}  // namespace mkernel
