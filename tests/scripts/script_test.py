"""What the script tests of this folder share: run a repository script, collect failures, report."""
import subprocess
import sys


def run_script(root, script, *args):
    """stdout of `python3 ROOT/scripts/SCRIPT ARGS...` (a non-zero exit raises)."""
    return subprocess.run([sys.executable, "%s/scripts/%s" % (root, script)] + list(args), check=True,
                          capture_output=True, text=True).stdout


def report(name, failures):
    """Prints each failure and the verdict; the exit status."""
    for f in failures:
        print("FAIL: " + f)
    print("%s: %s" % (name, "passed" if not failures else "%d failed" % len(failures)))
    return 1 if failures else 0
