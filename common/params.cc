#include "common/param.h"

#include <dlfcn.h>
#include <link.h>
#include <strings.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"

extern char** environ;

namespace mkernel {
namespace params {
namespace {

constexpr Info kInfo[] = {
#define MKERNEL_PARAM(name, type, def, route, audience, nccl, values, help) \
  {#name, Type::type, def, route, Audience::audience, nccl, values, help},
#define ROUTE true
#define LOCAL false
#include "common/params.def"
#undef ROUTE
#undef LOCAL
#undef MKERNEL_PARAM
};
constexpr int kCount = static_cast<int>(Id::kCount);
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == static_cast<size_t>(kCount),
              "params.def rows and ids disagree");

// One setting's parsed value.
struct Value {
  bool set = false;     // given in the environment (valid or not)
  bool isAuto = false;  // INT_AUTO / SIZE_AUTO: "auto"
  int64_t i = 0;        // INT, BOOL, SIZE, *_AUTO, ENUM (the word's index)
  double d = 0.0;       // DOUBLE
  std::string s;        // STRING, ENUM (the word), LIST (as given); the canonical text otherwise
  std::vector<std::string> list;  // LIST
};

struct Snapshot {
  Value v[kCount];
};

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> splitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item =
        trim(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

bool parseInt(const std::string& t, int64_t* out) {
  if (t.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(t.c_str(), &end, 0);
  if (errno != 0 || end == t.c_str() || *end != '\0') return false;
  *out = x;
  return true;
}

// A byte count: digits, then optionally K, M or G (binary), with an optional "B" or "iB".
bool parseSize(const std::string& t, int64_t* out) {
  if (t.empty() || t[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(t.c_str(), &end, 10);
  if (errno != 0 || end == t.c_str()) return false;
  std::string suffix(end);
  int shift = 0;
  if (!suffix.empty()) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0])));
    if (c == 'K')
      shift = 10;
    else if (c == 'M')
      shift = 20;
    else if (c == 'G')
      shift = 30;
    else if (c == 'B' && suffix.size() == 1)
      shift = 0;
    else
      return false;
    if (shift != 0) {
      const std::string rest = suffix.substr(1);
      if (!rest.empty() && strcasecmp(rest.c_str(), "B") != 0 &&
          strcasecmp(rest.c_str(), "iB") != 0)
        return false;
    }
  }
  if (x > (static_cast<unsigned long long>(INT64_MAX) >> shift)) return false;
  *out = static_cast<int64_t>(x << shift);
  return true;
}

bool parseBool(const std::string& t, int64_t* out) {
  static const char* const kTrue[] = {"1", "true", "yes", "on"};
  static const char* const kFalse[] = {"0", "false", "no", "off"};
  for (const char* w : kTrue)
    if (strcasecmp(t.c_str(), w) == 0) return *out = 1, true;
  for (const char* w : kFalse)
    if (strcasecmp(t.c_str(), w) == 0) return *out = 0, true;
  return false;
}

// "lo..hi", "lo.." or "..hi" in an INT/SIZE row's values; true when x lies in it (or there is
// none).
bool inRange(const char* range, int64_t x) {
  if (range == nullptr || *range == '\0') return true;
  const std::string r(range);
  const size_t dots = r.find("..");
  if (dots == std::string::npos) return true;
  int64_t lo = 0, hi = 0;
  if (dots > 0 && parseSize(r.substr(0, dots), &lo) && x < lo) return false;
  if (dots > 0 && r[0] == '-' && parseInt(r.substr(0, dots), &lo) && x < lo) return false;
  if (dots + 2 < r.size() && parseSize(r.substr(dots + 2), &hi) && x > hi) return false;
  return true;
}

// Parses `text` as a value of `info`. On failure `*expected` says what was expected.
bool parse(const Info& info, const std::string& raw, Value* v, std::string* expected) {
  const std::string t = trim(raw);
  switch (info.type) {
    case Type::INT:
    case Type::INT_AUTO:
      if (info.type == Type::INT_AUTO && strcasecmp(t.c_str(), "auto") == 0) {
        v->isAuto = true;
        v->s = "auto";
        return true;
      }
      if (!parseInt(t, &v->i) || !inRange(info.values, v->i)) {
        *expected = std::string(info.type == Type::INT_AUTO ? "auto or an integer" : "an integer") +
                    (*info.values ? std::string(" in ") + info.values : std::string());
        return false;
      }
      v->s = std::to_string(v->i);
      return true;
    case Type::SIZE:
    case Type::SIZE_AUTO:
      if (info.type == Type::SIZE_AUTO && strcasecmp(t.c_str(), "auto") == 0) {
        v->isAuto = true;
        v->s = "auto";
        return true;
      }
      if (!parseSize(t, &v->i) || !inRange(info.values, v->i)) {
        *expected =
            std::string(info.type == Type::SIZE_AUTO ? "auto or a byte count" : "a byte count") +
            " (K, M, G suffixes allowed)" +
            (*info.values ? std::string(" in ") + info.values : std::string());
        return false;
      }
      v->s = std::to_string(v->i);
      return true;
    case Type::BOOL:
      if (!parseBool(t, &v->i)) {
        *expected = "0 or 1";
        return false;
      }
      v->s = v->i ? "1" : "0";
      return true;
    case Type::DOUBLE: {
      char* end = nullptr;
      v->d = std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0') {
        *expected = "a number";
        return false;
      }
      v->s = t;
      return true;
    }
    case Type::STRING:
      v->s = raw;
      return true;
    case Type::ENUM: {
      const std::vector<std::string> words = splitCommas(info.values);
      for (size_t k = 0; k < words.size(); ++k)
        if (strcasecmp(words[k].c_str(), t.c_str()) == 0) {
          v->i = static_cast<int64_t>(k);
          v->s = words[k];
          return true;
        }
      *expected = std::string("one of ") + info.values;
      return false;
    }
    case Type::LIST: {
      v->list = splitCommas(t);
      if (*info.values != '\0') {
        const std::vector<std::string> words = splitCommas(info.values);
        for (std::string& item : v->list) {
          bool ok = false;
          for (const std::string& w : words)
            if (strcasecmp(w.c_str(), item.c_str()) == 0) {
              item = w;
              ok = true;
            }
          if (!ok) {
            *expected = std::string("a comma list of ") + info.values;
            return false;
          }
        }
      }
      std::string joined;
      for (const std::string& item : v->list) joined += (joined.empty() ? "" : ",") + item;
      v->s = joined;
      return true;
    }
  }
  return false;
}

// The environment's text for a setting, MKERNEL_ first, then the NCCL twin; nullptr when neither
// is set (an empty value counts as unset). `from` names the variable it came from.
const char* envText(const Info& info, std::string* from) {
  const std::string own = std::string("MKERNEL_") + info.name;
  const char* v = std::getenv(own.c_str());
  if (v != nullptr && *v != '\0') {
    *from = own;
    return v;
  }
  if (*info.nccl != '\0') {
    v = std::getenv(info.nccl);
    if (v != nullptr && *v != '\0') {
      *from = info.nccl;
      return v;
    }
  }
  return nullptr;
}

Snapshot* build(std::vector<std::string>* warnings) {
  Snapshot* snap = new Snapshot();
  for (int k = 0; k < kCount; ++k) {
    const Info& info = kInfo[k];
    Value& v = snap->v[k];
    std::string expected;
    const bool defOk = parse(info, info.def, &v, &expected);
    if (!defOk)
      warnings->push_back(std::string("MKERNEL_") + info.name + ": the declared default '" +
                          info.def + "' is not " + expected + " (bug in common/params.def)");
    std::string from;
    const char* text = envText(info, &from);
    if (text == nullptr) continue;
    Value given;
    if (parse(info, text, &given, &expected)) {
      given.set = true;
      v = std::move(given);
    } else {
      v.set = true;
      warnings->push_back(from + "=" + text + " is not valid: expected " + expected +
                          "; using the default '" + info.def + "'");
    }
  }
  return snap;
}

std::mutex gMu;
std::atomic<Snapshot*> gSnap{nullptr};
std::vector<Snapshot*>* gOld = nullptr;  // kept: references handed out stay valid

const Value& value(Id id) {
  Snapshot* s = gSnap.load(std::memory_order_acquire);
  if (s == nullptr) {
    std::vector<std::string> warnings;
    {
      std::lock_guard<std::mutex> lock(gMu);
      s = gSnap.load(std::memory_order_acquire);
      if (s == nullptr) {
        s = build(&warnings);
        gSnap.store(s, std::memory_order_release);
      }
    }
    // Outside the lock: the logger's first line reads its own settings.
    for (const std::string& w : warnings) MK_WARN("%s", w.c_str());
  }
  return s->v[static_cast<int>(id)];
}

const Info* findByName(const char* name) {
  for (const Info& p : kInfo)
    if (std::strcmp(p.name, name) == 0) return &p;
  return nullptr;
}

}  // namespace

const Info* table() {
  return kInfo;
}
const Info& info(Id id) {
  return kInfo[static_cast<int>(id)];
}

const char* typeName(Type t) {
  switch (t) {
    case Type::INT:
      return "int";
    case Type::BOOL:
      return "bool";
    case Type::SIZE:
      return "size";
    case Type::INT_AUTO:
      return "int or auto";
    case Type::SIZE_AUTO:
      return "size or auto";
    case Type::DOUBLE:
      return "double";
    case Type::STRING:
      return "string";
    case Type::ENUM:
      return "enum";
    case Type::LIST:
      return "list";
  }
  return "?";
}

const char* audienceName(Audience a) {
  switch (a) {
    case Audience::USER:
      return "user";
    case Audience::TUNING:
      return "tuning";
    case Audience::TEST:
      return "test";
  }
  return "?";
}

int64_t Param<Type::INT>::operator()() const {
  return value(id).i;
}
bool Param<Type::BOOL>::operator()() const {
  return value(id).i != 0;
}
int64_t Param<Type::SIZE>::operator()() const {
  return value(id).i;
}
std::optional<int64_t> Param<Type::INT_AUTO>::operator()() const {
  const Value& v = value(id);
  return v.isAuto ? std::nullopt : std::optional<int64_t>(v.i);
}
std::optional<int64_t> Param<Type::SIZE_AUTO>::operator()() const {
  const Value& v = value(id);
  return v.isAuto ? std::nullopt : std::optional<int64_t>(v.i);
}
double Param<Type::DOUBLE>::operator()() const {
  return value(id).d;
}
const std::string& Param<Type::STRING>::operator()() const {
  return value(id).s;
}
const std::vector<std::string>& Param<Type::LIST>::operator()() const {
  return value(id).list;
}
int Param<Type::ENUM>::operator()() const {
  return static_cast<int>(value(id).i);
}

bool Param<Type::ENUM>::is(const char* word) const {
  const Info& inf = info();
  bool known = false;
  for (const std::string& w : splitCommas(inf.values)) known = known || w == word;
  if (!known)
    MK_WARN("MKERNEL_%s has no value '%s' (bug: params.def allows %s)", inf.name, word, inf.values);
  return value(id).s == word;
}

#define MKERNEL_PARAM_COMMON(T)              \
  bool Param<Type::T>::isSet() const {       \
    return value(id).set;                    \
  }                                          \
  const char* Param<Type::T>::text() const { \
    return value(id).s.c_str();              \
  }
MKERNEL_PARAM_COMMON(INT)
MKERNEL_PARAM_COMMON(BOOL)
MKERNEL_PARAM_COMMON(SIZE)
MKERNEL_PARAM_COMMON(INT_AUTO)
MKERNEL_PARAM_COMMON(SIZE_AUTO)
MKERNEL_PARAM_COMMON(DOUBLE)
MKERNEL_PARAM_COMMON(STRING)
MKERNEL_PARAM_COMMON(LIST)
MKERNEL_PARAM_COMMON(ENUM)
#undef MKERNEL_PARAM_COMMON

std::vector<std::pair<std::string, std::string>> routeSettings() {
  std::vector<std::pair<std::string, std::string>> out;
  for (int k = 0; k < kCount; ++k)
    if (kInfo[k].route) out.emplace_back(kInfo[k].name, value(static_cast<Id>(k)).s);
  return out;
}

void warnUnknownOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      if (std::strncmp(*e, "MKERNEL_", 8) != 0) continue;
      const char* eq = std::strchr(*e, '=');
      std::string name(*e + 8, eq ? static_cast<size_t>(eq - *e - 8) : std::strlen(*e + 8));
      if (findByName(name.c_str()) == nullptr)
        MK_WARN("MKERNEL_%s is not a known mkernel variable and is ignored (see docs/TUNING.md)",
                name.c_str());
    }
  });
}

void resetThisCopyForTesting() {
  std::lock_guard<std::mutex> lock(gMu);
  Snapshot* s = gSnap.exchange(nullptr, std::memory_order_acq_rel);
  if (s == nullptr) return;
  if (gOld == nullptr) gOld = new std::vector<Snapshot*>();
  gOld->push_back(s);
}

void resetForTesting() {
  resetThisCopyForTesting();
  // A test linked to mkernel's static libraries that also loads libmkernel.so (linked, or opened
  // with RTLD_LOCAL as NCCL opens its plugins) holds more than one copy of the registry: reset the
  // copy of every loaded object that exports mkernelResetParamsForTesting (plugin/mkernel_api.h).
  std::vector<std::string> objects;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0')
          static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
        return 0;
      },
      &objects);
  using ResetFn = void (*)();
  for (const std::string& o : objects) {
    void* h = dlopen(o.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) continue;
    if (auto fn = reinterpret_cast<ResetFn>(dlsym(h, "mkernelResetParamsForTesting"))) fn();
    dlclose(h);
  }
}

}  // namespace params

// The raw text in effect for `name` (MKERNEL_, the twin, the default); nullptr for an undeclared
// name, a programming error.
namespace {
const char* rawText(const char* name, const params::Info** infoOut) {
  const params::Info* info = params::findByName(name);
  *infoOut = info;
  if (info == nullptr) {
    MK_WARN("MKERNEL_%s is read by the code but not declared in common/params.def (bug)", name);
    return nullptr;
  }
  std::string from;
  const char* v = params::envText(*info, &from);
  return v != nullptr ? v : info->def;
}
}  // namespace

std::string paramString(const char* name) {
  const params::Info* info = nullptr;
  const char* v = rawText(name, &info);
  return v == nullptr ? std::string() : std::string(v);
}

int64_t paramInt(const char* name, int64_t fallback) {
  const params::Info* info = nullptr;
  const char* v = rawText(name, &info);
  if (v == nullptr) return fallback;
  params::Value parsed;
  std::string expected;
  if (params::parse(*info, v, &parsed, &expected) && !parsed.isAuto) return parsed.i;
  if (params::parse(*info, info->def, &parsed, &expected) && !parsed.isAuto) return parsed.i;
  return fallback;
}

bool paramIsSet(const char* name) {
  const params::Info* info = params::findByName(name);
  std::string from;
  return info != nullptr && params::envText(*info, &from) != nullptr;
}

}  // namespace mkernel
