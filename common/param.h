// MKERNEL_* environment variables.
//
// Every variable is declared once, with its default and meaning, in common/params.def; the README's
// table is checked against that file by a test (tests/common), and any MKERNEL_* variable in the
// environment that is not declared there is warned about once.
#pragma once

#include <cstdint>
#include <string>

namespace mkernel {

struct ParamInfo {
  const char* name;     // without the MKERNEL_ prefix
  const char* def;      // default, as text ("" = unset)
  const char* meaning;  // one line, copied into the README table
};

// All declared variables, in params.def order.
const ParamInfo* paramTable(int* count);

// Value of MKERNEL_<name>, or the declared default. `name` must be declared in params.def
// (otherwise this logs a WARN naming the programming error and uses `fallback`).
int64_t paramInt(const char* name, int64_t fallback = 0);
double paramDouble(const char* name, double fallback = 0.0);
std::string paramString(const char* name);
bool paramIsSet(const char* name);

// Warns once per process about MKERNEL_* variables in the environment that params.def does not
// declare (typos are the usual cause of "my setting did nothing").
void warnUnknownParamsOnce();

}  // namespace mkernel
