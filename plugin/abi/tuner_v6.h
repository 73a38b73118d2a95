// ncclTuner_v6_t (NCCL 2.30.7 src/include/plugin/tuner/tuner_v6.h): v5's init and getCollInfo,
// v5's constants and NVLink-domain structs, and one more, optional entry point: getChunkSize,
// which may override the chunk size NCCL computed for a collective (NULL: NCCL's is used).
#pragma once

#include "plugin/abi/tuner_v5.h"

namespace mkernel {
namespace abi {

using ncclTunerConstants_v6_t = ncclTunerConstants_v5_t;
using ncclNvlDomainInfo_v6_t = ncclNvlDomainInfo_v5_t;

struct ncclTuner_v6_t {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v6_t* nvlDomainInfo,
                       ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
};
static_assert(sizeof(ncclTuner_v6_t) == 5 * sizeof(void*), "ncclTuner_v6_t: name + 4 functions");
static_assert(offsetof(ncclTuner_v6_t, getChunkSize) == 4 * sizeof(void*),
              "ncclTuner_v6_t.getChunkSize");

}  // namespace abi
}  // namespace mkernel
