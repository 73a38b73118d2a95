// libFuzzer target: the bootstrap's pure wire checks (transport/bootstrap/validate.h) on arbitrary
// bytes. Input: one selector byte, then the bytes of the wire struct (zero-padded when short).
// Besides "no crash, no UB" it checks that whatever a validator accepts really is safe to use:
// ranks in range, sizes under the limit, addresses connectable.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "transport/bootstrap/validate.h"

using namespace mkernel::bootstrap;

namespace {

constexpr uint64_t kNonce = 0x0123456789abcdefull;  // the seeds carry this nonce

template <typename T>
T decode(const uint8_t* data, size_t size) {
  T t;
  std::memset(&t, 0, sizeof(t));
  std::memcpy(&t, data, size < sizeof(t) ? size : sizeof(t));
  return t;
}

bool connectable(const SockAddr& a) {
  return (a.sa.sa_family == AF_INET && a.sin.sin_port != 0) ||
         (a.sa.sa_family == AF_INET6 && a.sin6.sin6_port != 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t selector = data[0] % 5;
  ++data;
  --size;
  std::string why;
  switch (selector) {
    case 0: {  // unique id, as given to Bootstrap::create (exactly 128 bytes, or truncated)
      IdWire w;
      if (parseUniqueId(data, size, &w, &why)) {
        FUZZ_CHECK(size >= sizeof(IdWire) && w.magic == kIdMagic && w.version == kWireVersion);
        FUZZ_CHECK(connectable(w.root));
      } else {
        FUZZ_CHECK(!why.empty());
      }
      break;
    }
    case 1: {  // a rank's hello at the root; the first byte after it says what the root knows
      HelloWire h = decode<HelloWire>(data, size);
      int known = size > sizeof(h) ? (data[sizeof(h)] % 2 ? 1 + data[sizeof(h)] % 7 : -1) : -1;
      std::vector<uint8_t> taken(known > 0 ? known : 0);
      for (size_t i = 0; i < taken.size() && sizeof(h) + 1 + i < size; ++i)
        taken[i] = data[sizeof(h) + 1 + i] & 1;
      if (validateHello(h, kNonce, known, taken.data(), &why)) {
        FUZZ_CHECK(h.nRanks > 0 && h.nRanks <= kMaxRanks && h.rank >= 0 && h.rank < h.nRanks);
        FUZZ_CHECK(known < 0 || (h.nRanks == known && !taken[h.rank]));
        FUZZ_CHECK(h.nonce == kNonce && connectable(h.listen));
      } else {
        FUZZ_CHECK(!why.empty());
      }
      break;
    }
    case 2: {  // a peer hello on a rank-to-rank connection
      PeerHelloWire h = decode<PeerHelloWire>(data, size);
      int nRanks = size > sizeof(h) ? 1 + data[sizeof(h)] % 16 : 4;
      if (validatePeerHello(h, kNonce, nRanks, &why))
        FUZZ_CHECK(h.rank >= 0 && h.rank < nRanks && h.magic == kPeerMagic && h.nonce == kNonce);
      else
        FUZZ_CHECK(!why.empty());
      break;
    }
    case 3: {  // a frame header: an accepted size must be one the receiver can allocate
      FrameHeader fh = decode<FrameHeader>(data, size);
      if (validateFrameHeader(fh, &why))
        FUZZ_CHECK(fh.size <= kMaxMessageBytes);
      else
        FUZZ_CHECK(!why.empty());
      break;
    }
    default: {  // the root's address table, as many whole entries as the input holds
      int n = static_cast<int>(size / sizeof(SockAddr));
      std::vector<SockAddr> table(n > 0 ? n : 1);
      if (n > 0) std::memcpy(table.data(), data, n * sizeof(SockAddr));
      if (validateAddressTable(n > 0 ? table.data() : nullptr, n, &why)) {
        for (int r = 0; r < n; ++r) FUZZ_CHECK(connectable(table[r]));
      } else {
        FUZZ_CHECK(!why.empty());
      }
      break;
    }
  }
  return 0;
}
