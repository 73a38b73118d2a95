// transport/bootstrap: mkernel's own TCP rendezvous (docs/TRANSPORT.md, bootstrap).
//
// The 128-byte unique id that the shim hands out (ncclGetUniqueId) carries a magic, a version,
// the root's listening address and a random nonce. Rank 0's process runs the root: every rank
// connects to it, sends its own listening address, and receives everyone's; ranks then talk
// directly (a full mesh of sockets, made lazily). Every wait is bounded by MKERNEL_TIMEOUT_S and
// polls the abort flag; every message is checked (magic, version, nonce, rank, size).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"

namespace mkernel {
namespace bootstrap {

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
// The leading bytes of the id the bootstrap uses (its wire form, wire.h: IdWire); the rest is free
// for the shim (which keeps the real NCCL's id there). wire.h pins it with a static_assert.
constexpr size_t kUniqueIdUsedBytes = 56;
struct UniqueId {
  char bytes[kUniqueIdBytes];
};

// Creates a new id and starts the root listener in this process (a background thread that serves
// one rendezvous, then exits). The root address is chosen like NCCL's: MKERNEL_SOCKET_IFNAME, else
// the first non-loopback IPv4 interface, else loopback.
Result createUniqueId(UniqueId* id);

// Whether `id` is one of ours (magic and version), i.e. not a real NCCL unique id.
bool isMkernelId(const UniqueId& id);

class Bootstrap {
 public:
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // Collective over all nRanks ranks (threads or processes). Bounded by MKERNEL_TIMEOUT_S.
  static Result create(const UniqueId& id, int rank, int nRanks, std::unique_ptr<Bootstrap>* out);

  int rank() const { return rank_; }
  int nRanks() const { return nRanks_; }

  // data holds nRanks slots of `size` bytes; this rank's slot is filled on entry.
  Result allGather(void* data, size_t size);
  Result broadcast(void* data, size_t size, int root);
  Result barrier();
  // Point-to-point, matched by (peer, tag), in order per (peer, tag).
  Result send(int peer, int tag, const void* data, size_t size);
  Result recv(int peer, int tag, void* data, size_t size);

  // Makes every current and future wait of this bootstrap return an error promptly.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // A host identity shared by ranks of one host (hostname + boot id hash), for grouping ranks
  // into nodes; the emulation overrides it with MKERNEL_RANKS_PER_NODE.
  static uint64_t hostHash();

 private:
  struct Impl;
  Bootstrap(int rank, int nRanks);
  int rank_;
  int nRanks_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<Impl> impl_;
};

}  // namespace bootstrap
}  // namespace mkernel
