// A stand-in libnccl.so.2 for the shim's CPU tests, loaded through MKERNEL_NCCL_LIBRARY: the few
// entry points the shim needs to load it and to create, use and destroy communicators without a
// GPU, reporting the version it was built with (FAKE_NCCL_VERSION_CODE). Like NCCL, it calls its
// own exported names through its PLT (ncclAllReduce asks ncclCommGetAsyncError, as NCCL's enqueue
// does), so that re-entry into the shim happens as under LD_PRELOAD. Hooks for the tests:
// fakeNccl* (test_shim_handles.cc).
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifndef FAKE_NCCL_VERSION_CODE
#error "FAKE_NCCL_VERSION_CODE: the version this fake reports"
#endif

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct FakeComm {
  uint64_t magic;
  int rank, nRanks;
};
constexpr uint64_t kFakeMagic = 0x6c63636e656b6166ull;  // "fakenccl"

std::atomic<int> gAsyncCalls{0}, gAllReduceCalls{0}, gGroupDepth{0};
std::atomic<int> gLastOp{-1};
ncclResult_t gReentered =
    ncclInternalError;  // what ncclAllReduce's own ncclCommGetAsyncError answered
void (*gDestroyHook)(void*) = nullptr;
// The last comm freed: the next creation gets its address back, as an allocator may.
FakeComm* gFreed = nullptr;
int gNextOp =
    ncclNumOps + 7;  // not the shim's first slot: the numbers the application sees are these

bool live(ncclComm_t c) {
  return c != nullptr && reinterpret_cast<FakeComm*>(c)->magic == kFakeMagic;
}

void release(ncclComm_t c) {
  if (gDestroyHook != nullptr) gDestroyHook(c);
  FakeComm* f = reinterpret_cast<FakeComm*>(c);
  f->magic = 0;
  gFreed = f;  // kept for reuse, never freed
}

}  // namespace

FAKE_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = FAKE_NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, "fake-nccl-id", 12);
  return ncclSuccess;
}

FAKE_EXPORT const char* ncclGetLastError(ncclComm_t) {
  return "fake NCCL";
}

FAKE_EXPORT const char* ncclGetErrorString(ncclResult_t) {
  return "fake NCCL's error string";
}

FAKE_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId,
                                                int rank, ncclConfig_t*) {
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  FakeComm* f = gFreed != nullptr ? gFreed : static_cast<FakeComm*>(std::malloc(sizeof(FakeComm)));
  gFreed = nullptr;
  f->magic = kFakeMagic;
  f->rank = rank;
  f->nRanks = nranks;
  *comm = reinterpret_cast<ncclComm_t>(f);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!live(comm)) return ncclInvalidArgument;
  release(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!live(comm)) return ncclInvalidArgument;
  release(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!live(comm) || asyncError == nullptr) return ncclInvalidArgument;
  gAsyncCalls.fetch_add(1);
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t op,
                                       ncclComm_t comm, cudaStream_t) {
  if (!live(comm)) return ncclInvalidArgument;
  gAllReduceCalls.fetch_add(1);
  gLastOp.store(static_cast<int>(op));
  // Through the PLT, as NCCL's enqueue: under the shim this lands in the shim first.
  ncclResult_t async = ncclInternalError;
  gReentered = ncclCommGetAsyncError(comm, &async) == ncclSuccess ? async : ncclInternalError;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclGroupStart() {
  gGroupDepth.fetch_add(1);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclGroupEnd() {
  if (gGroupDepth.load() == 0) return ncclInvalidUsage;
  gGroupDepth.fetch_sub(1);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t,
                                                  ncclScalarResidence_t, ncclComm_t comm) {
  if (!live(comm) || op == nullptr) return ncclInvalidArgument;
  *op = static_cast<ncclRedOp_t>(gNextOp++);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (!live(comm) || static_cast<int>(op) < ncclNumOps) return ncclInvalidArgument;
  gLastOp.store(static_cast<int>(op));
  return ncclSuccess;
}

// --- the tests' hooks ------------------------------------------------------------------------

// Called with the comm at the start of every ncclCommDestroy and ncclCommAbort.
FAKE_EXPORT void fakeNcclSetDestroyHook(void (*hook)(void*)) {
  gDestroyHook = hook;
}

// NCCL's code calling its own exported ncclCommGetAsyncError through its PLT, as its enqueue
// does: under the shim that call reaches the shim first. A call, not a jump: the shim knows NCCL's
// calls by their return address (a tail call would carry this function's caller's).
FAKE_EXPORT ncclResult_t fakeNcclReenterAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const ncclResult_t r = ncclCommGetAsyncError(comm, asyncError);
  gReentered = r;
  return r;
}

FAKE_EXPORT int fakeNcclAsyncErrorCalls() {
  return gAsyncCalls.load();
}

FAKE_EXPORT int fakeNcclAllReduceCalls() {
  return gAllReduceCalls.load();
}

// The op of the last ncclAllReduce or ncclRedOpDestroy.
FAKE_EXPORT int fakeNcclLastOp() {
  return gLastOp.load();
}

// What the last ncclAllReduce's own (re-entering) ncclCommGetAsyncError answered.
FAKE_EXPORT int fakeNcclReentered() {
  return static_cast<int>(gReentered);
}

FAKE_EXPORT int fakeNcclGroupDepth() {
  return gGroupDepth.load();
}
