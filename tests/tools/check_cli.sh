#!/bin/sh
# check_cli.sh RC STDOUT_ERE STDERR_ERE COMMAND [ARG...]: runs COMMAND and fails (exit 1, saying
# why) unless it exits with RC, its stdout matches STDOUT_ERE and its stderr matches STDERR_ERE.
# An ERE of "-" stands for "empty"; "." for "anything, even nothing" on stdout, "non-empty" on stderr.
set -u
want_rc=$1 out_re=$2 err_re=$3
shift 3
cmd="$*"
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
"$@" >"$dir/out" 2>"$dir/err"
rc=$?
fail() {
  echo "check_cli: $cmd: $*" >&2
  echo "--- stdout" >&2; cat "$dir/out" >&2
  echo "--- stderr" >&2; cat "$dir/err" >&2
  exit 1
}
[ "$rc" = "$want_rc" ] || fail "exit status $rc, want $want_rc"
case $out_re in
  -) [ ! -s "$dir/out" ] || fail "stdout not empty" ;;
  .) ;;
  *) grep -Eq -- "$out_re" "$dir/out" || fail "stdout does not match /$out_re/" ;;
esac
case $err_re in
  -) [ ! -s "$dir/err" ] || fail "stderr not empty" ;;
  .) [ -s "$dir/err" ] || fail "stderr empty" ;;
  *) grep -Eq -- "$err_re" "$dir/err" || fail "stderr does not match /$err_re/" ;;
esac
echo "check_cli: ok: $cmd"
