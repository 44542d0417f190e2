"""README.md's "Using it" section against the binary: every command line of its example block runs
(exit 0) on a tiny model, each flag it uses is in that subcommand's --help, and every flag the
section names in backticks is in some subcommand's --help."""
import os
import re
import shlex
import subprocess
import time
import urllib.request

from cli_common import check, exe, finish, make_model, scratch, start

start()
model = make_model("hybrid", "hybridlm-tiny", 3)  # Mamba-2 and attention layers: KV and state
readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
with open(readme, encoding="utf-8") as f:
    text = f.read()
section = text[text.index("## Using it"):]
section = section[:section.index("\n## ", 1)]
block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)

with open(os.path.join(scratch, "prompt.txt"), "w") as f:
    f.write("Once upon a time\n")
with open(os.path.join(scratch, "text.txt"), "w") as f:
    f.write("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20)

with open(os.path.join(scratch, "train.yaml"), "w") as f:  # the README's train line, after prepare-data's
    f.write("model: {block_pattern: [m2, t], hidden_size: 32, ssm: {d_state: 8, head_dim: 16},\n"
            "        attention: {num_heads: 2}}\n"
            "tokenizer: tok\ndata: {train: data/train.bin}\nbatch: {sequences: 2, seq_len: 8}\n"
            "steps: 2\nthreads: 1\nout: run\n")

helps = {}


def help_of(sub):
    if sub not in helps:
        helps[sub] = subprocess.run([exe, sub, "--help"], capture_output=True, text=True, timeout=60).stdout
    return helps[sub]


def flags_in(help_text):
    return set(re.findall(r"(?<![\w-])(-{1,2}[a-z][a-z0-9-]*)", help_text))


commands = [l for l in block.splitlines() if l.startswith("$B ")]
check("the example block has a line for every subcommand",
      {shlex.split(l, comments=True)[1] for l in commands} >= {"generate", "score", "perplexity", "tokenize", "inspect", "bench",
                                                "plan", "train-tokenizer", "prepare-data", "train", "grad", "serve",
                                                "help"}, commands)
for line in commands:
    args = shlex.split(line, comments=True)[1:]
    args = [model if a == "DIR" else a for a in args]
    sub = args[1] if args[0] == "help" else args[0]
    known = flags_in(help_of(sub))
    used = [a.split("=")[0] for a in args if re.fullmatch(r"-{1,2}[a-z][a-z0-9-]*(=.*)?", a)]
    check(f"README `{line[3:60]}`: its flags are in `{sub} --help`", all(u in known for u in used),
          [u for u in used if u not in known])
    if sub == "serve":  # runs until stopped: it must come up (on any free port) and answer /health
        args = ["0" if a == "8080" else a for a in args]
        proc = subprocess.Popen([exe, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=scratch)
        ready, port, deadline, no_http = False, None, time.time() + 60, False
        while time.time() < deadline:
            l = proc.stderr.readline()
            if not l:
                break
            no_http = no_http or "has no HTTP server" in l  # a build without cpp-httplib (aarch64 cross)
            m = re.search(r"listening on http://[\d.]+:(\d+)", l)
            port = int(m.group(1)) if m else port
            if "serve: ready" in l:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
                    ready = r.status == 200
                break
        proc.terminate()
        rc = proc.wait(timeout=30)
        if no_http:
            check(f"README `{line[3:60]}`: this build says it has no HTTP server", rc == 1)
        else:
            check(f"README `{line[3:60]}` runs and answers /health", ready and rc == 0)
        continue
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300, cwd=scratch, stdin=subprocess.DEVNULL)
    check(f"README `{line[3:60]}` runs", p.returncode == 0, p.stderr[-400:])

all_flags = set()
for sub in ["generate", "score", "perplexity", "tokenize", "inspect", "bench", "plan", "train-tokenizer",
            "prepare-data", "train", "grad", "serve", "chat"]:
    all_flags |= flags_in(help_of(sub))
about_cli = section.split("Make a random-weight checkpoint")[0]  # the rest is about tools/make_test_checkpoint.py
named = set(re.findall(r"`(-{1,2}[a-z][a-z0-9-]*)", about_cli))
check("every flag the section names is in some subcommand's --help", named and named <= all_flags,
      sorted(named - all_flags))

finish()
