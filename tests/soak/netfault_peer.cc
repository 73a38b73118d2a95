// netfault_peer: one side of a TCP net::Net transfer for scripts/test.sh netfault, which runs the
// two sides in two network namespaces joined by a veth pair with rate limits, drops or a cut link
// in between (docs/RELIABILITY.md). Not a unit test: a plain executable driven by the script.
//   netfault_peer recv <handle-file> <messages> <bytes>   listens, writes the handle, verifies
//   netfault_peer send <handle-file> <messages> <bytes>   waits for the handle file, connects,
//   sends
// Prints one line "result=<ok|error> code=<mkernel::Result as int, 6 = RemoteError> messages=<n>
// seconds=<s> error_after_progress_s=<s> msg=<...>" and exits 0 on success, 2 on a transport error
// (a clean failure), 1 on a wrong byte or misuse.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "transport/net/net.h"

using namespace mkernel;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

uint8_t patternByte(uint64_t msg, size_t i) {
  return static_cast<uint8_t>((msg * 131) ^ (i * 7) ^ (i >> 9));
}

Result gLastResult = Result::Success;  // what the failing net::Net call returned

int report(const char* result, int messages, Clock::time_point t0, Clock::time_point lastProgress,
           const std::string& msg, int rc) {
  std::printf("result=%s code=%d messages=%d seconds=%.2f error_after_progress_s=%.2f msg=\"%s\"\n",
              result, static_cast<int>(gLastResult), messages, since(t0),
              rc == 0 ? 0.0 : since(lastProgress), msg.c_str());
  std::fflush(stdout);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s send|recv <handle-file> <messages> <bytes>\n", argv[0]);
    return 1;
  }
  const bool sender = std::strcmp(argv[1], "send") == 0;
  const std::string handleFile = argv[2];
  const int messages = std::atoi(argv[3]);
  const size_t bytes = std::strtoull(argv[4], nullptr, 10);
  std::string why;
  std::unique_ptr<net::Net> n = net::createTcpNet(&why);
  if (n == nullptr) return std::fprintf(stderr, "no TCP net: %s\n", why.c_str()), 1;

  auto t0 = Clock::now(), last = t0;
  char handle[net::kHandleSize] = {};
  net::SendComm* sc = nullptr;
  net::RecvComm* rc = nullptr;
  net::ListenComm* lc = nullptr;
  if (!sender) {
    if ((gLastResult = n->listen(0, handle, &lc)) != Result::Success)
      return report("error", 0, t0, last, lastError(), 2);
    std::string tmp = handleFile + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(handle, sizeof(handle));
    std::rename(tmp.c_str(), handleFile.c_str());
  } else {
    for (;;) {
      std::ifstream in(handleFile, std::ios::binary);
      if (in.read(handle, sizeof(handle))) break;
      if (since(t0) > 30) return report("error", 0, t0, last, "no handle file", 1);
      usleep(10000);
    }
  }
  while (sc == nullptr && rc == nullptr) {
    Result r = gLastResult = sender ? n->connect(0, handle, &sc) : n->accept(lc, &rc);
    if (r != Result::Success) return report("error", 0, t0, last, lastError(), 2);
    if (since(t0) > 60) return report("error", 0, t0, last, "no connection within 60 s", 2);
  }
  if (lc != nullptr) n->closeListen(lc);

  std::vector<uint8_t> buf(bytes);
  int done = 0;
  for (; done < messages; ++done) {
    if (sender)
      for (size_t i = 0; i < bytes; ++i) buf[i] = patternByte(done, i);
    net::Request* req = nullptr;
    while (req == nullptr) {
      void* data = buf.data();
      int tag = 7;
      void* mh = nullptr;
      Result r = gLastResult = sender ? n->isend(sc, buf.data(), bytes, tag, nullptr, &req)
                                      : n->irecv(rc, 1, &data, &bytes, &tag, &mh, &req);
      if (r != Result::Success) return report("error", done, t0, last, lastError(), 2);
    }
    bool complete = false;
    size_t got = 0;
    while (!complete) {
      if ((gLastResult = n->test(req, &complete, &got)) != Result::Success)
        return report("error", done, t0, last, lastError(), 2);
    }
    last = Clock::now();
    if (!sender)
      for (size_t i = 0; i < bytes; ++i)
        if (buf[i] != patternByte(done, i))
          return report("corrupt", done, t0, last, "wrong byte", 1);
  }
  if (sc != nullptr) n->closeSend(sc);
  if (rc != nullptr) n->closeRecv(rc);
  return report("ok", done, t0, last, "", 0);
}
