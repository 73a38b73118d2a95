// Argument checks at every shim entry, with NCCL's result codes (NCCL's ArgsCheck/CommCheck:
// null pointers, datatype, reduction op, root/peer range, buffers on the comm's device) plus the
// checks NCCL leaves to luck (element counts whose byte size overflows size_t). Each failure
// returns the code NCCL would and leaves a message for ncclGetLastError.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/types.h"
#include "common/result.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/shim_comm.h"

namespace mkernel {
namespace shim {

// Every data-moving entry of the API.
enum class CallKind {
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllReduce,
  AlltoAll,
  Gather,
  Scatter,
  Send,
  Recv
};

struct Call {
  CallKind kind = CallKind::AllReduce;
  const char* name = "";  // "AllReduce", for messages
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // NCCL's per-rank count for the call
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;  // only for reductions
  int root = 0;              // root, or the peer of Send/Recv
  // NCCL 2.32's per-call config (the nccl*Config entry points), or null. One that is not all
  // defaults (collConfigIsDefault) sends the call to NCCL's *Config function.
  const ncclCollConfig_t* collConfig = nullptr;
};

// Whether a per-call config asks for nothing the plain call does not: NULL, or every field the
// caller filled (its size says which) at its initializer's value (algSelection "" counts as
// automatic, and forceAlgSelection then means nothing). One without NCCL_COLLCONFIG_INITIALIZER's
// magic is not: NCCL's call judges it.
bool collConfigIsDefault(const ncclCollConfig_t* config);

bool isReduction(CallKind k);
bool hasRoot(CallKind k);  // Broadcast, Reduce, Gather, Scatter
// The collective type when the call is one mkernel can run (else false).
bool collTypeOf(CallKind k, coll::CollType* out);

// A reduction op resolved against the comm's table of custom ops.
struct ResolvedOp {
  bool custom = false;
  CustomOp customOp;  // when custom
};

// What validation needs to know of the comm.
struct CommView {
  int rank = 0;
  int nRanks = 1;
  int cudaDev = 0;
  bool checkPointers = true;
};

// Datatype, op (built-in or live custom op of the same dtype), root/peer, count overflow, then
// (count > 0 and checkPointers) the buffers this rank uses. `ops` is the comm's custom op table.
Result validateCall(const Call& call, const CommView& comm, const std::vector<CustomOp>& ops,
                    ResolvedOp* op);

// A pointer NCCL could use on device `cudaDev` (cudaPointerGetAttributes): a device pointer of
// that device, managed memory, or host memory mapped for the device.
Result checkDevicePointer(const void* p, int cudaDev, const char* what, const char* opName);

// Host-immediate premul-sum scalar of `dtype` at `p`, as a double.
Result scalarToDouble(const void* p, ncclDataType_t dtype, double* out);

}  // namespace shim
}  // namespace mkernel
