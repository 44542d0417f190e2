#!/usr/bin/python3
"""A golden multi-step loss trajectory: `hybridlm train` (f32, cpu kernels) against the same
training computed independently in float64 numpy (grad_ref.py's backward, AdamW, the schedule and
clipping written here from their definitions), step by step.

Usage: test_train_trajectory.py HYBRIDLM_BINARY SCRATCH_DIR

The run starts from a random hybridlm checkpoint (init: DIR) with every block kind (m2, t, m and
the MLP), and its training file holds exactly one window of seq_len + 1 tokens, so every row of
every micro-batch is that window whatever the sampler draws: the reference needs no sampler. The
optimizer is exercised whole: warmup then cosine, decoupled weight decay on matrices only,
gradient accumulation over 2 micro-batches, and clipping that binds (grad_clip below the norm).

Tolerance: each step's loss within TOL relative. Measured: 1e-9 at the first step, 1.2e-7 at the
sixth (the float32 gradients are ~2e-6 of their scale off float64, test_grad_engine.py, and Adam's
normalised steps carry that into the parameters). TOL = 1e-5 leaves ~100x headroom, while a wrong
term anywhere in the optimizer (a missing bias correction, decay on a norm, the clip coefficient,
the schedule off by a step) moves the loss by 1e-3 or more within two steps.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))

import grad_ref  # noqa: E402
import make_test_checkpoint  # noqa: E402
from mamba_ref import read_weights  # noqa: E402

TOL = 1e-5
STEPS, SEQ_LEN, ROWS, ACCUM = 6, 24, 2, 2
LR, MIN_LR, WARMUP, B1, B2, EPS, WD, CLIP = 1e-2, 1e-3, 2, 0.9, 0.95, 1e-8, 0.1, 0.5


def lr_at(step):
    if step < WARMUP:
        return np.float32(LR) * np.float32(step + 1) / np.float32(WARMUP)
    q = min(1.0, (step - WARMUP) / (STEPS - WARMUP - 1))
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * q))


def main():
    binary, scratch = sys.argv[1], sys.argv[2]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    tokenizer = os.path.join(HERE, "..", "..", "models", "default", "tokenizer.json")
    model = os.path.join(scratch, "init")
    make_test_checkpoint.main(["--preset", "hybridlm-tiny", "--vocab", "4096", "--seed", "5", "--out", model,
                               "--tokenizer", tokenizer, "--set", 'block_pattern=["m2", "t", "m"]'])
    rng = np.random.default_rng(11)
    window = rng.integers(0, 4096, SEQ_LEN + 1)
    data = os.path.join(scratch, "data")
    os.makedirs(data)
    window.astype("<u2").tofile(os.path.join(data, "train.bin"))
    with open(os.path.join(data, "index.json"), "w") as f:
        json.dump({"format": "hybridlm-tokens", "version": 1, "dtype": "uint16", "byte_order": "little",
                   "vocab_size": 4096, "eos_id": 0, "tokenizer": {"path": os.path.abspath(tokenizer)},
                   "train": {"file": "train.bin", "tokens": SEQ_LEN + 1},
                   "val": {"file": "val.bin", "tokens": 0}}, f)
    with open(os.path.join(scratch, "train.yaml"), "w") as f:
        f.write(f"""model: {{init: init}}
data: {{train: data/train.bin, validation: null}}
optimizer: {{lr: {LR}, betas: [{B1}, {B2}], eps: {EPS}, weight_decay: {WD}, grad_clip: {CLIP}}}
schedule: {{kind: cosine, warmup_steps: {WARMUP}, min_lr: {MIN_LR}}}
batch: {{sequences: {ROWS}, seq_len: {SEQ_LEN}, accumulation: {ACCUM}}}
steps: {STEPS}
log_interval: 1
eval_interval: 0
checkpoint_interval: 0
seed: 3
threads: 2
out: run
""")
    p = subprocess.run([binary, "train", "--config", os.path.join(scratch, "train.yaml"), "-q"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print("FAIL engine exited %d: %s" % (p.returncode, p.stderr.strip()[-400:]))
        return 1
    with open(os.path.join(scratch, "run", "metrics.jsonl")) as f:
        engine = [json.loads(l)["loss"] for l in f if '"loss"' in l]

    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    w = read_weights(model)
    m = {n: np.zeros_like(a) for n, a in w.items()}
    v = {n: np.zeros_like(a) for n, a in w.items()}
    ref = []
    for step in range(STEPS):
        # Every row of every micro-batch is the window: the mean over them is the window's loss.
        loss, cache = grad_ref.hybridlm_loss_fwd(cfg, w, window)
        g = grad_ref.hybridlm_loss_bwd(cache)
        ref.append(loss)
        norm = math.sqrt(sum(float(np.sum(a * a)) for a in g.values()))
        if norm > CLIP:
            g = {n: a * (CLIP / (norm + 1e-6)) for n, a in g.items()}
        lr, t = float(lr_at(step)), step + 1
        for n in w:
            if w[n].ndim >= 2 and not n.endswith("A_log"):
                w[n] = w[n] - lr * WD * w[n]
            m[n] = B1 * m[n] + (1 - B1) * g[n]
            v[n] = B2 * v[n] + (1 - B2) * g[n] * g[n]
            w[n] = w[n] - lr * (m[n] / (1 - B1 ** t)) / (np.sqrt(v[n] / (1 - B2 ** t)) + EPS)
    ok = len(engine) == STEPS
    worst = max((abs(e - r) / abs(r) for e, r in zip(engine, ref)), default=1.0)
    for i, (e, r) in enumerate(zip(engine, ref)):
        print("step %d: engine %.7f  reference %.7f  rel %.1e" % (i + 1, e, r, abs(e - r) / abs(r)))
    ok = ok and worst <= TOL and ref[-1] < ref[0]
    print("%s loss trajectory over %d steps: worst relative difference %.1e (tolerance %.0e)"
          % ("PASS" if ok else "FAIL", STEPS, worst, TOL))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
