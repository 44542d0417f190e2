#!/usr/bin/env python3
"""`hybridlm bench`: comma-separated sweeps run as a cross product in a fixed order, -p 0 / -n 0
skipping a kind of test, the output formats (-o md|csv|json|jsonl, --json), --no-probe, the model
shown by name and size, percentages above 100% explained, and one-line errors for bad list items.
Speed itself is never asserted.

Run as the other CLI tests are (cli_common.py).
"""
import csv
import io
import json
import math
import os
import re
import struct

from cli_common import check, expect_error, finish, make_model, run, start

start()
m2 = make_model("m2", "mamba2-tiny", 5)
FAST = ["-r", "1", "--no-probe"]


def bench_rows(*args, model=None):
    """Runs bench on `model` (mamba2-tiny by default) with -o jsonl; returns (rc, rows, stdout + stderr)."""
    rc, out, err = run("bench", "-m", model or m2, *args, "-o", "jsonl")
    try:
        rows = [json.loads(l) for l in out.splitlines()] if rc == 0 else []
    except ValueError:
        rows = []
    return rc, rows, out + err


# Sweeps: for each -t, the pp tests in -p order, then for each -n every --batch.
rc, rows, text = bench_rows("-p", "8,16", "-n", "2,3", "-t", "1,2", "--batch", "1,2", *FAST)
want = [(t, test, b) for t in (1, 2) for test, b in
        [("pp8", 1), ("pp16", 1), ("tg2", 1), ("tg2", 2), ("tg3", 1), ("tg3", 2)]]
check("sweep: the cross product of -p, -n, -t and --batch, in order",
      [(r.get("threads"), r.get("test"), r.get("batch")) for r in rows] == want, text)
check("sweep: n_prompt and n_gen say which test a row is",
      all((r["n_prompt"], r["n_gen"]) == ((int(r["test"][2:]), 0) if r["test"].startswith("pp")
                                          else (0, int(r["test"][2:]))) for r in rows) and rows, text)
# Parallel regions per decode step: none on one thread (every call runs inline), some on two.
tg = [r for r in rows if r["test"].startswith("tg")]
check("sweep: tg rows count the thread pool's parallel regions per step",
      tg and all((r["parallel_regions_per_step"] == 0) == (r["threads"] == 1) for r in tg) and
      not any("parallel_regions_per_step" in r for r in rows if r["test"].startswith("pp")), text)
rc, rows, text = bench_rows("-p", "0", "-n", "2", "--batch", "1,3", "-t", "1", *FAST)
check("-p 0 skips the pp tests", rc == 0 and [(r["test"], r["batch"]) for r in rows] == [("tg2", 1), ("tg2", 3)], text)
rc, rows, text = bench_rows("-p", "8,0,4", "-n", "0", "-t", "1", *FAST)
check("-n 0 skips the tg tests (and a 0 among sizes is no test)", rc == 0 and [r["test"] for r in rows] == ["pp8", "pp4"],
      text)

# Formats: the same rows and keys in csv, json and jsonl; md is a table.
args = ["bench", "-m", m2, "-p", "8", "-n", "2", "-t", "1", *FAST]
keys = ["model", "parameters", "weight_bytes", "family", "dtype", "test", "threads", "batch", "tokens_per_second",
        "stddev", "state_dtype", "state_bytes_per_sequence", "kv_dtype", "kv_bytes_per_token", "peak_rss_bytes"]
rc, out, err = run(*args, "-o", "csv")
table = list(csv.DictReader(io.StringIO(out))) if rc == 0 else []
check("-o csv: a header row, then one row per test with every key",
      [r.get("test") for r in table] == ["pp8", "tg2"] and all(k in table[0] for k in keys) and
      table[0]["gbps"] == "" and table[1]["gflops"] == "" and float(table[1]["gbps"]) > 0, out + err)
rc, out, err = run(*args, "-o", "json")
try:
    arr = json.loads(out) if rc == 0 else None
except ValueError:
    arr = None
check("-o json: an array of one object per test", isinstance(arr, list) and [r.get("test") for r in arr] ==
      ["pp8", "tg2"] and all(k in r for r in arr for k in keys) and "gflops" in arr[0] and "gbps" in arr[1], out + err)
rc, out2, err = run(*args, "--json")
try:
    arr2 = json.loads(out2) if rc == 0 else None
except ValueError:
    arr2 = None
check("--json is -o json", isinstance(arr2, list) and arr and [sorted(r) for r in arr2] == [sorted(r) for r in arr],
      out2 + err)
rc, out, err = run(*args, "-o", "jsonl")
lines = out.splitlines()
try:
    objs = [json.loads(l) for l in lines] if rc == 0 else []
except ValueError:
    objs = []
check("-o jsonl: one object per line", len(lines) == 2 and [r.get("test") for r in objs] == ["pp8", "tg2"], out + err)
for fmt in [None, "md"]:
    rc, out, err = run(*args, *(["-o", fmt] if fmt else []))
    tbl = [l for l in out.splitlines() if l.startswith("|")]
    head = [c.strip() for c in tbl[0].strip("|").split("|")] if tbl else []
    check(f"-o {fmt or '(default)'}: a markdown table, header, rule and one row per test",
          rc == 0 and len(tbl) == 4 and head[:3] == ["model", "size", "params"] and "t/s" in head and
          set(tbl[1]) <= set("|-: ") and "pp8" in tbl[2] and "tg2" in tbl[3], out + err)

# The model by name and size, not by path.
rc, out, err = run("inspect", "-m", m2, "--no-mmap")
params = int(out.split("parameters:")[1].split()[0]) if rc == 0 else -1
wbytes = int(out.split("weight bytes:")[1].split()[0]) if rc == 0 else -1
rc, rows, text = bench_rows("-p", "4", "-n", "0", "-t", "1", *FAST)
check("the model is its directory name, with parameters and weight bytes",
      rows and rows[0]["model"] == "m2" and rows[0]["parameters"] == params and rows[0]["weight_bytes"] == wbytes, text)
rc, out, err = run("bench", "-m", m2 + "/", "-p", "4", "-n", "0", "-t", "1", *FAST)
cells = [c.strip() for c in out.splitlines()[2].strip("|").split("|")] if rc == 0 else []
check("md: the model's name (also from DIR/) and its size, never the full path",
      cells[:3] == ["m2", "12.51 MiB", "3.27 M"] and m2 not in out, out + err)

# --no-probe: no peaks anywhere; with the probe, peaks per row and the probe's 1 GiB buffer kept out
# of the reported peak RSS (the tiny model needs a few tens of MiB).
rc, out, err = run(*args, "-o", "json")
check("--no-probe: no peak keys", rc == 0 and not any(k.startswith("peak_g") or k == "peak_is_int8"
                                                       for r in json.loads(out) for k in r), out + err)
rc, out, err = run(*args)
check("--no-probe: no machine line and no 'of peak' column", rc == 0 and "machine" not in out and "of peak" not in out and
      "%" not in out, out + err)
probe = ["bench", "-m", m2, "-p", "8", "-n", "2", "-t", "1", "-r", "1"]
rc, out, err = run(*probe, "-o", "json")
arr = json.loads(out) if rc == 0 else []
check("with the probe: peak_gflops for pp, peak_gbps for tg, and peak RSS without the probe's 1 GiB",
      len(arr) == 2 and "peak_gflops" in arr[0] and "peak_is_int8" in arr[0] and arr[1].get("peak_gbps", 0) > 0 and
      0 <= arr[1].get("peak_gbps_spread", -1) <= 1 and
      all(r["peak_rss_bytes"] < 512 * 2**20 for r in arr), out + err)
rc, out, err = run(*probe)
pcts = [int(p) for p in re.findall(r"(\d+)%", out)]
over = re.findall(r"(\d+)%( [†‡])?", out)
check("md with the probe: the machine line and an 'of peak' column", rc == 0 and out.startswith("machine (same run, 1 threads)")
      and "| of peak |" in out and pcts, out + err)
check("md: a percentage above 100% carries a mark and its footnote",
      all(mark for p, mark in over if int(p) > 100) and
      all(("\n" + mark.strip() + " above 100%") in out for p, mark in over if int(p) > 100), out)

# Threads beyond the CPUs are allowed, with one warning.
cores = len(os.sched_getaffinity(0))
rc, rows, text = bench_rows("-p", "0", "-n", "1", "-t", f"{cores + 1},{cores + 2}", *FAST)
warns = [l for l in text.splitlines() if l.startswith("warning:")]
check("threads above the CPUs run, warned once", rc == 0 and [r["threads"] for r in rows] == [cores + 1, cores + 2] and
      len(warns) == 1 and f"-t {cores + 2}" in warns[0], text)

# -d: every test of a depth starts from a context of that many tokens, filled once per depth and
# forked for each repetition's sequences; the test is named as llama-bench names it.
jamba = make_model("jamba-tiny", "jamba-tiny", 9)  # attention layers: forks share KV pages
for model in (m2, jamba):
    rc, rows, text = bench_rows("-p", "4", "-n", "2", "-d", "0,16", "--batch", "1,2", "-t", "1", *FAST, model=model)
    want = [("pp4", 0, 1), ("tg2", 0, 1), ("tg2", 0, 2), ("pp4 @ d16", 16, 1), ("tg2 @ d16", 16, 1),
            ("tg2 @ d16", 16, 2)]
    check(f"-d 0,16: each depth's tests in order, with n_depth ({os.path.basename(model)})",
          [(r.get("test"), r.get("n_depth"), r.get("batch")) for r in rows] == want and
          text.count("bench: filling a context of 16 tokens") == 1, text)
rc, out, err = run("bench", "-m", m2, "-p", "0", "-n", "2", "-d", "0,8", "-t", "1", *FAST)
check("md: the parallel-regions line once for a sweep that repeats it",
      rc == 0 and out.count("parallel regions per decode step (1 threads, batch 1)") == 1 and "tg2 @ d8" in out,
      out + err)

# tg's GB/s counts the weights a step reads: of a mixture, only the experts its tokens are routed
# to (E (1 - (1 - k/E)^batch) of E, routing taken as uniform), and of an untied embedding one row a
# token. Checked against the checkpoint's own tensor sizes, to within the embedding's padding to
# whole panels of 32 rows (the experts' rows fill theirs).
def checkpoint_meta(model):
    """(safetensors header without its metadata, config.json, its text config) of a model directory."""
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    with open(os.path.join(model, "config.json")) as f:
        top = json.load(f)
    return header, top, top.get("text_config", top)


def expected_unread(model, batch):
    header, top, cfg = checkpoint_meta(model)
    size = {k: 4 * math.prod(v["shape"]) for k, v in header.items() if not k.startswith("mtp.")}
    unread = 0.0
    if cfg.get("num_experts"):
        touched = 1 - (1 - cfg["num_experts_per_tok"] / cfg["num_experts"]) ** batch
        unread += sum(b for k, b in size.items() if ".experts." in k) * (1 - touched)
    if not top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)):
        unread += sum(b for k, b in size.items() if k.endswith("embed_tokens.weight")) * (1 - batch / cfg["vocab_size"])
    return unread


qnext = make_model("qnext", "qwen3-next-tiny", 4)  # experts by name
for model in (m2, qnext, make_model("q35moe", "qwen3.5-moe-tiny", 4)):  # and stacked
    rc, rows, text = bench_rows("-p", "0", "-n", "2", "--batch", "1,4", "-t", "1", *FAST, model=model)
    got = [r["weight_bytes"] - r["weight_bytes_per_step"] for r in rows]
    want = [expected_unread(model, b) for b in (1, 4)]
    check(f"tg counts the weights a step reads ({os.path.basename(model)}: unread {want})",
          len(got) == 2 and all(abs(g - w) <= 32 * 64 * 4 for g, w in zip(got, want)) and
          (want[0] > 0) == (model != m2),
          text)
rc, out, err = run("bench", "-m", qnext, "-p", "0", "-n", "2", "-t", "1", *FAST)
check("md: a line says how much of the weights a step reads",
      rc == 0 and re.search(r"weights read per decode step \(batch 1\): \S+ \S+ of ", out) is not None, out + err)

# --profile: each test's ms a step by kernel op, "other" the rest of the step's wall time; the
# items add up to the step's time that tokens/s gives (one repetition: the same wall time).
for model, step_op, scan_op in ((qnext, "gated_delta_step", "gated_delta_scan"), (jamba, "mamba1_scan", "mamba1_scan")):
    rc, rows, text = bench_rows("-p", "8", "-n", "4", "--batch", "1,2", "-t", "1", "--profile", *FAST, model=model)
    prof = [dict((k, float(v)) for k, v in (item.split("=") for item in r.get("profile_ms_per_step", "").split(";")))
            if r.get("profile_ms_per_step") else {} for r in rows]
    ok = len(rows) == 3 and all(p and "matmul" in p and "attention" in p and "other" in p for p in prof)
    ok = ok and scan_op in prof[0] and step_op in prof[1] and step_op in prof[2]
    for r, p in zip(rows, prof):
        step_ms = 1000.0 * (r["n_prompt"] or r["batch"]) / r["tokens_per_second"]
        ok = ok and abs(sum(p.values()) - step_ms) <= 0.02 * step_ms + 0.001 * len(p)
    check(f"--profile: ms a step by op, adding up to the step ({os.path.basename(model)})", ok, text)
rc, out, err = run("bench", "-m", jamba, "-p", "0", "-n", "2", "-t", "1", "--profile", *FAST)
check("--profile md: a line per test under the table",
      rc == 0 and re.search(r"^profile of tg2 \(1 threads, batch 1\), ms a step: matmul [0-9.]+ \(\d+%\),.* other ",
                            out, re.M) is not None, out + err)
# --profile's line by part: the matmuls' bytes and FLOPs per step, from the checkpoint's own
# header: every 2-D tensor but an untied embedding (gathered a row a token) and (1, H) gates (an
# elementwise product), the experts' bytes at the share of them the step touches, their
# multiply-adds at k / E per token. Bytes may exceed the header's by the padding of each matrix
# to whole panels of 32 rows.
def expected_matmul(model, batch):
    header, top, cfg = checkpoint_meta(model)
    tied = top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
    nbytes = macs = pad = 0
    for k, v in header.items():
        shape = v["shape"]
        if k.startswith("mtp.") or len(shape) != 2 or shape[0] == 1 or (not tied and k.endswith("embed_tokens.weight")):
            continue
        share = per_token = 1.0
        if ".experts." in k:
            per_token = cfg["num_experts_per_tok"] / cfg["num_experts"]
            share = 1 - (1 - per_token) ** batch
        nbytes += 4 * math.prod(shape) * share
        macs += math.prod(shape) * per_token
        pad += 4 * 31 * shape[1]
    return nbytes, 2 * macs * batch, pad


for model in (m2, qnext):
    rc, rows, text = bench_rows("-p", "0", "-n", "2", "--batch", "1,4", "-t", "1", "--profile", *FAST, model=model)
    ok = len(rows) == 2
    for r in rows:
        want_bytes, want_flops, pad = expected_matmul(model, r["batch"])
        ok = ok and abs(r["matmul_flops_per_step"] - want_flops) <= 1e-6 * want_flops
        ok = ok and want_bytes - 1 <= r["matmul_bytes_per_step"] <= want_bytes + pad
    check(f"--profile: the matmuls' bytes and FLOPs a step ({os.path.basename(model)})", ok, text)
rc, out, err = run("bench", "-m", jamba, "-p", "0", "-n", "2", "-d", "0,8", "-t", "1", "--profile", *FAST)
num = r"([0-9.]+)"
parts = re.findall(r"^by part, tg2 (?:@ d8 )?\(1 threads, batch 1\): matmul " + num + r" ms \(\d+%\): \S+ \S+ of weights at " +
                   num + r" GB/s, " + num + r" GFLOP at " + num + r" GFLOP/s; state ops " + num +
                   r" ms \(\d+%\): \S+ \S+ read and written at " + num + r" GB/s; (?:attention " + num +
                   r" ms \(\d+%\): \S+ \S+ of KV at " + num + r" GB/s; )?the rest " + num + r" ms \(\d+%\)$", out, re.M)
profiles = [sum(float(x) for x in re.findall(r" ([0-9.]+) \(\d+%\)", line))
            for line in re.findall(r"^profile of tg2 .*$", out, re.M)]
# two tests, both with attention (the KV of the tokens decoded, and at depth 8 of the context);
# the parts add up to the profile's step (items rounded to 1 us); rates positive
ok = rc == 0 and len(parts) == 2 and len(profiles) == 2 and parts[0][6] != "" and parts[1][6] != ""
for p, step in zip(parts, profiles) if ok else []:
    total = sum(float(p[i]) for i in (0, 4, 6, 8) if p[i])
    ok = ok and abs(total - step) <= 0.01 and all(float(p[i]) > 0 for i in (1, 3, 5))
check("--profile md: a line by part under each tg profile", ok, out + err)
rc, out, err = run("bench", "-m", m2, "-p", "0", "-n", "2", "-t", "1", "--profile", *FAST)
check("--profile md: no attention part without KV",
      rc == 0 and re.search(r"^by part, tg2 .*; state ops .*; the rest [0-9.]+ ms", out, re.M) is not None and
      "of KV" not in out, out + err)
rc, rows, text = bench_rows("-p", "4", "-n", "2", "-t", "1", *FAST)
check("without --profile no profile key", rc == 0 and rows and not any("profile_ms_per_step" in r for r in rows), text)

# Bad values: exit 1 and one line naming the flag and the item.
base = ["bench", "-m", m2, "--no-probe"]
expect_error("bad -p item", base + ["-p", "12,x"], 1, "-p/--n-prompt: 'x' is not an integer in [0, 1048576]")
expect_error("bad -t item", base + ["-t", "0,-1"], 1, "-t/--threads: '-1' is not an integer in [0, 1024]")
expect_error("empty -n", base + ["-n", ""], 1, "-n/--n-gen: '' is not an integer")
expect_error("empty --batch item", base + ["--batch", "1,,2"], 1, "--batch: '' is not an integer in [1, 1024]")
expect_error("--batch 0", base + ["--batch", "0"], 1, "--batch: '0' is not an integer in [1, 1024]")
expect_error("bad -d item", base + ["-d", "0,-4"], 1, "-d/--n-depth: '-4' is not an integer in [0, 1048576]")
expect_error("-p 0 -n 0", base + ["-p", "0", "-n", "0"], 1, "bench: -p and -n are both 0: no test to run")
expect_error("unknown -o", base + ["-o", "xml"], 1, "-o/--output xml: use md, csv, json or jsonl")
expect_error("--json against -o csv", base + ["-o", "csv", "--json"], 1, "bench: --json and -o csv disagree")

finish()
