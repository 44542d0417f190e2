#!/usr/bin/env python3
"""Prompt-eval and generation tokens/s of `hybridlm generate` on random-weight checkpoints with the
shapes of mamba-130m and mamba2-130m (f32), at 1 and 2 threads. Weights are read into memory
(--no-mmap): the memory-reclaim daemon of our VMs pages out mapped files mid-run.

Baseline measured in the same run: the machine's read bandwidth (numpy sums over 512 MiB arrays,
in 1 and in 2 processes at once), which bounds batch-1 decode at bandwidth / weight bytes
tokens/s. Each row prints the decode rate as a fraction of that bound.

usage: bench/bench_generate.py [--exe build/hybridlm] [--models build/bench_models] [-r 3] [--markdown]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = os.path.join(ROOT, "..", "shared", "data", "tokenizers", "gpt-neox-20b", "tokenizer.json")
CORPUS = os.path.join(ROOT, "tests", "data", "corpora", "tinyshakespeare.txt")


def _sum_worker(args):
    n, reps, barrier = args
    a = np.ones(n, dtype=np.float32)
    a.sum()
    best = 0.0
    for _ in range(reps):
        barrier.wait()
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def read_bandwidth_gbs(procs):
    """Aggregate read bandwidth of `procs` processes each summing its own 512 MiB array at once."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    barrier = ctx.Manager().Barrier(procs)
    with ctx.Pool(procs) as pool:
        return sum(pool.map(_sum_worker, [(128 * 1024 * 1024, 5, barrier)] * procs))


def make_model(models, preset):
    out = os.path.join(models, preset)
    if not os.path.exists(os.path.join(out, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_test_checkpoint.py"), "--preset", preset,
                        "--out", out, "--tokenizer", TOK, "--seed", "1"], check=True)
    return out


def run_once(exe, model, prompt, n, threads):
    p = subprocess.run([exe, "generate", "-m", model, "-p", prompt, "-n", str(n), "-t", str(threads),
                        "--no-mmap", "--temperature", "0", "--ignore-eos"], capture_output=True, text=True, check=True)
    pp = float(re.search(r"prompt eval: .*\(([\d.]+) tokens/s\)", p.stderr).group(1))
    tg = float(re.search(r"generation: .*\(([\d.]+) tokens/s\)", p.stderr).group(1))
    return pp, tg


def weight_bytes(exe, model):
    out = subprocess.run([exe, "inspect", "-m", model], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"weight bytes:\s+(\d+)", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "hybridlm"))
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "bench_models"))
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-n", "--gen-tokens", type=int, default=128)
    args = ap.parse_args()

    text = open(CORPUS, encoding="utf-8").read()
    bw = {t: read_bandwidth_gbs(t) for t in (1, 2)}
    print(f"read bandwidth (numpy sum, same run): {bw[1]:.1f} GB/s with 1 process, {bw[2]:.1f} GB/s with 2")
    print(f"| model | threads | pp{args.prompt_tokens} t/s | tg{args.gen_tokens} t/s | tg roofline t/s | tg / roofline |")
    print("|---|---|---|---|---|---|")
    for preset in ["mamba-130m", "mamba2-130m"]:
        model = make_model(args.models, preset)
        ids = subprocess.run([args.exe, "tokenize", "-m", model, "-p", text[:20000]], capture_output=True,
                             text=True, check=True).stdout
        n_ids = len(ids.split(","))
        # A prompt of about prompt_tokens tokens: cut the text proportionally.
        prompt = text[: int(20000 * args.prompt_tokens / n_ids)]
        wb = weight_bytes(args.exe, model)
        for threads in [1, 2]:
            roof = bw[threads] * 1e9 / wb
            runs = [run_once(args.exe, model, prompt, args.gen_tokens, threads) for _ in range(args.reps)]
            pp = [r[0] for r in runs]
            tg = [r[1] for r in runs]
            sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
            print(f"| {preset} (f32) | {threads} | {statistics.mean(pp):.1f} ± {sd(pp):.1f} | "
                  f"{statistics.mean(tg):.1f} ± {sd(tg):.1f} | {roof:.1f} | {statistics.mean(tg) / roof:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
