#!/usr/bin/env python3
"""Rewrites the MKERNEL_* table in README.md (between the param-table markers) from
common/params.def, the one place where variables are declared. tests/common checks they agree."""
import pathlib, re, sys

root = pathlib.Path(__file__).resolve().parent.parent
rows = []
for line in (root / "common/params.def").read_text().splitlines():
    m = re.match(r'\s*MKERNEL_PARAM\((\w+),\s*"((?:[^"\\]|\\.)*)",\s*"((?:[^"\\]|\\.)*)"\)', line)
    if m:
        name, default, meaning = m.groups()
        rows.append(f"| `MKERNEL_{name}` | {('`' + default + '`') if default else '(unset)'} | {meaning.replace('|', '/')} |")
table = "| variable | default | meaning |\n|---|---|---|\n" + "\n".join(rows)
readme = root / "README.md"
text = readme.read_text()
begin, end = "<!-- param-table:begin -->", "<!-- param-table:end -->"
if begin not in text:
    sys.exit("README.md has no param-table markers")
pre, rest = text.split(begin, 1)
_, post = rest.split(end, 1)
readme.write_text(pre + begin + "\n" + table + "\n" + end + post)
print(f"README.md: {len(rows)} variables")
