#include "collectives/stats.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "collectives/communicator.h"

namespace mkernel {
namespace coll {

GlobalStats& globalStats() {
  static GlobalStats stats{};  // zero-initialised atomics
  return stats;
}

namespace {
struct Folders {
  std::mutex mu;
  std::map<const void*, std::function<void()>> fold;
};
Folders& folders() {
  static Folders* f = new Folders;  // never destroyed: communicators may outlive static destruction
  return *f;
}
}  // namespace

void registerStatsFolder(const void* key, std::function<void()> fold) {
  std::lock_guard<std::mutex> lock(folders().mu);
  folders().fold[key] = std::move(fold);
}

void unregisterStatsFolder(const void* key) {
  std::lock_guard<std::mutex> lock(folders().mu);
  folders().fold.erase(key);
}

void foldLiveStats() {
  std::lock_guard<std::mutex> lock(folders().mu);
  for (auto& f : folders().fold) f.second();
}

namespace {
void appendf(std::string* out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string* out, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  *out += buf;
}
}  // namespace

std::string commStatsLine(const CollStats* st, const uint64_t forwarded[kNumCollTypes],
                          const char* why) {
  uint64_t kernel = 0, launch = 0, fwd = 0;
  for (int c = 0; c < kNumCollTypes; ++c) {
    if (st != nullptr) {
      kernel += st->kernelOps[c];
      launch += st->launchOps[c];
    }
    fwd += forwarded[c];
  }
  std::string out;
  appendf(&out, "%" PRIu64 " collectives: ", kernel + fwd);
  if (st != nullptr) {
    // launchOps counts the one-rank copies too (CollStats); the persistent kernel ran the rest.
    appendf(&out, "persistent kernel %" PRIu64 " (rings %" PRIu64 "), ", kernel - launch,
            st->ringOps);
    appendf(&out,
            "launch path %" PRIu64 " (LL mode %" PRIu64 ", of them batched %" PRIu64
            "; one-rank copies %" PRIu64 "), ",
            launch, st->llOps, st->llBatchOps, st->oneRankCopies);
  } else {
    appendf(&out, "none in mkernel (%s), ",
            why != nullptr && *why != '\0' ? why : "no mkernel communicator");
  }
  appendf(&out, "forwarded to NCCL %" PRIu64, fwd);
  if (st != nullptr) appendf(&out, "; persistent-kernel launches %" PRIu64, st->kernelLaunches);
  // Per collective, mkernel/NCCL, for those that ran at all.
  const char* sep = "; mkernel/NCCL:";
  for (int c = 0; c < kNumCollTypes; ++c) {
    const uint64_t mk = st != nullptr ? st->kernelOps[c] : 0;
    if (mk == 0 && forwarded[c] == 0) continue;
    appendf(&out, "%s %s %" PRIu64 "/%" PRIu64, sep, collName(static_cast<CollType>(c)), mk,
            forwarded[c]);
    sep = ",";
  }
  if (st != nullptr && st->countersLate > 0)
    appendf(&out, "; %" PRIu64 " late counter read(s): the launch-path counts may be short",
            st->countersLate);
  return out;
}

}  // namespace coll
}  // namespace mkernel
