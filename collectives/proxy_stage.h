// The proxy's copies between GPU net buffers and their host mirror (MKERNEL_PROXY_GDR=stage;
// docs/PROXY.md, "Staged by the proxy"): proxy::Stager on the CUDA runtime. Each copy is a
// cudaMemcpyAsync on one of two streams of its own (sends' copies to the host on one, receives'
// copies to the GPU on the other, so that the two directions' copy engines run at once) followed
// by an event; done() queries the event. The copy engines, not the kernel's CTAs, then move the
// rail's bytes across PCIe, and the kernel's node phases read and write HBM only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/result.h"
#include "transport/proxy/proxy.h"

namespace mkernel {
namespace coll {

class CudaStager : public proxy::Stager {
 public:
  explicit CudaStager(int cudaDev) : dev_(cudaDev) {}
  ~CudaStager() override;  // waits for the copies still running
  CudaStager(const CudaStager&) = delete;
  CudaStager& operator=(const CudaStager&) = delete;

  Result start(void* dst, const void* src, size_t bytes, bool toHost, uint64_t* ticket) override;
  Result done(uint64_t ticket, bool* done) override;

 private:
  Result init();  // on the proxy thread's first copy: its device, capture mode and streams

  int dev_;
  bool ready_ = false;
  void* streams_[2] = {nullptr, nullptr};  // cudaStream_t: to the host, to the GPU
  std::vector<void*> events_;              // cudaEvent_t; a ticket is an index
  std::vector<uint64_t> free_;             // tickets whose copies completed
};

}  // namespace coll
}  // namespace mkernel
