#!/usr/bin/env python3
"""The hybridlm CLI contract: subcommands, flags, exit codes (0 ok, 1 user error, 2 usage), the .npy
output of `score`, and one-line error messages that name the problem.

Run as the other CLI tests are (cli_common.py).
"""
import json
import os
import shutil

import numpy as np

from cli_common import check, expect_error, finish, make_model, run, scratch, start

start()
m2 = make_model("m2", "mamba2-tiny", 5)
m1 = make_model("m1", "mamba-tiny", 6)

# --help everywhere, usage errors exit 2.
for sub in ["generate", "score", "perplexity", "tokenize", "inspect", "bench"]:
    rc, out, _ = run(sub, "--help")
    check(f"{sub} --help", rc == 0 and "-m" in out, out[:200])
check("no subcommand is a usage error", run()[0] == 2)
check("unknown flag is a usage error", run("generate", "-m", m2, "-p", "x", "--bogus")[0] == 2)
check("missing required flag is a usage error", run("score", "-m", m2)[0] == 2)

# tokenize: JSON ids and --decode back to the text.
text = "Hello world, state spaces!"
rc, out, err = run("tokenize", "-m", m2, "-p", text)
ids = json.loads(out) if rc == 0 else []
check("tokenize prints a JSON array of ids", rc == 0 and ids and all(isinstance(i, int) for i in ids), err)
rc, out, err = run("tokenize", "-m", m2, "--decode", ",".join(map(str, ids)))
check("tokenize --decode inverts tokenize", rc == 0 and out.rstrip("\n") == text, out)

# score: float32 (tokens, vocab) .npy, equal for --ids and -p of the same tokens.
npy = os.path.join(scratch, "a.npy")
rc, _, err = run("score", "-m", m2, "--ids", ",".join(map(str, ids)), "--logits-out", npy)
a = np.load(npy) if rc == 0 else None
check("score --ids writes float32 (tokens, vocab)", a is not None and a.dtype == np.float32 and a.shape == (len(ids), 50288), err)
rc, _, err = run("score", "-m", m2, "-p", text, "--logits-out", npy + "2.npy")
b = np.load(npy + "2.npy") if rc == 0 else None
check("score -p equals score --ids", b is not None and a is not None and np.array_equal(a, b), err)
rc, _, err = run("score", "-m", m2, "-p", text, "--logits-out", npy + "3.npy", "--no-mmap")
c3 = np.load(npy + "3.npy") if rc == 0 else None
check("weights used in place (mmap) equal weights copied (--no-mmap)", c3 is not None and np.array_equal(a, c3), err)

# generate: greedy is deterministic; the prompt is echoed; rates go to stderr.
rc1, out1, err1 = run("generate", "-m", m2, "-p", "Once upon a time", "-n", "12", "--temperature", "0")
rc2, out2, _ = run("generate", "-m", m2, "-p", "Once upon a time", "-n", "12", "--temperature", "0", "-t", "3")
check("generate greedy runs and streams text", rc1 == 0 and out1.startswith("Once upon a time") and len(out1) > 16, err1)
check("generate reports tokens/s on stderr", "prompt eval:" in err1 and "generation:" in err1 and "tokens/s" in err1, err1)
check("greedy output does not depend on thread count", out1 == out2, (out1, out2))
rc3, out3, _ = run("generate", "-m", m2, "-p", "Hi", "-n", "10", "--seed", "3", "--temperature", "1", "--top-k", "50", "--top-p", "0.9")
rc4, out4, _ = run("generate", "-m", m2, "-p", "Hi", "-n", "10", "--seed", "3", "--temperature", "1", "--top-k", "50", "--top-p", "0.9")
check("same seed, same sampled text", rc3 == 0 and out3 == out4)
rc, out, err = run("generate", "-m", m1, "-p", "The", "-n", "8", "--dtype", "bf16", "--temperature", "0")
check("generate --dtype bf16 on mamba-1", rc == 0 and out.startswith("The"), err)

# The demo checkpoint has 50288 embedding rows and a 50277-token tokenizer (as mamba-*-hf): ids the
# tokenizer cannot decode must never be sampled (review: a hot sample aborted generation).
rc, out, err = run("generate", "-m", m2, "-p", "Hello", "-n", "400", "--temperature", "50", "--top-k", "0",
                   "--top-p", "1", "--min-p", "0", "--seed", "2", "--ignore-eos")
check("hot sampling never picks ids beyond the tokenizer", rc == 0 and "generation: 400 tokens" in err, err[-300:])

# bench --json: one object per test with the documented keys (speed itself is never asserted).
rc, out, err = run("bench", "-m", m2, "-p", "16", "-n", "4", "-r", "2", "--batch", "3", "-t", "2", "--json")
try:
    rows = json.loads(out) if rc == 0 else []
except ValueError:
    rows = []
keys_ok = all(all(k in r for k in ["test", "threads", "batch", "tokens_per_second", "stddev", "peak_rss_bytes"])
              for r in rows)
check("bench --json rows for pp16 and tg4", [r.get("test") for r in rows] == ["pp16", "tg4"] and keys_ok and
      rows[1]["batch"] == 3 and rows[0]["threads"] == 2 and all(r["tokens_per_second"] > 0 for r in rows), out + err)

# plan: the Mamba-Codestral-7B record (64 layers x 128 heads x 64 x 128 state, bf16 = 128 MiB;
# conv 3 columns x (8192 + 2 x 8 x 128) channels x 64 layers), 0 KV bytes per token. Its
# torch_dtype bfloat16 (as on the hub) makes plan's default --dtype auto size bf16 weights.
codestral = os.path.join(scratch, "codestral.json")
with open(codestral, "w") as f:
    f.write('{"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 4096, '
            '"num_hidden_layers": 64, "num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8, '
            '"vocab_size": 32768, "expand": 2, "conv_kernel": 4, "tie_word_embeddings": false, '
            '"time_step_limit": [0.0, Infinity], "torch_dtype": "bfloat16"}')
plans = {}
for sd in ["bf16", "f32"]:
    rc, out, err = run("plan", "--config", codestral, "--state-dtype", sd, "--memory", "24GiB", "--context", "32768", "--json")
    plans[sd] = json.loads(out) if rc == 0 else {}
check("plan: Codestral SSM state 128 MiB at bf16, 256 MiB at f32",
      plans["bf16"].get("ssm_state_bytes_per_sequence") == 64 * 128 * 64 * 128 * 2 and
      plans["f32"].get("ssm_state_bytes_per_sequence") == 64 * 128 * 64 * 128 * 4, plans)
check("plan: Codestral conv state and 0 KV bytes per token",
      plans["bf16"].get("conv_state_bytes_per_sequence") == 3 * (8192 + 2 * 8 * 128) * 64 * 2 and
      plans["bf16"].get("kv_bytes_per_token") == 0, plans)
weights_bf16 = plans["bf16"].get("weight_bytes", 0) if plans["bf16"].get("dtype") == "bf16" else 0
per_seq = 64 * 128 * 64 * 128 * 2 + 3 * (8192 + 2 * 8 * 128) * 64 * 2
check("plan: max sequences = (memory - weights) / state",
      plans["bf16"].get("max_sequences") == (24 * 2**30 - weights_bf16) // per_seq, plans["bf16"])
rc, out, err = run("plan", "--config", codestral)
check("plan: human-readable output (default state f32: 256 MiB)", rc == 0 and "ssm 268435456 bytes (256.00 MiB)" in out, out + err)
for d in [m1, m2]:
    rc, out, _ = run("plan", "-m", d, "--json")
    rc2, out2, _ = run("inspect", "-m", d)
    want = int(out2.split("parameters:")[1].split()[0]) if rc2 == 0 else -1
    check("plan's parameter count (from config) equals the loader's (" + os.path.basename(d) + ")",
          rc == 0 and json.loads(out)["parameters"] == want, out + out2)
expect_error("plan: bad --memory", ["plan", "--config", codestral, "--memory", "lots"], 1, "--memory lots: expected a size")

# Every family generates from the CLI (sampling and beam search), and its plan matches its loader.
for preset in ["hybridlm-tiny", "jamba-tiny", "bamba-tiny", "granite-h-tiny", "nemotron-h-tiny", "falcon-h1-tiny",
               "zamba2-tiny", "lfm2-tiny",
               "lfm2-moe-tiny", "zamba-tiny", "qwen3-next-tiny", "qwen3.5-tiny",
               "qwen3.5-moe-tiny"]:
    d = make_model(preset, preset, 9)
    rc, out, err = run("generate", "-m", d, "-p", "Once upon a time", "-n", "8", "--seed", "3")
    check(f"generate works for {preset}", rc == 0 and out.startswith("Once upon a time") and "generation: 8 tokens" in err,
          out + err)
    rc, out, err = run("generate", "-m", d, "-p", "Once upon a time", "-n", "6", "--num-beams", "3", "--ignore-eos")
    check(f"generate --num-beams 3 works for {preset}", rc == 0 and out.startswith("Once upon a time") and
          "beam search: 3 beams, 6 tokens" in err, out + err)
    rc, out, _ = run("plan", "-m", d, "--json")
    rc2, out2, _ = run("inspect", "-m", d)
    want = int(out2.split("parameters:")[1].split()[0]) if rc2 == 0 else -1
    check(f"plan's parameter count equals the loader's ({preset})", rc == 0 and json.loads(out)["parameters"] == want,
          out + out2)
    # plan sizes the weights from the same tensor declarations and storage rule as the loader:
    # equal to the bytes a --no-mmap load holds, at every --dtype.
    for dt in ["f32", "bf16", "q8_0", "q4_0"]:
        rc, out, _ = run("plan", "-m", d, "--dtype", dt, "--json")
        rc2, out2, _ = run("inspect", "-m", d, "--dtype", dt, "--no-mmap")
        want = int(out2.split("weight bytes:")[1].split()[0]) if rc2 == 0 else -1
        check(f"plan's weight bytes equal the loaded model's ({preset}, {dt})",
              rc == 0 and json.loads(out)["weight_bytes"] == want, out + out2)
rc, out, err = run("generate", "-m", os.path.join(scratch, "jamba-tiny"), "-p", "Once", "-n", "3", "--mlock",
                   "--state-dtype", "bf16")
check("generate --mlock --state-dtype bf16 runs and reports peak RSS", rc == 0 and "peak RSS: " in err, out + err)
expect_error("generate: bad --state-dtype", ["generate", "-m", os.path.join(scratch, "jamba-tiny"), "-p", "x",
                                             "--state-dtype", "f8"], 1, "--state-dtype f8: use f32, bf16 or f16")
# --kv-dtype: bf16 by default on attention models; inspect, the run's stderr, bench and plan report
# the dtype actually used, and plan's default equals the runtime's.
jamba_dir = os.path.join(scratch, "jamba-tiny")
rc, out, err = run("inspect", "-m", jamba_dir)
rc2, out2, err2 = run("inspect", "-m", jamba_dir, "--kv-dtype", "f32")
kv_line = [l for l in out.splitlines() if l.startswith("kv / token:")]
kv_line2 = [l for l in out2.splitlines() if l.startswith("kv / token:")]
kv_bytes = int(kv_line[0].split()[3]) if kv_line else -1
kv_bytes2 = int(kv_line2[0].split()[3]) if kv_line2 else -1
check("inspect: KV bf16 by default, f32 with --kv-dtype f32 (twice the bytes)",
      rc == 0 and rc2 == 0 and "bf16 (--kv-dtype)" in kv_line[0] and "f32 (--kv-dtype)" in kv_line2[0] and
      kv_bytes > 0 and kv_bytes2 == 2 * kv_bytes, out + err + out2 + err2)
rc, out, err = run("plan", "-m", jamba_dir, "--json")
jd = json.loads(out) if rc == 0 else {}
check("plan: default --kv-dtype is the runtime's (bf16), with inspect's bytes per token",
      jd.get("kv_dtype") == "bf16" and jd.get("kv_bytes_per_token") == kv_bytes, out + err)
rc, out, err = run("generate", "-m", jamba_dir, "-p", "Once", "-n", "2", "--kv-dtype", "f16")
check("generate --kv-dtype f16 reports the cache it used", rc == 0 and "; KV f16, " in err, err)
ids40 = ",".join(str(i) for i in range(1, 41))
npy_f32, npy_bf16 = os.path.join(scratch, "kv_f32.npy"), os.path.join(scratch, "kv_bf16.npy")
rc, _, err = run("score", "-m", jamba_dir, "--ids", ids40, "--logits-out", npy_f32, "--kv-dtype", "f32")
rc2, _, err2 = run("score", "-m", jamba_dir, "--ids", ids40, "--logits-out", npy_bf16)
if rc == 0 and rc2 == 0:
    lf, lb = np.load(npy_f32).astype(np.float64), np.load(npy_bf16).astype(np.float64)
    rel = np.max(np.abs(lb - lf)) / max(1.0, np.max(np.abs(lf)))
else:
    rel = -1
# tests/numerics.h kKvBf16Model: 3e-2 of the logit scale.
check("score: bf16 KV (default) within 3e-2 of f32 KV, and not identical", 0 < rel < 3e-2 and "KV bf16" in err2,
      f"rel={rel} {err} {err2}")
rc, out, err = run("bench", "-m", jamba_dir, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--json", "--kv-dtype", "f16")
try:
    brows = json.loads(out) if rc == 0 else []
except ValueError:
    brows = []
check("bench --json reports the KV dtype and bytes", brows and all(r.get("kv_dtype") == "f16" and
      r.get("kv_bytes_per_token") == kv_bytes for r in brows), out + err)
expect_error("generate: bad --kv-dtype", ["generate", "-m", jamba_dir, "-p", "x", "--kv-dtype", "q8_0"], 1,
             "--kv-dtype q8_0: use f32, bf16 or f16")
expect_error("generate: prompt + -n beyond --ctx-size on an attention model",
             ["generate", "-m", os.path.join(scratch, "jamba-tiny"), "-p", "Once upon a time", "-n", "100",
              "--ctx-size", "50"], 1, "exceeds --ctx-size 50")

# plan for a Jamba-style hybrid (ai21labs AI21-Jamba-Mini-1.5 shape): 28 Mamba-1 layers of state
# (d_inner 8192 x d_state 16, conv 3 x 8192) plus 4 attention layers of KV (8 KV heads x 128).
jamba_cfg = os.path.join(scratch, "jamba.json")
with open(jamba_cfg, "w") as f:
    json.dump({"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "num_experts": 16, "num_experts_per_tok": 2, "vocab_size": 65536,
               "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2,
               "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2}, f)
rc, out, err = run("plan", "--config", jamba_cfg, "--state-dtype", "f32", "--kv-dtype", "bf16", "--context", "32768",
                   "--memory", "128GiB", "--json")
jp = json.loads(out) if rc == 0 else {}
check("plan: Jamba-style SSM state (28 x 8192 x 16 x f32) and conv state (28 x 3 x 8192 x f32)",
      jp.get("ssm_state_bytes_per_sequence") == 28 * 8192 * 16 * 4 and
      jp.get("conv_state_bytes_per_sequence") == 28 * 3 * 8192 * 4, jp or err)
check("plan: Jamba-style KV per token (4 layers x K,V x 8 heads x 128 x bf16) and both terms per sequence",
      jp.get("kv_bytes_per_token") == 4 * 2 * 8 * 128 * 2 and
      jp.get("bytes_per_sequence") == 28 * 8192 * 16 * 4 + 28 * 3 * 8192 * 4 + 4 * 2 * 8 * 128 * 2 * 32768, jp)
rc, out, err = run("plan", "--config", jamba_cfg)
check("plan: human-readable output shows the mamba state and the attention KV (bf16 by default)",
      rc == 0 and "mamba1    x28" in out and "attention x4" in out and "kv 16384 bytes per token" in out and
      "at --kv-dtype bf16" in out and
      "(mamba1+mlp, mamba1+moe, mamba1+mlp, mamba1+moe, attention+mlp, mamba1+moe, mamba1+mlp, mamba1+moe) x4" in out, out + err)

# perplexity and inspect.
txt = os.path.join(scratch, "t.txt")
with open(txt, "w") as f:
    f.write("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 4)
rc, out, err = run("perplexity", "-m", m2, "-f", txt, "--ctx", "16")
ok = rc == 0 and out.startswith("perplexity: ")
ppl = float(out.split()[1]) if ok else 0
check("perplexity prints a finite value", ok and 1 < ppl < 1e9, out + err)
# --dtype q4_0 where q8_0 runs: perplexity (close to f32's on random weights), bench (reports it).
rc, out, err = run("perplexity", "-m", m2, "-f", txt, "--ctx", "16", "--dtype", "q4_0")
ppl4 = float(out.split()[1]) if rc == 0 and out.startswith("perplexity: ") else 0
check("perplexity --dtype q4_0 runs, within 10% of f32's", abs(ppl4 / ppl - 1) < 0.1 if ppl else False, out + err)
rc, out, err = run("bench", "-m", m2, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--json", "--no-probe",
                   "--dtype", "q4_0")
try:
    brows = json.loads(out) if rc == 0 else []
except ValueError:
    brows = []
check("bench --dtype q4_0 reports its dtype", brows and all(r.get("dtype") == "q4_0" for r in brows), out + err)
rc, out, err = run("inspect", "-m", m1)
check("inspect names family, pattern, params, bytes, state",
      rc == 0 and all(k in out for k in ["family:         mamba", "layer pattern:  mamba1 x2", "parameters:", "weight bytes:", "state / seq:"]), out + err)

# Bad input: exit 1, one line naming the problem.
expect_error("id outside the vocabulary", ["score", "-m", m2, "--ids", "1,50288", "--logits-out", npy], 1,
             "token id 50288 is outside the vocabulary (size 50288)")
expect_error("logits too large to hold", ["score", "-m", m2, "--ids", ",".join(["1"] * 22000), "--logits-out", npy], 1,
             "of logits, over the 4.00 GiB limit")
expect_error("negative -n", ["generate", "-m", m2, "-p", "x", "-n", "-3"], 1, "-n/--n-predict must be >= 0")
expect_error("malformed --ids", ["score", "-m", m2, "--ids", "1,x", "--logits-out", npy], 1, "--ids: 'x' is not a token id")
expect_error("blank --ids item", ["score", "-m", m2, "--ids", "1, ,2", "--logits-out", npy], 1, "--ids: '' is not a token id")
expect_error("trailing comma in --ids", ["score", "-m", m2, "--ids", "1,2,", "--logits-out", npy], 1, "--ids: '' is not a token id")
expect_error("blank --decode", ["tokenize", "-m", m2, "--decode", " "], 1, "--decode: '' is not a token id")
expect_error("path too long is an error, not an abort", ["tokenize", "-m", "a" * 5000, "-p", "hi"], 1, "error")
expect_error("bad sampling flag before loading", ["generate", "-m", m2, "-p", "x", "--top-p", "0"], 1, "--top-p must be in (0, 1]")
expect_error("missing model dir", ["inspect", "-m", os.path.join(scratch, "nope")], 1,
             "-m " + os.path.join(scratch, "nope") + ": no such file or directory")
expect_error("bad --dtype", ["inspect", "-m", m2, "--dtype", "q4"], 1, "--dtype q4: unsupported")

bad = os.path.join(scratch, "bad")
shutil.copytree(m2, bad)
with open(os.path.join(bad, "config.json"), "w") as f:
    f.write("{\"model_type\": \"mamba2\", ")
expect_error("malformed config.json", ["inspect", "-m", bad], 1, "config.json: malformed JSON")
shutil.copy(os.path.join(m2, "config.json"), os.path.join(bad, "config.json"))
st = os.path.join(bad, "model.safetensors")
size = os.path.getsize(st)
with open(st, "r+b") as f:
    f.truncate(size - 100)
expect_error("truncated safetensors", ["inspect", "-m", bad], 1, "model.safetensors")
shutil.copy(os.path.join(m2, "model.safetensors"), st)
with open(os.path.join(bad, "tokenizer.json"), "w") as f:
    f.write("{\"model\": ")
expect_error("malformed tokenizer.json", ["tokenize", "-m", bad, "-p", "hi"], 1, "tokenizer.json")
with open(os.path.join(m2, "config.json")) as f:
    cfg_text = f.read()
with open(os.path.join(bad, "config.json"), "w") as f:
    f.write(cfg_text.replace('"head_dim": 16', '"head_dim": 10'))
expect_error("impossible config value", ["inspect", "-m", bad], 1, "num_heads x head_dim")

# Values nested a million deep (found by review: printing them in an error message overflowed the stack).
with open(os.path.join(bad, "config.json"), "w") as f:
    f.write('{"model_type": "mamba2", "hidden_size": ' + "[" * 1000000 + "]" * 1000000 + "}")
expect_error("deeply nested config.json", ["inspect", "-m", bad], 1, "nested deeper than 128 levels")
shutil.copy(os.path.join(m2, "config.json"), os.path.join(bad, "config.json"))
import struct
hdr = ('{"a": {"dtype": "F32", "shape": ' + "[" * 500000 + "]" * 500000 + ', "data_offsets": [0, 0]}}').encode()
with open(st, "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr)
expect_error("deeply nested safetensors header", ["inspect", "-m", bad], 1, "nested deeper than 128 levels")
shutil.copy(os.path.join(m2, "model.safetensors"), st)

finish()
