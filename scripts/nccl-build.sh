#!/usr/bin/env bash
# Builds libnccl.so.2 from NCCL's source with NCCL's own Makefile, for one GPU architecture, into an
# install prefix of its own (PREFIX/lib/libnccl.so.2, PREFIX/include/nccl.h), for running mkernel's
# shim and plugins against NCCL versions other than the installed one (docs/TROUBLESHOOTING.md,
# "NCCL versions"). No network is needed: the source is a folder, or a tag of a git dir.
#
#   scripts/nccl-build.sh --src DIR --prefix PREFIX [options]
#   scripts/nccl-build.sh --src GITDIR --tag v2.30.7-1 --prefix /tmp/nccl-2.30.7 [options]
#
#   --src DIR        an NCCL source tree (Makefile, src/nccl.h.in), or with --tag a git dir (bare or
#                    not) that holds the tag
#   --tag TAG        `git archive TAG` of --src into PREFIX/src, then build that
#   --prefix PREFIX  NCCL's BUILDDIR: include/, lib/ and obj/ (kept for a rebuild) go there
#   --jobs N         make -j N (default: every core)
#   --arch SM        the compute capability built, without the dot (default 90: sm_90 only)
#   --only-funcs F   NCCL's ONLY_FUNCS (src/device/generate.py): device kernels of these
#                    collectives only, e.g. "AllReduce Sum f32 RING SIMPLE" (a build check in a
#                    fraction of the time; collectives left out fail at run time)
# Only libnccl.so is built (NCCL's src.lib: no static library, packages, tools or tests). At the end
# the script prints the library's own ncclGetVersion() and exits non-zero when the build failed or
# that version is not the one in PREFIX/include/nccl.h. Environment: CUDA_HOME (/usr/local/cuda).
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"

die() { printf 'nccl-build.sh: %s\n' "$*" >&2; exit 1; }

src="" tag="" prefix="" jobs=$(nproc) arch=90 only_funcs=""
while [ $# -gt 0 ]; do
  case $1 in
    --src) src=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --only-funcs) only_funcs=$2; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$src" ] || die "--src is required (see --help)"
[ -n "$prefix" ] || die "--prefix is required (see --help)"
[[ $arch =~ ^[0-9]+[a-z]?$ ]] || die "--arch $arch: a compute capability without the dot, e.g. 90"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc: set CUDA_HOME"
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

if [ -n "$tag" ]; then
  git --git-dir="$src" rev-parse -q --verify "$tag^{commit}" >/dev/null 2>&1 ||
    git --git-dir="$src/.git" rev-parse -q --verify "$tag^{commit}" >/dev/null 2>&1 ||
    die "no tag $tag in the git dir $src"
  gitdir=$src
  [ -d "$src/.git" ] && gitdir=$src/.git
  src=$prefix/src
  if [ "$(cat "$src/.nccl-build-tag" 2>/dev/null)" != "$tag" ]; then
    echo "== git archive $tag -> $src"
    rm -rf "$src"
    mkdir -p "$src"
    git --git-dir="$gitdir" archive "$tag" | tar -x -C "$src"
    echo "$tag" >"$src/.nccl-build-tag"
  fi
fi
if [ ! -f "$src/Makefile" ] || [ ! -f "$src/src/nccl.h.in" ]; then
  die "$src is not an NCCL source tree (no Makefile, src/nccl.h.in)"
fi
src=$(cd "$src" && pwd)
version=$(sed -n 's/^NCCL_\(MAJOR\|MINOR\|PATCH\) *:= *\([0-9]*\).*/\2/p' "$src/makefiles/version.mk" | paste -sd.)

gencode="-gencode=arch=compute_$arch,code=sm_$arch"
echo "== NCCL $version from $src: make -j$jobs src.lib, $gencode${only_funcs:+, ONLY_FUNCS=\"$only_funcs\"} -> $prefix"
args=(-C "$src" -j"$jobs" src.lib BUILDDIR="$prefix" CUDA_HOME="$CUDA_HOME" NVCC_GENCODE="$gencode")
# NCCL's host compiles put CUDA's include folder (CUDA_INC) before the tree's own: NCCL headers
# installed there (a CUDA toolkit with NCCL) would shadow the version being built. CUDA_INC is
# then a folder of links to everything in it but those.
if compgen -G "$CUDA_HOME/include/nccl*" >/dev/null; then
  inc=$prefix/cuda-include
  rm -rf "$inc"
  mkdir -p "$inc"
  for f in "$CUDA_HOME"/include/*; do
    case ${f##*/} in nccl*) ;; *) ln -s "$f" "$inc/" ;; esac
  done
  args+=(CUDA_INC="$inc")
  echo "   CUDA_INC=$inc: $CUDA_HOME/include without its NCCL headers ($(cd "$CUDA_HOME/include" && echo nccl*))"
fi
[ -n "$only_funcs" ] && args+=(ONLY_FUNCS="$only_funcs")
start=$(date +%s)
# NCCL's version header runs `git describe` in the source: never the repository around it.
GIT_CEILING_DIRECTORIES=$(dirname "$src") make "${args[@]}" >"$prefix/build.log" 2>&1 || {
  grep -E -m10 -A4 'error|Error' "$prefix/build.log" || tail -20 "$prefix/build.log"
  die "make failed after $(( $(date +%s) - start )) s (log: $prefix/build.log)"
}
echo "build: $(( $(date +%s) - start )) s (log: $prefix/build.log)"

lib=$prefix/lib/libnccl.so.2
[ -f "$lib" ] || die "the build left no $lib"
header=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$prefix/include/nccl.h" | paste -sd.)
# ncclGetVersion needs no GPU: the library's version as an application sees it.
got=$(mk_nccl_lib_version "$lib") || die "ncclGetVersion of $lib failed"
vs=$(grep -a -m1 -oE 'NCCL version [0-9][^ [:cntrl:]]*' "$lib" || echo "no version string")
echo "$lib: NCCL $got (ncclGetVersion; \"$vs\"), nccl.h $header"
[ "$got" = "$header" ] || die "the library reports $got, its nccl.h $header"
