// vendor/cuda_driver.cc's cuMem functions (ncclMemAlloc's mapping, process ranks' shared
// memory) against a fake driver on the CPU: every reservation, mapping and handle reference is
// accounted for, on success and when each driver call fails in turn (paths a GPU never takes on
// its own). The fake follows the driver's contract: a handle's memory lives while the handle or a
// mapping of it holds a reference; cuMemMap takes one, cuMemUnmap drops it.
#include "tests/catch.h"

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "vendor/cuda_driver.h"
#include "vendor/cuda_driver_vmm.h"
#include "common/result.h"

using mkernel::Result;
namespace cudrv = mkernel::cudrv;

namespace {

struct FakeDriver {
  std::map<CUmemGenericAllocationHandle, int> refs;  // handle -> references (its own and mappings')
  std::set<CUmemGenericAllocationHandle> freed;      // handles whose memory went (refs reached 0)
  std::map<CUdeviceptr, size_t> reserved;            // base -> size
  std::map<CUdeviceptr, std::pair<size_t, CUmemGenericAllocationHandle>> mapped;
  std::vector<std::pair<CUdeviceptr, int>> access;  // (base, device) made read-write
  std::string failAt;                               // the call that fails
  std::vector<std::string> calls;
  CUmemGenericAllocationHandle nextHandle = 100;
  CUdeviceptr nextBase = 0x7f0000000000ull;

  // Nothing reserved or mapped, and no handle holds memory.
  bool clean() const {
    if (!reserved.empty() || !mapped.empty()) return false;
    for (const auto& kv : refs)
      if (kv.second != 0) return false;
    return true;
  }
  // The mapping [base, base + size) that holds `p`, if any.
  const std::pair<const CUdeviceptr, std::pair<size_t, CUmemGenericAllocationHandle>>* mappingOf(
      CUdeviceptr p) const {
    for (const auto& m : mapped)
      if (p >= m.first && p < m.first + m.second.first) return &m;
    return nullptr;
  }
};

FakeDriver* g = nullptr;
constexpr CUresult kFail = CUDA_ERROR_OUT_OF_MEMORY;

bool failing(const char* name) {
  g->calls.push_back(name);
  return g->failAt == name;
}
void dropRef(CUmemGenericAllocationHandle h) {
  REQUIRE(g->refs[h] > 0);
  if (--g->refs[h] == 0) g->freed.insert(h);
}

CUresult fDeviceGet(CUdevice* d, int ordinal) {
  if (failing("cuDeviceGet")) return kFail;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult fDeviceGetAttribute(int* v, CUdevice_attribute, CUdevice) {
  *v = 0;
  return CUDA_SUCCESS;
}
CUresult fGranularity(size_t* gran, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *gran = size_t(2) << 20;
  return CUDA_SUCCESS;
}
CUresult fCreate(CUmemGenericAllocationHandle* h, size_t, const CUmemAllocationProp*,
                 unsigned long long) {
  if (failing("cuMemCreate")) return kFail;
  *h = g->nextHandle++;
  g->refs[*h] = 1;
  return CUDA_SUCCESS;
}
CUresult fReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr, unsigned long long) {
  if (failing("cuMemAddressReserve")) return kFail;
  *p = g->nextBase;
  g->nextBase += size + (size_t(1) << 30);
  g->reserved[*p] = size;
  return CUDA_SUCCESS;
}
CUresult fMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
              unsigned long long) {
  if (failing("cuMemMap")) return kFail;
  REQUIRE(g->reserved.count(p) == 1);
  REQUIRE(g->reserved[p] == size);
  REQUIRE(offset == 0);
  REQUIRE(g->refs[h] > 0);
  g->mapped[p] = {size, h};
  ++g->refs[h];
  return CUDA_SUCCESS;
}
CUresult fSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (failing("cuMemSetAccess")) return kFail;
  REQUIRE(g->mapped.count(p) == 1);
  REQUIRE(g->mapped[p].first == size);
  REQUIRE(count == 1);
  REQUIRE(desc->location.type == CU_MEM_LOCATION_TYPE_DEVICE);
  REQUIRE(desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  g->access.emplace_back(p, desc->location.id);
  return CUDA_SUCCESS;
}
CUresult fRetain(CUmemGenericAllocationHandle* h, void* addr) {
  g->calls.push_back("cuMemRetainAllocationHandle");
  const auto* m = g->mappingOf(reinterpret_cast<CUdeviceptr>(addr));
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *h = m->second.second;
  ++g->refs[*h];
  return CUDA_SUCCESS;
}
CUresult fRelease(CUmemGenericAllocationHandle h) {
  g->calls.push_back("cuMemRelease");
  dropRef(h);
  return CUDA_SUCCESS;
}
CUresult fAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  if (failing("cuMemGetAddressRange")) return kFail;
  const auto* m = g->mappingOf(p);
  if (m == nullptr) return CUDA_ERROR_NOT_FOUND;
  *base = m->first;
  *size = m->second.first;
  return CUDA_SUCCESS;
}
CUresult fUnmap(CUdeviceptr p, size_t size) {
  if (failing("cuMemUnmap")) return kFail;
  REQUIRE(g->mapped.count(p) == 1);
  REQUIRE(g->mapped[p].first == size);
  const CUmemGenericAllocationHandle h = g->mapped[p].second;
  g->mapped.erase(p);
  dropRef(h);
  return CUDA_SUCCESS;
}
CUresult fAddressFree(CUdeviceptr p, size_t size) {
  if (failing("cuMemAddressFree")) return kFail;
  REQUIRE(g->reserved.count(p) == 1);
  REQUIRE(g->reserved[p] == size);
  REQUIRE(g->mapped.count(p) == 0);  // unmapped first
  g->reserved.erase(p);
  return CUDA_SUCCESS;
}
CUresult fExportFd(void* fd, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                   unsigned long long) {
  if (failing("cuMemExportToShareableHandle")) return kFail;
  REQUIRE(type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  REQUIRE(g->refs[h] > 0);
  *static_cast<int*>(fd) = 40 + static_cast<int>(h);
  return CUDA_SUCCESS;
}
CUresult fImportFd(CUmemGenericAllocationHandle* h, void* fd, CUmemAllocationHandleType type) {
  if (failing("cuMemImportFromShareableHandle")) return kFail;
  REQUIRE(type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  REQUIRE(reinterpret_cast<uintptr_t>(fd) == 7);
  *h = g->nextHandle++;
  g->refs[*h] = 1;
  return CUDA_SUCCESS;
}

// Installs a fresh fake driver for one test (section) and takes it away after.
struct FakeScope {
  FakeDriver driver;
  cudrv::detail::Vmm table;
  FakeScope() {
    g = &driver;
    table.deviceGet = fDeviceGet;
    table.deviceGetAttribute = fDeviceGetAttribute;
    table.granularity = fGranularity;
    table.create = fCreate;
    table.reserve = fReserve;
    table.map = fMap;
    table.setAccess = fSetAccess;
    table.retain = fRetain;
    table.release = fRelease;
    table.addressRange = fAddressRange;
    table.unmap = fUnmap;
    table.addressFree = fAddressFree;
    table.exportFd = fExportFd;
    table.importFd = fImportFd;
    cudrv::detail::setVmmForTest(&table);
  }
  ~FakeScope() {
    cudrv::detail::setVmmForTest(nullptr);
    g = nullptr;
  }
};

constexpr size_t kSize = size_t(4) << 20;

}  // namespace

TEST_CASE(
    "vmmImportFd maps another process's memory read-write; the mapping alone holds it; vmmUnmap "
    "frees it") {
  FakeScope f;
  void* p = nullptr;
  REQUIRE(cudrv::vmmImportFd(7, kSize, 3, &p) == Result::Success);
  REQUIRE(p != nullptr);
  const CUmemGenericAllocationHandle h = 100;
  CHECK(f.driver.refs[h] == 1);  // the mapping's reference only: the import's own was released
  REQUIRE(f.driver.access.size() == 1);
  CHECK(f.driver.access[0] == std::make_pair(reinterpret_cast<CUdeviceptr>(p), 3));
  CHECK(f.driver.freed.count(h) == 0);
  REQUIRE(cudrv::vmmUnmap(static_cast<char*>(p) + 4096) ==
          Result::Success);  // any address inside it
  CHECK(f.driver.freed.count(h) == 1);
  CHECK(f.driver.clean());
}

TEST_CASE("vmmImportFd undoes every step when a driver call fails") {
  const char* call = GENERATE("cuDeviceGet", "cuMemImportFromShareableHandle",
                              "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess");
  FakeScope f;
  f.driver.failAt = call;
  void* p = reinterpret_cast<void*>(0x1);
  CHECK(cudrv::vmmImportFd(7, kSize, 0, &p) == Result::UnhandledCudaError);
  CHECK(p == nullptr);
  CHECK(f.driver.clean());  // no reservation, no mapping, and the imported handle released
  CHECK(std::strstr(mkernel::lastError(), call) != nullptr);
}

TEST_CASE(
    "mapReadWrite keeps the caller's reference when asked, and vmmFree then frees everything") {
  FakeScope f;
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(fCreate(&h, kSize, nullptr, 0) == CUDA_SUCCESS);
  void* p = nullptr;
  REQUIRE(cudrv::detail::mapReadWrite(f.table, h, kSize, size_t(2) << 20, 1, /*keep=*/true, &p) ==
          Result::Success);
  CHECK(f.driver.refs[h] == 2);  // the caller's and the mapping's

  SECTION("vmmExportFd gives a descriptor and the size, and leaves the references as they were") {
    int fd = -1;
    size_t size = 0;
    REQUIRE(cudrv::vmmExportFd(static_cast<char*>(p) + 100, &fd, &size) == Result::Success);
    CHECK(fd == 40 + static_cast<int>(h));
    CHECK(size == kSize);
    CHECK(f.driver.refs[h] == 2);
    f.driver.failAt = "cuMemExportToShareableHandle";
    fd = 5;
    CHECK(cudrv::vmmExportFd(p, &fd, &size) == Result::UnhandledCudaError);
    CHECK(fd == -1);
    CHECK(f.driver.refs[h] == 2);
    f.driver.failAt.clear();
  }
  SECTION("vmmGrantAccess makes it read-write for another device") {
    REQUIRE(cudrv::vmmGrantAccess(p, 5) == Result::Success);
    CHECK(f.driver.access.back() == std::make_pair(reinterpret_cast<CUdeviceptr>(p), 5));
    f.driver.failAt = "cuMemSetAccess";
    CHECK(cudrv::vmmGrantAccess(p, 6) == Result::UnhandledCudaError);
    CHECK(std::strstr(mkernel::lastError(), "another GPU") != nullptr);
    f.driver.failAt.clear();
  }
  REQUIRE(cudrv::vmmFree(p) == Result::Success);
  CHECK(f.driver.freed.count(h) == 1);
  CHECK(f.driver.clean());
}

TEST_CASE(
    "mapReadWrite undoes every step when a driver call fails, whether it keeps the caller's "
    "reference or not") {
  const char* call = GENERATE("cuMemAddressReserve", "cuMemMap", "cuMemSetAccess");
  const bool keep = GENERATE(true, false);
  FakeScope f;
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(fCreate(&h, kSize, nullptr, 0) == CUDA_SUCCESS);
  f.driver.failAt = call;
  void* p = nullptr;
  CHECK(cudrv::detail::mapReadWrite(f.table, h, kSize, 0, 0, keep, &p) ==
        Result::UnhandledCudaError);
  CHECK(p == nullptr);
  CHECK(f.driver.freed.count(h) == 1);  // on failure the reference is released either way
  CHECK(f.driver.clean());
}

TEST_CASE(
    "the cuMem functions refuse an address that is no cuMem mapping, and vmmFree a failed unmap") {
  FakeScope f;
  int fd = 3;
  size_t size = 0;
  int local = 0;
  CHECK(cudrv::vmmExportFd(&local, &fd, &size) == Result::UnhandledCudaError);
  CHECK(fd == -1);
  CHECK(std::strstr(mkernel::lastError(), "not a cuMem mapping") != nullptr);
  CHECK(cudrv::vmmFree(&local) == Result::UnhandledCudaError);
  CHECK(std::strstr(mkernel::lastError(), "not a mapping of ncclMemAlloc") != nullptr);
  CHECK(cudrv::vmmUnmap(&local) == Result::UnhandledCudaError);
  CHECK(cudrv::vmmGrantAccess(&local, 1) == Result::UnhandledCudaError);
  CHECK(f.driver.clean());

  void* p = nullptr;
  REQUIRE(cudrv::vmmImportFd(7, kSize, 0, &p) == Result::Success);
  f.driver.failAt = "cuMemUnmap";
  CHECK(cudrv::vmmUnmap(p) == Result::UnhandledCudaError);
  CHECK(std::strstr(mkernel::lastError(), "cuMemUnmap") != nullptr);
  f.driver.failAt.clear();
  REQUIRE(cudrv::vmmUnmap(p) == Result::Success);  // still mapped after the failure: a retry works
  CHECK(f.driver.clean());
}
