// The proxy thread of one rank (docs/PROXY.md): it consumes the
// command ring of proxy_ring.h and moves the bytes with net::Net (TCP or verbs).
//
// Setup is collective over the ranks that exchange data (the caller carries the handles, e.g.
// over the bootstrap): listenHandles() -> exchange -> connectAll() -> registerRegion() ->
// start(). The thread then runs until stop(): it takes commands from the ring in order, keeps one
// FIFO of pending transfers per peer and direction (so a peer's sends and receives are posted in
// ring order, as tag matching between two ranks requires), retries an isend/irecv the transport
// answered with back-pressure, tests what is in flight, and bumps the command's completion counter
// when its transfer is done. Any transport error, or a command that names an unknown peer or
// memory outside the registered regions, stops the proxy: ProxyFlags::failed is raised for the
// producer and error() says which rank, peer and command failed.
//
// Channels. A proxy may serve several rings, one per producer (a CTA of the kernel), each with
// its own flags and its own connection to every peer, as NCCL's channels have. Channel c's
// commands travel only on channel c's connections, in channel c's ring order, so producers need
// no order between each other, and a transfer waiting on one channel (a receive whose sender is
// late) holds up nothing on another. Every rank must create the same number of channels: the
// handles for a peer carry one listen handle per channel, and connectAll checks their size.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "transport/net/net.h"
#include "transport/proxy/proxy_ring.h"

namespace mkernel {
namespace proxy {

using Handle = std::vector<uint8_t>;  // net::kHandleSize bytes

// One producer's ring and the completion counters the proxy bumps for it.
struct ProxyChannel {
  ProxyRing* ring = nullptr;
  ProxyFlags* flags = nullptr;
};

class Proxy {
 public:
  // `ring` and `flags` live in memory both sides see (host-mapped for a GPU producer); the caller
  // owns them and zeroes them before start(). `net` outlives the proxy.
  Proxy(net::Net* net, int dev, int rank, int nRanks, ProxyRing* ring, ProxyFlags* flags);
  // Several channels (at least one; every rank the same number).
  Proxy(net::Net* net, int dev, int rank, int nRanks, std::vector<ProxyChannel> channels);
  ~Proxy();
  // How messages name this proxy and its peers (the error text, pendingSummary): by default
  // "rank r: proxy" and "rank p", the proxy's own numbering. The hierarchical communicator's
  // proxy numbers nodes: setNames("rank 5 (node 2, rail 1)", "node") says so. Before start().
  void setNames(const std::string& self, const std::string& peerNoun);
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Step 1: one handle per peer (entry p goes to rank p; the own entry stays empty), holding one
  // listen handle per channel (channels() x net::kHandleSize bytes).
  Result listenHandles(std::vector<Handle>* out);
  // Step 2: `fromPeers[p]` is the handle rank p made for this rank. Connects to every peer and
  // accepts every peer's connection on every channel, bounded by MKERNEL_TIMEOUT_S.
  Result connectAll(const std::vector<Handle>& fromPeers);
  // Memory commands may point into (host memory, or GPU memory where the transport supports it:
  // net::PtrType). Registered with every connection.
  Result registerRegion(void* base, size_t bytes, int ptrType);
  // Receives into memory that the NIC writes without the GPU's ordering (GPU memory registered
  // through DMA-BUF or nvidia-peermem, on a GPU whose GPUDirect RDMA writes are not ordered for
  // its own kernels): after each receive completes, a transport flush (net::Net::iflush, a read
  // through the NIC, as NCCL's proxy does) before its flag is raised, so that the kernel waiting
  // on the flag reads the bytes that landed. Transports that need none answer with no request.
  // Before start().
  void setFlushReceives(bool on) { flushReceives_ = on; }
  // Starts the thread, pinned to `cpus` when not empty (the topology placement's proxy CPUs,
  // coll::proxyCpusFor); a pinning the OS refuses is a warning, and the thread runs unpinned.
  Result start(const std::vector<int>& cpus);
  // Stops the thread (pending transfers are abandoned) and closes every connection.
  Result stop();

  // Whether the proxy stopped on an error, and the error's message.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string error() const;

  int channels() const { return static_cast<int>(channels_.size()); }
  // The CPUs the proxy thread may run on, as the OS reports them (empty when it is not running).
  std::vector<int> threadCpus();

  // Counters for tests and benchmarks (all channels).
  uint64_t commandsTaken() const { return taken_.load(std::memory_order_relaxed); }
  uint64_t transfersDone() const { return done_.load(std::memory_order_relaxed); }
  // Receives whose flush went through a transport request (setFlushReceives).
  uint64_t receivesFlushed() const { return flushed_.load(std::memory_order_relaxed); }
  // What is still in flight, for a hang's report (a kernel that gave up waiting for its
  // transfers: KernelCommunicator::kernelError): the commands taken and transfers done, and each
  // link's pending transfers in ring order (channel, peer, command, tag, bytes, posted or not yet
  // accepted by the transport; four per queue at most), or "nothing pending". Safe from any
  // thread: while the proxy thread runs, it writes the summary itself at its next turn of the
  // loop, and the caller waits up to `wait` for it ("the proxy thread did not answer" after
  // that); once the thread has left its loop, the caller's thread reads the queues.
  std::string pendingSummary(std::chrono::milliseconds wait = std::chrono::milliseconds(1000));

 private:
  struct Region {
    uintptr_t base = 0;
    size_t bytes = 0;
    std::vector<void*> sendMr;  // per link (link())
    std::vector<void*> recvMr;  // per link
  };
  struct Pending {
    ProxyCmd cmd;
    void* mhandle = nullptr;
    net::Request* request = nullptr;  // null until the transport accepted it
    bool arrived = false;             // the transfer completed (request consumed by test)
    net::Request* flush = nullptr;    // a receive's flush in flight (setFlushReceives)
  };

  // Connections, MRs and queues are per link: channel c, peer p.
  size_t link(int c, int p) const {
    return static_cast<size_t>(c) * static_cast<size_t>(nRanks_) + static_cast<size_t>(p);
  }
  void loop();
  bool takeCommands(int c);            // channel c's new commands; false once failed
  bool progressLink(int c, int peer);  // posts and tests that link's queues; false on error
  bool mhandleFor(int c, const ProxyCmd& cmd, void** mh);
  void fail(const std::string& what);  // records the first error, raises every channel's flags
  std::string queueState(int c, int peer) const;  // the pending transfers of a link, for errors
  std::string linkState(int c, int peer) const;   // queueState without the counters
  std::string pendingNow() const;                 // pendingSummary, on the queues' thread
  uint64_t
  serveSummary();  // the proxy thread answers pendingSummary (the requests up to the one returned)
  std::string who(int c) const;       // "<self>: proxy" (+ " channel c" with several)
  std::string peerName(int p) const;  // "<noun> p"
  void closeAll();

  net::Net* net_;
  int dev_;
  int rank_;
  int nRanks_;
  std::string self_;               // setNames: who this proxy serves ("rank r" by default)
  std::string peerNoun_ = "rank";  // ... and what its peers are
  std::vector<ProxyChannel> channels_;
  uint64_t timeoutNs_;
  std::vector<net::ListenComm*> listen_;  // per link
  std::vector<net::SendComm*> send_;
  std::vector<net::RecvComm*> recv_;
  std::vector<Region> regions_;
  std::vector<std::deque<Pending>> sends_;  // per link, ring order
  std::vector<std::deque<Pending>> recvs_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> taken_{0};
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> flushed_{0};
  bool flushReceives_ = false;
  // pendingSummary's requests (a count) and answers: the proxy thread owns the queues.
  std::atomic<bool> looping_{false};
  std::atomic<uint64_t> summaryWanted_{0};
  std::mutex summaryMu_;
  std::condition_variable summaryCv_;
  uint64_t summaryServed_ = 0;  // guarded by summaryMu_, as summary_
  std::string summary_;
  mutable std::mutex errorMu_;
  std::string error_;
};

}  // namespace proxy
}  // namespace mkernel
