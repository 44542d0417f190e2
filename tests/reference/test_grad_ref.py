#!/usr/bin/python3
"""Checks the hand-written backward passes of grad_ref.py against central finite differences.

For every op: random small shapes, a fixed random cotangent R, the scalar f = sum(out * R) (the
loss itself for cross-entropy). For every input and parameter X, the analytic gradient
op_bwd(R, cache)[X] is compared with the central difference
    fd_i = (f(X + eps e_i) - f(X - eps e_i)) / (2 eps),   float64,
over all coordinates i (ops, mixers) or a random sample of them (the whole model). eps = 1e-6,
except 1e-5 for the mixers and MLP alone: there some tensors' gradients (A_log, dt_proj) are ~1e-3 of the
output's scale, so the rounding error of the difference, ~1e-16 |f| / eps, reaches ~2e-7 of them
at 1e-6 (measured: it scales as 1/eps, so it is not the backward) while the O(eps^2) truncation
error stays ~1e-8. In the whole model the truncation error dominates instead (3e-7 at eps 1e-5,
scaling as eps^2), so it keeps 1e-6 (errors ~3e-8). The error of a
tensor is the relative max-norm error
    err = max_i |fd_i - g_i| / max(max_i |g_i|, max_i |fd_i|, 1e-8)
over the checked coordinates, and must be <= 1e-6 (issue 16). Per op the worst tensor is printed.

Also: each op's forward equals the oracle's (mamba_ref / hybrid_ref) to 1e-12, the whole model's
logits equal hybrid_ref.hybridlm_forward's, and the checker itself rejects a gradient with one
coordinate off by 1e-5 relative (so a broken backward cannot pass).

Whole model: block pattern [m, m2, t, m2d], each block with a gated MLP, final norm, tied (and
untied) head, cross-entropy over predicted positions; the loss gradient w.r.t. every tensor
(sampled coordinates).

States: the gradients w.r.t. the final SSM / conv state (bwd's dh_final, dS_final, dstate_next) by
finite differences, and the chunk-by-chunk backward (each chunk recomputed from the state that
entered it, the state gradient carried backwards) equal to the whole-sequence one.

Usage: test_grad_ref.py.  Prints PASS/FAIL lines and "N passed, M failed"; exit 1 on a failure.
"""

import os
import sys
import time
import traceback

import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import grad_ref as gr  # noqa: E402
import hybrid_ref  # noqa: E402
import mamba_ref  # noqa: E402

EPS = 1e-6
EPS_MIXER = 1e-5
TOL = 1e-6
FLOOR = 1e-8
CASES = []
ERRORS = {}  # case name -> (max err, tensor)


def case(fn):
    CASES.append(fn)
    return fn


def rel_err(fd, g):
    den = max(float(np.max(np.abs(g))), float(np.max(np.abs(fd))), FLOOR)
    return float(np.max(np.abs(fd - g))) / den


def fd_grad(f, inputs, key, coords, eps=EPS):
    """Central differences of f(inputs) w.r.t. inputs[key] at the flat indices coords."""
    X = inputs[key]
    flat = X.reshape(-1)  # a view: X is contiguous
    out = np.zeros(len(coords))
    for j, i in enumerate(coords):
        old = flat[i]
        flat[i] = old + eps
        fp = f(inputs)
        flat[i] = old - eps
        fm = f(inputs)
        flat[i] = old
        out[j] = (fp - fm) / (2 * eps)
    return out


def check_grads(name, f, inputs, grads, rng, sample=None, keys=None, eps=EPS):
    """FD-check grads[k] for k in keys (default: every float input).  Records the worst error."""
    worst, worst_key = 0.0, None
    for k in (keys if keys is not None else inputs):
        X = inputs[k]
        if not isinstance(X, np.ndarray) or X.dtype != np.float64:
            continue
        if k not in grads:
            raise AssertionError("%s: no gradient for %s" % (name, k))
        g = np.asarray(grads[k]).reshape(-1)
        if g.size != X.size:
            raise AssertionError("%s: gradient of %s has %d entries, want %d" % (name, k, g.size, X.size))
        coords = np.arange(X.size)
        if sample is not None and X.size > sample:
            coords = np.sort(rng.choice(X.size, sample, replace=False))
        e = rel_err(fd_grad(f, inputs, k, coords, eps), g[coords])
        if e > TOL:
            raise AssertionError("%s: d/d%s relative error %.3e > %.0e" % (name, k, e, TOL))
        if e >= worst:
            worst, worst_key = e, k
    prev = ERRORS.get(name, (0.0, None))
    ERRORS[name] = max(prev, (worst, worst_key), key=lambda t: t[0])


def check_op(name, fwd, bwd, inputs, rng, sample=None):
    """fwd(**inputs) -> (out, cache); f = sum(out * R) with a fixed random R; bwd(R, cache)."""
    inputs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
    out, cache = fwd(**inputs)
    R = rng.standard_normal(np.shape(out))
    grads = bwd(R, cache)
    check_grads(name, lambda inp: float(np.sum(fwd(**inp)[0] * R)), inputs, grads, rng, sample)


def same(got, want, what, tol=1e-12):
    err = float(np.max(np.abs(np.asarray(got) - np.asarray(want))))
    scale = max(1.0, float(np.max(np.abs(want))))
    if not err <= tol * scale:
        raise AssertionError("%s: differs from the reference by %.3e" % (what, err))


def rn(rng, *shape, s=1.0):
    return rng.standard_normal(shape) * s


# ---------------------------------------------------------------------------------------------
# The checker itself
# ---------------------------------------------------------------------------------------------


@case
def checker_rejects_wrong_gradient(rng):
    W = rn(rng, 4, 3)
    x = rn(rng, 5, 3)
    f = lambda inp: float(np.sum((inp["x"] @ inp["W"].T) ** 2))
    good = {"W": 2 * (x @ W.T).T @ x, "x": 2 * (x @ W.T) @ W}
    check_grads("checker", f, {"W": W.copy(), "x": x.copy()}, good, rng)
    for k in good:
        bad = dict(good)
        bad[k] = good[k].copy()
        bad[k].reshape(-1)[2] *= 1.0 + 1e-5
        try:
            check_grads("checker(bad)", f, {"W": W.copy(), "x": x.copy()}, bad, rng)
        except AssertionError:
            continue
        raise AssertionError("checker accepted a gradient of %s off by 1e-5 relative" % k)
    ERRORS.pop("checker(bad)", None)
    ERRORS.pop("checker", None)


# ---------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------


@case
def activations(rng):
    x = rn(rng, 6, 5, s=2.0)
    for kind in ("silu", "gelu", "gelu_tanh", "relu2"):
        check_op("act " + kind, lambda x: gr.act_fwd(x, kind), gr.act_bwd, {"x": x}, rng)
    same(gr.act_fwd(x, "gelu_pytorch_tanh")[0], gr.act_fwd(x, "gelu_tanh")[0], "HF alias")
    same(gr.act_fwd(x, "silu")[0], hybrid_ref.ACTS["silu"](x), "silu")
    same(gr.act_fwd(x, "gelu")[0], hybrid_ref.ACTS["gelu"](x), "gelu")
    same(gr.act_fwd(x, "relu2")[0], hybrid_ref.ACTS["relu2"](x), "relu2")
    # gelu_tanh is the tanh approximation: within 1e-3 of the exact gelu
    same(gr.act_fwd(x, "gelu_tanh")[0], hybrid_ref.ACTS["gelu"](x), "gelu_tanh ~ gelu", tol=1e-3)


@case
def embedding(rng):
    ids = np.array([3, 1, 3, 0, 6, 3])  # repeats accumulate
    check_op("embedding", lambda W: gr.embedding_fwd(ids, W), gr.embedding_bwd, {"W": rn(rng, 7, 5)}, rng)


@case
def linear(rng):
    x, W, b = rn(rng, 5, 4), rn(rng, 3, 4), rn(rng, 3)
    check_op("linear", gr.linear_fwd, gr.linear_bwd, {"x": x, "W": W, "b": b}, rng)
    check_op("linear", gr.linear_fwd, gr.linear_bwd, {"x": x, "W": W}, rng)
    same(gr.linear_fwd(x, W, b)[0], mamba_ref.linear(x, W, b), "linear")


@case
def rmsnorm(rng):
    x, w = rn(rng, 5, 6), rn(rng, 6)
    check_op("rmsnorm", lambda x, w: gr.rmsnorm_fwd(x, w, 1e-5), gr.rmsnorm_bwd, {"x": x, "w": w}, rng)
    check_op("rmsnorm", lambda x: gr.rmsnorm_fwd(x, None, 1e-6), gr.rmsnorm_bwd, {"x": x}, rng)
    x3, w3 = rn(rng, 4, 3, 6), rn(rng, 6)  # per head, as the q/k norms
    check_op("rmsnorm", lambda x, w: gr.rmsnorm_fwd(x, w, 1e-5), gr.rmsnorm_bwd, {"x": x3, "w": w3}, rng)
    same(gr.rmsnorm_fwd(x, w, 1e-5)[0], mamba_ref.rmsnorm(x, w, 1e-5), "rmsnorm")


@case
def gated_rmsnorm(rng):
    T, I = 4, 12
    y, z, w = rn(rng, T, I), rn(rng, T, I), rn(rng, I)
    for gs in (4, 12):  # grouped (G = 3) and full width
        fwd = lambda y, z, w: gr.gated_rmsnorm_fwd(y, z, w, 1e-5, gs)
        check_op("gated_rmsnorm", fwd, gr.gated_rmsnorm_bwd, {"y": y, "z": z, "w": w}, rng)
        same(fwd(y, z, w)[0], mamba_ref.gated_rmsnorm(y, z, w, 1e-5, gs), "gated_rmsnorm")


@case
def conv1d(rng):
    T, C, K = 6, 3, 4
    x, w, b, st = rn(rng, T, C), rn(rng, C, 1, K), rn(rng, C), rn(rng, K - 1, C)
    check_op("conv1d", lambda x, w, b, state: gr.conv1d_fwd(x, w, b, state, act=True), gr.conv1d_bwd,
             {"x": x, "w": w, "b": b, "state": st}, rng)
    check_op("conv1d", lambda x, w: gr.conv1d_fwd(x, w, None, None, act=False), gr.conv1d_bwd,
             {"x": x, "w": w}, rng)
    check_op("conv1d", lambda x, w: gr.conv1d_fwd(x, w, None, None, act=False), gr.conv1d_bwd,
             {"x": x[:2], "w": w}, rng)  # T < K - 1
    same(gr.conv1d_fwd(x, w, b, None, act=False)[0], mamba_ref.causal_conv1d(x, w, b), "conv1d")
    # with a state: the same as running on [state; x] and keeping the last T outputs
    same(gr.conv1d_fwd(x, w, b, st, act=False)[0],
         mamba_ref.causal_conv1d(np.concatenate([st, x]), w, b)[K - 1:], "conv1d state")


@case
def mamba1_scan(rng):
    T, I, N = 6, 3, 4
    inp = {"x": rn(rng, T, I), "dt": rn(rng, T, I), "A_log": rn(rng, I, N, s=0.5),
           "B": rn(rng, T, N), "C": rn(rng, T, N), "D": rn(rng, I), "z": rn(rng, T, I),
           "h0": rn(rng, I, N)}
    check_op("mamba1_scan", gr.mamba1_scan_fwd, gr.mamba1_scan_bwd, inp, rng)
    no_z = {k: v for k, v in inp.items() if k not in ("z", "h0")}
    check_op("mamba1_scan", gr.mamba1_scan_fwd, gr.mamba1_scan_bwd, no_z, rng)
    want = mamba_ref.mamba1_scan(inp["x"], mamba_ref.softplus(inp["dt"]), -np.exp(inp["A_log"]),
                                 inp["B"], inp["C"], inp["D"]) * mamba_ref.silu(inp["z"])
    same(gr.mamba1_scan_fwd(**{k: v for k, v in inp.items() if k != "h0"})[0], want, "mamba1_scan")


@case
def mamba2_ssd(rng):
    T, nh, P, G, N = 6, 4, 3, 2, 3
    inp = {"x": rn(rng, T, nh, P), "dt": rn(rng, T, nh), "dt_bias": rn(rng, nh, s=0.5),
           "A_log": rn(rng, nh, s=0.5), "B": rn(rng, T, G, N), "C": rn(rng, T, G, N), "D": rn(rng, nh),
           "S0": rn(rng, nh, P, N)}
    check_op("mamba2_ssd", gr.mamba2_ssd_fwd, gr.mamba2_ssd_bwd, inp, rng)
    lim = (0.4, 1.2)  # some steps clamped on each side: zero gradient there
    sp = mamba_ref.softplus(inp["dt"] + inp["dt_bias"])
    assert (sp < lim[0]).any() and (sp > lim[1]).any()
    check_op("mamba2_ssd clamp", lambda **k: gr.mamba2_ssd_fwd(dt_limit=lim, **k), gr.mamba2_ssd_bwd, inp, rng)
    one = {k: v for k, v in inp.items() if k != "S0"}
    one["B"], one["C"] = inp["B"][:, :1], inp["C"][:, :1]  # G = 1
    check_op("mamba2_ssd", gr.mamba2_ssd_fwd, gr.mamba2_ssd_bwd, one, rng)
    want = mamba_ref.mamba2_scan(inp["x"], np.clip(sp, *lim), -np.exp(inp["A_log"]), inp["B"], inp["C"],
                                 inp["D"], nh // G)
    same(gr.mamba2_ssd_fwd(dt_limit=lim, **{k: v for k, v in inp.items() if k != "S0"})[0], want, "ssd")


@case
def ssd_discrete(rng):
    T, nh, P, G, N = 6, 4, 3, 2, 3
    inp = {"x": rn(rng, T, nh, P), "a_raw": rn(rng, T, nh), "B": rn(rng, T, G, N), "C": rn(rng, T, G, N),
           "D": rn(rng, nh), "S0": rn(rng, nh, P, N)}
    check_op("ssd_discrete", gr.ssd_discrete_fwd, gr.ssd_discrete_bwd, inp, rng)
    one = {k: v for k, v in inp.items() if k != "S0"}
    one["B"], one["C"] = inp["B"][:, :1], inp["C"][:, :1]  # G = 1
    check_op("ssd_discrete", gr.ssd_discrete_fwd, gr.ssd_discrete_bwd, one, rng)
    # The same recurrence as Mamba-2's with dt = softplus(A~), A = -1 and x / dt as the input.
    sp = mamba_ref.softplus(inp["a_raw"])
    want = mamba_ref.mamba2_scan(inp["x"] / sp[:, :, None], sp, -np.ones(nh), inp["B"], inp["C"], np.zeros(nh),
                                 nh // G) + inp["D"][None, :, None] * inp["x"]
    same(gr.ssd_discrete_fwd(**{k: v for k, v in inp.items() if k != "S0"})[0], want, "ssd_discrete", 1e-10)


def check_with_final_state(name, fwd, bwd, inputs, final_of, kw, rng):
    """f = sum(out * R) + <final state, R2>: the final-state gradient argument kw of bwd."""
    inputs = {k: v.copy() for k, v in inputs.items()}
    out, cache = fwd(**inputs)
    R, R2 = rng.standard_normal(out.shape), rng.standard_normal(final_of(cache).shape)
    grads = bwd(R, cache, **{kw: R2})

    def f(inp):
        o, c = fwd(**inp)
        return float(np.sum(o * R) + np.sum(final_of(c) * R2))
    check_grads(name, f, inputs, grads, rng)


def check_chunked(name, fwd, bwd, inputs, time_keys, state_in, final_of, kw, Q, rng):
    """Run fwd chunk by chunk (Q steps each, the state passed on) and bwd in reverse, carrying
    the state gradient (bwd's kw = the next chunk's d<state_in>): the outputs and the gradients
    (time-indexed ones concatenated, the rest summed) equal the unchunked op's to 1e-12.  This
    is the recompute-from-chunk-boundaries scheme of docs/derivations/."""
    out, cache = fwd(**inputs)
    R = rng.standard_normal(out.shape)
    want = bwd(R, cache)
    T = out.shape[0]
    caches, outs, st = [], [], inputs.get(state_in)
    for t0 in range(0, T, Q):
        part = {k: (v[t0:t0 + Q] if k in time_keys else v) for k, v in inputs.items()}
        part[state_in] = st
        o, c = fwd(**part)
        outs.append(o)
        caches.append((t0, c))
        st = final_of(c).copy()
    same(np.concatenate(outs), out, name + " chunked forward")
    got, carry = {}, None
    for t0, c in reversed(caches):
        g = bwd(R[t0:t0 + Q], c, **{kw: carry})
        carry = g[state_in]
        for k, v in g.items():
            if k in time_keys:
                got.setdefault(k, {})[t0] = v
            elif k != state_in:
                got[k] = got.get(k, 0.0) + v
    got[state_in] = carry
    for k, v in want.items():
        gk = np.concatenate([got[k][t0] for t0 in sorted(got[k])]) if k in time_keys else got[k]
        same(gk, v, "%s chunked d%s" % (name, k))


@case
def chunked_states(rng):
    """Final-state gradients by FD, and chunk-by-chunk backward == the whole-sequence one."""
    T, I, N, K = 7, 3, 2, 4
    m1 = {"x": rn(rng, T, I), "dt": rn(rng, T, I), "A_log": rn(rng, I, N, s=0.5), "B": rn(rng, T, N),
          "C": rn(rng, T, N), "D": rn(rng, I), "z": rn(rng, T, I), "h0": rn(rng, I, N)}
    fin1 = lambda c: c[-2][-1]
    check_with_final_state("mamba1_scan", gr.mamba1_scan_fwd, gr.mamba1_scan_bwd, m1, fin1, "dh_final", rng)
    check_chunked("mamba1_scan", gr.mamba1_scan_fwd, gr.mamba1_scan_bwd, m1, ("x", "dt", "B", "C", "z"),
                  "h0", fin1, "dh_final", 3, rng)
    nh, P, G = 4, 2, 2
    m2 = {"x": rn(rng, T, nh, P), "dt": rn(rng, T, nh), "dt_bias": rn(rng, nh, s=0.5),
          "A_log": rn(rng, nh, s=0.5), "B": rn(rng, T, G, N), "C": rn(rng, T, G, N), "D": rn(rng, nh),
          "S0": rn(rng, nh, P, N)}
    fin2 = lambda c: c[-1][-1]
    check_with_final_state("mamba2_ssd", gr.mamba2_ssd_fwd, gr.mamba2_ssd_bwd, m2, fin2, "dS_final", rng)
    check_chunked("mamba2_ssd", gr.mamba2_ssd_fwd, gr.mamba2_ssd_bwd, m2, ("x", "dt", "B", "C"),
                  "S0", fin2, "dS_final", 3, rng)
    md = {"x": rn(rng, T, nh, P), "a_raw": rn(rng, T, nh), "B": rn(rng, T, G, N), "C": rn(rng, T, G, N),
          "D": rn(rng, nh), "S0": rn(rng, nh, P, N)}
    check_with_final_state("ssd_discrete", gr.ssd_discrete_fwd, gr.ssd_discrete_bwd, md, fin2, "dS_final", rng)
    check_chunked("ssd_discrete", gr.ssd_discrete_fwd, gr.ssd_discrete_bwd, md, ("x", "a_raw", "B", "C"),
                  "S0", fin2, "dS_final", 3, rng)
    cv = {"x": rn(rng, T, I), "w": rn(rng, I, 1, K), "b": rn(rng, I), "state": rn(rng, K - 1, I)}
    fin3 = lambda c: c[0][-(K - 1):]
    check_with_final_state("conv1d", gr.conv1d_fwd, gr.conv1d_bwd, cv, fin3, "dstate_next", rng)
    for Q in (3, 2):  # Q < K - 1: the next state reaches back into the previous chunk's state
        check_chunked("conv1d", gr.conv1d_fwd, gr.conv1d_bwd, cv, ("x",), "state", fin3,
                      "dstate_next", Q, rng)


@case
def rope(rng):
    x = rn(rng, 5, 3, 8)
    for rot, pos0 in ((8, 0), (4, 3), (0, 0)):
        check_op("rope", lambda x: gr.rope_fwd(x, rot, 100.0, pos0), gr.rope_bwd, {"x": x}, rng)
    same(gr.rope_fwd(x, 4, 100.0)[0], hybrid_ref.rope(x, 4, 100.0), "rope")


@case
def sdpa(rng):
    T, heads, kv, hd = 5, 4, 2, 3
    inp = {"q": rn(rng, T, heads, hd), "k": rn(rng, T, kv, hd), "v": rn(rng, T, kv, hd)}
    check_op("sdpa", lambda q, k, v: gr.sdpa_fwd(q, k, v, 0.7), gr.sdpa_bwd, inp, rng)


@case
def cross_entropy(rng):
    logits = rn(rng, 5, 7, s=2.0)
    targets = np.array([2, 0, -1, 6, 2])  # one position not predicted
    loss, cache = gr.cross_entropy_fwd(logits, targets)
    g = gr.cross_entropy_bwd(1.0, cache)["logits"]
    check_grads("cross_entropy", lambda inp: gr.cross_entropy_fwd(inp["logits"], targets)[0],
                {"logits": logits.copy()}, {"logits": g}, rng)
    lse = np.log(np.sum(np.exp(logits), axis=1))
    want = np.mean([lse[t] - logits[t, targets[t]] for t in (0, 1, 3, 4)])
    same(loss, want, "cross_entropy")
    if np.any(g[2] != 0):
        raise AssertionError("cross_entropy: gradient at a position not predicted")


def params_op(name, fwd, bwd, p, u, rng, sample):
    """A mixer / MLP: fwd(p, u) -> (out, cache), bwd -> (du, {param: grad}); check du and all params."""
    inputs = {("p:" + k): v.copy() for k, v in p.items()}
    inputs["u"] = u.copy()
    run = lambda inp: fwd({k[2:]: v for k, v in inp.items() if k.startswith("p:")}, inp["u"])
    out, cache = run(inputs)
    R = rng.standard_normal(out.shape)
    du, gp = bwd(R, cache)
    grads = {("p:" + k): v for k, v in gp.items()}
    grads["u"] = du
    check_grads(name, lambda inp: float(np.sum(run(inp)[0] * R)), inputs, grads, rng, sample,
                eps=EPS_MIXER)
    return out


def as_weights(p, prefix):
    return hybrid_ref.Weights({prefix + k: v for k, v in p.items()})


@case
def mlp(rng):
    T, H, F = 4, 5, 6
    u = rn(rng, T, H)
    p = {"gate_proj.weight": rn(rng, F, H), "up_proj.weight": rn(rng, F, H), "down_proj.weight": rn(rng, H, F)}
    for act in ("silu", "gelu", "gelu_tanh", "relu2"):
        for gated in (True, False):
            q = p if gated else {k: v for k, v in p.items() if k != "gate_proj.weight"}
            out = params_op("mlp", lambda p, u: gr.mlp_fwd(p, u, act, gated), gr.mlp_bwd, q, u, rng, None)
            if act != "gelu_tanh":
                same(out, hybrid_ref.mlp(as_weights(q, ""), "", u, H, F, act, gated), "mlp " + act)


@case
def attention(rng):
    T, H, heads, kv, hd = 5, 6, 4, 2, 4
    u = rn(rng, T, H)
    p = {"q_proj.weight": rn(rng, heads * hd, H, s=0.5), "k_proj.weight": rn(rng, kv * hd, H, s=0.5),
         "v_proj.weight": rn(rng, kv * hd, H), "o_proj.weight": rn(rng, H, heads * hd),
         "q_proj.bias": rn(rng, heads * hd), "k_proj.bias": rn(rng, kv * hd), "v_proj.bias": rn(rng, kv * hd),
         "q_norm.weight": rn(rng, hd), "k_norm.weight": rn(rng, hd)}
    fwd = lambda p, u: gr.attention_fwd(p, u, heads, kv, hd, 2, 50.0, qk_norm_eps=1e-5)
    out = params_op("attention", fwd, gr.attention_bwd, p, u, rng, None)
    same(out, hybrid_ref.attention(as_weights(p, ""), "", u, H, heads, kv, hd, 2, 50.0, bias=True,
                                   qk_norm_eps=1e-5), "attention")
    plain = {k: v for k, v in p.items() if "bias" not in k and "norm" not in k}
    fwd = lambda p, u: gr.attention_fwd(p, u, heads, kv, hd, hd, 10000.0)
    params_op("attention", fwd, gr.attention_bwd, plain, u, rng, None)


def mamba1_params(rng, H, I, N, R, K, bias):
    p = {"in_proj.weight": rn(rng, 2 * I, H, s=0.5), "conv1d.weight": rn(rng, I, 1, K, s=0.5),
         "conv1d.bias": rn(rng, I, s=0.3), "x_proj.weight": rn(rng, R + 2 * N, I, s=0.5),
         "dt_proj.weight": rn(rng, I, R, s=0.5), "dt_proj.bias": rn(rng, I, s=0.5) - 1.0,
         "A_log": np.log(np.tile(np.arange(1.0, N + 1), (I, 1))) + rn(rng, I, N, s=0.1),
         "D": rn(rng, I), "out_proj.weight": rn(rng, H, I, s=0.5)}
    if bias:
        p["in_proj.bias"], p["out_proj.bias"] = rn(rng, 2 * I, s=0.3), rn(rng, H, s=0.3)
    return p


def mamba2_params(rng, H, I, nh, G, N, K, bias):
    cd, W = I + 2 * G * N, 2 * I + 2 * G * N + nh
    p = {"in_proj.weight": rn(rng, W, H, s=0.5), "conv1d.weight": rn(rng, cd, 1, K, s=0.5),
         "conv1d.bias": rn(rng, cd, s=0.3), "dt_bias": rn(rng, nh, s=0.5) - 1.0,
         "A_log": rn(rng, nh, s=0.5), "D": rn(rng, nh), "norm.weight": 1.0 + rn(rng, I, s=0.2),
         "out_proj.weight": rn(rng, H, I, s=0.5)}
    if bias:
        p["in_proj.bias"], p["out_proj.bias"] = rn(rng, W, s=0.3), rn(rng, H, s=0.3)
    return p


@case
def mamba1_mixer(rng):
    T, H, I, N, R, K = 5, 4, 6, 3, 2, 3
    u = rn(rng, T, H)
    p = mamba1_params(rng, H, I, N, R, K, bias=True)
    out = params_op("mamba1_mixer", lambda p, u: gr.mamba1_mixer_fwd(p, u, I, N, R), gr.mamba1_mixer_bwd,
                    p, u, rng, None)
    same(out, hybrid_ref.mamba1(as_weights(p, ""), "", u, H, I, N, R, K, True, True), "mamba1_mixer")


@case
def mamba2_mixer(rng):
    T, H, I, nh, G, N, K = 5, 4, 8, 4, 2, 3, 3
    u = rn(rng, T, H)
    p = mamba2_params(rng, H, I, nh, G, N, K, bias=True)
    for gs in (I // G, I):
        fwd = lambda p, u: gr.mamba2_mixer_fwd(p, u, I, nh, G, N, 1e-5, gs)
        out = params_op("mamba2_mixer", fwd, gr.mamba2_mixer_bwd, p, u, rng, None)
        same(out, hybrid_ref.mamba2(as_weights(p, ""), "", u, H, I, nh, G, N, K, True, True, 1e-5, gs),
             "mamba2_mixer")


def m2d_params(rng, H, I, nh, G, N, K, bias):
    cd, W = I + 2 * G * N, 2 * I + 2 * G * N + nh
    p = {"in_proj.weight": rn(rng, W, H, s=0.5), "conv1d.weight": rn(rng, cd, 1, K, s=0.5),
         "conv1d.bias": rn(rng, cd, s=0.3), "D": rn(rng, nh), "out_proj.weight": rn(rng, H, I, s=0.5)}
    if bias:
        p["in_proj.bias"], p["out_proj.bias"] = rn(rng, W, s=0.3), rn(rng, H, s=0.3)
    else:
        p["z_bias"] = rn(rng, I, s=0.3)
    return p


@case
def m2d_mixer(rng):
    T, H, I, nh, G, N, K = 5, 4, 8, 4, 2, 3, 3
    u = rn(rng, T, H)
    for bias in (False, True):
        p = m2d_params(rng, H, I, nh, G, N, K, bias)
        fwd = lambda p, u: gr.m2d_mixer_fwd(p, u, I, nh, G, N)
        out = params_op("m2d_mixer", fwd, gr.m2d_mixer_bwd, p, u, rng, None)
        same(out, hybrid_ref.discrete_mamba2(as_weights(p, ""), "", u, H, I, nh, G, N, K, bias, True),
             "m2d_mixer")


# ---------------------------------------------------------------------------------------------
# Whole model
# ---------------------------------------------------------------------------------------------


def tiny_model(rng, tie):
    c = {"model_type": "hybridlm", "hidden_size": 8, "vocab_size": 11, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": tie, "block_pattern": ["m", "m2", "t", "m2d"],
         "ssm": {"d_state": 3, "d_conv": 3, "expand": 2, "dt_rank": 2, "head_dim": 4, "n_groups": 2,
                 "conv_bias": True, "proj_bias": False},
         "attention": {"num_heads": 4, "num_kv_heads": 2, "head_dim": 4, "rope_theta": 100.0,
                       "partial_rotary_factor": 0.5, "qk_norm": True, "bias": False},
         "mlp": {"intermediate_size": 12, "activation": "silu", "gated": True}}
    d = gr.hybridlm_dims(c)
    H, I = d["H"], d["I"]
    w = {"model.embed_tokens.weight": rn(rng, d["V"], H), "model.norm.weight": 1.0 + rn(rng, H, s=0.2)}
    if not tie:
        w["lm_head.weight"] = rn(rng, d["V"], H)
    blocks = {"m": mamba1_params(rng, H, I, d["N"], d["R"], 3, False),
              "m2": mamba2_params(rng, H, I, I // d["P"], d["G"], d["N"], 3, False),
              "m2d": m2d_params(rng, H, I, I // d["P"], d["G"], d["N"], 3, False),
              "t": {"q_proj.weight": rn(rng, 16, H, s=0.5), "k_proj.weight": rn(rng, 8, H, s=0.5),
                    "v_proj.weight": rn(rng, 8, H), "o_proj.weight": rn(rng, H, 16, s=0.5),
                    "q_norm.weight": 1.0 + rn(rng, 4, s=0.2), "k_norm.weight": 1.0 + rn(rng, 4, s=0.2)}}
    for i, kind in enumerate(c["block_pattern"]):
        pre = "model.layers.%d." % i
        w[pre + "mixer_norm.weight"] = 1.0 + rn(rng, H, s=0.2)
        w[pre + "ffn_norm.weight"] = 1.0 + rn(rng, H, s=0.2)
        w.update({pre + "mixer." + k: v for k, v in blocks[kind].items()})
        w.update({pre + "ffn." + k: rn(rng, *s, s=0.5) for k, s in
                  (("gate_proj.weight", (12, H)), ("up_proj.weight", (12, H)), ("down_proj.weight", (H, 12)))})
    return c, w


@case
def whole_model(rng):
    ids = np.array([1, 5, 2, 9, 5, 0, 7])
    for tie in (True, False):
        c, w = tiny_model(rng, tie)
        loss, cache = gr.hybridlm_loss_fwd(c, w, ids)
        weights = hybrid_ref.Weights(w)
        same(cache["logits"], hybrid_ref.hybridlm_forward(c, weights, ids, "grouped"), "model logits")
        unused = set(w) - weights.used
        if unused:
            raise AssertionError("tiny model has tensors hybrid_ref never reads: %s" % sorted(unused))
        g = gr.hybridlm_loss_bwd(cache)
        if set(g) != set(w):
            raise AssertionError("gradient names differ: %s" % sorted(set(g) ^ set(w)))
        name = "model m,m2,t,m2d " + ("tied" if tie else "untied")
        check_grads(name, lambda inp: gr.hybridlm_loss_fwd(c, inp, ids)[0], w, g, rng, sample=40)


def main():
    t0 = time.time()
    passed = failed = 0
    for n, fn in enumerate(CASES):
        rng = np.random.default_rng(1234 + n)
        try:
            fn(rng)
            print("PASS %s" % fn.__name__)
            passed += 1
        except Exception:  # noqa: BLE001 - report and go on
            print("FAIL %s" % fn.__name__)
            traceback.print_exc(file=sys.stdout)
            failed += 1
    print("\nmax relative error (FD vs hand-written backward), worst tensor per op:")
    for name, (e, k) in ERRORS.items():
        print("  %-28s %.2e  (%s)" % (name, e, k))
    print("\n%d passed, %d failed in %.1f s" % (passed, failed, time.time() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
