// The GPU-to-proxy command ring (docs/PROXY.md).
//
// A producer (a GPU CTA of the persistent kernel; in CPU tests, a thread playing the GPU) writes
// commands into a ring in host-mapped memory; the rank's proxy thread consumes them in order and
// drives net::Net: a Send command becomes an isend to a peer, a Recv command an irecv from one.
// When a command's transfer completes, the proxy bumps a completion counter (ProxyFlags::count)
// that the producer polls. For a Recv the counter moves only after the transport reported the
// receive complete (and, for GPU memory, flushed), which orders the data before the flag: the
// producer never sees a flag ahead of its bytes.
//
// Single producer, single consumer per ring. The slot's `seq` (its ring position + 1) is written
// last with release semantics: a slot is valid when seq matches, so the consumer needs no head
// pointer; the consumer publishes `tail` after it has copied a command out (the slot is free).
//
// This header is plain C++ usable from .cu files: the functions are host+device, with the device
// half (fences, %globaltimer) compiled only by nvcc.
#pragma once

#include <cstdint>

#include <atomic>
#include <chrono>
#include <thread>

#if defined(__CUDACC__)
#define MK_PROXY_HD __host__ __device__
#else
#define MK_PROXY_HD
#endif

namespace mkernel {
namespace proxy {

constexpr uint32_t kRingSlots = 256;  // power of two
constexpr uint32_t kMaxFlags = 64;    // completion counters per ring
static_assert((kRingSlots & (kRingSlots - 1)) == 0, "ring size must be a power of two");

enum ProxyOp : uint32_t {
  kOpSend = 1,  // isend `bytes` at `addr` to `peer` with `tag`
  kOpRecv = 2,  // irecv up to `bytes` into `addr` from `peer` with `tag`
};

struct alignas(64) ProxyCmd {
  uint64_t seq;    // ring position + 1, written last (release): the slot holds a valid command
  uint32_t op;     // ProxyOp
  int32_t peer;    // rank of the peer in the proxy's communicator
  uint64_t addr;   // data, inside a region registered with the proxy
  uint64_t bytes;  // size to send, or the largest size to receive
  int32_t tag;     // matched between a Send and the peer's Recv
  uint32_t flag;   // index of the completion counter to bump (< kMaxFlags)
  uint64_t pad[3];
};
static_assert(sizeof(ProxyCmd) == 64, "ProxyCmd is one cache line");

struct alignas(64) ProxyRing {
  uint64_t head;  // producer-owned: commands posted so far
  uint64_t pad0[7];
  uint64_t tail;  // consumer-owned: commands taken so far (their slots are free again)
  uint64_t pad1[7];
  ProxyCmd cmd[kRingSlots];
};

// Written by the proxy, read by the producer.
struct alignas(64) ProxyFlags {
  uint64_t count[kMaxFlags];  // completions per flag index (monotonic)
  uint32_t failed;            // 1 once the proxy stopped on an error (Proxy::error() says why)
  uint32_t pad[15];
};

// ---- memory ordering, host and device
// ------------------------------------------------------------

MK_PROXY_HD inline uint64_t loadAcquire64(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MK_PROXY_HD inline void storeRelease64(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

MK_PROXY_HD inline uint32_t loadRelaxed32(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint32_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

MK_PROXY_HD inline uint64_t proxyNowNs() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

MK_PROXY_HD inline void proxyBackoff() {
#if defined(__CUDA_ARCH__)
  __nanosleep(200);
#else
  std::this_thread::yield();
#endif
}

enum class PostStatus { kPosted, kTimedOut, kProxyFailed };

// What the producer knows of its ring, kept where it can read it cheaply: on a GPU, device memory
// (DeviceState), since every read of the host-mapped ring is a round trip over PCIe. `head` is the
// commands it has posted (ring->head mirrors it for the host), `tailSeen` the consumer's tail as
// last read: the ring is read again only when that says there is no room.
struct ProxyProducer {
  uint64_t head;
  uint64_t tailSeen;
};

MK_PROXY_HD inline void storeRelaxed64(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#elif defined(__SANITIZE_THREAD__)
  // ThreadSanitizer does not model fences (scripts/test.sh tsan): there the store after
  // fenceRelease() is itself a release store, which orders at least as much.
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}

// A release fence at system scope: the stores before it are visible to whoever acquires a store
// after it (the seq fields below).
MK_PROXY_HD inline void fenceRelease() {
#if defined(__CUDA_ARCH__)
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

// Producer side, a batch of n commands (n <= kRingSlots) in three calls:
//   proxyReserve   waits until n slots are free (gives up after timeoutNs, or at once when the
//                  proxy has failed);
//   proxyWrite     writes command i of the batch into its slot, all but seq;
//   proxyPublish   one release fence, then every slot's seq, then ring->head.
// One fence and no read of the ring per batch when there is room, where proxyPost pays a read of
// head and tail and a release store per command. Single producer per ring.
MK_PROXY_HD inline PostStatus proxyReserve(const ProxyRing* ring, const ProxyFlags* flags,
                                           ProxyProducer* pr, uint32_t n, uint64_t timeoutNs) {
  if (n > kRingSlots) return PostStatus::kTimedOut;  // could never fit
  uint64_t start = 0;
  while (pr->head + n - pr->tailSeen > kRingSlots) {
    pr->tailSeen = loadAcquire64(&ring->tail);
    if (pr->head + n - pr->tailSeen <= kRingSlots) break;
    if (loadRelaxed32(&flags->failed)) return PostStatus::kProxyFailed;
    const uint64_t now = proxyNowNs();
    if (start == 0) start = now;
    if (now - start > timeoutNs) return PostStatus::kTimedOut;
    proxyBackoff();
  }
  return PostStatus::kPosted;
}

MK_PROXY_HD inline void proxyWrite(ProxyRing* ring, const ProxyProducer& pr, uint32_t i,
                                   const ProxyCmd& cmd) {
  ProxyCmd* slot = &ring->cmd[(pr.head + i) & (kRingSlots - 1)];
  slot->op = cmd.op;
  slot->peer = cmd.peer;
  slot->addr = cmd.addr;
  slot->bytes = cmd.bytes;
  slot->tag = cmd.tag;
  slot->flag = cmd.flag;
}

MK_PROXY_HD inline void proxyPublish(ProxyRing* ring, ProxyProducer* pr, uint32_t n) {
  if (n == 0) return;
  fenceRelease();  // the fields (and whatever the commands point at) before any seq
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t pos = pr->head + i;
    storeRelaxed64(&ring->cmd[pos & (kRingSlots - 1)].seq, pos + 1);
  }
  pr->head += n;
  ring->head = pr->head;
}

// Producer side. Posts one command (its seq field is ignored: the slot gets its own), waiting
// while the ring is full; reads ring->head and ring->tail (a batch through ProxyProducer does
// not). Gives up after timeoutNs, or at once when the proxy has failed. Single producer per ring.
MK_PROXY_HD inline PostStatus proxyPost(ProxyRing* ring, const ProxyFlags* flags,
                                        const ProxyCmd& cmd, uint64_t timeoutNs) {
  ProxyProducer pr{ring->head, 0};
  const PostStatus st = proxyReserve(ring, flags, &pr, 1, timeoutNs);
  if (st != PostStatus::kPosted) return st;
  proxyWrite(ring, pr, 0, cmd);
  proxyPublish(ring, &pr, 1);
  return PostStatus::kPosted;
}

enum class WaitStatus { kReached, kTimedOut, kProxyFailed };

// Producer side: waits until completion counter `flag` reaches `target`.
MK_PROXY_HD inline WaitStatus proxyWaitFlag(const ProxyFlags* flags, uint32_t flag, uint64_t target,
                                            uint64_t timeoutNs) {
  uint64_t start = 0;
  while (loadAcquire64(&flags->count[flag]) < target) {
    if (loadRelaxed32(&flags->failed)) return WaitStatus::kProxyFailed;
    const uint64_t now = proxyNowNs();
    if (start == 0) start = now;
    if (now - start > timeoutNs) return WaitStatus::kTimedOut;
    proxyBackoff();
  }
  return WaitStatus::kReached;
}

}  // namespace proxy
}  // namespace mkernel
