#include "transport/bootstrap/validate.h"

#include <cstring>

namespace mkernel {
namespace bootstrap {
namespace {

bool fail(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return false;
}

bool isConnectable(const SockAddr& a) {
  if (a.sa.sa_family == AF_INET) return a.sin.sin_port != 0;
  if (a.sa.sa_family == AF_INET6) return a.sin6.sin6_port != 0;
  return false;
}

}  // namespace

bool parseUniqueId(const void* bytes, size_t size, IdWire* out, std::string* why) {
  if (bytes == nullptr || size < sizeof(IdWire))
    return fail(why, "unique id shorter than " + std::to_string(sizeof(IdWire)) + " bytes");
  IdWire w;
  std::memcpy(&w, bytes, sizeof(w));
  if (w.magic != kIdMagic) return fail(why, "not an mkernel unique id (magic)");
  if (w.version != kWireVersion)
    return fail(why, "unique id of wire version " + std::to_string(w.version) +
                         ", this build speaks " + std::to_string(kWireVersion));
  if (!isConnectable(w.root)) return fail(why, "unique id names no connectable root address");
  if (out != nullptr) *out = w;
  return true;
}

bool validateHello(const HelloWire& h, uint64_t nonce, int knownNRanks, const uint8_t* rankTaken,
                   std::string* why) {
  if (h.magic != kHelloMagic) return fail(why, "bad hello magic");
  if (h.version != kWireVersion)
    return fail(why, "hello of wire version " + std::to_string(h.version));
  if (h.nonce != nonce) return fail(why, "hello for another rendezvous (nonce)");
  if (h.nRanks <= 0 || h.nRanks > kMaxRanks)
    return fail(why, "hello with nRanks " + std::to_string(h.nRanks));
  if (h.rank < 0 || h.rank >= h.nRanks)
    return fail(why,
                "hello with rank " + std::to_string(h.rank) + " of " + std::to_string(h.nRanks));
  if (knownNRanks > 0 && h.nRanks != knownNRanks)
    return fail(why, "hello with nRanks " + std::to_string(h.nRanks) + ", others said " +
                         std::to_string(knownNRanks));
  if (knownNRanks > 0 && rankTaken != nullptr && rankTaken[h.rank])
    return fail(why, "second hello from rank " + std::to_string(h.rank));
  if (!isConnectable(h.listen))
    return fail(why, "hello from rank " + std::to_string(h.rank) + " with no connectable address");
  return true;
}

bool validatePeerHello(const PeerHelloWire& h, uint64_t nonce, int nRanks, std::string* why) {
  if (h.magic != kPeerMagic) return fail(why, "bad peer hello magic");
  if (h.nonce != nonce) return fail(why, "peer hello for another rendezvous (nonce)");
  if (h.rank < 0 || h.rank >= nRanks)
    return fail(why,
                "peer hello with rank " + std::to_string(h.rank) + " of " + std::to_string(nRanks));
  return true;
}

bool validateFrameHeader(const FrameHeader& fh, std::string* why) {
  if (fh.size > kMaxMessageBytes)
    return fail(why, "frame of " + std::to_string(fh.size) + " bytes (limit " +
                         std::to_string(kMaxMessageBytes) + ")");
  return true;
}

bool validateAddressTable(const SockAddr* table, int nRanks, std::string* why) {
  if (table == nullptr || nRanks <= 0 || nRanks > kMaxRanks)
    return fail(why, "empty address table");
  for (int r = 0; r < nRanks; ++r)
    if (!isConnectable(table[r]))
      return fail(why, "address table entry of rank " + std::to_string(r) + " is not connectable");
  return true;
}

}  // namespace bootstrap
}  // namespace mkernel
