// Communicator creation shared by ncclCommInitRank*, ncclCommInitAll, ncclCommSplit and
// ncclCommShrink: an mkernel Bootstrap from an mkernel unique id, the real NCCL comm beside it
// (unless emulating), then the mkernel Communicator (or everything forwarded when it cannot be
// made).
#pragma once

#include "plugin/shim/nccl_api.h"
#include "plugin/shim/shim_comm.h"
#include "transport/bootstrap/bootstrap.h"

namespace mkernel {
namespace shim {

struct CommSetup {
  bootstrap::UniqueId id{};
  int rank = 0;
  int nRanks = 1;
  int cudaDev = 0;
  const ncclConfig_t* config = nullptr;  // the user's (copied), or null
  bool emulate = false;
  // Split/shrink make the real comm from the parent's (ncclCommSplit/Shrink) before calling
  // setupComm: then it is handed in here instead of created from a broadcast real unique id.
  bool realGiven = false;
  ncclComm_t real = nullptr;
  const char* caller = "ncclCommInitRank";
};

// Collective over the setup's ranks. On failure the comm is left InitFailed with nothing held.
Result setupComm(ShimComm* c, const CommSetup& s);

// Whether MKERNEL_EMULATE is on.
bool emulationRequested();

// A copy of `user` for the real NCCL: missing fields from NCCL_CONFIG_INITIALIZER, and blocking
// forced on (the shim completes its own part synchronously, so it waits for NCCL's too).
ncclConfig_t realConfigFor(const ncclConfig_t* user);

// Checks an ncclConfig_t as NCCL does (initializer used).
Result checkConfig(const ncclConfig_t* config, const char* caller);

// A tag for bootstrap messages of the shim's own protocol (split/shrink), unique per parent
// operation and distinct from the bootstrap's own (negative) tags.
inline int shimTag(uint32_t seq) {
  return 0x53480000 + static_cast<int>(seq & 0xffff);
}

}  // namespace shim
}  // namespace mkernel
