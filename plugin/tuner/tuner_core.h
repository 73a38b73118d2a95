// The one tuner core behind ncclTunerPlugin_v5..v2 (plugin/tuner/tuner_v*.cc are thin adapters).
//
// It decides once per communicator whether the user asked for mkernel's tuner (NCCL also loads
// the tuner implicitly from the net plugin's library whenever NCCL_NET_PLUGIN=mkernel, and must
// then see its own choices unchanged), builds the policy's view of the job from the topology
// model, and hands each getCollInfo to collectives/tuner_policy. It never returns an error for a
// situation it does not know: it logs and leaves NCCL's table alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/log.h"
#include "common/result.h"

namespace mkernel {
namespace tuner {

// NCCL v5's NVLink-domain summary; absent (nNvlDomains < 0) for v2..v4.
struct NvlDomainSummary {
  int nNvlDomains = -1;
  int minRanksPerDomain = 0;
  int maxRanksPerDomain = 0;
};

// Whether the tuner steers NCCL: MKERNEL_TUNER=1/0 decides; unset, NCCL_TUNER_PLUGIN must name
// mkernel ("mkernel", or a path / library name containing it). *why says which.
bool tunerRequested(std::string* why);

Result tunerInit(uint64_t commId, size_t nRanks, size_t nNodes, NcclLogger logger,
                 const NvlDomainSummary& nvl, void** context);
// table: numAlgo rows of numProto floats. Never fails.
void tunerGetCollInfo(void* context, int coll, size_t nBytes, float* table, int numAlgo,
                      int numProto, int* nChannels);
Result tunerFinalize(void* context);

}  // namespace tuner
}  // namespace mkernel
