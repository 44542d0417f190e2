"""Hybrids side by side with llama.cpp: pp512, tg128 and batched decode at B = 1..32 sequences, on the same
random weights (the Granite-4.0-H-like hybrid and mamba2-1.3b by default), f32.

llama.cpp side (a build kept outside this repository; pass its binaries):
  llama-bench -m M.gguf -t T -p P -n N -r R -mmp 0 -o json                        (pp, tg)
  llama-batched-bench -m M.gguf -t T -npp 0 -ntg G -npl 1,2,...,32 -c C --no-mmap  (batched decode)
Our side:
  hybridlm bench -m DIR -t T -p P -n N -r R --dtype f32                            (pp, tg)
  hybridlm bench -m DIR -t T -p 0 -n G --batch 1,2,...,32 -r R2 --dtype f32        (batched decode)
Both batched runs start every sequence from an empty context (no prompt: -npp 0) and count
B x G generated tokens over the wall time of the G steps; llama-batched-bench runs each B once, so ours
takes -r R2 (default 1) after its warm-up. Weights in anonymous memory on both sides, f32 recurrent state.
GGUF files: GGUF_DIR/<model>-f32.gguf from bench/llamacpp_gguf.py (check one with bench/llamacpp_check.py).

Writes OUT.json (every figure), OUT.md (the tables) and OUT.svg (decode tokens/s against batch size,
one panel per model, both engines) and prints the markdown.

Usage: python3 bench/llamacpp_hybrids.py --llama-bench PATH --llama-batched-bench PATH --gguf-dir DIR
           [--exe build/hybridlm] [--models build/bench_models] [--presets granite-4.0-h-350m,mamba2-1.3b]
           [-t 2] [-p 512] [-n 128] [-r 3] [--batches 1,2,4,8,16,32] [--batch-gen 128] [--batch-reps 1]
           [--skip-pp-tg] [--out build/hybrids_side_by_side]
"""
import argparse, json, os, re, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_suite  # noqa: E402  (its SVG panel)

ap = argparse.ArgumentParser()
ap.add_argument("--llama-bench", required=True)
ap.add_argument("--llama-batched-bench", required=True)
ap.add_argument("--gguf-dir", required=True)
ap.add_argument("--exe", default="build/hybridlm")
ap.add_argument("--models", default="build/bench_models")
ap.add_argument("--presets", default="granite-4.0-h-350m,mamba2-1.3b")
ap.add_argument("-t", "--threads", default="2")
ap.add_argument("-p", "--prompt", default="512")
ap.add_argument("-n", "--gen", default="128")
ap.add_argument("-r", "--reps", default="3")
ap.add_argument("--batches", default="1,2,4,8,16,32")
ap.add_argument("--batch-gen", default="128", help="decode steps per batched test (both engines)")
ap.add_argument("--batch-reps", default="1", help="our repetitions per batch size (llama-batched-bench runs once)")
ap.add_argument("--skip-pp-tg", action="store_true", help="only the batched sweep")
ap.add_argument("--out", default="build/hybrids_side_by_side")
args = ap.parse_args()
models = args.presets.split(",")
batches = [int(b) for b in args.batches.split(",")]
env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.llama_bench)))


def run(cmd):
    print("  " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


out = []


def save():
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)


for m in models:
    gguf, ours = f"{args.gguf_dir}/{m}-f32.gguf", f"{args.models}/{m}"
    for p in (gguf, ours):
        if not os.path.exists(p):
            sys.exit(f"llamacpp_hybrids: {p} does not exist (make it with tools/make_test_checkpoint.py --preset {m} "
                     "and bench/llamacpp_gguf.py)")
    t0 = time.time()
    if not args.skip_pp_tg:
        for x in json.loads(run([args.llama_bench, "-m", gguf, "-t", args.threads, "-p", args.prompt, "-n", args.gen,
                                 "-r", args.reps, "-mmp", "0", "-o", "json"])):
            test = f"pp{x['n_prompt']}" if x["n_prompt"] else f"tg{x['n_gen']}"
            out.append(dict(engine="llama.cpp", model=m, test=test, batch=1, tps=x["avg_ts"], sd=x["stddev_ts"]))
        for x in json.loads(run([args.exe, "bench", "-m", ours, "-t", args.threads, "-p", args.prompt, "-n", args.gen,
                                 "-r", args.reps, "--dtype", "f32", "--json"])):
            out.append(dict(engine="hybridlm", model=m, test=x["test"], batch=1, tps=x["tokens_per_second"],
                            sd=x["stddev"], peak_gbps=x.get("peak_gbps"), peak_gflops=x.get("peak_gflops")))
        save()
    ctx = max(batches) * int(args.batch_gen) + 64
    for line in run([args.llama_batched_bench, "-m", gguf, "-t", args.threads, "-npp", "0", "-ntg", args.batch_gen,
                     "-npl", args.batches, "-c", str(ctx), "--no-mmap", "--output-format", "jsonl"]).splitlines():
        if line.startswith("{"):
            x = json.loads(re.sub(r":\s*-?(nan|inf)\b", ": null", line))  # speed_pp with no prompt
            out.append(dict(engine="llama.cpp", model=m, test=f"tg{x['tg']}", batch=x["pl"], tps=x["speed_tg"], sd=0.0))
    for x in json.loads(run([args.exe, "bench", "-m", ours, "-t", args.threads, "-p", "0", "-n", args.batch_gen,
                             "--batch", args.batches, "-r", args.batch_reps, "--dtype", "f32", "--json"])):
        out.append(dict(engine="hybridlm", model=m, test=x["test"], batch=x["batch"], tps=x["tokens_per_second"],
                        sd=x["stddev"], peak_gbps=x.get("peak_gbps"), batched=True))
    save()
    print(f"{m}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


def pick(engine, m, test, b, batched):
    """The figure of one engine; batched picks the sweep's row (ours has a tg128 batch-1 row in both)."""
    rows = [o for o in out if o["engine"] == engine and o["model"] == m and o["test"] == test and o["batch"] == b]
    if engine == "hybridlm":
        rows = [o for o in rows if bool(o.get("batched")) == batched]
    return rows[-1] if rows else None


md = []
if not args.skip_pp_tg:
    md += ["| model | test | llama.cpp t/s | hybridlm t/s | ratio |", "|---|---|---|---|---|"]
    for m in models:
        for test in (f"pp{args.prompt}", f"tg{args.gen}"):
            l, h = pick("llama.cpp", m, test, 1, False), pick("hybridlm", m, test, 1, False)
            md.append(f"| {m} | {test} | {l['tps']:.1f} ± {l['sd']:.1f} | {h['tps']:.1f} ± {h['sd']:.1f} | "
                      f"{h['tps'] / l['tps']:.2f}x |")
    md.append("")
md += [f"| model | sequences | llama-batched-bench t/s | hybridlm t/s | ratio |", "|---|---|---|---|---|"]
series = {}
for m in models:
    pts = {"llama.cpp": [], "hybridlm": []}
    for b in batches:
        l, h = pick("llama.cpp", m, f"tg{args.batch_gen}", b, True), pick("hybridlm", m, f"tg{args.batch_gen}", b, True)
        if not (l and h):
            continue
        pts["llama.cpp"].append((b, l["tps"]))
        pts["hybridlm"].append((b, h["tps"]))
        md.append(f"| {m} | {b} | {l['tps']:.1f} | {h['tps']:.1f} | {h['tps'] / l['tps']:.2f}x |")
    series[m] = pts
text = "\n".join(md)
print(text)
with open(args.out + ".md", "w") as f:
    f.write(text + "\n")

bench_suite.COLORS.update({"llama.cpp": "#d62728", "hybridlm": "#1f77b4"})
w, h = 460, 320
body = []
for k, m in enumerate(models):
    body += bench_suite.svg_panel(k * w, 0, w, h, f"decode, {m}, f32, {args.threads} threads",
                                  "sequences decoding together", "tokens/s (all sequences)", series[m])
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{len(models) * w}" height="{h}" font-family="sans-serif">',
       '<rect width="100%" height="100%" fill="white"/>'] + body + ["</svg>"]
with open(args.out + ".svg", "w") as f:
    f.write("\n".join(svg) + "\n")
print(f"wrote {args.out}.json, .md, .svg", file=sys.stderr)
