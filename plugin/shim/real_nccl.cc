#include "plugin/shim/real_nccl.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <mutex>

#include "common/dl.h"
#include "common/log.h"
#include "common/param.h"
#include "common/version.h"

namespace mkernel {
namespace shim {

std::atomic<uintptr_t> gRealCodeBegin{0}, gRealCodeEnd{0};

namespace {

// The shim's own copy of an nccl* name must never be mistaken for the real one (that would
// recurse): a symbol that dlsym resolves into libmkernel.so itself is rejected.
bool isOwnSymbol(void* sym) {
  Dl_info mine{}, theirs{};
  if (dladdr(reinterpret_cast<void*>(&calledFromRealNccl), &mine) == 0) return false;
  if (dladdr(sym, &theirs) == 0) return false;
  return mine.dli_fbase == theirs.dli_fbase;
}

// The bounds of the executable segments of the object loaded at `base`, for fromRealNccl. The
// first real NCCL loaded sets them (both tables load the same library).
void noteCodeBounds(const void* base) {
  struct Bounds {
    uintptr_t base, begin = UINTPTR_MAX, end = 0;
  } b{reinterpret_cast<uintptr_t>(base)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        Bounds* out = static_cast<Bounds*>(arg);
        bool mine = info->dlpi_addr == out->base;
        for (int i = 0; i < info->dlpi_phnum && !mine; ++i)
          mine = info->dlpi_phdr[i].p_type == PT_LOAD &&
                 info->dlpi_addr + info->dlpi_phdr[i].p_vaddr == out->base;
        if (!mine) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (lo < out->begin) out->begin = lo;
          if (lo + ph.p_memsz > out->end) out->end = lo + ph.p_memsz;
        }
        return 1;
      },
      &b);
  if (b.end <= b.begin) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (gRealCodeEnd.load(std::memory_order_relaxed) != 0) return;
  gRealCodeBegin.store(b.begin, std::memory_order_relaxed);
  gRealCodeEnd.store(b.end, std::memory_order_release);  // fromRealNccl reads the end first
}

void load(RealNccl* r, bool allowLoad) {
  const std::string& configured = params::NCCL_LIBRARY();
  // Already loaded by the application (PyTorch, nccl-tests): take exactly that copy.
  void* h = nullptr;
  if (!configured.empty()) h = dlopen(configured.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr && allowLoad) {
    const char* candidates[] = {configured.empty() ? "libnccl.so.2" : configured.c_str(),
                                configured.empty() ? nullptr : "libnccl.so.2", nullptr};
    std::string why;
    h = dlOpenFirst(candidates, RTLD_NOW | RTLD_LOCAL, &why);
    if (h == nullptr) {
      r->why = "cannot load the real NCCL (" + why +
               "); set MKERNEL_NCCL_LIBRARY to libnccl.so.2's path";
      return;
    }
  } else if (h == nullptr) {
    r->why = "the real NCCL is not loaded in this process (emulation does not load it)";
    return;
  }
  DlSymbol syms[] = {
#define MKERNEL_NCCL_API(name, role, what) {#name, reinterpret_cast<void**>(&r->name), false},
#include "plugin/shim/nccl_api.def"
#undef MKERNEL_NCCL_API
  };
  const int n = static_cast<int>(sizeof(syms) / sizeof(syms[0]));
  // The p-prefixed strong aliases are NCCL's own definitions; prefer them where they exist so
  // that a handle whose nccl* name is interposed still reaches NCCL's code.
  for (int i = 0; i < n; ++i) {
    std::string alias = std::string("p") + syms[i].name;
    void* sym = dlsym(h, alias.c_str());
    if (sym == nullptr || isOwnSymbol(sym)) sym = dlsym(h, syms[i].name);
    if (sym != nullptr && isOwnSymbol(sym)) sym = nullptr;
    *syms[i].slot = sym;
  }
  if (r->ncclGetVersion == nullptr || r->ncclCommInitRankConfig == nullptr ||
      r->ncclAllReduce == nullptr) {
    r->why =
        "the library loaded as the real NCCL lacks its core entry points (is MKERNEL_NCCL_LIBRARY "
        "libmkernel.so?)";
    return;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(r->ncclAllReduce), &info) != 0) {
    r->base = info.dli_fbase;
    r->path = info.dli_fname ? info.dli_fname : "";
  }
  r->handle = h;
  r->available = true;
  noteCodeBounds(r->base);
  // No call into NCCL here: this runs under call_once, and NCCL code may call its exported
  // names through the PLT (back into the shim, which would wait on this very call_once). The
  // version is read after it (readVersion).
}

// Reads the loaded NCCL's version once: at INFO (INIT) always, and a WARN, once per process, when
// it is newer than the newest version the shim was tested with. Outside the load's call_once
// (NCCL's code may call back into the shim); a call back into here from inside that ncclGetVersion
// finds the version still unread and goes on without it.
void readVersion(RealNccl* r) {
  static thread_local bool reading = false;
  if (!r->available || r->version.load(std::memory_order_acquire) != 0 || reading) return;
  static std::mutex mu;  // one reader per table; the others wait for its answer
  std::lock_guard<std::mutex> lock(mu);
  if (r->version.load(std::memory_order_acquire) != 0) return;
  int code = 0;
  reading = true;
  const ncclResult_t got = r->ncclGetVersion(&code);
  reading = false;
  if (got != ncclSuccess || code <= 0) {
    MK_WARN("shim: the real NCCL at %s did not tell its version (ncclGetVersion returned %d)",
            r->path.c_str(), static_cast<int>(got));
    r->version.store(-1, std::memory_order_release);
    return;
  }
  r->version.store(code, std::memory_order_release);
  MK_INFO(
      kLogInit,
      "shim: real NCCL %s (version code %d) at %s; the shim supports %s and newer, tested up to %s",
      ncclVersionText(code).c_str(), code, r->path.c_str(),
      ncclVersionText(kOldestSupportedNccl).c_str(), ncclVersionText(kNewestTestedNccl).c_str());
  static std::atomic<bool> warned{false};
  if (code > kNewestTestedNccl && !warned.exchange(true))
    MK_WARN(
        "shim: the real NCCL is %s (%s), newer than %s, the newest version mkernel's shim was "
        "tested with: "
        "entry points the shim does not export reach NCCL directly with NCCL's own communicator "
        "(docs/SHIM.md)",
        ncclVersionText(code).c_str(), r->path.c_str(), ncclVersionText(kNewestTestedNccl).c_str());
}

}  // namespace

const RealNccl& realNccl(bool allowLoad) {
  // Two immutable tables, each filled once: the one that may load libnccl (the normal path) and
  // the one that only takes an NCCL the process already holds (emulation, foreign handles).
  static RealNccl loaded, noLoad;
  static std::once_flag loadedOnce, noLoadOnce;
  static std::atomic<bool> loadedReady{false};
  if (allowLoad) {
    std::call_once(loadedOnce, [] {
      load(&loaded, true);
      loadedReady.store(true, std::memory_order_release);
    });
    readVersion(&loaded);
    return loaded;
  }
  if (loadedReady.load(std::memory_order_acquire) && loaded.available) {
    readVersion(&loaded);
    return loaded;
  }
  std::call_once(noLoadOnce, [] { load(&noLoad, false); });
  readVersion(&noLoad);
  return noLoad;
}

Result checkRealNcclVersion(const RealNccl& real, const char* caller) {
  const int code = real.version.load(std::memory_order_acquire);
  if (!real.available || code <= 0 || code >= kOldestSupportedNccl) return Result::Success;
  return MK_ERROR(
      Result::InvalidUsage,
      "%s : the real NCCL at %s is %s; mkernel's shim needs NCCL %s or newer (built against %s, "
      "tested up to %s): load a newer libnccl.so.2 (MKERNEL_NCCL_LIBRARY)",
      caller, real.path.c_str(), ncclVersionText(code).c_str(),
      ncclVersionText(kOldestSupportedNccl).c_str(), ncclVersionText(NCCL_VERSION_CODE).c_str(),
      ncclVersionText(kNewestTestedNccl).c_str());
}

std::string ncclVersionText(int code) {
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z from 2.9 on, X*1000 + Y*100 + Z before.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void announceShimOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!logStartupEnabled()) return;
    Dl_info self{};
    const char* selfPath =
        dladdr(reinterpret_cast<void*>(&announceShimOnce), &self) != 0 && self.dli_fname != nullptr
            ? self.dli_fname
            : "?";
    const bool emulate = paramInt("EMULATE") != 0;
    // In emulation only an NCCL the process already holds is looked at (none is loaded for it).
    const RealNccl& real = realNccl(!emulate);
    std::string nccl;
    if (real.available) {
      const int code = real.version.load(std::memory_order_acquire);
      nccl = "NCCL " + (code > 0 ? ncclVersionText(code) : std::string("(version unknown)")) +
             " at " + real.path;
    }
    if (emulate) {
      logStartupLine(
          "mkernel %s loaded as NCCL shim from %s; emulation (MKERNEL_EMULATE=1): mkernel runs "
          "every "
          "communicator, nothing is forwarded%s%s%s",
          MKERNEL_VERSION_STRING, selfPath, real.available ? " (" : "", nccl.c_str(),
          real.available ? " is loaded in the process, unused)" : "");
    } else if (real.available) {
      logStartupLine(
          "mkernel %s loaded as NCCL shim from %s; forwarding to %s%s", MKERNEL_VERSION_STRING,
          selfPath, nccl.c_str(),
          paramInt("DISABLE") != 0 ? " (MKERNEL_DISABLE=1: every call goes to NCCL)" : "");
    } else {
      logStartupLine("mkernel %s loaded as NCCL shim from %s; no real NCCL to forward to: %s",
                     MKERNEL_VERSION_STRING, selfPath, real.why.c_str());
    }
  });
}

bool calledFromRealNccl(const void* returnAddress) {
  Dl_info info{};
  if (returnAddress == nullptr || dladdr(returnAddress, &info) == 0 || info.dli_fname == nullptr)
    return false;
  // The caller's object is an NCCL if it defines NCCL's strong p-aliases (libmkernel.so never
  // does). Independent of the tables, so it holds whichever copy of NCCL the caller is.
  void* h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  void* sym = dlsym(h, "pncclGetUniqueId");
  Dl_info symInfo{};
  bool inside = sym != nullptr && dladdr(sym, &symInfo) != 0 && symInfo.dli_fbase == info.dli_fbase;
  dlclose(h);  // balances the NOLOAD reference
  return inside;
}

}  // namespace shim
}  // namespace mkernel
