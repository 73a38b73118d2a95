#!/bin/bash
# Usage: pair.sh 'server command' 'client command'
# Boots two VMs (1 vCPU each) whose virtio NICs are joined by a TCP socket on 127.0.0.1:$VM_PORT;
# rxe0 sits on eth0, 198.51.100.1 in the server VM and 198.51.100.2 in the client VM. The client
# must retry until the server listens. Exit 0 only if both commands exit 0.
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export VM_HOME=${VM_HOME:-$REPO/.vm}
PORT=${VM_PORT:-$((20000 + RANDOM % 20000))}
export VM_SMP=${VM_SMP:-1} VM_TIMEOUT=${VM_TIMEOUT:-300}
mkdir -p "$VM_HOME"
OUT1=$(mktemp "$VM_HOME/pair.XXXXXX")
VM_NIC=listen:$PORT VM_IP=198.51.100.1 "$HERE/run.sh" "$1" > "$OUT1" 2>&1 & P1=$!
sleep 1
VM_NIC=connect:$PORT VM_IP=198.51.100.2 "$HERE/run.sh" "$2" 2>&1 | sed 's/^/[vm2] /'; rc2=${PIPESTATUS[0]}
wait $P1; rc1=$?
sed 's/^/[vm1] /' "$OUT1"; rm -f "$OUT1"
echo "pair: server rc=$rc1 client rc=$rc2" >&2
[ "$rc1" = 0 ] && [ "$rc2" = 0 ]
