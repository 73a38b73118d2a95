// The verbs backend as a net::Net: creation (createIbNet), device properties, memory
// registration and teardown. Connection setup is in ib_connect.cc, the data path in ib_data.cc.
#include "transport/net/ib/ib_net.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/param.h"
#include "transport/net/ib/cuda_dmabuf.h"

namespace mkernel {
namespace net {

namespace ib {
namespace {

std::mutex gPreferredMu;
std::vector<std::string> gPreferred;

// GPUDirect RDMA without DMA-BUF: the nvidia-peermem module lets ibv_reg_mr pin GPU memory.
bool peermemLoaded() {
  return access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
         access("/sys/module/nvidia_peermem/version", F_OK) == 0 ||
         access("/sys/module/nv_peer_mem/version", F_OK) == 0;
}

}  // namespace

void setIbPreferredDevices(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(gPreferredMu);
  gPreferred = names;
}

// ---- comm lifetime
// -------------------------------------------------------------------------------

void IbComm::destroyVerbs() {
  // QPs first: once they are gone no transfer can touch the memory released below.
  for (ibv_qp* qp : qps)
    if (qp) api->destroyQp(qp);
  qps.clear();
  for (auto& r : pool)
    if (r->kind != IbRequest::kFree) freeRequest(r.get());
}

IbComm::~IbComm() {
  if (cq) api->destroyCq(cq);
  if (fd >= 0) close(fd);
}

IbSendComm::~IbSendComm() {
  destroyVerbs();
  if (fifoMr) api->deregMr(fifoMr);
  if (sizeStagingMr) api->deregMr(sizeStagingMr);
  std::free(fifo);
  std::free(sizeStaging);
}

IbRecvComm::~IbRecvComm() {
  destroyVerbs();
  if (flushQp) api->destroyQp(flushQp);
  if (flushMr) api->deregMr(flushMr);
  if (sizesMr) api->deregMr(sizesMr);
  if (ctsStagingMr) api->deregMr(ctsStagingMr);
  std::free(flushScratch);
  std::free(sizes);
  std::free(ctsStaging);
}

IbListenComm::~IbListenComm() {
  delete pending;
  if (fd >= 0) close(fd);
}

// ---- IbNet
// ----------------------------------------------------------------------------------------

IbNet::IbNet(const IbvApi* api, std::vector<IbDevice*> devs) : api_(api), devs_(std::move(devs)) {
  std::string whyNoGpu;
  const CudaGpuSupport& gpu = cudaGpuSupport(&whyNoGpu);
  if (gpu.gpuPresent) {
    useDmabuf_ = gpu.dmabufSupported && api_->regDmabufMr != nullptr;
    peermem_ = peermemLoaded();
    if (useDmabuf_) ptrSupport_ |= kPtrCuda | kPtrDmaBuf;
    if (peermem_) ptrSupport_ |= kPtrCuda;
  }
  MK_INFO(kLogInit | kLogNet, "NET/IB: GPU memory: %s",
          (ptrSupport_ & kPtrDmaBuf) ? "DMA-BUF"
          : (ptrSupport_ & kPtrCuda) ? "nvidia-peermem"
          : gpu.gpuPresent           ? "no DMA-BUF or peermem support"
                                     : whyNoGpu.c_str());
}

IbNet::~IbNet() {
  for (auto& p : pendingConnects_) delete p.second;
  pendingConnects_.clear();
  closeIbDevices(*api_, &devs_);
}

Result IbNet::getProperties(int dev, DeviceProps* props) const {
  if (dev < 0 || dev >= int(devs_.size()))
    return MK_ERROR(Result::InvalidArgument, "NET/IB: properties of device %d of %zu", dev,
                    devs_.size());
  const IbDevice& d = *devs_[dev];
  *props = DeviceProps();
  props->name = d.name;
  props->pciPath = d.pciPath;
  props->guid = d.guid;
  props->ptrSupport = ptrSupport_;
  props->regIsGlobal = true;
  // The receiver's completion (WRITE_WITH_IMM) already orders the data on sm90+; NCCL itself
  // asks for iflush on older GPUs.
  props->forceFlush = false;
  props->speedMbps = d.speedMbps;
  props->port = d.port;
  props->latencyUs = 0.0f;
  int nqps = std::max(1, static_cast<int>(params::IB_QPS_PER_CONN()));
  props->maxComms = std::max(1, d.maxQp / (nqps + 1));
  props->maxRecvs = kMaxGroupedRecvs;
  props->maxP2pBytes = size_t(1) << 31;
  props->maxCollBytes = size_t(1) << 31;
  return Result::Success;
}

IbDevice* IbNet::deviceOf(Comm* comm) {
  if (auto* s = dynamic_cast<IbSendComm*>(comm)) return s->dev;
  if (auto* r = dynamic_cast<IbRecvComm*>(comm)) return r->dev;
  if (auto* l = dynamic_cast<IbListenComm*>(comm)) return l->dev;
  return nullptr;
}

Result IbNet::regMr(Comm* comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = nullptr;
  IbDevice* dev = deviceOf(comm);
  if (dev == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: regMr on a comm that is not a verbs comm");
  if (type != kPtrHost && type != kPtrCuda)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: regMr of pointer type %d", type);
  if (type == kPtrCuda && !(ptrSupport_ & kPtrCuda))
    return MK_ERROR(Result::InvalidUsage,
                    "NET/IB: regMr of GPU memory, but this host has no GPUDirect RDMA "
                    "(no DMA-BUF support and no nvidia-peermem)");
  MrEntry* e = nullptr;
  MK_CHECK(dev->cache.reg(*api_, dev->pd, data, size, type, useDmabuf_, peermem_, &e));
  *mhandle = e;
  return Result::Success;
}

Result IbNet::regMrDmaBuf(Comm* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                          void** mhandle) {
  *mhandle = nullptr;
  IbDevice* dev = deviceOf(comm);
  if (dev == nullptr)
    return MK_ERROR(Result::InvalidArgument,
                    "NET/IB: regMrDmaBuf on a comm that is not a verbs comm");
  if (fd < 0) return regMr(comm, data, size, type, mhandle);
  MrEntry* e = nullptr;
  MK_CHECK(dev->cache.regDmabuf(*api_, dev->pd, data, size, offset, fd, type, &e));
  *mhandle = e;
  return Result::Success;
}

Result IbNet::deregMr(Comm* comm, void* mhandle) {
  IbDevice* dev = deviceOf(comm);
  if (dev == nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: deregMr on a comm that is not a verbs comm");
  if (mhandle == nullptr) return Result::Success;
  return dev->cache.dereg(*api_, static_cast<MrEntry*>(mhandle));
}

Result IbNet::closeSend(SendComm* comm) {
  auto* c = dynamic_cast<IbSendComm*>(comm);
  if (c == nullptr && comm != nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: closeSend of a foreign comm");
  delete c;
  return Result::Success;
}

Result IbNet::closeRecv(RecvComm* comm) {
  auto* c = dynamic_cast<IbRecvComm*>(comm);
  if (c == nullptr && comm != nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: closeRecv of a foreign comm");
  delete c;
  return Result::Success;
}

Result IbNet::closeListen(ListenComm* comm) {
  auto* c = dynamic_cast<IbListenComm*>(comm);
  if (c == nullptr && comm != nullptr)
    return MK_ERROR(Result::InvalidArgument, "NET/IB: closeListen of a foreign comm");
  delete c;
  return Result::Success;
}

}  // namespace ib

// ---- the factory
// ----------------------------------------------------------------------------------

std::unique_ptr<Net> createIbNet(std::string* why) {
  std::string reason;
  const ib::IbvApi* api = ib::loadIbvApi(&reason);
  if (api == nullptr) {
    if (why) *why = "no RDMA device (" + reason + ")";
    return nullptr;
  }
  std::vector<std::string> preferred;
  {
    std::lock_guard<std::mutex> lock(ib::gPreferredMu);
    preferred = ib::gPreferred;
  }
  std::vector<ib::IbDevice*> devs;
  if (ib::openIbDevices(*api, preferred, &devs, &reason) != Result::Success || devs.empty()) {
    ib::closeIbDevices(*api, &devs);
    if (why)
      *why = reason.rfind("no RDMA device", 0) == 0 ? reason : "no RDMA device (" + reason + ")";
    return nullptr;
  }
  for (const ib::IbDevice* d : devs)
    MK_INFO(kLogInit | kLogNet, "NET/IB: %s port %d %s, %s %s (GID index %d), %d Mbps, MTU %d",
            d->name.c_str(), d->port,
            d->linkLayer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
            d->linkLayer == IBV_LINK_LAYER_ETHERNET ? "IP" : "LID",
            d->linkLayer == IBV_LINK_LAYER_ETHERNET ? d->ipAddress.c_str()
                                                    : std::to_string(d->lid).c_str(),
            d->gidIndex, d->speedMbps, 128 << int(d->mtu));
  return std::unique_ptr<Net>(new ib::IbNet(api, std::move(devs)));
}

}  // namespace net
}  // namespace mkernel
