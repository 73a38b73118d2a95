/* A program of a user of the installed C API: links libmkernel.so (found through find_package or
   pkg-config) and prints mkernelVersionString() and the stats struct's size. */
#include <mkernel_api.h>
#include <stdio.h>

int main(void) {
  mkernelStats_t stats = {0};
  stats.size = sizeof(stats);
  if (mkernelGetStats(&stats) != 0) {
    fprintf(stderr, "mkernelGetStats failed\n");
    return 1;
  }
  printf("%s\n", mkernelVersionString());
  printf("sizeof(mkernelStats_t) %zu, commsCreated %llu\n", sizeof(stats),
         (unsigned long long)stats.commsCreated);
  return 0;
}
