// Wire formats of the bootstrap: the unique id and the messages of the rendezvous. Everything a
// peer sends is checked (magic, version, nonce, rank range, sizes) before it is used.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include "transport/bootstrap/bootstrap.h"

namespace mkernel {
namespace bootstrap {

constexpr uint64_t kIdMagic = 0x44494c4e524b4d2eull;  // ".MKRNLID"
constexpr uint32_t kWireVersion = 1;
constexpr uint64_t kHelloMagic = 0x4f4c4c45484b4d2eull;  // ".MKHELLO"
constexpr uint64_t kPeerMagic = 0x524545504b4d2e2eull;   // "..MKPEER"
constexpr int kMaxRanks = 1 << 20;
constexpr uint64_t kMaxMessageBytes = 1ull << 30;  // larger frames are rejected as malformed

// A socket address big enough for IPv4 and IPv6.
struct SockAddr {
  union {
    sockaddr sa;
    sockaddr_in sin;
    sockaddr_in6 sin6;
  };
  socklen_t len() const {
    return sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
};

// Layout of UniqueId::bytes (128 bytes).
struct IdWire {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t nonce;
  SockAddr root;
};
static_assert(sizeof(IdWire) <= 128, "the unique id is NCCL_UNIQUE_ID_BYTES long");

// rank -> root, once: who I am and where I listen.
static_assert(sizeof(IdWire) <= kUniqueIdUsedBytes,
              "the unique id's wire form fits the bytes bootstrap.h reserves");

struct HelloWire {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t nRanks;
  int32_t pad;
  uint64_t nonce;
  SockAddr listen;
};

// Opening message of a rank-to-rank connection.
struct PeerHelloWire {
  uint64_t magic;
  uint64_t nonce;
  int32_t rank;
  int32_t pad;
};

// Header of every message on a rank-to-rank connection.
struct FrameHeader {
  int32_t tag;
  uint32_t pad;
  uint64_t size;
};

}  // namespace bootstrap
}  // namespace mkernel
