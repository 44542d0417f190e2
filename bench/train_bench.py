#!/usr/bin/python3
"""Training tokens/s and peak memory of `hybridlm train` against the same model in plain PyTorch on
CPU, measured side by side in one run (issue 16's training benchmark; a benchmark, not a test).

The model is models/default's (its config.json: pattern [m2, m2, t, m2], hidden 256, vocab 4096,
tied embeddings, Mamba-2 d_state 64 / head_dim 64 / expand 2, attention 4 x 64 with RoPE, gated
SiLU MLP 768); the batch is 8 sequences x 256 tokens of random ids. A step is forward, backward,
gradient clipping and AdamW for both engines.

- PyTorch: the model written here from docs/model-format.md (no mamba_ssm, no Triton): the Mamba-2
  mixer of tests/reference/grad_ref.py's mamba2_mixer_fwd with the SSD scan in its chunked matmul
  form (docs/derivations/mamba2-ssd.md), softmax attention with RoPE, torch.optim.AdamW. It runs
  in a child process of Debian's python3-torch (a benchmark-only dependency), with
  torch.set_num_threads(--threads), after --warmup untimed steps.
- Ours: `hybridlm train --config` on a generated train.yaml and a token file of random ids; the
  rate is read from metrics.jsonl (log_interval 1, the first --warmup steps skipped).
- Peak memory: each child's peak RSS (wait4's ru_maxrss), less what the process holds before it
  builds the model (PyTorch: after `import torch`; ours: `hybridlm --version`), per token of the
  batch (sequences x seq_len).

OpenBLAS: this machine's environment sets OPENBLAS_CORETYPE=Haswell, which keeps OpenBLAS (torch's
BLAS here) on its AVX2 kernels, about half its AVX-512 sgemm rate. The comparison is against
torch's best, so the PyTorch child runs with OPENBLAS_CORETYPE=SKYLAKEX unless
--openblas-coretype says otherwise (`inherit` keeps the environment's value). Our engine links no
BLAS.

--verify checks that the PyTorch model is our model: it loads models/default's weights into it and
compares its loss and every parameter's gradient on one sequence with `hybridlm grad`'s.

usage: python3 bench/train_bench.py [--exe build/hybridlm] [--model models/default] [--steps 20]
           [--warmup 3] [--threads 2] [--openblas-coretype SKYLAKEX|inherit|NAME] [--markdown]
           [--quick] [--verify] [--only ours|torch]
"""
import argparse
import json
import os
import platform
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-torch is installed for this interpreter
TORCH_LABEL = "PyTorch"


# ---------------------------------------------------------------------------------------------
# Common
# ---------------------------------------------------------------------------------------------


def model_section(model_dir, pattern=None, hidden=None):
    """The train.yaml model section (config.json's keys a training run accepts) of model_dir's
    config.json, with the pattern / hidden size overridden when given."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    keep = ["block_pattern", "hidden_size", "vocab_size", "rms_norm_eps", "tie_word_embeddings", "ssm", "attention",
            "mlp"]
    m = {k: cfg[k] for k in keep if k in cfg}
    if pattern:
        m["block_pattern"] = pattern
    if hidden:
        m["hidden_size"] = hidden
    return m


def mib(kib_value):
    return "%.0f MiB" % (kib_value / 1024.0)


def wait_rusage(proc):
    """Waits for a Popen child and returns (returncode, its own peak RSS in KiB)."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_maxrss


# ---------------------------------------------------------------------------------------------
# The PyTorch model (imported only in the torch child)
# ---------------------------------------------------------------------------------------------


def build_torch_model(cfg):
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    H = int(cfg["hidden_size"])
    V = int(cfg["vocab_size"])
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    ssm, att, mc = cfg.get("ssm", {}), cfg.get("attention", {}), cfg.get("mlp", {})
    I = int(ssm.get("expand", 2)) * H
    N = int(ssm.get("d_state", 16))
    K = int(ssm.get("d_conv", 4))
    P = int(ssm.get("head_dim", 64))
    G = int(ssm.get("n_groups", 1))
    nh = I // P
    chunk = int(ssm.get("chunk_size", 256))
    heads = int(att.get("num_heads", 8))
    kv_heads = int(att.get("num_kv_heads", heads))
    hd = int(att.get("head_dim", H // heads))
    rot = int(float(att.get("partial_rotary_factor", 1.0)) * hd)
    theta = float(att.get("rope_theta", 10000.0))
    Fm = int(mc.get("intermediate_size", 0))
    act = {"silu": F.silu, "gelu": F.gelu, "relu2": lambda x: torch.relu(x) ** 2}[mc.get("activation", "silu")]
    gated = bool(mc.get("gated", True))
    tie = bool(cfg.get("tie_word_embeddings", True))
    if att.get("qk_norm") or att.get("bias") or ssm.get("proj_bias") or not ssm.get("conv_bias", True):
        raise SystemExit("train_bench: qk_norm, q/k/v biases, projection biases and conv without bias are not modelled")
    if any(k not in ("m2", "t") for k in cfg["block_pattern"]):
        raise SystemExit("train_bench: only m2 and t blocks are modelled")

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def ssd(x, dt, A, B, C):
        """Chunked SSD (docs/derivations/mamba2-ssd.md).  x (b,l,h,p); dt (b,l,h) = delta after
        softplus; A (h); B, C (b,l,g,n).  y_t = S_t C_t with S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T."""
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        q = min(chunk, l)
        pad = (-l) % q
        if pad:  # zero steps at the end: they change nothing before them
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
            dt = F.pad(dt, (0, 0, 0, pad))
            B = F.pad(B, (0, 0, 0, 0, 0, pad))
            C = F.pad(C, (0, 0, 0, 0, 0, pad))
        L = l + pad
        c = L // q
        hpg = h // g  # head h reads group h // hpg: heads are laid out (g, hpg), B and C broadcast over hpg
        a = (dt * A).view(b, c, q, g, hpg).permute(0, 1, 3, 4, 2)      # (b,c,g,hpg,q) log-decay per step
        lam = torch.cumsum(a, dim=-1)                                    # Λ_t within the chunk, t included
        xdt = (x * dt.unsqueeze(-1)).view(b, c, q, g, hpg, p).permute(0, 1, 3, 4, 2, 5)  # (b,c,g,hpg,q,p)
        Bc = B.view(b, c, q, g, 1, n).permute(0, 1, 3, 4, 2, 5)         # (b,c,g,1,q,n)
        Cc = C.view(b, c, q, g, 1, n).permute(0, 1, 3, 4, 2, 5)
        # Intra-chunk (diagonal blocks): y_t = sum_{s<=t} exp(Λ_t - Λ_s) (C_t . B_s) Δ_s x_s
        seg = lam.unsqueeze(-1) - lam.unsqueeze(-2)                      # (b,c,g,hpg,q,q): Λ_t - Λ_s
        causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
        Lmat = torch.exp(seg.masked_fill(~causal, float("-inf")))
        y = ((Cc @ Bc.transpose(-1, -2)) * Lmat) @ xdt                   # (b,c,g,hpg,q,p)
        # Each chunk's own state at its end: sum_s exp(Λ_last - Λ_s) Δ_s x_s B_s^T
        decay = torch.exp(lam[..., -1:] - lam).unsqueeze(-1)             # (b,c,g,hpg,q,1)
        states = (xdt * decay).transpose(-1, -2) @ Bc                    # (b,c,g,hpg,p,n)
        # Inter-chunk recurrence: S_in(c+1) = exp(Λ_last(c)) S_in(c) + states(c), S_in(0) = 0
        chunk_decay = torch.exp(lam[..., -1])                            # (b,c,g,hpg)
        S = x.new_zeros(b, g, hpg, p, n)
        s_in = []
        for ci in range(c):
            s_in.append(S)
            S = chunk_decay[:, ci, :, :, None, None] * S + states[:, ci]
        s_in = torch.stack(s_in, dim=1)                                  # (b,c,g,hpg,p,n)
        # The entering state's part: y_t += exp(Λ_t) S_in C_t
        y = y + (Cc @ s_in.transpose(-1, -2)) * torch.exp(lam).unsqueeze(-1)
        return y.permute(0, 1, 4, 2, 3, 5).reshape(b, L, h, p)[:, :l]

    class Mamba2(nn.Module):
        def __init__(self):
            super().__init__()
            self.cd = I + 2 * G * N
            self.in_proj = nn.Linear(H, I + self.cd + nh, bias=False)    # [z, xBC, dt]
            self.conv1d = nn.Conv1d(self.cd, self.cd, K, groups=self.cd, bias=True)
            # as mamba_ssm: dt in [1e-3, 0.1] log-uniform, dt_bias its inverse softplus; A in U(1, 16)
            dt = torch.exp(torch.rand(nh) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
            self.A_log = nn.Parameter(torch.log(torch.empty(nh).uniform_(1, 16)))
            self.D = nn.Parameter(torch.ones(nh))
            self.norm = RMSNorm(I)  # grouped gated norm: forward below
            self.out_proj = nn.Linear(I, H, bias=False)

        def forward(self, u):
            b, l, _ = u.shape
            z, xBC, dt = torch.split(self.in_proj(u), [I, self.cd, nh], dim=-1)
            xBC = F.conv1d(xBC.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, padding=K - 1,
                           groups=self.cd)[..., :l]                      # causal depthwise
            xBC = F.silu(xBC).transpose(1, 2)
            x, B, C = torch.split(xBC, [I, G * N, G * N], dim=-1)
            x = x.reshape(b, l, nh, P)
            dt = F.softplus(dt + self.dt_bias)
            A = -torch.exp(self.A_log)
            y = ssd(x, dt, A, B.reshape(b, l, G, N), C.reshape(b, l, G, N))
            y = (y + x * self.D.unsqueeze(-1)).reshape(b, l, I)
            t = (y * F.silu(z)).view(b, l, G, I // G)                    # norm(y * silu(z)) per group
            t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
            return self.out_proj(t.reshape(b, l, I) * self.norm.weight)

    sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(H, heads * hd, bias=False)
            self.k_proj = nn.Linear(H, kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(H, kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(heads * hd, H, bias=False)
            self.cache = {}

        def rope_tables(self, l, x):
            if l not in self.cache:
                half = rot // 2
                inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / rot)
                ang = torch.arange(l, dtype=torch.float64)[:, None] * inv[None, :]
                self.cache[l] = (ang.cos().to(x.dtype)[None, None], ang.sin().to(x.dtype)[None, None],
                                 torch.full((l, l), float("-inf"), dtype=x.dtype).triu(1))
            return self.cache[l]

        def rope(self, x, cos, sin):  # rotate-half on the first `rot` dims; x (b, heads, l, hd)
            if rot == 0:
                return x
            half = rot // 2
            a, b2, rest = x[..., :half], x[..., half:rot], x[..., rot:]
            return torch.cat([a * cos - b2 * sin, b2 * cos + a * sin, rest], dim=-1)

        def forward(self, u):
            b, l, _ = u.shape
            q = self.q_proj(u).view(b, l, heads, hd).transpose(1, 2)
            k = self.k_proj(u).view(b, l, kv_heads, hd).transpose(1, 2)
            v = self.v_proj(u).view(b, l, kv_heads, hd).transpose(1, 2)
            cos, sin, mask = self.rope_tables(l, u)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            if kv_heads != heads:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) * (hd ** -0.5) + mask
                y = torch.softmax(s, dim=-1) @ v
            return self.o_proj(y.transpose(1, 2).reshape(b, l, heads * hd))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            if gated:
                self.gate_proj = nn.Linear(H, Fm, bias=False)
            self.up_proj = nn.Linear(H, Fm, bias=False)
            self.down_proj = nn.Linear(Fm, H, bias=False)

        def forward(self, u):
            m = act(self.gate_proj(u)) * self.up_proj(u) if gated else act(self.up_proj(u))
            return self.down_proj(m)

    class Block(nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.mixer_norm = RMSNorm(H)
            self.mixer = Mamba2() if kind == "m2" else Attention()
            if Fm > 0:
                self.ffn_norm = RMSNorm(H)
                self.ffn = MLP()

        def forward(self, h):
            h = h + self.mixer(self.mixer_norm(h))
            if Fm > 0:
                h = h + self.ffn(self.ffn_norm(h))
            return h

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, H)
            nn.init.normal_(self.embed_tokens.weight, std=0.02)
            self.layers = nn.ModuleList([Block(k) for k in cfg["block_pattern"]])
            self.norm = RMSNorm(H)

    class HybridLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            if not tie:
                self.lm_head = nn.Linear(H, V, bias=False)

        def forward(self, ids, targets):
            h = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                h = layer(h)
            h = self.model.norm(h)
            logits = F.linear(h, self.model.embed_tokens.weight if tie else self.lm_head.weight)
            return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))

    return HybridLM()


def torch_param_groups(model, weight_decay):
    """As ours (TrainTensor::decay): decay the matrices and conv taps, not 1-D tensors nor A_log."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.endswith("A_log") else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def torch_worker(spec):
    """The PyTorch side, in its own process: builds the model, runs the steps, prints one JSON line."""
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import torch
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cfg = spec["model"]
    model = build_torch_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(torch_param_groups(model, 0.1), lr=2e-3, betas=(0.9, 0.95), eps=1e-8)
    S, L, V = spec["sequences"], spec["seq_len"], int(cfg["vocab_size"])
    gen = torch.Generator().manual_seed(spec["seed"])
    times, losses = [], []
    for step in range(spec["warmup"] + spec["steps"]):
        ids = torch.randint(0, V, (S, L + 1), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if step >= spec["warmup"]:
            times.append(dt)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"tokens_per_s": S * L * len(times) / sum(times), "step_s": times, "params": n_params,
                      "first_loss": losses[0], "last_loss": losses[-1], "rss_start_kib": rss_start,
                      "rss_base_kib": rss_import, "rss_peak_kib": peak, "torch": torch.__version__,
                      "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}))


# ---------------------------------------------------------------------------------------------
# --verify: the PyTorch model against `hybridlm grad` on models/default's weights
# ---------------------------------------------------------------------------------------------


def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            raise SystemExit("train_bench: %s: dtype %s not handled" % (name, t["dtype"]))
        out[name] = arr.reshape(t["shape"]).copy()
    return out


def verify_worker(spec):
    import numpy as np
    import torch
    torch.set_num_threads(spec["threads"])
    model_dir, exe = spec["model_dir"], spec["exe"]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = build_torch_model(cfg)
    weights = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            weights.update(read_safetensors(os.path.join(model_dir, fn)))
    names = dict(model.named_parameters())
    missing = sorted(set(names) ^ set(weights))
    if missing:
        raise SystemExit("train_bench --verify: tensor names differ from the checkpoint's: %s" % missing[:8])
    with torch.no_grad():
        for n, p in names.items():
            if tuple(p.shape) != weights[n].shape:
                raise SystemExit("train_bench --verify: %s: shape %s, checkpoint %s" % (n, tuple(p.shape),
                                                                                          weights[n].shape))
            p.copy_(torch.from_numpy(weights[n]))
    rng = np.random.default_rng(7)
    ids = rng.integers(0, int(cfg["vocab_size"]), size=spec["tokens"])
    t = torch.from_numpy(ids).long()[None]
    loss = model(t[:, :-1], t[:, 1:])
    loss.backward()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "grads.safetensors")
        r = subprocess.run([exe, "grad", "-m", model_dir, "--ids", ",".join(map(str, ids)), "--out", out,
                            "-t", str(spec["threads"])], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("hybridlm grad failed:\n" + r.stderr)
        ours_loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
        grads = read_safetensors(out)
    worst = (0.0, "")
    for n, p in names.items():
        g, ref = p.grad.numpy(), grads[n]
        err = float(np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-30))
        worst = max(worst, (err, n))
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "tensors": len(names),
                      "tokens": len(ids), "torch_loss": float(loss), "ours_loss": ours_loss,
                      "worst_grad_rel_err": worst[0], "worst_tensor": worst[1]}))


# ---------------------------------------------------------------------------------------------
# The driver: ours, then PyTorch, then the table
# ---------------------------------------------------------------------------------------------


def torch_python(args):
    if args.torch_python:
        return args.torch_python
    try:
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            return sys.executable
    except (ImportError, ValueError):
        pass
    return SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable


def torch_env(args):
    env = dict(os.environ)
    if args.openblas_coretype != "inherit":
        env["OPENBLAS_CORETYPE"] = args.openblas_coretype
    env["OMP_NUM_THREADS"] = str(args.threads)
    env["OPENBLAS_NUM_THREADS"] = str(args.threads)
    return env


def run_child_json(cmd, env, what):
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        rc, maxrss = wait_rusage(p)
        out.seek(0)
        err.seek(0)
        text, etext = out.read(), err.read()
    if rc != 0 or not text.strip():
        sys.exit("train_bench: %s failed (exit %s):\n%s%s" % (what, rc, text, etext))
    return json.loads(text.strip().splitlines()[-1]), maxrss


def run_torch(args, model):
    spec = {"model": model, "threads": args.threads, "sequences": args.sequences, "seq_len": args.seq_len,
            "warmup": args.warmup, "steps": args.steps, "seed": 1}
    res, maxrss = run_child_json([torch_python(args), os.path.abspath(__file__), "--torch-worker", json.dumps(spec)],
                                 torch_env(args), "the PyTorch side")
    res["rss_peak_kib"] = max(res["rss_peak_kib"], maxrss)
    return res


def write_tokens(d, vocab, n_tokens, tokenizer, seed):
    import random
    os.makedirs(d, exist_ok=True)
    rnd = random.Random(seed)
    ids = [rnd.randrange(vocab) for _ in range(n_tokens)]
    with open(os.path.join(d, "train.bin"), "wb") as f:
        f.write(struct.pack("<%dH" % n_tokens, *ids))
    open(os.path.join(d, "val.bin"), "wb").close()
    index = {"format": "hybridlm-tokens", "version": 1, "dtype": "uint16", "byte_order": "little",
             "vocab_size": vocab, "eos_id": 0, "tokenizer": {"path": tokenizer},
             "val_fraction": 0.0, "seed": seed,
             "train": {"file": "train.bin", "tokens": n_tokens,
                       "documents": [{"source": "random", "offset": 0, "tokens": n_tokens, "document_offset": 0}]},
             "val": {"file": "val.bin", "tokens": 0, "documents": []}}
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


def run_ours(args, model, work):
    vocab = int(model["vocab_size"])
    tokenizer = os.path.abspath(os.path.join(args.model, "tokenizer.json"))
    data = os.path.join(work, "data")
    write_tokens(data, vocab, 1 << 17, tokenizer, 1)
    steps = args.warmup + args.steps
    run = os.path.join(work, "run")
    yaml = "\n".join([
        "# generated by bench/train_bench.py",
        "model: " + json.dumps(model),  # JSON is YAML
        "tokenizer: " + json.dumps(tokenizer),
        "data: {train: %s, validation: null}" % json.dumps(os.path.join(data, "train.bin")),
        "optimizer: {lr: 2.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1, grad_clip: 1.0}",
        "schedule: {kind: cosine, warmup_steps: 0, min_lr: 1.0e-4}",
        "batch: {sequences: %d, seq_len: %d, accumulation: 1}" % (args.sequences, args.seq_len),
        "steps: %d" % steps,
        "eval_interval: 0",
        "checkpoint_interval: 0",
        "log_interval: 1",
        "seed: 1",
        "threads: %d" % args.threads,
        "out: " + json.dumps(run), ""])
    cfg_path = os.path.join(work, "train.yaml")
    with open(cfg_path, "w") as f:
        f.write(yaml)
    # The process's own footprint before any model: `hybridlm --version`.
    base = subprocess.Popen([args.exe, "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, base_kib = wait_rusage(base)
    with open(os.path.join(work, "train.log"), "w+") as log:
        p = subprocess.Popen([args.exe, "train", "--config", cfg_path], stdout=log, stderr=subprocess.STDOUT)
        rc, peak_kib = wait_rusage(p)
        log.seek(0)
        text = log.read()
    if rc != 0:
        sys.exit("train_bench: hybridlm train failed (exit %d):\n%s" % (rc, text))
    m = re.search(r"(\d+) parameters", text)
    rows = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("tokens_per_s") is not None:
                rows.append(r)
    tokens_per_step = args.sequences * args.seq_len
    timed = [r for r in rows if r["step"] > args.warmup]
    secs = [tokens_per_step / r["tokens_per_s"] for r in timed]
    return {"tokens_per_s": tokens_per_step * len(secs) / sum(secs), "step_s": secs,
            "params": int(m.group(1)) if m else None, "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
            "rss_base_kib": base_kib, "rss_peak_kib": peak_kib}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def git_commit():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def spread(xs):
    if len(xs) < 2:
        return ""
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return " ± %.0f" % (sd / mean * 100) + "%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "hybridlm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"),
                    help="the model directory whose config.json gives the shape (and tokenizer.json the tokenizer)")
    ap.add_argument("--pattern", help="override the block pattern, e.g. m2,m2,t,m2")
    ap.add_argument("--hidden", type=int, help="override hidden_size")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per engine (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--openblas-coretype", default="SKYLAKEX",
                    help="OPENBLAS_CORETYPE for the PyTorch side (default SKYLAKEX: the AVX-512 kernels); "
                         "'inherit' keeps the environment's")
    ap.add_argument("--torch-python", help="the interpreter with torch (default: this one if it has torch, else "
                                           + SYSTEM_PYTHON + ")")
    ap.add_argument("--only", choices=["ours", "torch"], help="run one side only")
    ap.add_argument("--markdown", action="store_true", help="print a docs-ready markdown table")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 warm-up + 3 timed steps")
    ap.add_argument("--verify", action="store_true",
                    help="check the PyTorch model against `hybridlm grad` on --model's weights, then stop")
    ap.add_argument("--keep", help="keep the generated data / train.yaml / run in this directory")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    ap.add_argument("--verify-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(json.loads(args.torch_worker))
    if args.verify_worker:
        return verify_worker(json.loads(args.verify_worker))
    if args.quick:
        args.steps, args.warmup = 3, 1
    if args.steps < 1 or args.warmup < 0:
        sys.exit("train_bench: --steps must be >= 1 and --warmup >= 0")
    args.exe = os.path.abspath(args.exe)
    if not os.access(args.exe, os.X_OK):
        sys.exit("train_bench: %s: not built (make build)" % args.exe)

    if args.verify:
        spec = {"model_dir": os.path.abspath(args.model), "exe": args.exe, "threads": args.threads, "tokens": 200}
        res, _ = run_child_json([torch_python(args), os.path.abspath(__file__), "--verify-worker", json.dumps(spec)],
                                torch_env(args), "--verify")
        print("verify: %s, %d tensors, %d parameters, one sequence of %d tokens" % (
            os.path.relpath(args.model, ROOT), res["tensors"], res["params"], res["tokens"]))
        print("  loss: PyTorch %.6f, hybridlm grad %.6f (difference %.2e)" % (
            res["torch_loss"], res["ours_loss"], abs(res["torch_loss"] - res["ours_loss"])))
        print("  gradients: worst max|torch - ours| / max|ours| over the tensors %.2e (%s)" % (
            res["worst_grad_rel_err"], res["worst_tensor"]))
        ok = abs(res["torch_loss"] - res["ours_loss"]) < 1e-3 and res["worst_grad_rel_err"] < 1e-3
        print("  " + ("same model" if ok else "MISMATCH"))
        return 0 if ok else 1

    pattern = [s.strip() for s in args.pattern.split(",")] if args.pattern else None
    model = model_section(args.model, pattern, args.hidden)
    tokens = args.sequences * args.seq_len
    env_ct = os.environ.get("OPENBLAS_CORETYPE", "(unset)")
    torch_ct = env_ct if args.openblas_coretype == "inherit" else args.openblas_coretype
    print("train_bench: %s, %d CPUs, commit %s; %d threads; OPENBLAS_CORETYPE in the environment: %s, "
          "for PyTorch: %s%s" % (cpu_name(), os.cpu_count(), git_commit(), args.threads, env_ct, torch_ct,
                                 " (its AVX-512 kernels: torch at its best)" if torch_ct.upper() == "SKYLAKEX" else ""),
          file=sys.stderr, flush=True)
    print("  model: pattern [%s], hidden %d, vocab %d; batch %d x %d = %d tokens; %d warm-up + %d timed steps "
          "(forward, backward, clip, AdamW)" % (", ".join(model["block_pattern"]), model["hidden_size"],
                                                model["vocab_size"], args.sequences, args.seq_len, tokens,
                                                args.warmup, args.steps), file=sys.stderr, flush=True)

    results = {}
    work = args.keep or tempfile.mkdtemp(prefix="train_bench.")
    try:
        if args.only != "torch":
            print("  running hybridlm train ...", file=sys.stderr, flush=True)
            results["hybridlm"] = run_ours(args, model, work)
        if args.only != "ours":
            print("  running PyTorch ...", file=sys.stderr, flush=True)
            results[TORCH_LABEL] = run_torch(args, model)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    ours, tref = results.get("hybridlm"), results.get(TORCH_LABEL)
    if ours and tref and ours["params"] != tref["params"]:
        print("WARNING: parameter counts differ: hybridlm %s, PyTorch %s" % (ours["params"], tref["params"]),
              file=sys.stderr)
    header = ["engine", "tokens/s", "vs PyTorch", "peak RSS", "at start", "(peak - start) / token", "loss first -> last"]
    rows = []
    for name, r in results.items():
        label = name
        if name == TORCH_LABEL:
            label = "PyTorch %s%s" % (r["torch"], " (OPENBLAS_CORETYPE=%s)" % r["openblas_coretype"]
                                      if r["openblas_coretype"] else "")
        ratio = "%.2fx" % (r["tokens_per_s"] / tref["tokens_per_s"]) if tref else "-"
        rows.append([label, "%.0f%s" % (r["tokens_per_s"], spread(r["step_s"])), ratio, mib(r["rss_peak_kib"]),
                     mib(r["rss_base_kib"]), "%.1f KiB" % ((r["rss_peak_kib"] - r["rss_base_kib"]) / tokens),
                     "%.3f -> %.3f" % (r["first_loss"], r["last_loss"])])
    params = (ours or tref)["params"]
    caption = ("Training, %s, %d threads, %s: pattern [%s], hidden %d, vocab %d, %s parameters; %d x %d tokens "
               "per step, %d timed steps after %d warm-up (forward, backward, clip, AdamW). Commit %s." % (
                   cpu_name(), args.threads, time.strftime("%Y-%m-%d"), ", ".join(model["block_pattern"]),
                   model["hidden_size"], model["vocab_size"], params, args.sequences, args.seq_len, args.steps,
                   args.warmup, git_commit()))
    if args.markdown:
        print(caption)
        print()
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        print(caption)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("tokens/s: mean over the timed steps (± the steps' relative standard deviation); peak RSS: the "
          "process's VmHWM; at start: PyTorch after `import torch`, ours `hybridlm --version`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
