#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

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
};
LogState g;
std::atomic<NcclLogger> gNcclLogger{nullptr};
thread_local int tRank = -1;
std::mutex gWriteMutex;

struct SubsysName {
  const char* name;
  uint64_t bit;
};
const SubsysName kSubsys[] = {{"INIT", kLogInit},   {"COLL", kLogColl},   {"P2P", kLogP2p},
                              {"SHM", kLogShm},     {"NET", kLogNet},     {"GRAPH", kLogGraph},
                              {"TUNE", kLogTune},   {"TUNING", kLogTune}, {"ENV", kLogEnv},
                              {"ALLOC", kLogAlloc}, {"CALL", kLogCall},   {"PROXY", kLogProxy},
                              {"BOOTSTRAP", kLogBootstrap}, {"REG", kLogReg}, {"ALL", kLogAll}};

LogLevel parseLevel(const std::string& v) {
  if (strcasecmp(v.c_str(), "VERSION") == 0) return LogLevel::Version;
  if (strcasecmp(v.c_str(), "WARN") == 0) return LogLevel::Warn;
  if (strcasecmp(v.c_str(), "INFO") == 0) return LogLevel::Info;
  if (strcasecmp(v.c_str(), "TRACE") == 0) return LogLevel::Trace;
  if (strcasecmp(v.c_str(), "NONE") == 0) return LogLevel::None;
  return LogLevel::Warn;
}

uint64_t parseMask(const std::string& v) {
  bool invert = !v.empty() && v[0] == '^';
  uint64_t mask = 0;
  size_t pos = invert ? 1 : 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string tok = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (const SubsysName& s : kSubsys)
      if (strcasecmp(tok.c_str(), s.name) == 0) mask |= s.bit;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

void initOnce() {
  std::call_once(g.once, [] {
    gethostname(g.host, sizeof(g.host) - 1);
    if (char* dot = std::strchr(g.host, '.')) *dot = '\0';
    g.level = parseLevel(paramString("DEBUG"));
    g.mask = parseMask(paramString("DEBUG_SUBSYS"));
    const char* nccl = std::getenv("NCCL_DEBUG");
    g.ncclLevel = nccl != nullptr ? parseLevel(nccl) : LogLevel::Warn;
    std::string path = paramString("DEBUG_FILE");
    if (!path.empty()) {
      std::string out;
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
      }
    }
  });
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::Warn: return "WARN";
    case LogLevel::Info: return "INFO";
    case LogLevel::Trace: return "TRACE";
    case LogLevel::Version: return "VERSION";
    default: return "LOG";
  }
}

void vlog(LogLevel level, uint64_t subsys, const char* file, int line, const char* fmt,
          va_list ap) {
  char msg[2048];
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  if (NcclLogger nccl = gNcclLogger.load(std::memory_order_acquire)) {
    // NCCL filters by its own NCCL_DEBUG / NCCL_DEBUG_SUBSYS and adds its prefix.
    nccl(static_cast<int>(level), static_cast<unsigned long>(subsys), file, line, "MKERNEL %s", msg);
    return;
  }
  char rank[24] = "";
  if (tRank >= 0) std::snprintf(rank, sizeof(rank), " [%d]", tRank);
  const char* base = std::strrchr(file, '/');
  std::lock_guard<std::mutex> lock(gWriteMutex);
  if (level == LogLevel::Warn) {
    std::fprintf(g.file, "%s:%d:%ld%s MKERNEL WARN %s:%d %s\n", g.host, getpid(),
                 static_cast<long>(syscall(SYS_gettid)), rank, base ? base + 1 : file, line, msg);
  } else {
    std::fprintf(g.file, "%s:%d:%ld%s MKERNEL %s %s\n", g.host, getpid(),
                 static_cast<long>(syscall(SYS_gettid)), rank, levelName(level), msg);
  }
}

}  // namespace

void setNcclLogger(NcclLogger logger) { gNcclLogger.store(logger, std::memory_order_release); }
void setLogRank(int rank) { tRank = rank; }

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

const char* resultString(Result r) {
  switch (r) {
    case Result::Success: return "no error";
    case Result::UnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case Result::SystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case Result::InternalError: return "internal error - please report this issue to the NCCL developers";
    case Result::InvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case Result::InvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case Result::RemoteError: return "remote process exited or there was a network error";
    case Result::InProgress: return "NCCL operation in progress";
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
