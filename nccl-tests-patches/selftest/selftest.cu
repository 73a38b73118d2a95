// Hardware-free check of the two mkernel patches, linked against the patched nccl-tests objects
// (common.o with its main renamed, util.o, ...). Needs no GPU: it calls the patched functions
// directly. Run by scripts/nccl-tests.sh --selftest in three setups (MODE argument):
//   plain    nothing preloaded: the path column must say "-"
//   fake     LD_PRELOAD=libfake_mkernel.so: counters this program sets decide mk/nccl/mix/?
//   real     LD_PRELOAD=<mkernel build>/lib/libmkernel.so: the real symbol is found, nothing ran
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "util.h"

extern int per_iter_timing;  // defined in common.cu, not declared in its headers

static int failures = 0;
#define EXPECT(cond, ...)                                               \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
      failures++;                                                       \
    }                                                                   \
  } while (0)

static void setEnv(const char* name, const char* value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

static void checkGpuSharing() {
  struct Case {
    const char* allow;
    const char* emulate;
    bool shared;
  };
  const Case cases[] = {
      {NULL, NULL, false}, {"1", NULL, true}, {NULL, "1", true}, {NULL, "0", false},
      {"0", "1", false},   {"", "1", true},   {"1", "0", true},
  };
  for (const Case& c : cases) {
    setEnv("NCCL_TESTS_ALLOW_GPU_SHARING", c.allow);
    setEnv("MKERNEL_EMULATE", c.emulate);
    const char* a = c.allow ? c.allow : "(unset)";
    const char* e = c.emulate ? c.emulate : "(unset)";
    EXPECT(testGpuSharingAllowed() == c.shared, "ALLOW=%s EMULATE=%s", a, e);
    // Indices below the device count never move; past it they wrap only when sharing is on.
    EXPECT(testDeviceForIndex(0, 1) == 0 && testDeviceForIndex(1, 2) == 1, "ALLOW=%s EMULATE=%s", a,
           e);
    EXPECT(testDeviceForIndex(3, 1) == (c.shared ? 0 : 3), "ALLOW=%s EMULATE=%s", a, e);
    EXPECT(testDeviceForIndex(5, 2) == (c.shared ? 1 : 5), "ALLOW=%s EMULATE=%s", a, e);
    EXPECT(testDeviceForIndex(9, 8) == (c.shared ? 1 : 9), "ALLOW=%s EMULATE=%s", a, e);
  }
  setEnv("NCCL_TESTS_ALLOW_GPU_SHARING", NULL);
  setEnv("MKERNEL_EMULATE", NULL);
}

// The fake library's setter: counts for collective index `coll` (ncclFunc_t order).
typedef void (*FakeAddFn)(int coll, uint64_t kernelOps, uint64_t forwardedOps);

static std::string labelAfter(FakeAddFn add, int coll, uint64_t kernelOps, uint64_t forwardedOps) {
  struct pathCounts before, after, delta;
  pathCountsRead(&before);
  if (add) add(coll, kernelOps, forwardedOps);
  const bool present = pathCountsRead(&after);
  delta.kernelOps = after.kernelOps - before.kernelOps;
  delta.forwardedOps = after.forwardedOps - before.forwardedOps;
  return pathLabel(present, &delta);
}

static void checkPathLabels(const std::string& mode) {
  FakeAddFn add = (FakeAddFn)dlsym(RTLD_DEFAULT, "fakeMkernelAdd");
  struct pathCounts counts;
  const bool present = pathCountsRead(&counts);
  if (mode == "plain") {
    EXPECT(!present, "mkernelGetStats found without mkernel preloaded");
    EXPECT(labelAfter(NULL, 0, 0, 0) == "-", "plain NCCL must print '-'");
  } else if (mode == "fake") {
    EXPECT(present && add != NULL, "fake mkernelGetStats/fakeMkernelAdd not found (LD_PRELOAD?)");
    if (!add) return;
    EXPECT(labelAfter(add, 4, 20, 0) == "mk", "AllReduce kernel ops only");
    EXPECT(labelAfter(add, 2, 0, 20) == "nccl", "AllGather forwarded only");
    EXPECT(labelAfter(add, 0, 3, 0) == "mk", "Broadcast (index 0) counts too");
    EXPECT(labelAfter(add, 3, 5, 7) == "mix", "both grew");
    EXPECT(labelAfter(add, 1, 0, 0) == "?", "nothing grew");
    pathCountsRead(&counts);
    EXPECT(counts.kernelOps == 28 && counts.forwardedOps == 27, "sums over the five: %llu %llu",
           (unsigned long long)counts.kernelOps, (unsigned long long)counts.forwardedOps);
  } else if (mode == "real") {
    EXPECT(present, "the real libmkernel.so's mkernelGetStats was not found (LD_PRELOAD?)");
    EXPECT(labelAfter(NULL, 0, 0, 0) == "?", "no collective ran: '?'");
  } else {
    EXPECT(false, "unknown mode %s", mode.c_str());
  }
}

// Captures what `emit` prints to stdout.
template <typename F>
static std::string captureStdout(F emit) {
  fflush(stdout);
  char path[] = "/tmp/nccl-tests-selftest-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "";
  const int saved = dup(1);
  dup2(fd, 1);
  emit();
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  std::string text;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) text.append(buf, (size_t)n);
  close(fd);
  unlink(path);
  return text;
}

static std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(text.substr(start, nl - start));
  return out;
}

static std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') i++;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') j++;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

// The result table: the existing columns keep their order, "path" is the last one and lines up
// with the header, for both the plain and the per-iteration header.
static void checkOutputFormat() {
  is_main_thread = 1;
  const std::string table = captureStdout([] {
    writeResultHeader(false, false);
    writeBenchmarkLinePreamble(1048576, 262144, "float", "sum", -1);
    writeBenchmarkLineBody(12.5, 83.9, 146.8, true, 0, false, false, true);
    writeBenchmarkLineBody(12.1, 86.7, 151.7, true, 0, false, false, false);
    writeBenchmarkLinePath("nccl");
    writeBenchmarkLineTerminator(20, "");
  });
  printf("%s", table.c_str());
  const std::vector<std::string> l = lines(table);
  EXPECT(l.size() == 5, "header (4 lines) + 1 result line, got %zu", l.size());
  if (l.size() != 5) return;
  const std::vector<std::string> head = words(l[2]), row = words(l[4]);
  EXPECT(head.size() == 15 && head.back() == "path", "header columns: %s", l[2].c_str());
  EXPECT(row.size() == 14, "result columns: %s", l[4].c_str());
  if (head.size() != 15 || row.size() != 14) return;
  // Upstream's 13 columns unchanged: size count type redop root time algbw busbw #wrong x2.
  EXPECT(row[0] == "1048576" && row[2] == "float" && row[8] == "0" && row[12] == "0", "%s",
         l[4].c_str());
  EXPECT(head[9] == "#wrong" && head[13] == "#wrong", "%s", l[2].c_str());
  EXPECT(row[13] == "nccl", "%s", l[4].c_str());
  EXPECT(l[2].size() == l[4].size(), "path column not aligned: header %zu chars, row %zu",
         l[2].size(), l[4].size());
  EXPECT(l[2].find("#wrong  path") != std::string::npos, "%s", l[2].c_str());

  per_iter_timing = 1;
  const std::string perIter = captureStdout([] { writeResultHeader(false, false); });
  per_iter_timing = 0;
  const std::vector<std::string> p = lines(perIter);
  EXPECT(p.size() == 4 && words(p[2]).back() == "path", "per-iteration header: %s",
         perIter.c_str());
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "plain";
  checkGpuSharing();
  checkPathLabels(mode);
  if (mode == "plain") checkOutputFormat();
  if (failures) {
    fprintf(stderr, "nccl-tests patch selftest (%s): %d FAILED\n", mode.c_str(), failures);
    return 1;
  }
  printf("nccl-tests patch selftest (%s): all checks passed\n", mode.c_str());
  return 0;
}
