// The selection policy: for each collective call, whether mkernel or the real NCCL runs it, and
// with which algorithm (collectives/algo/algo.h). One object per communicator, used by the shim for
// every call and by the tuner (docs/ARCHITECTURE.md: one policy serves both).
//
// The answer must be identical on every rank, or ranks take different paths and the job
// deadlocks. So decide() depends ONLY on what every rank shares: the call's collective, dtype,
// op and count, nRanks and nNodes, the communicator's configuration (PolicyConfig, built once at
// communicator creation) and the MKERNEL_* settings (which must be the same on every rank, as
// NCCL_* settings must). Never on buffers, in-place-ness, registration or timing.
//
// Decision order (the first rule that applies wins; docs/ALGORITHMS.md has the table):
//   1. a collective/dtype/op value outside the known enums     -> NCCL (it reports the error)
//   2. MKERNEL_DISABLE=1                                        -> NCCL
//   3. collective not in MKERNEL_COLLECTIVES                    -> NCCL
//   4. nNodes > 1 and the kernel has no inter-node path yet     -> NCCL
//   5. nRanks above what the kernel addresses (kernelMaxRanks)  -> NCCL
//   6. message above MKERNEL_MAX_BYTES (when set)               -> NCCL
//   6b. MKERNEL_NCCL_CROSSOVER=auto, 2 ranks on one node, from the size NCCL measured faster ->
//   NCCL 6c. MKERNEL_NCCL_CROSSOVER=auto, several nodes, AllReduce / ReduceScatter / AllGather
//   where
//      the cost model (collectives/route/cost_model.h: policyModelFor) predicts NCCL faster -> NCCL
//   7. otherwise mkernel, algorithm: MKERNEL_ALGO if it implements the collective; else Ring
//      without direct peer access (PCIe-only); else OneShot for AllReduce up to
//      MKERNEL_ONESHOT_MAX_BYTES, TwoShot above; Direct for the other collectives.
// In emulation (no real NCCL) rules 1-5 answer Unsupported instead of NCCL (the shim returns the
// error from unsupportedError()), and rules 6-6c are skipped: everything supported runs in mkernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "collectives/algo/algo.h"
#include "collectives/route/cost_model.h"
#include "collectives/types.h"
#include "common/result.h"

namespace mkernel {
namespace coll {

enum class ExecPath : int32_t {
  Mkernel = 0,      // the persistent kernel runs it
  Nccl = 1,         // forwarded to the real NCCL
  Unsupported = 2,  // emulation only: neither can run it; the call fails
};
const char* execPathName(ExecPath p);

struct PolicyConfig {
  // From MKERNEL_* (loadPolicyConfig()).
  bool disabled = false;                          // MKERNEL_DISABLE
  uint32_t collMask = (1u << kNumCollTypes) - 1;  // MKERNEL_COLLECTIVES, bit = CollType value
  int forcedAlgo = -1;                            // MKERNEL_ALGO: an Algo value, -1 = auto
  size_t oneShotMaxBytes = 32768;                 // MKERNEL_ONESHOT_MAX_BYTES
  size_t maxBytes = 0;                            // MKERNEL_MAX_BYTES, 0 = no limit
  size_t ringChunkBytes = 131072;                 // MKERNEL_RING_CHUNK_BYTES
  bool ncclCrossover = true;  // MKERNEL_NCCL_CROSSOVER=auto (true) / off: rules 6b and 6c
  // Rule 6c's cost model: policyCostParams() with MKERNEL_COST_MODEL's settings over it; which of
  // nic-gbps, nics and rail that variable set (the communicator's own facts give the others).
  CostParams costModel = policyCostParams();
  bool costNicGiven = false, costNicsGiven = false, costRailGiven = false;
  // From the communicator (identical on every rank by construction).
  bool emulate = false;          // MKERNEL_EMULATE: no real NCCL behind us
  bool directAccess = true;      // all local ranks read/write each other's memory (NVLink
                                 // all-to-all, or ranks sharing one GPU); false: Ring only
  bool stagedRanks = false;      // collectives stage through IPC buffers (process ranks: the
                                 // communicator's peers.staged, agreed at creation)
  bool kernelMultiNode = false;  // the kernel has an inter-node path
  int kernelMaxRanks = 16;       // ranks one kernel addresses (collectives/algo/work.h kMaxRanks)
  // Several nodes (the communicator's CollStats, agreed at creation): the slowest rank's rail NIC
  // in Mb/s (0: unknown) and the rail exchange it runs (HierRailAlgo; -1: unknown).
  int railMbps = 0;
  int hierRail = -1;
};

// Rule 6c's parameters for a query's shape: cfg.costModel with nodes = nNodes, GPUs per node =
// nRanks / nNodes (rounded up); unless MKERNEL_COST_MODEL set them, the NIC rate from railMbps
// (times kNicEfficiency), one NIC per GPU (each rank's proxy on its rail NIC) and the rail form
// the communicator runs.
CostParams policyModelFor(const PolicyConfig& cfg, int nRanks, int nNodes);

// Fills the MKERNEL_* part of *cfg (the communicator part is left as it is). InvalidArgument,
// naming the variable and the accepted values, when a setting cannot be parsed: a typo must not
// silently change where collectives run.
Result loadPolicyConfig(PolicyConfig* cfg);
// Parses MKERNEL_COLLECTIVES / MKERNEL_ALGO syntax (exposed for tests and tools).
Result parseCollectiveList(const std::string& text, uint32_t* mask);
Result parseAlgoName(const std::string& text, int* algo);

// Where NCCL measured faster than mkernel's own path, from this size on (policyBytes; 0: nowhere):
// two ranks, one GPU each, NVLink, one node (two H200s, NCCL 2.28.9, multicast off, nccl-tests
// -b 8 -e 8G -f 2; docs/PERFORMANCE.md). NCCL/mkernel time there:
//   Reduce    from 512 KiB: 0.93-0.94x up to 1 MiB, 0.71-0.86x from 2 MiB to 8 GiB;
//   Broadcast from 2 MiB:   0.88-0.99x (2 MiB to 8 GiB; 1.00x at 32 MiB only);
//   AllReduce from 512 MiB: 0.99x, then 0.95-0.91x to 8 GiB.
// Process ranks (staged: every collective through the IPC staging buffers), the same two GPUs,
// PyTorch through the shim (scripts/torch_bench.py, docs/PERFORMANCE.md), NCCL/mkernel:
//   AllReduce     from 4 MiB:  0.91x at 4 MiB, 0.64x at 16 MiB, 0.71x at 64 MiB (1.32x at 1 MiB);
//   AllGather     from 4 MiB:  0.84x at 4 MiB, 0.74x at 16 MiB, 0.80x at 64 MiB (1.21x at 1 MiB);
//   ReduceScatter from 16 MiB: 0.63x at 16 MiB, 0.69x at 64 MiB (1.04x at 4 MiB);
//   Reduce and Broadcast: not measured with process ranks; the thread ranks' sizes above.
// Other rank counts, several nodes and emulation were not measured against NCCL this way (or NCCL
// cannot run): the table applies to 2 ranks on one node with direct access only.
size_t ncclCrossoverBytes(CollType c, int nRanks, int nNodes, bool directAccess,
                          bool staged = false);

struct PolicyQuery {
  CollType coll = CollType::AllReduce;
  DataType dtype = DataType::Float32;
  RedOp op = RedOp::Sum;
  size_t count = 0;  // NCCL's count
  int nRanks = 1;
  int nNodes = 1;
};

struct PolicyDecision {
  ExecPath path = ExecPath::Nccl;
  Algo algo = Algo::OneShot;  // meaningful when path == Mkernel
  const char* reason = "";    // static text: why this path/algorithm
  // Rule 6c consulted (several nodes, a modelled collective): its predictions, in microseconds
  // (0: not consulted), and NCCL's choice in the model ("tree/ll", ...).
  double modelNcclUs = 0, modelMkUs = 0;
  char modelNcclChoice[16] = "";
};

// The message size the thresholds compare with: count * elemSize, times nRanks for AllGather and
// ReduceScatter (their whole nRanks-block buffer, as nccl-tests reports size). Saturates.
size_t policyBytes(const PolicyQuery& q);
// Power-of-two size class for logging: 0 for 0 bytes, else floor(log2(bytes)) + 1.
int policySizeBucket(size_t bytes);

class SelectionPolicy {
 public:
  explicit SelectionPolicy(const PolicyConfig& cfg) : cfg_(cfg) {}

  // The decision; pure (no logging, no state).
  PolicyDecision decide(const PolicyQuery& q) const;
  // decide(), and at MKERNEL_DEBUG=INFO (subsystem COLL) a line the first time each
  // (collective, size class, decision) is seen by this policy.
  PolicyDecision select(const PolicyQuery& q);
  // The error an Unsupported decision makes the call return (InvalidUsage, with the reason).
  Result unsupportedError(const PolicyQuery& q, const PolicyDecision& d) const;

  const PolicyConfig& config() const { return cfg_; }

  // Tests: receive the decision lines instead of (and regardless of) the logger.
  using LogSink = void (*)(void* ctx, const char* line);
  void setLogSink(LogSink sink, void* ctx);

 private:
  PolicyConfig cfg_;
  std::mutex mu_;
  std::set<uint64_t> logged_;
  LogSink sink_ = nullptr;
  void* sinkCtx_ = nullptr;
};

}  // namespace coll
}  // namespace mkernel
