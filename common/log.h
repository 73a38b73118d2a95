// NCCL-style logging: MKERNEL_DEBUG=VERSION|WARN|INFO|TRACE (default WARN), MKERNEL_DEBUG_FILE,
// MKERNEL_DEBUG_SUBSYS. One line per event, prefixed "host:pid:tid [rank] MKERNEL <LEVEL>", and,
// for the levels in MKERNEL_DEBUG_TIMESTAMP_LEVELS (default WARN, as NCCL_DEBUG_TIMESTAMP_LEVELS;
// NONE: no timestamps), by the time in MKERNEL_DEBUG_TIMESTAMP_FORMAT (default "[%F %T] ", as
// NCCL_DEBUG_TIMESTAMP_FORMAT). A value the log does not understand (a level, a subsystem, a file
// that cannot be opened) is reported by one WARN when the settings are read, at the first line.
// When NCCL loaded us as a plugin it hands us its logger; lines then go through NCCL's
// NCCL_DEBUG machinery instead (setNcclLogger), and those above NCCL_DEBUG's level (WARN when
// unset) are dropped before they are formatted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>

namespace mkernel {

enum class LogLevel : int { None = 0, Version = 1, Warn = 2, Info = 3, Abort = 4, Trace = 5 };

// Subsystems, a bit each, as NCCL's ncclDebugLogSubSys (values chosen to match NCCL's where they
// exist, so that NCCL_DEBUG_SUBSYS filtering works when we log through NCCL).
enum LogSubsys : uint64_t {
  kLogInit = 0x1,
  kLogColl = 0x2,
  kLogP2p = 0x4,
  kLogShm = 0x8,
  kLogNet = 0x10,
  kLogGraph = 0x20,
  kLogTune = 0x40,
  kLogEnv = 0x80,
  kLogAlloc = 0x100,
  kLogCall = 0x200,
  kLogProxy = 0x400,
  kLogBootstrap = 0x1000,
  kLogReg = 0x2000,
  kLogAll = ~0ull,
};

// NCCL's logger signature (ncclDebugLogger_t).
using NcclLogger = void (*)(int level, unsigned long flags, const char* file, int line,
                            const char* fmt, ...);
void setNcclLogger(NcclLogger logger);

// The rank shown in the prefix for lines logged by this thread (-1: none).
void setLogRank(int rank);

bool logEnabled(LogLevel level, uint64_t subsys);

// The startup line ("mkernel 0.1.0 loaded as NCCL shim; ..."), as NCCL's "NCCL version ..." line:
// printed bare (no prefix) at MKERNEL_DEBUG=VERSION, as an INFO line at INFO and TRACE, not at
// WARN (the default) or NONE. Under NCCL's logger (plugins) it goes through NCCL as an INFO line
// when NCCL_DEBUG is INFO or TRACE. The caller prints it once per mode and process.
void logStartupLine(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// A line asked for by a setting of its own (MKERNEL_STATS), printed at every MKERNEL_DEBUG level
// but NONE, whatever MKERNEL_DEBUG_SUBSYS and NCCL_DEBUG say: "host:pid:tid [rank] MKERNEL
// <label> ...", to MKERNEL_DEBUG_FILE or stderr, timestamped as INFO lines are.
void logRequested(const char* label, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Whether logStartupLine prints (callers skip gathering what the line names otherwise).
bool logStartupEnabled();

// Writes the timestamp prefix for `format` (strftime's conversions, plus %<1-9>f for that many
// digits of the fraction of a second, as NCCL_DEBUG_TIMESTAMP_FORMAT; '_' stands for a space) at
// time `tm` + `nsec` into `out`; returns the characters written (0: empty format, or it did not
// fit, and then out is "").
size_t formatLogTimestamp(const char* format, const std::tm& tm, long nsec, char* out, size_t size);
void logMessage(LogLevel level, uint64_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

}  // namespace mkernel

#define MK_WARN(...)                                                                       \
  ::mkernel::logMessage(::mkernel::LogLevel::Warn, ::mkernel::kLogAll, __FILE__, __LINE__, \
                        __VA_ARGS__)
#define MK_INFO(subsys, ...)                                                                       \
  do {                                                                                             \
    if (::mkernel::logEnabled(::mkernel::LogLevel::Info, (subsys)))                                \
      ::mkernel::logMessage(::mkernel::LogLevel::Info, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define MK_TRACE(subsys, ...)                                                         \
  do {                                                                                \
    if (::mkernel::logEnabled(::mkernel::LogLevel::Trace, (subsys)))                  \
      ::mkernel::logMessage(::mkernel::LogLevel::Trace, (subsys), __FILE__, __LINE__, \
                            __VA_ARGS__);                                             \
  } while (0)
