// collectives/route/launch_path.h, the launch path's LL mode, run by CPU threads: one thread per
// (rank, CTA) per collective, every rank's collectives in order (a rank's next collective starts
// once all its CTAs of the previous one ended: its stream's order), the ranks running freely
// against each other with random delays. Each rank pushes 8-byte halves {4 payload bytes, flag}
// into its peers' line slots (two halves per line, each stored on its own, as a 16-byte store may
// land over NVLink; the slots sized by the rank count, up to 256 KiB per op with two ranks), the
// receiver polls its own slots, takes a line once both halves carry the op's flag and zeroes it;
// CTA 0 exchanges a token with every peer, exactly as launchLl does. Inputs differ per op, so a
// line overwritten before it was read, or a stale line taken for a fresh one, gives a wrong
// result; every output byte is compared with the collective's definition (a
// byte-wise sum stands for the reduction: what is checked is where every byte goes).
//
// Graph mode: the op list replays several times, as a captured graph does, and each CTA takes its
// epoch from the rank's device counter (graphSeq + 1) at its start, some CTAs late; the last CTA
// of an op to finish advances it, as launchKernel does for captured LL ops.
//
// LL batches (MKERNEL_LL_BATCH=exchange, the kernel's llBatchExchange): a batch of 2-8 one-CTA
// ops is ONE exchange (one epoch, flag and token), op i's lines from lineBase[i] of each slot,
// run in the waves of llPlanWaves (the rank's own plan, from its buffers' addresses). The ops of a
// wave run at once on the GPU; here a rank pushes them in a random order, then receives them in
// a random order, and passes to the next wave. Besides independent ops, a batch has ops that
// depend on the one before on this rank: an in-place AllReduce chained on its output (reads what
// it wrote), an AllReduce into the same output (writes what it wrote: the later must win), and an
// AllReduce into its input (writes what it reads). Must fail: every op in one wave (the chained
// op pushes its input before it is computed, or an order is lost), and without the line offsets
// (every op's lines at the slot's start).
//
// The variants that must fail: no tokens (a non-root runs two Reduces ahead of the root and
// overwrites lines it has not read), and no zeroing with a flag that wraps quickly (a stale
// line carrying the current flag is taken). With zeroing, a flag that wraps every other op still
// passes: the flag's 32 bits may wrap.
#include "tests/catch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/route/launch_path.h"
#include "tests/collectives/launch_sim.h"
#include "tests/sanitizer.h"

using namespace mkernel::coll;

namespace {

using launchsim::jitter;

struct LlOp {
  CollType coll;
  uint64_t count;
  uint64_t esz;
  int root;
};

struct Variant {
  bool tokens = true;
  bool zero = true;
  uint32_t flagPeriod = 0;  // 0: llFlag(e); else e % period + 1 (a flag that wraps)
  int deadlineS = 20;
};

// One half of a line: payload in the low 32 bits, flag in the high 32.
using Half = std::atomic<uint64_t>;

struct World {
  int n = 0, cap = 1;
  Variant v;
  std::vector<LlOp> ops;
  // lines[(rank * 2 + parity) * kLlSpaceLines + llSlotLine(llSlotLines(n), source, line)] * 2 +
  // half
  std::unique_ptr<Half[]> lines;
  std::unique_ptr<Half[]> tokens;  // [(rank * 2 + parity) * n + source] * 2 + half
  launchsim::Failures failures;
  int replays = 0;                                         // graph mode: > 0
  std::unique_ptr<std::atomic<uint64_t>[]> graphSeq;       // [rank]
  std::unique_ptr<std::atomic<uint32_t>[]> graphCtasDone;  // [rank]
  const LlOp& op(uint64_t epoch) const { return ops[(epoch - 1) % ops.size()]; }

  Half* line(int rank, int parity, int src, uint64_t i) {
    return &lines[((static_cast<size_t>(rank) * 2 + static_cast<size_t>(parity)) * kLlSpaceLines +
                   llSlotLine(llSlotLines(n), src, i)) *
                  2];
  }
  Half* token(int rank, int parity, int src) {
    return &tokens[((static_cast<size_t>(rank) * 2 + static_cast<size_t>(parity)) *
                        static_cast<size_t>(n) +
                    static_cast<size_t>(src)) *
                   2];
  }
  uint32_t flag(uint64_t e) const {
    return v.flagPeriod ? static_cast<uint32_t>(e % v.flagPeriod) + 1 : llFlag(e);
  }
  // Every rank's line slots and tokens, both parities, zeroed (n set).
  void allocate() {
    const size_t nLines = static_cast<size_t>(n) * 2 * kLlSpaceLines * 2;
    lines.reset(new Half[nLines]);
    for (size_t i = 0; i < nLines; ++i) lines[i] = 0;
    const size_t nTokens = static_cast<size_t>(n) * 2 * static_cast<size_t>(n) * 2;
    tokens.reset(new Half[nTokens]);
    for (size_t i = 0; i < nTokens; ++i) tokens[i] = 0;
  }
};

uint8_t inputByte(uint64_t epoch, int rank, uint64_t j) {
  return static_cast<uint8_t>(
      (epoch * 2654435761ull + static_cast<uint64_t>(rank) * 40503ull + j * 97ull) >> 7);
}
uint64_t sendBytes(const LlOp& op, int n) {
  return (op.coll == CollType::ReduceScatter ? static_cast<uint64_t>(n) : 1) * op.count * op.esz;
}
uint64_t recvBytes(const LlOp& op, int n) {
  return (op.coll == CollType::AllGather ? static_cast<uint64_t>(n) : 1) * op.count * op.esz;
}

// llLoad8 / llStore8 of the kernel: up to 8 bytes, fewer at the end of the buffer.
uint64_t load8(const std::vector<uint8_t>& buf, uint64_t at, uint64_t avail) {
  uint64_t v = 0;
  for (uint64_t b = 0; b < std::min<uint64_t>(8, avail); ++b)
    v |= static_cast<uint64_t>(buf[at + b]) << (8 * b);
  return v;
}
void store8(std::vector<uint8_t>& buf, std::vector<std::atomic<int>>& writes, uint64_t at,
            uint64_t v, uint64_t avail) {
  for (uint64_t b = 0; b < std::min<uint64_t>(8, avail); ++b) {
    buf[at + b] = static_cast<uint8_t>(v >> (8 * b));
    writes[at + b]++;
  }
}

void put(Half* h, uint64_t v, uint32_t flag) {
  // The two halves land separately (and in either order).
  const uint64_t lo = (v & 0xffffffffull) | (static_cast<uint64_t>(flag) << 32);
  const uint64_t hi = (v >> 32) | (static_cast<uint64_t>(flag) << 32);
  if (v & 1) {
    h[1].store(hi, std::memory_order_release);
    h[0].store(lo, std::memory_order_release);
  } else {
    h[0].store(lo, std::memory_order_release);
    h[1].store(hi, std::memory_order_release);
  }
}

// llTake: polls both halves for `flag`, takes the payload and zeroes the line. With zeroing, a
// half holding anything but 0 or the flag is a protocol violation (a peer ahead of its time).
// where(): the failure's place, built only on failure.
template <typename Where>
bool take(World& w, Half* h, uint32_t flag, uint64_t* out, Where where) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(w.v.deadlineS);
  for (uint32_t iter = 0;; ++iter) {
    const uint64_t a = h[0].load(std::memory_order_acquire),
                   b = h[1].load(std::memory_order_acquire);
    const uint32_t fa = static_cast<uint32_t>(a >> 32), fb = static_cast<uint32_t>(b >> 32);
    if (fa == flag && fb == flag) {
      *out = (a & 0xffffffffull) | ((b & 0xffffffffull) << 32);
      if (w.v.zero) {
        h[0].store(0, std::memory_order_relaxed);
        h[1].store(0, std::memory_order_relaxed);
      }
      return true;
    }
    if (w.v.zero && ((fa != 0 && fa != flag) || (fb != 0 && fb != flag))) {
      w.failures.fail(where() + ": a line holds flag " + std::to_string(fa != flag ? fa : fb) +
                      " while op flag " + std::to_string(flag) +
                      " is awaited (overwritten before it was read)");
      return false;
    }
    if (w.failures.stop) return false;
    if ((iter & 63) == 0 && std::chrono::steady_clock::now() > deadline) {
      w.failures.fail(where() + ": never arrived");
      return false;
    }
    std::this_thread::yield();
  }
}

void runCta(World& w, int r, int cta, int nCtas, uint64_t epoch, const std::vector<uint8_t>& send,
            std::vector<uint8_t>& recv, std::vector<std::atomic<int>>& writes, unsigned seed) {
  std::mt19937 rng(seed);
  const LlOp& op = w.op(epoch);
  const int n = w.n, parity = static_cast<int>(epoch & 1);
  const uint32_t flag = w.flag(epoch);
  const uint64_t payload = llPayloadBytes(op.count, op.esz);
  const LlRange range = llCtaLines(llLines(payload), nCtas, cta);
  const std::string tag = "op " + std::to_string(epoch) + " (" + collName(op.coll) + ", " +
                          std::to_string(payload) + " B) rank " + std::to_string(r) + " CTA " +
                          std::to_string(cta);
  if (w.v.tokens && cta == 0)
    for (int k = 0; k < n; ++k)
      if (k != r) put(w.token(k, parity, r), 0, flag);
  jitter(rng);
  for (uint64_t i = range.first; i < range.first + range.count; ++i) {
    const uint64_t at = i * kLlLinePayload;
    for (int k = 0; k < n; ++k) {
      if (k == r || !llSends(op.coll, r, k, op.root)) continue;
      put(w.line(k, parity, r, i),
          load8(send, llSendOffset(op.coll, op.count, op.esz, k) + at, payload - at), flag);
    }
  }
  jitter(rng);
  auto from = [&](int k, uint64_t i, uint64_t* v) {
    if (k == r) {
      *v = load8(send, llSendOffset(op.coll, op.count, op.esz, r) + i * kLlLinePayload,
                 payload - i * kLlLinePayload);
      return true;
    }
    return take(w, w.line(r, parity, k, i), flag, v, [&] {
      return tag + " line " + std::to_string(i) + " from rank " + std::to_string(k);
    });
  };
  for (uint64_t i = range.first; i < range.first + range.count && !w.failures.stop; ++i) {
    const uint64_t at = i * kLlLinePayload;
    uint64_t v = 0;
    switch (op.coll) {
      case CollType::AllGather:
        for (int k = 0; k < n; ++k) {
          if (!from(k, i, &v)) return;
          store8(recv, writes, static_cast<uint64_t>(k) * payload + at, v, payload - at);
        }
        break;
      case CollType::Broadcast:
        if (!from(op.root, i, &v)) return;
        store8(recv, writes, at, v, payload - at);
        break;
      case CollType::Reduce:
        if (r != op.root) break;
        [[fallthrough]];
      default: {
        uint8_t acc[8] = {};
        for (int k = 0; k < n; ++k) {
          if (!from(k, i, &v)) return;
          for (int b = 0; b < 8; ++b)
            acc[b] = static_cast<uint8_t>(acc[b] + static_cast<uint8_t>(v >> (8 * b)));
        }
        uint64_t out = 0;
        for (int b = 0; b < 8; ++b) out |= static_cast<uint64_t>(acc[b]) << (8 * b);
        store8(recv, writes, at, out, payload - at);
      }
    }
    if (i % 64 == 0) jitter(rng);
  }
  if (w.v.tokens && cta == 0)
    for (int k = 0; k < n; ++k) {
      uint64_t unused;
      if (k != r && !take(w, w.token(r, parity, k), flag, &unused,
                          [&] { return tag + " token from rank " + std::to_string(k); }))
        return;
    }
}

void check(World& w, int r, uint64_t epoch, const std::vector<uint8_t>& recv,
           const std::vector<std::atomic<int>>& writes) {
  const LlOp& op = w.op(epoch);
  const int n = w.n;
  const uint64_t payload = op.count * op.esz;
  const bool writes_ = !(op.coll == CollType::Reduce && r != op.root);
  for (uint64_t o = 0; o < recv.size(); ++o) {
    auto at = [&] {
      return "op " + std::to_string(epoch) + " (" + collName(op.coll) + ", " +
             std::to_string(payload) + " B) rank " + std::to_string(r) + ": byte " +
             std::to_string(o);
    };
    if (writes[o] != (writes_ ? 1 : 0)) {
      w.failures.fail(at() + " written " + std::to_string(writes[o].load()) + " times");
      return;
    }
    if (!writes_) continue;
    uint8_t expect = 0;
    switch (op.coll) {
      case CollType::AllGather:
        expect = inputByte(epoch, static_cast<int>(o / payload), o % payload);
        break;
      case CollType::Broadcast:
        expect = inputByte(epoch, op.root, o);
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k)
          expect = static_cast<uint8_t>(
              expect + inputByte(epoch, k, static_cast<uint64_t>(r) * payload + o));
        break;
      default:
        for (int k = 0; k < n; ++k) expect = static_cast<uint8_t>(expect + inputByte(epoch, k, o));
    }
    if (recv[o] != expect) {
      w.failures.fail(at() + " is " + std::to_string(recv[o]) + ", want " + std::to_string(expect) +
                      " (a line overwritten before it was read, or a stale one taken)");
      return;
    }
  }
}

void runRank(World& w, int r) {
  const uint64_t total = w.ops.size() * static_cast<uint64_t>(w.replays > 0 ? w.replays : 1);
  for (uint64_t epoch = 1; epoch <= total && !w.failures.stop; ++epoch) {
    const LlOp& op = w.op(epoch);
    const int nCtas = llCtas(llPayloadBytes(op.count, op.esz), w.cap);
    std::vector<uint8_t> send(sendBytes(op, w.n));
    for (uint64_t j = 0; j < send.size(); ++j) send[j] = inputByte(epoch, r, j);
    std::vector<uint8_t> recv(recvBytes(op, w.n), 0);
    std::vector<std::atomic<int>> writes(recv.size());
    for (auto& x : writes) x = 0;
    // Stream order: the next op starts after every CTA ended.
    launchsim::runThreads(nCtas, [&](int c) {
      const unsigned seed = static_cast<unsigned>(epoch * 131 + static_cast<uint64_t>(r) * 17 +
                                                  static_cast<uint64_t>(c));
      if (w.replays == 0) {
        runCta(w, r, c, nCtas, epoch, send, recv, writes, seed);
        return;
      }
      // Captured: the epoch from the device counter, some CTAs starting late.
      std::mt19937 rng(seed ^ 0x85ebca6bu);
      if (c % 2 == 1 && rng() % 4 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(300 + rng() % 700));
      const uint64_t e = w.graphSeq[r].load(std::memory_order_acquire) + 1;
      if (e != epoch) {
        w.failures.fail("rank " + std::to_string(r) + " CTA " + std::to_string(c) +
                        ": the device sequence gave epoch " + std::to_string(e) + " for op " +
                        std::to_string(epoch));
      } else {
        runCta(w, r, c, nCtas, e, send, recv, writes, seed);
      }
      if (w.graphCtasDone[r].fetch_add(1, std::memory_order_acq_rel) + 1 ==
          static_cast<uint32_t>(nCtas)) {
        w.graphCtasDone[r].store(0, std::memory_order_relaxed);
        w.graphSeq[r].store(e, std::memory_order_release);
      }
    });
    if (!w.failures.stop) check(w, r, epoch, recv, writes);
  }
}

// `onlyReduceRoot0`: every op a Reduce to rank 0 (the pattern the tokens exist for).
std::vector<std::string> runWorld(int n, int cap, int nOps, unsigned seed, Variant v,
                                  bool onlyReduceRoot0 = false, int replays = 0) {
  World w;
  w.n = n;
  w.cap = cap;
  w.v = v;
  w.replays = replays;
  w.graphSeq.reset(new std::atomic<uint64_t>[static_cast<size_t>(n)]);
  w.graphCtasDone.reset(new std::atomic<uint32_t>[static_cast<size_t>(n)]);
  for (int r = 0; r < n; ++r) {
    w.graphSeq[r] = 0;
    w.graphCtasDone[r] = 0;
  }
  std::mt19937 rng(seed);
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  const uint64_t eszs[] = {1, 2, 4, 8};
  for (int i = 0; i < nOps; ++i) {
    LlOp op;
    op.coll = onlyReduceRoot0 ? CollType::Reduce : colls[rng() % 5];
    op.esz = eszs[rng() % 4];
    const uint64_t maxCount = llMaxPayload(n) / op.esz;
    const uint64_t pick = rng() % 4;
    op.count = pick == 0   ? 1 + rng() % 7
               : pick == 1 ? 1 + rng() % 600
               : pick == 2 ? maxCount
                           : 1 + rng() % maxCount;
    op.root = onlyReduceRoot0 ? 0 : static_cast<int>(rng() % static_cast<unsigned>(n));
    w.ops.push_back(op);
  }
  w.allocate();
  launchsim::runThreads(n, [&](int r) { runRank(w, r); });
  return w.failures.list;
}

// ---- LL batches as one exchange ------------------------------------------------------------

struct BatchVariant {
  bool waves =
      true;  // llPlanWaves splits the batch where an op depends on one before (false: one wave)
  bool offsets = true;  // op i's lines from lineBase[i] (false: every op from line 0)
  int deadlineS = 20;
};

struct BatchOp {
  enum Kind { kFresh, kChained, kSameOutput, kIntoInput, kTwin };
  LlOp op;
  // kChained: AllReduce in place on the previous op's output buffer. kSameOutput: AllReduce of a
  // fresh input into the previous op's output buffer. kIntoInput: AllReduce of a fresh input into
  // the previous op's input buffer. kTwin: the previous op again, on its buffers (out of place).
  Kind kind = kFresh;
};

// What rank r's output of `op` must be, given every rank's input (byte-wise sums for reductions).
std::vector<uint8_t> reference(const LlOp& op, int n, int r,
                               const std::vector<std::vector<uint8_t>>& in) {
  const uint64_t payload = op.count * op.esz;
  std::vector<uint8_t> out(recvBytes(op, n), 0);
  for (uint64_t o = 0; o < out.size(); ++o) {
    switch (op.coll) {
      case CollType::AllGather:
        out[o] = in[o / payload][o % payload];
        break;
      case CollType::Broadcast:
        out[o] = in[static_cast<size_t>(op.root)][o];
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k)
          out[o] = static_cast<uint8_t>(
              out[o] + in[static_cast<size_t>(k)][static_cast<uint64_t>(r) * payload + o]);
        break;
      default:
        for (int k = 0; k < n; ++k)
          out[o] = static_cast<uint8_t>(out[o] + in[static_cast<size_t>(k)][o]);
    }
  }
  return out;
}

// One rank's batch, number `epoch`, as llBatchExchange runs it (one CTA: one thread here).
// send[i], recv[i]: op i's buffers on this rank (those of a dependent op are the op before's).
void runBatch(World& w, const BatchVariant& bv, int r, uint64_t epoch,
              const std::vector<BatchOp>& ops, const std::vector<uint64_t>& lineBase,
              std::vector<std::vector<uint8_t>*>& send, std::vector<std::vector<uint8_t>*>& recv,
              unsigned seed) {
  std::mt19937 rng(seed);
  const int n = w.n, parity = static_cast<int>(epoch & 1);
  const uint32_t flag = w.flag(epoch);
  auto tag = [&](size_t i) {
    return "batch " + std::to_string(epoch) + " op " + std::to_string(i) + " (" +
           collName(ops[i].op.coll) + ") rank " + std::to_string(r);
  };
  for (int k = 0; k < n; ++k)
    if (k != r) put(w.token(k, parity, r), 0, flag);
  auto push = [&](size_t j) {
    const LlOp& op = ops[j].op;
    const uint64_t payload = llPayloadBytes(op.count, op.esz), base = bv.offsets ? lineBase[j] : 0;
    for (uint64_t i = 0; i < llLines(payload); ++i) {
      const uint64_t at = i * kLlLinePayload;
      for (int k = 0; k < n; ++k)
        if (k != r && llSends(op.coll, r, k, op.root))
          put(w.line(k, parity, r, base + i),
              load8(*send[j], llSendOffset(op.coll, op.count, op.esz, k) + at, payload - at), flag);
    }
  };
  auto receive = [&](size_t j) {
    const LlOp& op = ops[j].op;
    const uint64_t payload = llPayloadBytes(op.count, op.esz), base = bv.offsets ? lineBase[j] : 0;
    std::vector<std::atomic<int>> writes(recv[j]->size());
    auto from = [&](int k, uint64_t i, uint64_t* v) {
      if (k == r) {
        *v = load8(*send[j], llSendOffset(op.coll, op.count, op.esz, r) + i * kLlLinePayload,
                   payload - i * kLlLinePayload);
        return true;
      }
      return take(w, w.line(r, parity, k, base + i), flag, v, [&] {
        return tag(j) + " line " + std::to_string(i) + " from rank " + std::to_string(k);
      });
    };
    for (uint64_t i = 0; i < llLines(payload); ++i) {
      const uint64_t at = i * kLlLinePayload;
      uint64_t v = 0;
      if (op.coll == CollType::AllGather) {
        for (int k = 0; k < n; ++k) {
          if (!from(k, i, &v)) return false;
          store8(*recv[j], writes, static_cast<uint64_t>(k) * payload + at, v, payload - at);
        }
      } else if (op.coll == CollType::Broadcast) {
        if (!from(op.root, i, &v)) return false;
        store8(*recv[j], writes, at, v, payload - at);
      } else if (!(op.coll == CollType::Reduce && r != op.root)) {
        uint8_t acc[8] = {};
        for (int k = 0; k < n; ++k) {
          if (!from(k, i, &v)) return false;
          for (int b = 0; b < 8; ++b)
            acc[b] = static_cast<uint8_t>(acc[b] + static_cast<uint8_t>(v >> (8 * b)));
        }
        uint64_t out = 0;
        for (int b = 0; b < 8; ++b) out |= static_cast<uint64_t>(acc[b]) << (8 * b);
        store8(*recv[j], writes, at, out, payload - at);
      }
    }
    return true;
  };
  // This rank's waves, from its buffers (the host's launchBatch, with the kernel's warp count).
  std::vector<LlBatchMem> mem(ops.size());
  for (size_t j = 0; j < ops.size(); ++j) {
    mem[j].send = reinterpret_cast<uintptr_t>(send[j]->data());
    mem[j].sendBytes = sendBytes(ops[j].op, n);
    mem[j].recv = reinterpret_cast<uintptr_t>(recv[j]->data());
    mem[j].recvBytes = recvBytes(ops[j].op, n);
    mem[j].lines = llLines(llPayloadBytes(ops[j].op.count, ops[j].op.esz));
    mem[j].twin = ops[j].kind == BatchOp::kTwin ? static_cast<int>(j) - 1 : -1;
    while (mem[j].twin >= 0 && ops[static_cast<size_t>(mem[j].twin)].kind == BatchOp::kTwin)
      --mem[j].twin;
  }
  const LlWaves waves =
      llPlanWaves(mem.data(), static_cast<int>(ops.size()), kLaunchThreads / 32, bv.waves);
  for (size_t first = 0; first < ops.size();) {
    size_t end = first + 1;
    while (end < ops.size() && !((waves.startMask >> end) & 1u)) ++end;
    std::vector<size_t> order;
    for (size_t j = first; j < end; ++j) order.push_back(j);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t j : order) {
      push(j);
      jitter(rng, 50);
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t j : order)
      if (!receive(j)) return;
    first = end;
  }
  for (int k = 0; k < n; ++k) {
    uint64_t unused;
    if (k != r && !take(w, w.token(r, parity, k), flag, &unused,
                        [&] { return tag(0) + " token from rank " + std::to_string(k); }))
      return;
  }
}

// nBatches batches of 2-8 random one-CTA ops (within one slot's lines), some of the later ops
// depending on the op before (BatchOp's kinds); every rank's every output against reference().
std::vector<std::string> runBatchWorld(int n, int nBatches, unsigned seed, BatchVariant bv) {
  World w;
  w.n = n;
  w.v.deadlineS = bv.deadlineS;
  std::mt19937 rng(seed);
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  const uint64_t eszs[] = {1, 2, 4, 8};
  std::vector<std::vector<BatchOp>> batches;
  std::vector<std::vector<uint64_t>> bases;
  for (int b = 0; b < nBatches; ++b) {
    const int k = 2 + static_cast<int>(rng() % 7);
    std::vector<BatchOp> ops;
    std::vector<uint64_t> base;
    uint64_t lines = 0;
    for (int i = 0; i < k; ++i) {
      BatchOp bo;
      // An op of the previous one's shape reading or writing its buffers: AllReduce after an op
      // whose input and output are count elements (AllReduce, Broadcast, Reduce).
      const CollType prev = i > 0 ? ops.back().op.coll : CollType::AllGather;
      const bool shaped =
          prev == CollType::AllReduce || prev == CollType::Broadcast || prev == CollType::Reduce;
      const unsigned pick = static_cast<unsigned>(rng() % 6);
      const bool outOfPlace =
          i > 0 && (ops.back().kind == BatchOp::kFresh || ops.back().kind == BatchOp::kTwin);
      if (outOfPlace && pick == 5) {
        bo.kind = BatchOp::kTwin;
        bo.op = ops.back().op;
      } else if (shaped && pick < 3) {
        bo.kind = pick == 0 && prev == CollType::AllReduce ? BatchOp::kChained
                  : pick == 1                              ? BatchOp::kSameOutput
                                                           : BatchOp::kIntoInput;
        bo.op = ops.back().op;  // the same count and type
        bo.op.coll = CollType::AllReduce;
      } else {
        bo.op.coll = colls[rng() % 5];
        bo.op.esz = eszs[rng() % 4];
        bo.op.count = 1 + rng() % (kLlBytesPerCta / bo.op.esz);  // one CTA
        bo.op.root = static_cast<int>(rng() % static_cast<unsigned>(n));
      }
      const uint64_t l = llLines(llPayloadBytes(bo.op.count, bo.op.esz));
      if (lines + l > llSlotLines(n)) break;  // what one slot holds (launchBatch's rule)
      base.push_back(lines);
      lines += l;
      ops.push_back(bo);
    }
    batches.push_back(ops);
    bases.push_back(base);
  }
  w.allocate();
  // Every rank's buffers of every op, and the expected outputs, computed op by op in order.
  const size_t nb = batches.size();
  std::vector<std::vector<std::vector<std::vector<uint8_t>>>> sendBufs(nb), recvBufs(nb),
      want(nb);  // [b][i][rank]
  for (size_t b = 0; b < nb; ++b) {
    const size_t k = batches[b].size();
    sendBufs[b].resize(k);
    recvBufs[b].resize(k);
    want[b].resize(k);
    for (size_t i = 0; i < k; ++i) {
      const LlOp& op = batches[b][i].op;
      std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        if (batches[b][i].kind == BatchOp::kChained) {
          in[static_cast<size_t>(r)] = want[b][i - 1][static_cast<size_t>(r)];
        } else if (batches[b][i].kind == BatchOp::kTwin) {
          in[static_cast<size_t>(r)] = sendBufs[b][i - 1][static_cast<size_t>(r)];
        } else {
          in[static_cast<size_t>(r)].resize(sendBytes(op, n));
          for (uint64_t j = 0; j < in[static_cast<size_t>(r)].size(); ++j)
            in[static_cast<size_t>(r)][j] = inputByte(b * 16 + i + 1, r, j);
        }
        recvBufs[b][i].push_back(std::vector<uint8_t>(recvBytes(op, n), 0));
      }
      sendBufs[b][i] = in;
      for (int r = 0; r < n; ++r) {
        // Reduce's non-roots write nothing: their output stays as it was (zeros, or a chain's
        // input).
        want[b][i].push_back(op.coll == CollType::Reduce && r != op.root
                                 ? recvBufs[b][i][static_cast<size_t>(r)]
                                 : reference(op, n, r, in));
      }
    }
  }
  launchsim::runThreads(n, [&](int r) {
    const size_t rs = static_cast<size_t>(r);
    for (size_t b = 0; b < nb && !w.failures.stop; ++b) {
      const size_t k = batches[b].size();
      // The ops that depend on the one before share its buffers.
      std::vector<std::vector<uint8_t>*> send(k), recv(k);
      for (size_t i = 0; i < k; ++i) {
        send[i] = &sendBufs[b][i][rs];
        recv[i] = &recvBufs[b][i][rs];
        switch (batches[b][i].kind) {
          case BatchOp::kChained:
            send[i] = recv[i] = recv[i - 1];
            break;
          case BatchOp::kSameOutput:
            recv[i] = recv[i - 1];
            break;
          case BatchOp::kIntoInput:
            recv[i] = send[i - 1];
            break;
          case BatchOp::kTwin:
            send[i] = send[i - 1], recv[i] = recv[i - 1];
            break;
          case BatchOp::kFresh:
            break;
        }
      }
      runBatch(w, bv, r, b + 1, batches[b], bases[b], send, recv,
               static_cast<unsigned>(b * 131 + rs * 17));
      if (w.failures.stop) return;
      static const char* const kinds[] = {"", ", chained", ", same output as the op before",
                                          ", into the input of the op before",
                                          ", twin of the op before"};
      for (size_t i = 0; i < k; ++i) {
        // A buffer holds the output of the last op that writes it: check that op.
        bool overwritten = false;
        for (size_t j = i + 1; j < k; ++j) overwritten = overwritten || recv[j] == recv[i];
        if (overwritten) continue;
        if (*recv[i] != want[b][i][rs]) {
          size_t o = 0;
          while (o < recv[i]->size() && (*recv[i])[o] == want[b][i][rs][o]) ++o;
          w.failures.fail("batch " + std::to_string(b + 1) + " op " + std::to_string(i) + " (" +
                          collName(batches[b][i].op.coll) + kinds[batches[b][i].kind] + ") rank " +
                          std::to_string(r) + ": byte " + std::to_string(o) + " is " +
                          std::to_string((*recv[i])[o]) + ", want " +
                          std::to_string(want[b][i][rs][o]));
          return;
        }
      }
    }
  });
  return w.failures.list;
}

}  // namespace

// A variant that must fail: it did, and (needle non-empty) the first failure says so.
void requireCaught(const std::vector<std::string>& failures, const std::string& needle) {
  REQUIRE(!failures.empty());
  WARN("caught: " << failures.front());
  if (!needle.empty()) CHECK(failures.front().find(needle) != std::string::npos);
}

TEST_CASE("LL mode: lines, CTAs and the flag") {
  CHECK(llLines(1) == 1);
  CHECK(llLines(8) == 1);
  CHECK(llLines(9) == 2);
  // The slots: a parity's lines split among the ranks, the most one source sends one destination.
  CHECK(llMaxPayload(16) == 32768);
  CHECK(llMaxPayload(2) == 262144);
  CHECK(llMaxPayload(4) == 131072);
  CHECK(llMaxPayload(3) == 21845 * 8);
  for (int n = 2; n <= kMaxRanks; ++n) {
    INFO(n << " ranks");
    CHECK(llLines(llMaxPayload(n)) <=
          llSlotLines(n) / 4);  // an op takes at most a quarter of a slot
    // The last source's last line is inside the parity's lines; slots do not overlap.
    CHECK(llSlotLine(llSlotLines(n), n - 1, llSlotLines(n) - 1) < kLlSpaceLines);
    CHECK(llSlotLine(llSlotLines(n), 1, 0) ==
          llSlotLine(llSlotLines(n), 0, llSlotLines(n) - 1) + 1);
    CHECK(llTakes(llMaxPayload(n), ~0ull, n));
    CHECK(!llTakes(llMaxPayload(n) + 1, ~0ull, n));
  }
  CHECK(llTakes(8, 32768, 2));
  CHECK(!llTakes(0, 32768, 2));
  CHECK(!llTakes(4096, 0, 2));
  CHECK(!llTakes(4097, 4096, 2));
  // The limit: auto by ranks on the GPU, a number as asked, both capped by the slots.
  CHECK(llLimit(~0ull, 2, 1) == kLlAutoMaxBytes);
  CHECK(llLimit(~0ull, 4, 4) == kLlSharedMaxBytes);
  CHECK(llLimit(~0ull, 16, 1) == std::min<uint64_t>(kLlAutoMaxBytes, 32768));
  CHECK(llLimit(1u << 30, 2, 1) == 262144);
  CHECK(llLimit(1u << 30, 8, 1) == 65536);
  CHECK(llLimit(100, 8, 8) == 100);
  CHECK(llLimit(0, 2, 1) == 0);
  CHECK(llCtas(8, 16) == 1);
  CHECK(llCtas(32768, 16) == static_cast<int>(32768 / kLlBytesPerCta));
  CHECK(llCtas(32768, 2) == 2);
  CHECK(llCtas(262144, 32) == 32);
  CHECK(llFlag(0) == 1);
  CHECK(llFlag(1ull << 32) == 1);
  CHECK(llFlag(7) == 7);
  CHECK(llSends(CollType::Broadcast, 2, 0, 2));
  CHECK(!llSends(CollType::Broadcast, 1, 0, 2));
  CHECK(llSends(CollType::Reduce, 1, 3, 3));
  CHECK(!llSends(CollType::Reduce, 1, 2, 3));
  CHECK(llSendOffset(CollType::ReduceScatter, 10, 4, 3) == 120);
  CHECK(llSendOffset(CollType::AllGather, 10, 4, 3) == 0);
  // The CTAs' ranges tile the lines.
  for (uint64_t lines : {1ull, 2ull, 7ull, 4096ull}) {
    for (int nCtas : {1, 3, 4, 32}) {
      uint64_t next = 0;
      for (int c = 0; c < nCtas; ++c) {
        const LlRange lr = llCtaLines(lines, nCtas, c);
        if (lr.count == 0) continue;
        CHECK(lr.first == next);
        next = lr.first + lr.count;
      }
      CHECK(next == lines);
    }
  }
}

TEST_CASE("LL mode: CPU ranks and CTAs, random collectives back to back") {
  struct Cfg {
    int n, cap, ops;
  };
  for (Cfg c : {Cfg{2, 4, 150}, Cfg{3, 2, 100}, Cfg{4, 4, 80}, Cfg{8, 1, 40}, Cfg{5, 3, 60}}) {
    INFO("ranks " << c.n << ", CTA cap " << c.cap);
    const std::vector<std::string> failures = runWorld(
        c.n, c.cap, mktest::tsanScaled(c.ops), static_cast<unsigned>(c.n * 977 + c.cap), Variant{});
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("LL mode: captured collectives replayed, the device numbering them") {
  struct Cfg {
    int n, cap, ops, replays;
  };
  for (Cfg c : {Cfg{2, 4, 10, 5}, Cfg{3, 4, 8, 4}, Cfg{4, 2, 6, 4}}) {
    INFO("ranks " << c.n << ", CTA cap " << c.cap << ", " << c.ops << " ops x " << c.replays
                  << " replays");
    const std::vector<std::string> failures =
        runWorld(c.n, c.cap, mktest::tsanScaled(c.ops), static_cast<unsigned>(c.n * 5003 + c.cap),
                 Variant{}, false, c.replays);
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("LL mode: a flag that wraps every other op is harmless when consumed lines are zeroed") {
  Variant v;
  v.flagPeriod = 2;
  const std::vector<std::string> failures = runWorld(3, 4, mktest::tsanScaled(120), 31337u, v);
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

TEST_CASE("LL mode: without zeroing, a wrapped flag takes a stale line") {
  Variant v;
  v.flagPeriod = 2;
  v.zero = false;
  v.deadlineS = 3;
  requireCaught(runWorld(3, 4, 120, 4242u, v), "stale one taken");
}

TEST_CASE(
    "LL mode: without the tokens, a non-root runs ahead of the root and overwrites its lines") {
  Variant v;
  v.tokens = false;
  v.deadlineS = 3;
  requireCaught(runWorld(3, 2, 200, 777u, v, /*onlyReduceRoot0=*/true), "overwritten");
}

TEST_CASE("LL batches as one exchange: random one-CTA ops, chains in place, one token per batch") {
  for (int n : {2, 3, 4, 8}) {
    INFO(n << " ranks");
    const std::vector<std::string> failures = runBatchWorld(
        n, mktest::tsanScaled(n == 8 ? 40 : 80), static_cast<unsigned>(n * 7919), BatchVariant{});
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

TEST_CASE(
    "LL batches as one exchange: in one wave, an op that depends on the one before reads or writes "
    "out of order") {
  BatchVariant bv;
  bv.waves = false;
  bv.deadlineS = 3;
  const std::vector<std::string> failures = runBatchWorld(3, 80, 1234u, bv);
  requireCaught(failures, "");
  // (Which dependent op fails first depends on the threads' timing.)
  CHECK((failures.front().find("chained") != std::string::npos ||
         failures.front().find("the op before") != std::string::npos));
}

TEST_CASE(
    "LL batches: the waves split where an op depends on one of the current wave, and share the "
    "warps") {
  auto mem = [](uint64_t send, uint64_t recv, uint64_t lines) {
    return LlBatchMem{send, 64, recv, 64, lines, -1};
  };
  // Independent ops: one wave, one warp each, the spare warps to the op with the most lines.
  LlBatchMem a[3] = {mem(0x1000, 0x2000, 1), mem(0x3000, 0x4000, 100), mem(0x5000, 0x6000, 1)};
  LlWaves w = llPlanWaves(a, 3, 8);
  CHECK(w.startMask == 0);
  CHECK(w.waves == 1);
  CHECK(w.warpCount[0] == 1);
  CHECK(w.warpCount[1] == 6);
  CHECK(w.warpCount[2] == 1);
  CHECK(w.warpFirst[1] == 1);
  CHECK(w.warpFirst[2] == 7);
  // Op 1 reads op 0's output, op 2 writes op 1's input, op 3 writes op 2's output: a wave each.
  // Op 4's input [0x2040, 0x2080) touches op 3's output [0x2000, 0x2040) without overlapping it.
  LlBatchMem b[5] = {mem(0x1000, 0x2000, 4), mem(0x2000, 0x7000, 4), mem(0x8000, 0x2000, 4),
                     mem(0x9000, 0x2000, 4), mem(0x2040, 0xa000, 4)};
  w = llPlanWaves(b, 5, 8);
  CHECK(w.startMask == ((1u << 1) | (1u << 2) | (1u << 3)));
  CHECK(w.waves == 4);
  CHECK(w.warpCount[3] == 4);
  CHECK(w.warpCount[4] == 4);
  CHECK(w.warpFirst[4] == 4);
  // More ops than warps: a new wave.
  LlBatchMem c[3] = {mem(0x1000, 0x2000, 1), mem(0x3000, 0x4000, 1), mem(0x5000, 0x6000, 1)};
  w = llPlanWaves(c, 3, 2);
  CHECK(w.startMask == (1u << 2));
  CHECK(w.warpCount[2] == 2);
  // split false: one wave whatever the memory.
  CHECK(llPlanWaves(b, 5, 8, false).startMask == 0);
  // Twins: op 1 repeats op 0 (one wave, though it writes op 0's output), op 2 repeats it too, and
  // op 3, on op 0's output but not its twin, starts a wave.
  LlBatchMem t[4] = {mem(0x1000, 0x2000, 4), mem(0x1000, 0x2000, 4), mem(0x1000, 0x2000, 4),
                     mem(0x1000, 0x2000, 4)};
  t[1].twin = 0;
  t[2].twin = 0;
  w = llPlanWaves(t, 4, 8);
  CHECK(w.startMask == (1u << 3));
  CHECK(w.waves == 2);
  // A twin is no twin of an op of an earlier wave: op 2 repeats op 0, but op 1 wrote op 0's input
  // in between, so op 2 (reading it) waits for op 1.
  LlBatchMem u[3] = {mem(0x1000, 0x2000, 4), mem(0x5000, 0x1000, 4), mem(0x1000, 0x2000, 4)};
  u[2].twin = 0;
  w = llPlanWaves(u, 3, 8);
  CHECK(w.startMask == ((1u << 1) | (1u << 2)));
  // A grid of 32 CTAs (256 warps): shares in proportion to the lines, every warp used once.
  LlBatchMem d[4] = {mem(0x1000, 0x2000, 1), mem(0x3000, 0x4000, 16384), mem(0x5000, 0x6000, 8192),
                     mem(0x7000, 0x8000, 3)};
  w = llPlanWaves(d, 4, 256);
  CHECK(w.waves == 1);
  CHECK(w.warpCount[0] == 1);
  CHECK(w.warpCount[3] == 1);
  CHECK(w.warpCount[1] + w.warpCount[2] == 254);
  CHECK(w.warpCount[1] >= 168);  // 16384 of 24580 lines: two thirds of the 252 spare warps
  CHECK(w.warpFirst[3] == 255);
}

TEST_CASE("LL batches as one exchange: without the line offsets, the ops' lines collide") {
  BatchVariant bv;
  bv.offsets = false;
  bv.deadlineS = 3;
  requireCaught(runBatchWorld(3, 80, 5678u, bv), "");
}
