// Pure checks of everything a bootstrap peer sends (docs/RELIABILITY.md). They take the decoded
// wire struct and the facts the receiver knows, touch no socket and no global state, so that the
// fuzzers (tests/fuzz) can drive them directly with arbitrary bytes. Each returns false with the
// reason in *why (when why is not null).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/bootstrap/wire.h"

namespace mkernel {
namespace bootstrap {

// The 128-byte unique id: magic, version, and a root address that can be connected to.
bool parseUniqueId(const void* bytes, size_t size, IdWire* out, std::string* why);

// A rank's hello at the root. knownNRanks is -1 until the first valid hello fixed it;
// rankTaken[rank] != 0 says that rank already said hello (may be null when knownNRanks < 0).
bool validateHello(const HelloWire& h, uint64_t nonce, int knownNRanks, const uint8_t* rankTaken,
                   std::string* why);

// The opening message of a rank-to-rank connection.
bool validatePeerHello(const PeerHelloWire& h, uint64_t nonce, int nRanks, std::string* why);

// The header of a rank-to-rank message.
bool validateFrameHeader(const FrameHeader& fh, std::string* why);

// The address table the root sends back: every entry a connectable IPv4/IPv6 address.
bool validateAddressTable(const SockAddr* table, int nRanks, std::string* why);

}  // namespace bootstrap
}  // namespace mkernel
