#!/usr/bin/python3
"""Self-check of the numpy reference (mamba_ref.py) and the checkpoint writer; no engine needed.

  (a) Mamba-2 sequential recurrence == an independent chunked SSD computation (chunk Q,
      segment sums inside a chunk, state passed between chunks), T not a multiple of Q.
  (b) Mamba-1 / FalconMamba with d_inner = d_state = dt_rank = H = 1, and Mamba-2 with every
      size 1 (with and without a time_step_limit clamp), against closed forms (geometric
      series of the scalar recurrence); the causal conv's tap order.
  (c) Mamba-2 gated norm: grouped == full when n_groups == 1, different when n_groups > 1.
  (d) Tied head: logits == h @ embeddings.T, no lm_head.weight on disk; untied uses lm_head.
  (e) Writer: safetensors header layout, bf16 round-to-nearest-even, shards / embedding alias /
      on-disk dtype do not change the model.

Usage: test_selfcheck.py SCRATCH_DIR.  Prints one line per case and "N passed, M failed".
"""

import json
import math
import os
import shutil
import struct
import sys
import traceback

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree clean
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))

import mamba_ref  # noqa: E402
import make_test_checkpoint  # noqa: E402

SCRATCH = None
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def make(name, *args):
    """Write a checkpoint with make_test_checkpoint into SCRATCH/name; returns its path."""
    out = os.path.join(SCRATCH, name)
    make_test_checkpoint.main(["--out", out] + list(args))
    return out


def assert_close(got, want, tol, what):
    err = float(np.max(np.abs(np.asarray(got) - np.asarray(want))))
    scale = max(1.0, float(np.max(np.abs(want))))
    if not err <= tol * scale:
        raise AssertionError("%s: max|diff| %.3e > %.1e * %.3g" % (what, err, tol, scale))


# ---------------------------------------------------------------------------------------------
# (a) chunked SSD
# ---------------------------------------------------------------------------------------------


def ssd_chunked(x, delta, A, B, C, D, heads_per_group, Q):
    """Chunked SSD ("Transformers are SSMs", Sec. 6), written independently of mamba2_scan.

    x: (T, nh, P); delta: (T, nh); A: (nh,); B, C: (T, G, N); D: (nh,) -> (T, nh, P)
    """
    T, nh, P = x.shape
    N = B.shape[2]
    n_chunks = -(-T // Q)
    pad = n_chunks * Q - T
    # Padded steps have delta = 0: no decay (a = 0) and no input (x*delta = 0).
    xp = np.concatenate([x, np.zeros((pad, nh, P))])
    dp = np.concatenate([delta, np.zeros((pad, nh))])
    Bh = np.repeat(np.concatenate([B, np.zeros((pad,) + B.shape[1:])]), heads_per_group, axis=1)
    Ch = np.repeat(np.concatenate([C, np.zeros((pad,) + C.shape[1:])]), heads_per_group, axis=1)
    xbar = xp * dp[:, :, None]                        # (T', nh, P)
    a = dp * A[None, :]                               # (T', nh)
    y = np.zeros_like(xp)
    S_in = np.zeros((nh, P, N))                       # state entering the chunk
    for c in range(n_chunks):
        sl = slice(c * Q, (c + 1) * Q)
        s = np.cumsum(a[sl], axis=0)                  # (Q, nh) cumulative log-decay
        # segsum[i, j, h] = s_i - s_j for j <= i, -inf above the diagonal
        seg = s[:, None, :] - s[None, :, :]
        seg[np.triu_indices(Q, 1)] = -np.inf
        Lmat = np.exp(seg)                            # (Q, Q, nh)
        CB = np.einsum("ihn,jhn->ijh", Ch[sl], Bh[sl])  # (Q, Q, nh)
        y_diag = np.einsum("ijh,jhp->ihp", Lmat * CB, xbar[sl])
        y_off = np.exp(s)[:, :, None] * np.einsum("ihn,hpn->ihp", Ch[sl], S_in)
        y[sl] = y_diag + y_off
        decay_to_end = np.exp(s[-1][None, :] - s)     # (Q, nh)
        S_chunk = np.einsum("jh,jhp,jhn->hpn", decay_to_end, xbar[sl], Bh[sl])
        S_in = np.exp(s[-1])[:, None, None] * S_in + S_chunk
    y = y[:T] + D[None, :, None] * x
    return y


@case
def a_ssd_chunked_equals_sequential():
    rng = np.random.default_rng(11)
    for T, Q, nh, P, G, N in [(37, 16, 4, 3, 2, 5), (16, 16, 2, 2, 1, 3), (5, 16, 2, 4, 2, 12),
                              (64, 8, 6, 2, 3, 4), (1, 4, 1, 1, 1, 1)]:
        x = rng.standard_normal((T, nh, P))
        delta = np.exp(rng.uniform(math.log(1e-3), math.log(1.0), (T, nh)))
        A = -rng.uniform(1.0, 16.0, nh)
        B = rng.standard_normal((T, G, N))
        C = rng.standard_normal((T, G, N))
        D = rng.standard_normal(nh)
        seq = mamba_ref.mamba2_scan(x, delta, A, B, C, D, nh // G)
        chk = ssd_chunked(x, delta, A, B, C, D, nh // G, Q)
        assert_close(seq, chk, 1e-12, "T=%d Q=%d nh=%d G=%d" % (T, Q, nh, G))


# ---------------------------------------------------------------------------------------------
# (b) Mamba-1 closed form
# ---------------------------------------------------------------------------------------------


def scalar_mamba1_model(falcon):
    """H = I = N = R = 1, K = 2, 1 layer, vocab 3, tied; every weight a chosen scalar.

    RMSNorm of a single value is x / sqrt(x^2 + eps), close to sign(x) for a small eps, which
    would hide errors; the eps values are large so every step shows in the logits.
    """
    c = dict(model_type="falcon_mamba" if falcon else "mamba", hidden_size=1,
             num_hidden_layers=1, vocab_size=3, state_size=1, intermediate_size=1,
             conv_kernel=2, time_step_rank=1, use_bias=False, use_conv_bias=True,
             layer_norm_epsilon=0.8, tie_word_embeddings=True, mixer_rms_eps=0.3)
    v = dict(E=[0.7, -1.3, 2.1], wn=1.2, a=0.9, b=-0.6, w0=0.4, w1=1.5, cb=0.1,
             p0=0.8, p1=-1.1, p2=0.5, q=0.7, qb=-1.5, A_log=math.log(2.5), D=0.3, o=1.7,
             wf=0.9)
    p = "backbone.layers.0."
    w = {
        "backbone.embeddings.weight": np.array(v["E"]).reshape(3, 1),
        p + "norm.weight": np.array([v["wn"]]),
        p + "mixer.in_proj.weight": np.array([[v["a"]], [v["b"]]]),
        p + "mixer.conv1d.weight": np.array([v["w0"], v["w1"]]).reshape(1, 1, 2),
        p + "mixer.conv1d.bias": np.array([v["cb"]]),
        p + "mixer.x_proj.weight": np.array([[v["p0"]], [v["p1"]], [v["p2"]]]),
        p + "mixer.dt_proj.weight": np.array([[v["q"]]]),
        p + "mixer.dt_proj.bias": np.array([v["qb"]]),
        p + "mixer.A_log": np.array([[v["A_log"]]]),
        p + "mixer.D": np.array([v["D"]]),
        p + "mixer.out_proj.weight": np.array([[v["o"]]]),
        "backbone.norm_f.weight": np.array([v["wf"]]),
    }
    return mamba_ref.Model(c, w), v


def scalar_mamba1_closed_form(v, token, T, falcon):
    """Logits (T, 3) for T repeats of `token`, by hand.

    The input is constant, so the conv output takes one value at t = 0 (zero history: only tap
    K-1 = w1 sees the input) and another for t >= 1 (w0 + w1).  Then, with a = exp(delta A) and
    b = delta B x for t >= 1:  h_t = a^t h_0 + b (1 - a^t) / (1 - a).
    """
    eps, meps = 0.8, 0.3
    silu = lambda s: s / (1.0 + math.exp(-s))
    nrm = (lambda s: s / math.sqrt(s * s + meps)) if falcon else (lambda s: s)
    u = v["E"][token]
    n = v["wn"] * u / math.sqrt(u * u + eps)
    x_in, z = v["a"] * n, v["b"] * n
    xc = [silu(v["w1"] * x_in + v["cb"]), silu((v["w0"] + v["w1"]) * x_in + v["cb"])]
    A = -math.exp(v["A_log"])
    delta = [math.log1p(math.exp(v["q"] * nrm(v["p0"] * s) + v["qb"])) for s in xc]
    Bv = [nrm(v["p1"] * s) for s in xc]
    Cv = [nrm(v["p2"] * s) for s in xc]
    h0 = delta[0] * Bv[0] * xc[0]
    a1 = math.exp(delta[1] * A)
    b1 = delta[1] * Bv[1] * xc[1]
    out = np.zeros((T, 3))
    for t in range(T):
        k = min(t, 1)
        h = h0 if t == 0 else a1 ** t * h0 + b1 * (1.0 - a1 ** t) / (1.0 - a1)
        y = (h * Cv[k] + v["D"] * xc[k]) * silu(z)
        r = u + v["o"] * y
        nf = v["wf"] * r / math.sqrt(r * r + eps)
        out[t] = np.array(v["E"]) * nf
    return out


@case
def b_mamba1_closed_form():
    for falcon in (False, True):
        m, v = scalar_mamba1_model(falcon)
        for token in range(3):
            T = 9
            got = mamba_ref.forward(m, [token] * T)
            want = scalar_mamba1_closed_form(v, token, T, falcon)
            assert_close(got, want, 1e-12, "falcon=%s token=%d" % (falcon, token))


def scalar_mamba2(limit):
    """H = I = P = N = nh = G = 1, K = 1, 1 layer, vocab 3, tied; returns (model, closed form).

    Constant input and K = 1 make x, B, C, delta constant, so
    S_t = a S_{t-1} + delta x B  =>  S_t = delta x B (1 - a^(t+1)) / (1 - a),  a = exp(delta A).
    """
    eps = 0.7
    c = dict(model_type="mamba2", hidden_size=1, num_hidden_layers=1, vocab_size=3,
             state_size=1, num_heads=1, head_dim=1, n_groups=1, expand=1, conv_kernel=1,
             use_bias=False, use_conv_bias=True, layer_norm_epsilon=eps,
             tie_word_embeddings=True, time_step_limit=list(limit))
    v = dict(E=[0.7, -1.3, 2.1], wn=1.2, rows=[0.9, -0.6, 1.1, -0.8, 0.5], cw=[1.3, 0.7, -1.2],
             cb=[0.1, -0.2, 0.3], dt_bias=-0.4, A_log=math.log(1.7), D=0.6, gw=1.1, o=1.4,
             wf=0.9)
    p = "backbone.layers.0."
    w = {
        "backbone.embeddings.weight": np.array(v["E"]).reshape(3, 1),
        p + "norm.weight": np.array([v["wn"]]),
        p + "mixer.in_proj.weight": np.array(v["rows"]).reshape(5, 1),   # [z, x, B, C, dt]
        p + "mixer.conv1d.weight": np.array(v["cw"]).reshape(3, 1, 1),  # over [x, B, C]
        p + "mixer.conv1d.bias": np.array(v["cb"]),
        p + "mixer.dt_bias": np.array([v["dt_bias"]]),
        p + "mixer.A_log": np.array([v["A_log"]]),
        p + "mixer.D": np.array([v["D"]]),
        p + "mixer.norm.weight": np.array([v["gw"]]),
        p + "mixer.out_proj.weight": np.array([[v["o"]]]),
        "backbone.norm_f.weight": np.array([v["wf"]]),
    }
    silu = lambda s: s / (1.0 + math.exp(-s))

    def closed_form(token, T):
        u = v["E"][token]
        n = v["wn"] * u / math.sqrt(u * u + eps)
        z, xr, Br, Cr, dt = (r * n for r in v["rows"])
        x, B, C = (silu(cw * s + cb) for cw, s, cb in zip(v["cw"], (xr, Br, Cr), v["cb"]))
        delta = min(max(math.log1p(math.exp(dt + v["dt_bias"])), limit[0]), limit[1])
        a = math.exp(-delta * math.exp(v["A_log"]))
        out = np.zeros((T, 3))
        for t in range(T):
            S = delta * x * B * (1.0 - a ** (t + 1)) / (1.0 - a)
            g = (S * C + v["D"] * x) * silu(z)
            r = u + v["o"] * v["gw"] * g / math.sqrt(g * g + eps)
            out[t] = np.array(v["E"]) * v["wf"] * r / math.sqrt(r * r + eps)
        return out

    return mamba_ref.Model(c, w), closed_form


@case
def b_mamba2_closed_form():
    for limit in ((0.0, float("inf")), (0.0, 0.05), (0.9, float("inf"))):
        m, closed_form = scalar_mamba2(limit)
        for token in range(3):
            got = mamba_ref.forward(m, [token] * 7)
            assert_close(got, closed_form(token, 7), 1e-12, "limit=%s token=%d" % (limit, token))


@case
def b_causal_conv_tap_order():
    x = np.array([[1.0], [2.0], [3.0], [4.0]])
    w = np.array([10.0, 100.0, 1000.0]).reshape(1, 1, 3)
    got = mamba_ref.causal_conv1d(x, w, np.array([0.5]))[:, 0]
    # out[t] = w0 x[t-2] + w1 x[t-1] + w2 x[t] + bias, zero history
    want = [1000.5, 2100.5, 3210.5, 4320.5]
    assert_close(got, want, 1e-15, "conv")


# ---------------------------------------------------------------------------------------------
# (c) grouped vs full gated norm
# ---------------------------------------------------------------------------------------------


@case
def c_grouped_vs_full_norm():
    ids = np.random.default_rng(3).integers(0, 512, 24)
    m1 = mamba_ref.load_model(make("norm_g1", "--preset", "mamba2-tiny"))
    d1 = np.max(np.abs(mamba_ref.forward(m1, ids, "grouped") - mamba_ref.forward(m1, ids, "full")))
    assert d1 <= 1e-12, "n_groups 1: grouped and full differ by %.3e" % d1
    for G in (2, 4):
        mg = mamba_ref.load_model(make("norm_g%d" % G, "--preset", "mamba2-tiny",
                                       "--set", "n_groups=%d" % G))
        dg = np.max(np.abs(mamba_ref.forward(mg, ids, "grouped") - mamba_ref.forward(mg, ids, "full")))
        assert dg > 1e-2, "n_groups %d: grouped and full agree (%.3e); switch has no effect" % (G, dg)


# ---------------------------------------------------------------------------------------------
# (d) tied / untied head, with an independent safetensors header read
# ---------------------------------------------------------------------------------------------


def raw_tensor(path, name):
    """(header entry, float64 array) read straight from the file, not via mamba_ref."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        if name not in header:
            return header, None
        e = header[name]
        b, end = e["data_offsets"]
        f.seek(8 + n + b)
        raw = f.read(end - b)
    assert e["dtype"] == "F32", e["dtype"]
    return header, np.frombuffer(raw, "<f4").astype(np.float64).reshape(e["shape"])


@case
def d_tied_and_untied_head():
    ids = np.random.default_rng(4).integers(0, 512, 17)
    for preset in ("mamba-tiny", "mamba2-tiny"):
        tied = make("tied_" + preset, "--preset", preset, "--tie")
        path = os.path.join(tied, "model.safetensors")
        header, E = raw_tensor(path, "backbone.embeddings.weight")
        assert "lm_head.weight" not in header, "tied checkpoint carries lm_head.weight"
        m = mamba_ref.load_model(tied)
        h = mamba_ref.backbone(m, ids)
        assert_close(mamba_ref.forward(m, ids), h @ E.T, 1e-13, preset + " tied")

        untied = make("untied_" + preset, "--preset", preset, "--untie")
        path = os.path.join(untied, "model.safetensors")
        _, W = raw_tensor(path, "lm_head.weight")
        assert W is not None, "untied checkpoint lacks lm_head.weight"
        m = mamba_ref.load_model(untied)
        h = mamba_ref.backbone(m, ids)
        assert_close(mamba_ref.forward(m, ids), h @ W.T, 1e-13, preset + " untied")
        # The head really is used: the embeddings would give something else.
        _, E = raw_tensor(path, "backbone.embeddings.weight")
        assert np.max(np.abs(h @ E.T - h @ W.T)) > 1e-1


# ---------------------------------------------------------------------------------------------
# (e) writer
# ---------------------------------------------------------------------------------------------


@case
def e_safetensors_layout():
    for args in (["--preset", "mamba-tiny"], ["--preset", "mamba2-tiny", "--dtype", "bf16",
                                              "--shards", "3"]):
        d = make("layout", *args)
        index = os.path.join(d, "model.safetensors.index.json")
        files = (sorted(set(json.load(open(index))["weight_map"].values()))
                 if os.path.exists(index) else ["model.safetensors"])
        total = 0
        for fname in files:
            path = os.path.join(d, fname)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                text = f.read(n).decode("utf-8")
            assert n % 8 == 0, "header length %d not a multiple of 8" % n
            assert text.rstrip(" ").endswith("}"), "header padding is not spaces: %r" % text[-9:]
            header = json.loads(text)
            entries = sorted((e["data_offsets"], e) for k, e in header.items() if k != "__metadata__")
            offset = 0
            for (b, end), e in entries:
                size = {"F32": 4, "BF16": 2, "F16": 2}[e["dtype"]] * int(np.prod(e["shape"]))
                assert b == offset and end - b == size, (b, end, offset, size)
                offset = end
            assert os.path.getsize(path) == 8 + n + offset
            total += offset
        if os.path.exists(index):
            assert json.load(open(index))["metadata"]["total_size"] == total
            assert len(files) == 3


@case
def e_bf16_round_to_nearest_even():
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0xBF817FFF,
                     0x7F7FFFFF - 0x10000], dtype=np.uint32)
    want = np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F81, 0xBF81, 0x7F7F], dtype=np.uint16)
    got = make_test_checkpoint.to_disk(bits.view(np.float32), "bf16").view(np.uint16)
    assert np.array_equal(got, want), [hex(g) for g in got]


@case
def e_variants_give_same_model():
    ids = np.random.default_rng(5).integers(0, 512, 21)
    for preset in ("mamba-tiny", "mamba2-tiny"):
        base = mamba_ref.forward(mamba_ref.load_model(make("v_base", "--preset", preset)), ids)
        for extra in (["--shards", "2"], ["--embedding-name", "embedding"]):
            other = mamba_ref.forward(mamba_ref.load_model(make("v_x", "--preset", preset, *extra)),
                                      ids)
            assert np.array_equal(base, other), "%s %s changed the logits" % (preset, extra)
        # bf16 on disk rounds each weight by at most 2^-9 relative; the model moves a little.
        m32 = mamba_ref.load_model(make("v_f32", "--preset", preset))
        m16 = mamba_ref.load_model(make("v_bf16", "--preset", preset, "--dtype", "bf16"))
        for name, a in m32.w.items():
            b = m16.w[name]
            assert np.all(np.abs(a - b) <= np.abs(a) * 2.0 ** -8), name
        bf = mamba_ref.forward(m16, ids)
        assert 0 < np.max(np.abs(bf - base)) < 0.1 * max(1.0, np.max(np.abs(base)))


# ---------------------------------------------------------------------------------------------
# (f) discrete Mamba-2 (Llamba) against the reference code's own formulation
# ---------------------------------------------------------------------------------------------


@case
def f_discrete_mamba2_equals_the_ssd_call_of_the_reference_code():
    """hybrid_ref.discrete_mamba2 writes the recurrence directly (decay exp(-softplus(A~)), input
    x B^T). cartesia / phi-mamba reach it through the Mamba-2 kernel with x / softplus(A~),
    dt = softplus(A~) and A = -1; in float64 the divide is harmless, so the two must agree."""
    import hybrid_ref  # noqa: E402 (tests/reference, on the path)
    rng = np.random.default_rng(21)
    H, I, nv, G, N, K = 8, 12, 4, 2, 3, 4
    T, P, conv_dim = 23, I // nv, I + 2 * G * N
    W = 2 * I + 2 * G * N + nv
    t = {"m.in_proj.weight": rng.standard_normal((W, H)) * 0.5,
         "m.conv1d.weight": rng.standard_normal((conv_dim, 1, K)),
         "m.conv1d.bias": rng.standard_normal(conv_dim) * 0.1, "m.D": rng.standard_normal(nv),
         "m.z_bias": rng.standard_normal(I) * 0.1, "m.out_proj.weight": rng.standard_normal((H, I))}
    t["m.in_proj.weight"][-nv:] *= 6.0  # decays from ~0 to ~1
    u = rng.standard_normal((T, H))
    got = hybrid_ref.discrete_mamba2(hybrid_ref.Weights(t), "m.", u, H, I, nv, G, N, K, False, True)
    proj = u @ t["m.in_proj.weight"].T
    xBC = mamba_ref.causal_conv1d(proj[:, :conv_dim], t["m.conv1d.weight"], t["m.conv1d.bias"])
    z, a = proj[:, conv_dim:conv_dim + I], proj[:, conv_dim + I:]
    dt = mamba_ref.softplus(a)
    x = xBC[:, :I].reshape(T, nv, P)
    y = mamba_ref.mamba2_scan(x / dt[:, :, None], dt, -np.ones(nv), xBC[:, I:I + G * N].reshape(T, G, N),
                              xBC[:, I + G * N:].reshape(T, G, N), np.zeros(nv), nv // G)
    y = y + t["m.D"][None, :, None] * x
    want = (y.reshape(T, I) * mamba_ref.silu(z + t["m.z_bias"])) @ t["m.out_proj.weight"].T
    assert_close(got, want, 1e-11, "discrete Mamba-2 vs x / softplus, dt = softplus, A = -1")


@case
def g_chunked_gated_delta_rule_equals_its_recurrence():
    """hybrid_ref.gated_delta_rule_chunked (the WY / UT-transform form the engine's prefill uses)
    against hybrid_ref.gated_delta_rule (the recurrence, as Qwen3-Next's torch reference): chunk
    remainders, one and several chunks, from a non-zero state, decays from ~1 to ~e^-50."""
    import hybrid_ref  # noqa: E402 (tests/reference, on the path)
    rng = np.random.default_rng(7)
    for T, chunk in [(1, 64), (63, 64), (64, 64), (65, 64), (130, 64), (200, 64), (37, 16), (100, 8)]:
        nv, dk, dv = 2, 12, 20
        q, k = rng.standard_normal((T, nv, dk)), rng.standard_normal((T, nv, dk))
        v = rng.standard_normal((T, nv, dv))
        g = -rng.uniform(0.1, 16.0, nv) * np.logaddexp(0.0, 2.0 * rng.standard_normal((T, nv)))
        beta = 1.0 / (1.0 + np.exp(-2.0 * rng.standard_normal((T, nv))))
        S0 = 0.5 * rng.standard_normal((nv, dk, dv))
        o1, S1 = hybrid_ref.gated_delta_rule(q, k, v, g, beta, S0)
        o2, S2 = hybrid_ref.gated_delta_rule_chunked(q, k, v, g, beta, chunk, S0)
        assert_close(o2, o1, 1e-11, "chunked vs recurrent output, T=%d chunk=%d" % (T, chunk))
        assert_close(S2, S1, 1e-11, "chunked vs recurrent state, T=%d chunk=%d" % (T, chunk))


def main():
    global SCRATCH
    if len(sys.argv) != 2:
        sys.exit("usage: test_selfcheck.py SCRATCH_DIR")
    SCRATCH = sys.argv[1]
    shutil.rmtree(SCRATCH, ignore_errors=True)
    os.makedirs(SCRATCH)
    passed = failed = 0
    for fn in CASES:
        try:
            fn()
            print("PASS %s" % fn.__name__)
            passed += 1
        except (Exception, SystemExit) as e:  # report every case, then fail at the end
            print("FAIL %s: %s" % (fn.__name__, e))
            traceback.print_exc(file=sys.stdout)
            failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
