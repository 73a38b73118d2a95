#!/bin/bash
# Usage: run.sh 'shell command run inside the VM (host paths are visible)'
# Boots the Soft-RoCE VM (QEMU, TCG unless VM_ACCEL=kvm), shares the host's / read-only (tmpfs
# overlay) and the current directory read-write at the same path, creates rxe0 on a dummy netdev
# (or on eth0 when VM_NIC is set), runs the command there and returns its exit status
# (124: timeout, 125: the VM gave no status). The command's output is printed when the VM exits.
# Env: VM_HOME (default <repo>/.vm), VM_TIMEOUT (s, default 300), VM_ACCEL (tcg|kvm), VM_MEM (MiB),
#      VM_SMP, VM_IP (default 198.51.100.1), VM_NIC (listen:PORT | connect:PORT, see pair.sh),
#      VM_KEEP (keep the job folder).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VM_HOME=${VM_HOME:-$REPO/.vm}
KROOT=$VM_HOME/kernel/root
KERNEL=$(ls "$KROOT"/boot/vmlinuz-* 2>/dev/null | head -1)
INITRD=$VM_HOME/initramfs.cpio.gz
if [ -z "$KERNEL" ] || [ ! -s "$INITRD" ]; then echo "run.sh: VM not set up (run scripts/rdma-vm/setup.sh)" >&2; exit 125; fi
mkdir -p "$VM_HOME/jobs"; JOB=$(mktemp -d "$VM_HOME/jobs/job.XXXXXX")
WORKDIR=$(pwd)
{ printf 'cd %q || exit 126\n' "$WORKDIR"; printf '%s\n' "$*"; } > "$JOB/cmd.sh"
echo "$WORKDIR" > "$JOB/workdir"
realpath "$KROOT" > "$JOB/kroot"
IP=${VM_IP:-198.51.100.1}; echo "$IP" > "$JOB/ip"
# No VM_NIC: rxe0 on a dummy netdev (one-node loopback RDMA). VM_NIC=listen:PORT / connect:PORT:
# a virtio NIC joined to another VM through a TCP socket on host loopback (two-node RDMA).
NIC=(-nic none)
case "${VM_NIC:-}" in
  listen:*|connect:*) NIC=(-netdev "socket,id=n0,${VM_NIC%%:*}=127.0.0.1:${VM_NIC#*:}"
                       -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:$(printf %02x "${IP##*.}")");;
esac
case "${VM_ACCEL:-tcg}" in
  kvm) ACCEL=(-accel kvm -cpu "${VM_CPU:-host}");;
  *)   ACCEL=(-accel tcg,thread=multi -cpu max);;
esac
start=$(date +%s%N)
timeout --foreground -k 5 "${VM_TIMEOUT:-300}" qemu-system-x86_64 "${ACCEL[@]}" \
  -machine q35 -m "${VM_MEM:-2048}" -smp "${VM_SMP:-2}" \
  -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$JOB",mount_tag=job,security_model=none \
  -virtfs local,path="$WORKDIR",mount_tag=work,security_model=none \
  "${NIC[@]}" -display none -monitor none -serial file:"$JOB/console.log" -no-reboot
qrc=$?
end=$(date +%s%N)
cat "$JOB/log" 2>/dev/null
grep VMINIT "$JOB/console.log" >&2
echo "vm-run: qemu rc=$qrc wall=$(( (end - start) / 1000000 ))ms job=$JOB" >&2
if [ "$qrc" = 124 ]; then exit 124; fi
rc=125; [ -s "$JOB/rc" ] && rc=$(cat "$JOB/rc")
[ "$rc" = 0 ] && [ -z "${VM_KEEP:-}" ] && rm -rf "$JOB"
exit "$rc"
