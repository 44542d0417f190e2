"""hybridlm bench against llama.cpp's llama-bench on the same random-weight checkpoints,
interleaved per model and weight type in one run (pure SSMs, f32 and q8_0); prints a markdown
table and writes the figures as JSON. It passes llama-bench `--load-mode none`, which llama.cpp
34af94cd takes and 81ff7abe5 rejects (bench/llamacpp_hybrids.py uses `-mmp 0`). llama-bench comes from a llama.cpp build kept
outside this repository; the GGUF files from bench/llamacpp_gguf.py (+ llama-quantize for Q8_0),
named GGUF_DIR/<model>-<f32|q8_0>.gguf.

Usage: python3 bench/llamacpp_side_by_side.py --llama-bench PATH --gguf-dir DIR
           [--exe build/hybridlm] [--models DIR] [--presets a,b] [--dtypes f32,q8_0] [-r 3] [--out F]
"""
import argparse, json, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--llama-bench", required=True)
ap.add_argument("--gguf-dir", required=True)
ap.add_argument("--exe", default="build/hybridlm")
ap.add_argument("--models", default="build/bench_models")
ap.add_argument("--presets", default="mamba-130m,mamba2-130m,mamba-1.4b,mamba2-1.3b")
ap.add_argument("--dtypes", default="f32,q8_0")
ap.add_argument("-r", "--reps", default="3")
ap.add_argument("--out", default="side_by_side.json")
args = ap.parse_args()
LB, HL, M, G = args.llama_bench, args.exe, args.models, args.gguf_dir
models, dtypes, reps = args.presets.split(","), args.dtypes.split(","), args.reps
out = []
for m in models:
    for d in dtypes:
        gg = f"{G}/{m}-{d}.gguf"
        t0 = time.time()
        r = subprocess.run([LB, "-m", gg, "-t", "2", "-p", "512", "-n", "128", "-r", reps, "--load-mode", "none", "-o", "json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr); sys.exit(1)
        for x in json.loads(r.stdout):
            test = f"pp{x['n_prompt']}" if x["n_prompt"] else f"tg{x['n_gen']}"
            out.append(dict(engine="llama.cpp", model=m, dtype=d, test=test, tps=x["avg_ts"], sd=x["stddev_ts"]))
        t1 = time.time()
        r = subprocess.run([HL, "bench", "-m", f"{M}/{m}", "-t", "2", "-p", "512", "-n", "128", "-r", reps, "--dtype", d, "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr); sys.exit(1)
        for x in json.loads(r.stdout):
            out.append(dict(engine="hybridlm", model=m, dtype=d, test=x["test"], tps=x["tokens_per_second"], sd=x["stddev"]))
        print(f"{m} {d}: llama.cpp {t1 - t0:.0f} s, hybridlm {time.time() - t1:.0f} s", file=sys.stderr, flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
print("| model | weights | test | llama.cpp t/s | hybridlm t/s | ratio |")
print("|---|---|---|---|---|---|")
for m in models:
    for d in dtypes:
        for test in ("pp512", "tg128"):
            a = [o for o in out if o["model"] == m and o["dtype"] == d and o["test"] == test]
            l = next(o for o in a if o["engine"] == "llama.cpp"); h = next(o for o in a if o["engine"] == "hybridlm")
            print(f"| {m} | {d.upper()} | {test} | {l['tps']:.1f} ± {l['sd']:.1f} | {h['tps']:.1f} ± {h['sd']:.1f} | {h['tps'] / l['tps']:.2f}x |")
