// The real NCCL's version as the shim reads it at load (plugin/shim/real_nccl.cc), through
// libmkernel.so without a GPU: an INFO line (INIT) with the version and the file; a WARN, once per
// process, for an NCCL newer than the newest the shim was tested with (it still works: the handle
// is NCCL's own); communicator creation refused with ncclInvalidUsage, naming both versions, for
// one older than the oldest it supports. One process per NCCL (CMakeLists.txt: the stand-ins of
// fake_nccl.cc through MKERNEL_NCCL_LIBRARY, and the real libnccl.so.2), since the shim loads it
// once.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <cstdlib>
#include <string>

#include "plugin/shim/nccl_api.h"

namespace {

using mktest::StderrCapture;

std::string library() {
  const char* v = std::getenv("MKERNEL_NCCL_LIBRARY");
  return v ? v : "";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("version: an NCCL newer than the newest tested is said at INFO and warned about once",
          "[.version-new]") {
  REQUIRE(library().find("fake_nccl_new") != std::string::npos);
  StderrCapture cap;
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == 29901);  // the real NCCL's number, as ever
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  // Not refused for its version: creation goes on to the device (none here, or a GPU's).
  const ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  CHECK(r != ncclInvalidUsage);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL INFO shim: real NCCL 2.99.1 (version code 29901) at " + library()) ==
        1);
  CHECK(count(out, "newer than") == 1);  // once, however often the shim is asked
  CHECK(count(out, "the real NCCL is 2.99.1 (" + library() +
                       "), newer than 2.32.3, the newest version mkernel's "
                       "shim was tested with") == 1);
}

TEST_CASE(
    "version: communicator creation beside an NCCL older than 2.28 is ncclInvalidUsage, naming "
    "both versions",
    "[.version-old]") {
  REQUIRE(library().find("fake_nccl_old") != std::string::npos);
  StderrCapture cap;
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == 22707);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclInvalidUsage);
  CHECK(comm == nullptr);
  const std::string said = ncclGetLastError(nullptr);
  CHECK(said == "ncclCommInitRank : the real NCCL at " + library() +
                    " is 2.27.7; mkernel's shim needs NCCL 2.28.0 or newer (built against " +
                    std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                    std::to_string(NCCL_PATCH) +
                    ", tested up to 2.32.3): load a newer libnccl.so.2 "
                    "(MKERNEL_NCCL_LIBRARY)");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInvalidUsage);
  CHECK(ncclCommInitRankScalable(&comm, 1, 0, 1, &id, &config) == ncclInvalidUsage);
  ncclComm_t comms[1] = {nullptr};
  CHECK(ncclCommInitAll(comms, 1, nullptr) == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(nullptr)).find("ncclCommInitAll : the real NCCL at ") == 0);
  CHECK(comms[0] == nullptr);
  // Inside a group, the group's end reports it too.
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclInvalidUsage);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL INFO shim: real NCCL 2.27.7 (version code 22707) at " + library()) ==
        1);
  CHECK(out.find("newer than") == std::string::npos);
}

TEST_CASE("version: the real libnccl.so.2 the build found is said at INFO, without a warning",
          "[.version-real]") {
  StderrCapture cap;
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  REQUIRE(v >= 22800);
  const std::string text = std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
                           std::to_string(v % 100);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  if (r == ncclSuccess)
    CHECK(ncclCommDestroy(comm) == ncclSuccess);  // a machine with a GPU
  else
    CHECK(r == ncclUnhandledCudaError);  // none: past the version check
  const std::string out = cap.text();
  INFO(out);
  CHECK(count(out, "MKERNEL INFO shim: real NCCL " + text + " (version code " + std::to_string(v) +
                       ") at ") == 1);
  if (v <= 23203) CHECK(out.find("newer than") == std::string::npos);
}
