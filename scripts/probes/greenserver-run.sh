# Session 37: runs scripts/probes/greenserver.cu on the device machine (see its header).
set -u
nvcc -arch=sm_90 -O2 -std=c++17 -o /tmp/gs scripts/probes/greenserver.cu -lcuda || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for a in "2 green 0" "2 green 3" "8 green 0" "8 green 1" "8 green 2" "8 green 3" "8 primary 0" "8 primary 3" "4 green 0" "4 green 3"; do
  echo "== $a"; timeout 40 /tmp/gs $a 2000 2>&1 | grep -v "empty kernels"; echo "rc $?"
done
