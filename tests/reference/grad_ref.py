#!/usr/bin/python3
"""Float64 numpy forward AND hand-written backward (vector-Jacobian products) of every op of the
hybridlm models: the oracle the engine's gradients (issue 16) are checked against.

Each op is a pair

    op_fwd(...)        -> (out, cache)
    op_bwd(dout, cache) -> grads     (a dict {input or parameter name: gradient}, same shapes)

The backward passes are derived by hand (docs/derivations/) and written as plain loops where the
forward is a recurrence; no autodiff, no finite differences (test_grad_ref.py checks them against
central differences). The forwards reuse the conventions of mamba_ref.py / hybrid_ref.py exactly
(Hugging Face parameter names, shapes and layouts); test_grad_ref.py checks that the composed
model's logits equal hybrid_ref's.

Notation as in mamba_ref.py: T time, H hidden, I d_inner, N d_state, K conv kernel, R dt rank,
nh heads, P head dim, G groups. Every array is float64; states are zero unless given.
"""

import math
import os
import sys

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mamba_ref import silu, softplus  # noqa: E402


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def dsilu(x):
    """d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)."""
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


# --------------------------------------------------------------------------------------------
# Activations (elementwise):  act_fwd(x, kind) / act_bwd(dout, cache) -> {"x"}
#   silu; gelu (exact, erf: HF 'gelu'); gelu_tanh (HF 'gelu_pytorch_tanh' / 'gelu_new', accepted
#   as aliases); relu2 (max(x,0)^2)
# --------------------------------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf)


_ACT_ALIASES = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}  # HF hidden_act names


def act_value(x, kind):
    kind = _ACT_ALIASES.get(kind, kind)
    if kind == "silu":
        return silu(x)
    if kind == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    if kind == "relu2":
        return np.maximum(x, 0.0) ** 2
    raise ValueError("unknown activation %r" % kind)


def act_deriv(x, kind):
    kind = _ACT_ALIASES.get(kind, kind)
    if kind == "silu":
        return dsilu(x)
    if kind == "gelu":
        # Phi(x) + x phi(x)
        return (0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
                + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))
    if kind == "gelu_tanh":
        th = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
        return (0.5 * (1.0 + th)
                + 0.5 * x * (1.0 - th * th) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x))
    if kind == "relu2":
        return 2.0 * np.maximum(x, 0.0)
    raise ValueError("unknown activation %r" % kind)


def act_fwd(x, kind):
    return act_value(x, kind), (x, kind)


def act_bwd(dout, cache):
    x, kind = cache
    return {"x": dout * act_deriv(x, kind)}


# --------------------------------------------------------------------------------------------
# Embedding:  out = W[ids]  (W: (V, H));  grads {"W"}.  A tied head adds its own dW (linear).
# --------------------------------------------------------------------------------------------


def embedding_fwd(ids, W):
    ids = np.asarray(ids, dtype=np.int64)
    return W[ids].copy(), (ids, W.shape)


def embedding_bwd(dout, cache):
    ids, shape = cache
    dW = np.zeros(shape)
    np.add.at(dW, ids, dout)  # repeated ids accumulate
    return {"W": dW}


# --------------------------------------------------------------------------------------------
# Linear:  y = x W^T + b   x: (T, in), W: (out, in), b: (out,) or None;  grads {"x","W","b"}
# (the LM head is linear(h, W_head) with no bias; tied: W_head is the embedding)
# --------------------------------------------------------------------------------------------


def linear_fwd(x, W, b=None):
    y = x @ W.T
    if b is not None:
        y = y + b
    return y, (x, W, b is not None)


def linear_bwd(dy, cache):
    x, W, has_b = cache
    g = {"x": dy @ W, "W": dy.T @ x}
    if has_b:
        g["b"] = dy.sum(axis=0)
    return g


# --------------------------------------------------------------------------------------------
# RMSNorm over the last dim:  y = x r w,  r = (mean(x^2) + eps)^-1/2;  w (D,) or None
# grads {"x", "w"}
# --------------------------------------------------------------------------------------------


def rmsnorm_fwd(x, w, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    n = x * r
    return (n if w is None else n * w), (n, r, w)


def rmsnorm_bwd(dy, cache):
    n, r, w = cache
    dn = dy if w is None else dy * w
    g = {"x": r * (dn - n * np.mean(dn * n, axis=-1, keepdims=True))}
    if w is not None:
        g["w"] = (dy * n).reshape(-1, n.shape[-1]).sum(axis=0)
    return g


# --------------------------------------------------------------------------------------------
# Gated RMSNorm (Mamba-2, norm_before_gate=False):  t = y silu(z), normalised over contiguous
# groups of group_size channels, times w.  y, z: (T, I); w: (I,);  grads {"y", "z", "w"}
# --------------------------------------------------------------------------------------------


def gated_rmsnorm_fwd(y, z, w, eps, group_size):
    T, I = y.shape
    t = (y * silu(z)).reshape(T, I // group_size, group_size)
    r = 1.0 / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + eps)
    n = (t * r).reshape(T, I)
    return n * w, (y, z, w, n, r, group_size)


def gated_rmsnorm_bwd(dout, cache):
    y, z, w, n, r, gs = cache
    T, I = y.shape
    dn = (dout * w).reshape(T, I // gs, gs)
    ng = n.reshape(T, I // gs, gs)
    dt = (r * (dn - ng * np.mean(dn * ng, axis=-1, keepdims=True))).reshape(T, I)
    return {"y": dt * silu(z), "z": dt * y * dsilu(z), "w": (dout * n).sum(axis=0)}


# --------------------------------------------------------------------------------------------
# Causal depthwise conv1d (+ optional SiLU) with the inference conv state as history:
#   xe = [state; x]  ((K-1+T), C), state (K-1, C) = the last K-1 raw inputs, oldest first
#   pre[t] = b + sum_k w[:, 0, k] * xe[t + k]     (tap K-1 multiplies x[t]);  out = silu(pre)
# grads {"x", "w", "b", "state"}.  The next state is cache[0][-(K-1):] (the last K-1 rows of
# xe); its gradient, when it feeds a later chunk, is bwd's dstate_next.
# --------------------------------------------------------------------------------------------


def conv1d_fwd(x, w, b=None, state=None, act=True):
    T, C = x.shape
    K = w.shape[2]
    if state is None:
        state = np.zeros((K - 1, C))
    xe = np.concatenate([state, x], axis=0)
    pre = np.zeros((T, C))
    for t in range(T):
        for k in range(K):
            pre[t] += w[:, 0, k] * xe[t + k]
    if b is not None:
        pre += b
    out = silu(pre) if act else pre
    return out, (xe, w, b is not None, pre, act)


def conv1d_bwd(dout, cache, dstate_next=None):
    xe, w, has_b, pre, act = cache
    T, C = pre.shape
    K = w.shape[2]
    dpre = dout * dsilu(pre) if act else dout
    dxe = np.zeros_like(xe)
    if dstate_next is not None and K > 1:
        dxe[-(K - 1):] += dstate_next
    dw = np.zeros_like(w)
    for t in range(T):
        for k in range(K):
            dxe[t + k] += dpre[t] * w[:, 0, k]
            dw[:, 0, k] += dpre[t] * xe[t + k]
    g = {"x": dxe[K - 1:], "w": dw, "state": dxe[:K - 1]}
    if has_b:
        g["b"] = dpre.sum(axis=0)
    return g


# --------------------------------------------------------------------------------------------
# Mamba-1 selective scan (with softplus on dt, A = -exp(A_log), D skip, optional z gate):
#   delta = softplus(dt);  A = -exp(A_log)
#   h_t = exp(delta_t A) * h_{t-1} + delta_t B_t x_t      h: (I, N), h_{-1} = h0 (or 0)
#   y_t = h_t C_t + D x_t;   out = y * silu(z)  (or y)
# x, dt, z: (T, I); A_log: (I, N); B, C: (T, N); D: (I,); h0: (I, N)
# grads {"x", "dt", "A_log", "B", "C", "D", "z", "h0"}.  The final state is cache[-2][-1]; its
# gradient (when the state is an output, as across chunks) is bwd's dh_final.
# --------------------------------------------------------------------------------------------


def mamba1_scan_fwd(x, dt, A_log, B, C, D, z=None, h0=None):
    T, I = x.shape
    delta = softplus(dt)
    A = -np.exp(A_log)
    hs = np.zeros((T + 1,) + A.shape)  # hs[t + 1] = h_t, hs[0] = h0
    if h0 is not None:
        hs[0] = h0
    y = np.zeros((T, I))
    for t in range(T):
        hs[t + 1] = np.exp(delta[t][:, None] * A) * hs[t] + delta[t][:, None] * B[t][None, :] * x[t][:, None]
        y[t] = hs[t + 1] @ C[t] + D * x[t]
    out = y * silu(z) if z is not None else y
    return out, (x, dt, delta, A, B, C, D, z, hs, y)


def mamba1_scan_bwd(dout, cache, dh_final=None):
    x, dt, delta, A, B, C, D, z, hs, y = cache
    T, I = x.shape
    g = {}
    if z is not None:
        g["z"] = dout * y * dsilu(z)
        dy = dout * silu(z)
    else:
        dy = dout
    dx = np.zeros_like(x)
    ddelta = np.zeros_like(delta)
    dA = np.zeros_like(A)
    dB = np.zeros_like(B)
    dC = np.zeros_like(C)
    dD = np.zeros_like(D)
    gh = np.zeros_like(A) if dh_final is None else dh_final.copy()  # dL/dh_t, backwards in time
    for t in range(T - 1, -1, -1):
        gh += dy[t][:, None] * C[t][None, :]               # y_t = h_t C_t
        dC[t] = hs[t + 1].T @ dy[t]
        dD += dy[t] * x[t]
        decay = np.exp(delta[t][:, None] * A)              # (I, N)
        hd = decay * hs[t]                                 # exp(delta_t A) h_{t-1}
        dx[t] = D * dy[t] + delta[t] * (gh @ B[t])
        ddelta[t] = gh @ B[t] * x[t] + np.sum(gh * A * hd, axis=1)
        dB[t] = (delta[t] * x[t]) @ gh
        dA += gh * delta[t][:, None] * hd
        gh = gh * decay                                    # -> dL/dh_{t-1}
    g.update({"x": dx, "dt": ddelta * sigmoid(dt), "A_log": dA * A, "B": dB, "C": dC, "D": dD,
              "h0": gh})
    return g


# --------------------------------------------------------------------------------------------
# Mamba-2 SSD recurrence (scalar A per head, B/C per group, dt softplus + dt_bias + clamp):
#   delta = clip(softplus(dt + dt_bias), lo, hi);  A = -exp(A_log)
#   S_t = exp(delta_t A_h) S_{t-1} + delta_t x_t B_t^T       S: (P, N) per head, S_{-1} = S0 (or 0)
#   y_t = S_t C_t + D_h x_t          head h reads group h // (nh / G)
# x: (T, nh, P); dt: (T, nh); dt_bias, A_log, D: (nh,); B, C: (T, G, N); S0: (nh, P, N)
# grads {"x", "dt", "dt_bias", "A_log", "B", "C", "D", "S0"}; the clamp passes no gradient
# where it is active (as mamba_ssm's _chunk_cumsum_bwd).  The final state is cache[-1][-1]; its
# gradient (when the state is an output, as across chunks) is bwd's dS_final.
# --------------------------------------------------------------------------------------------


def mamba2_ssd_fwd(x, dt, dt_bias, A_log, B, C, D, dt_limit=(0.0, math.inf), S0=None):
    T, nh, P = x.shape
    G, N = B.shape[1], B.shape[2]
    hpg = nh // G
    sp = softplus(dt + dt_bias)
    delta = np.clip(sp, dt_limit[0], dt_limit[1])
    A = -np.exp(A_log)
    Ss = np.zeros((T + 1, nh, P, N))  # Ss[t + 1] = S_t
    if S0 is not None:
        Ss[0] = S0
    y = np.zeros((T, nh, P))
    for h in range(nh):
        gr = h // hpg
        for t in range(T):
            Ss[t + 1, h] = (math.exp(delta[t, h] * A[h]) * Ss[t, h]
                            + delta[t, h] * np.outer(x[t, h], B[t, gr]))
            y[t, h] = Ss[t + 1, h] @ C[t, gr] + D[h] * x[t, h]
    inside = (sp >= dt_limit[0]) & (sp <= dt_limit[1])
    return y, (x, dt, dt_bias, sp, delta, inside, A, B, C, D, Ss)


def mamba2_ssd_bwd(dy, cache, dS_final=None):
    x, dt, dt_bias, sp, delta, inside, A, B, C, D, Ss = cache
    T, nh, P = x.shape
    G = B.shape[1]
    hpg = nh // G
    dx = np.zeros_like(x)
    ddelta = np.zeros_like(delta)
    dA = np.zeros_like(A)
    dB = np.zeros_like(B)
    dC = np.zeros_like(C)
    dD = np.zeros_like(D)
    dS0 = np.zeros_like(Ss[0])
    for h in range(nh):
        gr = h // hpg
        gS = np.zeros(Ss.shape[2:]) if dS_final is None else dS_final[h].copy()  # dL/dS_t
        for t in range(T - 1, -1, -1):
            gS += np.outer(dy[t, h], C[t, gr])
            dC[t, gr] += Ss[t + 1, h].T @ dy[t, h]
            dD[h] += dy[t, h] @ x[t, h]
            a = math.exp(delta[t, h] * A[h])
            gSS = np.sum(gS * Ss[t, h])                    # <dL/dS_t, S_{t-1}>
            dx[t, h] = D[h] * dy[t, h] + delta[t, h] * (gS @ B[t, gr])
            dB[t, gr] += delta[t, h] * (gS.T @ x[t, h])
            ddelta[t, h] = x[t, h] @ gS @ B[t, gr] + A[h] * a * gSS
            dA[h] += delta[t, h] * a * gSS
            gS = a * gS
        dS0[h] = gS
    ddt = ddelta * inside * sigmoid(dt + dt_bias)
    return {"x": dx, "dt": ddt, "dt_bias": ddt.sum(axis=0), "A_log": dA * A, "B": dB, "C": dC,
            "D": dD, "S0": dS0}


# --------------------------------------------------------------------------------------------
# Discrete Mamba-2 scan (m2d: MOHAWK / Llamba):  x: (T, nh, P); a_raw: (T, nh) in_proj's A~ rows;
# B, C: (T, G, N); D: (nh); S0: (nh, P, N); head h reads group h // (nh / G)
#   la_t = -softplus(a_raw_t),  S_t = exp(la_t) S_{t-1} + x_t B_t^T,  y_t = S_t C_t + D x_t
# Backward, gS = dL/dS_t with y_t's term added:  dla_t = exp(la_t) <gS, S_{t-1}> (the decay's
# log), d a_raw = -sigmoid(a_raw) dla;  dx_t = D dy_t + gS B_t;  dB_t += gS^T x_t;  then
# dL/dS_{t-1} = exp(la_t) gS.  grads {"x", "a_raw", "B", "C", "D", "S0"}
# --------------------------------------------------------------------------------------------


def ssd_discrete_fwd(x, a_raw, B, C, D, S0=None):
    T, nh, P = x.shape
    G, N = B.shape[1], B.shape[2]
    hpg = nh // G
    la = -softplus(a_raw)
    Ss = np.zeros((T + 1, nh, P, N))  # Ss[t + 1] = S_t
    if S0 is not None:
        Ss[0] = S0
    y = np.zeros((T, nh, P))
    for h in range(nh):
        gr = h // hpg
        for t in range(T):
            Ss[t + 1, h] = math.exp(la[t, h]) * Ss[t, h] + np.outer(x[t, h], B[t, gr])
            y[t, h] = Ss[t + 1, h] @ C[t, gr] + D[h] * x[t, h]
    return y, (x, a_raw, la, B, C, D, Ss)


def ssd_discrete_bwd(dy, cache, dS_final=None):
    x, a_raw, la, B, C, D, Ss = cache
    T, nh, P = x.shape
    G = B.shape[1]
    hpg = nh // G
    dx = np.zeros_like(x)
    dla = np.zeros_like(la)
    dB = np.zeros_like(B)
    dC = np.zeros_like(C)
    dD = np.zeros_like(D)
    dS0 = np.zeros_like(Ss[0])
    for h in range(nh):
        gr = h // hpg
        gS = np.zeros(Ss.shape[2:]) if dS_final is None else dS_final[h].copy()
        for t in range(T - 1, -1, -1):
            gS += np.outer(dy[t, h], C[t, gr])
            dC[t, gr] += Ss[t + 1, h].T @ dy[t, h]
            dD[h] += dy[t, h] @ x[t, h]
            a = math.exp(la[t, h])
            dx[t, h] = D[h] * dy[t, h] + gS @ B[t, gr]
            dB[t, gr] += gS.T @ x[t, h]
            dla[t, h] = a * np.sum(gS * Ss[t, h])
            gS = a * gS
        dS0[h] = gS
    return {"x": dx, "a_raw": -sigmoid(a_raw) * dla, "B": dB, "C": dC, "D": dD, "S0": dS0}


# --------------------------------------------------------------------------------------------
# RoPE (rotate-half on the first `rot` dims of each head, positions pos0 .. pos0+T-1)
#   x: (T, heads, hd); pair (j, j + rot/2) rotated by pos * theta^(-2j/rot);  grads {"x"}
# --------------------------------------------------------------------------------------------


def _rope_cs(T, rot, theta, pos0):
    half = rot // 2
    inv = theta ** (-2.0 * np.arange(half) / rot)
    ang = (pos0 + np.arange(T))[:, None] * inv[None, :]
    return np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]


def rope_fwd(x, rot, theta, pos0=0):
    if rot == 0:
        return x.copy(), (rot, None, None)
    half = rot // 2
    c, s = _rope_cs(x.shape[0], rot, theta, pos0)
    out = x.copy()
    a, b = x[:, :, :half], x[:, :, half:rot]
    out[:, :, :half] = a * c - b * s
    out[:, :, half:rot] = b * c + a * s
    return out, (rot, c, s)


def rope_bwd(dout, cache):
    rot, c, s = cache
    dx = dout.copy()
    if rot == 0:
        return {"x": dx}
    half = rot // 2
    d1, d2 = dout[:, :, :half], dout[:, :, half:rot]
    dx[:, :, :half] = d1 * c + d2 * s        # transpose of the rotation
    dx[:, :, half:rot] = d2 * c - d1 * s
    return {"x": dx}


# --------------------------------------------------------------------------------------------
# Causal GQA softmax attention core:  q: (T, heads, hd); k, v: (T, kv_heads, hd)
#   S = q_h k_j^T * scale (future masked), P = softmax_rows(S), y_h = P v_j,  j = h // (heads/kv)
# grads {"q", "k", "v"}
# --------------------------------------------------------------------------------------------


def sdpa_fwd(q, k, v, scale):
    T, heads, hd = q.shape
    rep = heads // k.shape[1]
    mask = np.tril(np.ones((T, T), dtype=bool))
    Ps = np.zeros((heads, T, T))
    y = np.zeros_like(q)
    for h in range(heads):
        s = (q[:, h, :] @ k[:, h // rep, :].T) * scale
        s = np.where(mask, s, -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        Ps[h] = e / e.sum(axis=1, keepdims=True)
        y[:, h, :] = Ps[h] @ v[:, h // rep, :]
    return y, (q, k, v, scale, Ps)


def sdpa_bwd(dy, cache):
    q, k, v, scale, Ps = cache
    heads = q.shape[1]
    rep = heads // k.shape[1]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(heads):
        j = h // rep
        P = Ps[h]
        dP = dy[:, h, :] @ v[:, j, :].T
        dS = P * (dP - np.sum(dP * P, axis=1, keepdims=True))   # masked entries have P = 0
        dq[:, h, :] = scale * dS @ k[:, j, :]
        dk[:, j, :] += scale * dS.T @ q[:, h, :]
        dv[:, j, :] += P.T @ dy[:, h, :]
    return {"q": dq, "k": dk, "v": dv}


# --------------------------------------------------------------------------------------------
# Softmax cross-entropy, mean over predicted positions (targets < 0 are not predicted)
#   logits: (T, V); targets: (T,) int;  loss = mean_t [logsumexp(logits_t) - logits_t[target_t]]
# grads {"logits"}; dout is the scalar upstream gradient (1 for the loss itself)
# --------------------------------------------------------------------------------------------


def cross_entropy_fwd(logits, targets):
    targets = np.asarray(targets, dtype=np.int64)
    valid = targets >= 0
    n = int(valid.sum())
    if n == 0:
        raise ValueError("no predicted positions")
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    lse = (m + np.log(e.sum(axis=1, keepdims=True)))[:, 0]
    p = e / e.sum(axis=1, keepdims=True)
    rows = np.nonzero(valid)[0]
    loss = float(np.sum(lse[rows] - logits[rows, targets[rows]]) / n)
    return loss, (p, targets, valid, n)


def cross_entropy_bwd(dout, cache):
    p, targets, valid, n = cache
    d = p * valid[:, None]
    rows = np.nonzero(valid)[0]
    d[rows, targets[rows]] -= 1.0
    return {"logits": d * (float(dout) / n)}


# --------------------------------------------------------------------------------------------
# Mixers and MLP, composed from the ops above.  Parameters are dicts of the Hugging Face names
# under the layer's mixer prefix (as hybrid_ref.mamba1 / mamba2 / attention / mlp read them);
# backward returns (du, {name: gradient}).
# --------------------------------------------------------------------------------------------


def _add(dst, grads, names):
    """dst[names[k]] = grads[k] for the keys present."""
    for k, name in names.items():
        if k in grads:
            dst[name] = grads[k]


def mamba1_mixer_fwd(p, u, I, N, R):
    """p: in_proj.weight (2I, H) [+ bias], conv1d.weight (I,1,K) [+ bias], x_proj.weight
    (R+2N, I), dt_proj.weight (I, R) + bias, A_log (I, N), D (I), out_proj.weight (H, I) [+ bias]."""
    c = {}
    xz, c["in"] = linear_fwd(u, p["in_proj.weight"], p.get("in_proj.bias"))
    x, z = xz[:, :I], xz[:, I:]
    xc, c["conv"] = conv1d_fwd(x, p["conv1d.weight"], p.get("conv1d.bias"), act=True)
    dbc, c["xp"] = linear_fwd(xc, p["x_proj.weight"])
    dtl, B, C = dbc[:, :R], dbc[:, R:R + N], dbc[:, R + N:]
    dt, c["dtp"] = linear_fwd(dtl, p["dt_proj.weight"], p["dt_proj.bias"])
    y, c["scan"] = mamba1_scan_fwd(xc, dt, p["A_log"], B, C, p["D"], z)
    out, c["out"] = linear_fwd(y, p["out_proj.weight"], p.get("out_proj.bias"))
    return out, c


def mamba1_mixer_bwd(dout, c):
    g = {}
    go = linear_bwd(dout, c["out"])
    _add(g, go, {"W": "out_proj.weight", "b": "out_proj.bias"})
    gs = mamba1_scan_bwd(go["x"], c["scan"])
    _add(g, gs, {"A_log": "A_log", "D": "D"})
    gd = linear_bwd(gs["dt"], c["dtp"])
    _add(g, gd, {"W": "dt_proj.weight", "b": "dt_proj.bias"})
    gx = linear_bwd(np.concatenate([gd["x"], gs["B"], gs["C"]], axis=1), c["xp"])
    g["x_proj.weight"] = gx["W"]
    gc = conv1d_bwd(gs["x"] + gx["x"], c["conv"])
    _add(g, gc, {"w": "conv1d.weight", "b": "conv1d.bias"})
    gi = linear_bwd(np.concatenate([gc["x"], gs["z"]], axis=1), c["in"])
    _add(g, gi, {"W": "in_proj.weight", "b": "in_proj.bias"})
    return gi["x"], g


def mamba2_mixer_fwd(p, u, I, nh, G, N, eps, group_size, dt_limit=(0.0, math.inf)):
    """p: in_proj.weight (2I+2GN+nh, H) as [z, xBC, dt] [+ bias], conv1d.weight (I+2GN, 1, K)
    [+ bias], dt_bias, A_log, D (nh), norm.weight (I), out_proj.weight (H, I) [+ bias]."""
    T = u.shape[0]
    P = I // nh
    cd = I + 2 * G * N
    c = {}
    zxbcdt, c["in"] = linear_fwd(u, p["in_proj.weight"], p.get("in_proj.bias"))
    z, xBC, dt = zxbcdt[:, :I], zxbcdt[:, I:I + cd], zxbcdt[:, I + cd:]
    xBC, c["conv"] = conv1d_fwd(xBC, p["conv1d.weight"], p.get("conv1d.bias"), act=True)
    x = xBC[:, :I].reshape(T, nh, P)
    B = xBC[:, I:I + G * N].reshape(T, G, N)
    C = xBC[:, I + G * N:].reshape(T, G, N)
    y, c["ssd"] = mamba2_ssd_fwd(x, dt, p["dt_bias"], p["A_log"], B, C, p["D"], dt_limit)
    yn, c["norm"] = gated_rmsnorm_fwd(y.reshape(T, I), z, p["norm.weight"], eps, group_size)
    out, c["out"] = linear_fwd(yn, p["out_proj.weight"], p.get("out_proj.bias"))
    return out, c


def mamba2_mixer_bwd(dout, c):
    g = {}
    go = linear_bwd(dout, c["out"])
    _add(g, go, {"W": "out_proj.weight", "b": "out_proj.bias"})
    gn = gated_rmsnorm_bwd(go["x"], c["norm"])
    g["norm.weight"] = gn["w"]
    T = gn["y"].shape[0]
    x = c["ssd"][0]
    gs = mamba2_ssd_bwd(gn["y"].reshape(x.shape), c["ssd"])
    _add(g, gs, {"dt_bias": "dt_bias", "A_log": "A_log", "D": "D"})
    dxBC = np.concatenate([gs["x"].reshape(T, -1), gs["B"].reshape(T, -1), gs["C"].reshape(T, -1)], axis=1)
    gc = conv1d_bwd(dxBC, c["conv"])
    _add(g, gc, {"w": "conv1d.weight", "b": "conv1d.bias"})
    gi = linear_bwd(np.concatenate([gn["z"], gc["x"], gs["dt"]], axis=1), c["in"])
    _add(g, gi, {"W": "in_proj.weight", "b": "in_proj.bias"})
    return gi["x"], g


def attention_fwd(p, u, heads, kv_heads, hd, rot, theta, scale=None, qk_norm_eps=None):
    """p: q_proj/k_proj/v_proj.weight [+ .bias], o_proj.weight, [q_norm.weight, k_norm.weight].
    Order as hybrid_ref.attention: project, (q/k RMSNorm per head), RoPE, causal GQA softmax."""
    T = u.shape[0]
    c = {}
    q, c["q"] = linear_fwd(u, p["q_proj.weight"], p.get("q_proj.bias"))
    k, c["k"] = linear_fwd(u, p["k_proj.weight"], p.get("k_proj.bias"))
    v, c["v"] = linear_fwd(u, p["v_proj.weight"], p.get("v_proj.bias"))
    q, k, v = q.reshape(T, heads, hd), k.reshape(T, kv_heads, hd), v.reshape(T, kv_heads, hd)
    if qk_norm_eps is not None:
        q, c["qn"] = rmsnorm_fwd(q, p["q_norm.weight"], qk_norm_eps)
        k, c["kn"] = rmsnorm_fwd(k, p["k_norm.weight"], qk_norm_eps)
    q, c["qr"] = rope_fwd(q, rot, theta)
    k, c["kr"] = rope_fwd(k, rot, theta)
    y, c["sdpa"] = sdpa_fwd(q, k, v, hd ** -0.5 if scale is None else scale)
    out, c["o"] = linear_fwd(y.reshape(T, heads * hd), p["o_proj.weight"])
    return out, c


def attention_bwd(dout, c):
    g = {}
    go = linear_bwd(dout, c["o"])
    g["o_proj.weight"] = go["W"]
    q = c["sdpa"][0]
    T = q.shape[0]
    ga = sdpa_bwd(go["x"].reshape(q.shape), c["sdpa"])
    dq = rope_bwd(ga["q"], c["qr"])["x"]
    dk = rope_bwd(ga["k"], c["kr"])["x"]
    dv = ga["v"]
    if "qn" in c:
        gq = rmsnorm_bwd(dq, c["qn"])
        gk = rmsnorm_bwd(dk, c["kn"])
        dq, dk = gq["x"], gk["x"]
        g["q_norm.weight"], g["k_norm.weight"] = gq["w"], gk["w"]
    du = 0.0
    for n, d in (("q", dq), ("k", dk), ("v", dv)):
        gl = linear_bwd(d.reshape(T, -1), c[n])
        _add(g, gl, {"W": n + "_proj.weight", "b": n + "_proj.bias"})
        du = du + gl["x"]
    return du, g


def mlp_fwd(p, u, act, gated=True):
    """gated: down(act(gate u) * up u); else down(act(up u)).  p: gate_proj/up_proj/down_proj.weight."""
    c = {"gated": gated}
    b, c["up"] = linear_fwd(u, p["up_proj.weight"])
    if gated:
        a, c["gate"] = linear_fwd(u, p["gate_proj.weight"])
        fa, c["act"] = act_fwd(a, act)
        m = fa * b
        c["fa"], c["b"] = fa, b
    else:
        m, c["act"] = act_fwd(b, act)
    out, c["down"] = linear_fwd(m, p["down_proj.weight"])
    return out, c


def mlp_bwd(dout, c):
    g = {}
    gd = linear_bwd(dout, c["down"])
    g["down_proj.weight"] = gd["W"]
    dm = gd["x"]
    if c["gated"]:
        gu = linear_bwd(dm * c["fa"], c["up"])
        gg = linear_bwd(act_bwd(dm * c["b"], c["act"])["x"], c["gate"])
        g["gate_proj.weight"] = gg["W"]
        g["up_proj.weight"] = gu["W"]
        return gu["x"] + gg["x"], g
    gu = linear_bwd(act_bwd(dm, c["act"])["x"], c["up"])
    g["up_proj.weight"] = gu["W"]
    return gu["x"], g


def m2d_mixer_fwd(p, u, I, nh, G, N, conv_act=False):
    """The discrete Mamba-2 mixer. p: in_proj.weight (2I+2GN+nh, H) as [x, B, C, z, A~]
    [+ bias], conv1d.weight (I+2GN, 1, K) [+ bias], D (nh), z_bias (I; only without the
    projection biases), out_proj.weight (H, I) [+ bias].  out = out_proj(y * silu(z + z_bias))."""
    T = u.shape[0]
    P = I // nh
    cd = I + 2 * G * N
    c = {}
    proj, c["in"] = linear_fwd(u, p["in_proj.weight"], p.get("in_proj.bias"))
    xBC, z, a_raw = proj[:, :cd], proj[:, cd:cd + I], proj[:, cd + I:]
    xBC, c["conv"] = conv1d_fwd(xBC, p["conv1d.weight"], p.get("conv1d.bias"), act=conv_act)
    x = xBC[:, :I].reshape(T, nh, P)
    B = xBC[:, I:I + G * N].reshape(T, G, N)
    C = xBC[:, I + G * N:].reshape(T, G, N)
    y, c["ssd"] = ssd_discrete_fwd(x, a_raw, B, C, p["D"])
    y = y.reshape(T, I)
    zb = z + p["z_bias"] if "z_bias" in p else z
    c["gate"] = (y, zb, "z_bias" in p)
    out, c["out"] = linear_fwd(y * silu(zb), p["out_proj.weight"], p.get("out_proj.bias"))
    return out, c


def m2d_mixer_bwd(dout, c):
    g = {}
    go = linear_bwd(dout, c["out"])
    _add(g, go, {"W": "out_proj.weight", "b": "out_proj.bias"})
    y, zb, has_z_bias = c["gate"]
    dy = go["x"] * silu(zb)
    dz = go["x"] * y * dsilu(zb)
    if has_z_bias:
        g["z_bias"] = dz.sum(axis=0)
    T = y.shape[0]
    gs = ssd_discrete_bwd(dy.reshape(c["ssd"][0].shape), c["ssd"])
    g["D"] = gs["D"]
    dxBC = np.concatenate([gs["x"].reshape(T, -1), gs["B"].reshape(T, -1), gs["C"].reshape(T, -1)], axis=1)
    gc = conv1d_bwd(dxBC, c["conv"])
    _add(g, gc, {"w": "conv1d.weight", "b": "conv1d.bias"})
    gi = linear_bwd(np.concatenate([gc["x"], dz, gs["a_raw"]], axis=1), c["in"])
    _add(g, gi, {"W": "in_proj.weight", "b": "in_proj.bias"})
    return gi["x"], g


# --------------------------------------------------------------------------------------------
# Whole hybridlm model (docs/model-format.md): forward to the loss, backward to every tensor.
#   h = E[ids]; per layer h += mixer(rmsnorm(h)); [h += mlp(rmsnorm(h))]; logits = rmsnorm(h) W_head^T
#   loss = cross-entropy of logits[t] against targets[t] (default ids[t+1]), mean over predicted.
# --------------------------------------------------------------------------------------------


def hybridlm_dims(c):
    """The sizes hybrid_ref.hybridlm_forward derives from a config, as a dict."""
    H = int(c["hidden_size"])
    ssm, att, mc = c.get("ssm", {}), c.get("attention", {}), c.get("mlp", {})
    R = ssm.get("dt_rank", "auto")
    heads = int(att.get("num_heads", 8))
    hd = int(att.get("head_dim", H // heads))
    d = {"H": H, "V": int(c["vocab_size"]), "eps": float(c.get("rms_norm_eps", 1e-5)),
         "I": int(ssm.get("expand", 2) * H), "N": int(ssm.get("d_state", 16)),
         "R": math.ceil(H / 16) if R == "auto" else int(R),
         "P": int(ssm.get("head_dim", 64)), "G": int(ssm.get("n_groups", 1)),
         "heads": heads, "kv_heads": int(att.get("num_kv_heads", heads)), "hd": hd,
         "rot": int(float(att.get("partial_rotary_factor", 1.0)) * hd),
         "theta": float(att.get("rope_theta", 10000.0)), "qk_norm": bool(att.get("qk_norm", False)),
         "F": int(mc.get("intermediate_size", 0)), "act": mc.get("activation", "silu"),
         "gated": bool(mc.get("gated", True)), "tie": bool(c.get("tie_word_embeddings", True))}
    return d


def _sub(w, prefix):
    return {n[len(prefix):]: a for n, a in w.items() if n.startswith(prefix)}


def hybridlm_loss_fwd(c, w, ids, targets=None, norm_groups="grouped"):
    """c: config dict; w: {tensor name: float64 array}.  Returns (loss, cache); cache["logits"]."""
    d = hybridlm_dims(c)
    ids = np.asarray(ids, dtype=np.int64)
    if targets is None:
        targets = np.concatenate([ids[1:], [-1]])
    cache = {"layers": []}
    h, cache["emb"] = embedding_fwd(ids, w["model.embed_tokens.weight"])
    for i, kind in enumerate(c["block_pattern"]):
        pre = "model.layers.%d." % i
        lc = {"kind": kind}
        u, lc["mn"] = rmsnorm_fwd(h, w[pre + "mixer_norm.weight"], d["eps"])
        p = _sub(w, pre + "mixer.")
        if kind == "m":
            o, lc["mix"] = mamba1_mixer_fwd(p, u, d["I"], d["N"], d["R"])
        elif kind == "m2":
            gs = d["I"] // d["G"] if norm_groups == "grouped" else d["I"]
            o, lc["mix"] = mamba2_mixer_fwd(p, u, d["I"], d["I"] // d["P"], d["G"], d["N"], d["eps"], gs)
        elif kind == "m2d":
            o, lc["mix"] = m2d_mixer_fwd(p, u, d["I"], d["I"] // d["P"], d["G"], d["N"])
        elif kind == "t":
            o, lc["mix"] = attention_fwd(p, u, d["heads"], d["kv_heads"], d["hd"], d["rot"], d["theta"],
                                         qk_norm_eps=d["eps"] if d["qk_norm"] else None)
        else:
            raise ValueError("unknown block kind %r" % kind)
        h = h + o
        if d["F"] > 0:
            u, lc["fn"] = rmsnorm_fwd(h, w[pre + "ffn_norm.weight"], d["eps"])
            o, lc["ffn"] = mlp_fwd(_sub(w, pre + "ffn."), u, d["act"], d["gated"])
            h = h + o
        cache["layers"].append(lc)
    hn, cache["norm"] = rmsnorm_fwd(h, w["model.norm.weight"], d["eps"])
    head = w["model.embed_tokens.weight"] if d["tie"] else w["lm_head.weight"]
    logits, cache["head"] = linear_fwd(hn, head)
    loss, cache["ce"] = cross_entropy_fwd(logits, targets)
    cache["logits"], cache["tie"] = logits, d["tie"]
    return loss, cache


def hybridlm_loss_bwd(cache, dloss=1.0):
    """{tensor name: dloss/dtensor} for every tensor the forward read."""
    g = {}
    dlogits = cross_entropy_bwd(dloss, cache["ce"])["logits"]
    gh = linear_bwd(dlogits, cache["head"])
    head_name = "model.embed_tokens.weight" if cache["tie"] else "lm_head.weight"
    g[head_name] = gh["W"]
    gn = rmsnorm_bwd(gh["x"], cache["norm"])
    g["model.norm.weight"] = gn["w"]
    dh = gn["x"]
    for i in range(len(cache["layers"]) - 1, -1, -1):
        lc = cache["layers"][i]
        pre = "model.layers.%d." % i
        if "ffn" in lc:
            du, gp = mlp_bwd(dh, lc["ffn"])
            g.update({pre + "ffn." + n: a for n, a in gp.items()})
            gf = rmsnorm_bwd(du, lc["fn"])
            g[pre + "ffn_norm.weight"] = gf["w"]
            dh = dh + gf["x"]
        bwd = {"m": mamba1_mixer_bwd, "m2": mamba2_mixer_bwd, "m2d": m2d_mixer_bwd, "t": attention_bwd}[lc["kind"]]
        du, gp = bwd(dh, lc["mix"])
        g.update({pre + "mixer." + n: a for n, a in gp.items()})
        gm = rmsnorm_bwd(du, lc["mn"])
        g[pre + "mixer_norm.weight"] = gm["w"]
        dh = dh + gm["x"]
    ge = embedding_bwd(dh, cache["emb"])["W"]
    name = "model.embed_tokens.weight"
    g[name] = g[name] + ge if name in g else ge  # tied: head and embedding gradients add
    return g
