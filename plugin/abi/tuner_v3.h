// ncclTuner_v3_t (NCCL 2.28.9 src/include/plugin/tuner/tuner_v3.h): as v4 without regBuff.
#pragma once

#include "plugin/abi/tuner_common.h"

namespace mkernel {
namespace abi {

struct ncclTuner_v3_t {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
};
static_assert(sizeof(ncclTuner_v3_t) == 4 * sizeof(void*), "ncclTuner_v3_t: name + 3 functions");

}  // namespace abi
}  // namespace mkernel
