// MKERNEL_* settings: a typed registry read once.
//
// Every setting is declared once in common/params.def with its type, default, help, whether it can
// change a collective's route, its audience and its NCCL twin. The environment is read and parsed
// at the first access (thread-safe) and kept; call sites get typed values:
//
//   const int64_t t = params::TIMEOUT_S();                        // INT
//   if (const std::optional<int64_t> v = params::LL_MAX_BYTES())  // SIZE_AUTO: nullopt is "auto"
//   if (params::PDL.is("early"))                                  // ENUM
//
// Precedence: MKERNEL_<NAME>, else its NCCL twin (NCCL_SOCKET_IFNAME, ...), else the default. An
// invalid value is warned about once, naming the variable, the value and what is expected, and the
// default is used. MKERNEL_* variables that params.def does not declare are warned about once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mkernel {
namespace params {

enum class Type : uint8_t { INT, BOOL, SIZE, INT_AUTO, SIZE_AUTO, DOUBLE, STRING, ENUM, LIST };
enum class Audience : uint8_t { USER, TUNING, TEST };

// One row of params.def.
struct Info {
  const char* name;  // without the MKERNEL_ prefix
  Type type;
  const char* def;  // default as text; "" = unset
  bool route;       // can change where or how a collective runs
  Audience audience;
  const char* nccl;    // NCCL twin variable, "" = none
  const char* values;  // ENUM/LIST: allowed words; INT/SIZE: optional range "lo..hi"
  const char* help;
};

enum class Id : int {
#define MKERNEL_PARAM(name, ...) name,
#include "common/params.def"
#undef MKERNEL_PARAM
  kCount
};

// Every declared setting, in params.def order (kCount rows).
const Info* table();
const Info& info(Id id);
const char* typeName(Type t);
const char* audienceName(Audience a);

// A setting's handle; call it for its typed value.
template <Type T>
struct Param;

#define MKERNEL_PARAM_HANDLE(T, R)                                                            \
  template <>                                                                                 \
  struct Param<Type::T> {                                                                     \
    Id id;                                                                                    \
    R operator()() const;                                                                     \
    bool isSet() const;       /* set in the environment (MKERNEL_ or the NCCL twin) */        \
    const char* text() const; /* the value in effect as canonical text ("auto", "1048576") */ \
    const Info& info() const { return params::info(id); }                                     \
  };
MKERNEL_PARAM_HANDLE(INT, int64_t)
MKERNEL_PARAM_HANDLE(BOOL, bool)
MKERNEL_PARAM_HANDLE(SIZE, int64_t)
MKERNEL_PARAM_HANDLE(INT_AUTO, std::optional<int64_t>)   // nullopt: auto
MKERNEL_PARAM_HANDLE(SIZE_AUTO, std::optional<int64_t>)  // nullopt: auto
MKERNEL_PARAM_HANDLE(DOUBLE, double)
MKERNEL_PARAM_HANDLE(STRING, const std::string&)
MKERNEL_PARAM_HANDLE(LIST, const std::vector<std::string>&)
#undef MKERNEL_PARAM_HANDLE

template <>
struct Param<Type::ENUM> {
  Id id;
  int operator()() const;  // index of the word in params.def's values
  bool isSet() const;
  const char* text() const;  // the word in effect
  // Whether the word in effect is `word` (which must be one of the allowed words: a word that is
  // not is a programming error, warned about).
  bool is(const char* word) const;
  const Info& info() const { return params::info(id); }
};

#define MKERNEL_PARAM(name, type, ...) inline constexpr Param<Type::type> name{Id::name};
#include "common/params.def"
#undef MKERNEL_PARAM

// The timeout of every wait, in seconds (MKERNEL_TIMEOUT_S).
inline double timeoutSeconds() {
  return static_cast<double>(TIMEOUT_S());
}

// The settings that can change a collective's route, with their values in effect as canonical
// text, in params.def order: what ranks compare at communicator creation.
std::vector<std::pair<std::string, std::string>> routeSettings();

// Warns once per process about MKERNEL_* variables in the environment that params.def does not
// declare (typos are the usual cause of "my setting did nothing").
void warnUnknownOnce();

// Tests only: forget the values read, so that the next access reads the environment again (after
// a test's setenv). Values handed out before stay valid. Also resets the copy inside a loaded
// libmkernel.so (mkernelResetParamsForTesting); resetThisCopyForTesting resets this one only.
void resetForTesting();
void resetThisCopyForTesting();

}  // namespace params

// Text access by name, uncached, for the logger (which must not log while reading its own
// settings) and for tools: MKERNEL_<name>, else its NCCL twin, else the default; nothing is
// warned about. Code that runs collectives uses the typed handles above.
std::string paramString(const char* name);
int64_t paramInt(const char* name, int64_t fallback = 0);
bool paramIsSet(const char* name);

}  // namespace mkernel
