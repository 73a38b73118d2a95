// mkernel-model: the cost model's predictions as a table (docs/MODEL.md).
//   mkernel-model [--nodes 2,8,64] [--gpus 8] [--nvlink-gbps 346] [--nic-gbps 48] [--nics 8]
//                 [--mk-overhead-us 28.9] [--mk-intra-us 1] [--mk-inter-us 4]
//                 [--rail best|direct|ring|rhd] [--mk-msg-us 0] [--hidden 1] [--min-bytes 8]
//                 [--max-bytes 4G] [--csv FILE]
//                 [--coll allreduce|reducescatter|allgather]   (bytes: nccl-tests' size)
//                 [--policy "name=value,..."]   (the selection policy's parameters,
//                 policyCostParams(), with
//                                                MKERNEL_COST_MODEL's settings; the parameter flags
//                                                apply over them)
// The parameter flags are MKERNEL_COST_MODEL's names with two dashes
// (collectives/route/cost_model.h, setCostParam). The per-call overhead defaults to the selection
// policy's (kPolicyOverheadUs), so that the table and the policy predict with the same figure.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "collectives/route/cost_model.h"
#include "collectives/algo/hier_staged.h"
#include "tools/cli.h"

namespace {

std::string human(double b) {
  char buf[32];
  if (b >= 1 << 30)
    std::snprintf(buf, sizeof(buf), "%g GiB", b / (1 << 30));
  else if (b >= 1 << 20)
    std::snprintf(buf, sizeof(buf), "%g MiB", b / (1 << 20));
  else if (b >= 1 << 10)
    std::snprintf(buf, sizeof(buf), "%g KiB", b / (1 << 10));
  else
    std::snprintf(buf, sizeof(buf), "%g B", b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  using mkernel::coll::CostParams;
  std::vector<int> nodes{2, 8, 64};
  int gpus = CostParams().gpusPerNode;
  uint64_t minBytes = 8, maxBytes = uint64_t(4) << 30;
  std::string csv, policy, collName = "allreduce";
  bool policyGiven = false;
  CLI::App app(
      "Predicted collective time of NCCL (ring / tree) and mkernel (hierarchical) for N nodes x G "
      "GPUs:\n"
      "the alpha-beta cost model of collectives/route/cost_model.h (docs/MODEL.md).",
      "mkernel-model");
  mktools::setupApp(app);
  mktools::listOf(app.add_option("--nodes", nodes, "node counts, one table block each"))
      ->check(mktools::kPositive)
      ->default_str("2,8,64");
  app.add_option("--gpus", gpus, "GPUs per node")->check(mktools::kPositive)->capture_default_str();
  app.add_option("--min-bytes", minBytes, "smallest size (nccl-tests' size; K, M, G accepted)")
      ->transform(mktools::kSize)
      ->capture_default_str();
  app.add_option("--max-bytes", maxBytes, "largest size; sizes step x4 from --min-bytes")
      ->transform(mktools::kSize)
      ->capture_default_str();
  app.add_option(
         "--coll", collName,
         "the collective (bytes: ReduceScatter the send buffer, AllGather the receive buffer)")
      ->check(CLI::IsMember({"allreduce", "reducescatter", "allgather"}))
      ->capture_default_str();
  app.add_option("--csv", csv, "also write the rows as CSV")->type_name("FILE");
  // The selection policy's parameters (rule 6c): policyCostParams() with these settings, as
  // MKERNEL_COST_MODEL would set them ("" for none).
  app.add_option("--policy", policy,
                 "the selection policy's parameters with MKERNEL_COST_MODEL's settings "
                 "(\"name=value,...\"; \"\" for none); the parameter flags apply over them")
      ->check([](const std::string& v) {
        CostParams scratch;
        std::string why;
        return mkernel::coll::parseCostParams(v, &scratch, nullptr, &why) ? std::string() : why;
      })
      ->type_name("SETTINGS");
  // MKERNEL_COST_MODEL's parameters (setCostParam), each checked by the same function.
  struct Param {
    const char* name;
    const char* help;
    std::string shown;  // the default, for --help
    std::string value;
    CLI::Option* opt;
  };
  const CostParams d;
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  std::vector<Param> params = {
      {"nvlink-gbps", "one GPU's NVLink bus bandwidth, GB/s", num(d.nvlinkGBps), "", nullptr},
      {"nic-gbps", "one NIC's bandwidth, GB/s", num(d.nicGBps), "", nullptr},
      {"nics", "NICs per node", num(d.nicsPerNode), "", nullptr},
      {"mk-overhead-us",
       "mkernel's per-call overhead, us (the selection policy's, kPolicyOverheadUs)",
       num(mkernel::coll::kPolicyOverheadUs), "", nullptr},
      {"mk-intra-us", "one NVLink step, us", num(d.mkIntraStepUs), "", nullptr},
      {"mk-inter-us", "one inter-node step, us", num(d.mkInterStepUs), "", nullptr},
      {"mk-msg-us", "per rail message, us", num(d.mkMsgUs), "", nullptr},
      {"hidden", "share of the shorter phase the pipeline hides (0 to 1)", num(d.hidden), "",
       nullptr},
      {"rail", "the rail exchange: best, direct, ring or rhd", "best", "", nullptr},
  };
  for (Param& prm : params) {
    const std::string name = prm.name;
    prm.opt =
        app.add_option("--" + name, prm.value, prm.help)
            ->check([name](const std::string& v) {
              CostParams scratch;
              std::string why;
              return mkernel::coll::setCostParam(&scratch, name, v, &why) ? std::string() : why;
            })
            ->type_name(name == "rail" ? "NAME" : "NUMBER")
            ->default_str(prm.shown);
  }
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  policyGiven = app.count("--policy") > 0;
  CostParams base;
  base.mkOverheadUs = mkernel::coll::kPolicyOverheadUs;
  if (policyGiven) {
    base = mkernel::coll::policyCostParams();
    std::string why;
    if (!mkernel::coll::parseCostParams(policy, &base, nullptr, &why))
      return mktools::usageError(app, "--policy: " + why);
  }
  base.gpusPerNode = gpus;
  for (const Param& prm : params) {
    std::string why;
    if (prm.opt->count() > 0 && !mkernel::coll::setCostParam(&base, prm.name, prm.value, &why))
      return mktools::usageError(app, "--" + std::string(prm.name) + ": " + why);
  }
  if (minBytes < 1 || maxBytes < minBytes)
    return mktools::usageError(app, "want 1 <= --min-bytes <= --max-bytes");
  mkernel::coll::CollType coll = mkernel::coll::CollType::AllReduce;
  if (collName == "reducescatter")
    coll = mkernel::coll::CollType::ReduceScatter;
  else if (collName == "allgather")
    coll = mkernel::coll::CollType::AllGather;
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (!csv.empty() && out == nullptr) {
    std::fprintf(stderr, "mkernel-model: cannot write %s\n", csv.c_str());
    return 1;
  }
  if (out)
    std::fprintf(out,
                 "nodes,gpus,bytes,nccl_ring_us,nccl_tree_us,nccl_us,nccl_choice,mk_pipelined_us,"
                 "mk_serial_us,speedup\n");
  std::printf(
      "# %s, alpha-beta model (docs/MODEL.md): NVLink %.0f GB/s per GPU, %d x %.0f GB/s NICs per "
      "node,\n"
      "# mkernel per-call %.1f us, NVLink step %.1f us, inter-node step %.1f us, per rail message "
      "%.1f us, rail exchange %s,\n"
      "# the pipeline hiding %.0f%% of the shorter phase;\n"
      "# NCCL 2.28.9 tuner latencies\n",
      mkernel::coll::collName(coll), base.nvlinkGBps, base.nicsPerNode, base.nicGBps,
      base.mkOverheadUs, base.mkIntraStepUs, base.mkInterStepUs, base.mkMsgUs,
      base.rail < 0 ? "best of ring and rhd" : mkernel::coll::hierRailName(base.rail),
      100.0 * base.hidden);
  std::printf("%6s %5s %10s %11s %11s %13s %11s %11s %8s\n", "nodes", "gpus", "bytes", "nccl_us",
              "nccl_algo", "mk_pipe_us", "mk_serial", "ratio", "");
  for (int n : nodes) {
    mkernel::coll::CostParams p = base;
    p.nodes = n;
    for (double b = static_cast<double>(minBytes); b <= static_cast<double>(maxBytes); b *= 4) {
      const mkernel::coll::CollCost c = mkernel::coll::predictCollective(p, coll, b);
      std::printf("%6d %5d %10s %11.1f %11s %13.1f %11.1f %10.2fx\n", n, p.gpusPerNode,
                  human(b).c_str(), c.ncclUs, c.ncclChoice.c_str(), c.mkPipelinedUs, c.mkSerialUs,
                  c.speedup);
      if (out)
        std::fprintf(out, "%d,%d,%.0f,%.3f,%.3f,%.3f,%s,%.3f,%.3f,%.4f\n", n, p.gpusPerNode, b,
                     c.ncclRingUs, c.ncclTreeUs, c.ncclUs, c.ncclChoice.c_str(), c.mkPipelinedUs,
                     c.mkSerialUs, c.speedup);
    }
  }
  if (out) std::fclose(out);
  return 0;
}
