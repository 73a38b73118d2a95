// ncclTunerPlugin_v2: no cost table. NCCL tells the plugin only whether CollNet and NVLS are
// supported and expects one algorithm + protocol back (it then zeroes that entry's cost if the
// entry is usable, else keeps its own choice). The adapter models NCCL's table from those two
// flags so that the one core decides, and reports the entry the core forced.
#include "plugin/abi/tuner_v2.h"

#include "plugin/tuner/tuner_core.h"

namespace mkernel {
namespace abi {
namespace {

ncclResult_t initV2(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context) {
  return static_cast<ncclResult_t>(
      tuner::tunerInit(0, nRanks, nNodes, logFunction, tuner::NvlDomainSummary(), context));
}

ncclResult_t getCollInfoV2(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                           int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                           int* nChannels) {
  // 1.0 = usable at an unknown cost; NCCL's own exclusions beyond these flags are unknown here,
  // which is harmless: NCCL ignores a v2 answer whose entry it cannot use.
  float table[kNcclNumAlgorithms][kNcclNumProtocols];
  for (auto& row : table)
    for (float& v : row) v = 1.0f;
  constexpr int kCollnetDirect = 2, kCollnetChain = 3, kNvls = 4, kNvlsTree = 5;
  for (int p = 0; p < kNcclNumProtocols; ++p) {
    if (!collNetSupport) table[kCollnetDirect][p] = table[kCollnetChain][p] = kNcclAlgoProtoIgnore;
    if (!nvlsSupport) table[kNvls][p] = table[kNvlsTree][p] = kNcclAlgoProtoIgnore;
  }
  tuner::tunerGetCollInfo(context, collType, nBytes, &table[0][0], kNcclNumAlgorithms,
                          kNcclNumProtocols, nChannels);
  for (int a = 0; a < kNcclNumAlgorithms; ++a)
    for (int p = 0; p < kNcclNumProtocols; ++p)
      if (table[a][p] == 0.0f) {
        if (algorithm != nullptr) *algorithm = a;
        if (protocol != nullptr) *protocol = p;
        return ncclSuccess;
      }
  return ncclSuccess;  // no decision: NCCL keeps its own
}

ncclResult_t destroyV2(void* context) {
  return static_cast<ncclResult_t>(tuner::tunerFinalize(context));
}

}  // namespace
}  // namespace abi
}  // namespace mkernel

// The symbol NCCL looks up with dlsym (a struct object, not a function).
extern "C" {
__attribute__((visibility("default"))) mkernel::abi::ncclTuner_v2_t ncclTunerPlugin_v2 = {
    "mkernel", mkernel::abi::initV2, mkernel::abi::getCollInfoV2, mkernel::abi::destroyV2};
}  // extern "C"
