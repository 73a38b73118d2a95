/* nccl_one_rank: the smallest real NCCL job. One rank, one GPU: ncclCommInitRank, one AllReduce
 * (sum) of 8 floats, result checked, ncclCommDestroy. With one rank NCCL moves no bytes through a
 * net plugin, but it loads the plugin named by NCCL_NET_PLUGIN and calls init, devices and
 * getProperties at communicator init, so this is how to see NCCL accept mkernel's net plugin:
 *
 *   NCCL_NET_PLUGIN=<build>/lib/libnccl-net-mkernel.so NCCL_DEBUG=INFO \
 *   NCCL_DEBUG_SUBSYS=INIT,NET ./nccl_one_rank
 *
 * Exit status 0 when the result is right, 1 otherwise (with a message). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

#define N 8

#define CHECK_CUDA(call)                                                                \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "nccl_one_rank: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#define CHECK_NCCL(call)                                                                    \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "nccl_one_rank: %s failed: %s (%s)\n", #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                                      \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

int main(void) {
  float host[N], result[N];
  float* dev = NULL;
  cudaStream_t stream;
  ncclUniqueId id;
  ncclComm_t comm;
  int version = 0, i;

  for (i = 0; i < N; ++i) host[i] = (float)(i + 1) * 0.5f;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDA(cudaMalloc((void**)&dev, sizeof(host)));
  CHECK_CUDA(cudaMemcpy(dev, host, sizeof(host), cudaMemcpyHostToDevice));

  CHECK_NCCL(ncclGetVersion(&version));
  CHECK_NCCL(ncclGetUniqueId(&id));
  CHECK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
  CHECK_NCCL(ncclAllReduce(dev, dev, N, ncclFloat, ncclSum, comm, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(result, dev, sizeof(result), cudaMemcpyDeviceToHost));
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaFree(dev));
  CHECK_CUDA(cudaStreamDestroy(stream));

  /* One rank: the sum is the input itself, exactly. */
  for (i = 0; i < N; ++i) {
    if (result[i] != host[i]) {
      fprintf(stderr, "nccl_one_rank: element %d is %g, expected %g\n", i, result[i], host[i]);
      return 1;
    }
  }
  printf("nccl_one_rank: NCCL %d, 1 rank, AllReduce of %d floats: OK\n", version, N);
  return 0;
}
