// The launch path (docs/KERNEL.md, "Small collectives: the launch path"): a small eager collective
// runs in a short kernel launched on the caller's stream instead of through the persistent
// kernel's doorbell. The stream memops of the doorbell cost 7-15 µs per collective on the H200
// (the kernel trace), more than NCCL's whole small AllReduce; a launch costs ~4 µs.
//
// One barrier per collective. For launch-path op e (a counter the same on every rank, "One
// numbering" below: every rank makes the same launch-path decisions in the same order), CTA c of
// rank r
//   1. publishes its part of r's input into r's inbox launchInbox[e & 1] (DeviceState, mapped
//      into every peer),
//   2. stores e into launchArrive[c] (release, system scope) and waits until every peer's
//      launchArrive[c] >= e,
//   3. reads its part of every peer's inbox and writes r's output (a reduction in rank order
//      0..n-1 on every rank, or a copy).
// Reusing parity e & 1 at op e + 2 is safe without a second barrier: r's op e + 2 starts after its
// op e + 1 ended (stream order), and op e + 1 passed the flags of every peer for e + 1, which each
// peer stored only after its op e had ended (its stream order), i.e. after its reads of r's inbox.
// The caller's streams must therefore run a communicator's launch-path ops one at a time: the host
// chains a change of stream to the previous eager op with an event; graphs holding collectives of
// one communicator, and eager collectives beside them, must not run concurrently (as with NCCL).
//
// One numbering. Launches captured into CUDA graphs are numbered by the device (a replay repeats
// its arguments): each CTA takes DeviceState::graphSeq + 1 at its start and the last CTA to finish
// stores it back, when every CTA of the launch has read it. Eager launches are numbered the same
// way, in the same flags and inboxes (DeviceState::launch[kLaunchGraph]; KernelParams::
// deviceNumbers), so that a collective captured on one rank and run eagerly on another meets
// (docs/SHIM.md, "One route on every rank"); the host still numbers eager ops for its own
// bookkeeping (the launch watch, the trace, finalize's drain). The argument above holds for the
// device's numbers. MKERNEL_EAGER_HOST_NUMBERS=1 (a test setting) gives eager launches the host's
// numbers e in a namespace of their own (launch[kLaunchEager]), which shares nothing with the
// captured one; then a rank that captures a collective never meets one that runs it eagerly.
//
// Plain header (MKERNEL_HD): the kernel and the CPU test (tests/collectives/test_launch_path.cc)
// use the same slicing.
#pragma once

#include <cstdint>

#include "collectives/algo/algo.h"
#include "collectives/types.h"
#include "collectives/algo/work.h"

namespace mkernel {
namespace coll {

// Inbox bytes below which one more CTA does not pay for its flag.
constexpr uint64_t kLaunchBytesPerCta = 32 * 1024;

// Elements one rank publishes: its whole input (ReduceScatter: n blocks of count).
MKERNEL_HD inline uint64_t launchPublishElems(CollType c, uint64_t count, int nRanks) {
  return c == CollType::ReduceScatter ? count * static_cast<uint64_t>(nRanks) : count;
}

// Direct mode's upper end (MKERNEL_DIRECT_MAX_BYTES=auto): from this many bytes of the whole
// buffer (nccl-tests' size: AllGather and ReduceScatter count x nRanks, the others count), eager
// ops of thread ranks go to the persistent kernel instead (its CTAs: 512 threads each, movers
// called through pointers), which moved them faster on two H200s (docs/PERFORMANCE.md:
// ReduceScatter 32 MiB 186 GB/s against 172, 512 MiB 315 against 210; AllGather 128 MiB 275
// against 266, 512 MiB 314 against 279; AllReduce was faster in the launch kernel at every size).
// 0: no upper end.
MKERNEL_HD inline uint64_t directAutoMaxBytes(CollType c) {
  switch (c) {
    case CollType::ReduceScatter:
      return uint64_t(32) << 20;
    case CollType::AllGather:
      return uint64_t(128) << 20;
    default:
      return 0;
  }
}
MKERNEL_HD inline uint64_t directWholeBytes(CollType c, uint64_t count, int nRanks,
                                            uint64_t elemSize) {
  const bool perRankBlocks = c == CollType::ReduceScatter || c == CollType::AllGather;
  return (perRankBlocks ? count * static_cast<uint64_t>(nRanks) : count) * elemSize;
}
// Whether direct mode takes an op of `wholeBytes` (directWholeBytes). limit: the setting, with
// kDirectAuto for the table above. sharing: the most ranks any GPU of the communicator holds
// (emulation). Ranks sharing a GPU share its SMs, so the launched CTAs are few and the persistent
// kernel moved large ops much faster (one H200, AllReduce: 2 ranks, 16 MiB 52 us
// direct against 64, 128 MiB 292 against 215; 4 ranks, 256 KiB 37 against 51, 2 MiB 96 against
// 51; 8 ranks, 256 KiB 54 against 62, 2 MiB 132 against 76): auto ends direct mode there at
// 32 MiB (2 ranks per GPU) and 1 MiB (more). sharedDirect (MKERNEL_SHARED_CTAS): those
// ranks' persistent kernels are kept small and their direct-mode kernels hold the GPU (64 CTAs of
// 512 threads each for 2 ranks): auto has no upper end then (one H200, a 64 MiB AllReduce of 2
// ranks 81.9 us, 77% of the copy bandwidth, against the persistent kernel's 125 us).
constexpr uint64_t kDirectAuto = ~uint64_t(0);
MKERNEL_HD inline bool directTakes(CollType c, uint64_t wholeBytes, uint64_t limit, int sharing = 1,
                                   bool sharedDirect = false) {
  uint64_t max = limit;
  if (limit == kDirectAuto && sharing > 1 && sharedDirect) return true;
  if (limit == kDirectAuto) {
    max = directAutoMaxBytes(c);
    const uint64_t shared = sharing <= 1   ? 0
                            : sharing == 2 ? uint64_t(32) << 20
                                           : uint64_t(1) << 20;
    if (shared != 0 && (max == 0 || shared < max)) max = shared;
  }
  return max == 0 || wholeBytes < max;
}

// MKERNEL_SHARED_CTAS=auto: the persistent kernel's CTAs per rank when `sharing` thread ranks share
// a GPU and their large collectives run in direct mode: together 4 SMs for 2 to 4 ranks (2 each
// for 2 ranks, 1 for 3 or 4), 1 each for more. directUnbounded: direct mode has no upper end
// (MKERNEL_DIRECT_MAX_BYTES auto or 0), so no collective of theirs takes the doorbell (pathOf),
// the persistent kernel never runs and the direct-mode kernels may take every SM (agreeLaunchCap):
// 64, 32 and 16 CTAs per rank for 2, 4 and 8 ranks on an H200, powers of two. With a numeric upper
// end, more than 4 ranks keep it off (0): the ops above that end take the persistent kernel, which
// then keeps its full size (docs/KERNEL.md, "The direct-mode kernel").
constexpr int kSharedPersistentSms = 4;
MKERNEL_HD inline int sharedPersistentCtas(int sharing, bool directUnbounded = true) {
  if (sharing < 2) return 0;
  if (sharing <= kSharedPersistentSms) return kSharedPersistentSms / sharing;
  return directUnbounded ? 1 : 0;
}

// One CTA per `perCta` bytes, at least one, at most `cap`.
MKERNEL_HD inline int ctasPer(uint64_t bytes, uint64_t perCta, int cap) {
  uint64_t c = (bytes + perCta - 1) / perCta;
  if (c < 1) c = 1;
  if (c > static_cast<uint64_t>(cap)) c = static_cast<uint64_t>(cap);
  return static_cast<int>(c);
}

// CTAs of one launch-path op: the same on every rank (a function of shared arguments and of the
// cap the ranks agreed on at creation).
MKERNEL_HD inline int launchCtas(uint64_t publishBytes, int cap) {
  return ctasPer(publishBytes, kLaunchBytesPerCta, cap);
}

// What CTA `cta` of rank `rank` does in one launch-path op. Offsets are in elements.
struct LaunchPart {
  Slice part;         // this CTA's elements of one block (the split is the same on every rank)
  int publishBlocks;  // blocks of `count` it publishes from its input: n for ReduceScatter, else 1
                      // (0: a Broadcast's non-root publishes nothing)
  bool compute;       // it writes output (Reduce: the root only)
  uint64_t readOffset;  // where it reads in every peer's inbox
};

MKERNEL_HD inline LaunchPart launchPart(CollType c, uint64_t count, int nRanks, int rank, int root,
                                        int nCtas, int cta, size_t elemSize) {
  LaunchPart lp;
  lp.part = rankSlice(count, nCtas, cta, sliceAlignElems(elemSize));
  lp.publishBlocks =
      c == CollType::ReduceScatter ? nRanks : (c == CollType::Broadcast && rank != root ? 0 : 1);
  lp.compute = !(c == CollType::Reduce && rank != root);
  lp.readOffset =
      (c == CollType::ReduceScatter ? static_cast<uint64_t>(rank) * count : 0) + lp.part.offset;
  return lp;
}

// ---- LL mode (small ops) ------------------------------------------------------------------------
//
// The inbox mode above costs two NVLink round trips and two system-scope fences per op: a rank
// publishes locally, releases a flag, and each peer polls that flag remotely and then reads the
// data remotely. In LL mode (after NCCL's LL protocol) a rank pushes: it stores its data into
// each peer's line slot (DeviceState::ll, 16-byte lines: 8 payload bytes and the op's flag in
// each 8-byte half), and each receiver polls its own memory until both halves of a line carry the
// flag. One one-way NVLink write per op, no fence, no flag word.
//
//   0. CTA 0 stores a token line (flag only) into every peer's token[e & 1][r];
//   1. every CTA pushes its share of the lines (llCtaLines) to every peer that needs them
//      (llSends; ReduceScatter: the peer's block);
//   2. it polls the lines it needs from each source in its own slots, combines them in rank
//      order 0..n-1 (its own contribution read from its input), writes the output, and zeroes
//      each line it consumed;
//   3. CTA 0 waits for every peer's token, and zeroes it.
//
// Parity e & 1 is rewritten at op e + 2. Rank r starts op e + 2 after its op e + 1 ended, which
// received a token (or lines) from every peer k written in k's op e + 1, which k's stream
// started after k's op e ended: k has read and zeroed everything r wrote at op e. The token
// exists for the ops in which r receives nothing from k (Broadcast from another root, Reduce on
// a non-root): without it a non-root could run two Reduces ahead of the root and overwrite lines
// the root has not read (tests/collectives/test_launch_ll.cc shows both). Since every consumed
// line is zeroed, a line holds 0 or the current op's flag, so the flag's 32 bits may wrap.
// It shares the epoch numbering with the other modes and no memory with them.

// LL batches (MKERNEL_LL_BATCH). A group's consecutive LL ops (at most
// kMaxOpsPerSlot, and together at most what one slot holds: llSlotLines(n) lines) go out as one
// kernel launch (launchLlBatchKernel). The run is the same on every rank: it depends only on the
// ops' coll, count and dtype, which every rank shares.
//   serial (ops of one CTA each, one CTA): op i of the batch is launch-path op e + i, run as above
//     after op i - 1 ended. The argument above holds unchanged: between consecutive ops of one
//     rank nothing differs from two launches on one stream but the launch.
//   exchange (the default): the batch is ONE exchange, number e: one flag, one token per peer,
//     each op's lines after the earlier ops' in every slot (lineBase), over a grid of llCtas(the
//     batch's payload) CTAs. Phases 0-3 as above, over all the batch's lines; the argument above
//     holds with "op" read as "exchange" (the batch takes one number, so exchanges still alternate
//     parity; the next launch starts after every CTA of this one ended). Within it, when a rank
//     pushes an op and when it receives one is its own choice (peers only poll lines; any thread
//     may take any line), so the ops run in waves of this rank's choosing (llPlanWaves below):
//     the ops of a wave at once on their own warps, a grid barrier between waves. A wave waits
//     only for lower ops, so no two ranks wait on each other. Outputs are written in op order (a
//     later op's overlapping output wins, as NCCL runs a group in order), and every input is read
//     before any later op writes it.

// Payload bytes per CTA below which another CTA does not pay for itself.
constexpr uint64_t kLlBytesPerCta = 8 * 1024;
// Lines a thread handles at once (the kernel's llLoadBatch / llPutBatch / llTakeBatch): it issues
// the loads of kLlBatch lines (input, or polls of its own slots) before it uses any of them. One
// line at a time, each line costs a dependent memory latency in the push and another in the
// receive: on two H200s push / receive took 1.09 / 1.18 us at 2 KiB (one line per thread) and
// 1.82 / 2.91 us at 8 KiB (four). With kLaunchThreads = 256, kLlBytesPerCta is one batch per
// thread, up to kLlAutoMaxBytes over 32 CTAs. With batches (two H200s): push 1.7-1.9 / receive
// 2.2-2.9 us from 8 B to 128 KiB, the same as one line at a time: the per-line latency is not
// what dominates (docs/KERNEL.md, LL mode).
constexpr int kLlBatch = 4;
static_assert(kLlBytesPerCta == static_cast<uint64_t>(kLlBatch) * kLaunchThreads * kLlLinePayload,
              "an LL CTA's share is one batch per thread");
// MKERNEL_LL_MAX_BYTES=auto with more than two ranks on one GPU (emulation): their launches share
// the SMs (one CTA each with 8 ranks), and pushing 32 KiB to every co-located peer cost more than
// the inbox mode. One H200, AllReduce, eager µs LL / inbox: 4 ranks 8 KiB
// 26.3 / 29.3, 32 KiB 44.3 / 32.7; 8 ranks 8 KiB 46.1 / 49.9, 32 KiB 75.0 / 52.9; 2 ranks 32 KiB
// 14.8 / 20.5.
constexpr uint64_t kLlSharedMaxBytes = 8 * 1024;
// MKERNEL_LL_MAX_BYTES=auto with at most two ranks on each GPU, before llMaxPayload(n) caps it.
// AllReduce, eager medians in µs, LL / as without it (collbench, one thread per rank):
// two H200s 8 B 8.26 / 12.19, 128 KiB 11.04 / 16.00, 256 KiB 11.14 / 16.16; 2 ranks
// emulated on one H200 32 KiB 10.98 / 13.89, 128 KiB 11.33 / 13.86 (with 4 ranks on
// the GPU, 128 KiB: 121 / 29, hence kLlSharedMaxBytes there). With 2 ranks the slots cap it at
// 256 KiB; with 4 at 128 KiB, with 8 at 64 KiB (not measured on 4 or 8 GPUs).
constexpr uint64_t kLlAutoMaxBytes = 256 * 1024;

// Lines of one source's slot in a communicator of n ranks (each parity's lines split n ways; the
// own rank's slot goes unused): what one exchange carries from one source to one destination
// (an LL batch's ops together). And the most payload one op sends one destination in LL mode.
// (A 32-bit division: the kernel computes it at every LL op.)
static_assert(kLlSpaceLines <= 0xffffffffull, "llSlotLines divides in 32 bits");
static_assert(kLlOpSpaceLines <= kLlSpaceLines, "an op fits a slot");
MKERNEL_HD inline uint64_t llSlotLines(int nRanks) {
  return static_cast<uint32_t>(kLlSpaceLines) / static_cast<uint32_t>(nRanks);
}
MKERNEL_HD inline uint64_t llMaxPayload(int nRanks) {
  return static_cast<uint64_t>(static_cast<uint32_t>(kLlOpSpaceLines) /
                               static_cast<uint32_t>(nRanks)) *
         kLlLinePayload;
}
// The index in LlSpace::lines[parity] of line i of source k's slot.
MKERNEL_HD inline uint64_t llSlotLine(uint64_t slotLines, int source, uint64_t i) {
  return static_cast<uint64_t>(source) * slotLines + i;
}

// Bytes one source sends one destination: count elements (ReduceScatter: the destination's block).
MKERNEL_HD inline uint64_t llPayloadBytes(uint64_t count, uint64_t elemSize) {
  return count * elemSize;
}
MKERNEL_HD inline uint64_t llLines(uint64_t payloadBytes) {
  return (payloadBytes + kLlLinePayload - 1) / kLlLinePayload;
}
// Whether LL mode takes an op of payloadBytes with limit MKERNEL_LL_MAX_BYTES, n > 1 ranks.
MKERNEL_HD inline bool llTakes(uint64_t payloadBytes, uint64_t limit, int nRanks) {
  return payloadBytes > 0 && payloadBytes <= limit && payloadBytes <= llMaxPayload(nRanks);
}
// The limit MKERNEL_LL_MAX_BYTES asks for (asked; auto: ~0ull) on a rank with ranksOnGpu ranks on
// its GPU, in a communicator of n ranks: never above what the slots hold.
MKERNEL_HD inline uint64_t llLimit(uint64_t asked, int nRanks, int ranksOnGpu) {
  const uint64_t want = asked != ~0ull   ? asked
                        : ranksOnGpu > 2 ? kLlSharedMaxBytes
                                         : kLlAutoMaxBytes;
  const uint64_t most = llMaxPayload(nRanks);
  return want < most ? want : most;
}
MKERNEL_HD inline int llCtas(uint64_t payloadBytes, int cap) {
  return ctasPer(payloadBytes, kLlBytesPerCta, cap);
}
// Lines [first, first + count) of CTA `cta` of nCtas (the same split on every rank).
struct LlRange {
  uint64_t first;
  uint64_t count;
};
MKERNEL_HD inline LlRange llCtaLines(uint64_t lines, int nCtas, int cta) {
  if (nCtas == 1) return LlRange{0, lines};  // every op up to kLlBytesPerCta: no division
  const uint64_t per = (lines + static_cast<uint64_t>(nCtas) - 1) / static_cast<uint64_t>(nCtas);
  uint64_t first = per * static_cast<uint64_t>(cta);
  if (first > lines) first = lines;
  uint64_t end = first + per;
  if (end > lines) end = lines;
  return LlRange{first, end - first};
}
// Whether rank src sends data to rank dst (src != dst).
MKERNEL_HD inline bool llSends(CollType c, int src, int dst, int root) {
  if (c == CollType::Broadcast) return src == root;
  if (c == CollType::Reduce) return dst == root;
  return true;
}
// Byte offset in the source's sendbuff of what it sends dst (ReduceScatter: dst's block) and of
// its own contribution to its own output (dst = itself).
MKERNEL_HD inline uint64_t llSendOffset(CollType c, uint64_t count, uint64_t elemSize, int dst) {
  return c == CollType::ReduceScatter ? static_cast<uint64_t>(dst) * count * elemSize : 0;
}
// The flag of op e: never 0, the value of a consumed line.
MKERNEL_HD inline uint32_t llFlag(uint64_t epoch) {
  const uint32_t f = static_cast<uint32_t>(epoch);
  return f == 0 ? 1u : f;
}

// MKERNEL_LL_BATCH=exchange: a batch's ops in waves. The ops of one wave run at the
// same time, each on its own warps of the batch's grid (push, then receive, then the next wave
// after a barrier over the grid). Serially, with one thread group running the ops one after
// another, a group of 8 cost 8 times one op's latency-bound frame (4.4 us per op on two
// H200s).
// Op i starts a new wave when its order against an op of the current wave matters on this rank:
// it reads what that op writes, or writes what that op reads or writes (an op reads its input
// again in its receive: its own contribution). Except a twin: the same collective as that op,
// with the same arguments and buffers, out of place (its input and output apart): both read the
// same input, which neither writes, and write the same bytes to the same output, since the
// reduction order is the same (nccl-tests -m repeats ops on one buffer when few fit in it). The
// plan is each rank's own (its buffers), which is safe because an op waits for the peers' pushes
// of that op only, and a rank pushes op i once its waves before i are done, which wait only for
// lower ops: by induction every op is pushed.
// A wave holds at most `warps` ops (the batch kernel's grid: warps over every CTA); each op of
// a wave gets a warp, the spare warps are shared in proportion to the ops' lines, and what
// rounding leaves goes one at a time to the op with the most lines per warp.
struct LlBatchMem {
  uint64_t send, sendBytes;  // what the op reads on this rank
  uint64_t recv, recvBytes;  // what it writes
  uint64_t lines;            // its lines per slot
  int twin;                  // the first earlier op it is a twin of (above), or -1
};
struct LlWaves {
  uint32_t startMask;                  // bit i: op i starts a wave (after a barrier)
  uint16_t warpFirst[kMaxOpsPerSlot];  // op i's warps in its wave
  uint16_t warpCount[kMaxOpsPerSlot];
  int waves;
};
inline bool llOverlap(uint64_t a, uint64_t aBytes, uint64_t b, uint64_t bBytes) {
  return aBytes > 0 && bBytes > 0 && a < b + bBytes && b < a + aBytes;
}
// split false: every op in one wave regardless of its memory (for the CPU test's variant that
// must fail).
inline LlWaves llPlanWaves(const LlBatchMem* ops, int nOps, int warps, bool split = true) {
  LlWaves w{};
  int first = 0;
  auto close = [&](int end) {  // warps for ops [first, end)
    ++w.waves;
    const uint64_t spare = static_cast<uint64_t>(warps - (end - first));
    uint64_t lines = 0, given = 0;
    for (int i = first; i < end; ++i) lines += ops[i].lines;
    for (int i = first; i < end; ++i) {
      const uint64_t share = lines > 0 ? spare * ops[i].lines / lines : 0;
      w.warpCount[i] = static_cast<uint16_t>(1 + share);
      given += share;
    }
    for (; given < spare; ++given) {
      int best = first;
      for (int i = first + 1; i < end; ++i)
        if (ops[i].lines * w.warpCount[best] > ops[best].lines * w.warpCount[i]) best = i;
      ++w.warpCount[best];
    }
    int at = 0;
    for (int i = first; i < end; ++i) {
      w.warpFirst[i] = static_cast<uint16_t>(at);
      at += w.warpCount[i];
    }
  };
  for (int i = 1; i < nOps; ++i) {
    bool conflict = i - first >= warps;
    for (int j = first; j < i && split && !conflict; ++j)
      conflict = !(ops[i].twin >= 0 && (ops[i].twin == j || ops[j].twin == ops[i].twin)) &&
                 (llOverlap(ops[i].send, ops[i].sendBytes, ops[j].recv, ops[j].recvBytes) ||
                  llOverlap(ops[i].recv, ops[i].recvBytes, ops[j].send, ops[j].sendBytes) ||
                  llOverlap(ops[i].recv, ops[i].recvBytes, ops[j].recv, ops[j].recvBytes));
    if (conflict) {
      close(i);
      first = i;
      w.startMask |= 1u << i;
    }
  }
  if (nOps > 0) close(nOps);
  return w;
}

}  // namespace coll
}  // namespace mkernel
