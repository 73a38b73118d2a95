#!/usr/bin/env bash
# The install tree (ctest test_install, label unit):
#   bash tests/install/check_install.sh BUILD_DIR VERSION C_COMPILER
# Installs BUILD_DIR to a temporary prefix with `cmake --install`, checks the files and links that
# are there, builds tests/install/consumer.c against it twice (find_package(mkernel) and
# pkg-config) and runs it, and opens the plugins the way NCCL does (plugin_probe.c).
set -euo pipefail
build=$1 version=$2 cc=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "check_install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install failed"; }
(cd "$prefix" && find . | sort)

# lib, lib64 or lib/<multiarch>, as GNUInstallDirs chose it.
real=$(find "$prefix" -name "libmkernel.so.$version" -type f)
[ -n "$real" ] || fail "no libmkernel.so.$version"
libdir=$(dirname "$real")
for name in libmkernel.so.0 libmkernel.so libnccl-net-mkernel.so libnccl-tuner-mkernel.so; do
  [ -L "$libdir/$name" ] || fail "$libdir/$name is not a symlink"
  [ "$(readlink -f "$libdir/$name")" = "$(readlink -f "$real")" ] || fail "$libdir/$name does not resolve to $real"
done
soname=$(objdump -p "$real" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = libmkernel.so.0 ] || fail "SONAME is '$soname'"
for f in include/mkernel_api.h; do [ -f "$prefix/$f" ] || fail "no $f"; done
for f in cmake/mkernel/mkernelConfig.cmake cmake/mkernel/mkernelConfigVersion.cmake \
         cmake/mkernel/mkernelTargets.cmake pkgconfig/mkernel.pc; do
  [ -f "$libdir/$f" ] || fail "no $libdir/$f"
done
for tool in mkernel-topo mkernel-model; do
  if [ -x "$build/bin/$tool" ]; then [ -x "$prefix/bin/$tool" ] || fail "no bin/$tool"; fi
done

# The header is self-contained C (C99 and C11, warnings as errors).
for std in c99 c11; do
  printf '#include <mkernel_api.h>\n' |
    "$cc" -std=$std -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$prefix/include" -x c - ||
    fail "mkernel_api.h is not self-contained $std"
done

want="mkernel $version"
# find_package(mkernel): a C project that links mkernel::mkernel (its build RPATH finds the library).
cmake -S "$here/find_package" -B "$work/fp" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
  -DMKERNEL_EXPECTED_VERSION="$version" >"$work/fp.log" 2>&1 || { cat "$work/fp.log"; fail "find_package(mkernel) failed"; }
cmake --build "$work/fp" >>"$work/fp.log" 2>&1 || { cat "$work/fp.log"; fail "find_package consumer does not build"; }
out=$("$work/fp/consumer")
echo "find_package consumer: $out"
[ "$(head -1 <<<"$out")" = "$want" ] || fail "find_package consumer printed '$out', want '$want'"

# pkg-config: the same program built with the flags mkernel.pc gives.
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion mkernel)" = "$version" ] || fail "pkg-config --modversion: $(pkg-config --modversion mkernel)"
# shellcheck disable=SC2046
"$cc" -o "$work/pc-consumer" "$here/consumer.c" $(pkg-config --cflags --libs mkernel) || fail "pkg-config consumer does not build"
out=$(LD_LIBRARY_PATH=$(pkg-config --variable=libdir mkernel) "$work/pc-consumer")
echo "pkg-config consumer: $out"
[ "$(head -1 <<<"$out")" = "$want" ] || fail "pkg-config consumer printed '$out', want '$want'"

# The plugins, found as NCCL finds them: by name through LD_LIBRARY_PATH.
"$cc" -o "$work/plugin_probe" "$here/plugin_probe.c" -ldl || fail "plugin_probe does not build"
out=$(NCCL_NET_PLUGIN=mkernel NCCL_TUNER_PLUGIN=mkernel LD_LIBRARY_PATH=$libdir "$work/plugin_probe") ||
  fail "plugin_probe: $out"
echo "$out"
grep -qx "$want" <<<"$out" || fail "plugin_probe printed no '$want'"
echo "check_install: passed"
