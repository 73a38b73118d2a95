# Session 37: runs scripts/probes/greenlaunch.cu on the device machine (see its header).
set -u
nvcc -arch=sm_90 -O2 -std=c++17 -o /tmp/gl scripts/probes/greenlaunch.cu -lcuda || exit 1
for n in 8 2 4; do
  for m in primary green pordered ordered; do timeout 60 /tmp/gl $n $m; done
done
for m in primary green; do timeout 60 /tmp/gl 8 $m; done
