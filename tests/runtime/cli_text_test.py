"""The CLI's text-in, numbers-out subcommands and its usage errors: `hybridlm help`, the nearest
flag for a misspelled one, tokenize (empty prompt, --show-pieces, ids read back), score's JSON
lines, and perplexity's windows (-c, --stride, --chunks, the deprecated --ctx, binary files)."""
import json
import math
import os

from cli_common import check, expect_error, finish, make_model, run, scratch, start

start()
m2 = make_model("m2", "mamba2-tiny", 5)


def usage_error(name, args, line):
    """`args` is a usage error: exit 2 and exactly `line` on stderr."""
    rc, out, err = run(*args)
    check(name, rc == 2 and err.strip().splitlines() == [line], f"rc={rc} stderr={err!r}")


# help: `hybridlm help` and `hybridlm help SUB` print what --help prints.
rc, out, _ = run("help")
rc2, out2, _ = run("--help")
check("hybridlm help equals hybridlm --help", rc == 0 and rc2 == 0 and out == out2 and "Subcommands:" in out, out)
for sub in ["generate", "score", "perplexity", "tokenize", "inspect", "bench", "plan"]:
    rc, out, _ = run("help", sub)
    rc2, out2, _ = run(sub, "--help")
    check(f"hybridlm help {sub} equals {sub} --help", rc == 0 and out == out2 and f"Usage: hybridlm {sub}" in out, out)
usage_error("help of an unknown subcommand names the nearest", ["help", "scroe"],
            "error: help: no subcommand scroe; did you mean score? (hybridlm help lists them)")

# Usage errors: one line, exit 2, with the nearest flag or subcommand.
usage_error("misspelled flag suggests the nearest", ["generate", "-m", m2, "-p", "x", "--tmp", "0.5"],
            "error: generate: unknown flag --tmp; did you mean --temp? (hybridlm help generate lists them)")
usage_error("misspelled long flag with =value", ["score", "-m", m2, "-p", "x", "--logit-out=a.npy"],
            "error: score: unknown flag --logit-out; did you mean --logits-out? (hybridlm help score lists them)")
usage_error("unknown flag far from all", ["inspect", "-m", m2, "--zzzzzzzzzzzz"],
            "error: inspect: unknown flag --zzzzzzzzzzzz (hybridlm help inspect lists them)")
usage_error("misspelled subcommand suggests the nearest", ["generat", "-m", m2],
            "error: unknown subcommand generat; did you mean generate? (hybridlm help lists them)")
usage_error("missing required flag", ["perplexity", "-m", m2],
            "error: perplexity: --file is required (see hybridlm help perplexity)")
for args, sub in [(["score", "-m", m2], "score"), (["tokenize", "-m", m2], "tokenize"),
                  (["score", "-m", m2, "-p", "a", "--ids", "1"], "score"),
                  (["tokenize", "-m", m2, "-p", "a", "--decode", "1"], "tokenize"),
                  (["generate", "-m", m2], "generate"), (["plan"], "plan"),
                  (["plan", "-m", m2, "--config", os.path.join(m2, "config.json")], "plan")]:
    rc, _, err = run(*args)
    lines = err.strip().splitlines()
    check(f"{' '.join(a for a in args if a != m2)}: none or both of the inputs is a usage error",
          rc == 2 and len(lines) == 1 and lines[0].startswith(f"error: {sub}: ") and "Exactly 1 option" in lines[0],
          f"rc={rc} {err!r}")

# tokenize: [] for an empty prompt; the printed array is read back by --decode and score --ids.
rc, out, err = run("tokenize", "-m", m2, "-p", "")
check("tokenize of an empty prompt is [] (GPT-NeoX adds no BOS)", rc == 0 and out == "[]\n", out + err)
text = "Hello world, ünïcode!"
rc, out, err = run("tokenize", "-m", m2, "-p", text)
printed = out.strip()
ids = json.loads(printed) if rc == 0 else []
rc, out, err = run("tokenize", "-m", m2, "--decode", printed)
check("tokenize --decode reads tokenize's printed array", rc == 0 and out == text + "\n", out + err)
rc, out, err = run("tokenize", "-m", m2, "--decode", "[]")
check("tokenize --decode [] is the empty text", rc == 0 and out == "\n", out + err)
rc, out, err = run("tokenize", "-m", m2, "-p", text, "--show-pieces")
lines = out.splitlines()
pieces_ok = rc == 0 and len(lines) == len(ids) and all(l.startswith(f"{i} -> '") for l, i in zip(lines, ids))
check("tokenize --show-pieces: one `id -> 'piece'` line per id", pieces_ok, out + err)
check("tokenize --show-pieces: the pieces spell the text", pieces_ok and
      "".join(l.split(" -> '", 1)[1][:-1] for l in lines) == text, out)
rc, out, err = run("tokenize", "-m", m2, "-p", "a\nb", "--show-pieces")
check("tokenize --show-pieces escapes a newline", rc == 0 and "'\\n'" in out, out + err)
rc, out, err = run("tokenize", "-m", os.path.join(m2, "config.json"), "-p", "hi")
check("tokenize -m takes a file inside the model directory", rc == 0 and out.startswith("["), out + err)

# score: one JSON line per scored token, then the total; the logprobs are log-softmax of the
# logits --logits-out writes (computed here in float64).
import numpy as np  # noqa: E402

npy = os.path.join(scratch, "s.npy")
rc, out, err = run("score", "-m", m2, "--ids", printed, "--logits-out", npy)
rows = [json.loads(l) for l in out.splitlines()] if rc == 0 else []
per_token, total = rows[:-1], rows[-1] if rows else {}
check("score prints a line per token after the first, then the total",
      rc == 0 and [r.get("position") for r in per_token] == list(range(1, len(ids))) and
      [r.get("id") for r in per_token] == ids[1:] and total.get("tokens") == len(ids) and
      total.get("scored") == len(ids) - 1, out + err)
if rc == 0:
    logits = np.load(npy).astype(np.float64)
    mx = logits.max(axis=1, keepdims=True)
    lsm = logits - mx - np.log(np.exp(logits - mx).sum(axis=1, keepdims=True))
    want = [lsm[i - 1, ids[i]] for i in range(1, len(ids))]
    got = [r["logprob"] for r in per_token]
    err_lp = max(abs(a - b) for a, b in zip(got, want))
    # tests/numerics.h kPenaltyVsF64-style bound: double sums of the same float logits.
    check("score's logprobs are log-softmax of the logits (float64, 1e-9)", err_lp < 1e-9, err_lp)
    check("score's total is the sum, its perplexity exp(-mean)",
          abs(total["logprob"] - sum(want)) < 1e-8 and
          abs(total["perplexity"] - math.exp(-sum(want) / len(want))) < 1e-6 * total["perplexity"], total)
    check("score's token text decodes each id", [r.get("token") for r in per_token][:2] == [" world", ","],
          per_token[:2])
rc, out2, err = run("score", "-m", m2, "-p", text)
check("score -p prints the same lines as --ids (and writes no .npy)", rc == 0 and out2 == out, out2 + err)
expect_error("score --ids []", ["score", "-m", m2, "--ids", "[]"], 1, "--ids: no token ids")
expect_error("score --ids '' is an empty id, not a missing prompt", ["score", "-m", m2, "--ids", ""], 1,
             "--ids: '' is not a token id")
expect_error("tokenize --decode '' decodes (an empty id), not encodes", ["tokenize", "-m", m2, "--decode", ""], 1,
             "--decode: '' is not a token id")

# perplexity: windows of -c tokens from a fresh state each, every --stride tokens; each window
# scores the tokens no earlier window scored. Recomputed here from `score --ids` of each window.
txt = os.path.join(scratch, "t.txt")
with open(txt, "w") as f:
    f.write("First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n" * 3)
rc, out, err = run("tokenize", "-m", m2, "-p", open(txt).read(), "--no-special")
toks = json.loads(out)


def window_ppl(ctx, stride, chunks=None):
    nll, count, scored_to, windows, b = 0.0, 0, 1, 0, 0
    while b + 1 < len(toks) and (chunks is None or windows < chunks):
        e = min(b + ctx, len(toks))
        first = max(scored_to, b + 1)
        if first < e:
            rc, out, err = run("score", "-m", m2, "--ids", ",".join(map(str, toks[b:e])))
            lines = [json.loads(l) for l in out.splitlines()][:-1]
            for r in lines:
                if b + r["position"] >= first:
                    nll -= r["logprob"]
                    count += 1
            windows += 1
        scored_to = e
        if e == len(toks):
            break
        b += stride
    return math.exp(nll / count), count, windows


for ctx, stride, chunks in [(16, 16, None), (16, 5, None), (24, 10, 3), (len(toks) + 5, None, None)]:
    args = ["perplexity", "-m", m2, "-f", txt, "-c", str(ctx)]
    if stride:
        args += ["--stride", str(stride)]
    if chunks:
        args += ["--chunks", str(chunks)]
    rc, out, err = run(*args)
    want, count, windows = window_ppl(ctx, stride or ctx, chunks)
    got = float(out.split()[1]) if rc == 0 and out.startswith("perplexity: ") else -1
    check(f"perplexity -c {ctx} --stride {stride} --chunks {chunks}: the windows' perplexity, count and windows",
          abs(got - want) <= 1e-4 * want and f"over {count} tokens" in out and f"{windows} windows" in out and
          f"{count} tokens scored" in err, f"got {got} want {want} count {count} windows {windows} {out} {err}")
# What the window plan must give, whatever its code: overlapping windows score every token but the
# first once; non-overlapping windows of c score all but each window's first token.
n = len(toks)
rc, out, err = run("perplexity", "-m", m2, "-f", txt, "-c", "16", "--stride", "5")
check("perplexity --stride 5 -c 16 scores every token but the first", rc == 0 and f"over {n - 1} tokens" in out, out)
rc, out, err = run("perplexity", "-m", m2, "-f", txt, "-c", "16")
w = -(-(n - 1) // 16)
check("perplexity -c 16 scores all but each window's first token",
      rc == 0 and f"over {n - w} tokens" in out and f"{w} windows" in out, (n, w, out))
rc, out, err = run("perplexity", "-m", m2, "-f", txt, "-c", str(len(toks) + 5))
rc2, out2, err2 = run("score", "-m", m2, "--ids", ",".join(map(str, toks)))
one = json.loads(out2.splitlines()[-1]) if rc2 == 0 else {}
check("perplexity of one window equals score's perplexity of the same tokens",
      rc == 0 and abs(float(out.split()[1]) - one.get("perplexity", 0)) <= 1e-4 * one.get("perplexity", 1), out + out2)
rc, out, err = run("perplexity", "-m", m2, "-f", txt, "--ctx", "16")
rc2, out2, _ = run("perplexity", "-m", m2, "-f", txt, "-c", "16")
check("perplexity --ctx: the same as -c, with a deprecation warning",
      rc == 0 and out == out2 and err.startswith("warning: --ctx is deprecated; use -c/--ctx-size"), out + err)
check("perplexity: no \\r progress when stderr is not a terminal", "\r" not in err, repr(err))
expect_error("perplexity --stride above -c", ["perplexity", "-m", m2, "-f", txt, "-c", "16", "--stride", "17"], 1,
             "--stride 17: must be in [1, -c/--ctx-size 16]")
expect_error("perplexity --chunks 0", ["perplexity", "-m", m2, "-f", txt, "--chunks", "0"], 1,
             "--chunks 0: must be >= 1 (or -1: all)")
binary = os.path.join(scratch, "b.bin")
with open(binary, "wb") as f:
    f.write(b"text\x00\x01\x02")
expect_error("perplexity refuses a file with a NUL byte", ["perplexity", "-m", m2, "-f", binary], 1,
             "b.bin: not a text file (a NUL byte at offset 4)")
with open(binary, "wb") as f:
    f.write(b"caf\xc3 and more")
expect_error("perplexity refuses invalid UTF-8", ["perplexity", "-m", m2, "-f", binary], 1,
             "b.bin: not a text file (invalid UTF-8 at byte offset 3)")
expect_error("perplexity of a directory", ["perplexity", "-m", m2, "-f", scratch], 1, "is a directory")

finish()
