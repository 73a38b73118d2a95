"""python -m mkernel.run <command> [args...]

Runs the command with libmkernel.so preloaded: LD_PRELOAD gets the library appended (after any
libraries already there; not twice), then the command replaces this process (exec), e.g.

  python -m mkernel.run torchrun --nproc-per-node 8 train.py
"""
import os
import sys

import mkernel


def preload_env(env, lib):
    """env's LD_PRELOAD with lib appended (the loader splits the list on ':' and spaces)."""
    current = env.get("LD_PRELOAD", "")
    entries = [e for e in current.replace(" ", ":").split(":") if e]
    if any(os.path.realpath(e) == os.path.realpath(lib) for e in entries):
        return current
    return ":".join(entries + [lib])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        lib = mkernel.library_path()
    except FileNotFoundError as e:
        print(f"mkernel.run: {e}", file=sys.stderr)
        return 1
    os.environ["LD_PRELOAD"] = preload_env(os.environ, lib)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"mkernel.run: {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
