#!/usr/bin/env bash
# Network-fault tier (docs/RELIABILITY.md): the TCP net::Net backend across two network namespaces
# joined by a veth pair, with faults in between: a tc tbf rate limit, nftables random drops, a cut
# link (ip link set down), a stalled peer (SIGSTOP) and a killed peer (SIGKILL). Transfers must
# complete with every byte right, or fail cleanly (exit 2, an error message) within
# MKERNEL_TIMEOUT_S — never hang, never deliver a wrong byte. Bounded to about 2 minutes.
#   NETFAULT_BUILD=<build dir with netfault_peer, default build> scripts/netfault-tier.sh
# Skips (exit 0, "skipped: <reason>") when namespaces cannot be made, unless CI=true.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${NETFAULT_BUILD:-$ROOT/build}
TIMEOUT_S=${NETFAULT_TIMEOUT_S:-5}
NS_A=mknf-a-$$ NS_B=mknf-b-$$ IF_A=mknfa$$ IF_B=mknfb$$
IP_A=10.201.77.1 IP_B=10.201.77.2
WORK=$(mktemp -d /tmp/netfault.XXXXXX)

skip() {
  if [ "${CI:-}" = true ]; then echo "netfault-tier: FAILED (CI=true, cannot skip): $*"; exit 1; fi
  echo "netfault-tier: skipped: $*"; exit 0
}
cleanup() {
  ip netns del "$NS_A" 2>/dev/null; ip netns del "$NS_B" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) not installed"
if ! command -v nft >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null 2>&1
fi
ip netns add "$NS_A" 2>/dev/null || skip "cannot create a network namespace"
ip netns add "$NS_B" || skip "cannot create a second network namespace"
ip link add "$IF_A" type veth peer name "$IF_B" || skip "cannot create a veth pair"
ip link set "$IF_A" netns "$NS_A" && ip link set "$IF_B" netns "$NS_B" || skip "cannot move veths into namespaces"
ip -n "$NS_A" addr add "$IP_A/24" dev "$IF_A" && ip -n "$NS_B" addr add "$IP_B/24" dev "$IF_B"
ip -n "$NS_A" link set "$IF_A" up && ip -n "$NS_B" link set "$IF_B" up
ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up

if [ ! -x "$BUILD/tests/soak/netfault_peer" ]; then
  cmake --build "$BUILD" --target netfault_peer -j "${MK_JOBS:-2}" >/dev/null || { echo "netfault-tier: cannot build netfault_peer in $BUILD"; exit 1; }
fi
PEER=$BUILD/tests/soak/netfault_peer
export MKERNEL_TIMEOUT_S=$TIMEOUT_S MKERNEL_NET_SOCKETS=2 MKERNEL_DEBUG=WARN

status=0
printf '%-28s %-9s %-6s %-14s %8s %9s  %s\n' scenario receiver sender code seconds "err_after" "message"
# run NAME MESSAGES BYTES EXPECT(ok|error) [ACTION-AFTER-SECONDS ACTION...]
run() {
  local name=$1 msgs=$2 bytes=$3 expect=$4; shift 4
  local hf=$WORK/$name.handle
  rm -f "$hf"
  ip netns exec "$NS_A" env MKERNEL_SOCKET_IFNAME="=$IF_A" timeout 30 "$PEER" recv "$hf" "$msgs" "$bytes" >"$WORK/$name.recv" 2>"$WORK/$name.recv.err" &
  local rpid=$!
  ip netns exec "$NS_B" env MKERNEL_SOCKET_IFNAME="=$IF_B" "$PEER" send "$hf" "$msgs" "$bytes" >"$WORK/$name.send" 2>"$WORK/$name.send.err" &
  local spid=$!  # ip netns exec and env exec in place: this is the peer itself
  if [ $# -gt 0 ]; then
    local after=$1; shift
    sleep "$after"
    "$@" "$spid"
  fi
  wait $rpid; local rrc=$?
  kill -CONT $spid 2>/dev/null; kill -9 $spid 2>/dev/null
  wait $spid 2>/dev/null; local src=$?
  local rline sline; rline=$(cat "$WORK/$name.recv"); sline=$(cat "$WORK/$name.send")
  [ -n "${NETFAULT_VERBOSE:-}" ] && echo "   recv: $rline" && echo "   send: $sline"
  local res=${rline#result=}; res=${res%% *}
  local secs; secs=$(echo "$rline" | grep -Eo 'seconds=[0-9.]+' | cut -d= -f2)
  local errafter; errafter=$(echo "$rline" | grep -Eo 'error_after_progress_s=[0-9.]+' | cut -d= -f2)
  local msg; msg=$(echo "$rline" | grep -Eo 'msg=".*"' | cut -c5- | cut -c1-90)
  local code; code=$(echo "$rline" | grep -Eo 'code=[0-9]+' | cut -d= -f2)
  printf '%-28s %-9s %-6s %-14s %8s %9s  %s\n' "$name" "${res:-none}($rrc)" "$src" "${code:-?}" "${secs:-?}" "${errafter:-?}" "$msg"
  local bad=0
  [ "$rrc" = 1 ] && bad=1                                       # a wrong byte is never acceptable
  [ "$expect" = ok ] && [ "$rrc" != 0 ] && bad=1
  [ "$expect" = error ] && [ "$rrc" != 2 ] && bad=1             # must fail cleanly, not hang (124)
  if [ "$expect" = error ] && [ -n "$errafter" ] && awk -v e="$errafter" -v t="$TIMEOUT_S" 'BEGIN { exit !(e > t + 3) }'; then bad=1; fi
  if [ $bad = 1 ]; then status=1; echo "   ^ FAILED: expected $expect; receiver stderr:"; tail -3 "$WORK/$name.recv.err" | sed 's/^/   /'; fi
}
stop_peer() { kill -STOP "$1"; }
kill_peer() { kill -9 "$1"; }
cut_link() { ip -n "$NS_B" link set "$IF_B" down; }

only() { [ -z "${NETFAULT_ONLY:-}" ] || [[ "$1" == *"$NETFAULT_ONLY"* ]]; }
only baseline && run baseline_64x1MiB 64 1048576 ok
if only tbf; then
  tc -n "$NS_B" qdisc add dev "$IF_B" root tbf rate 40mbit burst 32kbit latency 50ms
  run tbf_40mbit_16x1MiB 16 1048576 ok
  tc -n "$NS_B" qdisc del dev "$IF_B" root
fi
if ! only nft; then
  :
elif command -v nft >/dev/null; then
  ip netns exec "$NS_B" nft add table inet mknf
  ip netns exec "$NS_B" nft add chain inet mknf out '{ type filter hook output priority 0 ; }'
  ip netns exec "$NS_B" nft add rule inet mknf out numgen random mod 100 '<' 5 counter drop
  run nft_drop5pct_32x1MiB 32 1048576 ok
  echo "   nft dropped: $(ip netns exec "$NS_B" nft list table inet mknf | grep -Eo 'packets [0-9]+ bytes [0-9]+')"
  ip netns exec "$NS_B" nft delete table inet mknf
else
  echo "nft_drop5pct: skipped: nftables not installed"
fi
only peer_killed && run peer_killed_mid_transfer 100000 1048576 error 1 kill_peer
only peer_stalled && run peer_stalled_sigstop 100000 1048576 error 1 stop_peer
only link_cut && run link_cut_mid_transfer 100000 1048576 error 1 cut_link
[ $status = 0 ] && echo "netfault-tier: passed" || echo "netfault-tier: FAILED"
exit $status
