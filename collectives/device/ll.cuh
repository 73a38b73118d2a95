// The launch path's LL mode: 8-byte payloads with flags in 16-byte lines pushed into the
// peers' inboxes (collectives/route/launch_path.h, "LL mode").
#pragma once

#include "collectives/device/launch_direct.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// ---- LL mode (launch_path.h, "LL mode")
// ----------------------------------------------------------

// Up to 8 bytes of a user buffer (fewer at its end: the rest reads as 0).
__device__ __forceinline__ uint64_t llLoad8(const char* p, uint64_t avail) {
  if (avail >= 8 && (reinterpret_cast<uint64_t>(p) & 7) == 0)
    return *reinterpret_cast<const uint64_t*>(p);
  uint64_t v = 0;
  const int m = avail < 8 ? static_cast<int>(avail) : 8;
  for (int b = 0; b < m; ++b) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[b])) << (8 * b);
  return v;
}
__device__ __forceinline__ void llStore8(char* p, uint64_t v, uint64_t avail) {
  if (avail >= 8 && (reinterpret_cast<uint64_t>(p) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(p) = v;
    return;
  }
  const int m = avail < 8 ? static_cast<int>(avail) : 8;
  for (int b = 0; b < m; ++b) p[b] = static_cast<char>(static_cast<uint8_t>(v >> (8 * b)));
}
// One line, both halves carrying the flag (two aligned 8-byte halves in one 16-byte store).
__device__ __forceinline__ void llPut(LlLine* line, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line),
               "r"(static_cast<uint32_t>(v)), "r"(flag), "r"(static_cast<uint32_t>(v >> 32)),
               "r"(flag)
               : "memory");
}
// Polls a line of this rank's slots until both halves carry `flag`, takes its payload and zeroes
// it. Bounded like waitGeq: false on stop, abort or timeout (recorded as kWaitLaunchPeer, with
// the half's flag seen).
__device__ __noinline__ bool llTake(const KernelParams& p, LlLine* line, uint32_t flag,
                                    uint64_t* out, int peer, int coll, uint64_t epoch) {
  uint64_t start = 0;
  for (uint32_t iter = 1;; ++iter) {
    uint32_t a, b, c, d;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(line)
                 : "memory");
    if (b == flag && d == flag) {
      *out = static_cast<uint64_t>(a) | (static_cast<uint64_t>(c) << 32);
      asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(line), "r"(0u)
                   : "memory");
      return true;
    }
    if ((iter & 255) == 0) {
      if (stopRequested(p)) return false;
      if ((iter & 8191) == 0 && hostStopRequested(p)) return false;
      const uint64_t now = globalTimerNs();
      if (start == 0) {
        start = now;
      } else if (now - start > p.timeoutNs) {
        recordError(p, static_cast<int>(blockIdx.x), peer, kWaitLaunchPeer, coll, epoch,
                    b != flag ? b : d);
        return false;
      }
      if (iter > (1u << 16)) __nanosleep(200);
    }
  }
}

// What one CTA of an LL op works with (launchLl).
struct LlArgs {
  LlRange range;       // this CTA's lines
  uint64_t payload;    // bytes from each source to each destination
  uint64_t slotLines;  // llSlotLines(n): source k's lines start at k * slotLines
  uint64_t lineBase;  // where the op's lines start in each slot (an LL batch's later ops: after the
                      // earlier ones')
  uint64_t epoch;
  int ns, parity;
  uint32_t flag;
  uint32_t tid, nthr;  // this thread among the op's threads (the CTA's, or an LL batch op's warps)
  // MKERNEL_KERNEL_TRACE=3 (launchLlKernel, captured ops): the record the receive's own stamps go
  // to (receive begun, first poll answered, line taken, combined and stored), else kNoTrace.
  uint64_t detailSeq;
};
__device__ __forceinline__ LlLine* llOwnLine(const KernelParams& p, const LlArgs& a, int source,
                                             uint64_t i) {
  return &p.self->ll[a.ns].lines[a.parity][llSlotLine(a.slotLines, source, a.lineBase + i)];
}

// A thread's lines come in batches of kLlBatch (launch_path.h): line base + u * stride of batch
// `base` (stride: the op's threads, LlArgs::nthr), those below `end`. Each step issues all of the
// batch's loads before it uses any, so that one memory latency, not kLlBatch of them, is paid per
// batch.
__device__ __forceinline__ uint64_t llBatchLine(uint64_t base, int u, uint32_t stride) {
  return base + static_cast<uint64_t>(u) * stride;
}
// The batch's payload at byte offset `from` of a buffer (line i at from + i * 8).
template <int B = kLlBatch>
__device__ __forceinline__ void llLoadBatch(const char* from, uint64_t payload, uint64_t base,
                                            uint64_t end, uint32_t stride, uint64_t (&v)[B]) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, stride);
    v[u] = i < end ? llLoad8(from + i * kLlLinePayload, payload - i * kLlLinePayload) : 0;
  }
}
template <int B = kLlBatch>
__device__ __forceinline__ void llStoreBatch(char* to, uint64_t payload, uint64_t base,
                                             uint64_t end, uint32_t stride,
                                             const uint64_t (&v)[B]) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, stride);
    if (i < end) llStore8(to + i * kLlLinePayload, v[u], payload - i * kLlLinePayload);
  }
}
// Pushes the batch's payload into source slot `mine` of a peer's lines.
template <int B = kLlBatch>
__device__ __forceinline__ void llPutBatch(LlLine* peerLines, uint64_t base, uint64_t end,
                                           uint32_t stride, const uint64_t (&v)[B], uint32_t flag) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, stride);
    if (i < end) llPut(peerLines + i, v[u], flag);
  }
}
// Takes the batch's lines from source k: one poll of each line, all issued together, then llTake
// for any line still missing its flag. False as llTake.
template <int B = kLlBatch>
__device__ __forceinline__ bool llTakeBatch(const KernelParams& p, const LlArgs& a, int k,
                                            uint64_t base, uint64_t end, uint64_t (&v)[B],
                                            int coll) {
  uint32_t w[B][4];
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, a.nthr);
    if (i < end) {
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w[u][0]), "=r"(w[u][1]), "=r"(w[u][2]), "=r"(w[u][3])
                   : "l"(llOwnLine(p, a, k, i))
                   : "memory");
    } else {
      w[u][0] = w[u][2] = 0;
      w[u][1] = w[u][3] = a.flag;
    }
  }
  if (a.detailSeq != kNoTrace) {
    // The first poll's answer (the compare waits for it), then the stamp.
    const bool hit = w[0][1] == a.flag && w[0][3] == a.flag;
    traceAfter(p, blockIdx.x, a.detailSeq, kTraceStartBarrier, hit ? 1 : 2);
  }
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, a.nthr);
    if (i >= end) {
      v[u] = 0;
    } else if (w[u][1] == a.flag && w[u][3] == a.flag) {
      v[u] = static_cast<uint64_t>(w[u][0]) | (static_cast<uint64_t>(w[u][2]) << 32);
      asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(llOwnLine(p, a, k, i)),
                   "r"(0u)
                   : "memory");
    } else {
      // The slow path: spin on this line. Through a temporary, so that v stays in registers
      // (llTake is not inlined, and an array element whose address it took would live in local
      // memory on the fast path too).
      uint64_t t;
      if (!llTake(p, llOwnLine(p, a, k, i), a.flag, &t, k, coll, a.epoch)) return false;
      v[u] = t;
    }
  }
  traceAfter(p, blockIdx.x, a.detailSeq, kTraceMoved, v[0]);
  return true;
}

// An LL op's reduction, resolved once per op (llRedOf): its dtype and op, and the PreMulSum
// scalar's bits (loaded when it is given by device pointer).
struct LlRed {
  uint64_t scalarBits;
  uint32_t divisor;
  int32_t dtype;
  DevRedOpKind kind;
};
__device__ __forceinline__ LlRed llRedOf(const WorkDesc& d) {
  LlRed o;
  o.dtype = d.dtype;
  o.kind = d.redOp.kind;
  o.divisor = d.redOp.divisor;
  o.scalarBits = d.redOp.scalarBits;
  if (d.scalarDevPtr) {
    const void* sp = reinterpret_cast<const void*>(d.scalarDevPtr);
    switch (elemSize(d.dtype)) {
      case 1:
        o.scalarBits = loadCg(static_cast<const uint8_t*>(sp));
        break;
      case 2:
        o.scalarBits = loadCg(static_cast<const uint16_t*>(sp));
        break;
      case 4:
        o.scalarBits = loadCg(static_cast<const uint32_t*>(sp));
        break;
      default:
        o.scalarBits = loadCg(static_cast<const uint64_t*>(sp));
        break;
    }
  }
  return o;
}

// One 8-byte word of a reduction in type T: acc = pre(v) (first) or combine(acc, pre(v)), then
// post() (last), as reduceCopy combines (docs/REDUCTIONS.md).
template <typename T, int FAMILY>
__device__ __forceinline__ uint64_t llStepAs(uint64_t acc, uint64_t v, bool first, bool last,
                                             const LlRed& o) {
  constexpr int kPer = 8 / sizeof(T);
  T scalar;
  memcpy(&scalar, &o.scalarBits, sizeof(T));
  const Reducer<T, FAMILY> red{scalar, o.divisor, o.kind == DevRedOpKind::PreMulSum,
                               o.kind == DevRedOpKind::SumPostDiv, o.kind == DevRedOpKind::Max};
  T a[kPer], x[kPer];
  memcpy(a, &acc, 8);
  memcpy(x, &v, 8);
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    a[e] = first ? red.pre(x[e]) : red.combine(a[e], red.pre(x[e]));
    if (last) a[e] = red.post(a[e]);
  }
  memcpy(&acc, a, 8);
  return acc;
}
template <typename T>
__device__ __forceinline__ uint64_t llStepTyped(uint64_t acc, uint64_t v, bool first, bool last,
                                                const LlRed& o) {
  if (o.kind == DevRedOpKind::Prod) return llStepAs<T, kFamilyProd>(acc, v, first, last, o);
  if (o.kind == DevRedOpKind::Min || o.kind == DevRedOpKind::Max)
    return llStepAs<T, kFamilyMinMax>(acc, v, first, last, o);
  return llStepAs<T, kFamilySum>(acc, v, first, last, o);
}
// The dtype x op dispatch of the LL reductions, one word at a time. The loop that moves the lines
// is one, inlined, and only this step depends on the type: a receive loop instantiated per dtype
// and op family and called out of line keeps, in its SASS, the op's and the kernel's parameters
// behind generic loads and its registers in local memory.
__device__ __noinline__ uint64_t llStep(uint64_t acc, uint64_t v, bool first, bool last, LlRed o) {
  switch (static_cast<DataType>(o.dtype)) {
    case DataType::Int8:
      return llStepTyped<int8_t>(acc, v, first, last, o);
    case DataType::Uint8:
      return llStepTyped<uint8_t>(acc, v, first, last, o);
    case DataType::Int32:
      return llStepTyped<int32_t>(acc, v, first, last, o);
    case DataType::Uint32:
      return llStepTyped<uint32_t>(acc, v, first, last, o);
    case DataType::Int64:
      return llStepTyped<int64_t>(acc, v, first, last, o);
    case DataType::Uint64:
      return llStepTyped<uint64_t>(acc, v, first, last, o);
    case DataType::Float16:
      return llStepTyped<__half>(acc, v, first, last, o);
    case DataType::Float32:
      return llStepTyped<float>(acc, v, first, last, o);
    case DataType::Float64:
      return llStepTyped<double>(acc, v, first, last, o);
    case DataType::Bfloat16:
      return llStepTyped<__nv_bfloat16>(acc, v, first, last, o);
    case DataType::Fp8E4M3:
      return llStepTyped<__nv_fp8_e4m3>(acc, v, first, last, o);
    case DataType::Fp8E5M2:
      return llStepTyped<__nv_fp8_e5m2>(acc, v, first, last, o);
  }
  return acc;
}

// The reducing collectives' receive side: for each of this thread's lines, every source's 8 bytes
// in rank order (this rank's own from its input), combined as reduceCopy does (pre on each input,
// combine left to right, post), written to the output. False when a wait failed.
template <int B = kLlBatch>
__device__ __forceinline__ bool llReduceLines(const KernelParams& p, const WorkDesc& d,
                                              const LlArgs& a) {
  const int n = p.nRanks, r = p.rank;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const LlRed o = llRedOf(d);
  const char* own = reinterpret_cast<const char*>(d.sendbuff) + llSendOffset(coll, d.count, esz, r);
  char* recv = reinterpret_cast<char*>(d.recvbuff);
  const uint64_t end = a.range.first + a.range.count;
  traceAt(p, blockIdx.x, a.detailSeq, kTraceLoaded);  // (MKERNEL_KERNEL_TRACE=3: receive begun)
  for (uint64_t base = a.range.first + a.tid; base < end; base += B * a.nthr) {
    uint64_t acc[B] = {};
    // The own input's loads first, whatever this rank's place in the order: the polls below are
    // volatile asm, which the compiler does not move loads across.
    uint64_t mine[B];
    llLoadBatch<B>(own, a.payload, base, end, a.nthr, mine);
    for (int k = 0; k < n; ++k) {
      uint64_t v[B];
      if (k == r) {
#pragma unroll
        for (int u = 0; u < B; ++u) v[u] = mine[u];
      } else if (!llTakeBatch<B>(p, a, k, base, end, v, d.coll)) {
        return false;
      }
#pragma unroll
      for (int u = 0; u < B; ++u)
        if (llBatchLine(base, u, a.nthr) < end)
          acc[u] = llStep(acc[u], v[u], k == 0, k == n - 1, o);
    }
    llStoreBatch<B>(recv, a.payload, base, end, a.nthr, acc);
  }
  traceAt(p, blockIdx.x, a.detailSeq,
          kTraceEndBarrier);  // (MKERNEL_KERNEL_TRACE=3: combined, stored)
  return true;
}

// What CTA blockIdx.x of an LL op works with (launch_path.h). One CTA (every op up to
// kLlBytesPerCta) divides nothing. wholeOp: every line of the op (an LL batch's op, whose warps
// may be in any CTA), no division either.
__device__ __forceinline__ LlArgs llArgs(const KernelParams& p, const WorkDesc& d, uint64_t epoch,
                                         int ns, bool wholeOp = false) {
  LlArgs a;
  a.payload = llPayloadBytes(d.count, elemSize(d.dtype));
  a.range = wholeOp ? LlRange{0, llLines(a.payload)}
                    : llCtaLines(llLines(a.payload), gridDim.x, blockIdx.x);
  a.slotLines = llSlotLines(p.nRanks);
  a.lineBase = 0;
  a.epoch = epoch;
  a.ns = ns;
  a.parity = static_cast<int>(epoch & 1);
  a.flag = llFlag(epoch);
  a.tid = threadIdx.x;
  a.nthr = blockDim.x;
  a.detailSeq = kNoTrace;
  return a;
}

// LL phases 0 and 1 (launch_path.h), this CTA's share: the token, and every line it pushes. The
// launch kernel runs them before anything else: the peers' receives wait for these
// stores and for nothing else of this kernel, so the frame's own setup (the shared state, the
// stop flag's mirror, the barrier) overlaps the NVLink crossing instead of preceding it. Peers'
// addresses come from the kernel's parameters (no shared state is set up yet). stop: the
// communicator has failed, nothing is stored; its loads are issued before stop is tested, so that
// the stop flag's latency and the input's overlap. token: phase 0 too (an LL batch's first op
// only).
template <int B = kLlBatch>
__device__ __forceinline__ void llPush(const KernelParams& p, const WorkDesc& d, const LlArgs& a,
                                       bool stop, bool token = true) {
  const int n = p.nRanks, r = p.rank, cta = blockIdx.x;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const uint64_t payload = a.payload;
  const uint32_t flag = a.flag;
  const int ns = a.ns;
  // Our slot's first line, in every peer. pathOf (llTakes) keeps llLines(payload) <= slotLines.
  const uint64_t mine = llSlotLine(a.slotLines, r, a.lineBase);
  const char* send = reinterpret_cast<const char*>(d.sendbuff);
  const int tid = static_cast<int>(a.tid);
  const uint64_t first = a.range.first + a.tid;
  const uint64_t end = a.range.first + a.range.count;
  const uint32_t stride = a.nthr;
  const uint64_t step = B * stride;
  // 0. The token: this rank has started op e (so it has finished op e - 1).
  if (token && !stop && cta == 0 && tid < n && tid != r)
    llPut(&p.peers[tid]->ll[ns].token[a.parity][r], 0, flag);
  // 1. Push, a batch at a time.
  if (coll == CollType::ReduceScatter) {
    for (uint64_t base = first; base < end; base += step) {
      for (int k = 0; k < n; ++k) {
        if (k == r) continue;
        uint64_t v[B];
        llLoadBatch<B>(send + llSendOffset(coll, d.count, esz, k), payload, base, end, stride, v);
        if (!stop)
          llPutBatch<B>(&p.peers[k]->ll[ns].lines[a.parity][mine], base, end, stride, v, flag);
      }
    }
  } else if (!(coll == CollType::Broadcast && r != d.root) &&
             !(coll == CollType::Reduce && r == d.root)) {
    for (uint64_t base = first; base < end; base += step) {
      uint64_t v[B];
      llLoadBatch<B>(send, payload, base, end, stride, v);
      for (int k = 0; k < n && !stop; ++k)
        if (k != r && llSends(coll, r, k, d.root))
          llPutBatch<B>(&p.peers[k]->ll[ns].lines[a.parity][mine], base, end, stride, v, flag);
    }
  }
}

// LL phase 2 of one op, this CTA's share: its lines received, combined and written. This
// thread's answer (no barrier); false when a wait failed.
template <int B = kLlBatch>
__device__ __forceinline__ bool llReceive(const KernelParams& p, const WorkDesc& d,
                                          const LlArgs& a) {
  const int n = p.nRanks, r = p.rank;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t payload = a.payload;
  const char* send = reinterpret_cast<const char*>(d.sendbuff);
  char* recv = reinterpret_cast<char*>(d.recvbuff);
  const uint64_t first = a.range.first + a.tid;
  const uint64_t end = a.range.first + a.range.count;
  const uint32_t stride = a.nthr;
  const uint64_t step = B * stride;
  // 2. Receive.
  bool ok = true;
  if (coll == CollType::AllReduce || coll == CollType::ReduceScatter ||
      (coll == CollType::Reduce && r == d.root)) {
    ok = llReduceLines<B>(p, d, a);
  } else if (coll == CollType::AllGather) {
    for (uint64_t base = first; base < end && ok; base += step) {
      for (int k = 0; k < n && ok; ++k) {
        uint64_t v[B];
        if (k == r) {
          if (send == recv + static_cast<uint64_t>(r) * payload)
            continue;  // in place: already there
          llLoadBatch<B>(send, payload, base, end, stride, v);
        } else {
          ok = llTakeBatch<B>(p, a, k, base, end, v, d.coll);
        }
        if (ok)
          llStoreBatch<B>(recv + static_cast<uint64_t>(k) * payload, payload, base, end, stride, v);
      }
    }
  } else if (coll == CollType::Broadcast && !(r == d.root && send == recv)) {
    for (uint64_t base = first; base < end && ok; base += step) {
      uint64_t v[B];
      if (r == d.root) {
        llLoadBatch<B>(send, payload, base, end, stride, v);
      } else {
        ok = llTakeBatch<B>(p, a, d.root, base, end, v, d.coll);
      }
      if (ok) llStoreBatch<B>(recv, payload, base, end, stride, v);
    }
  }
  return ok;
}

// LL phase 3: every peer's token of this exchange (CTA 0's threads 32 + peer, or peer in a CTA of
// one warp). This thread's answer. The pollers are in the second warp so that, for the small ops
// whose lines all belong to the first, they wait for the tokens while it receives (in the first
// warp the two waits would run one after the other).
__device__ bool llTokens(const KernelParams& p, const LlArgs& a, int coll) {
  const int tid = static_cast<int>(threadIdx.x) - (blockDim.x >= 64 ? 32 : 0);
  if (blockIdx.x != 0 || tid < 0 || tid >= p.nRanks || tid == p.rank) return true;
  uint64_t unused;
  return llTake(p, &p.self->ll[a.ns].token[a.parity][tid], a.flag, &unused, tid, coll, a.epoch);
}

// LL phases 2 and 3 of one op, this CTA's share (llPush ran phases 0 and 1 before). The same
// answer in every thread: false when a wait failed.
template <int B = kLlBatch>
__device__ __forceinline__ bool llFinish(const KernelParams& p, const WorkDesc& d, const LlArgs& a,
                                         uint64_t traceSeq) {
  bool ok = llReceive<B>(p, d, a);
  traceAt(p, blockIdx.x, traceSeq, kTraceMoved);  // (this thread's lines received and written)
  if (ok) ok = llTokens(p, a, d.coll);
  return __syncthreads_and(ok) != 0;
}

// One LL op's phases 2 and 3 in launchKernel (llPush ran phases 0 and 1 at the kernel's start).
// False when the communicator had failed or a wait failed.
__device__ bool launchLl(const KernelParams& p, const WorkDesc& d, uint64_t epoch, int ns,
                         uint64_t traceSeq) {
  return llFinish(p, d, llArgs(p, d, epoch, ns), traceSeq);
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
