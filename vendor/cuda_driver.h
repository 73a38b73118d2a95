// The CUDA driver entry points mkernel needs beyond the runtime: stream memory operations
// (cuStreamWriteValue32 / cuStreamWaitValue32), the doorbells of the persistent kernel, and the
// context flag that keeps local memory at its largest size (cuCtxGetFlags / cuCtxSetFlags).
//
// They are looked up at run time through cudaGetDriverEntryPointByVersion (the runtime finds
// libcuda itself), so libmkernel.so links no libcuda and loads on hosts without a driver; a
// missing entry point is an error message, never a crash.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/result.h"

namespace mkernel {
namespace cudrv {

// ncclMemAlloc's mapping, as NCCL makes it: cuMemCreate (pinned, on the current device; GPUDirect
// RDMA capable where the device says so), cuMemAddressReserve, cuMemMap and cuMemSetAccess for the
// device, `bytes` rounded up to the recommended granularity. Initialises the runtime's primary
// context on the current device first. Error: which call failed (nothing is left allocated).
Result vmmAlloc(void** ptr, size_t bytes);
// Frees a vmmAlloc mapping as NCCL's ncclMemFree does (cuMemRetainAllocationHandle, cuMemRelease,
// cuMemGetAddressRange, cuMemUnmap, cuMemRelease, cuMemAddressFree). Unlike cudaFree it waits for
// no kernel, so it holds back no other thread's CUDA calls (measured with mkernel-freeprobe): the
// caller guarantees that nothing still uses the memory. Error: not a vmmAlloc mapping, or which
// call failed.
Result vmmFree(void* ptr);

// Process ranks' shared memory (collectives/runtime/peer_memory.cc, MKERNEL_PEER_IPC=cumem), as
// NCCL shares its buffers between processes:
// - vmmExportFd: a POSIX file descriptor for the vmmAlloc mapping at `ptr` (the caller closes it),
//   and the mapping's size, which the importer needs.
// - vmmImportFd: maps another process's descriptor (of `size` bytes) into this process, read-write
//   for `device`; the mapping alone keeps the memory (the exporter may free its own at any time).
// - vmmUnmap: unmaps a vmmImportFd mapping. Like vmmFree, it waits for no kernel and holds back no
//   other thread's CUDA calls (cudaIpcCloseMemHandle does both: docs/RELIABILITY.md); the caller
//   guarantees nothing of this process still uses it.
Result vmmExportFd(void* ptr, int* fd, size_t* size);
Result vmmImportFd(int fd, size_t size, int device, void** ptr);
Result vmmUnmap(void* ptr);
// Lets `device` read and write the vmmAlloc mapping at `ptr` too (cuMemSetAccess: peer access for
// cuMem memory, which cudaDeviceEnablePeerAccess does not give), for thread ranks of this process
// on other GPUs.
Result vmmGrantAccess(void* ptr, int device);

// Resolves the entry points once per process (thread-safe). Error: which one is missing.
Result loadMemOps();

// *addr = value when `stream` reaches this point (with a memory barrier before the write, so
// everything earlier on the stream is visible first). Legal during CUDA graph capture.
Result streamWriteValue32(cudaStream_t stream, uint32_t* addr, uint32_t value);
// Blocks `stream` until the condition holds. Legal during CUDA graph capture. Waits until *addr ==
// value (Eq) or, comparing cyclically as the driver does, *addr >= value (Geq: (int32_t)(*addr -
// value) >= 0).
enum class WaitCmp { Eq, Geq };
Result streamWaitValue32(cudaStream_t stream, uint32_t* addr, uint32_t value,
                         WaitCmp cmp = WaitCmp::Eq);

// Sets CU_CTX_LMEM_RESIZE_TO_MAX on the calling thread's current context (cuCtxGetFlags /
// cuCtxSetFlags, CUDA 12.1+; the other flags are kept): once a launch has grown the context's local
// memory, the driver keeps it instead of shrinking it again after that kernel, so that no later
// launch has to grow it (a resize waits for every running kernel). Error: the entry points are
// missing or the driver refused.
Result keepLocalMemory();

}  // namespace cudrv
}  // namespace mkernel
