"""Training from the CLI: `hybridlm train --config train.yaml [--resume]` on a tiny model and data
made here (train-tokenizer + prepare-data on Tiny Shakespeare): the loss falls, a resumed run
continues bit-exactly, the checkpoint loads in generate and score, MPI with 2 ranks gives the
losses of 1 process, and every bad input is a one-line error with no checkpoint left behind."""
import json
import os
import shutil
import subprocess

from cli_common import check, data, exe, expect_error, finish, make_model, run, scratch, start

start()
with open(os.path.join(data, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
    shakespeare = f.read()
corpus = os.path.join(scratch, "shakespeare.txt")
with open(corpus, "w", encoding="utf-8") as f:
    f.write(shakespeare[:300_000])
tok = os.path.join(scratch, "tok")
tokdata = os.path.join(scratch, "data")
rc, _, err = run("train-tokenizer", "-i", corpus, "--vocab-size", "512", "-o", tok)
check("train-tokenizer for the run", rc == 0, err)
rc, _, err = run("prepare-data", "--tokenizer", tok, "-i", corpus, "-o", tokdata)
check("prepare-data for the run", rc == 0, err)

MODEL = """model:
  block_pattern: [m2, t, m]
  hidden_size: 64
  ssm: {d_state: 16, head_dim: 16, chunk_size: 16}
  attention: {num_heads: 4, num_kv_heads: 2}
  mlp: {intermediate_size: 128}
"""


def write_yaml(name, body, out=None):
    d = os.path.join(scratch, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "train.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(body.replace("OUT", out or os.path.join(d, "run")).replace("DATA", tokdata).replace("TOK", tok))
    return path, os.path.join(d, "run")


def losses(run_dir, key="loss"):
    vals = []
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            j = json.loads(line)
            if key in j:
                vals.append((j["step"], j[key]))
    return vals


# 1. Fifty steps: the loss falls from ln(512) = 6.24 to below a bound.
RUN = MODEL + """tokenizer: TOK
data: {train: DATA/train.bin, validation: DATA/val.bin}
optimizer: {lr: 3.0e-3, weight_decay: 0.1, grad_clip: 1.0}
schedule: {kind: cosine, warmup_steps: 5}
batch: {sequences: 4, seq_len: 64}
steps: 50
eval_interval: 25
eval_batches: 4
checkpoint_interval: 25
log_interval: 5
seed: 7
threads: 2
out: OUT
"""
# 50 steps of 4 x 64 tokens (12,800 tokens) take the loss from ~6.2 (first 5 steps) to ~4.95.
LOSS_BOUND = 5.3
cfg, out = write_yaml("fifty", RUN)
rc, _, err = run("train", "--config", cfg, timeout=600)
tl = losses(out) if rc == 0 else []
vl = losses(out, "val_loss") if rc == 0 else []
check("train: 50 steps run", rc == 0 and tl and tl[-1][0] == 50, err[-500:])
check(f"train: loss falls below {LOSS_BOUND} (first {tl[0][1] if tl else '?'}, last {tl[-1][1] if tl else '?'})",
      tl and tl[0][1] > 5.0 and tl[-1][1] < LOSS_BOUND, tl)
check("train: validation loss at steps 25 and 50", [s for s, _ in vl] == [25, 50] and vl[-1][1] < vl[0][1] + 0.5, vl)
check("train: progress lines with step, loss, lr, tok/s and ETA",
      "step 50/50" in err and "tok/s" in err and "ETA" in err and "lr " in err, err[-300:])
final = os.path.join(out, "step-50")
check("train: checkpoints step-25 and step-50 with the model files and trainer state",
      all(os.path.exists(os.path.join(out, s, f)) for s in ("step-25", "step-50")
          for f in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json",
                    "optimizer.safetensors")), os.listdir(out) if os.path.isdir(out) else out)
check("train: loss_curve.svg next to the checkpoints", os.path.exists(os.path.join(out, "loss_curve.svg")))
check("train: no temporary directory left", not [n for n in os.listdir(out) if n.startswith(".")] if
      os.path.isdir(out) else False)
rc, gen, err = run("generate", "-m", final, "-p", "ROMEO:", "-n", "8", "--seed", "1", "--temp", "0")
check("generate loads the trained checkpoint", rc == 0 and gen.startswith("ROMEO:"), err[-300:])
rc, sc, err = run("score", "-m", final, "-p", "First Citizen: Before we proceed any further, hear me speak.")
check("score loads the trained checkpoint", rc == 0 and '"perplexity"' in sc, err[-300:])

# 1b. Discrete Mamba-2 blocks train too (their gradients: test_grad_engine.py): 30 steps of
# [m2d, t, m2d] take the loss from ~6.2 to ~5.2 (measured 5.16 at step 30 of a 50-step run).
M2D = RUN.replace("[m2, t, m]", "[m2d, t, m2d]").replace("steps: 50", "steps: 30") \
         .replace("eval_interval: 25", "eval_interval: 30").replace("checkpoint_interval: 25", "checkpoint_interval: 30")
cfg, out = write_yaml("m2d", M2D)
rc, _, err = run("train", "--config", cfg, "-q", timeout=600)
tl = losses(out) if rc == 0 else []
check(f"train m2d: loss falls below 5.5 (first {tl[0][1] if tl else '?'}, last {tl[-1][1] if tl else '?'})",
      rc == 0 and tl and tl[-1][0] == 30 and tl[0][1] > 5.0 and tl[-1][1] < 5.5, err[-500:])
rc, sc, err = run("score", "-m", os.path.join(out, "step-30"), "-p", "First Citizen: Before we proceed any further.")
check("score loads the m2d checkpoint", rc == 0 and '"perplexity"' in sc, err[-300:])

# 2. Resume after a kill equals the uninterrupted run, step for step, bit for bit.
RESUME = RUN.replace("steps: 50", "steps: 8").replace("checkpoint_interval: 25", "checkpoint_interval: 3") \
            .replace("log_interval: 5", "log_interval: 1").replace("eval_interval: 25", "eval_interval: 4")
# The straight run keeps only its 2 newest checkpoints (keep_checkpoints), which changes nothing else.
cfg_a, out_a = write_yaml("straight", RESUME.replace("checkpoint_interval: 3", "checkpoint_interval: 3\nkeep_checkpoints: 2"))
cfg_b, out_b = write_yaml("resumed", RESUME)
rc_a, _, err_a = run("train", "--config", cfg_a, "-q", timeout=300)
rc_b1, _, err_b1 = run("train", "--config", cfg_b, "-q", "--stop-after", "5", timeout=300)
rc_b2, _, err_b2 = run("train", "--config", cfg_b, "--resume", timeout=300)
la, lb = (losses(out_a), losses(out_b)) if rc_a == rc_b1 == rc_b2 == 0 else ([], [])
check("resume: continues from the last checkpoint (step 3)", "resuming from" in err_b2 and "step 3" in err_b2,
      err_b2[-300:])
check("resume: the 8 losses equal the uninterrupted run's exactly", len(la) == 8 and la == lb, f"{la} vs {lb}")
check("resume: validation losses equal too", losses(out_a, "val_loss") == losses(out_b, "val_loss"))
left = sorted(n for n in os.listdir(out_a) if n.startswith("step-") or n.startswith("."))
check("keep_checkpoints: 2 leaves step-6 and step-8 of step-3, -6, -8 (nothing hidden)", left == ["step-6", "step-8"],
      left)
with open(os.path.join(out_a, "step-8", "model.safetensors"), "rb") as fa, \
        open(os.path.join(out_b, "step-8", "model.safetensors"), "rb") as fb:
    check("resume: the final weights are byte-identical", fa.read() == fb.read())
rc, _, err = run("train", "--config", write_yaml("noresume", RESUME)[0], "--resume")
check("resume with no checkpoint: one-line error", rc == 1 and "no checkpoint to resume" in err and
      len(err.strip().splitlines()) == 1, err)

# 3. MPI: 2 ranks, each half of every batch, give the losses of 1 process (float32 reduction order).
mpirun = shutil.which("mpirun")
if mpirun:
    cfg_m, out_m = write_yaml("mpi", RESUME)
    env = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_plm_rsh_agent="", OMPI_MCA_rmaps_base_oversubscribe="1")
    # Under the sanitizer build, no LeakSanitizer for these ranks: Open MPI never frees ~120 KB from
    # MPI_Init (see tests/train/CMakeLists.txt); the single-process runs above are leak-checked.
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    p = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", exe, "train", "--config", cfg_m,
                        "-q"], capture_output=True, text=True, timeout=300, env=env)
    if "built without MPI" in p.stderr:  # the aarch64 cross build has no MPI: it must say so
        check("mpirun -np 2 on a build without MPI: the error says so", p.returncode != 0, p.stderr[-300:])
    else:
        lm = losses(out_m) if p.returncode == 0 else []
        worst = max((abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(lm, la)), default=1.0)
        check(f"mpirun -np 2: the losses of 1 process within 1e-5 (worst {worst:.1e})",
              len(lm) == 8 and worst < 1e-5, (p.stderr[-500:], lm, la))
else:
    check("mpirun is installed (scripts/setup.sh installs openmpi-bin)", False)

# 4. Bad input: one line, exit 1, no checkpoint left behind.
def bad(name, body, needle, extra_files=None):
    cfg, out = write_yaml("bad_" + name, body)
    for path, content in (extra_files or {}).items():
        with open(path, "wb") as f:
            f.write(content)
    expect_error(f"bad input: {name}", ["train", "--config", cfg], 1, needle)
    check(f"bad input: {name}: no checkpoint written", not os.path.exists(out) or
          not [n for n in os.listdir(out) if n.startswith("step-") or n.startswith(".tmp")])


bad("unknown block kind", RUN.replace("[m2, t, m]", "[m2, x, m]"), "x")
bad("unknown key", RUN.replace("steps: 50", "stepz: 50"), "stepz")
bad("YAML type error", RUN.replace("lr: 3.0e-3", "lr: fast"), "optimizer.lr")
empty = os.path.join(scratch, "empty_data", "train.bin")
os.makedirs(os.path.dirname(empty), exist_ok=True)
shutil.copy(os.path.join(tokdata, "index.json"), os.path.dirname(empty))
bad("empty data file", RUN.replace("DATA/train.bin", empty), "empty", {empty: b""})
missing = os.path.join(scratch, "missing.bin")
bad("missing data file", RUN.replace("DATA/train.bin", missing), "missing.bin")
big = os.path.join(scratch, "big_id", "train.bin")
os.makedirs(os.path.dirname(big), exist_ok=True)
shutil.copy(os.path.join(tokdata, "index.json"), os.path.dirname(big))
n_train = os.path.getsize(os.path.join(tokdata, "train.bin")) // 2  # uint16 ids: a 512-token vocabulary
bad("token id beyond the vocabulary", RUN.replace("DATA/train.bin", big), "vocab",
    {big: (b"\x05\x00" * (n_train - 1)) + b"\xff\x7f"})
bad("sequence longer than the data", RUN.replace("seq_len: 64", "seq_len: 500000"), "fewer than seq_len")
blocker = os.path.join(scratch, "not_a_dir")
with open(blocker, "w") as f:
    f.write("x")
cfg_nw, _ = write_yaml("bad_unwritable", RUN, out=os.path.join(blocker, "run"))
expect_error("bad input: run directory not writable", ["train", "--config", cfg_nw], 1, "not_a_dir")

# A full disk: the run directory on a 128 KiB tmpfs (where this user may mount one), else a 64 KiB
# file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: the write fails with EFBIG). The first checkpoint
# (~1.6 MB of f32 weights and optimizer moments) cannot be written: one line, exit 1, no step-*
# and no .tmp-* directory left.
full_root = os.path.join(scratch, "full_disk")
os.makedirs(full_root, exist_ok=True)
mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", full_root],
                         capture_output=True).returncode == 0 if os.geteuid() == 0 else False
cfg_full, out_full = write_yaml("bad_full_disk", RUN.replace("steps: 50", "steps: 6"),
                                out=os.path.join(full_root, "run"))


def limit_file_size():
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


# Families whose blocks the trainer does not compute are refused by name, not trained as something else.
for preset, needle in [("zamba-tiny", "multi-head Mamba-1 (zamba) is not supported"),
                       ("jamba-tiny", "Mamba-1 with dt/B/C norms (falcon_mamba, jamba) is not supported"),
                       ("lfm2-moe-tiny", "the mixer 'short_conv+mlp' is not supported"),
                       ("qwen3-next-tiny", "zero-centred (1 + w) norms (qwen3_next) is not supported")]:
    expect_error(f"grad refuses {preset}", ["grad", "-m", make_model(preset, preset, 3), "--ids", "1,2,3"], 1, needle)

try:
    p = subprocess.run([exe, "train", "--config", cfg_full, "-q"], capture_output=True, text=True, timeout=120,
                       preexec_fn=None if mounted else limit_file_size)
    left = os.listdir(out_full) if os.path.isdir(out_full) else []
    how = "a 128 KiB tmpfs" if mounted else "a 64 KiB file-size limit"
    check(f"bad input: full disk ({how}): one-line error", p.returncode == 1 and
          len(p.stderr.strip().splitlines()) == 1 and "write failed" in p.stderr, (p.returncode, p.stderr[-300:]))
    check("bad input: full disk: no checkpoint written",
          not [n for n in left if n.startswith("step-") or n.startswith(".tmp")], left)
finally:
    if mounted:
        subprocess.run(["umount", full_root])
finish()
