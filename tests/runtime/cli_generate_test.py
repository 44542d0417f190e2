#!/usr/bin/env python3
"""`hybridlm generate` as llama.cpp and transformers users expect it (issue 15): a random seed by
default that the summary prints and --seed reproduces, llama.cpp's aliases and flags (--temp, the
penalties, -f, -e, --no-display-prompt, -n -1), beam search's -n 0, --num-return-sequences and
--length-penalty, sampling flags refused with beams, and a failed write to stdout exiting 1.

Run as the other CLI tests are (cli_common.py).
"""
import json
import os
import re
import subprocess

from cli_common import REPORT_PREFIXES, check, exe, expect_error, finish, make_model, run, scratch, start

start()
m2 = make_model("m2", "mamba2-tiny", 5)
jamba = make_model("jamba-tiny", "jamba-tiny", 9)
P = "Once upon a time"


def seed_of(err):
    m = re.search(r"^seed: (\d+)$", err, re.M)
    return int(m.group(1)) if m else None


def tokens_generated(err):
    m = re.search(r"^generation: (\d+) tokens", err, re.M)
    return int(m.group(1)) if m else None


# The seed: random unless given (-1 is random too), printed in the summary, and --seed reproduces it.
sampled = ["generate", "-m", m2, "-p", P, "-n", "12", "--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
rc1, out1, err1 = run(*sampled)
rc2, out2, err2 = run(*sampled)
s1, s2 = seed_of(err1), seed_of(err2)
check("default seed is random and printed in the summary", rc1 == 0 and rc2 == 0 and s1 is not None and
      s2 is not None and s1 != s2, err1 + err2)
rc, out, err = run(*sampled, "--seed", str(s1))
check("--seed N with the printed seed reproduces the text", rc == 0 and out == out1 and seed_of(err) == s1,
      (out1, out, err))
rc, _, err3 = run(*sampled, "--seed", "-1")
rc4, _, err4 = run(*sampled, "--seed", "-1")
check("--seed -1 is a random seed", rc == 0 and rc4 == 0 and seed_of(err3) not in (None, seed_of(err4)), err3 + err4)
expect_error("--seed below -1", sampled + ["--seed", "-2"], 1, "--seed must be >= 0, or -1 for a random seed, got -2")

# --temp is --temperature; inf and nan are refused for what they are.
rc, out_a, _ = run("generate", "-m", m2, "-p", P, "-n", "8", "--seed", "4", "--temp", "0.7")
rc2, out_b, _ = run("generate", "-m", m2, "-p", P, "-n", "8", "--seed", "4", "--temperature", "0.7")
check("--temp is an alias of --temperature", rc == 0 and rc2 == 0 and out_a == out_b, (out_a, out_b))
for flag in ["--temperature", "--temp"]:
    for v in ["inf", "nan"]:
        expect_error(f"{flag} {v}", ["generate", "-m", m2, "-p", "x", flag, v], 1,
                     f"--temperature must be a finite number >= 0, got {v}")

# Penalties (their arithmetic is sampler_test's): each reaches the sampler, --repeat-last-n 0 turns
# them off, bad values are named. The random model's greedy text repeats no token, so a penalty
# cannot change it; the values below reward a seen token instead, and the text starts repeating.
greedy = ["generate", "-m", m2, "-p", P, "-n", "40", "--temp", "0", "--ignore-eos"]
rc, base, err = run(*greedy)
check("greedy baseline", rc == 0 and base.startswith(P), err)
for flags in [["--repeat-penalty", "0.2"], ["--presence-penalty", "-2"], ["--frequency-penalty", "-2"]]:
    rc, out, err = run(*greedy, *flags)
    check(f"{flags[0]} changes greedy text", rc == 0 and out.startswith(P) and out != base, err)
    rc, out, err = run(*greedy, *flags, "--repeat-last-n", "0")
    check(f"{flags[0]} with --repeat-last-n 0 is off", rc == 0 and out == base, (base, out, err))
    rc, out_all, err = run(*greedy, *flags, "--repeat-last-n", "-1")
    check(f"{flags[0]} with --repeat-last-n -1 runs", rc == 0 and out_all.startswith(P), err)
expect_error("--presence-penalty out of range", greedy + ["--presence-penalty", "2.5"], 1,
             "--presence-penalty must be in [-2, 2], got 2.5")
expect_error("--frequency-penalty out of range", greedy + ["--frequency-penalty", "-3"], 1,
             "--frequency-penalty must be in [-2, 2], got -3")
expect_error("--repeat-last-n below -1", greedy + ["--repeat-last-n", "-2"], 1,
             "--repeat-last-n must be >= 0, or -1 for the whole history, got -2")
expect_error("--repeat-penalty inf", greedy + ["--repeat-penalty", "inf"], 1,
             "--repeat-penalty must be a finite number > 0, got inf")

# The prompt from a file (one trailing newline dropped, as llama.cpp) or standard input.
short = ["-n", "6", "--temp", "0"]
rc, want, _ = run("generate", "-m", m2, "-p", P, *short)
pf = os.path.join(scratch, "prompt.txt")
with open(pf, "w") as f:
    f.write(P + "\n")
rc, out, err = run("generate", "-m", m2, "-f", pf, *short)
check("-f FILE equals -p with the file's text", rc == 0 and out == want, (want, out, err))
rc, out, err = run("generate", "-m", m2, "-f", "-", *short, stdin=P + "\n")
check("-f - reads the prompt from standard input", rc == 0 and out == want, (want, out, err))
missing = os.path.join(scratch, "nope.txt")
expect_error("-f a missing file", ["generate", "-m", m2, "-f", missing], 1,
             f"-f {missing}: cannot open: No such file or directory")
check("-p and -f together are a usage error", run("generate", "-m", m2, "-p", P, "-f", pf)[0] == 2)
check("neither -p nor -f is a usage error", run("generate", "-m", m2, "-n", "2")[0] == 2)

# -e turns \n and \t into the characters; without it the backslashes stay.
rc, out, err = run("generate", "-m", m2, "-p", "a\\nb\\tc", "-e", *short)
check("-e processes \\n and \\t in the prompt", rc == 0 and out.startswith("a\nb\tc"), (out, err))
rc, out, err = run("generate", "-m", m2, "-p", "a\\nb", *short)
check("without -e the prompt is taken as written", rc == 0 and out.startswith("a\\nb"), (out, err))

# --no-display-prompt: the generated text only.
rc, out, err = run("generate", "-m", m2, "-p", P, *short, "--no-display-prompt")
check("--no-display-prompt prints only the generated text", rc == 0 and P + out == want, (want, out, err))

# -n -1: until end of sequence or until prompt + output fill --ctx-size (attention or not).
rc, out, _ = run("tokenize", "-m", m2, "-p", P)
plen = len(out.strip().strip("[]").split(","))
for name, d in [("mamba2", m2), ("jamba", jamba)]:
    rc, out, err = run("generate", "-m", d, "-p", P, "-n", "-1", "--ctx-size", "20", "--ignore-eos", "--seed", "1")
    check(f"-n -1 --ignore-eos fills --ctx-size ({name})", rc == 0 and tokens_generated(err) == 20 - plen, err)
rc, out, err = run("generate", "-m", m2, "-p", P, "-n", "-1", "--ctx-size", "20", "--seed", "1")
check("-n -1 stops at eos or --ctx-size", rc == 0 and 1 <= tokens_generated(err) <= 20 - plen, err)
expect_error("-n below -1", ["generate", "-m", m2, "-p", P, "-n", "-2"], 1,
             "-n/--n-predict must be >= 0, or -1 (until end of sequence or --ctx-size), got -2")
expect_error("-n -1 with a prompt that fills --ctx-size", ["generate", "-m", m2, "-p", P, "-n", "-1", "--ctx-size",
                                                           str(plen)], 1, "-n -1 leaves no room")

# Beam search: -n 0, sampling flags refused, several sequences, the length penalty.
beam = ["generate", "-m", m2, "-p", P, "--num-beams", "3", "--ignore-eos"]
rc, out, err = run(*beam, "-n", "0")
check("beam search -n 0 gives no token", rc == 0 and out == P + "\n" and "beam search: 3 beams, 0 tokens" in err,
      (out, err))
rc, out, err = run("generate", "-m", m2, "-p", P, "-n", "0")
check("sampling -n 0 gives no token", rc == 0 and out == P + "\n" and tokens_generated(err) == 0, (out, err))
for flag, value in [("--temp", "0.5"), ("--top-k", "5"), ("--seed", "3"), ("--repeat-penalty", "1.2"),
                    ("--presence-penalty", "1")]:
    name = "--temperature" if flag == "--temp" else flag
    expect_error(f"beam search refuses {flag}", beam + ["-n", "4", flag, value], 1,
                 f"{name} is a sampling flag: beam search (--num-beams 3) does not sample")
rc, best, err = run(*beam, "-n", "6")
rc3, out3, err3 = run(*beam, "-n", "6", "--num-return-sequences", "3")
seqs = out3.split("\n---\n")
check("--num-return-sequences 3: the best first, then two more, separated by lines ---",
      rc == 0 and rc3 == 0 and len(seqs) == 3 and seqs[0] + "\n" == best and all(s.startswith(P) for s in seqs) and
      len(set(seqs)) == 3 and err3.count("\nsequence ") == 2, (best, out3, err3))
expect_error("--num-return-sequences above --num-beams", beam + ["-n", "4", "--num-return-sequences", "4"], 1,
             "--num-return-sequences 4: must be in [1, --num-beams 3]")
expect_error("--num-return-sequences without beam search", ["generate", "-m", m2, "-p", P,
                                                            "--num-return-sequences", "2"], 1,
             "--num-return-sequences needs beam search (--num-beams > 1)")
expect_error("--length-penalty without beam search", ["generate", "-m", m2, "-p", P, "--length-penalty", "2"], 1,
             "--length-penalty needs beam search (--num-beams > 1)")
expect_error("--length-penalty inf", beam + ["--length-penalty", "inf"], 1,
             "--length-penalty must be a finite number, got inf")


def beam_scores(err):
    m = re.search(r"beam search: 3 beams, (\d+) tokens .* best logprob (\S+) \(score (\S+)\)", err)
    return (int(m.group(1)), float(m.group(2)), float(m.group(3))) if m else None


for lp in [0.0, 2.0]:
    rc, out, err = run(*beam, "-n", "6", "--length-penalty", str(lp))
    sc = beam_scores(err)
    check(f"--length-penalty {lp}: score = logprob / length^{lp}", rc == 0 and sc is not None and
          abs(sc[2] - sc[1] / sc[0] ** lp) < 1e-3, err)

# A write error on stdout exits 1 with one error line (after the load report, if any), and
# generation stops at it (no summary).
def to_dev_full(*args):
    with open("/dev/full", "w") as full:
        p = subprocess.run([exe, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    return p.returncode, p.stderr


full_msg = "error: cannot write to standard output: No space left on device"
for name, args in [("generate", ["generate", "-m", m2, "-p", P, "-n", "200", "--ignore-eos"]),
                   ("generate --num-beams", beam + ["-n", "50"]),
                   ("tokenize", ["tokenize", "-m", m2, "-p", P]),
                   ("inspect", ["inspect", "-m", m2])]:
    rc, err = to_dev_full(*args)
    lines = [l for l in err.strip().splitlines() if not l.startswith(REPORT_PREFIXES)]
    check(f"{name} > /dev/full exits 1 with one line", rc == 1 and lines == [full_msg], (rc, err))

# Without -m: the shipped model (models/default, trained by this engine on the KJV). Its text is
# English: most generated words are whole words of its 4,096-token BPE (random weights give
# fragments: a word split over several tokens, or none at all).
rc, out, err = run("generate", "-p", "And God said", "-n", "40", "--seed", "3", "--temp", "0.7")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "default",
                       "tokenizer.json"), encoding="utf-8") as f:
    vocab = json.load(f)["model"]["vocab"]
words = re.findall(r"[A-Za-z]+", out[len("And God said"):])
whole = [w for w in words if "\u0120" + w in vocab or "\u0120" + w.lower() in vocab]
check(f"generate without -m: the shipped model writes English ({len(whole)} of {len(words)} words whole)",
      rc == 0 and out.startswith("And God said") and len(words) >= 15 and len(whole) >= 0.8 * len(words),
      (rc, out, err[-300:]))
rc, out, err = run("generate", "-p", "hi", "-n", "2", env={"HYBRIDLM_DEFAULT_MODEL": os.path.join(scratch, "none")})
check("generate without -m and no default model: one line saying to give -m",
      rc == 1 and "give -m" in err and len(err.strip().splitlines()) == 1, err)

# chat: each line a user turn on the plain chat format (no template in this model), greedy; the
# first answer is generate's on the rendered prompt, and turn 2 reuses turn 1 (prompt + answer).
rc, out, err = run("chat", "-m", jamba, "-n", "6", "--temp", "0", "-t", "2", stdin="Hello there\nAnd then?\n")
turns = re.findall(r"turn (\d): (\d+) prompt tokens \((\d+) reused\), (\d+) generated", err)
check("chat: two turns from two lines of input, an answer line each",
      rc == 0 and len(turns) == 2 and len(out.splitlines()) == 2, (rc, out, err[-300:]))
rc2, first, err2 = run("generate", "-m", jamba, "-e", "-p", "User: Hello there\\nAssistant:", "-n", "6", "--temp", "0",
                       "--no-display-prompt", "--quiet", "-t", "2")
check("chat: the first answer is generate's on the rendered prompt", rc == rc2 == 0 and
      out.splitlines()[0] == first.rstrip("\n"), (out, first, err2))
check("chat: the second turn reuses the first turn's tokens",
      len(turns) == 2 and int(turns[1][2]) >= int(turns[0][1]), turns)

finish()
