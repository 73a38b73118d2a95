#!/usr/bin/env python3
"""scripts/results-table.py: the page it renders from CSVs (tests/scripts/fixtures/results), --check
on a current and on a stale page, --readme between the markers only (and its refusal without them
or with more than 8 headline rows), --embed of one CSV's tables into a page, its refusal of a
malformed CSV, compat.csv's table (a row per NCCL version, a column per component), and that the
repository's own docs/RESULTS.md and docs/MODEL.md's embedded table are what docs/results/*.csv give.

    python3 tests/scripts/test_results_table.py REPO_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

from script_test import report, run_script

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def rc(root, *args):
    p = subprocess.run([sys.executable, "%s/scripts/results-table.py" % root] + list(args),
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def main(root):
    failures = []

    def check(what, ok):
        if not ok:
            failures.append(what)

    tmp = tempfile.mkdtemp(prefix="results-table-")
    try:
        results = os.path.join(tmp, "results")
        shutil.copytree("%s/tests/scripts/fixtures/results" % root, results)
        page = os.path.join(tmp, "RESULTS.md")
        base = ["--results", results, "--out", page]

        # The page.
        run_script(root, "results-table.py", *base)
        text = read(page)
        check("the page says it is generated and by which command",
              "Generated from `docs/results/*.csv` by `python3 scripts/results-table.py --embed docs/MODEL.md`" in text)
        check("one section per CSV", text.count("\n## ") == 2 and "(`collectives.csv`)" in text
              and "(`latency.csv`)" in text)
        check("rows are counted", "4 rows." in text and "2 rows." in text)
        check("a run's constant columns are printed once above its table",
              "ranks: 2; unit: us" in text and "| collective | size | mkernel | nccl | ratio | path |" not in text)
        check("each run of the CSV gets its own heading",
              "commit: a3082c0" in text and "commit: eb5b2d1" in text and text.count("**date: 2026-11-30") == 1)
        check("sizes are printed in binary units", "| 1 MiB |" in text and "| 512 MiB |" in text and "| 8 B |" in text)
        check("the headline column is not printed", "headline" not in text.split("## mkernel")[1])
        check("a | inside a cell is escaped", "NVLink one way \\| push" in text)
        check("the rows of a run keep the CSV's order",
              text.index("| 8 B | 10.95") < text.index("| 1 MiB | 16.72") < text.index("| 512 MiB | 1695.92"))

        # --check: current, then stale after a CSV changes, and --check writes nothing.
        code, out = rc(root, "--check", *base)
        check("--check on a current page exits 0 (%d: %s)" % (code, out), code == 0)
        csvp = os.path.join(results, "collectives.csv")
        write(csvp, read(csvp).replace("16.72,15.72", "16.80,15.72"))
        code, out = rc(root, "--check", *base)
        check("--check on a stale page exits 1 (%d)" % code, code == 1 and "stale" in out)
        check("--check leaves the page alone", read(page) == text)
        run_script(root, "results-table.py", *base)
        check("regenerating takes the new value", "| 1 MiB | 16.80" in read(page))

        # --readme: only between the markers.
        readme = os.path.join(tmp, "README.md")
        before, after = "# mkernel\n\nintro\n\n", "\n\n## Next\n\ntext\n"
        write(readme, before + BEGIN + "\nold table\n" + END + after)
        run_script(root, "results-table.py", "--readme", readme, *base)
        r = read(readme)
        check("--readme keeps what lies outside the markers", r.startswith(before + BEGIN + "\n") and r.endswith(END + after))
        inner = r.split(BEGIN)[1].split(END)[0]
        rows = [l for l in inner.splitlines() if l.startswith("| 20")]
        check("--readme writes one row per headline row (%d)" % len(rows), len(rows) == 2 and "old table" not in inner)
        check("--readme's row has date, hardware, commit, command and the figure against NCCL",
              rows and rows[0] == "| 2026-11-30 | 2x H200 NVLink | a3082c0 | `bash scripts/gpu-check.sh multigpu` | "
                                  "all_reduce 8 B (-g 2): mkernel 10.95 us, NCCL 13.73 us (NCCL / mkernel 1.254x) |")
        code, out = rc(root, "--check", "--readme", readme, *base)
        check("--check --readme after --readme exits 0 (%d: %s)" % (code, out), code == 0)
        run_script(root, "results-table.py", "--readme", readme, *base)
        check("--readme twice changes nothing", read(readme) == r)
        write(readme, r.replace("a3082c0 | `bash", "0000000 | `bash"))
        code, out = rc(root, "--check", "--readme", readme, *base)
        check("--check finds a stale README table (%d)" % code, code == 1 and "README.md is stale" in out)

        # --embed: one CSV's tables between its own pair of lines, the rest kept.
        doc = os.path.join(tmp, "MODEL.md")
        head, tail = "# Model\n\ntext\n\n", "\n\nmore text\n"
        write(doc, head + "<!-- results:latency.csv begin -->\nold\n<!-- results:latency.csv end -->" + tail)
        run_script(root, "results-table.py", "--embed", doc, *base)
        d = read(doc)
        body = d.split("<!-- results:latency.csv begin -->")[1].split("<!-- results:latency.csv end -->")[0]
        check("--embed keeps what lies outside its lines", d.startswith(head) and d.endswith(tail))
        check("--embed writes that CSV's tables and nothing else",
              "old" not in body and "| 0.68 |" in body and "10.95" not in body and "## " not in body)
        code, out = rc(root, "--check", "--embed", doc, *base)
        check("--check --embed after --embed exits 0 (%d: %s)" % (code, out), code == 0)
        write(doc, head + tail)
        code, out = rc(root, "--embed", doc, *base)
        check("--embed without the lines exits 1 (%d: %s)" % (code, out), code == 1 and "results:NAME.csv" in out)
        write(doc, "<!-- results:nosuch.csv begin -->\n<!-- results:nosuch.csv end -->\n")
        code, out = rc(root, "--embed", doc, *base)
        check("--embed of a CSV that does not exist exits 1 (%d: %s)" % (code, out), code == 1 and "nosuch.csv" in out)

        write(readme, before + after)
        code, out = rc(root, "--readme", readme, *base)
        check("--readme without markers exits 1 and says so (%d: %s)" % (code, out),
              code == 1 and "results:begin" in out and read(readme) == before + after)

        write(readme, before + BEGIN + "\n" + END + after)
        lines = read(csvp).splitlines()
        extra = [l.replace(",0,eager", ",1,eager").replace(",8,2,10.95", ",%d,2,10.95" % (16 << i)) for i, l in
                 enumerate([lines[1]] * 7)]
        write(csvp, "\n".join(lines + extra) + "\n")
        code, out = rc(root, "--readme", readme, *base)
        check("more than 8 headline rows exit 1 (%d: %s)" % (code, out), code == 1 and "at most 8" in out)
        check("...and leave the README alone", read(readme) == before + BEGIN + "\n" + END + after)

        # Malformed CSVs.
        write(csvp, "date,machine,commit,collective\n2026-11-30,x,y,z\n")
        code, out = rc(root, *base)
        check("a CSV without the command column exits 1 (%d: %s)" % (code, out), code == 1 and "command" in out)
        write(csvp, "date,machine,commit,command\n30.11.2026,x,y,z\n")
        code, out = rc(root, *base)
        check("a date not YYYY-MM-DD exits 1 (%d: %s)" % (code, out), code == 1 and "YYYY-MM-DD" in out)
        write(csvp, "date,machine,commit,command\n2026-11-30,x,y\n")
        code, out = rc(root, *base)
        check("a short row exits 1 (%d: %s)" % (code, out), code == 1 and "fields" in out)

        # compat.csv: a row per NCCL version, newest first (2.9.6 is older than 2.30.7), a column per
        # component; "net plugin + tuner" fills both; two runs of one cell are both there.
        compat = os.path.join(tmp, "compat")
        os.mkdir(compat)
        write(os.path.join(compat, "compat.csv"),
              "date,machine,commit,command,nccl,component,result\n"
              "2026-12-01,cpu,aaa1111,abi test v2.28,2.28.9,net plugin + tuner,ABI equal\n"
              "2026-12-02,gpu,bbb2222,ctest shim,2.30.7,shim,4 of 4 passed\n"
              "2026-12-03,gpu,ccc3333,torch_check,2.30.7,shim,PASS\n"
              "2026-12-03,gpu,ccc3333,old run,2.9.6,tuner,loaded\n")
        cpage = os.path.join(tmp, "COMPAT.md")
        run_script(root, "results-table.py", "--results", compat, "--out", cpage)
        lines = read(cpage).splitlines()
        rows = [l for l in lines if l.startswith("| 2.")]
        check("compat: the header names the three components", "| NCCL | shim | net plugin | tuner |" in lines)
        check("compat: one row per version, newest first (%s)" % [r.split(" |")[0] for r in rows],
              [r.split(" |")[0] for r in rows] == ["| 2.30.7", "| 2.28.9", "| 2.9.6"])
        cells = [[c.strip() for c in r.split("|")[1:-1]] for r in rows]
        check("compat: a cell holds command, result, machine, date and commit",
              cells and cells[0][1] == "`ctest shim`: 4 of 4 passed (gpu, 2026-12-02, bbb2222)<br>"
                                      "`torch_check`: PASS (gpu, 2026-12-03, ccc3333)")
        check("compat: net plugin + tuner fills both columns, nothing else",
              len(cells) > 1 and cells[1][1] == "" and cells[1][2] == cells[1][3] == "`abi test v2.28`: ABI equal (cpu, 2026-12-01, aaa1111)")
        check("compat: a version without a run of a component has an empty cell",
              len(cells) > 2 and cells[2][1:3] == ["", ""] and "loaded" in cells[2][3])
    finally:
        shutil.rmtree(tmp)

    # The repository's page and docs/MODEL.md's table are current.
    code, out = rc(root, "--check", "--embed", "%s/docs/MODEL.md" % root)
    check("docs/RESULTS.md and docs/MODEL.md are what docs/results/*.csv give (%s)" % out.strip(), code == 0)
    return report("test_results_table", failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
