// The path one collective of a KernelCommunicator takes (launch path, LL, direct, doorbell), the
// one-rank copy, and the order of launches on the caller's stream.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

KernelCommunicator::Path KernelCommunicator::pathOf(const WorkDesc& d) const {
  // One path whether the op's stream is being captured or not (docs/SHIM.md, "One route on every
  // rank"): a rank that captures an op and one that runs it eagerly must meet. Captured ops replay
  // without the host, and so do the launch path's kernels (the device numbers them, eager ones
  // too: launch_path.h, "One numbering") and the doorbell (a replayable protocol).
  // MKERNEL_GRAPH_LAUNCH=0 gives every op to the doorbell. Emulated nodes (the hierarchy through
  // the proxies) take the doorbell.
  if (!graphLaunch_ || launchMaxBytes_ == 0 || params_.nNodes > 1) return Path::kDoorbell;
  // Rings run in the persistent kernel only (the launch path's modes are all-to-all).
  if (static_cast<Algo>(d.algo) == Algo::Ring) return Path::kDoorbell;
  const CollType c = static_cast<CollType>(d.coll);
  const uint64_t bytes =
      launchPublishElems(c, d.count, opts_.nRanks) * dataTypeSize(static_cast<DataType>(d.dtype));
  // One rank: a copy (or PreMulSum's kernel) at any size; nothing to exchange.
  if (opts_.nRanks == 1) return Path::kLaunchInbox;
  // LL mode (launch_path.h): small ops push 16-byte lines, thread and process ranks alike.
  if (llTakes(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))), llMaxBytes_,
              opts_.nRanks))
    return Path::kLaunchLl;
  if (bytes <= launchMaxBytes_) return Path::kLaunchInbox;
  if (!launchDirect_) return Path::kDoorbell;
  return directTakes(c,
                     directWholeBytes(c, d.count, opts_.nRanks,
                                      dataTypeSize(static_cast<DataType>(d.dtype))),
                     directMaxBytes_, directSharing_, peers_.sharedDirect)
             ? Path::kLaunchDirect
             : Path::kDoorbell;
}

bool KernelCommunicator::needsDoorbell(const CollArgs& op) const {
  if (op.count == 0) return false;  // a no-op: nothing runs
  WorkDesc d;
  if (fillDesc(op, &d) != Result::Success) return true;  // (the shim validated it already)
  return pathOf(d) == Path::kDoorbell;
}

// One rank, eager, launch-path size: every collective but PreMulSum is a copy (Avg divides by 1;
// in place, nothing), which cudaMemcpyAsync does with less overhead than a kernel, as NCCL's
// own one-rank path. PreMulSum multiplies, so it takes the launch-path kernel.
bool KernelCommunicator::oneRankCopy(const CollArgs& a) const {
  if (opts_.nRanks != 1 || oneRankKernel_) return false;
  const bool reduces = a.coll == CollType::AllReduce || a.coll == CollType::ReduceScatter ||
                       a.coll == CollType::Reduce;
  return !(reduces && a.op == RedOp::PreMulSum);
}

Result KernelCommunicator::copyOneRank(const CollArgs& a, cudaStream_t stream) {
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  if (a.sendbuff != a.recvbuff)
    MK_CUDA_CHECK(cudaMemcpyAsync(a.recvbuff, a.sendbuff, bytes, cudaMemcpyDeviceToDevice, stream),
                  "rank %d: cudaMemcpyAsync (one rank)", opts_.rank);
  ++startsQueued_;
  const int c = static_cast<int>(a.coll);
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++oneRankCopies_[c];
  }
  globalStats().kernelOps[c].fetch_add(1, std::memory_order_relaxed);
  globalStats().launchOps[c].fetch_add(1, std::memory_order_relaxed);
  return Result::Success;
}

// Before a launch-path launch on `stream`: the order against the previous one.
Result KernelCommunicator::launchOrder(bool capturing, cudaStream_t stream) {
  // One launch-path op at a time per communicator and namespace (launch_path.h): an eager op on
  // another stream than the previous one waits for that op through launchEvent_ (recordEachOp_:
  // recorded after every op, so the old stream is never used again). A stream destroyed right
  // after an op and a new one at the same address, while that op still runs, would escape the
  // wait; waiting at every op would close that too, for half a microsecond of host time per
  // call, which every caller would pay.
  // Captured ops: only within one capture (a stream outside it cannot be waited for while
  // capturing); graphs holding collectives of one communicator must not run concurrently, as
  // with NCCL.
  if (capturing) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    MK_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &st, &id), "rank %d: cudaStreamGetCaptureInfo",
                  opts_.rank);
    if (lastGraphStream_ != nullptr && lastGraphStream_ != stream && id == lastGraphCapture_) {
      MK_CUDA_CHECK(cudaEventRecord(graphEvent_, lastGraphStream_),
                    "rank %d: cudaEventRecord(launch path, capture)", opts_.rank);
      MK_CUDA_CHECK(cudaStreamWaitEvent(stream, graphEvent_, 0),
                    "rank %d: cudaStreamWaitEvent(launch path, capture)", opts_.rank);
    }
    lastGraphStream_ = stream;
    lastGraphCapture_ = id;
  } else if (lastLaunchStream_ != nullptr && lastLaunchStream_ != stream && recordEachOp_) {
    MK_CUDA_CHECK(cudaStreamWaitEvent(stream, launchEvent_, 0),
                  "rank %d: cudaStreamWaitEvent(launch path)", opts_.rank);
  } else if (lastLaunchStream_ != nullptr && lastLaunchStream_ != stream) {
    if (cudaEventRecord(launchEvent_, lastLaunchStream_) == cudaSuccess) {
      MK_CUDA_CHECK(cudaStreamWaitEvent(stream, launchEvent_, 0),
                    "rank %d: cudaStreamWaitEvent(launch path)", opts_.rank);
    } else {
      (void)cudaGetLastError();  // that stream is gone: its work still completes, unordered
      MK_INFO(
          kLogColl,
          "rank %d: the stream of the previous launch-path collective is gone; not waiting for it",
          opts_.rank);
    }
  }
  return Result::Success;
}

// After an eager launch-path launch on runOn (the caller's stream): what the next launch orders
// itself after.
Result KernelCommunicator::launchQueued(cudaStream_t runOn, cudaStream_t stream, CollType last) {
  lastLaunchColl_ = collName(last);
  lastLaunchAt_ = std::chrono::steady_clock::now();
  if (recordEachOp_)
    MK_CUDA_CHECK(cudaEventRecord(launchEvent_, runOn), "rank %d: cudaEventRecord(launch path)",
                  opts_.rank);
  lastLaunchStream_ = runOn;
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
