// ncclTuner_v2_t (NCCL 2.28.9 src/include/plugin/tuner/tuner_v2.h): no cost table; the plugin
// returns one algorithm and protocol (NCCL then zeroes that entry's cost if it is usable), and
// learns only whether CollNet / NVLS are supported.
#pragma once

#include "plugin/abi/tuner_common.h"

namespace mkernel {
namespace abi {

struct ncclTuner_v2_t {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                              int* nChannels);
  ncclResult_t (*destroy)(void* context);
};
static_assert(sizeof(ncclTuner_v2_t) == 4 * sizeof(void*), "ncclTuner_v2_t: name + 3 functions");

}  // namespace abi
}  // namespace mkernel
