// ncclTunerPlugin_v5 (NCCL 2.28 and 2.29's own tuner ABI) and ncclTunerPlugin_v6 (NCCL 2.30's),
// over plugin/tuner/tuner_core.
//
// v5's init also hands over NCCL's performance-model constants (in/out). mkernel reads them only
// for the log and never writes them: its policy steers through the cost table, and changing the
// model's latencies or bandwidths would need calibration data per GPU generation that mkernel
// does not have (docs/TUNER.md). v6 adds getChunkSize, which mkernel leaves NULL: NCCL's chunk
// size stays NCCL's.
#include "plugin/abi/tuner_v6.h"

#include "plugin/tuner/tuner_core.h"

namespace mkernel {
namespace abi {
namespace {

ncclResult_t initV5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                    ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                    ncclTunerConstants_v5_t* constants) {
  tuner::NvlDomainSummary nvl;
  if (nvlDomainInfo != nullptr) {
    nvl.nNvlDomains = nvlDomainInfo->nNvlDomains;
    nvl.minRanksPerDomain = nvlDomainInfo->minRanksPerNvlDomain;
    nvl.maxRanksPerDomain = nvlDomainInfo->maxRanksPerNvlDomain;
  }
  Result r = tuner::tunerInit(commId, nRanks, nNodes, logFunction, nvl, ctx);
  if (r == Result::Success && constants != nullptr)
    MK_INFO(kLogTune,
            "tuner v5: NCCL model constants read, left unchanged (Hopper 1-node LL max bw %.1f, "
            "tree/simple base latency %.2f us)",
            constants->llMaxBws[2][0], constants->baseLatencies[0][2]);
  return static_cast<ncclResult_t>(r);
}

ncclResult_t getCollInfoV5(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                           float** collCostTable, int numAlgo, int numProto, int regBuff,
                           int* nChannels) {
  // NCCL passes its float[numAlgo][numProto] array cast to float**.
  tuner::tunerGetCollInfo(context, collType, nBytes, reinterpret_cast<float*>(collCostTable),
                          numAlgo, numProto, nChannels);
  return ncclSuccess;
}

ncclResult_t finalizeV5(void* context) {
  return static_cast<ncclResult_t>(tuner::tunerFinalize(context));
}

}  // namespace
}  // namespace abi
}  // namespace mkernel

// The symbol NCCL looks up with dlsym (a struct object, not a function).
extern "C" {
__attribute__((visibility("default"))) mkernel::abi::ncclTuner_v5_t ncclTunerPlugin_v5 = {
    "mkernel", mkernel::abi::initV5, mkernel::abi::getCollInfoV5, mkernel::abi::finalizeV5};
__attribute__((visibility("default"))) mkernel::abi::ncclTuner_v6_t ncclTunerPlugin_v6 = {
    "mkernel", mkernel::abi::initV5, mkernel::abi::getCollInfoV5, mkernel::abi::finalizeV5,
    nullptr /* getChunkSize: NCCL's chunk size */};
}  // extern "C"
