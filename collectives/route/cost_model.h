// An alpha-beta cost model of AllReduce, ReduceScatter and AllGather on
// N nodes x G GPUs: NCCL's ring and tree (with NCCL 2.28's own latency constants) against
// mkernel's hierarchical algorithm (collectives/algo/hierarchical.h), pipelined inside the
// persistent kernel or phase after phase. It plans past the hardware this project has;
// docs/MODEL.md gives every parameter's source, the predictions for 2, 8 and 64 nodes of 8 x H200,
// and how far the model is from what was measured.
#pragma once

#include <string>
#include <vector>

#include "collectives/types.h"

namespace mkernel {
namespace coll {

struct CostParams {
  int nodes = 2;
  int gpusPerNode = 8;
  // Sustained bandwidths, GB/s per direction.
  // One GPU's NVLink bus bandwidth without NVLS: NCCL 2.28.9's busbw for an 8 GiB AllReduce on
  // two H200s (nccl-tests, docs/MODEL.md); an 8-GPU NVSwitch node is assumed alike.
  double nvlinkGBps = 346.0;
  double nicGBps = 48.0;  // one 400 Gb/s NIC (ConnectX-7), ~96% of line rate
  int nicsPerNode = 8;    // rail-aligned: one NIC per GPU
  // NCCL: its tuner's constants (src/graph/tuning.cc of 2.28.9, LL / LL128 / Simple).
  double ncclBaseUs[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};  // [tree, ring][proto]
  double ncclNvlinkLatUs[2][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
  double ncclNetLatUs[2][3] = {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}};
  double ncclNetOverheadUs = 1.0;  // x86 Intel (x3 for Simple), as NCCL's getNetOverhead
  // mkernel (assumptions until measured on a cluster; the overhead can be set to what the H200
  // measured today, docs/PERFORMANCE.md).
  double mkOverheadUs = 8.0;   // per call: doorbell -> kernel -> done (the design goal)
  double mkIntraStepUs = 1.0;  // one NVLink barrier / flag round trip
  double mkInterStepUs = 4.0;  // one inter-node step: GPU -> proxy ring -> RDMA -> flag
  // The rail exchange's steps per AllReduce (MKERNEL_HIER_RAIL): kRailBest = the fewer of ring's
  // 2 (N - 1) and recursive halving/doubling's 2 log2 N (the published predictions); 0 direct (2
  // steps at any N; its N - 1 transfers per step are not charged), 1 ring, 2 rhd (a node count
  // that is not a power of two: ring, as the kernel runs it). The wire bytes are the same.
  int rail = kRailBest;
  static constexpr int kRailBest = -1;
  // Per message a rank sends among the rail (railMessagesFor), on top of the per-step term: the
  // direct form's fan-out. 0 in the published predictions; on emulated nodes over loopback TCP it
  // was 24 us (docs/MODEL.md), which is host CPU time, not a NIC's.
  double mkMsgUs = 0.0;
  // The share of the shorter of the two (NVLink, rail) phases that the pipeline hides: 1 (the
  // max-of-phases rule) in the published predictions; timed by phase on emulated nodes of one
  // H200 it was 0.34-0.73 at 4-16 MiB (docs/MODEL.md), where the phases share the GPU
  // and the host's cores. mkPipelinedUs = lat + max + (1 - hidden) x min.
  double hidden = 1.0;
};

// Inter-node steps of one AllReduce among N nodes for rail (CostParams::rail).
int railStepsFor(int rail, int nodes);
// Messages one rank sends among the rail per AllReduce chunk: direct and ring 2 (N - 1), rhd
// 2 log2 N (ring's when N is not a power of two); kRailBest: as the form railStepsFor picks.
int railMessagesFor(int rail, int nodes);

// One CostParams setting by name: mkernel-model's flag without its dashes. Names: nvlink-gbps,
// nic-gbps (> 0), nics (>= 1), mk-overhead-us, mk-intra-us, mk-inter-us, mk-msg-us (>= 0), hidden
// (0..1), rail (best, direct, ring, rhd). False, with *why, for an unknown name or a value that is
// not a number in its range. The topology (nodes, GPUs per node) is not among them: the tool
// takes it from --nodes/--gpus, the selection policy from the communicator.
bool setCostParam(CostParams* p, const std::string& name, const std::string& value,
                  std::string* why);
// "name=value,name=value" (MKERNEL_COST_MODEL; empty: nothing): each through setCostParam. *given
// (may be null) gets the names set, in order. False, with *why, at the first bad item; *p is then
// left as it was.
bool parseCostParams(const std::string& text, CostParams* p, std::vector<std::string>* given,
                     std::string* why);

// The parameters the selection policy predicts with before MKERNEL_COST_MODEL (rule 6c,
// docs/ALGORITHMS.md §6; docs/MODEL.md, "In the selection policy"): the published ones, except
// the per-call overhead, which is what the H200 measured for the persistent kernel's doorbell
// (kPolicyOverheadUs; every hierarchical collective takes it).
CostParams policyCostParams();
// The doorbell's per-call time on one H200 (mkernel-collbench --wait memop --ranks 1, 8 B
// AllReduce, eager median of 1,000: 28.93 us).
constexpr double kPolicyOverheadUs = 28.9;
// A NIC's sustained share of its line rate (the published 48 GB/s for 400 Gb/s: ConnectX-7).
constexpr double kNicEfficiency = 0.96;

struct CollCost {
  double ncclRingUs = 0, ncclTreeUs = 0;  // best protocol of each (tree: AllReduce only, else +inf)
  double ncclUs = 0;                      // NCCL's choice: the faster of the two
  std::string ncclChoice;                 // "ring/simple", "tree/ll", ...
  double mkPipelinedUs = 0;               // the three phases overlapped in chunks
  double mkSerialUs = 0;                  // the same phases one after another
  double speedup = 0;                     // ncclUs / mkPipelinedUs
};

using AllReduceCost = CollCost;

// bytes: NCCL's per-rank AllReduce size. Parameters must be positive (nodes, GPUs, bandwidths).
AllReduceCost predictAllReduce(const CostParams& p, double bytes);

// AllReduce, ReduceScatter or AllGather (others: every time NaN, ncclChoice "not modelled").
// bytes: nccl-tests' size (AllReduce: per rank; ReduceScatter: the send buffer, every rank's
// block; AllGather: the receive buffer). NCCL runs ReduceScatter and AllGather as a ring of
// R - 1 steps, N - 1 of them between nodes (its tree is AllReduce's alone; PAT, which it may pick
// with one GPU per node, and NVLS are not modelled); mkernel as the first or second half of its
// hierarchical AllReduce: one NVLink phase of (G - 1) / G of the bytes and a rail phase of
// (N - 1) / N of bytes / G, half of the AllReduce's rail steps and messages, one NVLink step.
CollCost predictCollective(const CostParams& p, CollType coll, double bytes);

// MKERNEL_HIER_RAIL's name of a rail algorithm (CostParams::rail >= 0): "direct", "ring", "rhd".
const char* railAlgoName(int rail);

}  // namespace coll
}  // namespace mkernel
