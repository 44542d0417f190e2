#!/usr/bin/python3
"""What weight quantization costs in quality: `hybridlm perplexity` of one model at every --dtype
on the same texts, as a markdown table (the "4-bit weights" section of docs/benchmarks.md).

Usage: bench/quant_perplexity.py [--exe build/hybridlm] [-m models/default] [-t 2] [-c 512]
                                 [--dtypes f32,bf16,q8_0,q4_0] [--text FILE ...]

Texts: by default tests/data/corpora/tinyshakespeare.txt and, where Debian's `bible` program is
installed (bible-kjv: what scripts/train_default_model.sh trains the default model on), the last
5% of the King James text prepared the same way: inside the last 10% of tokens that
prepare-data holds out for validation, so text the default model never trained on.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def kjv_tail(path):
    """The last 5% of lines of the KJV as train_default_model.sh prepares it, or None."""
    if not shutil.which("bible"):
        return None
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    lines = [re.sub(r"^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ ", "", l) for l in out.splitlines()]
    tail = lines[len(lines) - len(lines) // 20:]
    with open(path, "w") as f:
        f.write("\n".join(tail) + "\n")
    return path


def perplexity(exe, model, dtype, text, threads, ctx):
    cmd = [exe, "perplexity", "-m", model, "--dtype", dtype, "-f", text, "-t", str(threads), "-c", str(ctx)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.match(r"perplexity: ([0-9.]+) over ([0-9]+) tokens", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"error: {' '.join(cmd)} failed: {r.stdout}{r.stderr}")
    return float(m.group(1)), int(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "hybridlm"))
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--dtypes", default="f32,bf16,q8_0,q4_0")
    ap.add_argument("--text", action="append", help="a text file (repeatable); default: see above")
    a = ap.parse_args()
    dtypes = a.dtypes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        texts = a.text or [t for t in [kjv_tail(os.path.join(tmp, "kjv_tail.txt")),
                                       os.path.join(ROOT, "tests", "data", "corpora", "tinyshakespeare.txt")] if t]
        names = {os.path.join(tmp, "kjv_tail.txt"): "KJV, last 5% (held out)"}
        print(f"`{os.path.relpath(a.model, ROOT)}`, `hybridlm perplexity -c {a.ctx_size} -t {a.threads}`; "
              "in parentheses the change against f32.\n")
        print("| text | tokens | " + " | ".join(dtypes) + " |")
        print("|---|---:|" + "---:|" * len(dtypes))
        for text in texts:
            ppl = {d: perplexity(a.exe, a.model, d, text, a.threads, a.ctx_size) for d in dtypes}
            base = ppl[dtypes[0]][0]
            cells = [f"{ppl[d][0]:.3f}" + ("" if d == dtypes[0] else f" ({100 * (ppl[d][0] / base - 1):+.1f}%)")
                     for d in dtypes]
            name = names.get(text, os.path.relpath(text, ROOT))
            print(f"| {name} | {ppl[dtypes[0]][1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
