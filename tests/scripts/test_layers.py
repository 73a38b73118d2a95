#!/usr/bin/env python3
"""The tree's layering (docs/ARCHITECTURE.md, "Layers"), checked on every #include "..." of the
library's sources: each layer includes only itself and the layers below it, nothing in the library
includes tests/ or tools/, and plugin/ includes only the engine's public headers.

    python3 tests/scripts/test_layers.py <source root>
"""
import pathlib
import re
import sys

# Bottom to top; a file may include its own layer and the ones before it.
LAYERS = ["common", "vendor", "transport", "topology", "collectives", "plugin"]
# What plugin/ may include from the layers below it: the engine's public headers.
PLUGIN_PUBLIC = [
    re.compile(r"common/[a-z_]+\.h"),
    re.compile(r"vendor/[a-z_]+\.h"),
    re.compile(r"collectives/[a-z_]+\.h"),  # the top folder only: not algo/, route/, runtime/, device/
    re.compile(r"topology/topology\.h"),
    re.compile(r"transport/bootstrap/bootstrap\.h"),
    re.compile(r"transport/net/(net|backend)\.h"),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".h", ".cc", ".cu", ".cuh", ".h.in")


def violations(root):
    out = []
    for layer_index, layer in enumerate(LAYERS):
        for path in sorted((root / layer).rglob("*")):
            if not path.is_file() or not path.name.endswith(SOURCES):
                continue
            rel = path.relative_to(root)
            for inc in INCLUDE.findall(path.read_text(errors="replace")):
                top = inc.split("/")[0]
                if top in ("tests", "tools"):
                    out.append(f"{rel}: includes {inc} (the library never includes tests/ or tools/)")
                    continue
                if top not in LAYERS:
                    continue  # a generated header or a file next to it
                if LAYERS.index(top) > layer_index:
                    out.append(f"{rel}: includes {inc}, of the layer above it ({top} over {layer})")
                elif layer == "plugin" and top != "plugin" and not any(p.fullmatch(inc) for p in PLUGIN_PUBLIC):
                    out.append(f"{rel}: includes {inc}, which is not one of the engine's public headers")
    return out


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    missing = [layer for layer in LAYERS if not (root / layer).is_dir()]
    if missing:
        print(f"test_layers: no {', '.join(missing)} under {root}")
        return 1
    found = violations(root)
    for line in found:
        print(line)
    print(f"test_layers: {len(found)} include(s) against the layering")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
