// mkernel's result codes and error messages.
//
// Values are identical to ncclResult_t so that plugin/ can return them unchanged; every failure
// carries a message that the shim exposes through ncclGetLastError() and that is logged at WARN.
#pragma once

#include <cstdarg>
#include <string>

namespace mkernel {

enum class Result : int {
  Success = 0,
  UnhandledCudaError = 1,
  SystemError = 2,
  InternalError = 3,
  InvalidArgument = 4,
  InvalidUsage = 5,
  RemoteError = 6,
  InProgress = 7,
};

const char* resultString(Result r);

// Records `fmt` as this thread's last error (see lastError()), logs it at WARN with the
// file/line of the caller, and returns `r`, so that failures read `return MK_ERROR(...)`.
Result setError(Result r, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
Result vsetError(Result r, const char* file, int line, const char* fmt, va_list ap);
// setError with " failed: <cause>" after the formatted context (common/check.h's checks).
Result setErrorCause(Result r, const char* file, int line, const char* cause, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

// The last message recorded by setError() on this thread ("" if none), and the last one recorded
// by any thread (what ncclGetLastError() reports, as NCCL's is process-wide too).
const char* lastError();
void clearLastError();

}  // namespace mkernel

#define MK_ERROR(res, ...) ::mkernel::setError((res), __FILE__, __LINE__, __VA_ARGS__)

// Propagates a failure, logging each frame as NCCL's NCCLCHECK does.
#define MK_CHECK(call)                                             \
  do {                                                             \
    ::mkernel::Result mk_check_res_ = (call);                      \
    if (mk_check_res_ != ::mkernel::Result::Success &&             \
        mk_check_res_ != ::mkernel::Result::InProgress) {          \
      ::mkernel::logTrace(__FILE__, __LINE__, "%s -> %s", #call,   \
                          ::mkernel::resultString(mk_check_res_)); \
      return mk_check_res_;                                        \
    }                                                              \
  } while (0)

namespace mkernel {
void logTrace(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
}
