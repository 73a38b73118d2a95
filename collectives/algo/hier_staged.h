// Hierarchical collectives through staging and the proxy: the in-kernel form of
// collectives/algo/hierarchical.h's phases (docs/ALGORITHMS.md, "Hierarchical"), chunked and
// written once as templates over an executor, like collectives/algo/staged.h. AllReduce is
// described here; the other four are at their functions below. The CPU test
// (tests/collectives/test_hier_staged.cc) runs it with rank threads, node-local staging regions
// checked for early reuse, and a real transport/proxy/Proxy per rank moving the inter-node bytes
// over TCP on loopback: the same command ring the persistent kernel will post to.
//
// Ranks are nNodes x perNode (NodeLayout); rank (k, j) is local rank j of node k. For each chunk
// of l elements of the buffer (at element g of this CTA's part):
//
//   1 intra  push part q of the chunk (rankSlice(l, perNode, q)) into slot j of local rank q's
//            inbox; node barrier; reduce part j over the node's slots (pre() applied,
//            not post()) into this rank's net buffer P (registered with the proxy)
//   2 inter  among the rail (ranks (m, j) for every node m), P in nNodes sub-parts
//            t_m = rankSlice(|P|, nNodes, m): round 1 sends t_m to node m and receives t_k from
//            every other node; reduce t_k over the nodes in order 0..nNodes-1 (post() applied);
//            round 2 sends the reduced t_k to every other node and receives their t_m (the
//            direct form; MKERNEL_HIER_RAIL=ring or rhd exchange the same blocks in N - 1 or
//            log2 N steps of one peer each: "The AllReduce's exchange among the rail" below)
//   3 intra  push every t_m of part j into the out region of every local rank (at part j's
//            offset); node barrier; copy this rank's out region into its recvbuff
//
// Reduction order: local ranks 0..perNode-1 within a node, then nodes 0..nNodes-1, the order
// hierarchical.h fixes (integers equal the flat algorithms' bits); the ring and rhd exchanges
// reduce over the nodes in their own order.
//
// Within one collective, done one chunk after another, reuse would need no parity (unlike
// staged.h's single barrier per chunk): a rank pushes chunk i+1 into a peer's inbox only after the
// second node barrier of chunk i, which the peer reaches after it has read its inbox; and into a
// peer's out region only after the first node barrier of chunk i+1, which the peer reaches after
// it has copied its out region of chunk i away. Across collectives that fails (the next
// collective's first push follows no barrier the peer passed after its reads), and the pipelined
// forms (MKERNEL_HIER_OVERLAP, below) reorder the phases, so every collective alternates regions
// by the CTA's chunk parity. Net buffers are this rank's own, kHierNetSlots (3) slots: a round's
// transfers complete before the buffers of its slot are read or refilled. The AllReduce takes slot
// seq % 3 for the chunk of sequence number seq (three chunks in flight on the rail:
// MKERNEL_HIER_AHEAD below); the other collectives take seq & 1.
// (tests/transport/proxy/test_hier_staged.cc breaks the second barrier on purpose and checks that
// the race check sees it.)
#pragma once

#include <cstdint>
#include <string>

#include "collectives/algo/algo.h"
#include "collectives/algo/hierarchical.h"
#include "collectives/algo/work.h"

namespace mkernel {
namespace coll {

constexpr int kMaxHierNodes = 16;

// nvcc: the templates below are host+device, and their executors are one or the other.
#ifdef __CUDACC__
#define MK_HIER_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define MK_HIER_TEMPLATE
#endif
// Each collective's body is its own function on the device: inlined together into one switch,
// their scratch arrays (HierCtx, HierRail: ~800 B per collective) were all given separate stack
// slots, and the persistent kernel's frame, which CUDA reserves for every resident thread,
// grew to 5.4 KB (scripts/test.sh spill; docs/PERFORMANCE.md).
#if defined(__CUDACC__)
#define MK_HIER_NOINLINE __noinline__
#else
#define MK_HIER_NOINLINE
#endif

struct HierCall {
  CollType coll;
  int root;  // Broadcast / Reduce
  NodeLayout layout;
  int node, local;  // this rank
  uint64_t count;   // NCCL's count (per-rank block for AllGather / ReduceScatter)
  uint64_t elemSize;
  uint64_t send, recv;  // this rank's user buffers
  Slice part;           // this CTA's elements (of the per-rank block)
  uint64_t chunkElems;  // hierChunkElemsFor()
  bool overlap = true;  // pipeline the phases of consecutive chunks (false: one after another,
                        // the same code: MKERNEL_HIER_OVERLAP=0, for the comparison)
  int rail = 0;         // HierRailAlgo (MKERNEL_HIER_RAIL): the exchange among the rail
  bool keepOwn = true;  // MKERNEL_HIER_KEEP_OWN: this rank's own piece of the rail reduction stays
                        // in device memory (hierArKeepOwn below; false: through P)
  int ahead = 2;  // MKERNEL_HIER_AHEAD: chunks the pipelined direct AllReduce starts before it
                  // finishes one (1 or 2; hierAllReduce below)
  // CTA roles (MKERNEL_HIER_ROLES, AllReduce only; hierAllReduceRoles below). With
  // role != kHierRoleNone, `part` is the lane's slice, which all of the lane's CTAs share.
  int role = 0;       // HierRole
  int roleIndex = 0;  // worker w of `workers`, reducer r of `reducers`
  int workers = 0, reducers = 0;
  uint64_t roleChunks = 0;  // chunks this lane ran in roles before this collective
  uint64_t roleOps = 0;     // role collectives (of at least one chunk) this lane ran before
};

// Elements of a chunk: an inbox holds perNode slots of the largest part of a chunk, so a chunk
// may be about chunkBytes of the per-rank buffer; a multiple of the 16-byte alignment.
MKERNEL_HD inline uint64_t hierChunkElems(const NodeLayout& L, uint64_t elemSize,
                                          uint64_t chunkBytes) {
  const uint64_t align = sliceAlignElems(elemSize);
  // The largest of perNode parts is at most ceil(l / perNode) rounded up to the alignment, and
  // perNode of them must fit: l <= (chunkBytes / esz / perNode - align) * perNode, aligned down.
  const uint64_t perSlot = chunkBytes / elemSize / static_cast<uint64_t>(L.perNode);
  if (perSlot <= align) return 0;
  return (perSlot - align) * static_cast<uint64_t>(L.perNode) / align * align;
}

// Elements of a chunk for collective c: every staged piece fits a chunkBytes region
// (AllReduce: perNode slots of a part; ReduceScatter and AllGather: nNodes x perNode slots of the
// chunk; Reduce: perNode slots; Broadcast: the chunk); 0 when chunkBytes is too small.
MKERNEL_HD inline uint64_t hierChunkElemsFor(CollType c, const NodeLayout& L, uint64_t elemSize,
                                             uint64_t chunkBytes) {
  const uint64_t align = sliceAlignElems(elemSize);
  uint64_t slots = 1;
  switch (c) {
    case CollType::AllReduce:
      return hierChunkElems(L, elemSize, chunkBytes);
    case CollType::ReduceScatter:
    case CollType::AllGather:
      slots = static_cast<uint64_t>(L.nNodes) * static_cast<uint64_t>(L.perNode);
      break;
    case CollType::Reduce:
      slots = static_cast<uint64_t>(L.perNode);
      break;
    case CollType::Broadcast:
      slots = 1;
      break;
  }
  return chunkBytes / slots / elemSize / align * align;
}

// CTAs one hierarchical collective runs on: `hierCtas` (MKERNEL_HIER_CTAS, agreed by every rank)
// for collectives of at least `splitMinBytes` (MKERNEL_HIER_SPLIT_MIN_BYTES, agreed too) of
// `wholeBytes` (the largest of its buffers), else 1. CTAs beyond the count skip the collective, on
// every rank alike (their node barriers, net slots and proxy channels stay where they were).
// From the sweep on two H200s, 2 emulated nodes of 2 ranks over loopback TCP (docs/PERFORMANCE.md):
// 1 CTA was fastest to 256 KiB (4 KiB: 110 us against 130 with 2 and 148 with 3),
// 3 CTAs from 1 MiB (1 MiB 390 against 453; 4 MiB 1093 against 1363; 16 MiB 3541 against 4401,
// 2 CTAs 3475).
MKERNEL_HD inline int hierCtasFor(uint64_t wholeBytes, int hierCtas, uint64_t splitMinBytes) {
  return wholeBytes >= splitMinBytes ? hierCtas : 1;
}

// Whether an AllReduce whose largest buffer holds `wholeBytes` runs in CTA roles
// (MKERNEL_HIER_ROLES, "CTA roles" below): roles on (workers > 0) and the collective split like a
// large one (wholeBytes >= MKERNEL_HIER_SPLIT_MIN_BYTES). Smaller AllReduces, a chunk or a few
// long, have nothing for the roles to overlap; they stay data-parallel on lane 0's first CTA (the
// roles' handoffs cost them 10-60 us each in a sweep on one H200). The roles are
// off by default: in that sweep they gave nothing over three data-parallel lanes
// (docs/ALGORITHMS.md, "CTA roles").
MKERNEL_HD inline bool hierRolesFor(CollType coll, uint64_t wholeBytes, int workers,
                                    uint64_t splitMinBytes) {
  return workers > 0 && coll == CollType::AllReduce && wholeBytes >= splitMinBytes;
}

// Bytes of one slot of an inbox (the largest part of a chunk of chunkElems elements).
MKERNEL_HD inline uint64_t hierSlotBytes(const NodeLayout& L, uint64_t chunkElems,
                                         uint64_t elemSize) {
  return rankSlice(chunkElems, L.perNode, 0, sliceAlignElems(elemSize)).count * elemSize;
}

// What every function below starts from: the call's layout and buffers, and scratch for the
// pointer lists it hands to the executor.
struct HierCtx {
  int G, N, j, k;  // ranks per node, nodes, this rank's local index and node
  uint64_t esz;
  const char* send;
  char* recv;
  const char* srcs[kMaxRanks];
  char* dsts[kMaxRanks];
  MKERNEL_HD explicit HierCtx(const HierCall& c)
      : G(c.layout.perNode),
        N(c.layout.nNodes),
        j(c.local),
        k(c.node),
        esz(c.elemSize),
        send(reinterpret_cast<const char*>(c.send)),
        recv(reinterpret_cast<char*>(c.recv)) {}
};

// One round among the rail: what goes to and comes from each node (0 bytes: nothing).
struct HierRail {
  const char* src[kMaxHierNodes];
  char* dst[kMaxHierNodes];
  uint64_t sendBytes[kMaxHierNodes];
  uint64_t recvBytes[kMaxHierNodes];
  MKERNEL_HD void set(int m, const char* s, uint64_t sb, char* d, uint64_t rb) {
    src[m] = s;
    sendBytes[m] = sb;
    dst[m] = d;
    recvBytes[m] = rb;
  }
};

// Chunk `o` of this CTA's part: l elements at g (per-rank block), l * esz bytes.
struct HierChunk {
  uint64_t l, g, bytes;
  MKERNEL_HD HierChunk(const HierCall& c, uint64_t o)
      : l(c.part.count - o < c.chunkElems ? c.part.count - o : c.chunkElems),
        g(c.part.offset + o),
        bytes(l * c.elemSize) {}
};

// Every function below runs its collective for one CTA through executor ex, which provides:
//   char* in(int local, int parity), char* out(int local, int parity)
//                                               node-local regions, chunkBytes each
//   char* netSend(int slot)                     this rank's net send buffer (chunkBytes),
//   registered;
//                                               kHierNetSlots of them, and of the receive slots
//   char* netRecv(int slot, int node)           one chunkBytes receive slot per node, registered
//   void copy(char* const* dsts, int nDst, const char* src, uint64_t bytes)
//   void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems,
//               bool pre, bool post)         srcs in order; pre() on every input, post() on the
//               result
//   bool nodeBarrier()                          the node's ranks (this CTA index)
//   bool railPost(int round, int slot, const char* const* sendPtr, const uint64_t* sendBytes,
//                 char* const* recvPtr, const uint64_t* recvBytes)
//        posts the sends of sendPtr[m] to node m and the receives of recvPtr[m] from node m, for
//        every m with a non-zero size (tag: round), counted apart per slot; false on failure
//   bool railWait(int slot)                     until every transfer posted with that slot is
//        complete (false on a transport failure or timeout)
//        A rank's sends to m and m's receives from it are posted in the same order per round;
//        at most one round per slot is in flight, and the rounds in flight differ in tag.
//   void phaseMark(int mark)                    Phase times (below): a no-op unless the executor
//        times the AllReduce in turn
// Uniform control flow across the CTA's threads; false when a wait failed. Every collective
// alternates regions by *chunkSeq's parity (the argument of staged.h; AllReduce's two node
// barriers per chunk would let one region do within a collective, but not across collectives:
// the next collective's first push could reach a local rank still reading its inbox).

// The AllReduce's exchange among the rail (phase 2; MKERNEL_HIER_RAIL; ReduceScatter and
// AllGather run its reduce-scatter or all-gather half alone, over N uniform blocks of one chunk
// each: HierStepsBase::chain below). P, the rank's part j of
// the chunk, is cut into nNodes blocks t_m = rankSlice(|P|, nNodes, m); node m ends up owning t_m
// reduced over every node (reduce-scatter steps), then every node gets every t_m (all-gather
// steps). The same bytes cross the rail in all three forms, (N - 1) / N of |P| each way per node;
// they differ in how many steps a chunk takes and how many peers a step talks to:
//   direct  1 + 1 steps, each with every other node at once (the simplest form): step 0
//           sends t_m to node m and receives t_k from every other node into netRecv(par, m); the
//           reduction runs over nodes 0..N-1 in order; step 1 sends the reduced t_k to every other
//           node, which receives it into netRecv(par, k)
//   ring    (N - 1) + (N - 1) steps, each one send to node k + 1 and one receive from node k - 1
//           (NCCL's ring among the nodes): reduce-scatter step s sends block k - s - 1 and
//           receives block k - s - 2, which it reduces into P (the predecessor's partial first);
//           all-gather step s sends block k - s and receives block k - s - 1 into P (mod N)
//   rhd     log2 N + log2 N steps (N a power of two): recursive halving, step s with partner
//           k ^ (N >> (s + 1)): send the partner's half of the blocks this node still reduces,
//           receive the partner's share of its own half and reduce it into P (the lower node's
//           operand first); then recursive doubling, step s with partner k ^ (1 << s): send the
//           2^s blocks this node holds, receive the partner's into P
// Each step waits for the one before it (its send is what that step reduced or received). One
// step per slot is in flight, and a step carries its index as tag, so the steps of chunk i and
// chunk i + 1 in flight together (different slots) never share one: chunk i + 1's step 0 is posted
// while chunk i is in its all-gather steps (index >= 1). Ring and rhd change the reduction's order
// among the nodes (results equal up to floating-point order, as NCCL's algorithms differ; integers
// exact); every node still gets the bits its block's owner computed.
enum HierRailAlgo : int { kRailDirect = 0, kRailRing = 1, kRailRhd = 2 };

// Phase times (the overlap measure). In turn (MKERNEL_HIER_OVERLAP=0) a chunk's phases run
// one after another on its CTA, so marks between them time each: the node phases are chunk start
// to rail start (phase 1: the NVLink reduce-scatter, and step 0 posted) plus rail end to chunk end
// (phase 3: the NVLink all-gather and the copy out); the rail phase is rail start to rail end (the
// reduce-scatter steps waited for and reduced, the all-gather steps waited for). The kernel's
// executor sums them for CTA 0 (DeviceState::hierTurn; CollStats::hierTurn*); mkernel-collbench
// prints them per op, and scripts/overlap-table.py sets the pipelined time against them: the
// share of the shorter phase that the pipeline hides. Pipelined, the marks are not made (C(i)'s
// rail end is another chunk's middle).
enum HierPhaseMark : int {
  kPhaseChunkStart = 0,
  kPhaseRailStart = 1,
  kPhaseRailEnd = 2,
  kPhaseChunkEnd = 3
};

MKERNEL_HD inline int hierLog2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}
// Reduce-scatter steps of one chunk (as many all-gather steps follow); rhd needs N a power of two
// (the host falls back to ring otherwise: hierRailFor).
MKERNEL_HD inline int hierRailHalf(int rail, int nNodes) {
  return rail == kRailRing ? nNodes - 1 : rail == kRailRhd ? hierLog2(nNodes) : 1;
}
// MKERNEL_HIER_RAIL's names (host code: the communicator, the GPU tier, mkernel-model).
inline const char* hierRailName(int rail) {
  return rail == kRailRing ? "ring" : rail == kRailRhd ? "rhd" : "direct";
}
// The HierRailAlgo named `name` (empty: direct); -1 for an unknown name.
inline int hierRailByName(const std::string& name) {
  for (int r : {kRailDirect, kRailRing, kRailRhd})
    if (name == hierRailName(r)) return r;
  return name.empty() ? kRailDirect : -1;
}
// The rail algorithm a communicator of nNodes nodes runs for MKERNEL_HIER_RAIL = `asked`: rhd on a
// node count that is not a power of two runs ring.
MKERNEL_HD inline int hierRailFor(int asked, int nNodes) {
  return asked == kRailRhd && (nNodes & (nNodes - 1)) != 0 ? kRailRing : asked;
}

// Blocks first .. first + n - 1 of a part of `count` elements cut into N (rankSlice), or, with
// `block` > 0, of N blocks of `block` elements each (ReduceScatter and AllGather: one chunk per
// node): one contiguous range.
MKERNEL_HD inline Slice hierBlocks(uint64_t count, int N, int first, int n, uint64_t align,
                                   uint64_t block = 0) {
  Slice s;
  if (block > 0) {
    s.offset = static_cast<uint64_t>(first) * block;
    s.count = static_cast<uint64_t>(n) * block;
    return s;
  }
  const Slice a = rankSlice(count, N, first, align), b = rankSlice(count, N, first + n - 1, align);
  s.offset = a.offset;
  s.count = b.offset + b.count - a.offset;
  return s;
}

// One step of the ring or rhd exchange for node k: one send (elements `send` of P to node `to`)
// and one receive (elements `recv` from node `from`); a reduce-scatter step receives into
// netRecv(par, from) and reduces that into P at `recv` (lowFirst: the received operand first),
// an all-gather step receives straight into P at `recv`.
struct HierRailStep {
  int to, from;
  Slice send, recv;
  bool reduce, lowFirst, last;  // last: the final reduce-scatter step (post() applied)
};

MKERNEL_HD inline HierRailStep hierRailStep(int rail, int N, int k, int st, uint64_t count,
                                            uint64_t align, uint64_t block = 0) {
  HierRailStep r;
  const int half = hierRailHalf(rail, N);
  r.reduce = st < half;
  r.last = st == half - 1;
  const int s = r.reduce ? st : st - half;
  if (rail == kRailRing) {
    r.to = (k + 1) % N;
    r.from = (k + N - 1) % N;
    r.lowFirst = true;
    const int sb = r.reduce ? k - s - 1 : k - s;  // the block sent; the one received precedes it
    r.send = hierBlocks(count, N, ((sb % N) + N) % N, 1, align, block);
    r.recv = hierBlocks(count, N, (((sb - 1) % N) + N) % N, 1, align, block);
    return r;
  }
  const int h = r.reduce ? N >> (s + 1) : 1 << s;
  const int p = k ^ h;
  r.to = r.from = p;
  r.lowFirst = p < k;
  if (r.reduce) {  // keep the half of this node's group that holds k, send the partner's half
    r.send = hierBlocks(count, N, p & ~(h - 1), h, align, block);
    r.recv = hierBlocks(count, N, k & ~(h - 1), h, align, block);
  } else {  // send the h blocks held, receive the partner's h
    r.send = hierBlocks(count, N, k & ~(h - 1), h, align, block);
    r.recv = hierBlocks(count, N, p & ~(h - 1), h, align, block);
  }
  return r;
}

// The pipelined AllReduce (c.overlap): the phases of chunk i as three steps, on regions of parity
// par = i & 1 and on the net buffers of slot i % 3 (kHierNetSlots; i counts the CTA's chunks).
//   A(i)   intra reduce-scatter into netSend(slot) (one node barrier), then rail step 0 posted
//   B(i)   the rail's reduce-scatter steps, each waited for and reduced, the next one posted; it
//          returns with the first all-gather step in flight
//   C(i)   the rail's all-gather steps waited for (each posting the next), intra all-gather (one
//          node barrier), copy into recvbuff
// One chunk ahead (MKERNEL_HIER_AHEAD=1; ring and rhd, below), in the order A(0); then for each
// i: B(i), A(i + 1), C(i). So the all-gather of chunk i travels while this CTA works on phase 1
// of chunk i + 1, and step 0 of chunk i + 1 while it works on the rest of chunk i. Every rank
// makes the same node barriers in the same order. Regions alternate by parity (unlike a
// sequential form): a rank writes in(q, par) for chunk i + 2 after the first barrier of chunk
// i + 1, which q reaches after its reduction of chunk i, and out(q, par) for chunk i + 2 after the
// second barrier of chunk i + 1, which q reaches after copying chunk i out; net slot i % 3 is
// reused by chunk i + 3 once C(i) has waited for its last step. In turn (MKERNEL_HIER_OVERLAP=0)
// the same steps run A(i), B(i), C(i).
//
// Two chunks ahead (MKERNEL_HIER_AHEAD=2, the direct rail): A(0), A(1); then for each i: B(i),
// A(i + 2), C(i). One ahead, nothing travels while B(i) reduces (step 0 of chunk i has landed,
// step 1 of chunk i - 1 was waited for in C(i - 1)), so the rail idles for the rail reduction of
// every chunk; two ahead, step 0 of chunk i + 1 travels through it, and the CTA's posts run two
// chunks before its waits. The node barriers come in the order A(0), A(1), then A(i + 2), C(i)
// for each i, the same on every rank. The regions still alternate by parity: a rank writes its
// slot of in(q, par) for chunk i + 2 after the first barrier of chunk i + 1, which q reaches
// after reducing chunk i's inbox in A(i) (slot j of in(j, par), which hierArKeepOwn reads again
// in B(i), only rank j writes, after its B(i)); it writes out(q, par) for chunk i + 2 in B(i + 2)
// and C(i + 2), after the second barrier of chunk i + 1, which q reaches after copying chunk i
// out. Net slot i % 3 is next used by A(i + 3), after C(i) waited for its last step and copied
// from it. Three rounds are then in flight at most (step 1 of chunk i, step 0 of chunks i + 1 and
// i + 2); the direct rounds carry tag 2 * slot + step, so no two of them share one.
//
// Woven (ring and rhd, pipelined). B(i) is a chain of N - 1 (or log2 N) steps, each a proxy round
// trip that the CTA can only wait for; in the plain order the CTA idles through all but one of
// them, and one lane of ring ran 1.5x the direct form's time at 64 MiB (docs/PERFORMANCE.md).
// Woven, C(i) follows each of chunk i's all-gather steps with one reduce-scatter
// step of chunk i + 1, whose step 0 A(i + 1) posted: A(0), B(0), then for each i: A(i + 1),
// C(i) with B(i + 1) inside it. Two chains are then in flight, one per net slot, and the node
// barriers come in the same order as before (A(i + 1) before C(i)), so the region argument above
// holds. Every rank posts in the same fixed order (no step is taken early because it happened to
// complete), so the sends and receives between two ranks stay in step; chunk i's steps carry tags
// half..2 half - 1 and chunk i + 1's 0..half - 1, so the two never share a tag. B(i + 1) ends
// with its first all-gather step posted, as in the plain order.
struct HierArChunk {
  HierChunk ch;
  Slice mine, tk;
  int par;   // node regions
  int slot;  // net buffers (the data-parallel form; CTA roles pick their own)
  MKERNEL_HD HierArChunk(const HierCall& c, const HierCtx& x, uint64_t i, uint64_t seq)
      : ch(c, i * c.chunkElems),
        mine(rankSlice(ch.l, x.G, x.j, sliceAlignElems(x.esz))),
        tk(rankSlice(mine.count, x.N, x.k, sliceAlignElems(x.esz))),
        par(static_cast<int>(seq & 1)),
        slot(static_cast<int>(seq % kHierNetSlots)) {}
};
// The tag of the data-parallel form's rail step st of chunk a: direct, 2 * slot + st (up to three
// rounds in flight, two ahead); ring and rhd, st (two chains in flight, hierArPhase3's `next`).
MKERNEL_HD inline int hierArTag(const HierCall& c, const HierArChunk& a, int st) {
  return c.rail == kRailDirect ? 2 * a.slot + st : st;
}

// Direct rail, data-parallel form (MKERNEL_HIER_KEEP_OWN): t_k, the piece of part j
// that this rank reduces over the nodes, never leaves the rank, so it need not pass through P
// (netSend: host-mapped unless GPUDirect). Phase 1 reduces it in place into this rank's own slot
// of its inbox, in(j, par) slot j; the rail's reduction reads it there and writes the result at
// once to P (for the all-gather step) and to every local rank's out(q, par) at its place; phase 3
// then copies only the pieces that came from the other nodes. Per chunk that takes two reads and
// one write of t_k off the net buffers (with N = 2 nodes, half of the reads), at the cost of
// phase 1's reduction in up to three pieces. By the region argument above: in(j, par) of chunk i
// is next written for chunk i + 2, after every rank passed the node barrier of A(i + 1), which
// this rank reaches after B(i); and out(q, par) of chunk i, written in B(i) after C(i - 1), whose
// second barrier q passes after copying chunk i - 2 out, is read by q after the second barrier of
// C(i), as the pieces phase 3 writes. CTA roles keep the older form (their reducers and workers
// meet through P). The rail's reduction writes G + 1 destinations, so G < kMaxRanks (a
// communicator of kMaxRanks ranks on one node is not hierarchical anyway).
MKERNEL_HD inline bool hierArKeepOwn(const HierCall& c) {
  return c.keepOwn && c.rail == kRailDirect && c.role == 0 /* kHierRoleNone */ &&
         c.layout.perNode < kMaxRanks;
}

// Ring / rhd step st on net slot `par` (P = netSend(par), a part of `count` elements, or N
// uniform blocks of `block`), posted with `tag`; and, once waited for, its reduction (reduce-
// scatter steps: what came into netRecv(par, from) reduced into P, post() on the last).
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierRailStepPost(Ex& ex, HierCtx& x, HierRail& rail, int algo, int st, int tag,
                                 int par, uint64_t count, uint64_t block) {
  const uint64_t esz = x.esz;
  char* P = ex.netSend(par);
  const HierRailStep r = hierRailStep(algo, x.N, x.k, st, count, sliceAlignElems(esz), block);
  for (int m = 0; m < x.N; ++m) rail.set(m, P, 0, P, 0);
  rail.src[r.to] = P + r.send.offset * esz;
  rail.sendBytes[r.to] = r.send.count * esz;
  rail.dst[r.from] = r.reduce ? ex.netRecv(par, r.from) : P + r.recv.offset * esz;
  rail.recvBytes[r.from] = r.recv.count * esz;
  return ex.railPost(tag, par, rail.src, rail.sendBytes, rail.dst, rail.recvBytes);
}

// Piece `piece` of `pieces` (CTA roles: reducer r of R; else 0 of 1) of that reduction.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD void hierRailStepReduce(Ex& ex, HierCtx& x, int algo, int st, int par, uint64_t count,
                                   uint64_t block, int piece = 0, int pieces = 1) {
  const uint64_t esz = x.esz, align = sliceAlignElems(esz);
  const HierRailStep r = hierRailStep(algo, x.N, x.k, st, count, align, block);
  if (!r.reduce) return;
  const Slice sub = rankSlice(r.recv.count, pieces, piece, align);
  x.dsts[0] = ex.netSend(par) + (r.recv.offset + sub.offset) * esz;
  x.srcs[r.lowFirst ? 0 : 1] = ex.netRecv(par, r.from) + sub.offset * esz;
  x.srcs[r.lowFirst ? 1 : 0] = x.dsts[0];
  ex.reduce(x.dsts, 1, x.srcs, 2, sub.count, false, r.last);
}

// Rail step st of chunk a posted on net slot `slot` with `tag` (the data-parallel form: a.slot and
// hierArTag; CTA roles: the lane's slot, and 2 * st + slot).
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierArRailPost(Ex& ex, const HierCall& c, HierCtx& x, HierRail& rail,
                               const HierArChunk& a, int st, int slot, int tag) {
  const uint64_t esz = x.esz, align = sliceAlignElems(esz);
  char* P = ex.netSend(slot);
  if (c.rail == kRailDirect) {
    for (int m = 0; m < x.N; ++m) {
      const Slice t = rankSlice(a.mine.count, x.N, m, align);
      const uint64_t other = m == x.k ? 0 : 1;
      if (st == 0)
        rail.set(m, P + t.offset * esz, other * t.count * esz, ex.netRecv(slot, m),
                 other * a.tk.count * esz);
      else
        rail.set(m, P + a.tk.offset * esz, other * a.tk.count * esz, ex.netRecv(slot, m),
                 other * t.count * esz);
    }
    return ex.railPost(tag, slot, rail.src, rail.sendBytes, rail.dst, rail.recvBytes);
  }
  return hierRailStepPost(ex, x, rail, c.rail, st, tag, slot, a.mine.count, 0);
}

// The reduce-scatter step st of chunk a (landed on net slot `slot`) reduced into P: direct, t_k
// over the nodes 0..N-1 in order (post() applied); ring and rhd, hierRailStepReduce. Piece `piece`
// of `pieces` of it (CTA roles: reducer r of R).
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD void hierArRailReduce(Ex& ex, const HierCall& c, HierCtx& x, const HierArChunk& a,
                                 int st, int slot, int piece = 0, int pieces = 1) {
  const uint64_t esz = x.esz;
  if (c.rail != kRailDirect) {
    hierRailStepReduce(ex, x, c.rail, st, slot, a.mine.count, 0, piece, pieces);
    return;
  }
  const Slice sub = rankSlice(a.tk.count, pieces, piece, sliceAlignElems(esz));
  char* P = ex.netSend(slot);
  char* mineP = P + (a.tk.offset + sub.offset) * esz;
  if (hierArKeepOwn(c)) {
    // t_k from slot j of in(j, par) (phase 1 left it there), the result to every local out(q, par)
    // and to P in one pass.
    const uint64_t at = (a.mine.offset + a.tk.offset + sub.offset) * esz;
    char* own = ex.in(x.j, a.par) +
                static_cast<uint64_t>(x.j) * hierSlotBytes(c.layout, c.chunkElems, esz) +
                (a.tk.offset + sub.offset) * esz;
    for (int m = 0; m < x.N; ++m)
      x.srcs[m] = m == x.k ? own : ex.netRecv(slot, m) + sub.offset * esz;
    for (int q = 0; q < x.G; ++q) x.dsts[q] = ex.out(q, a.par) + at;
    x.dsts[x.G] = mineP;
    ex.reduce(x.dsts, x.G + 1, x.srcs, x.N, sub.count, false, true);
    return;
  }
  for (int m = 0; m < x.N; ++m)
    x.srcs[m] = m == x.k ? mineP : ex.netRecv(slot, m) + sub.offset * esz;
  x.dsts[0] = mineP;
  ex.reduce(x.dsts, 1, x.srcs, x.N, sub.count, false, true);
}

// Rail step st of chunk a waited for, and (reduce-scatter steps) what it received reduced into P.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierArRailLand(Ex& ex, const HierCall& c, HierCtx& x, const HierArChunk& a,
                               int st) {
  if (!ex.railWait(a.slot)) return false;
  if (st < hierRailHalf(c.rail, x.N)) hierArRailReduce(ex, c, x, a, st, a.slot);
  return true;
}

MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierArPhase1(Ex& ex, const HierCall& c, HierCtx& x, HierRail& rail,
                             const HierArChunk& a) {
  const uint64_t esz = x.esz, align = sliceAlignElems(esz);
  const uint64_t slotBytes = hierSlotBytes(c.layout, c.chunkElems, esz);
  for (int q = 0; q < x.G; ++q) {
    const Slice s = rankSlice(a.ch.l, x.G, q, align);
    x.dsts[0] = ex.in(q, a.par) + static_cast<uint64_t>(x.j) * slotBytes;
    ex.copy(x.dsts, 1, x.send + (a.ch.g + s.offset) * esz, s.count * esz);
  }
  if (!ex.nodeBarrier()) return false;
  char* P = ex.netSend(a.slot);
  // Part j reduced over the node: [0, lo) and [hi, mine) into P, t_k = [lo, hi) into P as well, or
  // (hierArKeepOwn) in place into slot j of in(j, par).
  const bool keep = hierArKeepOwn(c);
  const uint64_t lo = keep ? a.tk.offset : a.mine.count,
                 hi = keep ? a.tk.offset + a.tk.count : a.mine.count;
  const uint64_t cut[4] = {0, lo, hi, a.mine.count};
  for (int r = 0; r < 3; ++r) {
    const uint64_t b = cut[r], e = cut[r + 1];
    if (b >= e) continue;
    for (int q = 0; q < x.G; ++q)
      x.srcs[q] = ex.in(x.j, a.par) + static_cast<uint64_t>(q) * slotBytes + b * esz;
    x.dsts[0] =
        r == 1 ? ex.in(x.j, a.par) + static_cast<uint64_t>(x.j) * slotBytes + b * esz : P + b * esz;
    ex.reduce(x.dsts, 1, x.srcs, x.G, e - b, true, false);
  }
  return hierArRailPost(ex, c, x, rail, a, 0, a.slot, hierArTag(c, a, 0));
}

// B(i): the rail's reduce-scatter steps; the first all-gather step posted.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierArRound1(Ex& ex, const HierCall& c, HierCtx& x, HierRail& rail,
                             const HierArChunk& a) {
  const int half = hierRailHalf(c.rail, x.N);
  for (int st = 0; st < half; ++st)
    if (!hierArRailLand(ex, c, x, a, st) ||
        !hierArRailPost(ex, c, x, rail, a, st + 1, a.slot, hierArTag(c, a, st + 1)))
      return false;
  return true;
}

// C(i): the rail's all-gather steps of chunk a, then phase 3. With `next` (the woven pipeline
// below), each all-gather step of a is followed by reduce-scatter step st - half of the next chunk,
// so that B(next) is done by the time C(a) is.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierArPhase3(Ex& ex, const HierCall& c, HierCtx& x, HierRail& rail,
                             const HierArChunk& a, const HierArChunk* next = nullptr) {
  const uint64_t esz = x.esz, align = sliceAlignElems(esz);
  const int half = hierRailHalf(c.rail, x.N);
  for (int st = half; st < 2 * half; ++st) {
    if (!hierArRailLand(ex, c, x, a, st) ||
        (st + 1 < 2 * half &&
         !hierArRailPost(ex, c, x, rail, a, st + 1, a.slot, hierArTag(c, a, st + 1))))
      return false;
    if (next != nullptr && (!hierArRailLand(ex, c, x, *next, st - half) ||
                            !hierArRailPost(ex, c, x, rail, *next, st - half + 1, next->slot,
                                            hierArTag(c, *next, st - half + 1))))
      return false;
  }
  ex.phaseMark(kPhaseRailEnd);
  char* P = ex.netSend(a.slot);
  if (c.rail == kRailDirect) {
    const bool keep = hierArKeepOwn(c);  // t_k is in every out(q, par) already
    for (int m = 0; m < x.N; ++m) {
      if (keep && m == x.k) continue;
      const Slice t = rankSlice(a.mine.count, x.N, m, align);
      for (int q = 0; q < x.G; ++q) x.dsts[q] = ex.out(q, a.par) + (a.mine.offset + t.offset) * esz;
      ex.copy(x.dsts, x.G, m == x.k ? P + a.tk.offset * esz : ex.netRecv(a.slot, m), t.count * esz);
    }
  } else {  // the all-gather steps left the whole part in P
    for (int q = 0; q < x.G; ++q) x.dsts[q] = ex.out(q, a.par) + a.mine.offset * esz;
    ex.copy(x.dsts, x.G, P, a.mine.count * esz);
  }
  if (!ex.nodeBarrier()) return false;
  x.dsts[0] = x.recv + a.ch.g * esz;
  ex.copy(x.dsts, 1, ex.out(x.j, a.par), a.ch.bytes);
  return true;
}

MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD MK_HIER_NOINLINE bool hierAllReduce(Ex& ex, const HierCall& c, uint64_t* chunkSeq) {
  if (c.part.count == 0) return true;
  HierCtx x(c);
  HierRail rail;
  const uint64_t chunks = (c.part.count + c.chunkElems - 1) / c.chunkElems;
  const uint64_t seq0 = *chunkSeq;
  *chunkSeq += chunks;
  if (!c.overlap) {
    for (uint64_t i = 0; i < chunks; ++i) {
      const HierArChunk a(c, x, i, seq0 + i);
      ex.phaseMark(kPhaseChunkStart);
      if (!hierArPhase1(ex, c, x, rail, a)) return false;
      ex.phaseMark(kPhaseRailStart);
      if (!hierArRound1(ex, c, x, rail, a) || !hierArPhase3(ex, c, x, rail, a)) return false;
      ex.phaseMark(kPhaseChunkEnd);
    }
    return true;
  }
  // Ring and rhd weave two chunks' chains of steps (hierArPhase3's `next`); direct has one step
  // each way, and runs one or two chunks ahead (c.ahead).
  const bool weave = c.rail != kRailDirect;
  if (!weave && c.ahead >= 2) {
    for (uint64_t i = 0; i < chunks && i < 2; ++i)
      if (!hierArPhase1(ex, c, x, rail, HierArChunk(c, x, i, seq0 + i))) return false;
    for (uint64_t i = 0; i < chunks; ++i) {
      const HierArChunk a(c, x, i, seq0 + i);
      if (!hierArRound1(ex, c, x, rail, a)) return false;
      if (i + 2 < chunks && !hierArPhase1(ex, c, x, rail, HierArChunk(c, x, i + 2, seq0 + i + 2)))
        return false;
      if (!hierArPhase3(ex, c, x, rail, a)) return false;
    }
    return true;
  }
  if (!hierArPhase1(ex, c, x, rail, HierArChunk(c, x, 0, seq0))) return false;
  for (uint64_t i = 0; i < chunks; ++i) {
    const HierArChunk a(c, x, i, seq0 + i);
    if ((!weave || i == 0) && !hierArRound1(ex, c, x, rail, a)) return false;
    const bool more = i + 1 < chunks;
    const HierArChunk next(c, x, more ? i + 1 : i, seq0 + (more ? i + 1 : i));
    if (more && !hierArPhase1(ex, c, x, rail, next)) return false;
    if (!hierArPhase3(ex, c, x, rail, a, weave && more ? &next : nullptr)) return false;
  }
  return true;
}

// The other four collectives have one rail round per chunk, and run as two steps per chunk:
//   A(i)  the work before the round (node-local phase, net send buffer), and the round posted
//   B(i)  the round waited for, and the work after it
// sequentially A(i), B(i), or pipelined (c.overlap) A(0), then A(i + 1), B(i) for each i: the
// round of chunk i travels while the CTA works on chunk i + 1. Chunk i uses regions of parity
// par(i) and net slot par(i), and its round the tag par(i), so the two rounds in flight never
// share a tag. A region is written again two chunks later: for the region read after a barrier
// of A (ReduceScatter, Reduce: inboxes) the writer of chunk i + 2 has passed the barrier of
// A(i + 1), which every reader reaches after reading chunk i; for the region read after the
// barrier of B (AllGather, Broadcast: out regions) the writer of chunk i + 2 has passed the
// barrier of B(i + 1), which every reader reaches after copying chunk i out. Net slot par(i) is
// refilled by A(i + 2), after B(i) waited for its round.
//
// The own piece (MKERNEL_HIER_KEEP_OWN, direct rail; HierStepsBase::keepOwn): a piece that a rank
// would write into P and read back from it without sending it, or read from P where its own
// buffer holds the same bytes, stays in device memory.
//   ReduceScatter  part k (this node's, reduced over the nodes by this rank) is reduced in place
//                  into this rank's own slot k * perNode + j of its inbox, and B reads it there
//   Reduce         the root's partial, in place into its own slot jr of its inbox
//   AllGather      B pushes block (k, j) from sendbuff instead of P
//   Broadcast      the root's B pushes from sendbuff instead of P
// Per chunk that takes two of ReduceScatter's 2 N block moves through P (with 2 nodes, half), one
// of AllGather's N + 1, two of the Reduce root's, one of the Broadcast root's. B(i) now reads an
// inbox after the barrier of A(i + 1), past the argument above; but the slot it reads only this
// rank writes (every rank pushes into slot m * perNode + its own index), and it next writes it in
// A(i + 2), after its B(i). For that the slots keep their bytes from chunk to chunk
// (HierStep::stride, a whole chunk's, also for the last and shorter one). sendbuff is not written
// by the collective (in place, the bytes written over it are those read).
struct HierStep {
  HierChunk ch;
  uint64_t slot;    // bytes of one rank's slot in a region (the chunk's bytes)
  uint64_t stride;  // bytes from one slot of a node region to the next: a whole chunk's, so that a
                    // slot stays at the same bytes for the collective's last, shorter chunk (the
                    // own slot's argument above)
  int par;
  MKERNEL_HD HierStep(const HierCall& c, uint64_t i, uint64_t seq)
      : ch(c, i * c.chunkElems),
        slot(ch.bytes),
        stride(c.chunkElems * c.elemSize),
        par(static_cast<int>(seq & 1)) {}
};

MK_HIER_TEMPLATE
template <class Ex, class Steps>
MKERNEL_HD bool hierTwoStep(Ex& ex, const HierCall& c, uint64_t* chunkSeq, Steps& st) {
  if (c.part.count == 0) return true;
  const uint64_t chunks = (c.part.count + c.chunkElems - 1) / c.chunkElems;
  const uint64_t seq0 = *chunkSeq;
  *chunkSeq += chunks;
  if (!c.overlap) {
    for (uint64_t i = 0; i < chunks; ++i) {
      const HierStep k(c, i, seq0 + i);
      if (!st.a(ex, k) || !st.b(ex, k)) return false;
    }
    return true;
  }
  if (!st.a(ex, HierStep(c, 0, seq0))) return false;
  for (uint64_t i = 0; i < chunks; ++i) {
    if (i + 1 < chunks && !st.a(ex, HierStep(c, i + 1, seq0 + i + 1))) return false;
    if (!st.b(ex, HierStep(c, i, seq0 + i))) return false;
  }
  return true;
}

// Broadcast and Reduce with MKERNEL_HIER_RAIL=ring or rhd: a binomial tree among the rail's
// nodes rooted at the root's node kr, ceil(log2 N) steps for any N (v = (k - kr) mod N):
//   Broadcast  step s: every node with v < 2^s sends the chunk to v + 2^s (if < N), which
//              receives it into its net send buffer and forwards it in later steps
//   Reduce     step s: every node whose low s + 1 bits of v are 2^s sends its partial to
//              v - 2^s; every node whose low s + 1 bits are 0 receives v + 2^s's partial (if
//              < N) and reduces it into its own (its own first); the root's last step applies
//              post()
// The root's NIC then carries log2 N copies instead of N - 1. A ring's chain would need as many
// chunks in flight as nodes to pipeline, and the two-step pipeline keeps two chunks in flight (net
// slots by parity), so both forms run this tree for these two collectives.
struct HierTreeStep {
  int to = -1, from = -1;  // -1: none this step
};
MKERNEL_HD inline HierTreeStep hierTreeStep(bool reduce, int N, int k, int kr, int s) {
  const int v = (k - kr + N) % N, bit = 1 << s;
  HierTreeStep t;
  if (!reduce) {
    if (v < bit && v + bit < N)
      t.to = (k + bit) % N;
    else if (v >= bit && v < 2 * bit)
      t.from = (k - bit + N) % N;
  } else {
    const int low = v & (2 * bit - 1);
    if (low == bit)
      t.to = (k - bit + N) % N;
    else if (low == 0 && v + bit < N)
      t.from = (k + bit) % N;
  }
  return t;
}

// What every two-step collective below keeps: the call, its context, the rail round being built,
// and (Broadcast, Reduce) the root's node and local index.
struct HierStepsBase {
  const HierCall& c;
  HierCtx x;
  HierRail rail;
  int kr, jr;
  MKERNEL_HD explicit HierStepsBase(const HierCall& call)
      : c(call), x(call), kr(call.layout.nodeOf(call.root)), jr(call.layout.localOf(call.root)) {}
  // The round built in `rail`, posted on the chunk's net slot with the chunk's parity as its tag.
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool post(Ex& ex, const HierStep& k) {
    return ex.railPost(k.par, k.par, rail.src, rail.sendBytes, rail.dst, rail.recvBytes);
  }
  // Slot m * perNode + idx of a node region (one chunk slot each: ReduceScatter, AllGather).
  MKERNEL_HD char* slotOf(char* region, int m, int idx, const HierStep& k) const {
    return region + static_cast<uint64_t>(m * x.G + idx) * k.stride;
  }
  // Byte offset of this chunk within rank (m, q)'s block of a buffer of nRanks blocks.
  MKERNEL_HD uint64_t blockOff(int m, int q, const HierStep& k) const {
    return (static_cast<uint64_t>(c.layout.rankOf(m, q)) * c.count + k.ch.g) * x.esz;
  }
  // Ring / rhd (MKERNEL_HIER_RAIL; ReduceScatter and AllGather): the chunk's N blocks of k.ch.l
  // elements in P, steps first .. last - 1 of hierRailStep's schedule, tagged 2 * step + parity
  // (chunk i + 1's first step is posted while chunk i's chain runs). post: step `first`;
  // chain: each step waited for (and reduced), the next posted, the last waited for.
  MKERNEL_HD bool chained() const { return c.rail != kRailDirect; }
  // The own piece stays in device memory (above HierStep; the direct rail only).
  MKERNEL_HD bool keepOwn() const { return c.keepOwn && !chained(); }
  // This rank's own slot of its inbox for node m's part: slot m * perNode + j (ReduceScatter).
  MKERNEL_HD char* ownSlot(char* inbox, int m, const HierStep& k) const {
    return slotOf(inbox, m, x.j, k);
  }
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool postStep(Ex& ex, const HierStep& k, int st) {
    return hierRailStepPost(ex, x, rail, c.rail, st, 2 * st + k.par, k.par,
                            static_cast<uint64_t>(x.N) * k.ch.l, k.ch.l);
  }
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool chain(Ex& ex, const HierStep& k, int first, int last) {
    for (int st = first; st < last; ++st) {
      if (!ex.railWait(k.par)) return false;
      hierRailStepReduce(ex, x, c.rail, st, k.par, static_cast<uint64_t>(x.N) * k.ch.l, k.ch.l);
      if (st + 1 < last && !postStep(ex, k, st + 1)) return false;
    }
    return true;
  }
  // Broadcast / Reduce tree step st (hierTreeStep) posted: the chunk (k.ch.bytes) from P to the
  // child or parent; received into P (Broadcast) or netRecv(par, from) (Reduce).
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool postTree(Ex& ex, const HierStep& k, int st, bool reduce) {
    char* P = ex.netSend(k.par);
    const HierTreeStep t = hierTreeStep(reduce, x.N, x.k, kr, st);
    for (int m = 0; m < x.N; ++m) rail.set(m, P, 0, P, 0);
    if (t.to >= 0) rail.sendBytes[t.to] = k.ch.bytes;
    if (t.from >= 0) {
      rail.dst[t.from] = reduce ? ex.netRecv(k.par, t.from) : P;
      rail.recvBytes[t.from] = k.ch.bytes;
    }
    return ex.railPost(2 * st + k.par, k.par, rail.src, rail.sendBytes, rail.dst, rail.recvBytes);
  }
  // A round that exchanges one slot with every other node: to node m from P + m * stride, from
  // node m into its receive slot.
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD void withEveryOtherNode(Ex& ex, const HierStep& k, char* P, uint64_t stride) {
    for (int m = 0; m < x.N; ++m) {
      const uint64_t bytes = m == x.k ? 0 : k.slot;
      rail.set(m, P + static_cast<uint64_t>(m) * stride, bytes, ex.netRecv(k.par, m), bytes);
    }
  }
};

// ReduceScatter and AllGather with MKERNEL_HIER_RAIL=ring or rhd: the round below becomes the
// reduce-scatter (ReduceScatter) or all-gather (AllGather) steps of the AllReduce's schedule,
// over N blocks of the chunk in P (block m: node m's), A posting the first and B running the
// chain; B(i)'s chain runs while chunk i + 1's first step, which A(i + 1) posted, travels.
//
// ReduceScatter (count = elements per rank block; sendbuff holds nNodes x perNode blocks):
//   A  intra: push the chunk of block (m, q), for every node m, into slot m*perNode + j of local
//      rank q's inbox; node barrier; for every node m, reduce slots m*perNode + 0..perNode-1
//      (pre()) into part m of the net send buffer; post: part m to node m, part k from every
//      other node
//   B  reduce part k over the nodes 0..nNodes-1 (post()) into recvbuff
struct HierReduceScatterSteps : HierStepsBase {
  MKERNEL_HD explicit HierReduceScatterSteps(const HierCall& call) : HierStepsBase(call) {}
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool a(Ex& ex, const HierStep& k) {
    for (int m = 0; m < x.N; ++m)
      for (int q = 0; q < x.G; ++q) {
        x.dsts[0] = slotOf(ex.in(q, k.par), m, x.j, k);
        ex.copy(x.dsts, 1, x.send + blockOff(m, q, k), k.slot);
      }
    if (!ex.nodeBarrier()) return false;
    char* P = ex.netSend(k.par);
    for (int m = 0; m < x.N; ++m) {
      for (int q = 0; q < x.G; ++q) x.srcs[q] = slotOf(ex.in(x.j, k.par), m, q, k);
      // keepOwn: part k, which is never sent, in place into this rank's own slot of its inbox.
      x.dsts[0] = keepOwn() && m == x.k ? ownSlot(ex.in(x.j, k.par), m, k)
                                        : P + static_cast<uint64_t>(m) * k.slot;
      ex.reduce(x.dsts, 1, x.srcs, x.G, k.ch.l, true, false);
    }
    if (chained()) return postStep(ex, k, 0);
    withEveryOtherNode(ex, k, P, k.slot);
    return post(ex, k);
  }
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool b(Ex& ex, const HierStep& k) {
    char* P = ex.netSend(k.par);
    if (chained()) {  // the reduce-scatter steps leave part k reduced over the nodes (post()) in P
      if (!chain(ex, k, 0, hierRailHalf(c.rail, x.N))) return false;
      x.dsts[0] = x.recv + k.ch.g * x.esz;
      ex.copy(x.dsts, 1, P + static_cast<uint64_t>(x.k) * k.slot, k.slot);
      return true;
    }
    if (!ex.railWait(k.par)) return false;
    const char* own =
        keepOwn() ? ownSlot(ex.in(x.j, k.par), x.k, k) : P + static_cast<uint64_t>(x.k) * k.slot;
    for (int m = 0; m < x.N; ++m) x.srcs[m] = m == x.k ? own : ex.netRecv(k.par, m);
    x.dsts[0] = x.recv + k.ch.g * x.esz;
    ex.reduce(x.dsts, 1, x.srcs, x.N, k.ch.l, false, true);
    return true;
  }
};

// AllGather (count = elements per rank block; recvbuff holds nNodes x perNode blocks):
//   A  copy the chunk into the net send buffer; post: it to every other node (its rank of this
//      rail), block (m, j)'s chunk from every other node m
//   B  intra: push block (m, j)'s chunk, for every node m, into slot m*perNode + j of every local
//      rank's out region; node barrier; copy slot m*perNode + q into block (m, q)
struct HierAllGatherSteps : HierStepsBase {
  MKERNEL_HD explicit HierAllGatherSteps(const HierCall& call) : HierStepsBase(call) {}
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool a(Ex& ex, const HierStep& k) {
    char* P = ex.netSend(k.par);
    x.dsts[0] =
        chained() ? P + static_cast<uint64_t>(x.k) * k.slot : P;  // ring / rhd: block k of P
    ex.copy(x.dsts, 1, x.send + k.ch.g * x.esz, k.slot);
    if (chained()) return postStep(ex, k, hierRailHalf(c.rail, x.N));  // the all-gather steps
    withEveryOtherNode(ex, k, P, 0);
    return post(ex, k);
  }
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool b(Ex& ex, const HierStep& k) {
    const int half = hierRailHalf(c.rail, x.N);
    if (chained() ? !chain(ex, k, half, 2 * half) : !ex.railWait(k.par)) return false;
    char* P = ex.netSend(k.par);
    const char* own =
        keepOwn() ? x.send + k.ch.g * x.esz : P;  // block (k, j): sendbuff holds it too
    for (int m = 0; m < x.N; ++m) {
      for (int q = 0; q < x.G; ++q) x.dsts[q] = slotOf(ex.out(q, k.par), m, x.j, k);
      ex.copy(x.dsts, x.G,
              chained()  ? P + static_cast<uint64_t>(m) * k.slot
              : m == x.k ? own
                         : ex.netRecv(k.par, m),
              k.slot);
    }
    if (!ex.nodeBarrier()) return false;
    for (int m = 0; m < x.N; ++m)
      for (int q = 0; q < x.G; ++q) {
        x.dsts[0] = x.recv + blockOff(m, q, k);
        ex.copy(x.dsts, 1, slotOf(ex.out(x.j, k.par), m, q, k), k.slot);
      }
    return true;
  }
};

// Broadcast from root (kr, jr) (with MKERNEL_HIER_RAIL=ring or rhd the rail round is the
// binomial tree of hierTreeStep, received into the net send buffer and forwarded from it):
//   A  rail jr: the root copies its chunk into the net send buffer; post: the root sends it to
//      (m, jr) for every other node m, which receives it into its slot kr (other rails: nothing)
//   B  rail jr: push the chunk into every local rank's out region; node barrier; every rank
//      copies its out region into recvbuff
struct HierBroadcastSteps : HierStepsBase {
  MKERNEL_HD explicit HierBroadcastSteps(const HierCall& call) : HierStepsBase(call) {}
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool a(Ex& ex, const HierStep& k) {
    if (x.j != jr) return true;
    char* P = ex.netSend(k.par);
    if (x.k == kr) {
      x.dsts[0] = P;
      ex.copy(x.dsts, 1, x.send + k.ch.g * x.esz, k.ch.bytes);
    }
    if (chained()) return postTree(ex, k, 0, false);
    for (int m = 0; m < x.N; ++m)
      rail.set(m, P, (x.k == kr && m != x.k) ? k.ch.bytes : 0, ex.netRecv(k.par, m),
               (x.k != kr && m == kr) ? k.ch.bytes : 0);
    return post(ex, k);
  }
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool b(Ex& ex, const HierStep& k) {
    if (x.j == jr) {
      const int steps = hierLog2(x.N);
      for (int st = 0; st < (chained() ? steps : 1); ++st)
        if (!ex.railWait(k.par) || (chained() && st + 1 < steps && !postTree(ex, k, st + 1, false)))
          return false;
      for (int q = 0; q < x.G; ++q) x.dsts[q] = ex.out(q, k.par);
      const char* src = x.k == kr && keepOwn()
                            ? x.send + k.ch.g * x.esz  // the root's chunk, from sendbuff
                        : x.k == kr || chained() ? ex.netSend(k.par)
                                                 : ex.netRecv(k.par, kr);
      ex.copy(x.dsts, x.G, src, k.ch.bytes);
    }
    if (!ex.nodeBarrier()) return false;
    x.dsts[0] = x.recv + k.ch.g * x.esz;
    ex.copy(x.dsts, 1, ex.out(x.j, k.par), k.ch.bytes);
    return true;
  }
};

// Reduce to root (kr, jr) (with MKERNEL_HIER_RAIL=ring or rhd: hierTreeStep's tree, each node
// reducing its children's partials into its own before sending it to its parent):
//   A  intra: push the chunk into slot j of local rank jr's inbox; node barrier; rank (m, jr) of
//      every node reduces its node's slots (pre()) into its net send buffer; post: it to the
//      root, which receives every other node's partial (other rails: nothing)
//   B  the root reduces the partials over the nodes 0..nNodes-1 (post()) into recvbuff
struct HierReduceSteps : HierStepsBase {
  MKERNEL_HD explicit HierReduceSteps(const HierCall& call) : HierStepsBase(call) {}
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool a(Ex& ex, const HierStep& k) {
    x.dsts[0] = ex.in(jr, k.par) + static_cast<uint64_t>(x.j) * k.stride;
    ex.copy(x.dsts, 1, x.send + k.ch.g * x.esz, k.slot);
    if (!ex.nodeBarrier()) return false;
    if (x.j != jr) return true;
    char* P = ex.netSend(k.par);
    for (int q = 0; q < x.G; ++q)
      x.srcs[q] = ex.in(x.j, k.par) + static_cast<uint64_t>(q) * k.stride;
    // keepOwn: the root's partial, which is never sent, in place into its own slot of its inbox.
    x.dsts[0] =
        keepOwn() && x.k == kr ? ex.in(x.j, k.par) + static_cast<uint64_t>(x.j) * k.stride : P;
    ex.reduce(x.dsts, 1, x.srcs, x.G, k.ch.l, true, false);
    if (chained()) return postTree(ex, k, 0, true);
    for (int m = 0; m < x.N; ++m)
      rail.set(m, P, (x.k != kr && m == kr) ? k.slot : 0, ex.netRecv(k.par, m),
               (x.k == kr && m != x.k) ? k.slot : 0);
    return post(ex, k);
  }
  MK_HIER_TEMPLATE
  template <class Ex>
  MKERNEL_HD bool b(Ex& ex, const HierStep& k) {
    if (x.j != jr) return true;
    if (chained()) {  // the tree's steps, each received partial reduced into P; the root's last
                      // with post()
      char* P = ex.netSend(k.par);
      const int steps = hierLog2(x.N);
      for (int st = 0; st < steps; ++st) {
        if (!ex.railWait(k.par)) return false;
        const HierTreeStep t = hierTreeStep(true, x.N, x.k, kr, st);
        if (t.from >= 0) {
          x.srcs[0] = P;
          x.srcs[1] = ex.netRecv(k.par, t.from);
          x.dsts[0] = P;
          ex.reduce(x.dsts, 1, x.srcs, 2, k.ch.l, false, x.k == kr && st == steps - 1);
        }
        if (st + 1 < steps && !postTree(ex, k, st + 1, true)) return false;
      }
      if (x.k == kr) {
        x.dsts[0] = x.recv + k.ch.g * x.esz;
        ex.copy(x.dsts, 1, P, k.slot);
      }
      return true;
    }
    if (!ex.railWait(k.par)) return false;
    if (x.k == kr) {
      const char* own =
          keepOwn() ? ex.in(x.j, k.par) + static_cast<uint64_t>(x.j) * k.stride : ex.netSend(k.par);
      for (int m = 0; m < x.N; ++m) x.srcs[m] = m == x.k ? own : ex.netRecv(k.par, m);
      x.dsts[0] = x.recv + k.ch.g * x.esz;
      ex.reduce(x.dsts, 1, x.srcs, x.N, k.ch.l, false, true);
    }
    return true;
  }
};

// A two-step collective with its own state (on the device, a function of its own:
// MK_HIER_NOINLINE).
MK_HIER_TEMPLATE
template <class Ex, class Steps>
MKERNEL_HD MK_HIER_NOINLINE bool hierRunSteps(Ex& ex, const HierCall& c, uint64_t* chunkSeq) {
  Steps st(c);
  return hierTwoStep(ex, c, chunkSeq, st);
}

// ---- CTA roles (MKERNEL_HIER_ROLES): the AllReduce on specialised CTAs
// ----------------------------
//
// SM specialisation. The data-parallel form above runs every phase of a chunk on one
// CTA, so the reduction over the nodes (B) waits behind that CTA's NVLink work and the other way
// round. With roles, each lane (one of the collective's hierCtasFor slices, with proxy channel
// `lane`) has 1 + W + R CTAs:
//   sender          posts every rail step of the lane (the channel's only producer, as in the
//                   data-parallel form: the sender of lane l is CTA l), and waits for the
//                   all-gather steps that the next step depends on; no data
//   worker w of W   phases 1 and 3 (NVLink) of sub-slice w of every part: its own node barrier
//                   and staging regions (those of its CTA index, as any CTA's)
//   reducer r of R  waits for each reduce-scatter step and reduces sub-slice r of what it
//                   brought into P (direct: t_k over the nodes; ring and rhd: the step's block)
// handing chunks on through the lane's monotonic counters (DeviceState::hierRole):
//   Open     sender, once per collective: the lane's net buffers now belong to this collective
//            (the channel's earlier rounds are complete: the sender waited for them)
//   Ready    worker w's own, per chunk: its sub-slice of part j is reduced into P (netSend(slot))
//   R0       sender, per reduce-scatter step: posted (targets published for the reducers)
//   Reduced  reducer r's own, per reduce-scatter step: its sub-slice of it is reduced
//   R1       sender, per chunk: the last all-gather step posted (targets published for the workers)
//   Freed    each worker, once per collective: done reading the lane's net buffers
// Every MKERNEL_HIER_RAIL form runs in roles: a chunk is the rail's 2 half steps (direct: 1 + 1,
// the "rounds" r0 and r1 below; ring: N - 1 + N - 1; rhd: log2 N + log2 N), and R0 / Reduced count
// reduce-scatter steps, half per chunk (the communicator's rail, hence half, is fixed).
// Chunk i of the collective is lane chunk s = roleChunks + i, on net slot s & 1. The sender posts
// the steps in the data-parallel form's order, woven: chunk 0's reduce-scatter steps; then for
// each i, step 0 of chunk i + 1 (after Ready(i + 1)), and each all-gather step of chunk i followed
// by the next reduce-scatter step of chunk i + 1. Direct, that is r0(0), then r1(i) before r0(i +
// 1); on every rank alike, so that sends and receives between two ranks stay in the same order.
// Step st carries tag 2 * st + slot. Posting r0(i + 1) before r1(i) would queue r1(i + 1) behind
// r0(i + 2), which waits for a worker's phase 3 of chunk i and phase 1 of chunk i + 2, so the rail
// would idle for both NVLink phases of every chunk: one lane in roles ran that way as slowly as
// the phases in turn (64 MiB, 2 x 2 nodes on one H200: 26.5 ms against 17.8 pipelined).
// Why one step per slot is in flight: a slot's next step is posted after the one before landed
// (all-gather: the sender waited for it; reduce-scatter: every reducer waited for it and reduced
// it), except step 0 of chunk i + 2, which waits for Ready(i + 2) from every worker, which each
// signals after its phase 3 of chunk i, which waited for chunk i's last step to complete; that
// step was posted after every reduce-scatter step of chunk i had been reduced. So a slot's
// buffers are refilled only after every reader of the chunk two before is done, and the
// published targets of a slot count exactly that slot's steps up to the one waited for (a slot's
// next step of the same kind is posted only after each waiter read its target).
// The workers keep the data-parallel form's order of node barriers (phase 1 of chunk i + 1
// before phase 3 of chunk i), so its region argument above holds for each worker index.
// In turn (c.overlap false, MKERNEL_HIER_OVERLAP=0), the same code with the phases of consecutive
// chunks kept apart, to measure what the overlap gains: a worker runs phase 3 of chunk i before
// phase 1 of chunk i + 1, and the sender posts step 0 of chunk i + 1 only after chunk i's last
// all-gather step is complete and Ready(i + 1) (so after every worker's phase 3 of chunk i); the
// reducers are unchanged. Every wait of the pipelined order is still made, so its arguments hold.
// The sender of lane 0 (CTA 0) marks the phase times (hierAllReduceRoles).
enum HierRole : int {
  kHierRoleNone = 0,
  kHierRoleSender = 1,
  kHierRoleWorker = 2,
  kHierRoleReducer = 3
};
// Ready and Reduced are one counter per worker / reducer: a shared count would let a worker that
// is a chunk ahead stand in for one that is a chunk behind (the CPU test checks it).
enum HierRoleCounter : int {
  kRoleOpen = 0,
  kRoleR0 = 1,
  kRoleR1 = 2,
  kRoleFreed = 3,
  kRoleReady = 4,                                // + worker index
  kRoleReduced = kRoleReady + kMaxHierRoleCtas,  // + reducer index
  kHierRoleCounters = kRoleReduced + kMaxHierRoleCtas
};
static_assert(kHierRoleCounters <=
                  static_cast<int>(sizeof(DeviceState::HierRoleLane::counter) / sizeof(uint64_t)),
              "DeviceState::HierRoleLane holds every role counter");

// CTAs a collective in roles needs: every lane's sender, workers and reducers.
MKERNEL_HD inline int hierRoleCtas(int lanes, int workers, int reducers) {
  return lanes * (1 + workers + reducers);
}

// What CTA cta plays, for `lanes` lanes of `workers` + 1 + `reducers` CTAs: CTA l < lanes is lane
// l's sender; the others lane by lane, workers first.
struct HierRoleOf {
  int role, lane, index;
  MKERNEL_HD HierRoleOf(int cta, int lanes, int workers, int reducers) {
    if (cta < lanes) {
      role = kHierRoleSender;
      lane = cta;
      index = 0;
      return;
    }
    const int per = workers + reducers, k = cta - lanes;
    lane = k / per;
    index = k % per;
    role = index < workers ? kHierRoleWorker : kHierRoleReducer;
    if (role == kHierRoleReducer) index -= workers;
  }
};

// Chunks of this CTA's part (0 for an empty part).
MKERNEL_HD inline uint64_t hierChunksOf(const HierCall& c) {
  return c.part.count == 0 || c.chunkElems == 0 ? 0
                                                : (c.part.count + c.chunkElems - 1) / c.chunkElems;
}

// Worker w's elements of a part of `count` elements: slice w of the largest part a full chunk has,
// cut at count. Fixed bounds, not a slice of each chunk's own parts: workers run up to a chunk
// apart, and P (the lane's net buffer) is shared; with bounds that moved with a short last chunk,
// a worker's phase 1 of chunk i + 2 overwrote P where another was still reading chunk i (the CPU
// test caught it).
MKERNEL_HD inline Slice hierRoleSub(const HierCall& c, uint64_t count) {
  const uint64_t align = sliceAlignElems(c.elemSize);
  const uint64_t cap = rankSlice(c.chunkElems, c.layout.perNode, 0, align).count;
  const Slice s = rankSlice(cap, c.workers, c.roleIndex, align);
  Slice out;
  out.offset = s.offset < count ? s.offset : count;
  const uint64_t end = s.offset + s.count < count ? s.offset + s.count : count;
  out.count = end - out.offset;
  return out;
}

// Worker: phase 1 of chunk a for its sub-slice of every part, on regions of parity a.par, into
// netSend(slot); then Ready.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierRoleWorker1(Ex& ex, const HierCall& c, HierCtx& x, const HierArChunk& a,
                                int slot) {
  const uint64_t esz = x.esz, align = sliceAlignElems(esz);
  const uint64_t slotBytes = hierSlotBytes(c.layout, c.chunkElems, esz);
  for (int q = 0; q < x.G; ++q) {
    const Slice s = rankSlice(a.ch.l, x.G, q, align);
    const Slice sub = hierRoleSub(c, s.count);
    x.dsts[0] = ex.in(q, a.par) + static_cast<uint64_t>(x.j) * slotBytes + sub.offset * esz;
    ex.copy(x.dsts, 1, x.send + (a.ch.g + s.offset + sub.offset) * esz, sub.count * esz);
  }
  if (!ex.nodeBarrier()) return false;
  const Slice sub = hierRoleSub(c, a.mine.count);
  for (int q = 0; q < x.G; ++q)
    x.srcs[q] = ex.in(x.j, a.par) + static_cast<uint64_t>(q) * slotBytes + sub.offset * esz;
  x.dsts[0] = ex.netSend(slot) + sub.offset * esz;
  ex.reduce(x.dsts, 1, x.srcs, x.G, sub.count, true, false);
  ex.roleAdd(kRoleReady + c.roleIndex);
  return true;
}

// Until every worker's (kRoleReady) or every reducer's (kRoleReduced) own counter reaches `target`.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierRoleWaitAll(Ex& ex, int first, int n, uint64_t target) {
  for (int i = 0; i < n; ++i)
    if (!ex.roleWait(first + i, target)) return false;
  return true;
}

// Worker: phase 3 of chunk a for its sub-slice [lo, hi) of part j, once the chunk's last rail step
// is complete (direct: the pieces of it that came from each node; ring and rhd: the whole part is
// in P); then its sub-slice of every part out.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierRoleWorker3(Ex& ex, const HierCall& c, HierCtx& x, const HierArChunk& a,
                                int slot) {
  const uint64_t esz = x.esz, align = sliceAlignElems(esz);
  if (!ex.railWaitPublished(1, slot)) return false;
  const Slice sub = hierRoleSub(c, a.mine.count);
  const uint64_t lo = sub.offset, hi = sub.offset + sub.count;
  char* P = ex.netSend(slot);
  if (c.rail != kRailDirect) {
    for (int q = 0; q < x.G; ++q) x.dsts[q] = ex.out(q, a.par) + (a.mine.offset + lo) * esz;
    ex.copy(x.dsts, x.G, P + lo * esz, (hi - lo) * esz);
  } else {
    for (int m = 0; m < x.N; ++m) {
      const Slice t = rankSlice(a.mine.count, x.N, m, align);
      const uint64_t b = t.offset > lo ? t.offset : lo,
                     e = t.offset + t.count < hi ? t.offset + t.count : hi;
      if (b >= e) continue;
      for (int q = 0; q < x.G; ++q) x.dsts[q] = ex.out(q, a.par) + (a.mine.offset + b) * esz;
      ex.copy(x.dsts, x.G, m == x.k ? P + b * esz : ex.netRecv(slot, m) + (b - t.offset) * esz,
              (e - b) * esz);
    }
  }
  if (!ex.nodeBarrier()) return false;
  for (int q = 0; q < x.G; ++q) {
    const Slice s = rankSlice(a.ch.l, x.G, q, align);
    const Slice qs = hierRoleSub(c, s.count);
    x.dsts[0] = x.recv + (a.ch.g + s.offset + qs.offset) * esz;
    ex.copy(x.dsts, 1, ex.out(x.j, a.par) + (s.offset + qs.offset) * esz, qs.count * esz);
  }
  return true;
}

// Sender: rail step st of chunk a posted on net slot `slot` (tag 2 * st + slot), and its targets
// published: a reduce-scatter step's for the reducers (then R0), the last all-gather step's for the
// workers (then R1). The steps between are the sender's own to wait for.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierRoleStep(Ex& ex, const HierCall& c, HierCtx& x, HierRail& rail,
                             const HierArChunk& a, int st, int slot) {
  const int half = hierRailHalf(c.rail, x.N);
  if (!hierArRailPost(ex, c, x, rail, a, st, slot, 2 * st + slot)) return false;
  if (st < half) {
    ex.railPublish(0, slot);
    ex.roleAdd(kRoleR0);
  } else if (st == 2 * half - 1) {
    ex.railPublish(1, slot);
    ex.roleAdd(kRoleR1);
  }
  return true;
}

MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD MK_HIER_NOINLINE bool hierAllReduceRoles(Ex& ex, const HierCall& c, uint64_t* chunkSeq) {
  const uint64_t chunks = hierChunksOf(c);
  if (chunks == 0) return true;
  HierCtx x(c);
  HierRail rail;
  const uint64_t seq0 = *chunkSeq, s0 = c.roleChunks;
  *chunkSeq += chunks;
  const int W = c.workers, R = c.reducers, half = hierRailHalf(c.rail, x.N);
  auto slotOf = [s0](uint64_t i) { return static_cast<int>((s0 + i) & 1); };
  // R0 and each reducer's Reduced count reduce-scatter steps: step st of chunk i is the lane's
  // (s0 + i) * half + st + 1-th (the rail, hence half, is the communicator's).
  auto rsCount = [s0, half](uint64_t i, int st) {
    return (s0 + i) * static_cast<uint64_t>(half) + static_cast<uint64_t>(st) + 1;
  };
  if (c.role == kHierRoleSender) {
    // Step st of chunk i posted; and before it, step st - 1 landed: a reduce-scatter step once
    // every reducer has reduced it, an all-gather step once complete (its receive is what the
    // next one sends). The last all-gather step is the workers' to wait for.
    auto post = [&](uint64_t i, int st) {
      return hierRoleStep(ex, c, x, rail, HierArChunk(c, x, i, seq0 + i), st, slotOf(i));
    };
    auto landPost = [&](uint64_t i, int st) {
      const bool landed = st - 1 < half ? hierRoleWaitAll(ex, kRoleReduced, R, rsCount(i, st - 1))
                                        : ex.railWait(slotOf(i));
      return landed && post(i, st);
    };
    ex.roleAdd(kRoleOpen);
    const uint64_t freed = static_cast<uint64_t>(W) * (c.roleOps + 1);
    if (!c.overlap) {
      // In turn (MKERNEL_HIER_OVERLAP=0, the overlap's comparison): chunk i's rail starts once the
      // workers have reduced it into P (Ready; in turn they start it only after their phase 3 of
      // chunk i - 1) and ends when its last all-gather step is complete, which the sender waits
      // for too. Phase times (CTA 0: lane 0's sender): the node phases are the waits for Ready
      // (phase 3 of the chunk before, phase 1 of this one) and, after the last chunk, for Freed
      // (its phase 3); the rail phase is the steps, with the reducers' work between them.
      for (uint64_t i = 0; i < chunks; ++i) {
        ex.phaseMark(kPhaseChunkStart);
        if (!hierRoleWaitAll(ex, kRoleReady, W, s0 + i + 1)) return false;
        ex.phaseMark(kPhaseRailStart);
        if (!post(i, 0)) return false;
        for (int st = 1; st < 2 * half; ++st)
          if (!landPost(i, st)) return false;
        if (!ex.railWait(slotOf(i))) return false;
        ex.phaseMark(kPhaseRailEnd);
        if (i + 1 == chunks && !ex.roleWait(kRoleFreed, freed)) return false;
        ex.phaseMark(kPhaseChunkEnd);
      }
    } else {
      if (!hierRoleWaitAll(ex, kRoleReady, W, s0 + 1) || !post(0, 0)) return false;
      for (int st = 1; st <= half; ++st)
        if (!landPost(0, st)) return false;
      for (uint64_t i = 0; i < chunks; ++i) {
        const bool more = i + 1 < chunks;
        if (more && (!hierRoleWaitAll(ex, kRoleReady, W, s0 + i + 2) || !post(i + 1, 0)))
          return false;
        for (int st = half; st < 2 * half; ++st) {
          if (st + 1 < 2 * half && !landPost(i, st + 1)) return false;
          if (more && !landPost(i + 1, st - half + 1)) return false;
        }
      }
    }
    // Every transfer of the lane complete and every worker done with the net buffers: the channel
    // and the buffers are free for whatever this CTA runs next. (One count for all workers is
    // enough here: none can count the next collective before this wait ends and Open follows.)
    return ex.roleWait(kRoleFreed, freed) && ex.railWait(0) && ex.railWait(1);
  }
  if (c.role == kHierRoleReducer) {
    for (uint64_t i = 0; i < chunks; ++i) {
      const int slot = slotOf(i);
      const HierArChunk a(c, x, i, seq0 + i);
      for (int st = 0; st < half; ++st) {
        if (!ex.roleWait(kRoleR0, rsCount(i, st)) || !ex.railWaitPublished(0, slot)) return false;
        hierArRailReduce(ex, c, x, a, st, slot, c.roleIndex, R);
        ex.roleAdd(kRoleReduced + c.roleIndex);
      }
    }
    return true;
  }
  // Worker: phase 1 of chunk i + 1 before phase 3 of chunk i; in turn, after it.
  if (!ex.roleWait(kRoleOpen, c.roleOps + 1)) return false;
  if (!hierRoleWorker1(ex, c, x, HierArChunk(c, x, 0, seq0), slotOf(0))) return false;
  for (uint64_t i = 0; i < chunks; ++i) {
    const bool more = i + 1 < chunks;
    if (c.overlap && more &&
        !hierRoleWorker1(ex, c, x, HierArChunk(c, x, i + 1, seq0 + i + 1), slotOf(i + 1)))
      return false;
    if (!ex.roleWait(kRoleR1, s0 + i + 1)) return false;
    if (!hierRoleWorker3(ex, c, x, HierArChunk(c, x, i, seq0 + i), slotOf(i))) return false;
    if (!c.overlap && more &&
        !hierRoleWorker1(ex, c, x, HierArChunk(c, x, i + 1, seq0 + i + 1), slotOf(i + 1)))
      return false;
  }
  ex.roleAdd(kRoleFreed);
  return true;
}

// One collective of call c for this CTA.
MK_HIER_TEMPLATE
template <class Ex>
MKERNEL_HD bool hierCollective(Ex& ex, const HierCall& c, uint64_t* chunkSeq) {
  switch (c.coll) {
    case CollType::AllReduce:
      if (c.role != kHierRoleNone) return hierAllReduceRoles(ex, c, chunkSeq);
      return hierAllReduce(ex, c, chunkSeq);
    case CollType::ReduceScatter:
      return hierRunSteps<Ex, HierReduceScatterSteps>(ex, c, chunkSeq);
    case CollType::AllGather:
      return hierRunSteps<Ex, HierAllGatherSteps>(ex, c, chunkSeq);
    case CollType::Broadcast:
      return hierRunSteps<Ex, HierBroadcastSteps>(ex, c, chunkSeq);
    case CollType::Reduce:
      return hierRunSteps<Ex, HierReduceSteps>(ex, c, chunkSeq);
  }
  return false;
}

}  // namespace coll
}  // namespace mkernel
