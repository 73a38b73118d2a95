/* Opens mkernel's plugins the way NCCL 2.28 does (src/plugin/plugin_open.cc): NCCL_NET_PLUGIN=X
   and NCCL_TUNER_PLUGIN=X make it dlopen("libnccl-net-X.so") and dlopen("libnccl-tuner-X.so"),
   RTLD_NOW | RTLD_LOCAL, through the loader's search path (LD_LIBRARY_PATH), then look up the
   newest table it knows (ncclNetPlugin_v11, ncclTunerPlugin_v5), whose first field is the name.
   Prints each table's name and the file the loader mapped, and checks that both names are one
   copy of libmkernel.so (the same link map as mkernelVersionString's). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* openPlugin(const char* prefix, const char* envName, const char* table,
                        const char** name) {
  const char* plugin = getenv(envName);
  char lib[256];
  void* handle;
  void* sym;
  if (plugin == NULL) {
    fprintf(stderr, "%s is not set\n", envName);
    return NULL;
  }
  snprintf(lib, sizeof(lib), "%s-%s.so", prefix, plugin);
  handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    fprintf(stderr, "dlopen(%s): %s\n", lib, dlerror());
    return NULL;
  }
  sym = dlsym(handle, table);
  if (sym == NULL) {
    fprintf(stderr, "%s: no %s\n", lib, table);
    return NULL;
  }
  *name = *(const char* const*)sym; /* every table starts with `const char* name` */
  return handle;
}

static const char* mappedFile(void* handle) {
  struct link_map* map = NULL;
  return dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL ? map->l_name : "?";
}

int main(void) {
  const char* netName = NULL;
  const char* tunerName = NULL;
  void* net = openPlugin("libnccl-net", "NCCL_NET_PLUGIN", "ncclNetPlugin_v11", &netName);
  void* tuner = openPlugin("libnccl-tuner", "NCCL_TUNER_PLUGIN", "ncclTunerPlugin_v5", &tunerName);
  const char* (*version)(void);
  if (net == NULL || tuner == NULL) return 1;
  *(void**)&version = dlsym(net, "mkernelVersionString");
  printf("net: ncclNetPlugin_v11 \"%s\" from %s\n", netName, mappedFile(net));
  printf("tuner: ncclTunerPlugin_v5 \"%s\" from %s\n", tunerName, mappedFile(tuner));
  printf("%s\n", version != NULL ? version() : "no mkernelVersionString");
  if (strcmp(netName, "mkernel") != 0 || strcmp(tunerName, "mkernel") != 0) return 1;
  if (net != tuner) {
    fprintf(stderr, "the two plugin names are two copies of the library\n");
    return 1;
  }
  return version != NULL ? 0 : 1;
}
