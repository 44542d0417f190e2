#!/usr/bin/python3
"""Slow, float64 numpy reference forward for the hybrid families (attention + SSM + MLP/MoE).

Written from the published math and the Hugging Face modeling code as summarised in
research/hf-hybrid.md (C.3 onwards), independently of the engine: every recurrence is a plain
loop over time (via mamba_ref's scans), attention is the dense causal softmax over all previous
positions, MoE routes each token on its own.

Families:  hybridlm (our block-pattern format, docs/model-format.md), llamba (discrete Mamba-2,
           research/ssm-math-serving-training.md A.4); the mamba_ssm families
           (mamba, falcon_mamba, mamba2) are delegated to mamba_ref.

Attention: q, k, v = u Wq^T, u Wk^T, u Wv^T split into heads; RoPE (rotate-half: dims j and
           j + r/2 of the first r dims of a head form the pair rotated by pos * theta^(-2j/r));
           scores = q k^T * scale with future positions masked; head h reads KV head
           h // (n_heads / n_kv_heads); out = softmax(scores) v, then Wo.
MLP:       down(act(gate u) * up u)  (gated)  or  down(act(up u))

API:       load_model(dir) -> model;  forward(model, ids, norm_groups='grouped') -> (T, vocab)
"""

import json
import math
import os
import sys

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mamba_ref  # noqa: E402
from mamba_ref import causal_conv1d, gated_rmsnorm, linear, rmsnorm, silu, softplus  # noqa: E402


class Weights:
    def __init__(self, tensors):
        self.t = dict(tensors)
        self.used = set()

    def __call__(self, name, shape=None):
        if name not in self.t:
            raise KeyError("missing tensor " + name)
        a = self.t[name]
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise ValueError("%s has shape %s, expected %s" % (name, a.shape, tuple(shape)))
        self.used.add(name)
        return a

    def opt(self, name, shape, present):
        return self(name, shape) if present else None


# --------------------------------------------------------------------------------------------
# Mixers
# --------------------------------------------------------------------------------------------


def mamba1(w, p, u, H, I, N, R, K, proj_bias, conv_bias, dt_bc_norm_eps=None, dt_bc_weights=False):
    """Mamba-1 (Gu & Dao 2023, Alg. 2) on u: (T, H); tensors under prefix p."""
    xz = linear(u, w(p + "in_proj.weight", (2 * I, H)), w.opt(p + "in_proj.bias", (2 * I,), proj_bias))
    x, z = xz[:, :I], xz[:, I:]
    x = silu(causal_conv1d(x, w(p + "conv1d.weight", (I, 1, K)), w.opt(p + "conv1d.bias", (I,), conv_bias)))
    dbc = linear(x, w(p + "x_proj.weight", (R + 2 * N, I)))
    dt, B, C = dbc[:, :R], dbc[:, R:R + N], dbc[:, R + N:]
    if dt_bc_norm_eps is not None:  # Jamba: RMSNorms with weights on dt, B, C
        dt = rmsnorm(dt, w(p + "dt_layernorm.weight", (R,)) if dt_bc_weights else None, dt_bc_norm_eps)
        B = rmsnorm(B, w(p + "b_layernorm.weight", (N,)) if dt_bc_weights else None, dt_bc_norm_eps)
        C = rmsnorm(C, w(p + "c_layernorm.weight", (N,)) if dt_bc_weights else None, dt_bc_norm_eps)
    delta = softplus(linear(dt, w(p + "dt_proj.weight", (I, R)), w(p + "dt_proj.bias", (I,))))
    A = -np.exp(w(p + "A_log", (I, N)))
    y = mamba_ref.mamba1_scan(x, delta, A, B, C, w(p + "D", (I,))) * silu(z)
    return linear(y, w(p + "out_proj.weight", (H, I)), w.opt(p + "out_proj.bias", (H,), proj_bias))


def mamba2(w, p, u, H, I, nh, G, N, K, proj_bias, conv_bias, eps, group_size, dt_limit=(0.0, math.inf),
           out_bias=None):
    """Mamba-2 (Dao & Gu 2024), sequential SSD recurrence, gate-then-norm."""
    out_bias = proj_bias if out_bias is None else out_bias
    T = u.shape[0]
    P = I // nh
    conv_dim = I + 2 * G * N
    W = I + conv_dim + nh
    zxbcdt = linear(u, w(p + "in_proj.weight", (W, H)), w.opt(p + "in_proj.bias", (W,), proj_bias))
    z, xBC, dt = zxbcdt[:, :I], zxbcdt[:, I:I + conv_dim], zxbcdt[:, I + conv_dim:]
    xBC = silu(causal_conv1d(xBC, w(p + "conv1d.weight", (conv_dim, 1, K)),
                             w.opt(p + "conv1d.bias", (conv_dim,), conv_bias)))
    x = xBC[:, :I].reshape(T, nh, P)
    B = xBC[:, I:I + G * N].reshape(T, G, N)
    C = xBC[:, I + G * N:].reshape(T, G, N)
    delta = np.clip(softplus(dt + w(p + "dt_bias", (nh,))), dt_limit[0], dt_limit[1])
    A = -np.exp(w(p + "A_log", (nh,)))
    y = mamba_ref.mamba2_scan(x, delta, A, B, C, w(p + "D", (nh,)), nh // G).reshape(T, I)
    y = gated_rmsnorm(y, z, w(p + "norm.weight", (I,)), eps, group_size)
    return linear(y, w(p + "out_proj.weight", (H, I)), w.opt(p + "out_proj.bias", (H,), out_bias))


def discrete_mamba2(w, p, u, H, I, nv, G, N, K, bias, conv_bias, conv_act="identity"):
    """Discrete Mamba-2 (MOHAWK, Bick et al. 2024; Llamba), written from the published math as a
    plain loop over time: in_proj -> [x (I), B (G*N), C (G*N), z (I), A~ (nv)]; causal conv over
    xBC with no activation ("identity"); per token and value head a = exp(-softplus(A~)),
    S_t = a_t S_{t-1} + x_t B_t^T (no dt), y_t = S_t C_t + D_h x_t;
    out = out_proj(y * silu(z + z_bias)).
    Value head h (head_dim I / nv) reads B/C group h // (nv / G). z_bias exists only without bias."""
    T = u.shape[0]
    P = I // nv
    conv_dim = I + 2 * G * N
    W = 2 * I + 2 * G * N + nv
    proj = linear(u, w(p + "in_proj.weight", (W, H)), w.opt(p + "in_proj.bias", (W,), bias))
    xBC, z, a_raw = proj[:, :conv_dim], proj[:, conv_dim:conv_dim + I], proj[:, conv_dim + I:]
    xBC = causal_conv1d(xBC, w(p + "conv1d.weight", (conv_dim, 1, K)),
                        w.opt(p + "conv1d.bias", (conv_dim,), conv_bias))
    if conv_act in ("silu", "swish"):
        xBC = silu(xBC)
    x = xBC[:, :I].reshape(T, nv, P)
    B = xBC[:, I:I + G * N].reshape(T, G, N)
    C = xBC[:, I + G * N:].reshape(T, G, N)
    decay = np.exp(-softplus(a_raw))                              # (T, nv), in (0, 1)
    D = w(p + "D", (nv,))
    rep = nv // G
    S = np.zeros((nv, P, N))
    y = np.zeros((T, nv, P))
    for t in range(T):
        for h in range(nv):
            g = h // rep
            S[h] = decay[t, h] * S[h] + np.outer(x[t, h], B[t, g])
            y[t, h] = S[h] @ C[t, g] + D[h] * x[t, h]
    zb = z + (w(p + "z_bias", (I,)) if not bias else 0.0)
    g = y.reshape(T, I) * silu(zb)
    return linear(g, w(p + "out_proj.weight", (H, I)), w.opt(p + "out_proj.bias", (H,), bias))


def rope(x, rot, theta):
    """x: (T, heads, hd); rotate-half RoPE on the first `rot` dims at positions 0..T-1."""
    if rot == 0:
        return x
    T = x.shape[0]
    half = rot // 2
    inv = theta ** (-2.0 * np.arange(half) / rot)                 # (half,)
    ang = np.arange(T)[:, None] * inv[None, :]                    # (T, half)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    a, b = x[:, :, :half], x[:, :, half:rot]
    out[:, :, :half] = a * c - b * s
    out[:, :, half:rot] = b * c + a * s
    return out


def attention(w, p, u, H, heads, kv_heads, hd, rot, theta, scale=None, bias=False, qk_norm_eps=None,
              o_name="o_proj", qk_names=("q_norm", "k_norm"), out_dim=None):
    """Causal GQA softmax attention over the whole sequence (positions 0..T-1)."""
    T = u.shape[0]
    q = linear(u, w(p + "q_proj.weight", (heads * hd, H)), w.opt(p + "q_proj.bias", (heads * hd,), bias))
    k = linear(u, w(p + "k_proj.weight", (kv_heads * hd, H)), w.opt(p + "k_proj.bias", (kv_heads * hd,), bias))
    v = linear(u, w(p + "v_proj.weight", (kv_heads * hd, H)), w.opt(p + "v_proj.bias", (kv_heads * hd,), bias))
    q, k, v = q.reshape(T, heads, hd), k.reshape(T, kv_heads, hd), v.reshape(T, kv_heads, hd)
    if qk_norm_eps is not None:
        q = rmsnorm(q, w(p + qk_names[0] + ".weight", (hd,)), qk_norm_eps)
        k = rmsnorm(k, w(p + qk_names[1] + ".weight", (hd,)), qk_norm_eps)
    q, k = rope(q, rot, theta), rope(k, rot, theta)
    scale = hd ** -0.5 if scale is None else scale
    rep = heads // kv_heads
    y = np.zeros((T, heads, hd))
    for h in range(heads):
        s = (q[:, h, :] @ k[:, h // rep, :].T) * scale             # (T, T)
        s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        y[:, h, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h // rep, :]
    return linear(y.reshape(T, heads * hd), w(p + o_name + ".weight", (out_dim or H, heads * hd)))


def gdn_split(qkvz, ba, nk, nv, dk, dv):
    """Qwen3-Next's interleaved projections (modeling_qwen3_next fix_query_key_value_ordering):
    qkvz rows per key head j are [q_j (dk) | k_j (dk) | v (r dv) | z (r dv)] with r = nv / nk, the v
    and z blocks holding value heads j r .. j r + r - 1; ba rows per key head are [b (r) | a (r)]."""
    T, r = qkvz.shape[0], nv // nk
    g = qkvz.reshape(T, nk, 2 * dk + 2 * r * dv)
    q, k = g[:, :, :dk], g[:, :, dk:2 * dk]
    v = g[:, :, 2 * dk:2 * dk + r * dv].reshape(T, nv, dv)
    z = g[:, :, 2 * dk + r * dv:].reshape(T, nv, dv)
    bag = ba.reshape(T, nk, 2 * r)
    return q, k, v, z, bag[:, :, :r].reshape(T, nv), bag[:, :, r:].reshape(T, nv)


def _gdn_qk(q, k):
    """q and k l2-normalised per head, x / sqrt(sum x^2 + 1e-6), and q scaled by dk^-1/2."""
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) / math.sqrt(q.shape[-1])
    return q, k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)


def gated_delta_rule(q, k, v, g, beta, S=None):
    """The gated delta rule as its recurrence (Yang et al. 2024; Qwen3-Next's
    torch_recurrent_gated_delta_rule), one step at a time. q, k: (T, nv, dk) already per value head,
    v: (T, nv, dv), g (log-decay), beta: (T, nv). q and k are l2-normalised (x / sqrt(sum x^2 +
    1e-6)), q scaled by dk^-1/2; per head S <- exp(g) S; delta = beta (v - S^T k); S <- S + k delta^T;
    o = S^T q. Returns o: (T, nv, dv) and the final S: (nv, dk, dv)."""
    T, nv, dk = q.shape
    dv = v.shape[2]
    q, k = _gdn_qk(q, k)
    S = np.zeros((nv, dk, dv)) if S is None else S.copy()
    o = np.zeros((T, nv, dv))
    for t in range(T):
        for h in range(nv):
            S[h] *= math.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - S[h].T @ k[t, h])
            S[h] += np.outer(k[t, h], delta)
            o[t, h] = S[h].T @ q[t, h]
    return o, S


def gated_delta_rule_chunked(q, k, v, g, beta, chunk, S=None):
    """The same rule in the chunked WY / UT-transform form (Yang et al. 2024, sec. 3; FLA's
    chunk_gated_delta_rule): within a chunk with cumulative log-decay c, the new values U solve
    (I + A) U = beta (v - exp(c) S0^T k), A_ij = beta_i exp(c_i - c_j) k_i.k_j (j < i); then
    o = exp(c) S0^T q + (exp(c_i - c_j) q_i.k_j)_{j<=i} U and S = exp(c_last) S0 + sum_j
    exp(c_last - c_j) k_j u_j^T. Checked against the recurrence in test_reference.py."""
    T, nv, dk = q.shape
    dv = v.shape[2]
    q, k = _gdn_qk(q, k)
    S = np.zeros((nv, dk, dv)) if S is None else S.copy()
    o = np.zeros((T, nv, dv))
    for h in range(nv):
        for c0 in range(0, T, chunk):
            sl = slice(c0, min(T, c0 + chunk))
            Q = sl.stop - c0
            qc, kc, vc, bc = q[sl, h], k[sl, h], v[sl, h], beta[sl, h]
            c = np.cumsum(g[sl, h])
            decay = np.exp(np.tril(c[:, None] - c[None, :]))
            A = np.tril(bc[:, None] * decay * (kc @ kc.T), -1)
            R = bc[:, None] * (vc - np.exp(c)[:, None] * (kc @ S[h]))
            U = np.linalg.solve(np.eye(Q) + A, R)
            o[sl, h] = np.exp(c)[:, None] * (qc @ S[h]) + (np.tril(decay) * (qc @ kc.T)) @ U
            S[h] = math.exp(c[-1]) * S[h] + (kc * np.exp(c[-1] - c)[:, None]).T @ U
    return o, S


def gated_deltanet(w, p, u, H, nk, nv, dk, dv, K, eps, interleaved=True):
    """Qwen3NextGatedDeltaNet (hf-hybrid.md C.10) on u: (T, H): interleaved in_proj_qkvz / in_proj_ba
    (Qwen3-Next) or Qwen3_5GatedDeltaNet's four projections in order (in_proj_qkv = [q | k | v],
    in_proj_z, in_proj_b, in_proj_a), causal conv (no bias) + SiLU over [q, k, v], beta =
    sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), q and k repeated to the nv value heads
    (repeat_interleave: value head h reads key head h // (nv / nk)), the gated delta rule, then per
    value head norm.weight * rmsnorm(o) * silu(z) (norm before gate) and out_proj."""
    T, Kd, Vd, r = u.shape[0], nk * dk, nv * dv, nv // nk
    if interleaved:
        qkvz = linear(u, w(p + "in_proj_qkvz.weight", (2 * Kd + 2 * Vd, H)))
        ba = linear(u, w(p + "in_proj_ba.weight", (2 * nv, H)))
        q, k, v, z, b, a = gdn_split(qkvz, ba, nk, nv, dk, dv)
        mixed = np.concatenate([q.reshape(T, Kd), k.reshape(T, Kd), v.reshape(T, Vd)], axis=1)
    else:
        mixed = linear(u, w(p + "in_proj_qkv.weight", (2 * Kd + Vd, H)))
        z = linear(u, w(p + "in_proj_z.weight", (Vd, H))).reshape(T, nv, dv)
        b = linear(u, w(p + "in_proj_b.weight", (nv, H)))
        a = linear(u, w(p + "in_proj_a.weight", (nv, H)))
    mixed = silu(causal_conv1d(mixed, w(p + "conv1d.weight", (2 * Kd + Vd, 1, K)), None))
    q, k, v = mixed[:, :Kd].reshape(T, nk, dk), mixed[:, Kd:2 * Kd].reshape(T, nk, dk), mixed[:, 2 * Kd:]
    beta = 1.0 / (1.0 + np.exp(-b))
    g = -np.exp(w(p + "A_log", (nv,))) * softplus(a + w(p + "dt_bias", (nv,)))
    q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)   # value head h reads key head h // r
    o, _ = gated_delta_rule(q, k, v.reshape(T, nv, dv), g, beta)
    o = rmsnorm(o, w(p + "norm.weight", (dv,)), eps) * silu(z)
    return linear(o.reshape(T, Vd), w(p + "out_proj.weight", (H, Vd)))


ACTS = {
    "silu": silu,
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "relu2": lambda x: np.maximum(x, 0.0) ** 2,
}


def mlp(w, p, u, H, F, act, gated=True, names=("gate_proj", "up_proj", "down_proj")):
    gate, up, down = names
    a = ACTS[act]
    if gated:
        g = a(linear(u, w(p + gate + ".weight", (F, H)))) * linear(u, w(p + up + ".weight", (F, H)))
    else:
        g = a(linear(u, w(p + up + ".weight", (F, H))))
    return linear(g, w(p + down + ".weight", (H, F)))


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------


def hybridlm_forward(c, w, ids, norm_groups):
    H, V = int(c["hidden_size"]), int(c["vocab_size"])
    eps = float(c.get("rms_norm_eps", 1e-5))
    ssm, att, mc = c.get("ssm", {}), c.get("attention", {}), c.get("mlp", {})
    I = int(ssm.get("expand", 2) * H)
    N, K = int(ssm.get("d_state", 16)), int(ssm.get("d_conv", 4))
    R = ssm.get("dt_rank", "auto")
    R = math.ceil(H / 16) if R == "auto" else int(R)
    P, G = int(ssm.get("head_dim", 64)), int(ssm.get("n_groups", 1))
    conv_bias, proj_bias = bool(ssm.get("conv_bias", True)), bool(ssm.get("proj_bias", False))
    heads = int(att.get("num_heads", 8))
    kv_heads = int(att.get("num_kv_heads", heads))
    hd = int(att.get("head_dim", H // heads))
    rot = int(float(att.get("partial_rotary_factor", 1.0)) * hd)
    theta = float(att.get("rope_theta", 10000.0))
    F = int(mc.get("intermediate_size", 0))
    h = w("model.embed_tokens.weight", (V, H))[ids]
    for i, kind in enumerate(c["block_pattern"]):
        p = "model.layers.%d." % i
        u = rmsnorm(h, w(p + "mixer_norm.weight", (H,)), eps)
        if kind == "m":
            h = h + mamba1(w, p + "mixer.", u, H, I, N, R, K, proj_bias, conv_bias)
        elif kind == "m2":
            gs = I // G if norm_groups == "grouped" else I
            h = h + mamba2(w, p + "mixer.", u, H, I, I // P, G, N, K, proj_bias, conv_bias, eps, gs)
        elif kind == "m2d":
            h = h + discrete_mamba2(w, p + "mixer.", u, H, I, I // P, G, N, K, proj_bias, conv_bias)
        elif kind == "gdn":
            gd = c.get("gdn", {})
            nk = int(gd.get("num_key_heads", 4))
            nv, dk = int(gd.get("num_value_heads", nk)), int(gd.get("key_head_dim", 16))
            dv = int(gd.get("value_head_dim", dk))
            h = h + gated_deltanet(w, p + "mixer.", u, H, nk, nv, dk, dv, int(gd.get("conv_kernel_dim", 4)), eps)
        elif kind == "t":
            qk_eps = eps if att.get("qk_norm", False) else None
            h = h + attention(w, p + "mixer.", u, H, heads, kv_heads, hd, rot, theta,
                              bias=bool(att.get("bias", False)), qk_norm_eps=qk_eps)
        else:
            raise ValueError("unknown block kind %r" % kind)
        if F > 0:
            u = rmsnorm(h, w(p + "ffn_norm.weight", (H,)), eps)
            h = h + mlp(w, p + "ffn.", u, H, F, mc.get("activation", "silu"), bool(mc.get("gated", True)))
    h = rmsnorm(h, w("model.norm.weight", (H,)), eps)
    tie = bool(c.get("tie_word_embeddings", True))
    return h @ (w("model.embed_tokens.weight") if tie else w("lm_head.weight", (V, H))).T


def moe(w, p, u, H, F, E, top_k, renormalize, router="router.weight"):
    """Softmax router over E experts, each token's top_k, weights p_e (renormalised if asked)."""
    logits = linear(u, w(p + router, (E, H)))
    out = np.zeros_like(u)
    for t in range(u.shape[0]):
        prob = np.exp(logits[t] - logits[t].max())
        prob /= prob.sum()
        top = np.argsort(-prob, kind="stable")[:top_k]
        wts = prob[top] / (prob[top].sum() if renormalize else 1.0)
        for e, wt in zip(top, wts):
            out[t] += wt * mlp(w, p + "experts.%d." % e, u[t:t + 1], H, F, "silu")[0]
    return out


def layer_types(c, default_attn):
    if "layers_block_type" in c:
        return [t in ("attention", "full_attention") for t in c["layers_block_type"]]
    return default_attn


def jamba_forward(c, w, ids, norm_groups):
    """JambaForCausalLM (hf-hybrid.md C.3): Mamba-1 with dt/B/C norms, no-PE attention, MoE."""
    H, V, L = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    eps = float(c.get("rms_norm_eps", 1e-6))
    I = int(c.get("mamba_expand", 2) * H)
    N, K = int(c.get("mamba_d_state", 16)), int(c.get("mamba_d_conv", 4))
    R = c.get("mamba_dt_rank", "auto")
    R = math.ceil(H / 16) if R == "auto" else int(R)
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    F, E, k = int(c.get("intermediate_size", 14336)), int(c.get("num_experts", 16)), int(c.get("num_experts_per_tok", 2))
    ap, ao = int(c.get("attn_layer_period", 8)), int(c.get("attn_layer_offset", 4))
    ep, eo = int(c.get("expert_layer_period", 2)), int(c.get("expert_layer_offset", 1))
    attn = layer_types(c, [i % ap == ao for i in range(L)])
    h = w("model.embed_tokens.weight", (V, H))[ids]
    for i in range(L):
        p = "model.layers.%d." % i
        u = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), eps)
        if attn[i]:
            h = h + attention(w, p + "self_attn.", u, H, heads, kv, H // heads, 0, 10000.0)
        else:
            h = h + mamba1(w, p + "mamba.", u, H, I, N, R, K, bool(c.get("mamba_proj_bias", False)),
                           bool(c.get("mamba_conv_bias", True)), dt_bc_norm_eps=eps, dt_bc_weights=True)
        u = rmsnorm(h, w(p + "pre_ff_layernorm.weight", (H,)), eps)
        if E > 1 and i % ep == eo:
            h = h + moe(w, p + "feed_forward.", u, H, F, E, k, renormalize=False)
        else:
            h = h + mlp(w, p + "feed_forward.", u, H, F, "silu")
    h = rmsnorm(h, w("model.final_layernorm.weight", (H,)), eps)
    return h @ (w("model.embed_tokens.weight") if c.get("tie_word_embeddings", False) else w("lm_head.weight", (V, H))).T


def bamba_forward(c, w, ids, norm_groups):
    """BambaForCausalLM (hf-hybrid.md C.4): Mamba-2 + attention with RoPE on half of each head."""
    H, V, L = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    eps = float(c.get("rms_norm_eps", 1e-5))
    I = int(c.get("mamba_expand", 2) * H)
    nh = int(c.get("mamba_n_heads", 128))
    G, N, K = int(c.get("mamba_n_groups", 1)), int(c.get("mamba_d_state", 256)), int(c.get("mamba_d_conv", 4))
    lim = c.get("time_step_limit", [0.0, math.inf])
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    hd = int(c.get("head_dim") or H // heads)
    theta = float((c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0)))
    F = int(c.get("intermediate_size", 14336))
    idx = set(c.get("attn_layer_indices") or [])
    attn = layer_types(c, [i in idx for i in range(L)])
    h = w("model.embed_tokens.weight", (V, H))[ids]
    for i in range(L):
        p = "model.layers.%d." % i
        u = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), eps)
        if attn[i]:
            h = h + attention(w, p + "self_attn.", u, H, heads, kv, hd, int(0.5 * hd), theta)
        else:
            gs = I // G if norm_groups == "grouped" else I
            h = h + mamba2(w, p + "mamba.", u, H, I, nh, G, N, K, bool(c.get("mamba_proj_bias", False)),
                           bool(c.get("mamba_conv_bias", True)), eps, gs, (float(lim[0]), float(lim[1])))
        u = rmsnorm(h, w(p + "pre_ff_layernorm.weight", (H,)), eps)
        h = h + mlp(w, p + "feed_forward.", u, H, F, "silu")
    h = rmsnorm(h, w("model.final_layernorm.weight", (H,)), eps)
    return h @ (w("model.embed_tokens.weight") if c.get("tie_word_embeddings", False) else w("lm_head.weight", (V, H))).T


def short_conv(w, p, u, H, L, bias):
    """LFM2 gated short conv: B, C, x = in_proj(u) split in three; out_proj(C * conv(B * x))."""
    bcx = linear(u, w(p + "in_proj.weight", (3 * H, H)), w.opt(p + "in_proj.bias", (3 * H,), bias))
    B, C, x = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
    y = causal_conv1d(B * x, w(p + "conv.weight", (H, 1, L)), w.opt(p + "conv.bias", (H,), bias))
    return linear(C * y, w(p + "out_proj.weight", (H, H)), w.opt(p + "out_proj.bias", (H,), bias))


def lfm2_moe_experts(w, p, u, H, c):
    """Lfm2MoeSparseMoeBlock (modeling_lfm2_moe.py): s = sigmoid(gate(u)); the top-k experts by
    s + expert_bias (the bias only chooses); weights the chosen s, divided by (their sum + 1e-6) when
    norm_topk_prob, times routed_scaling_factor; each expert a SwiGLU w2(silu(w1 u) * w3 u)."""
    E, k = int(c.get("num_experts", 32)), int(c.get("num_experts_per_tok", 4))
    F = int(c.get("moe_intermediate_size", 1792))
    logits = linear(u, w(p + "gate.weight", (E, H)))
    bias = w(p + "expert_bias", (E,)) if c.get("use_expert_bias", True) else np.zeros(E)
    out = np.zeros_like(u)
    for t in range(u.shape[0]):
        s = 1.0 / (1.0 + np.exp(-logits[t]))
        top = np.argsort(-(s + bias), kind="stable")[:k]
        wts = s[top]
        if c.get("norm_topk_prob", True):
            wts = wts / (wts.sum() + 1e-6)
        for e, wt in zip(top, wts * float(c.get("routed_scaling_factor", 1.0))):
            out[t] += wt * mlp(w, p + "experts.%d." % e, u[t:t + 1], H, F, "silu", names=("w1", "w3", "w2"))[0]
    return out


def lfm2_forward(c, w, ids, norm_groups):
    """Lfm2ForCausalLM (hf-hybrid.md C.9) and Lfm2MoeForCausalLM (the first num_dense_layers layers
    with an MLP of intermediate_size, the others lfm2_moe_experts)."""
    H, V, L = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    eps = float(c.get("norm_eps", 1e-5))
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    hd = int(c.get("head_dim") or H // heads)
    theta = float(c.get("theta", (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 1e6))))
    moe = c["model_type"] == "lfm2_moe"
    # Lfm2MLP's width, re-derived here from the config keys; Lfm2MoeMLP takes intermediate_size as is.
    F = int(c.get("intermediate_size", 7168 if moe else c.get("block_ff_dim", 12288)))
    if c.get("block_auto_adjust_ff_dim", True) and not moe:
        F = int(2 * F / 3)
        if c.get("block_ffn_dim_multiplier", 1.0) is not None:
            mult = int(c.get("block_multiple_of", 256))
            F = int(c.get("block_ffn_dim_multiplier", 1.0) * F)
            F = mult * ((F + mult - 1) // mult)
    if "layer_types" in c:
        attn = [t == "full_attention" for t in c["layer_types"]]
    elif "full_attn_idxs" in c:
        attn = [i in set(c["full_attn_idxs"]) for i in range(L)]
    else:
        attn = [True] * L
    h = w("model.embed_tokens.weight", (V, H))[ids]
    for i in range(L):
        p = "model.layers.%d." % i
        u = rmsnorm(h, w(p + "operator_norm.weight", (H,)), eps)
        if attn[i]:
            h = h + attention(w, p + "self_attn.", u, H, heads, kv, hd, hd, theta, qk_norm_eps=eps, o_name="out_proj",
                              qk_names=("q_layernorm", "k_layernorm"))
        else:
            h = h + short_conv(w, p + "conv.", u, H, int(c.get("conv_L_cache", 3)), bool(c.get("conv_bias", False)))
        u = rmsnorm(h, w(p + "ffn_norm.weight", (H,)), eps)
        if moe and i >= int(c.get("num_dense_layers", 2)):
            h = h + lfm2_moe_experts(w, p + "feed_forward.", u, H, c)
        else:
            h = h + mlp(w, p + "feed_forward.", u, H, F, "silu", names=("w1", "w3", "w2"))
    h = rmsnorm(h, w("model.embedding_norm.weight", (H,)), eps)
    return h @ (w("model.embed_tokens.weight") if c.get("tie_word_embeddings", True) else w("lm_head.weight", (V, H))).T


def moe_sigmoid(w, p, u, H, F, E, top_k, n_group, topk_group, norm, scale, act):
    """DeepSeek-V3 style routing (Nemotron-H): sigmoid scores, choice by score + correction bias
    within the best groups (a group ranks by its two best biased scores), weights the unbiased
    scores of the chosen, renormalised if `norm`, times `scale`."""
    logits = linear(u, w(p + "gate.weight", (E, H)))
    bias = w(p + "gate.e_score_correction_bias", (E,))
    out = np.zeros_like(u)
    per = E // n_group
    for t in range(u.shape[0]):
        s = 1.0 / (1.0 + np.exp(-logits[t]))
        key = s + bias
        if n_group > 1:
            gs = np.array([np.sort(key[g * per:(g + 1) * per])[::-1][:2].sum() for g in range(n_group)])
            keep = np.argsort(-gs, kind="stable")[:topk_group]
            key = np.array([key[e] if e // per in keep else 0.0 for e in range(E)])
        top = np.argsort(-key, kind="stable")[:top_k]
        wts = s[top] / (s[top].sum() + 1e-20) if norm else s[top]
        for e, wt in zip(top, wts * scale):
            out[t] += wt * mlp(w, p + "experts.%d." % e, u[t:t + 1], H, F, act, gated=False)[0]
    return out


def nemotron_h_forward(c, w, ids, norm_groups):
    """NemotronHForCausalLM (hf-hybrid.md C.6): one op per layer; dt >= time_step_min (HF torch)."""
    H, V = int(c["hidden_size"]), int(c["vocab_size"])
    eps = float(c.get("layer_norm_epsilon", 1e-5))
    if c.get("hybrid_override_pattern"):
        kinds = list(c["hybrid_override_pattern"])
    else:
        names = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
        kinds = [names[t] for t in c.get("layers_block_type") or c["layer_types"]]
    nh, P = int(c.get("mamba_num_heads", 128)), int(c.get("mamba_head_dim", 64))
    I, G, N = nh * P, int(c.get("n_groups", 8)), int(c.get("ssm_state_size", 128))
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    hd = int(c.get("head_dim") or c.get("attention_head_dim") or H // heads)
    h = w("backbone.embeddings.weight", (V, H))[ids]
    for i, kind in enumerate(kinds):
        p = "backbone.layers.%d." % i
        m = p + "mixer."
        u = rmsnorm(h, w(p + "norm.weight", (H,)), eps)
        if kind == "M":
            h = h + mamba2(w, m, u, H, I, nh, G, N, int(c.get("conv_kernel", 4)), bool(c.get("use_bias", False)),
                           bool(c.get("use_conv_bias", True)), eps, I // G,
                           (float(c.get("time_step_min", 0.001)), math.inf))
        elif kind == "*":
            h = h + attention(w, m, u, H, heads, kv, hd, 0, 10000.0)
        elif kind == "-":
            h = h + mlp(w, m, u, H, int(c.get("intermediate_size", 21504)), "relu2", gated=False)
        else:
            h = h + moe_sigmoid(w, m, u, H, int(c.get("moe_intermediate_size", 7688)), int(c.get("n_routed_experts", 8)),
                                int(c.get("num_experts_per_tok", 2)), int(c.get("n_group", 1)),
                                int(c.get("topk_group", 1)), bool(c.get("norm_topk_prob", True)),
                                float(c.get("routed_scaling_factor", 1.0)), "relu2")
            h = h + mlp(w, m + "shared_experts.", u, H, int(c.get("moe_shared_expert_intermediate_size", 7688)),
                        "relu2", gated=False)
    h = rmsnorm(h, w("backbone.norm_f.weight", (H,)), eps)
    return h @ (w("backbone.embeddings.weight") if c.get("tie_word_embeddings", False) else w("lm_head.weight", (V, H))).T


def fused_mlp(wi, wo, u):
    """act(c0) * c1 with (c0, c1) = the two halves of u @ wi^T (gate first); then @ wo^T."""
    c = u @ wi.T
    F = c.shape[1] // 2
    return (silu(c[:, :F]) * c[:, F:]) @ wo.T


def granitemoehybrid_forward(c, w, ids, norm_groups):
    """GraniteMoeHybridForCausalLM (hf-hybrid.md C.5)."""
    H, V, L = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    eps = float(c.get("rms_norm_eps", 1e-6))
    types = c.get("layer_types") or c.get("layers_block_type") or ["mamba"] * L
    I = int(c.get("mamba_expand", 2) * H)
    nh = int(c.get("mamba_n_heads", 128))
    G, N, K = int(c.get("mamba_n_groups", 1)), int(c.get("mamba_d_state", 256)), int(c.get("mamba_d_conv", 4))
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    hd = H // heads
    rot = hd if c.get("position_embedding_type") == "rope" else 0
    E, F, S = int(c.get("num_local_experts", 8)), int(c.get("intermediate_size", 11008)), \
        int(c.get("shared_intermediate_size", 1024))
    k = int(c.get("num_experts_per_tok", 2))
    rm = float(c.get("residual_multiplier", 1.0))
    h = w("model.embed_tokens.weight", (V, H))[ids] * float(c.get("embedding_multiplier", 1.0))
    for i in range(L):
        p = "model.layers.%d." % i
        u = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), eps)
        if types[i] in ("attention", "full_attention"):
            out = attention(w, p + "self_attn.", u, H, heads, kv, hd, rot, float(c.get("rope_theta", 10000.0)),
                            scale=float(c.get("attention_multiplier", 1.0)))
        else:
            gs = I // G if norm_groups == "grouped" else I
            out = mamba2(w, p + "mamba.", u, H, I, nh, G, N, K, bool(c.get("mamba_proj_bias", False)),
                         bool(c.get("mamba_conv_bias", True)), eps, gs)
        h = h + rm * out
        u = rmsnorm(h, w(p + "post_attention_layernorm.weight", (H,)), eps)
        f = fused_mlp(w(p + "shared_mlp.input_linear.weight", (2 * S, H)), w(p + "shared_mlp.output_linear.weight", (H, S)), u)
        if E > 0:
            m = p + "block_sparse_moe."
            logits = linear(u, w(m + "router.layer.weight", (E, H)))
            wi, wo = w(m + "input_linear.weight", (E, 2 * F, H)), w(m + "output_linear.weight", (E, H, F))
            for t in range(u.shape[0]):
                top = np.argsort(-logits[t], kind="stable")[:k]        # top-k logits, then softmax over them
                g = np.exp(logits[t][top] - logits[t][top].max())
                for e, gate in zip(top, g / g.sum()):
                    f[t] += gate * fused_mlp(wi[e], wo[e], u[t:t + 1])[0]
        h = h + rm * f
    h = rmsnorm(h, w("model.norm.weight", (H,)), eps)
    head = w("model.embed_tokens.weight") if c.get("tie_word_embeddings", False) else w("lm_head.weight", (V, H))
    return (h @ head.T) / float(c.get("logits_scaling", 1.0))


def falcon_h1_mamba(w, p, u, c, H):
    """Falcon-H1's Mamba-2 (µP): in_proj(u * ssm_in) * mup over [z | x | B | C | dt]; the output gate
    y * silu(z), with a per-group RMSNorm before or after the gate when mamba_rms_norm."""
    T = u.shape[0]
    I = int(c.get("mamba_d_ssm") or c.get("mamba_expand", 2) * H)
    nh = int(c.get("mamba_n_heads", 128))
    G, N, K = int(c.get("mamba_n_groups", 1)), int(c.get("mamba_d_state", 256)), int(c.get("mamba_d_conv", 4))
    P, eps = I // nh, float(c.get("rms_norm_eps", 1e-5))
    conv_dim = I + 2 * G * N
    W = I + conv_dim + nh
    m = [float(v) for v in c.get("ssm_multipliers", [1.0] * 5)]
    mup = np.concatenate([np.full(I, m[0]), np.full(I, m[1]), np.full(G * N, m[2]), np.full(G * N, m[3]), np.full(nh, m[4])])
    zxbcdt = linear(u * float(c.get("ssm_in_multiplier", 1.0)), w(p + "in_proj.weight", (W, H)),
                    w.opt(p + "in_proj.bias", (W,), bool(c.get("mamba_proj_bias", False)))) * mup
    z, xBC, dt = zxbcdt[:, :I], zxbcdt[:, I:I + conv_dim], zxbcdt[:, I + conv_dim:]
    xBC = silu(causal_conv1d(xBC, w(p + "conv1d.weight", (conv_dim, 1, K)),
                             w.opt(p + "conv1d.bias", (conv_dim,), bool(c.get("mamba_conv_bias", True)))))
    x, B, C = xBC[:, :I].reshape(T, nh, P), xBC[:, I:I + G * N].reshape(T, G, N), xBC[:, I + G * N:].reshape(T, G, N)
    delta = softplus(dt + w(p + "dt_bias", (nh,)))            # no clamp: the torch path's limit is (0, inf)
    y = mamba_ref.mamba2_scan(x, delta, -np.exp(w(p + "A_log", (nh,))), B, C, w(p + "D", (nh,)), nh // G).reshape(T, I)
    if c.get("mamba_rms_norm", False):
        wn = w(p + "norm.weight", (I,))
        def group_norm(v):
            g = v.reshape(T, G, I // G)
            return (g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps)).reshape(T, I) * wn
        y = group_norm(y) * silu(z) if c.get("mamba_norm_before_gate", True) else group_norm(y * silu(z))
    else:
        y = y * silu(z)
    out = linear(y, w(p + "out_proj.weight", (H, I)), w.opt(p + "out_proj.bias", (H,), bool(c.get("projectors_bias", False))))
    return out * float(c.get("ssm_out_multiplier", 1.0))


def falcon_h1_forward(c, w, ids, norm_groups):
    """FalconH1ForCausalLM (hf-hybrid.md C.7): h += mamba(x) + attention(x), then the MLP."""
    H, V, L = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    eps = float(c.get("rms_norm_eps", 1e-5))
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    hd = int(c.get("head_dim") or H // heads)
    theta = float((c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 100000.0)))
    gm, dm = [float(v) for v in c.get("mlp_multipliers", [1.0, 1.0])]
    F = int(c.get("intermediate_size", 14336))
    h = w("model.embed_tokens.weight", (V, H))[ids] * float(c.get("embedding_multiplier", 1.0))
    for i in range(L):
        p = "model.layers.%d." % i
        x = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), eps)
        m = falcon_h1_mamba(w, p + "mamba.", x, c, H)
        # key_multiplier scales k before RoPE: fold it into a scaled copy of k_proj for this call.
        a_w = Weights({n: (t * float(c.get("key_multiplier", 1.0)) if n == p + "self_attn.k_proj.weight" else t)
                       for n, t in w.t.items() if n.startswith(p + "self_attn.")})
        a = attention(a_w, p + "self_attn.", x * float(c.get("attention_in_multiplier", 1.0)), H, heads, kv, hd, hd, theta)
        w.used.update(a_w.used)
        h = h + m + a * float(c.get("attention_out_multiplier", 1.0))
        u = rmsnorm(h, w(p + "pre_ff_layernorm.weight", (H,)), eps)
        f = p + "feed_forward."
        g = linear(u, w(f + "up_proj.weight", (F, H))) * silu(linear(u, w(f + "gate_proj.weight", (F, H))) * gm)
        h = h + linear(g, w(f + "down_proj.weight", (H, F))) * dm
    h = rmsnorm(h, w("model.final_layernorm.weight", (H,)), eps)
    head = w("model.embed_tokens.weight") if c.get("tie_word_embeddings", False) else w("lm_head.weight", (V, H))
    return (h @ head.T) * float(c.get("lm_head_multiplier", 1.0))


def zamba2_forward(c, w, ids, norm_groups):
    """Zamba2ForCausalLM (hf-hybrid.md C.8). The j-th hybrid layer runs shared block j % num_mem_blocks
    with adapters j on concat(h, embeddings): attention over 2H (scale (hd/2)^-0.5) -> H, norm, gated
    MLP; no residual inside. Its output goes through the layer's linear and is added to h before the
    layer's Mamba-2 norm. dt >= time_step_min (torch path); gated norm per group, eps 1e-5."""
    H, V = int(c["hidden_size"]), int(c["vocab_size"])
    eps = float(c.get("rms_norm_eps", 1e-5))
    types = c["layers_block_type"]
    I = int(c.get("mamba_expand", 2) * H)
    nh, G = int(c.get("n_mamba_heads", 8)), int(c.get("mamba_ngroups", 1))
    N, K = int(c.get("mamba_d_state", 64)), int(c.get("mamba_d_conv", 4))
    heads = int(c.get("num_attention_heads", 32))
    kv = int(c.get("num_key_value_heads", heads))
    hd = 2 * H // heads
    F = int(c.get("intermediate_size", 4 * H))
    nb = int(c.get("num_mem_blocks", 1))
    act = ACTS[c.get("hidden_act", "gelu")]
    rot = hd if c.get("use_mem_rope", False) else 0
    dt_lim = (float(c.get("time_step_min", 0.001)), math.inf)
    hybrid_ids = [i for i, t in enumerate(types) if t == "hybrid"]
    home = {}
    for j, L in enumerate(hybrid_ids):
        home.setdefault(j % nb, L)
    emb = w("model.embed_tokens.weight", (V, H))[ids]
    h = emb
    for i, t in enumerate(types):
        p = "model.layers.%d." % i
        if t == "hybrid":
            j = hybrid_ids.index(i)
            s = "model.layers.%d.shared_transformer." % home[j % nb]
            x = rmsnorm(np.concatenate([h, emb], axis=1), w(s + "input_layernorm.weight", (2 * H,)), eps)
            # Adapters: q/k/v += (x A0^T) A1^T: fold each into a per-call weight W + A1 A0.
            lw = {}
            for n in ("q", "k", "v"):
                W = w(s + "self_attn.%s_proj.weight" % n)
                if c.get("use_shared_attention_adapter", False):
                    q = s + "self_attn.linear_%s_adapter_list.%d." % (n, j)
                    W = W + w(q + "1.weight") @ w(q + "0.weight")
                lw[s + "self_attn.%s_proj.weight" % n] = W
            lw[s + "self_attn.o_proj.weight"] = w(s + "self_attn.o_proj.weight")
            a = attention(Weights(lw), s + "self_attn.", x, 2 * H, heads, kv, hd, rot,
                          float(c.get("rope_theta", 10000.0)), scale=(hd / 2) ** -0.5, out_dim=H)
            f = rmsnorm(a, w(s + "pre_ff_layernorm.weight", (H,)), eps)
            gu = linear(f, w(s + "feed_forward.gate_up_proj.weight", (2 * F, H)))
            if c.get("use_shared_mlp_adapter", False):
                q = s + "feed_forward.gate_up_proj_adapter_list.%d." % j
                gu = gu + linear(linear(f, w(q + "0.weight")), w(q + "1.weight"))
            m = linear(act(gu[:, :F]) * gu[:, F:], w(s + "feed_forward.down_proj.weight", (H, F)))
            tt = linear(m, w(p + "linear.weight", (H, H)))
            u = rmsnorm(h + tt, w(p + "mamba_decoder.input_layernorm.weight", (H,)), eps)
            h = h + mamba2(w, p + "mamba_decoder.mamba.", u, H, I, nh, G, N, K,
                           bool(c.get("add_bias_linear", False)), True, 1e-5, I // G, dt_lim)
        else:
            u = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), eps)
            h = h + mamba2(w, p + "mamba.", u, H, I, nh, G, N, K, bool(c.get("add_bias_linear", False)), True,
                           1e-5, I // G, dt_lim)
    h = rmsnorm(h, w("model.final_layernorm.weight", (H,)), eps)
    return h @ (w("model.embed_tokens.weight") if c.get("tie_word_embeddings", True) else w("lm_head.weight", (V, H))).T


def zamba_mamba(w, p, u, c, H):
    """ZambaMambaMixer (modeling_zamba.py, slow path): in_proj rows alternate x and z (row 2c is x_c,
    row 2c + 1 is z_c); causal conv + silu over all I channels; then each of n_mamba_heads heads of
    P = I / nh channels is an independent Mamba-1 with its own x_proj (R + 2N, P), dt_proj (P, R) +
    bias, A_log (P, N) and D (P); no dt clamp; y_n * silu(z_n); out_proj of the heads side by side."""
    I, nh = int(c.get("mamba_expand", 2) * H), int(c.get("n_mamba_heads", 2))
    N, K = int(c.get("mamba_d_state", 16)), int(c.get("mamba_d_conv", 4))
    R = c.get("mamba_dt_rank", "auto")
    R = math.ceil(H / 16) if R == "auto" else int(R)
    P = I // nh
    bias, conv_bias = bool(c.get("mamba_proj_bias", False)), bool(c.get("mamba_conv_bias", True))
    xz = linear(u, w(p + "in_proj.weight", (2 * I, H)), w.opt(p + "in_proj.bias", (2 * I,), bias))
    x, z = xz[:, 0::2], xz[:, 1::2]
    x = silu(causal_conv1d(x, w(p + "conv1d.weight", (I, 1, K)), w.opt(p + "conv1d.bias", (I,), conv_bias)))
    xw, dw = w(p + "x_proj_weight", (nh, R + 2 * N, P)), w(p + "dt_proj_weight", (nh, P, R))
    db, A_log, D = w(p + "dt_proj_bias", (nh, P)), w(p + "A_log", (nh, P, N)), w(p + "D", (nh, P))
    ys = []
    for n in range(nh):
        xn = x[:, n * P:(n + 1) * P]
        dbc = xn @ xw[n].T
        dt, B, C = dbc[:, :R], dbc[:, R:R + N], dbc[:, R + N:]
        delta = softplus(dt @ dw[n].T + db[n])
        ys.append(mamba_ref.mamba1_scan(xn, delta, -np.exp(A_log[n]), B, C, D[n]) * silu(z[:, n * P:(n + 1) * P]))
    return linear(np.concatenate(ys, axis=1), w(p + "out_proj.weight", (H, I)), w.opt(p + "out_proj.bias", (H,), bias))


def zamba_forward(c, w, ids, norm_groups):
    """ZambaForCausalLM (modeling_zamba.py). layers_block_type, or transformers' rule from
    attn_layer_period / offset. A hybrid layer runs the one shared block on concat(h, embeddings):
    RMSNorm over 2H, attention without positions (head_dim 2H / heads, scale (hd / 2)^-0.5), o_proj to
    H, RMSNorm, gated MLP (hidden_act); no residual inside; t = linear(block); then
    h += mamba(norm(h + t)). Mamba layers: h += mamba(norm(h))."""
    H, V = int(c["hidden_size"]), int(c["vocab_size"])
    eps = float(c.get("rms_norm_eps", 1e-5))
    types = c.get("layers_block_type")
    if not types:
        period, offset = int(c.get("attn_layer_period", 6)), int(c.get("attn_layer_offset", 4))
        types = ["mamba", "mamba", "hybrid"] + ["hybrid" if i % period == offset else "mamba"
                                              for i in range(int(c.get("num_hidden_layers", 76)) - 3)]
    heads = int(c.get("num_attention_heads", 16))
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("attention_head_dim") or 2 * H // heads)
    F = int(c.get("intermediate_size", 14848))
    act = c.get("hidden_act", "gelu")
    # The shared block's weights are tied across hybrid layers; the checkpoint holds one copy.
    homes = [i for i, t in enumerate(types) if t == "hybrid"
             and "model.layers.%d.shared_transf.input_layernorm.weight" % i in w.t]
    emb = w("model.embed_tokens.weight", (V, H))[ids]
    h = emb
    for i, t in enumerate(types):
        p = "model.layers.%d." % i
        if t == "hybrid":
            s = "model.layers.%d.shared_transf." % homes[0]
            x = rmsnorm(np.concatenate([h, emb], axis=1), w(s + "input_layernorm.weight", (2 * H,)), eps)
            a = attention(w, s + "self_attn.", x, 2 * H, heads, kv, hd, 0, 10000.0, scale=(hd / 2) ** -0.5, out_dim=H)
            f = rmsnorm(a, w(s + "pre_ff_layernorm.weight", (H,)), eps)
            m = mlp(w, s + "feed_forward.", f, H, F, act)
            tt = linear(m, w(p + "linear.weight", (H, H)))
            u = rmsnorm(h + tt, w(p + "mamba_decoder.input_layernorm.weight", (H,)), eps)
            h = h + zamba_mamba(w, p + "mamba_decoder.mamba.", u, c, H)
        else:
            u = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), eps)
            h = h + zamba_mamba(w, p + "mamba.", u, c, H)
    h = rmsnorm(h, w("model.final_layernorm.weight", (H,)), eps)
    return h @ (w("model.embed_tokens.weight") if c.get("tie_word_embeddings", True) else w("lm_head.weight", (V, H))).T


def llamba_forward(c, w, ids, norm_groups):
    """Llamba (cartesia-pytorch LlambaLMHeadModel): Llama-shaped blocks around the discrete Mamba-2.
    The vocabulary is padded up to pad_vocab_size_multiple; the block norms use eps 1e-5 whatever
    norm_epsilon says, the final norm norm_epsilon."""
    H = int(c["d_model"])
    mult = int(c.get("pad_vocab_size_multiple", 8))
    V = (int(c["vocab_size"]) + mult - 1) // mult * mult
    eps = float(c.get("norm_epsilon", 1e-5))
    ssm, mc = c.get("ssm_cfg", {}), c.get("mlp_cfg", {})
    I = int(ssm.get("expand", 1) * H)
    N, K = int(ssm.get("d_state", 64)), int(ssm.get("d_conv", 4))
    nv, G = int(ssm.get("n_v_heads", 32)), int(ssm.get("n_qk_heads", 32))
    bias, conv_bias = bool(ssm.get("bias", False)), bool(ssm.get("conv_bias", True))
    F = int(mc.get("intermediate_size", 14336))
    h = w("backbone.embedding.weight", (V, H))[ids]
    for i in range(int(c.get("n_layer", 32))):
        p = "backbone.layers.%d." % i
        u = rmsnorm(h, w(p + "input_layernorm.weight", (H,)), 1e-5)
        h = h + discrete_mamba2(w, p + "mixer.", u, H, I, nv, G, N, K, bias, conv_bias,
                                ssm.get("activation", "identity"))
        u = rmsnorm(h, w(p + "post_attention_layernorm.weight", (H,)), 1e-5)
        h = h + mlp(w, p + "mlp.", u, H, F, mc.get("act_fn", "silu"))
    h = rmsnorm(h, w("backbone.final_layernorm.weight", (H,)), eps)
    head = w("backbone.embedding.weight") if c.get("tie_embeddings", False) else w("lm_head.weight", (V, H))
    return h @ head.T


def moe_stacked(w, p, u, H, F, E, top_k):
    """Qwen3.5-MoE's sparse block: router gate.weight, softmax over all experts, top-k always
    renormalised; expert e is one slice of experts.gate_up_proj (E, 2F, H) = [gate | up] rows and
    of experts.down_proj (E, H, F)."""
    logits = linear(u, w(p + "gate.weight", (E, H)))
    gu, down = w(p + "experts.gate_up_proj", (E, 2 * F, H)), w(p + "experts.down_proj", (E, H, F))
    out = np.zeros_like(u)
    for t in range(u.shape[0]):
        prob = np.exp(logits[t] - logits[t].max())
        prob /= prob.sum()
        top = np.argsort(-prob, kind="stable")[:top_k]
        for e, wt in zip(top, prob[top] / prob[top].sum()):
            h = gu[e] @ u[t]
            out[t] += wt * (down[e] @ (silu(h[:F]) * h[F:]))
    return out


def qwen3_next_forward(c, w, ids, norm_groups, prefix="model.", variant="next"):
    """Qwen3NextForCausalLM (hf-hybrid.md C.10; modeling_qwen3_next.py pinned in docs/numerics.md):
    zero-centred RMSNorms x (1 + w) everywhere but the DeltaNet's output norm; gated DeltaNet
    layers; gated attention (q_proj per head [query | gate], q/k norms, partial RoPE, output x
    sigmoid(gate)); sparse MoE (softmax over all experts, top-k, renormalised iff norm_topk_prob)
    plus a shared expert x sigmoid(shared_expert_gate . x), or a dense SwiGLU MLP.
    variant "3.5" / "3.5-moe": Qwen3.5's text model (modeling_qwen3_5.py, modular_qwen3_5_moe.py):
    the DeltaNet's four projections apart; every feed-forward dense (3.5) or a MoE with stacked
    experts and an always-renormalising router (3.5-moe); weights under `prefix`."""
    H, V, L = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    eps = float(c.get("rms_norm_eps", 1e-6))
    heads, kv_heads = int(c.get("num_attention_heads", 16)), int(c.get("num_key_value_heads", 2))
    hd = int(c.get("head_dim", 256))
    rp = c.get("rope_parameters") or {}
    theta = float(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
    rot = int(hd * float(rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))))
    nk, nv = int(c.get("linear_num_key_heads", 16)), int(c.get("linear_num_value_heads", 32))
    dk, dv = int(c.get("linear_key_head_dim", 128)), int(c.get("linear_value_head_dim", 128))
    K = int(c.get("linear_conv_kernel_dim", 4))
    if variant == "next":
        E, step, top_k = int(c.get("num_experts", 512)), int(c.get("decoder_sparse_step", 1)), int(c.get("num_experts_per_tok", 10))
        only = set(c.get("mlp_only_layers") or [])
    else:
        E = int(c.get("num_experts", 256)) if variant == "3.5-moe" else 0
        step, top_k, only = 1, int(c.get("num_experts_per_tok", 8)), set()
    interval = int(c.get("full_attention_interval", 4))
    types = c.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                     for i in range(L)]

    def znorm(x, name, d):
        return rmsnorm(x, 1.0 + w(name, (d,)), eps)

    T = len(ids)
    h = w(prefix + "embed_tokens.weight", (V, H))[ids]
    for i in range(L):
        p = prefix + "layers.%d." % i
        u = znorm(h, p + "input_layernorm.weight", H)
        if types[i] == "full_attention":
            a = p + "self_attn."
            qg = linear(u, w(a + "q_proj.weight", (2 * heads * hd, H))).reshape(T, heads, 2 * hd)
            q, gate = qg[:, :, :hd], qg[:, :, hd:]
            k = linear(u, w(a + "k_proj.weight", (kv_heads * hd, H))).reshape(T, kv_heads, hd)
            v = linear(u, w(a + "v_proj.weight", (kv_heads * hd, H))).reshape(T, kv_heads, hd)
            q, k = znorm(q, a + "q_norm.weight", hd), znorm(k, a + "k_norm.weight", hd)
            q, k = rope(q, rot, theta), rope(k, rot, theta)
            rep = heads // kv_heads
            y = np.zeros((T, heads, hd))
            for hh in range(heads):
                sc = (q[:, hh] @ k[:, hh // rep].T) * hd ** -0.5
                sc = np.where(np.tril(np.ones((T, T), dtype=bool)), sc, -np.inf)
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                y[:, hh] = (sc / sc.sum(axis=1, keepdims=True)) @ v[:, hh // rep]
            y = y * (1.0 / (1.0 + np.exp(-gate)))
            h = h + linear(y.reshape(T, heads * hd), w(a + "o_proj.weight", (H, heads * hd)))
        else:
            h = h + gated_deltanet(w, p + "linear_attn.", u, H, nk, nv, dk, dv, K, eps, interleaved=variant == "next")
        u = znorm(h, p + "post_attention_layernorm.weight", H)
        f = p + "mlp."
        if E > 0 and (i + 1) % step == 0 and i not in only:
            F = int(c.get("moe_intermediate_size", 512))
            if variant == "next":
                out = moe(w, f, u, H, F, E, top_k, bool(c.get("norm_topk_prob", True)), router="gate.weight")
            else:
                out = moe_stacked(w, f, u, H, F, E, top_k)
            shared = mlp(w, f + "shared_expert.", u, H, int(c.get("shared_expert_intermediate_size", 512)), "silu")
            sg = 1.0 / (1.0 + np.exp(-linear(u, w(f + "shared_expert_gate.weight", (1, H)))))
            h = h + out + sg * shared
        else:
            h = h + mlp(w, f, u, H, int(c.get("intermediate_size", 5632)), "silu")
    h = znorm(h, prefix + "norm.weight", H)
    tie = bool(c.get("tie_word_embeddings", False))
    return h @ (w(prefix + "embed_tokens.weight") if tie else w("lm_head.weight", (V, H))).T


def qwen3_5_forward(c, w, ids, norm_groups):
    """Qwen3_5(Moe)ForConditionalGeneration on text (the text keys nested in text_config, weights
    under model.language_model., tie_word_embeddings at the top) or the text-only ForCausalLM form
    (flat keys, model.). With text positions only, the interleaved MRoPE is plain RoPE."""
    variant = "3.5-moe" if c["model_type"].startswith("qwen3_5_moe") else "3.5"
    if "text_config" in c:
        text = dict(c["text_config"])
        text["tie_word_embeddings"] = c.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return qwen3_next_forward(text, w, ids, norm_groups, "model.language_model.", variant)
    return qwen3_next_forward(c, w, ids, norm_groups, "model.", variant)


FAMILIES = {"qwen3_next": qwen3_next_forward, "qwen3_5": qwen3_5_forward, "qwen3_5_moe": qwen3_5_forward,
            "qwen3_5_text": qwen3_5_forward, "qwen3_5_moe_text": qwen3_5_forward, "zamba2": zamba2_forward,
            "falcon_h1": falcon_h1_forward, "granitemoehybrid": granitemoehybrid_forward,
            "nemotron_h": nemotron_h_forward, "hybridlm": hybridlm_forward, "jamba": jamba_forward,
            "bamba": bamba_forward, "lfm2": lfm2_forward, "llamba": llamba_forward, "zamba": zamba_forward,
            "lfm2_moe": lfm2_forward}


class Model:
    def __init__(self, config, tensors):
        self.config = config
        self.model_type = config["model_type"]
        self.vocab = int(config.get("text_config", config)["vocab_size"])
        if self.model_type == "llamba":  # the model pads its vocabulary
            mult = int(config.get("pad_vocab_size_multiple", 8))
            self.vocab = (self.vocab + mult - 1) // mult * mult
        self.tensors = tensors


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") in ("mamba", "falcon_mamba", "mamba2"):
        return mamba_ref.Model(config, mamba_ref.read_weights(model_dir))
    if config.get("model_type") not in FAMILIES:
        raise ValueError("unsupported model_type %r" % config.get("model_type"))
    return Model(config, mamba_ref.read_weights(model_dir))


def forward(model, ids, norm_groups="grouped"):
    """Logits, float64 (T, vocab)."""
    if isinstance(model, mamba_ref.Model):
        return mamba_ref.forward(model, ids, norm_groups)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= model.vocab:
        raise ValueError("ids must be a non-empty 1-D sequence in [0, %d)" % model.vocab)
    w = Weights(model.tensors)
    logits = FAMILIES[model.model_type](model.config, w, ids, norm_groups)
    # Tensors the family's Hugging Face class also ignores on load (_keys_to_ignore_on_load_unexpected):
    # the multi-token-prediction head and the vision tower.
    ignored = ("mtp.", "model.visual.") if model.model_type.startswith("qwen3") else ()
    unused = {n for n in set(model.tensors) - w.used - {"lm_head.weight"} if not n.startswith(ignored)}
    if unused:  # every tensor of the checkpoint must take part (catches a misread config)
        raise ValueError("tensors the reference never read: %s" % sorted(unused)[:5])
    return logits
