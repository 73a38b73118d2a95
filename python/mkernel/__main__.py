"""python -m mkernel [--lib | --plugin-dir | --header | --version | --stats]

Without an option: the version, the library, the plugin folder and how to use them.
"""
import argparse
import json
import sys

import mkernel


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m mkernel", description="Where mkernel's library is, "
                                "for LD_PRELOAD and NCCL's plugin lookup.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lib", action="store_true", help="print the path of libmkernel.so (LD_PRELOAD=...)")
    g.add_argument("--plugin-dir", action="store_true",
                   help="print a folder holding libnccl-net-mkernel.so and libnccl-tuner-mkernel.so "
                        "(LD_LIBRARY_PATH=... with NCCL_NET_PLUGIN=mkernel, NCCL_TUNER_PLUGIN=mkernel)")
    g.add_argument("--header", action="store_true", help="print the path of mkernel_api.h")
    g.add_argument("--version", action="store_true", help="print the library's version (mkernelVersionString)")
    g.add_argument("--stats", action="store_true", help="print mkernelGetStats() of this process as JSON")
    a = p.parse_args(argv)
    try:
        if a.lib:
            print(mkernel.library_path())
        elif a.plugin_dir:
            print(mkernel.plugin_dir())
        elif a.header:
            print(mkernel.header_path())
        elif a.version:
            print(mkernel.version())
        elif a.stats:
            print(json.dumps(mkernel.stats()))
        else:
            lib = mkernel.library_path()
            print(f"{mkernel.version()}\n  library     {lib}\n  plugin dir  {mkernel.plugin_dir()}\n"
                  f"  header      {mkernel.header_path()}\n\n"
                  f"  LD_PRELOAD={lib} <command>          (or: python -m mkernel.run <command>)\n"
                  f"  NCCL_NET_PLUGIN=mkernel NCCL_TUNER_PLUGIN=mkernel "
                  f"LD_LIBRARY_PATH={mkernel.plugin_dir()} <command>")
    except (FileNotFoundError, OSError, ValueError) as e:
        print(f"mkernel: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
