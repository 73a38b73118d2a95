#include "common/log.h"

#include <sys/syscall.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/param.h"
#include "common/result.h"

namespace mkernel {
namespace {

struct LogState {
  std::once_flag once;
  LogLevel level = LogLevel::Warn;
  uint64_t mask = kLogAll;
  FILE* file = stderr;
  char host[64] = "?";
  // NCCL_DEBUG, for lines that go through NCCL's logger: NCCL drops those above its level, so
  // they are not even formatted (the shim's per-collective TRACE lines, the tuner's per-call
  // lines). Unset: NCCL's default, WARN.
  LogLevel ncclLevel = LogLevel::Warn;
  uint32_t timestampLevels = 1u << static_cast<int>(LogLevel::Warn);  // a bit per LogLevel
  std::string timestampFormat = "[%F %T] ";
};
LogState g;
std::atomic<NcclLogger> gNcclLogger{nullptr};
thread_local int tRank = -1;
std::mutex gWriteMutex;

struct SubsysName {
  const char* name;
  uint64_t bit;
};
const SubsysName kSubsys[] = {{"INIT", kLogInit},
                              {"COLL", kLogColl},
                              {"P2P", kLogP2p},
                              {"SHM", kLogShm},
                              {"NET", kLogNet},
                              {"GRAPH", kLogGraph},
                              {"TUNE", kLogTune},
                              {"TUNING", kLogTune},
                              {"ENV", kLogEnv},
                              {"ALLOC", kLogAlloc},
                              {"CALL", kLogCall},
                              {"PROXY", kLogProxy},
                              {"BOOTSTRAP", kLogBootstrap},
                              {"REG", kLogReg},
                              {"ALL", kLogAll}};

struct LevelName {
  const char* name;
  LogLevel level;
};
const LevelName kLevels[] = {{"NONE", LogLevel::None},   {"VERSION", LogLevel::Version},
                             {"WARN", LogLevel::Warn},   {"INFO", LogLevel::Info},
                             {"ABORT", LogLevel::Abort}, {"TRACE", LogLevel::Trace}};

bool parseLevel(const std::string& v, LogLevel* out) {
  for (const LevelName& l : kLevels)
    if (strcasecmp(v.c_str(), l.name) == 0) {
      *out = l.level;
      return true;
    }
  return false;
}

// Splits a comma list; empty items are skipped.
std::vector<std::string> splitList(const std::string& v) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string tok = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!tok.empty()) out.push_back(tok);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// MKERNEL_DEBUG_SUBSYS; names it does not know go to *unknown.
uint64_t parseMask(const std::string& v, std::string* unknown) {
  bool invert = !v.empty() && v[0] == '^';
  uint64_t mask = 0;
  for (const std::string& tok : splitList(invert ? v.substr(1) : v)) {
    bool known = false;
    for (const SubsysName& s : kSubsys)
      if (strcasecmp(tok.c_str(), s.name) == 0) {
        mask |= s.bit;
        known = true;
      }
    if (!known) *unknown += (unknown->empty() ? "" : ",") + tok;
  }
  return invert ? ~mask : mask;
}

// MKERNEL_DEBUG_TIMESTAMP_LEVELS: level names, ALL, or NONE; names it does not know go to *unknown.
uint32_t parseTimestampLevels(const std::string& v, std::string* unknown) {
  uint32_t bits = 0;
  for (const std::string& tok : splitList(v)) {
    LogLevel l;
    if (strcasecmp(tok.c_str(), "ALL") == 0) {
      bits = ~0u;
    } else if (strcasecmp(tok.c_str(), "NONE") == 0) {
      // nothing: an explicit "no timestamps"
    } else if (parseLevel(tok, &l) && l != LogLevel::None) {
      bits |= 1u << static_cast<int>(l);
    } else {
      *unknown += (unknown->empty() ? "" : ",") + tok;
    }
  }
  return bits;
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::Warn:
      return "WARN";
    case LogLevel::Info:
      return "INFO";
    case LogLevel::Trace:
      return "TRACE";
    case LogLevel::Version:
      return "VERSION";
    default:
      return "LOG";
  }
}

// A formatted line to our own output (MKERNEL_DEBUG_FILE or stderr).
void writeOwn(LogLevel level, const char* file, int line, const char* msg,
              const char* label = nullptr) {
  char stamp[256] = "";
  if ((g.timestampLevels >> static_cast<int>(level)) & 1u) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    std::tm tm;
    localtime_r(&ts.tv_sec, &tm);
    formatLogTimestamp(g.timestampFormat.c_str(), tm, ts.tv_nsec, stamp, sizeof(stamp));
  }
  char rank[24] = "";
  if (tRank >= 0) std::snprintf(rank, sizeof(rank), " [%d]", tRank);
  const char* base = std::strrchr(file, '/');
  std::lock_guard<std::mutex> lock(gWriteMutex);
  if (level == LogLevel::Version) {  // bare, as NCCL's version line
    std::fprintf(g.file, "%s%s\n", stamp, msg);
  } else if (level == LogLevel::Warn) {
    std::fprintf(g.file, "%s%s:%d:%ld%s MKERNEL WARN %s:%d %s\n", stamp, g.host, getpid(),
                 static_cast<long>(syscall(SYS_gettid)), rank, base ? base + 1 : file, line, msg);
  } else {
    std::fprintf(g.file, "%s%s:%d:%ld%s MKERNEL %s %s\n", stamp, g.host, getpid(),
                 static_cast<long>(syscall(SYS_gettid)), rank,
                 label != nullptr ? label : levelName(level), msg);
  }
}

void vlog(LogLevel level, uint64_t subsys, const char* file, int line, const char* fmt,
          va_list ap) {
  char msg[2048];
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  if (NcclLogger nccl = gNcclLogger.load(std::memory_order_acquire)) {
    // NCCL filters by its own NCCL_DEBUG / NCCL_DEBUG_SUBSYS and adds its prefix.
    nccl(static_cast<int>(level), static_cast<unsigned long>(subsys), file, line, "MKERNEL %s",
         msg);
    return;
  }
  writeOwn(level, file, line, msg);
}

// A WARN about the log's own settings, while they are read (initOnce must not be re-entered).
void settingsWarn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void settingsWarn(const char* fmt, ...) {
  if (gNcclLogger.load(std::memory_order_acquire) == nullptr &&
      static_cast<int>(g.level) < static_cast<int>(LogLevel::Warn))
    return;
  va_list ap;
  va_start(ap, fmt);
  vlog(LogLevel::Warn, kLogAll, __FILE__, __LINE__, fmt, ap);
  va_end(ap);
}

void initOnce() {
  std::call_once(g.once, [] {
    gethostname(g.host, sizeof(g.host) - 1);
    if (char* dot = std::strchr(g.host, '.')) *dot = '\0';
    const std::string level = paramString("DEBUG");
    const bool levelKnown = parseLevel(level, &g.level);
    if (!levelKnown) g.level = LogLevel::Warn;
    std::string unknownSubsys;
    const std::string subsys = paramString("DEBUG_SUBSYS");
    g.mask = parseMask(subsys, &unknownSubsys);
    const char* nccl = std::getenv("NCCL_DEBUG");
    if (nccl == nullptr || !parseLevel(nccl, &g.ncclLevel)) g.ncclLevel = LogLevel::Warn;
    std::string unknownLevels;
    const std::string stampLevels = paramString("DEBUG_TIMESTAMP_LEVELS");
    g.timestampLevels = parseTimestampLevels(stampLevels, &unknownLevels);
    g.timestampFormat = paramString("DEBUG_TIMESTAMP_FORMAT");
    std::string path = paramString("DEBUG_FILE");
    std::string out;
    bool fileFailed = false;
    int fileErrno = 0;
    if (!path.empty()) {
      for (size_t i = 0; i < path.size(); ++i) {
        if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'h') {
          out += g.host;
          ++i;
        } else if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'p') {
          out += std::to_string(getpid());
          ++i;
        } else {
          out += path[i];
        }
      }
      if (FILE* f = std::fopen(out.c_str(), "a")) {
        setvbuf(f, nullptr, _IOLBF, 0);
        g.file = f;
      } else {
        fileFailed = true;
        fileErrno = errno;
      }
    }
    // The settings are in place: what was not understood is said now, once per process.
    if (!levelKnown)
      settingsWarn(
          "MKERNEL_DEBUG=%s is not a log level (NONE, VERSION, WARN, INFO, TRACE); using WARN",
          level.c_str());
    if (!unknownSubsys.empty())
      settingsWarn(
          "MKERNEL_DEBUG_SUBSYS=%s: unknown subsystem(s) %s, ignored (known: INIT, COLL, P2P, SHM, "
          "NET, "
          "GRAPH, TUNE, ENV, ALLOC, CALL, PROXY, BOOTSTRAP, REG, ALL)",
          subsys.c_str(), unknownSubsys.c_str());
    if (!unknownLevels.empty())
      settingsWarn(
          "MKERNEL_DEBUG_TIMESTAMP_LEVELS=%s: unknown level(s) %s, ignored (known: VERSION, WARN, "
          "INFO, "
          "TRACE, ALL, NONE)",
          stampLevels.c_str(), unknownLevels.c_str());
    if (fileFailed)
      settingsWarn(
          "MKERNEL_DEBUG_FILE=%s: cannot open %s for appending (%s); logging to stderr instead",
          path.c_str(), out.c_str(), std::strerror(fileErrno));
  });
}

}  // namespace

size_t formatLogTimestamp(const char* format, const std::tm& tm, long nsec, char* out,
                          size_t size) {
  if (size == 0) return 0;
  out[0] = '\0';
  if (format == nullptr || *format == '\0') return 0;
  // %<d>f becomes d digits of the fraction of a second (truncated), %% stays for strftime, and
  // '_' is a space (hard to pass on a command line otherwise): then strftime does the rest.
  std::string fmt;
  for (const char* p = format; *p != '\0'; ++p) {
    if (p[0] == '%' && p[1] == '%') {
      fmt += "%%";
      ++p;
    } else if (p[0] == '%' && p[1] >= '1' && p[1] <= '9' && p[2] == 'f') {
      const int digits = p[1] - '0';
      long frac = nsec < 0 ? 0 : nsec % 1000000000L;
      for (int d = digits; d < 9; ++d) frac /= 10;
      char buf[32];  // any long in decimal, whatever the digits asked for
      std::snprintf(buf, sizeof(buf), "%0*ld", digits, frac);
      fmt += buf;
      p += 2;
    } else {
      fmt += *p == '_' ? ' ' : *p;
    }
  }
  // The format is the user's setting by design (NCCL_DEBUG_TIMESTAMP_FORMAT's contract).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  const size_t n = std::strftime(out, size, fmt.c_str(), &tm);
#pragma GCC diagnostic pop
  if (n == 0) out[0] = '\0';
  return n;
}

void setNcclLogger(NcclLogger logger) {
  gNcclLogger.store(logger, std::memory_order_release);
}
void setLogRank(int rank) {
  tRank = rank;
}

bool logEnabled(LogLevel level, uint64_t subsys) {
  initOnce();
  if (gNcclLogger.load(std::memory_order_relaxed) != nullptr)  // NCCL filters the subsystems
    return level <= LogLevel::Warn || static_cast<int>(level) <= static_cast<int>(g.ncclLevel);
  if (static_cast<int>(level) > static_cast<int>(g.level)) return false;
  return level <= LogLevel::Warn || (g.mask & subsys) != 0;
}

void logMessage(LogLevel level, uint64_t subsys, const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(level, subsys)) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(level, subsys, file, line, fmt, ap);
  va_end(ap);
}

bool logStartupEnabled() {
  initOnce();
  if (gNcclLogger.load(std::memory_order_acquire) != nullptr &&
      static_cast<int>(g.ncclLevel) >= static_cast<int>(LogLevel::Info))
    return true;
  return g.level == LogLevel::Version ||
         static_cast<int>(g.level) >= static_cast<int>(LogLevel::Info);
}

void logStartupLine(const char* fmt, ...) {
  if (!logStartupEnabled()) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  // A plugin under NCCL_DEBUG=INFO or TRACE: through NCCL's logger, beside NCCL's own lines.
  if (NcclLogger nccl = gNcclLogger.load(std::memory_order_acquire)) {
    if (static_cast<int>(g.ncclLevel) >= static_cast<int>(LogLevel::Info)) {
      nccl(static_cast<int>(LogLevel::Info), kLogInit, __FILE__, __LINE__, "MKERNEL %s", msg);
      return;
    }
  }
  // Otherwise MKERNEL_DEBUG decides, and the line goes to our own output (NCCL would drop it).
  if (g.level == LogLevel::Version)
    writeOwn(LogLevel::Version, __FILE__, __LINE__, msg);
  else if (static_cast<int>(g.level) >= static_cast<int>(LogLevel::Info))
    writeOwn(LogLevel::Info, __FILE__, __LINE__, msg);
}

void logRequested(const char* label, const char* fmt, ...) {
  initOnce();
  if (g.level == LogLevel::None) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  writeOwn(LogLevel::Info, __FILE__, __LINE__, msg, label);
}

void logTrace(const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(LogLevel::Trace, kLogAll)) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(LogLevel::Trace, kLogAll, file, line, fmt, ap);
  va_end(ap);
}

// ---- errors ----------------------------------------------------------------------------------

namespace {
thread_local std::string tLastError;
std::mutex gLastErrorMutex;
std::string gLastError;
}  // namespace

// mkernel's own failures point at mkernel's log, not NCCL's (the shim's ncclGetErrorString gives
// these for an error that arose in mkernel, NCCL's texts for NCCL's).
const char* resultString(Result r) {
  switch (r) {
    case Result::Success:
      return "no error";
    case Result::UnhandledCudaError:
      return "unhandled cuda error in mkernel (run with MKERNEL_DEBUG=INFO for details; "
             "MKERNEL_DEBUG_SUBSYS selects "
             "the subsystems)";
    case Result::SystemError:
      return "unhandled system error in mkernel (run with MKERNEL_DEBUG=INFO for details; "
             "MKERNEL_DEBUG_SUBSYS "
             "selects the subsystems)";
    case Result::InternalError:
      return "internal error in mkernel - please report this issue to the mkernel developers";
    case Result::InvalidArgument:
      return "invalid argument (run with MKERNEL_DEBUG=WARN for details)";
    case Result::InvalidUsage:
      return "invalid usage (run with MKERNEL_DEBUG=WARN for details)";
    case Result::RemoteError:
      return "remote process exited or there was a network error";
    case Result::InProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

Result vsetError(Result r, const char* file, int line, const char* fmt, va_list ap) {
  char msg[1024];
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  tLastError = msg;
  {
    std::lock_guard<std::mutex> lock(gLastErrorMutex);
    gLastError = msg;
  }
  logMessage(LogLevel::Warn, kLogAll, file, line, "%s", msg);
  return r;
}

Result setError(Result r, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsetError(r, file, line, fmt, ap);
  va_end(ap);
  return r;
}

Result setErrorCause(Result r, const char* file, int line, const char* cause, const char* fmt,
                     ...) {
  char context[768];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(context, sizeof(context), fmt, ap);
  va_end(ap);
  return setError(r, file, line, "%s failed: %s", context, cause);
}

const char* lastError() {
  if (!tLastError.empty()) return tLastError.c_str();
  std::lock_guard<std::mutex> lock(gLastErrorMutex);
  static thread_local std::string copy;
  copy = gLastError;
  return copy.c_str();
}

void clearLastError() {
  tLastError.clear();
  std::lock_guard<std::mutex> lock(gLastErrorMutex);
  gLastError.clear();
}

}  // namespace mkernel
