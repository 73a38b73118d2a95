// NCCL tuner-plugin ABI: what every version (v2..v6) shares.
//
// Written for mkernel from the layout of NCCL 2.28.9's src/include/plugin/nccl_tuner.h and
// nccl_common.h. The types live in mkernel::abi so that they never clash with NCCL's own headers
// or with the net ABI (plugin/abi/net_*.h); only their layout matters to NCCL, and each is pinned
// with static_assert against the sizes NCCL 2.28.9 compiles to.
#pragma once

#include <nccl.h>  // ncclResult_t

#include <cstddef>
#include <cstdint>

#include "common/log.h"

namespace mkernel {
namespace abi {

// ncclDebugLogger_t (nccl_common.h); the same alias as the net ABI's, so both may be included.
using ncclDebugLogger_t = ::mkernel::NcclLogger;

// ncclFunc_t (nccl_common.h): a C enum; the tuner only ever sees the first five.
enum ncclFunc_t : int {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclFuncAlltoAll = 8,
  ncclFuncScatter = 9,
  ncclFuncGather = 10,
  ncclNumFuncs = 11,
};
static_assert(sizeof(ncclFunc_t) == 4, "ncclFunc_t is a C enum (int)");

// Cost-table geometry and codes (nccl_tuner.h).
constexpr int kNcclNumAlgorithms =
    7;  // NCCL_NUM_ALGORITHMS: TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE PAT
constexpr int kNcclNumProtocols = 3;           // NCCL_NUM_PROTOCOLS: LL LL128 SIMPLE
constexpr int kNcclNumHwLinks = 3;             // NCCL_NUM_HW_LINKS: NVLINK PCI NET
constexpr int kNcclNumCompCaps = 4;            // NCCL_NUM_COMPCAPS: VOLTA AMPERE HOPPER BLACKWELL
constexpr int kNcclNumTuningScales = 3;        // NCCL_NUM_TUNING_SCALES: 1, 2, 4 nodes
constexpr float kNcclAlgoProtoIgnore = -1.0f;  // NCCL_ALGO_PROTO_IGNORE

}  // namespace abi
}  // namespace mkernel
