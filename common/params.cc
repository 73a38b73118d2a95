#include "common/param.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "common/log.h"

extern char** environ;

namespace mkernel {
namespace {

const ParamInfo kParams[] = {
#define MKERNEL_PARAM(name, def, meaning) {#name, def, meaning},
#include "common/params.def"
#undef MKERNEL_PARAM
};
constexpr int kParamCount = sizeof(kParams) / sizeof(kParams[0]);

const ParamInfo* find(const char* name) {
  for (const ParamInfo& p : kParams)
    if (std::strcmp(p.name, name) == 0) return &p;
  return nullptr;
}

// The text value: the environment's, else the declared default. nullptr when undeclared.
const char* rawValue(const char* name) {
  const ParamInfo* info = find(name);
  if (info == nullptr) {
    MK_WARN("MKERNEL_%s is read by the code but not declared in common/params.def (bug)", name);
    return nullptr;
  }
  std::string env = std::string("MKERNEL_") + name;
  const char* v = std::getenv(env.c_str());
  return (v != nullptr && *v != '\0') ? v : info->def;
}

}  // namespace

const ParamInfo* paramTable(int* count) {
  *count = kParamCount;
  return kParams;
}

int64_t paramInt(const char* name, int64_t fallback) {
  const char* v = rawValue(name);
  if (v == nullptr || *v == '\0') return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  if (errno != 0 || end == v || *end != '\0') {
    const ParamInfo* info = find(name);
    MK_WARN("MKERNEL_%s=%s is not an integer; using the default %s", name, v, info->def);
    x = std::strtoll(info->def, nullptr, 0);
  }
  return x;
}

double paramDouble(const char* name, double fallback) {
  const char* v = rawValue(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (end == v || *end != '\0') {
    const ParamInfo* info = find(name);
    MK_WARN("MKERNEL_%s=%s is not a number; using the default %s", name, v, info->def);
    x = std::strtod(info->def, nullptr);
  }
  return x;
}

std::string paramString(const char* name) {
  const char* v = rawValue(name);
  return v == nullptr ? std::string() : std::string(v);
}

bool paramIsSet(const char* name) {
  std::string env = std::string("MKERNEL_") + name;
  const char* v = std::getenv(env.c_str());
  return v != nullptr && *v != '\0';
}

void warnUnknownParamsOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      if (std::strncmp(*e, "MKERNEL_", 8) != 0) continue;
      const char* eq = std::strchr(*e, '=');
      std::string name(*e + 8, eq ? static_cast<size_t>(eq - *e - 8) : std::strlen(*e + 8));
      if (find(name.c_str()) == nullptr)
        MK_WARN("MKERNEL_%s is not a known mkernel variable and is ignored (see the README's table)",
                name.c_str());
    }
  });
}

}  // namespace mkernel
