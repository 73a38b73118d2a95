#!/usr/bin/env python3
"""Writes docs/SHIM.md's table of NCCL entry points: every nccl* function that each libnccl.so.2
listed in tests/plugin/shim/fixtures/nccl-<version>.txt exports, the versions that export it, and what
the shim does with it, from plugin/shim/nccl_api.def (routed, intercepted, or NCCL directly).
Only what lies between <!-- entry-points:begin --> and <!-- entry-points:end --> is rewritten.

  tests/plugin/shim/entry_points.py            rewrites the table
  tests/plugin/shim/entry_points.py --check    exits 1 when it is stale, or when nccl_api.def names a
                                        function no listed NCCL has (ctest: test_shim_entry_points)
  --doc PATH                            another file
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests/plugin/shim/fixtures"
API_DEF = ROOT / "plugin/shim/nccl_api.def"
BEGIN, END = "<!-- entry-points:begin -->", "<!-- entry-points:end -->"
STR = r'"((?:[^"\\]|\\.)*)"'
API = re.compile(r'^MKERNEL_NCCL_API(?:_SIG)?\(\s*(\w+)\s*,\s*(ROUTED|INTERCEPTED)\s*,\s*' + STR + r'\s*[,)]')
DIRECT = re.compile(r'^MKERNEL_NCCL_DIRECT\(\s*(\w+)\s*,\s*' + STR + r'\s*\)\s*$')
DIRECT_TEXT = "NCCL directly"


def version_key(v):
    return tuple(int(x) for x in v.split("."))


def read_fixtures():
    lists = {}
    for path in FIXTURES.glob("nccl-*.txt"):
        version = path.stem[len("nccl-"):]
        names = [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")]
        lists[version] = set(names)
    if not lists:
        sys.exit(f"no nccl-<version>.txt in {FIXTURES}")
    return dict(sorted(lists.items(), key=lambda kv: version_key(kv[0])))


def read_api():
    shim, direct = {}, {}
    for n, line in enumerate(API_DEF.read_text().splitlines(), 1):
        s = line.strip()
        if s.startswith("MKERNEL_NCCL_API"):
            m = API.match(s)
            if not m:
                sys.exit(f"{API_DEF}:{n}: not an MKERNEL_NCCL_API row of the current format")
            shim[m.group(1)] = (m.group(2).lower(), m.group(3))
        elif s.startswith("MKERNEL_NCCL_DIRECT("):
            m = DIRECT.match(s)
            if not m:
                sys.exit(f"{API_DEF}:{n}: not an MKERNEL_NCCL_DIRECT row of the current format")
            direct[m.group(1)] = m.group(2)
    return shim, direct


def problems(lists, shim, direct):
    known = set().union(*lists.values())
    out = [f"nccl_api.def exports {n}, which no NCCL in tests/plugin/shim/fixtures exports" for n in sorted(shim) if n not in known]
    out += [f"nccl_api.def notes {n} as reaching NCCL directly, but it exports it" for n in sorted(direct) if n in shim]
    out += [f"nccl_api.def notes {n}, which no NCCL in tests/plugin/shim/fixtures exports" for n in sorted(direct) if n not in known]
    return out


def table(lists, shim, direct):
    versions = list(lists)
    names = sorted(set().union(*lists.values()) | set(shim))
    rows = ["| entry point | " + " | ".join(versions) + " | the shim |",
            "|---|" + ":-:|" * len(versions) + "---|"]
    for n in names:
        marks = " | ".join("x" if n in lists[v] else "" for v in versions)
        if n in shim:
            role, what = shim[n]
            cell = f"**{role}**: {what}"
        else:
            cell = DIRECT_TEXT + (f": {direct[n]}" if n in direct else "")
        rows.append(f"| `{n}` | {marks} | {cell} |")
    counts = ", ".join(f"{v}: {len(lists[v])}" for v in versions)
    routed = sum(1 for r, _ in shim.values() if r == "routed")
    rows.append("")
    rows.append(f"Exported by the NCCLs listed: {counts}. The shim exports {len(shim)} ({routed} routed, "
                f"{len(shim) - routed} intercepted); the other {len(names) - len(shim)} reach NCCL directly.")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when the table is stale")
    ap.add_argument("--doc", default=str(ROOT / "docs/SHIM.md"))
    args = ap.parse_args()
    lists = read_fixtures()
    shim, direct = read_api()
    bad = problems(lists, shim, direct)
    for p in bad:
        print(p, file=sys.stderr)
    doc = pathlib.Path(args.doc)
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{doc}: no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + BEGIN + "\n" + table(lists, shim, direct) + "\n" + END + tail
    if args.check:
        if new != text:
            print(f"{doc}: the table of entry points is stale: run tests/plugin/shim/entry_points.py", file=sys.stderr)
            return 1
        return 1 if bad else 0
    if new != text:
        doc.write_text(new)
        print(f"wrote {doc}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
