#!/usr/bin/env python3
"""The mkernel Python module against a real libmkernel.so (ctest test_python_module, and
scripts/test.sh's wheel stage in a fresh venv):

  python3 tests/install/check_python.py --version X.Y.Z --cc gcc

Checks `python -m mkernel --lib/--version/--plugin-dir/--header`, mkernel.stats() (every counter
zero in a process that ran no collective), mkernelStats_t's layout as the module reads it from the
header against the C compiler's (sizeof, offsetof of every field), that a changed struct the
reader cannot follow is refused, the plugin names opened by name as NCCL does, and
`python -m mkernel.run` (LD_PRELOAD appended, the command exec'd). Run it outside the source tree
to check an installed package. Prints one line per check; exit status 1 on the first failure.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import mkernel
from mkernel._header import parse_struct


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + str(detail) if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def cli(*args, env=None):
    r = subprocess.run([sys.executable, "-m", "mkernel", *args], capture_output=True, text=True, env=env)
    check(f"python -m mkernel {' '.join(args)} exits 0", r.returncode == 0, r.stderr.strip())
    return r.stdout.strip()


def c_layout(cc, header, fields):
    """sizeof(mkernelStats_t) and offsetof of each field, as the C compiler lays them out."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "layout.c")
        with open(src, "w") as f:
            f.write('#include <stddef.h>\n#include <stdio.h>\n#include "mkernel_api.h"\nint main(void) {\n')
            f.write('  printf("%zu\\n", sizeof(mkernelStats_t));\n')
            for name, _, _ in fields:
                f.write(f'  printf("%zu\\n", offsetof(mkernelStats_t, {name}));\n')
            f.write("  return 0;\n}\n")
        exe = os.path.join(d, "layout")
        subprocess.run([cc, "-std=c99", "-I", os.path.dirname(header), "-o", exe, src], check=True)
        out = [int(v) for v in subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()]
    return out[0], out[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--version", required=True, help="the project's version (CMakeLists.txt's project())")
    p.add_argument("--cc", required=True, help="C compiler for the layout check")
    p.add_argument("--installed", action="store_true",
                   help="the module must be an installed package that carries its library and header")
    a = p.parse_args()
    want = f"mkernel {a.version}"
    if a.installed:
        pkg = os.path.dirname(os.path.abspath(mkernel.__file__))
        check("mkernel is the installed package", "site-packages" in pkg.split(os.sep), pkg)
        check("the package carries lib/libmkernel.so", mkernel.library_path() == os.path.join(pkg, "lib", "libmkernel.so"))
        check("the package carries include/mkernel_api.h", mkernel.header_path() == os.path.join(pkg, "include", "mkernel_api.h"))
        from importlib.metadata import version
        check("the package's version is the project's", version("mkernel") == a.version, version("mkernel"))

    lib = cli("--lib")
    check("--lib prints an existing file", os.path.isfile(lib), lib)
    check("--lib is mkernel.library_path()", lib == mkernel.library_path())
    check("--version is the library's mkernelVersionString", cli("--version") == want, want)
    check("mkernel.version()", mkernel.version() == want, mkernel.version())
    header = cli("--header")
    check("--header prints an existing file", os.path.isfile(header), header)

    plugins = cli("--plugin-dir")
    for name in mkernel.PLUGIN_NAMES:
        path = os.path.join(plugins, name)
        check(f"{name} in the plugin dir resolves to the library",
              os.path.realpath(path) == os.path.realpath(lib), path)
    # NCCL_NET_PLUGIN=mkernel: NCCL dlopens libnccl-net-mkernel.so by name (LD_LIBRARY_PATH).
    probe = ("import ctypes; n = ctypes.CDLL('libnccl-net-mkernel.so'); t = ctypes.CDLL('libnccl-tuner-mkernel.so');"
             "print(ctypes.c_char_p.in_dll(n, 'ncclNetPlugin_v11').value.decode(),"
             " ctypes.c_char_p.in_dll(t, 'ncclTunerPlugin_v5').value.decode())")
    env = dict(os.environ, LD_LIBRARY_PATH=plugins)
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    check("the plugins open by name through --plugin-dir (ncclNetPlugin_v11, ncclTunerPlugin_v5)",
          r.returncode == 0 and r.stdout.split() == ["mkernel", "mkernel"], (r.stdout + r.stderr).strip())

    # The struct: one copy, the header's; laid out as the C compiler lays it out.
    with open(mkernel.header_path()) as f:
        text = f.read()
    fields = parse_struct(text)
    t = mkernel.stats_type()
    size, offsets = c_layout(a.cc, mkernel.header_path(), fields)
    check("sizeof(mkernelStats_t) as C has it", ctypes.sizeof(t) == size, f"{ctypes.sizeof(t)} vs {size}")
    mine = [getattr(t, name).offset for name, _, _ in fields]
    check("offsetof of every field as C has it", mine == offsets, dict(zip([f[0] for f in fields], offsets)))
    for bad in ("double ratio;", "uint64_t a, b;", "struct { uint64_t x; } nested;", "uint64_t v[N];"):
        changed = text.replace("uint64_t countersLate;", f"uint64_t countersLate;\n  {bad}")
        check(f"the header has 'uint64_t countersLate;' to add '{bad}' after", changed != text)
        try:
            parse_struct(changed)
            refused = False
        except ValueError:
            refused = True
        check(f"a struct with '{bad}' is refused", refused)

    s = mkernel.stats()
    names = [name for name, _, _ in fields][1:]
    check("mkernel.stats() has the header's fields", list(s) == names, list(s))
    flat = [v for x in s.values() for v in (x if isinstance(x, list) else [x])]
    check("mkernel.stats(): every counter zero", not any(flat), json.dumps(s))
    check("python -m mkernel --stats", json.loads(cli("--stats")) == s)

    # python -m mkernel.run: LD_PRELOAD appended to the one there, the command exec'd; the child
    # finds the preloaded library (mkernel.stats(load=False) is not None).
    child = ("import json, os, mkernel; "
             "print(json.dumps([os.environ['LD_PRELOAD'], mkernel.stats(load=False) is not None]))")
    env = dict(os.environ, LD_PRELOAD="libm.so.6")
    r = subprocess.run([sys.executable, "-m", "mkernel.run", sys.executable, "-c", child],
                       capture_output=True, text=True, env=env)
    got = json.loads(r.stdout) if r.returncode == 0 else r.stderr
    check("python -m mkernel.run: LD_PRELOAD=libm.so.6:<lib>, library loaded in the command",
          got == [f"libm.so.6:{lib}", True], got)
    r = subprocess.run([sys.executable, "-m", "mkernel.run", "mkernel-no-such-command"],
                       capture_output=True, text=True)
    check("python -m mkernel.run: a missing command exits 127", r.returncode == 127, r.stderr.strip())
    print("check_python: passed")


if __name__ == "__main__":
    main()
