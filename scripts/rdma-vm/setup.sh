#!/bin/bash
# One-time setup of the Soft-RoCE VM (adapted from the team's reference in /work/shared/rdma-vm/):
#   1. host packages (qemu, busybox-static, rdma-core, ...), installed with apt-get only if missing;
#   2. the Debian kernel package, fetched with `apt-get download` and unpacked (never installed)
#      into $VM_HOME/kernel (cached: a second run does not download again);
#   3. a small initramfs (static busybox + the modules for 9p, overlayfs, virtio-net, rdma_rxe).
# VM_HOME defaults to <repo>/.vm (ignored by git). Exit 0 when the VM is ready; non-zero with a
# one-line reason on stderr otherwise (scripts/verbs-tier.sh turns that into "skipped: ...").
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VM_HOME=${VM_HOME:-$REPO/.vm}
KDIR=$VM_HOME/kernel
mkdir -p "$VM_HOME"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || need+=(busybox-static)
for p in cpio kmod iproute2 rdma-core ibverbs-providers ibverbs-utils libibverbs-dev file; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "setup: missing packages ${need[*]} and not root" >&2; exit 2; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    { echo "setup: apt-get install ${need[*]} failed" >&2; exit 2; }
fi
[ -x /bin/busybox ] || { echo "setup: no static busybox" >&2; exit 2; }

if ! ls "$KDIR"/root/boot/vmlinuz-* >/dev/null 2>&1; then
  KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$KPKG" ] || { echo "setup: no linux-image package known to apt (apt-get update?)" >&2; exit 3; }
  rm -rf "$KDIR"; mkdir -p "$KDIR"
  (cd "$KDIR" && apt-get download "$KPKG" >/dev/null 2>&1 && dpkg-deb -x "$KPKG"_*.deb root && rm -f "$KPKG"_*.deb) ||
    { echo "setup: could not download $KPKG" >&2; rm -rf "$KDIR"; exit 3; }
fi

INITRD=$VM_HOME/initramfs.cpio.gz
if [ ! -s "$INITRD" ] || [ "$HERE/guest-init.sh" -nt "$INITRD" ] || [ "$HERE/build-initramfs.sh" -nt "$INITRD" ]; then
  KROOT="$KDIR/root" OUT="$INITRD" "$HERE/build-initramfs.sh" >/dev/null
fi
echo "setup: VM ready in $VM_HOME ($(basename "$(ls "$KDIR"/root/boot/vmlinuz-* | head -1)"))"
