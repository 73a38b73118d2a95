// ncclTuner_v5_t (NCCL 2.28.9 src/include/plugin/tuner/tuner_v5.h): init receives the comm id,
// the NVLink-domain summary and NCCL's performance-model constants (in/out).
#pragma once

#include "plugin/abi/tuner_common.h"

namespace mkernel {
namespace abi {

struct ncclNvlDomainInfo_v5_t {
  int nNvlDomains;           // number of NVLink domains in the communicator
  int minRanksPerNvlDomain;  // fewest ranks in one domain
  int maxRanksPerNvlDomain;  // most ranks in one domain
};
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12, "ncclNvlDomainInfo_v5_t is 3 ints");

struct ncclTunerConstants_v5_t {
  double baseLatencies[kNcclNumAlgorithms][kNcclNumProtocols];
  double hwLatencies[kNcclNumHwLinks][kNcclNumAlgorithms][kNcclNumProtocols];
  double llMaxBws[kNcclNumCompCaps][kNcclNumTuningScales];
  double perChMaxRingLL128Bws[kNcclNumCompCaps][kNcclNumTuningScales];
  double perChMaxTreeLL128Bws[kNcclNumCompCaps][kNcclNumTuningScales];
  double perChMaxTreeBws[kNcclNumCompCaps][kNcclNumTuningScales];
  double perChMaxNVLSTreeBws[kNcclNumCompCaps][kNcclNumTuningScales];
};
static_assert(sizeof(ncclTunerConstants_v5_t) == (21 + 63 + 5 * 12) * sizeof(double),
              "ncclTunerConstants_v5_t: 21 base + 63 hw latencies + 5 bandwidth tables of 4x3");
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == 21 * 8, "hwLatencies offset");
static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == 84 * 8, "llMaxBws offset");
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws) == 132 * 8, "NVLSTree offset");

struct ncclTuner_v5_t {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
};
static_assert(sizeof(ncclTuner_v5_t) == 4 * sizeof(void*), "ncclTuner_v5_t: name + 3 functions");
static_assert(offsetof(ncclTuner_v5_t, finalize) == 3 * sizeof(void*), "ncclTuner_v5_t.finalize");

}  // namespace abi
}  // namespace mkernel
