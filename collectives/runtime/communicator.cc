// Communicator::create and the communicator that runs collectives in the persistent kernel
// (docs/KERNEL.md).
#include "collectives/communicator.h"

#include "collectives/stats.h"
#include "collectives/algo/work.h"
#include "common/log.h"
#include "transport/bootstrap/bootstrap.h"

namespace mkernel {
namespace coll {

#ifdef MKERNEL_HAVE_DEVICE_CODE
// collectives/runtime/communicator_kernel.cc: allocates, exchanges peers, sizes the kernel.
Result createKernelCommunicator(const CommOptions& opts, bootstrap::Bootstrap* bootstrap,
                                std::unique_ptr<Communicator>* out);
#endif

Result Communicator::create(const CommOptions& opts, bootstrap::Bootstrap* bootstrap,
                            std::unique_ptr<Communicator>* out) {
  if (out == nullptr) return MK_ERROR(Result::InvalidArgument, "Communicator::create: out is null");
  out->reset();
#ifndef MKERNEL_HAVE_DEVICE_CODE
  (void)opts;
  (void)bootstrap;
  return MK_ERROR(Result::InvalidUsage,
                  "mkernel built without device code (MKERNEL_DEVICE_CODE=OFF): the persistent "
                  "kernel is not available");
#else
  if (bootstrap == nullptr)
    return MK_ERROR(Result::InvalidArgument, "Communicator::create: bootstrap is null");
  if (opts.nRanks < 1 || opts.nRanks > kMaxRanks)
    return MK_ERROR(Result::InvalidArgument, "Communicator::create: nRanks %d outside 1..%d",
                    opts.nRanks, kMaxRanks);
  if (opts.rank < 0 || opts.rank >= opts.nRanks)
    return MK_ERROR(Result::InvalidArgument, "Communicator::create: rank %d outside 0..%d",
                    opts.rank, opts.nRanks - 1);
  if (bootstrap->rank() != opts.rank || bootstrap->nRanks() != opts.nRanks)
    return MK_ERROR(Result::InvalidArgument,
                    "Communicator::create: options say rank %d of %d, the bootstrap %d of %d",
                    opts.rank, opts.nRanks, bootstrap->rank(), bootstrap->nRanks());
  int nDev = 0;
  cudaError_t err = cudaGetDeviceCount(&nDev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return MK_ERROR(Result::UnhandledCudaError, "no CUDA device: %s", cudaGetErrorString(err));
  }
  if (nDev == 0)
    return MK_ERROR(Result::UnhandledCudaError, "no CUDA device: the driver reports none");
  if (opts.cudaDev < 0 || opts.cudaDev >= nDev)
    return MK_ERROR(Result::InvalidArgument, "Communicator::create: cudaDev %d outside 0..%d",
                    opts.cudaDev, nDev - 1);
  if (!opts.settingsAgreed) MK_CHECK(agreeRouteSettings(*bootstrap, "Communicator::create"));
  MK_CHECK(createKernelCommunicator(opts, bootstrap, out));
  return Result::Success;
#endif
}

}  // namespace coll
}  // namespace mkernel
