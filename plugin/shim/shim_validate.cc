#include "plugin/shim/shim_validate.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mkernel {
namespace shim {

static_assert(static_cast<int>(coll::DataType::Fp8E5M2) == ncclFloat8e5m2 &&
                  coll::kNumDataTypes == ncclNumTypes,
              "collectives/types.h datatypes must equal NCCL's");
static_assert(static_cast<int>(coll::RedOp::Avg) == ncclAvg &&
                  static_cast<int>(coll::RedOp::PreMulSum) == ncclNumOps,
              "collectives/types.h ops must equal NCCL's built-in ones");

bool isReduction(CallKind k) {
  return k == CallKind::Reduce || k == CallKind::AllReduce || k == CallKind::ReduceScatter;
}

bool hasRoot(CallKind k) {
  return k == CallKind::Broadcast || k == CallKind::Reduce || k == CallKind::Gather ||
         k == CallKind::Scatter;
}

bool collTypeOf(CallKind k, coll::CollType* out) {
  switch (k) {
    case CallKind::Broadcast:
      *out = coll::CollType::Broadcast;
      return true;
    case CallKind::Reduce:
      *out = coll::CollType::Reduce;
      return true;
    case CallKind::AllGather:
      *out = coll::CollType::AllGather;
      return true;
    case CallKind::ReduceScatter:
      *out = coll::CollType::ReduceScatter;
      return true;
    case CallKind::AllReduce:
      *out = coll::CollType::AllReduce;
      return true;
    default:
      return false;
  }
}

namespace {

// How many per-rank counts the largest buffer of the call holds (AllGather's receive buffer is
// nRanks * count elements, and so on).
size_t largestBufferFactor(CallKind k, int nRanks) {
  switch (k) {
    case CallKind::AllGather:
    case CallKind::ReduceScatter:
    case CallKind::AlltoAll:
    case CallKind::Gather:
    case CallKind::Scatter:
      return static_cast<size_t>(nRanks);
    default:
      return 1;
  }
}

Result resolveOp(const Call& call, const std::vector<CustomOp>& ops, ResolvedOp* out) {
  *out = ResolvedOp();
  int op = 0;  // any int may arrive as an ncclRedOp_t: read the bits, not the enum
  static_assert(sizeof(op) == sizeof(call.op), "ncclRedOp_t is an int");
  std::memcpy(&op, &call.op, sizeof(op));
  if (op < 0 || op > static_cast<int>(ncclMaxRedOp))
    return MK_ERROR(Result::InvalidArgument, "%s : invalid reduction operation %d", call.name, op);
  if (op < ncclNumOps) return Result::Success;
  const size_t ix = static_cast<size_t>(op - ncclNumOps);
  if (ix >= ops.size() || !ops[ix].live)
    return MK_ERROR(Result::InvalidArgument,
                    "%s : reduction operation %d unknown to this communicator", call.name, op);
  if (ops[ix].dtype != call.dtype)
    return MK_ERROR(
        Result::InvalidArgument,
        "%s : reduction operation %d was created for datatype %d, used with datatype %d", call.name,
        op, static_cast<int>(ops[ix].dtype), static_cast<int>(call.dtype));
  out->custom = true;
  out->customOp = ops[ix];
  return Result::Success;
}

}  // namespace

bool collConfigIsDefault(const ncclCollConfig_t* config) {
  if (config == nullptr) return true;
  if (config->magic != 0xcafebeefu || config->size < offsetof(ncclCollConfig_t, ext)) return false;
  const size_t filled = config->size;
#define MK_FILLED(field) (filled >= offsetof(ncclCollConfig_t, field) + sizeof(config->field))
  if (MK_FILLED(ext) && config->ext != nullptr) return false;
  if (MK_FILLED(minCTAs) && config->minCTAs != NCCL_CONFIG_UNDEF_INT) return false;
  if (MK_FILLED(maxCTAs) && config->maxCTAs != NCCL_CONFIG_UNDEF_INT) return false;
  if (MK_FILLED(nvlsCTAs) && config->nvlsCTAs != NCCL_CONFIG_UNDEF_INT) return false;
  if (MK_FILLED(cgaClusterSize) && config->cgaClusterSize != NCCL_CONFIG_UNDEF_INT) return false;
  if (MK_FILLED(algSelection) && config->algSelection != nullptr && config->algSelection[0] != '\0')
    return false;
  if (MK_FILLED(CTAPolicy) && config->CTAPolicy != NCCL_CONFIG_UNDEF_INT) return false;
  if (MK_FILLED(userProfilerTag) && config->userProfilerTag != 0) return false;
#ifdef MKERNEL_COLLCONFIG_HAS_COMPLETION_EVENT
  if (MK_FILLED(launchCompletionEvent) && config->launchCompletionEvent != nullptr) return false;
#else
  if (filled > sizeof(ncclCollConfig_t)) return false;  // fields this nccl.h does not know
#endif
#undef MK_FILLED
  return true;
}

Result checkDevicePointer(const void* p, int cudaDev, const char* what, const char* opName) {
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess || attr.devicePointer == nullptr) {
    if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave a sticky-looking error behind
    return MK_ERROR(Result::InvalidArgument, "%s : %s %p is not a valid pointer%s%s", opName, what,
                    p, err != cudaSuccess ? ": " : "",
                    err != cudaSuccess ? cudaGetErrorString(err) : "");
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != cudaDev)
    return MK_ERROR(Result::InvalidArgument,
                    "%s : %s allocated on device %d does not match the communicator's device %d",
                    opName, what, attr.device, cudaDev);
  return Result::Success;
}

Result validateCall(const Call& call, const CommView& comm, const std::vector<CustomOp>& ops,
                    ResolvedOp* op) {
  const bool p2p = call.kind == CallKind::Send || call.kind == CallKind::Recv;
  if (call.root < 0 || call.root >= comm.nRanks) {
    if (p2p)
      return MK_ERROR(Result::InvalidArgument,
                      "%s : invalid peer %d (peer should be in the 0..%d range)", call.name,
                      call.root, comm.nRanks - 1);
    if (hasRoot(call.kind))
      return MK_ERROR(Result::InvalidArgument,
                      "%s : invalid root %d (root should be in the 0..%d range)", call.name,
                      call.root, comm.nRanks - 1);
  }
  // The caller may pass any int as an ncclDataType_t: read the bits, not the enum (loading an
  // out-of-range enum value is undefined behaviour).
  int dtypeBits = 0;
  static_assert(sizeof(dtypeBits) == sizeof(call.dtype), "ncclDataType_t is an int");
  std::memcpy(&dtypeBits, &call.dtype, sizeof(dtypeBits));
  if (dtypeBits < 0 || dtypeBits >= ncclNumTypes)
    return MK_ERROR(Result::InvalidArgument, "%s : invalid type %d", call.name, dtypeBits);
  if (isReduction(call.kind)) {
    MK_CHECK(resolveOp(call, ops, op));
  } else {
    *op = ResolvedOp();
  }
  const size_t elemBytes = coll::dataTypeSize(static_cast<coll::DataType>(call.dtype));
  const size_t factor = largestBufferFactor(call.kind, comm.nRanks);
  if (call.count > std::numeric_limits<size_t>::max() / elemBytes / factor)
    return MK_ERROR(Result::InvalidArgument,
                    "%s : count %zu of %zu-byte elements (x%zu ranks) overflows the byte size",
                    call.name, call.count, elemBytes, factor);
  if (call.count == 0 || !comm.checkPointers) return Result::Success;

  const bool isRoot = comm.rank == call.root;
  bool useSend = true, useRecv = true;
  switch (call.kind) {
    case CallKind::Send:
      useRecv = false;
      break;
    case CallKind::Recv:
      useSend = false;
      break;
    case CallKind::Broadcast:
    case CallKind::Scatter:
      useSend = isRoot;
      break;
    case CallKind::Reduce:
    case CallKind::Gather:
      useRecv = isRoot;
      break;
    default:
      break;
  }
  if (useSend) MK_CHECK(checkDevicePointer(call.sendbuff, comm.cudaDev, "sendbuff", call.name));
  if (useRecv) MK_CHECK(checkDevicePointer(call.recvbuff, comm.cudaDev, "recvbuff", call.name));
  return Result::Success;
}

Result scalarToDouble(const void* p, ncclDataType_t dtype, double* out) {
  if (p == nullptr)
    return MK_ERROR(Result::InvalidArgument, "ncclRedOpCreatePreMulSum : scalar is NULL");
  switch (dtype) {
    case ncclInt8:
      *out = *static_cast<const int8_t*>(p);
      break;
    case ncclUint8:
      *out = *static_cast<const uint8_t*>(p);
      break;
    case ncclInt32:
      *out = *static_cast<const int32_t*>(p);
      break;
    case ncclUint32:
      *out = *static_cast<const uint32_t*>(p);
      break;
    case ncclInt64:
      *out = static_cast<double>(*static_cast<const int64_t*>(p));
      break;
    case ncclUint64:
      *out = static_cast<double>(*static_cast<const uint64_t*>(p));
      break;
    case ncclFloat16:
      *out = __half2float(*static_cast<const __half*>(p));
      break;
    case ncclFloat32:
      *out = *static_cast<const float*>(p);
      break;
    case ncclFloat64:
      *out = *static_cast<const double*>(p);
      break;
    case ncclBfloat16:
      *out = __bfloat162float(*static_cast<const __nv_bfloat16*>(p));
      break;
    case ncclFloat8e4m3: {
      __nv_fp8_e4m3 v;
      std::memcpy(&v, p, 1);
      *out = static_cast<float>(v);
      break;
    }
    case ncclFloat8e5m2: {
      __nv_fp8_e5m2 v;
      std::memcpy(&v, p, 1);
      *out = static_cast<float>(v);
      break;
    }
    default:
      return MK_ERROR(Result::InvalidArgument, "ncclRedOpCreatePreMulSum : invalid type %d",
                      static_cast<int>(dtype));
  }
  return Result::Success;
}

}  // namespace shim
}  // namespace mkernel
