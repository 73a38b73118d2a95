// mkernel-model: the cost model's predictions as a table (docs/MODEL.md).
//   mkernel-model [--nodes 2,8,64] [--gpus 8] [--nvlink-gbps 346] [--nic-gbps 48] [--nics 8]
//                 [--mk-overhead-us 8] [--mk-intra-us 1] [--mk-inter-us 4]
//                 [--rail best|direct|ring|rhd] [--mk-msg-us 0] [--hidden 1] [--min-bytes 8] [--max-bytes 4294967296] [--csv FILE]
//                 [--coll allreduce|reducescatter|allgather]   (bytes: nccl-tests' size)
//                 [--policy "name=value,..."]   (the selection policy's parameters, policyCostParams(), with
//                                                MKERNEL_COST_MODEL's settings; the flags after it still apply)
// The parameter flags are MKERNEL_COST_MODEL's names with two dashes (collectives/cost_model.h, setCostParam).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/hier_staged.h"
#include "tools/args.h"

namespace {

std::string human(double b) {
  char buf[32];
  if (b >= 1 << 30) std::snprintf(buf, sizeof(buf), "%g GiB", b / (1 << 30));
  else if (b >= 1 << 20) std::snprintf(buf, sizeof(buf), "%g MiB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof(buf), "%g KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof(buf), "%g B", b);
  return buf;
}

int usage() {
  std::fprintf(stderr,
               "usage: mkernel-model [--nodes 2,8,64] [--gpus 8] [--nvlink-gbps 346] [--nic-gbps 48] [--nics 8]\n"
               "                     [--mk-overhead-us 8] [--mk-intra-us 1] [--mk-inter-us 4]\n"
               "                     [--rail best|direct|ring|rhd] [--mk-msg-us 0] [--hidden 1] [--min-bytes 8] [--max-bytes 4294967296] [--csv FILE]\n"
               "                     [--coll allreduce|reducescatter|allgather] (bytes: nccl-tests' size; ReduceScatter: the send buffer,\n"
               "                     AllGather: the receive buffer)\n"
               "                     [--policy \"name=value,...\"] (the selection policy's parameters with MKERNEL_COST_MODEL's settings)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  mkernel::coll::CostParams base;
  std::vector<int> nodes{2, 8, 64};
  double minBytes = 8, maxBytes = 4294967296.0;
  std::string csv;
  mkernel::coll::CollType coll = mkernel::coll::CollType::AllReduce;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    std::string why;
    if (a == "--nodes") nodes = mktools::parseIntList(v);
    else if (a == "--gpus") base.gpusPerNode = std::atoi(v);
    else if (a == "--policy") {
      // The selection policy's parameters (rule 6c): policyCostParams() with `v`, as
      // MKERNEL_COST_MODEL would set them ("" for none); the flags after it still apply.
      mkernel::coll::CostParams p = mkernel::coll::policyCostParams();
      p.gpusPerNode = base.gpusPerNode;
      if (!mkernel::coll::parseCostParams(v, &p, nullptr, &why)) {
        std::fprintf(stderr, "mkernel-model: --policy: %s\n", why.c_str());
        return usage();
      }
      base = p;
    } else if (a == "--min-bytes") minBytes = std::atof(v);
    else if (a == "--max-bytes") maxBytes = std::atof(v);
    else if (a == "--csv") csv = v;
    else if (a == "--coll") {
      const std::string c = v;
      if (c == "allreduce") coll = mkernel::coll::CollType::AllReduce;
      else if (c == "reducescatter") coll = mkernel::coll::CollType::ReduceScatter;
      else if (c == "allgather") coll = mkernel::coll::CollType::AllGather;
      else return usage();
    } else if (a.rfind("--", 0) == 0 && mkernel::coll::setCostParam(&base, a.substr(2), v, &why)) {
      // --nvlink-gbps, --nic-gbps, --nics, --mk-*-us, --hidden, --rail: MKERNEL_COST_MODEL's names
    } else {
      if (!why.empty() && why.rfind("unknown parameter", 0) != 0) std::fprintf(stderr, "mkernel-model: %s\n", why.c_str());
      return usage();
    }
  }
  if (nodes.empty() || base.gpusPerNode < 1 || base.nvlinkGBps <= 0 || base.nicGBps <= 0 || base.nicsPerNode < 1 ||
      minBytes < 1 || maxBytes < minBytes || base.hidden < 0 || base.hidden > 1)
    return usage();
  for (int n : nodes)
    if (n < 1) return usage();
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (!csv.empty() && out == nullptr) {
    std::fprintf(stderr, "mkernel-model: cannot write %s\n", csv.c_str());
    return 1;
  }
  if (out) std::fprintf(out, "nodes,gpus,bytes,nccl_ring_us,nccl_tree_us,nccl_us,nccl_choice,mk_pipelined_us,mk_serial_us,speedup\n");
  std::printf("# %s, alpha-beta model (docs/MODEL.md): NVLink %.0f GB/s per GPU, %d x %.0f GB/s NICs per node,\n"
              "# mkernel per-call %.1f us, NVLink step %.1f us, inter-node step %.1f us, per rail message %.1f us, rail exchange %s,\n"
              "# the pipeline hiding %.0f%% of the shorter phase;\n"
              "# NCCL 2.28.9 tuner latencies\n",
              mkernel::coll::collName(coll), base.nvlinkGBps, base.nicsPerNode, base.nicGBps, base.mkOverheadUs, base.mkIntraStepUs, base.mkInterStepUs, base.mkMsgUs,
              base.rail < 0 ? "best of ring and rhd" : mkernel::coll::hierRailName(base.rail), 100.0 * base.hidden);
  std::printf("%6s %5s %10s %11s %11s %13s %11s %11s %8s\n", "nodes", "gpus", "bytes", "nccl_us", "nccl_algo",
              "mk_pipe_us", "mk_serial", "ratio", "");
  for (int n : nodes) {
    mkernel::coll::CostParams p = base;
    p.nodes = n;
    for (double b = minBytes; b <= maxBytes; b *= 4) {
      const mkernel::coll::CollCost c = mkernel::coll::predictCollective(p, coll, b);
      std::printf("%6d %5d %10s %11.1f %11s %13.1f %11.1f %10.2fx\n", n, p.gpusPerNode, human(b).c_str(), c.ncclUs,
                  c.ncclChoice.c_str(), c.mkPipelinedUs, c.mkSerialUs, c.speedup);
      if (out)
        std::fprintf(out, "%d,%d,%.0f,%.3f,%.3f,%.3f,%s,%.3f,%.3f,%.4f\n", n, p.gpusPerNode, b, c.ncclRingUs, c.ncclTreeUs,
                     c.ncclUs, c.ncclChoice.c_str(), c.mkPipelinedUs, c.mkSerialUs, c.speedup);
    }
  }
  if (out) std::fclose(out);
  return 0;
}
