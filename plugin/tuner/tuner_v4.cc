// ncclTunerPlugin_v4 (NCCL 2.21-2.26 era): no comm id, no NVLink-domain info, destroy instead of
// finalize; same cost table as v5.
#include "plugin/abi/tuner_v4.h"

#include "plugin/tuner/tuner_core.h"

namespace mkernel {
namespace abi {
namespace {

ncclResult_t initV4(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context) {
  return static_cast<ncclResult_t>(
      tuner::tunerInit(0, nRanks, nNodes, logFunction, tuner::NvlDomainSummary(), context));
}

ncclResult_t getCollInfoV4(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                           float** collCostTable, int numAlgo, int numProto, int regBuff,
                           int* nChannels) {
  tuner::tunerGetCollInfo(context, collType, nBytes, reinterpret_cast<float*>(collCostTable),
                          numAlgo, numProto, nChannels);
  return ncclSuccess;
}

ncclResult_t destroyV4(void* context) {
  return static_cast<ncclResult_t>(tuner::tunerFinalize(context));
}

}  // namespace
}  // namespace abi
}  // namespace mkernel

// The symbol NCCL looks up with dlsym (a struct object, not a function).
extern "C" {
__attribute__((visibility("default"))) mkernel::abi::ncclTuner_v4_t ncclTunerPlugin_v4 = {
    "mkernel", mkernel::abi::initV4, mkernel::abi::getCollInfoV4, mkernel::abi::destroyV4};
}  // extern "C"
