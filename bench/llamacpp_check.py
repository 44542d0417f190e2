"""Check a GGUF written by bench/llamacpp_gguf.py against the checkpoint it came from: llama.cpp's greedy
continuation of a fixed token prompt must be ours too, and its log-probabilities must match ours.

llama.cpp side: `llama-server` (from a llama.cpp build kept outside this repository) on the GGUF, f32 KV,
asked over HTTP for a greedy continuation of the prompt's token ids with the top log-probabilities of
every step. Our side: `hybridlm score --ids PROMPT+CONTINUATION --logits-out` (f32 KV) on the
safetensors checkpoint, one forward pass: at every generated position our argmax must be llama.cpp's
token, and our log-softmax of each token llama.cpp listed must agree with its log-probability.
Use an untied checkpoint (make_test_checkpoint.py --set tie_word_embeddings=false): with tied random
embeddings the last token's own logit dominates and every continuation repeats it, which checks little.

Usage: python3 bench/llamacpp_check.py --llama-server PATH --gguf F.gguf --model DIR
           [--exe build/hybridlm] [--prompt 11,22,...] [-n 32] [--tol 1e-3] [--out F.json]
Exit 0 when every greedy token matches and every log-probability is within --tol; prints a summary.
"""
import argparse, json, os, random, socket, subprocess, sys, tempfile, time, urllib.request
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--llama-server", required=True)
ap.add_argument("--gguf", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--exe", default="build/hybridlm")
ap.add_argument("--prompt", default="11,22,333,4444,5555,12345,99,7,1000,2024,31337,42")
ap.add_argument("-n", type=int, default=32)
ap.add_argument("--top", type=int, default=8, help="log-probabilities compared per step")
ap.add_argument("--tol", type=float, default=1e-3, help="largest |log-prob difference| accepted")
ap.add_argument("-t", "--threads", default="2")
ap.add_argument("--out", default=None, help="write the figures as JSON here")
args = ap.parse_args()
prompt = [int(x) for x in args.prompt.split(",")]

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.llama_server)))
log = tempfile.NamedTemporaryFile("w+", suffix=".log")
srv = subprocess.Popen([args.llama_server, "-m", args.gguf, "-t", args.threads, "-c", str(len(prompt) + args.n + 16),
                        "-np", "1", "-ctk", "f32", "-ctv", "f32", "--host", "127.0.0.1", "--port", str(port)],
                       stdout=log, stderr=subprocess.STDOUT, env=env)
try:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if srv.poll() is not None:
            log.seek(0)
            sys.exit("llamacpp_check: llama-server exited:\n" + log.read()[-2000:])
        time.sleep(0.2)
    req = dict(prompt=prompt, n_predict=args.n, temperature=0, top_k=1, n_probs=args.top,
               post_sampling_probs=False, return_tokens=True, cache_prompt=False, ignore_eos=True)
    r = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(req).encode(),
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=600) as resp:
        res = json.load(resp)
finally:
    srv.terminate()
    srv.wait()
theirs = res["tokens"]
steps = res["completion_probabilities"]
if len(theirs) != args.n:
    sys.exit(f"llamacpp_check: llama-server returned {len(theirs)} tokens, asked for {args.n}")

with tempfile.TemporaryDirectory() as d:
    npy = os.path.join(d, "logits.npy")
    ids = ",".join(str(x) for x in prompt + theirs)
    subprocess.run([args.exe, "score", "-m", args.model, "--ids", ids, "--logits-out", npy, "--kv-dtype", "f32",
                    "-t", args.threads, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    logits = np.load(npy).astype(np.float64)
lsm = logits - logits.max(axis=1, keepdims=True)
lsm -= np.log(np.exp(lsm).sum(axis=1, keepdims=True))
p0 = len(prompt) - 1  # row p0 predicts the first generated token
ours = [int(np.argmax(logits[p0 + k])) for k in range(args.n)]
diffs, per_step = [], []
for k, st in enumerate(steps):
    d = [abs(lsm[p0 + k, tp["id"]] - tp["logprob"]) for tp in st["top_logprobs"]]
    diffs += d
    per_step.append(round(max(d), 7))
first_bad = next((k for k in range(args.n) if ours[k] != theirs[k]), None)
summary = dict(gguf=os.path.basename(args.gguf), model=args.model, prompt=prompt, llama_cpp=theirs, hybridlm=ours,
               greedy_match=first_bad is None, first_mismatch=first_bad, logprobs_compared=len(diffs),
               max_abs_logprob_diff=max(diffs), mean_abs_logprob_diff=float(np.mean(diffs)),
               max_abs_logprob_diff_per_step=per_step)
print(json.dumps(summary))
if args.out:
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
sys.exit(0 if first_bad is None and max(diffs) <= args.tol else 1)
