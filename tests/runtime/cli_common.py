"""What the hybridlm CLI tests share: running the binary, recording checks, and making tiny
random-weight checkpoints with the GPT-NeoX tokenizer.

Every CLI test script is run as `SCRIPT HYBRIDLM MAKE_CHECKPOINT_PY TEST_DATA SCRATCH`, prints one
line per check and ends with `N passed, M failed` (exit 1 if any failed).
"""
import os
import shutil
import subprocess
import sys

exe, tool, data, scratch = sys.argv[1:5]
neox = os.path.join(data, "tokenizers", "gpt-neox-20b", "tokenizer.json")
results = []


def run(*args, stdin=None, timeout=120, env=None):
    """env: variables added to this process's environment."""
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, input=stdin,
                       env=dict(os.environ, **env) if env else None)
    return p.returncode, p.stdout, p.stderr


def check(name, cond, detail=""):
    results.append(bool(cond))
    print(("PASS " if cond else "FAIL ") + name + ("" if cond else f"  [{detail}]"))


# Lines a model-loading command writes before it fails: the load progress and summary.
REPORT_PREFIXES = ("loading weights: ", "loaded ")


def expect_error(name, args, code, needle):
    """`args` exits with `code` and writes one error line to stderr, containing `needle`: the only
    line, or the last after the load report when the error came after loading."""
    rc, out, err = run(*args)
    lines = [l for l in err.strip().splitlines() if l]
    check(name, rc == code and lines and needle in lines[-1] and
          all(l.startswith(REPORT_PREFIXES) for l in lines[:-1]),
          f"rc={rc} stderr={err.strip()[:300]!r}")


def make_model(name, preset, seed, tokenizer=None):
    """A random-weight checkpoint of `preset` in SCRATCH/name (made once per scratch directory)."""
    d = os.path.join(scratch, name)
    if not os.path.exists(os.path.join(d, "config.json")):
        subprocess.run(["/usr/bin/python3", tool, "--preset", preset, "--out", d, "--tokenizer", tokenizer or neox,
                        "--seed", str(seed)], check=True, capture_output=True)
    return d


def start():
    """A fresh scratch directory; fails the script at once if the test data is missing."""
    if not os.path.exists(neox):
        print(f"FAIL test tokenizer missing: {neox}")
        print("0 passed, 1 failed")
        sys.exit(1)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)


def finish():
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)
