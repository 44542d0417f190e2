#!/usr/bin/env python3
"""The benchmark suite of docs/benchmarks.md: `hybridlm bench --json` over random-weight checkpoints
with the shapes of real models, every weight dtype, plus two sweeps (prompt length, decode batch).

It writes the figures between the `<!-- bench-suite:begin -->` / `<!-- bench-suite:end -->`
markers of docs/benchmarks.md, the raw results to docs/bench/results.json and the plot to
docs/bench/throughput.svg. Every figure comes with the baselines `hybridlm bench` measures in the
same run (read bandwidth, FP32 FMA peak), so a slow machine shows as a slow baseline.

Weights are read into memory (the default of `hybridlm bench`): the memory-reclaim daemon of our
VMs pages out mapped files mid-run. Checkpoints are made once with tools/make_test_checkpoint.py.

usage: bench/bench_suite.py [--exe build/hybridlm] [--models build/bench_models] [-t 2] [-r 3]
                            [--large] [--quick] [--no-docs]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
OUT_DIR = os.path.join(ROOT, "docs", "bench")
DTYPES = ["f32", "bf16", "q8_0"]
COLORS = {"f32": "#1f77b4", "bf16": "#ff7f0e", "q8_0": "#2ca02c"}


def make_model(models, preset):
    out = os.path.join(models, preset)
    if not os.path.exists(os.path.join(out, "config.json")):
        print(f"making {preset} in {out} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_test_checkpoint.py"), "--preset", preset,
                        "--out", out, "--seed", "1"], check=True)
    return out


def bench(exe, model, dtype, threads, reps, p, n, batch=1, state="f32"):
    cmd = [exe, "bench", "-m", model, "--dtype", dtype, "-t", str(threads), "-r", str(reps), "-p", str(p),
           "-n", str(n), "--batch", str(batch), "--state-dtype", state, "--json"]
    print("  " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    rows = json.loads(res.stdout)
    return next(r for r in rows if r["test"].startswith("pp")), next(r for r in rows if r["test"].startswith("tg"))


def machine_peaks(rows):
    """The machine's peaks as the median of what each probe measured over the whole suite (and
    their range): every bench run measures them once at its start, and on this shared host a
    single probe swings widely (read bandwidth 26-49 GB/s, FP32 peak 117-228 GFLOP/s within one
    suite), so a run's own probe is a poor yardstick for its own rate."""
    def stats(key, want):
        vals = sorted(r[key] for r in rows if key in r and want(r) and r[key] > 0)
        if not vals:
            return 0.0, 0.0, 0.0
        return vals[len(vals) // 2], vals[0], vals[-1]
    return {"gbps": stats("peak_gbps", lambda r: True),
            "fp32": stats("peak_gflops", lambda r: r.get("peak_is_int8", 0) == 0),
            "int8": stats("peak_gflops", lambda r: r.get("peak_is_int8", 0) > 0)}


def fmt_rate(r, peaks):
    """pp: GFLOP/s against the FP32 FMA peak (q8_0: GOP/s against the int8 VNNI peak); tg: weight
    GB/s against the read bandwidth, then the same with every sequence's state read and written."""
    if r["test"].startswith("pp"):
        int8 = r.get("peak_is_int8", 0) > 0
        rate, peak, unit = r["gflops"], peaks["int8" if int8 else "fp32"][0], "GOP/s" if int8 else "GFLOP/s"
    else:
        rate, peak, unit = r["gbps"], peaks["gbps"][0], "GB/s"
    # The compute peaks are measured only on the AVX-512 path (0 otherwise).
    text = f"{rate:.1f} {unit}" + (f" ({100 * rate / peak:.0f}%)" if peak > 0 else "")
    if "gbps_with_state" in r and peak > 0:
        text += f"; with state {r['gbps_with_state']:.1f} ({100 * r['gbps_with_state'] / peak:.0f}%)"
    return text


def svg_panel(x0, y0, w, h, title, xlabel, ylabel, series):
    """One log2-x line chart: series = {label: [(x, y), ...]}."""
    xs = sorted({x for pts in series.values() for x, _ in pts})
    ymax = max(y for pts in series.values() for _, y in pts) * 1.1 or 1.0
    lx = lambda x: (xs.index(x) / max(1, len(xs) - 1))  # even spacing of the measured x values
    px = lambda x: x0 + 50 + lx(x) * (w - 70)
    py = lambda y: y0 + h - 40 - y / ymax * (h - 90)
    out = [f'<text x="{x0 + w / 2}" y="{y0 + 18}" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{x0 + 50}" y1="{y0 + h - 40}" x2="{x0 + w - 20}" y2="{y0 + h - 40}" stroke="black"/>',
           f'<line x1="{x0 + 50}" y1="{y0 + 30}" x2="{x0 + 50}" y2="{y0 + h - 40}" stroke="black"/>',
           f'<text x="{x0 + w / 2}" y="{y0 + h - 8}" text-anchor="middle" font-size="12">{xlabel}</text>',
           f'<text x="{x0 + 12}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
           f'transform="rotate(-90 {x0 + 12} {y0 + h / 2})">{ylabel}</text>']
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{y0 + h - 26}" text-anchor="middle" font-size="10">{x}</text>')
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<text x="{x0 + 46}" y="{py(y) + 3:.1f}" text-anchor="end" font-size="10">{y:.0f}</text>')
        out.append(f'<line x1="{x0 + 50}" y1="{py(y):.1f}" x2="{x0 + w - 20}" y2="{py(y):.1f}" stroke="#ddd"/>')
    for k, (label, pts) in enumerate(series.items()):
        color = COLORS.get(label.split()[0], "#555")
        pts = sorted(pts)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="5,3"' if "state" in label else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{x0 + 60 + 120 * (k % 3)}" y="{y0 + 38 + 14 * (k // 3)}" font-size="11" '
                   f'fill="{color}">{label}</text>')
    return out


def write_svg(path, prompt_sweep, batch_sweep, model, threads):
    w, h = 460, 320
    body = svg_panel(0, 0, w, h, f"prefill, {model}, {threads} threads", "prompt tokens", "tokens/s", prompt_sweep)
    body += svg_panel(w, 0, w, h, f"decode, {model}, {threads} threads", "sequences decoding together",
                      "tokens/s (all sequences)", batch_sweep)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>'] + body + ["</svg>"]
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")


def measure(args):
    """Runs every bench; returns the record that render() and docs/bench/results.json use."""
    p, n = (128, 32) if args.quick else (512, 128)
    presets = ["mamba-130m", "mamba2-130m", "hybrid-130m"] + (["mamba-1.4b", "mamba2-1.3b"] if args.large else [])
    rows = []
    for preset in presets:
        model = make_model(args.models, preset)
        for dt in DTYPES:
            for r in bench(args.exe, model, dt, args.threads, args.reps, p, n):  # pp, then tg
                r["preset"] = preset
                rows.append(r)
    sweep_model = make_model(args.models, "mamba2-130m")
    lengths = [64, 128, 256] if args.quick else [64, 128, 256, 512, 1024, 2048]
    batches = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    batch_steps = 32 if args.quick else 64
    sweep_rows = []
    for dt in DTYPES:
        for L in lengths:
            r = bench(args.exe, sweep_model, dt, args.threads, args.reps, L, 1)[0]  # pp
            sweep_rows.append(dict(r, preset="mamba2-130m", sweep="prompt", length=L))
        for state in ("f32", "bf16"):  # bf16 state: half the per-sequence traffic of every step
            for B in batches:
                r = bench(args.exe, sweep_model, dt, args.threads, args.reps, 16, batch_steps, B, state)[1]  # tg
                sweep_rows.append(dict(r, preset="mamba2-130m", sweep="batch", steps=batch_steps, state=state))
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    cpu = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "commit": commit, "cpu": cpu, "threads": args.threads,
            "reps": args.reps, "large": args.large, "quick": args.quick,
            "system": f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}", "rows": rows,
            "sweeps": sweep_rows}


def render(data):
    """The markdown block of docs/benchmarks.md, and the two sweeps for the plot."""
    rows, sweeps, threads = data["rows"], data["sweeps"], data["threads"]
    peaks = machine_peaks(rows + sweeps)
    prompt_sweep, batch_sweep = {}, {}
    for r in sweeps:
        if r["sweep"] == "prompt":
            prompt_sweep.setdefault(r["dtype"], []).append((int(r.get("length", r["test"][2:])), r["tokens_per_second"]))
        else:
            label = r["dtype"] + ("" if r.get("state", "f32") == "f32" else f" {r['state']}-state")
            batch_sweep.setdefault(label, []).append((r["batch"], r["tokens_per_second"]))
    lengths = sorted({x for pts in prompt_sweep.values() for x, _ in pts})
    batches = sorted({x for pts in batch_sweep.values() for x, _ in pts})
    steps = next((r.get("steps") for r in sweeps if r["sweep"] == "batch" and r.get("steps")),
                 next((r["test"][2:] for r in sweeps if r["sweep"] == "batch"), "?"))
    flags = f"-t {threads} -r {data['reps']}" + (" --large" if data.get("large") else "") + (
        " --quick" if data.get("quick") else "")
    md = [f"Generated by `python3 bench/bench_suite.py {flags}` on {data['date']}, commit {data['commit']}, "
          f"{data['cpu']}, {data['system']}. Mean ± standard deviation over {data['reps']} runs after a "
          "warm-up. Every run measures the machine's read bandwidth, FP32 FMA peak and (q8_0) int8 VNNI "
          "peak at its start; the percentages are against the median of each over the whole suite "
          "(read bandwidth {:.1f} GB/s, range {:.1f}-{:.1f}; FP32 {:.0f} GFLOP/s, {:.0f}-{:.0f}; int8 {:.0f} GOP/s, "
          "{:.0f}-{:.0f}): a single probe on this shared host swings too widely to judge its own run by. "
          "tg: weight bytes read per step, then ".format(*peaks["gbps"], *peaks["fp32"], *peaks["int8"]) +
          "weights plus the recurrent state of every sequence read and written; pp: 2 x projection "
          "parameters per token.", "",
          "| model (random weights) | dtype | weights | test | tokens/s | achieved (of the peak) |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['preset']} | {r['dtype']} | {r['weight_bytes'] / 1e6:.0f} MB | {r['test']} | "
                  f"{r['tokens_per_second']:.1f} ± {r['stddev']:.1f} | {fmt_rate(r, peaks)} |")
    md += ["", f"Sweeps on mamba2-130m ({threads} threads): prefill tokens/s by prompt length (`-p L -n 1`), "
           f"and aggregate decode tokens/s by the number of sequences decoding together (`-p 16 -n {steps} "
           "--batch B [--state-dtype bf16]`; each step reads the weights once for all of them, and every "
           "sequence's recurrent state).", "", "| dtype | state | " +
           " | ".join(f"pp{L}" for L in lengths) + " | " + " | ".join(f"tg x{B}" for B in batches) +
           f" | tg x{batches[-1]} / x1 |", "|---" * (3 + len(lengths) + len(batches)) + "|"]
    for dt in DTYPES:
        for state in ("f32", "bf16"):
            label = dt if state == "f32" else f"{dt} {state}-state"
            if label not in batch_sweep and (state != "f32" or dt not in prompt_sweep):
                continue
            pp = sorted(prompt_sweep.get(dt, [])) if state == "f32" else []
            tg = dict(batch_sweep.get(label, []))
            ratio = f"{tg[batches[-1]] / tg[1]:.1f}x" if batches and 1 in tg and batches[-1] in tg else "-"
            cells = [dt, state] + [f"{y:.0f}" for _, y in pp] + ["-"] * (len(lengths) - len(pp))
            cells += [f"{tg[B]:.0f}" if B in tg else "-" for B in batches] + [ratio]
            md.append("| " + " | ".join(cells) + " |")
    md += ["", "![tokens/s vs prompt length and vs batch size](bench/throughput.svg)"]
    return "\n".join(md), prompt_sweep, batch_sweep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "hybridlm"))
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "bench_models"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--large", action="store_true", help="also the 1.3B/1.4B shapes (~5.5 GB checkpoints each)")
    ap.add_argument("--quick", action="store_true", help="-p 128 -n 32 and shorter sweeps (a smoke run)")
    ap.add_argument("--no-docs", action="store_true", help="print, but leave docs/ as it is")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="measure nothing: rewrite the docs block and plot from a saved results.json")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        data.setdefault("reps", args.reps)
        data.setdefault("large", args.large)
        data.setdefault("quick", args.quick)
        data.setdefault("system", f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}")
    else:
        data = measure(args)
    text, prompt_sweep, batch_sweep = render(data)
    print(text)
    if args.no_docs:
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    write_svg(os.path.join(OUT_DIR, "throughput.svg"), prompt_sweep, batch_sweep, "mamba2-130m", data["threads"])
    doc = open(DOC).read()
    begin, end = "<!-- bench-suite:begin -->", "<!-- bench-suite:end -->"
    if begin not in doc or end not in doc:
        sys.exit(f"{DOC}: markers {begin} / {end} not found")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(DOC, "w") as f:
        f.write(head + begin + "\n" + text + "\n" + end + tail)


if __name__ == "__main__":
    main()
