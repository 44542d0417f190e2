#!/usr/bin/python3
"""`hybridlm grad` (the engine's float32 training forward and backward) against grad_ref.py's
float64 hand-written backward, on tiny random hybridlm checkpoints covering every block kind.

Usage: test_grad_engine.py HYBRIDLM_BINARY SCRATCH_DIR

For each case and each kernel set (ref, cpu): write the checkpoint, draw seeded token ids, run
    HYBRIDLM grad -m DIR --ids a,b,c --out grads.safetensors --kernels K
(contract: one JSON line {"loss": L, "tokens": N}; float32 gradients under the checkpoint's names)
and compare with grad_ref.hybridlm_loss_fwd / hybridlm_loss_bwd.

Tolerances: the loss within LOSS_TOL relative; each tensor's gradient within GRAD_TOL of the
largest reference gradient of that tensor (max|engine - ref| <= GRAD_TOL * max|ref|). The engine
computes in float32 through a few layers and up to 70 recurrence steps and sums gradients over
all positions; 2e-4 of a tensor's gradient scale leaves ~10x headroom over the float32 error
measured (printed per case) while any wrong term (a missing factor, a transposed index) is off by
O(1). A tensor whose exact gradient vanishes (k_proj.bias: softmax ignores a constant added to a
row of scores) has no scale of its own; its scale is floored at FLOOR times the largest gradient
of the model. The reference itself is checked against central differences by test_grad_ref.py.
"""

import json
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
from mamba_ref import read_safetensors, read_weights  # noqa: E402

LOSS_TOL = 1e-5
GRAD_TOL = 2e-4
FLOOR = 1e-3
RUN_TIMEOUT_S = 120

# (name, make_test_checkpoint arguments, sequence length)
CASES = [
    # m2, t, m, m2, t: GQA 4:2 with RoPE, SwiGLU MLP, untied head; T spans 3 chunks of 16.
    ("hybridlm-tiny", ["--preset", "hybridlm-tiny"], 41),
    ("MQA, half RoPE, q/k norm, relu2 MLP, 2 groups, tied",
     ["--preset", "hybridlm-tiny", "--tie", "--set", 'block_pattern=["t", "m2", "m"]',
      "--set", 'attention={"num_heads": 4, "num_kv_heads": 1, "head_dim": 16, "partial_rotary_factor": 0.5,'
               ' "qk_norm": true, "rope_theta": 500.0}',
      "--set", 'mlp={"intermediate_size": 48, "activation": "relu2", "gated": false}',
      "--set", 'ssm={"d_state": 8, "head_dim": 8, "n_groups": 2, "chunk_size": 8, "dt_rank": 5}'], 30),
    ("biases everywhere, gelu MLP, no RoPE",
     ["--preset", "hybridlm-tiny", "--set", 'block_pattern=["m", "t", "m2"]',
      "--set", 'attention={"num_heads": 2, "num_kv_heads": 2, "bias": true, "partial_rotary_factor": 0.0}',
      "--set", 'ssm={"d_state": 8, "head_dim": 16, "proj_bias": true, "conv_bias": true}',
      "--set", 'mlp={"intermediate_size": 40, "activation": "gelu"}'], 19),
    # Discrete Mamba-2 with z_bias, two B/C groups, T over 3 chunks of 8; then with biases.
    ("m2d with z_bias, 2 groups",
     ["--preset", "hybridlm-tiny", "--set", 'block_pattern=["m2d", "t", "m2d"]',
      "--set", 'ssm={"d_state": 8, "head_dim": 8, "n_groups": 2, "chunk_size": 8}'], 20),
    ("m2d with projection biases, no conv bias",
     ["--preset", "hybridlm-tiny", "--set", 'block_pattern=["m2", "m2d"]',
      "--set", 'ssm={"d_state": 4, "head_dim": 16, "proj_bias": true, "conv_bias": false}'], 11),
    ("no MLP, no conv bias, two tokens",
     ["--preset", "hybridlm-tiny", "--set", 'block_pattern=["m2", "m"]',
      "--set", 'ssm={"d_state": 4, "head_dim": 16, "conv_bias": false}',
      "--set", 'mlp={"intermediate_size": 0}'], 2),
]


def run_case(index, name, args, T, binary, scratch):
    d = os.path.join(scratch, "case%02d" % index)
    make_test_checkpoint.main(["--out", d, "--seed", str(index)] + args)
    with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    w = read_weights(d)
    V = int(cfg["vocab_size"])
    rng = np.random.default_rng(2000 + index)
    ids = rng.integers(0, V, T)
    ids[0], ids[-1] = V - 1, 0
    loss_ref, cache = grad_ref.hybridlm_loss_fwd(cfg, w, ids)
    g_ref = grad_ref.hybridlm_loss_bwd(cache)
    details = []
    for kernels in ("ref", "cpu"):
        out = os.path.join(d, "grads-%s.safetensors" % kernels)
        cmd = [binary, "grad", "-m", d, "--ids", ",".join(str(int(i)) for i in ids), "--out", out,
               "--kernels", kernels]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, "%s: engine timed out after %d s" % (kernels, RUN_TIMEOUT_S)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return False, "%s: engine exited %d: %s" % (kernels, proc.returncode, " | ".join(tail))
        lines = proc.stdout.strip().splitlines()
        if len(lines) != 1:
            return False, "%s: expected one JSON line, got %r" % (kernels, proc.stdout[:200])
        res = json.loads(lines[0])
        if res.get("tokens") != T:
            return False, "%s: tokens %r, expected %d" % (kernels, res.get("tokens"), T)
        if abs(res["loss"] - loss_ref) > LOSS_TOL * abs(loss_ref):
            return False, "%s: loss %.8g, reference %.8g" % (kernels, res["loss"], loss_ref)
        g = read_safetensors(out)
        if set(g) != set(w):
            return False, "%s: gradient names differ from the checkpoint's: %s" % (
                kernels, sorted(set(g) ^ set(w))[:5])
        worst, worst_name = 0.0, ""
        floor = FLOOR * max(float(np.max(np.abs(r))) for r in g_ref.values())
        for n, ref in g_ref.items():
            if g[n].shape != w[n].shape:
                return False, "%s: %s has shape %s, the checkpoint %s" % (kernels, n, g[n].shape, w[n].shape)
            scale = float(np.max(np.abs(ref)))
            err = float(np.max(np.abs(g[n] - ref))) / max(scale, floor)
            if err > worst:
                worst, worst_name = err, n
        if worst > GRAD_TOL:
            return False, "%s: %s gradient off by %.2e of its scale (> %.0e)" % (kernels, worst_name, worst, GRAD_TOL)
        details.append("%s worst %.1e (%s)" % (kernels, worst, worst_name.replace("model.layers.", "L")))
    return True, "loss %.5f; " % loss_ref + "; ".join(details)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, scratch = sys.argv[1], sys.argv[2]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    passed = failed = 0
    for i, (name, args, T) in enumerate(CASES):
        ok, detail = run_case(i, name, args, T, binary, scratch)
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail))
        passed += ok
        failed += not ok
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
