#!/bin/bash
# Builds a tiny initramfs: static busybox + the guest kernel modules needed for 9p sharing of the
# host root, overlayfs, virtio-net and Soft-RoCE (rdma_rxe). Called by setup.sh.
# Env: KROOT (the unpacked linux-image-*.deb), OUT (the .cpio.gz to write).
set -euo pipefail
KROOT=$(realpath "${KROOT:?KROOT: unpacked kernel package}")
OUT=${OUT:?OUT: initramfs path}
KV=$(ls "$KROOT/lib/modules" | head -1)
W=$(mktemp -d "$(dirname "$OUT")/initramfs.XXXXXX")
trap 'rm -rf "$W"' EXIT
mkdir -p "$W"/{bin,sbin,proc,sys,dev,tmp,host,newroot,rw,lib/modules/$KV}
cp /bin/busybox "$W/bin/busybox"
depmod -b "$KROOT" "$KV"
# crc32_generic: without a crc32 crypto module `rdma link add` fails.
MODS="sch_netem crc32_generic crc32_pclmul virtio_pci virtio_net 9p 9pnet_virtio overlay rdma_rxe ib_uverbs rdma_ucm ib_umad dummy veth"
for m in $MODS; do modprobe -d "$KROOT" -S "$KV" --show-depends $m 2>/dev/null || true; done |
  awk '$1=="insmod"{print $2}' | sort -u |
  while read -r f; do rel=${f#$KROOT}; mkdir -p "$W$(dirname "$rel")"; cp "$f" "$W$rel"; done
cp "$KROOT/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$W/lib/modules/$KV/" 2>/dev/null || true
depmod -b "$W" "$KV"
echo "$MODS" > "$W/modules.list"
cp "$(dirname "$0")/guest-init.sh" "$W/init"; chmod +x "$W/init"
(cd "$W" && find . | cpio -o -H newc --quiet | gzip -1) > "$OUT"
ls -la "$OUT"
