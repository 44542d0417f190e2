#!/usr/bin/python3
"""Slow, float64 numpy reference forward for Mamba-1, FalconMamba and Mamba-2 checkpoints.

This is the oracle the engine is checked against, so it is written to be obviously correct,
not fast: every recurrence is a plain loop over time, one step at a time, straight from the
published math (Gu & Dao 2023, "Mamba", Alg. 2; Dao & Gu 2024, "Transformers are SSMs", eq. for
the SSD recurrence) and the Hugging Face torch paths described in research/hf-hybrid.md C.1, C.2.
Nothing is shared with the engine or with make_test_checkpoint.py; the safetensors reader is
its own.

Notation (paper terms):  H hidden size, I inner (d_inner), N state size (d_state), K conv
kernel, R dt rank, nh heads, P head dim (I = nh*P), G groups (B/C shared by nh/G heads).

Model:   h = embed(ids)
         per layer:  h = h + mixer(rmsnorm(h))         (residual stream kept in float64)
         logits = rmsnorm_f(h) @ W_head.T              (W_head = embeddings when tied)

API:     load_model(dir) -> Model;  forward(model, ids, norm_groups='grouped') -> (T, vocab)
CLI:     mamba_ref.py DIR --ids 1,2,3 --out logits.npy [--norm-groups grouped|full]
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# --------------------------------------------------------------------------------------------
# safetensors reading (8-byte LE header length, JSON header, raw little-endian data)
# --------------------------------------------------------------------------------------------


def _decode(raw, dtype, shape):
    """Raw bytes of one tensor -> float64 array."""
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
    elif dtype == "BF16":
        # bf16 is the top half of an f32: widen by shifting into the high 16 bits.
        u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
        a = (u16 << np.uint32(16)).view(np.float32).astype(np.float64)
    elif dtype == "F64":
        a = np.frombuffer(raw, dtype="<f8").astype(np.float64)
    else:
        raise ValueError("unsupported safetensors dtype %s" % dtype)
    return a.reshape(shape)


def read_safetensors(path):
    """{name: float64 array} for every tensor in one file."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = _decode(data[base + b:base + e], info["dtype"], tuple(info["shape"]))
    return out


def read_weights(model_dir):
    """All tensors of a checkpoint directory, single file or sharded with an index."""
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)
    if not os.path.exists(index):
        raise FileNotFoundError("no model.safetensors or model.safetensors.index.json in "
                                + model_dir)
    with open(index, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    weights = {}
    for fname in sorted(set(weight_map.values())):
        for name, arr in read_safetensors(os.path.join(model_dir, fname)).items():
            if weight_map.get(name) != fname:
                raise ValueError("%s found in %s but the index says %s"
                                 % (name, fname, weight_map.get(name)))
            weights[name] = arr
    missing = set(weight_map) - set(weights)
    if missing:
        raise ValueError("tensors listed in the index but absent: %s" % sorted(missing)[:5])
    return weights


# --------------------------------------------------------------------------------------------
# Model description
# --------------------------------------------------------------------------------------------


class Model:
    """Parsed dimensions + float64 weights.

    family: 'mamba1' (mamba, falcon_mamba) or 'mamba2'.  w: {hf name: array}.
    """

    def __init__(self, config, weights):
        self.config = config
        self.model_type = config["model_type"]
        if self.model_type in ("mamba", "falcon_mamba"):
            self.family = "mamba1"
        elif self.model_type == "mamba2":
            self.family = "mamba2"
        else:
            raise ValueError("unsupported model_type %r" % self.model_type)
        c = config
        self.H = int(c["hidden_size"])
        self.n_layers = int(c["num_hidden_layers"])
        self.vocab = int(c["vocab_size"])
        self.K = int(c.get("conv_kernel", 4))
        self.eps = float(c.get("layer_norm_epsilon", 1e-5))
        self.use_conv_bias = bool(c.get("use_conv_bias", True))
        if self.family == "mamba1":
            # HF MambaConfig defaults (hf-hybrid.md C.1)
            self.N = int(c.get("state_size", 16))
            self.I = int(c.get("intermediate_size") or int(c.get("expand", 2) * self.H))
            r = c.get("time_step_rank", "auto")
            self.R = math.ceil(self.H / 16) if r == "auto" else int(r)
            self.use_bias = bool(c.get("use_bias", False))  # MambaConfig default
            self.tie = bool(c.get("tie_word_embeddings", True))
            # FalconMamba: dt, B, C are RMS-normalised (no weight) with this eps.
            self.mixer_rms_eps = (float(c.get("mixer_rms_eps", 1e-6))
                                  if self.model_type == "falcon_mamba" else None)
        else:
            # HF Mamba2Config defaults (hf-hybrid.md C.2)
            self.N = int(c.get("state_size", 128))
            self.nh = int(c.get("num_heads", 128))
            self.P = int(c.get("head_dim", 64))
            self.G = int(c.get("n_groups", 8))
            self.I = self.nh * self.P
            if "expand" in c and int(c["expand"] * self.H) != self.I:
                raise ValueError("mamba2: expand*hidden_size %d != num_heads*head_dim %d"
                                 % (int(c["expand"] * self.H), self.I))
            if self.nh % self.G:
                raise ValueError("mamba2: num_heads %d not a multiple of n_groups %d"
                                 % (self.nh, self.G))
            self.use_bias = bool(c.get("use_bias", False))
            self.tie = bool(c.get("tie_word_embeddings", False))
            lim = c.get("time_step_limit", [0.0, float("inf")])
            self.dt_limit = (float(lim[0]), float(lim[1]))
        self.w = dict(weights)
        # Hub files sometimes say backbone.embedding.weight (HF's load hook renames it).
        if "backbone.embeddings.weight" not in self.w and "backbone.embedding.weight" in self.w:
            self.w["backbone.embeddings.weight"] = self.w.pop("backbone.embedding.weight")
        self._check_shapes()

    def get(self, name, shape=None):
        if name not in self.w:
            raise KeyError("missing tensor " + name)
        a = self.w[name]
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise ValueError("%s has shape %s, expected %s" % (name, a.shape, tuple(shape)))
        return a

    def bias(self, name, shape):
        """A projection bias, present exactly when use_bias."""
        return self.get(name, shape) if self.use_bias else None

    def _expected_names(self):
        names = {"backbone.embeddings.weight", "backbone.norm_f.weight"}
        if not self.tie:
            names.add("lm_head.weight")
        per_layer = ["norm.weight", "mixer.in_proj.weight", "mixer.conv1d.weight", "mixer.A_log",
                     "mixer.D", "mixer.out_proj.weight"]
        if self.family == "mamba1":
            per_layer += ["mixer.x_proj.weight", "mixer.dt_proj.weight", "mixer.dt_proj.bias"]
        else:
            per_layer += ["mixer.dt_bias", "mixer.norm.weight"]
        if self.use_bias:
            per_layer += ["mixer.in_proj.bias", "mixer.out_proj.bias"]
        if self.use_conv_bias:
            per_layer += ["mixer.conv1d.bias"]
        for i in range(self.n_layers):
            names.update("backbone.layers.%d.%s" % (i, n) for n in per_layer)
        return names

    def _check_shapes(self):
        expected = self._expected_names()
        missing = expected - set(self.w)
        # A tied checkpoint may still carry lm_head.weight; HF ignores it, so do we.
        unexpected = set(self.w) - expected - {"lm_head.weight"}
        if missing or unexpected:
            raise ValueError("checkpoint does not match config: missing %s, unexpected %s"
                             % (sorted(missing)[:5], sorted(unexpected)[:5]))
        H, V = self.H, self.vocab
        self.get("backbone.embeddings.weight", (V, H))
        self.get("backbone.norm_f.weight", (H,))
        if not self.tie:
            self.get("lm_head.weight", (V, H))
        for i in range(self.n_layers):
            self.get("backbone.layers.%d.norm.weight" % i, (H,))


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)  # Python's json accepts the Infinity HF writes in time_step_limit
    return Model(config, read_weights(model_dir))


# --------------------------------------------------------------------------------------------
# Building blocks (float64)
# --------------------------------------------------------------------------------------------


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    # log(1 + e^x) without overflow
    return np.logaddexp(0.0, x)


def rmsnorm(x, weight, eps):
    """x: (..., D) normalised over the last dim; weight (D,) or None."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def linear(x, weight, bias=None):
    """x: (T, in), weight: (out, in) -> (T, out)."""
    y = x @ weight.T
    return y if bias is None else y + bias


def causal_conv1d(x, weight, bias):
    """Depthwise causal conv with zero history.

    x: (T, C); weight: (C, 1, K); bias (C,) or None.  PyTorch conv1d with padding K-1, first T
    outputs kept:  out[t, c] = sum_k weight[c, 0, k] * x[t - (K-1) + k, c]  (x[<0] = 0),
    i.e. tap K-1 multiplies the current input.
    """
    T, C = x.shape
    K = weight.shape[2]
    out = np.zeros((T, C))
    for t in range(T):
        for k in range(K):
            s = t - (K - 1) + k
            if s >= 0:
                out[t] += weight[:, 0, k] * x[s]
    if bias is not None:
        out += bias
    return out


# --------------------------------------------------------------------------------------------
# Mamba-1 (and FalconMamba) mixer
# --------------------------------------------------------------------------------------------


def mamba1_scan(x, delta, A, B, C, D):
    """Selective scan, one step at a time.

    x, delta: (T, I); A: (I, N) (negative); B, C: (T, N); D: (I,) -> y: (T, I)
      h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * x_t      h: (I, N), h_{-1} = 0
      y_t = h_t . C_t + D * x_t
    """
    T, I = x.shape
    h = np.zeros(A.shape)
    y = np.zeros((T, I))
    for t in range(T):
        dA = np.exp(delta[t][:, None] * A)                         # (I, N)
        dBx = delta[t][:, None] * B[t][None, :] * x[t][:, None]    # (I, N)
        h = dA * h + dBx
        y[t] = h @ C[t] + D * x[t]
    return y


def mamba1_mixer(m, i, u):
    """u: (T, H) normalised input of layer i -> (T, H)."""
    p = "backbone.layers.%d.mixer." % i
    H, I, N, R, K = m.H, m.I, m.N, m.R, m.K
    xz = linear(u, m.get(p + "in_proj.weight", (2 * I, H)),
                m.bias(p + "in_proj.bias", (2 * I,)))                            # (T, 2I)
    x, z = xz[:, :I], xz[:, I:]                                              # x first, gate z
    conv_b = m.get(p + "conv1d.bias", (I,)) if m.use_conv_bias else None
    x = silu(causal_conv1d(x, m.get(p + "conv1d.weight", (I, 1, K)), conv_b))  # (T, I)
    dbc = linear(x, m.get(p + "x_proj.weight", (R + 2 * N, I)))              # (T, R+2N)
    dt, B, C = dbc[:, :R], dbc[:, R:R + N], dbc[:, R + N:]
    if m.mixer_rms_eps is not None:  # FalconMamba
        dt = rmsnorm(dt, None, m.mixer_rms_eps)
        B = rmsnorm(B, None, m.mixer_rms_eps)
        C = rmsnorm(C, None, m.mixer_rms_eps)
    delta = softplus(linear(dt, m.get(p + "dt_proj.weight", (I, R)),
                            m.get(p + "dt_proj.bias", (I,))))                  # (T, I)
    A = -np.exp(m.get(p + "A_log", (I, N)))                                  # (I, N)
    y = mamba1_scan(x, delta, A, B, C, m.get(p + "D", (I,)))                 # (T, I)
    y = y * silu(z)
    return linear(y, m.get(p + "out_proj.weight", (H, I)),
                  m.bias(p + "out_proj.bias", (H,)))


# --------------------------------------------------------------------------------------------
# Mamba-2 mixer
# --------------------------------------------------------------------------------------------


def mamba2_scan(x, delta, A, B, C, D, heads_per_group):
    """SSD recurrence, one step and one head at a time.

    x: (T, nh, P); delta: (T, nh); A: (nh,) (negative); B, C: (T, G, N); D: (nh,)
      S_t = exp(delta_t A_h) S_{t-1} + delta_t x_t (outer) B_t     S: (P, N), S_{-1} = 0
      y_t = S_t C_t + D_h x_t
    head h reads group h // heads_per_group.  Returns y: (T, nh, P).
    """
    T, nh, P = x.shape
    N = B.shape[2]
    y = np.zeros((T, nh, P))
    for h in range(nh):
        g = h // heads_per_group
        S = np.zeros((P, N))
        for t in range(T):
            S = math.exp(delta[t, h] * A[h]) * S + delta[t, h] * np.outer(x[t, h], B[t, g])
            y[t, h] = S @ C[t, g] + D[h] * x[t, h]
    return y


def gated_rmsnorm(y, z, weight, eps, group_size):
    """t = y * silu(z), RMS-normalised over contiguous groups of `group_size` channels, * weight.

    group_size = I / n_groups is mamba_ssm's RMSNormGated (norm_before_gate=False);
    group_size = I is Hugging Face's MambaRMSNormGated (torch path).
    """
    T, I = y.shape
    t = y * silu(z)
    g = t.reshape(T, I // group_size, group_size)
    g = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps)
    return g.reshape(T, I) * weight


def mamba2_mixer(m, i, u, norm_groups):
    """u: (T, H) normalised input of layer i -> (T, H)."""
    p = "backbone.layers.%d.mixer." % i
    H, I, N, G, nh, P, K = m.H, m.I, m.N, m.G, m.nh, m.P, m.K
    conv_dim = I + 2 * G * N
    w_in = m.get(p + "in_proj.weight")
    width = w_in.shape[0]
    # in_proj rows: [d_mlp, d_mlp, z (I), xBC (conv_dim), dt (nh)]; HF checkpoints have d_mlp = 0
    # and Mamba2 discards the d_mlp slices anyway.
    extra = width - (I + conv_dim + nh)
    if extra < 0 or extra % 2:
        raise ValueError("%sin_proj has %d rows; 2I + 2GN + nh = %d leaves no even d_mlp"
                         % (p, width, I + conv_dim + nh))
    d_mlp = extra // 2
    if w_in.shape[1] != H:
        raise ValueError("%sin_proj.weight has %d columns, expected %d" % (p, w_in.shape[1], H))
    zxbcdt = linear(u, w_in, m.bias(p + "in_proj.bias", (width,)))
    o = 2 * d_mlp
    z = zxbcdt[:, o:o + I]                                       # (T, I)
    xBC = zxbcdt[:, o + I:o + I + conv_dim]                      # (T, I + 2GN)
    dt = zxbcdt[:, o + I + conv_dim:]                            # (T, nh)
    conv_b = m.get(p + "conv1d.bias", (conv_dim,)) if m.use_conv_bias else None
    xBC = silu(causal_conv1d(xBC, m.get(p + "conv1d.weight", (conv_dim, 1, K)), conv_b))
    T = u.shape[0]
    x = xBC[:, :I].reshape(T, nh, P)                             # (T, nh, P)
    B = xBC[:, I:I + G * N].reshape(T, G, N)                     # (T, G, N)
    C = xBC[:, I + G * N:].reshape(T, G, N)                      # (T, G, N)
    delta = softplus(dt + m.get(p + "dt_bias", (nh,)))           # (T, nh)
    delta = np.clip(delta, m.dt_limit[0], m.dt_limit[1])
    A = -np.exp(m.get(p + "A_log", (nh,)))                       # (nh,)
    y = mamba2_scan(x, delta, A, B, C, m.get(p + "D", (nh,)), nh // G).reshape(T, I)
    if norm_groups == "grouped":
        group_size = I // G
    elif norm_groups == "full":
        group_size = I
    else:
        raise ValueError("norm_groups must be 'grouped' or 'full', got %r" % norm_groups)
    y = gated_rmsnorm(y, z, m.get(p + "norm.weight", (I,)), m.eps, group_size)
    return linear(y, m.get(p + "out_proj.weight", (H, I)),
                  m.bias(p + "out_proj.bias", (H,)))


# --------------------------------------------------------------------------------------------
# Whole model
# --------------------------------------------------------------------------------------------


def backbone(m, ids, norm_groups="grouped"):
    """ids: sequence of T token ids -> final hidden states after norm_f, (T, H)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("ids must be a non-empty 1-D sequence")
    if ids.min() < 0 or ids.max() >= m.vocab:
        raise ValueError("token id out of range [0, %d)" % m.vocab)
    h = m.get("backbone.embeddings.weight")[ids]                 # (T, H)
    for i in range(m.n_layers):
        u = rmsnorm(h, m.get("backbone.layers.%d.norm.weight" % i), m.eps)
        if m.family == "mamba1":
            h = h + mamba1_mixer(m, i, u)
        else:
            h = h + mamba2_mixer(m, i, u, norm_groups)
    return rmsnorm(h, m.get("backbone.norm_f.weight"), m.eps)


def head_weight(m):
    """(vocab, H): lm_head, or the embeddings when tied (HF ties even if lm_head is stored)."""
    return m.get("backbone.embeddings.weight") if m.tie else m.get("lm_head.weight")


def forward(m, ids, norm_groups="grouped"):
    """Logits, float64 (T, vocab).  norm_groups: 'grouped' (mamba_ssm) or 'full' (HF torch)."""
    return backbone(m, ids, norm_groups) @ head_weight(m).T


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 numpy reference forward (Mamba-1/2)")
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help=".npy file for float64 logits (T, vocab)")
    ap.add_argument("--norm-groups", choices=["grouped", "full"], default="grouped",
                    help="Mamba-2 gated norm: per group (mamba_ssm, default) or full width (HF)")
    args = ap.parse_args(argv)
    ids = [int(s) for s in args.ids.split(",") if s.strip()]
    logits = forward(load_model(args.model_dir), ids, args.norm_groups)
    np.save(args.out, logits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
