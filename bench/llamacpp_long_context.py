"""Long-context decode side by side with llama.cpp: decode tokens/s of one sequence after a context of D tokens
(D = 1K, 16K by default; 64K, 128K with --depths), for a gated-DeltaNet hybrid (qwen3-next-750m) and a Mamba-2
hybrid (granite-4.0-h-350m), same random weights, f32 weights, 16-bit KV on both sides.

Recurrent layers cost the same per token at any depth; only the attention layers' KV reads grow, so the
script also prints the bytes a decode step reads at each depth (weights once, the KV of D tokens, the
recurrent state) and the tokens/s that bound allows at a given bandwidth (--bandwidth GB/s, for example
what `hybridlm bench` probed on the same machine).

llama.cpp: llama-bench -m M.gguf -t T -p 0 -n N -d D1,D2,... -r R -mmp 0 -o json (its depth prefill is not
timed; --no-warmup unless --llama-warmup: the depth prefill before the timed steps warms it). Ours:
hybridlm generate on a prompt of exactly D tokens (" hello" x D under the GPT-NeoX tokenizer, which
the script copies next to the checkpoint when none is there), -n N, greedy, --ignore-eos, its
"generation: ... tokens/s" line (the first token comes from the prefill and is not in it). Prefill
tokens/s of the same runs is kept as well (ours: the prompt eval of the D-token prompt; llama.cpp's
depth prefill is untimed, so llama-bench -p runs give it where wanted).

Usage: python3 bench/llamacpp_long_context.py --llama-bench PATH --gguf-dir DIR [--exe build/hybridlm]
           [--models build/bench_models] [--presets qwen3-next-750m,granite-4.0-h-350m]
           [--depths 1024,16384] [--llama-depths 1024] [-n 32] [-r 1] [-t 2] [--bandwidth 30] [--llama-warmup]
           [--out build/long_context]
"""
import argparse, json, os, re, shutil, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--llama-bench", required=True)
ap.add_argument("--gguf-dir", required=True)
ap.add_argument("--exe", default="build/hybridlm")
ap.add_argument("--models", default="build/bench_models")
ap.add_argument("--presets", default="qwen3-next-750m,granite-4.0-h-350m")
ap.add_argument("--depths", default="1024,16384")
ap.add_argument("--llama-depths", default=None,
                help="the depths llama.cpp runs (default: all of --depths; its depth prefill at 128K can take hours)")
ap.add_argument("-n", "--gen", default="32")
ap.add_argument("-r", "--reps", default="1")
ap.add_argument("-t", "--threads", default="2")
ap.add_argument("--bandwidth", type=float, default=0.0, help="GB/s for the roofline column (0: leave it out)")
ap.add_argument("--llama-warmup", action="store_true",
                help="let llama-bench warm up (one more depth prefill per test); ours has no warm-up run either")
ap.add_argument("--out", default="build/long_context")
args = ap.parse_args()
models = args.presets.split(",")
depths = [int(d) for d in args.depths.split(",")]
llama_depths = args.depths if args.llama_depths is None else args.llama_depths
env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.llama_bench)))
tokenizer = os.path.join(ROOT, "tests", "data", "tokenizers", "gpt-neox-20b", "tokenizer.json")


def run(cmd, **kw):
    print("  " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def run_streamed(cmd):
    """Like run, but llama-bench's --progress lines reach stderr as they come, timed: its depth prefill at
    128K runs for most of an hour on two cores."""
    print("  " + " ".join(cmd), file=sys.stderr, flush=True)
    t0, tail = time.time(), []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as p:
        stdout = []
        reader = threading.Thread(target=lambda: stdout.append(p.stdout.read()))  # so neither pipe fills
        reader.start()
        for line in p.stderr:
            tail = (tail + [line])[-40:]
            if line.startswith("llama-bench: benchmark"):
                print(f"  [{time.time() - t0:6.0f} s] {line.rstrip()}", file=sys.stderr, flush=True)
        reader.join()
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}):\n{''.join(tail)[-3000:]}")
    return stdout[0]


def inspect(model_dir):
    """Weight bytes, state bytes per sequence and KV bytes per token (bf16), from hybridlm inspect."""
    text = run([args.exe, "inspect", "-m", model_dir, "--quiet"]).stdout
    num = lambda key: int(re.search(key + r":\s+(\d+)", text).group(1))
    return num("weight bytes"), num("state / seq"), num("kv / token")


out = []
for m in models:
    gguf, ours = f"{args.gguf_dir}/{m}-f32.gguf", f"{args.models}/{m}"
    for p in (gguf, ours):
        if not os.path.exists(p):
            sys.exit(f"llamacpp_long_context: {p} does not exist (tools/make_test_checkpoint.py --preset {m}, "
                     "then bench/llamacpp_gguf.py)")
    if not os.path.exists(os.path.join(ours, "tokenizer.json")):
        shutil.copy(tokenizer, os.path.join(ours, "tokenizer.json"))
    wbytes, sbytes, kvtok = inspect(ours)
    t0 = time.time()
    for x in json.loads(run_streamed([args.llama_bench, "-m", gguf, "-t", args.threads, "-p", "0", "-n", args.gen,
                                      "-d", llama_depths, "-r", args.reps, "-mmp", "0", "-o", "json", "--progress"]
                                     + ([] if args.llama_warmup else ["--no-warmup"]))):
        out.append(dict(engine="llama.cpp", model=m, depth=x["n_depth"], test=f"tg{x['n_gen']}", tps=x["avg_ts"],
                        sd=x["stddev_ts"]))
    for d in depths:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(" hello" * d)
            f.flush()
            tps = []
            pp = []
            for _ in range(int(args.reps)):
                err = run([args.exe, "generate", "-m", ours, "-f", f.name, "-n", args.gen, "--temp", "0",
                           "--ignore-eos", "-t", args.threads, "-c", str(d + int(args.gen) + 16), "--no-display-prompt",
                           "--no-mmap"]).stderr
                g = re.search(r"generation: (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)", err)
                p = re.search(r"prompt eval: (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)", err)
                if not g or not p or int(p.group(1)) != d:
                    sys.exit(f"llamacpp_long_context: unexpected generate output (prompt of {d} tokens):\n"
                             + err[-1500:])
                tps.append((int(g.group(1)) - 1) / float(g.group(2)))  # as generate counts; it prints one decimal
                pp.append(int(p.group(1)) / float(p.group(2)))
        mean = sum(tps) / len(tps)
        sd = (sum((v - mean) ** 2 for v in tps) / max(1, len(tps) - 1)) ** 0.5
        out.append(dict(engine="hybridlm", model=m, depth=d, test=f"tg{args.gen}", tps=mean, sd=sd,
                        prefill_tps=sum(pp) / len(pp)))
    for d in depths:
        step = wbytes + kvtok * d + 2 * sbytes  # bf16 KV (ours); f32 weights, every expert (MoE: an upper bound)
        out.append(dict(engine="bound", model=m, depth=d, bytes_per_step=step,
                        tps=args.bandwidth * 1e9 / step if args.bandwidth else None))
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    print(f"{m}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

head = "| model | context | llama.cpp t/s | hybridlm t/s | ratio | bytes per step |"
md = [head + (f" bound at {args.bandwidth:g} GB/s |" if args.bandwidth else ""),
      "|---|---|---|---|---|---|" + ("---|" if args.bandwidth else "")]
for m in models:
    for d in depths:
        get = lambda e: next((o for o in out if o["engine"] == e and o["model"] == m and o["depth"] == d), None)
        l, h, b = get("llama.cpp"), get("hybridlm"), get("bound")
        row = (f"| {m} | {d} | " + (f"{l['tps']:.1f} ± {l['sd']:.1f}" if l else "-") + f" | {h['tps']:.1f} ± "
               f"{h['sd']:.1f} | " + (f"{h['tps'] / l['tps']:.2f}x" if l else "-") +
               f" | {b['bytes_per_step'] / 1e6:.0f} MB |")
        md.append(row + (f" {b['tps']:.1f} |" if args.bandwidth else ""))
text = "\n".join(md)
print(text)
with open(args.out + ".md", "w") as f:
    f.write(text + "\n")
