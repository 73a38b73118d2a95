// Communicator creation shared by ncclCommInitRank*, ncclCommInitAll, ncclCommSplit and
// ncclCommShrink: mkernel's part (an mkernel Bootstrap from an mkernel unique id, then the mkernel
// Communicator, or everything forwarded when it cannot be made), and NCCL's communicator beside it
// (unless emulating), whose handle is the one the application holds.
//
// Every rank runs the two rendezvous in one order, mkernel's first: outside a group both run in
// the call; inside one, NCCL's creation is queued in NCCL's group at the call (so that an init's
// handle exists at once, as NCCL's does) and runs at ncclGroupEnd after mkernel's deferred parts.
#pragma once

#include <functional>

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
  const char* caller = "ncclCommInitRank";
};

// mkernel's part, collective over the setup's ranks. On failure the comm is left InitFailed with
// nothing of mkernel's held; the real comm (if any) is the caller's.
Result setupComm(ShimComm* c, const CommSetup& s);

// Makes NCCL's communicator into *out (ncclCommInitRankConfig, ncclCommSplit, ...).
using MakeReal = std::function<ncclResult_t(ncclComm_t* out)>;

// A creation outside a group: `kernelPart` (setupComm, or split's and shrink's protocol), then,
// unless emulating, `makeReal`; the handle (NCCL's comm, or a stand-in) enters the side table and
// is written to *newcomm. A failure hands back no communicator of the shim's: mkernel's part is
// released and NCCL's comm aborted (*newcomm NULL), except that a failure of NCCL's own creation
// passes NCCL's result and whatever handle NCCL left (its own, outside the side table). When
// mkernel's part fails, NCCL's is not attempted (such failures are every rank's: a rendezvous, a
// setting). `child` null (split's NCCL_SPLIT_NOCOLOR): only the collective protocol and NCCL's
// call.
ncclResult_t createBlocking(ShimComm* child, const std::function<Result()>& kernelPart,
                            const MakeReal& makeReal, bool emulate, const char* caller,
                            ncclComm_t* newcomm);

// Whether MKERNEL_EMULATE is on.
bool emulationRequested();

// A copy of `user` for the real NCCL: missing fields from NCCL_CONFIG_INITIALIZER, and blocking
// forced on (the shim completes its own part synchronously, so it waits for NCCL's too).
ncclConfig_t realConfigFor(const ncclConfig_t* user);

// Checks an ncclConfig_t as NCCL does (initializer used).
Result checkConfig(const ncclConfig_t* config, const char* caller);

// The unique id the shim hands out: an mkernel id (the bootstrap's root address and nonce) that
// carries, past the bootstrap's fields, the real NCCL's own unique id (unless emulating or no real
// NCCL is there), so that every rank can create NCCL's communicator without a rendezvous of
// mkernel's first.
ncclResult_t makeUniqueId(ncclUniqueId* out, const char* caller);
// The real NCCL's id inside an id of makeUniqueId's; false when it carries none.
bool realIdOf(const ncclUniqueId& id, ncclUniqueId* real);
// Puts `real` into `id` (an mkernel id); false when it does not fit (its bytes past the room the
// mkernel id leaves are not zero).
bool embedRealId(ncclUniqueId* id, const ncclUniqueId& real);

// A tag for bootstrap messages of the shim's own protocol (split/shrink), unique per parent
// operation and distinct from the bootstrap's own (negative) tags.
inline int shimTag(uint32_t seq) {
  return 0x53480000 + static_cast<int>(seq & 0xffff);
}

}  // namespace shim
}  // namespace mkernel
