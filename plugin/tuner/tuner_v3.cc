// ncclTunerPlugin_v3: as v4 without the regBuff hint.
#include "plugin/abi/tuner_v3.h"

#include "plugin/tuner/tuner_core.h"

namespace mkernel {
namespace abi {
namespace {

ncclResult_t initV3(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context) {
  return static_cast<ncclResult_t>(
      tuner::tunerInit(0, nRanks, nNodes, logFunction, tuner::NvlDomainSummary(), context));
}

ncclResult_t getCollInfoV3(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                           float** collCostTable, int numAlgo, int numProto, int* nChannels) {
  tuner::tunerGetCollInfo(context, collType, nBytes, reinterpret_cast<float*>(collCostTable),
                          numAlgo, numProto, nChannels);
  return ncclSuccess;
}

ncclResult_t destroyV3(void* context) {
  return static_cast<ncclResult_t>(tuner::tunerFinalize(context));
}

}  // namespace
}  // namespace abi
}  // namespace mkernel

// The symbol NCCL looks up with dlsym (a struct object, not a function).
extern "C" {
__attribute__((visibility("default"))) mkernel::abi::ncclTuner_v3_t ncclTunerPlugin_v3 = {
    "mkernel", mkernel::abi::initV3, mkernel::abi::getCollInfoV3, mkernel::abi::destroyV3};
}  // extern "C"
