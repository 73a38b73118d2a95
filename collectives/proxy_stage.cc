#include "collectives/proxy_stage.h"

#include <cuda_runtime.h>

#include "common/log.h"

namespace mkernel {
namespace coll {

namespace {
cudaStream_t stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

CudaStager::~CudaStager() {
  for (void* s : streams_) {
    if (s == nullptr) continue;
    (void)cudaStreamSynchronize(stream(s));
    (void)cudaStreamDestroy(stream(s));
  }
  for (void* e : events_) (void)cudaEventDestroy(event(e));
}

Result CudaStager::init() {
  if (cudaSetDevice(dev_) != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "proxy copies: cudaSetDevice(%d): %s", dev_,
                    cudaGetErrorString(cudaGetLastError()));
  // Another thread may be capturing a CUDA graph in global mode (PyTorch does), which forbids
  // this thread's event queries unless it is relaxed; the copies are on streams of our own and
  // never part of a capture.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  for (void*& s : streams_) {
    cudaStream_t st = nullptr;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError, "proxy copies: cudaStreamCreateWithFlags: %s",
                      cudaGetErrorString(cudaGetLastError()));
    s = st;
  }
  ready_ = true;
  return Result::Success;
}

Result CudaStager::start(void* dst, const void* src, size_t bytes, bool toHost, uint64_t* ticket) {
  if (!ready_) MK_CHECK(init());
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError, "proxy copies: cudaEventCreateWithFlags: %s",
                      cudaGetErrorString(cudaGetLastError()));
    events_.push_back(e);
    free_.push_back(events_.size() - 1);
  }
  const uint64_t t = free_.back();
  cudaStream_t s = stream(streams_[toHost ? 0 : 1]);
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, toHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) err = cudaEventRecord(event(events_[t]), s);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "proxy copies: %zu bytes %s: %s", bytes, toHost ? "to the host" : "to the GPU",
                    cudaGetErrorString(err));
  free_.pop_back();
  *ticket = t;
  return Result::Success;
}

Result CudaStager::done(uint64_t ticket, bool* done) {
  *done = false;
  if (ticket >= events_.size())
    return MK_ERROR(Result::InternalError, "proxy copies: unknown copy %llu", static_cast<unsigned long long>(ticket));
  const cudaError_t err = cudaEventQuery(event(events_[ticket]));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: the copy is running
    return Result::Success;
  }
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "proxy copies: cudaEventQuery: %s", cudaGetErrorString(err));
  free_.push_back(ticket);
  *done = true;
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
