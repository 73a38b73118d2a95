// The CPU reference executor: runs a Plan over host buffers of ALL simulated ranks the way the
// persistent kernel runs it on GPUs: phase by phase (a phase ends where the kernel has a
// cross-rank barrier or flag wait), rank by rank, with algo.h's partition, ring schedule,
// chunking and reduction order and reduce_host.h's arithmetic. Direct algorithms access the
// peers' user buffers in place, as the kernel does; Ring pushes chunks through per-rank staging
// inboxes. CI has no GPU: this is how schedules, chunking, counts that do not divide,
// in-place/aliased buffers and roots are tested (tests/collectives), and the kernel's results
// must equal this executor's bit for bit.
//
// What it checks while running (an InternalError names the plan, phase, ranks and addresses):
//   - no two ranks touch overlapping bytes in one phase unless both only read (on the GPU that
//     would be a race: this is what proves in-place and aliased buffers safe);
//   - a staging region is read only after it was written in an EARLIER phase of the same round,
//     with exactly the element count written; staging is poisoned at every round's start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/algo/plan.h"
#include "common/result.h"

namespace mkernel {
namespace coll {

// One rank's user buffers, as passed to NCCL. In-place: send == recv (AllReduce, Broadcast,
// Reduce), send == recv + rank*count elements (AllGather), recv == send + rank*count elements
// (ReduceScatter). Broadcast reads `send` on the root only; Reduce writes `recv` on the root
// only (both may be nullptr elsewhere).
struct RankBuffers {
  const void* send = nullptr;
  void* recv = nullptr;
};

// Device-memory traffic the executor performed, summed over ranks (bytes): user-buffer and
// staging reads and writes, counted as minDeviceBytesPerRank() counts them.
struct ReferenceStats {
  uint64_t bytesRead = 0;
  uint64_t bytesWritten = 0;
  uint64_t rounds = 0;
  uint64_t phases = 0;
};

// Runs the plan over bufs[0 .. plan.args.nRanks-1]. Buffer sizes are plan.sendCount() /
// plan.recvCount() elements.
Result runReference(const Plan& plan, const RankBuffers* bufs, ReferenceStats* stats = nullptr);

// ---- result checks (shared with GPU tests and the benchmark's verification) --------------------

// Norm-wise tolerances (docs/ALGORITHMS.md, verification): fp64 1e-12, fp32 1e-5, fp16/bf16 1e-2,
// fp8 1e-1; 0 (exact) for integers.
double normwiseTolerance(DataType dtype);

// Floats: ||got - expected||_2 / ||expected||_2 (absolute when ||expected|| is 0) must not exceed
// normwiseTolerance(dtype); a NaN anywhere fails. `expected` holds float64 values.
// Returns true if within tolerance; *why gets the error and the worst element otherwise.
bool checkNormwise(DataType dtype, const void* got, const double* expected, size_t n,
                   std::string* why, double* relErr = nullptr);

}  // namespace coll
}  // namespace mkernel
