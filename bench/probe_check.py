#!/usr/bin/python3
"""The read bandwidth `hybridlm bench` probes, next to what an independent tool reads on the same
machine in the same run: Debian's sysbench (`sysbench memory --memory-oper=read`, each thread
reading its own buffer of --block-mib MiB sequentially; a benchmark-only dependency that
scripts/setup.sh installs). A benchmark, not a test: run it on a quiet machine.

The probe's figure comes from `hybridlm bench -o json` (peak_gbps of its tg row, the best of 5
reads of 1 GiB; peak_gbps_spread says how far apart the 5 were). Both sides are repeated
--repeats times, alternating, and the best of each is shown with its spread.

usage: python3 bench/probe_check.py [--exe build/hybridlm] [--model models/default] [--threads 1,2]
           [--repeats 3] [--block-mib 256] [--markdown]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def probe(exe, model, threads):
    """(best GB/s, spread of its 5 reads) of hybridlm bench's probe at `threads`."""
    p = subprocess.run([exe, "bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "-t", str(threads), "-o", "json"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit("probe_check: hybridlm bench failed:\n" + p.stderr[-2000:])
    tg = [r for r in json.loads(p.stdout) if r["test"].startswith("tg")]
    return tg[0]["peak_gbps"], tg[0].get("peak_gbps_spread", 0.0)


def sysbench(threads, block_mib):
    """GB/s (1e9 bytes) that sysbench memory reads with `threads` threads."""
    total = max(16, 4 * threads) * 1024  # MiB: many passes over each thread's buffer
    p = subprocess.run(["sysbench", "memory", f"--memory-block-size={block_mib}M", f"--memory-total-size={total}M",
                        "--memory-oper=read", "--memory-access-mode=seq", f"--threads={threads}", "run"],
                       capture_output=True, text=True, timeout=600)
    m = re.search(r"\(([\d.]+) MiB/sec\)", p.stdout)
    if p.returncode != 0 or not m:
        sys.exit("probe_check: sysbench failed:\n" + p.stdout[-1000:] + p.stderr[-1000:])
    return float(m.group(1)) * 2**20 / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "hybridlm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-mib", type=int, default=256)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not shutil.which("sysbench"):
        sys.exit("probe_check: sysbench is not installed (scripts/setup.sh installs it)")
    rows = []
    for t in (int(x) for x in a.threads.split(",")):
        ours, spreads, theirs = [], [], []
        for _ in range(a.repeats):
            gbs, spread = probe(a.exe, a.model, t)
            ours.append(gbs)
            spreads.append(spread)
            theirs.append(sysbench(t, a.block_mib))
        rows.append({"threads": t, "probe_gbs": max(ours), "probe_runs": ours, "probe_spread_max": max(spreads),
                     "sysbench_gbs": max(theirs), "sysbench_runs": theirs, "ratio": max(ours) / max(theirs)})
    if a.markdown:
        print("| threads | hybridlm bench probe GB/s (runs) | sysbench memory read GB/s (runs) | probe / sysbench |")
        print("|---:|---|---|---:|")
        for r in rows:
            print(f"| {r['threads']} | {r['probe_gbs']:.1f} ({', '.join(f'{x:.1f}' for x in r['probe_runs'])}) | "
                  f"{r['sysbench_gbs']:.1f} ({', '.join(f'{x:.1f}' for x in r['sysbench_runs'])}) | {r['ratio']:.2f} |")
    else:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
