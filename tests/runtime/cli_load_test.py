"""The model-loading flags every subcommand shares (ModelFlags, tools/hybridlm/cli.h) and the
sizes `plan` predicts for them: --dtype auto, -t, -m, the load summary, --quiet / --verbose,
inspect --json and the layer pattern."""
import json
import os
import re
import subprocess

from cli_common import check, expect_error, finish, make_model, neox, run, scratch, start, tool

start()


def make_dtype_model(name, preset, dtype):
    d = os.path.join(scratch, name)
    subprocess.run(["/usr/bin/python3", tool, "--preset", preset, "--out", d, "--tokenizer", neox, "--seed", "5",
                    "--dtype", dtype], check=True, capture_output=True)
    return d


def inspect_json(*args):
    rc, out, err = run("inspect", *args, "--json")
    try:
        return json.loads(out) if rc == 0 else {}, err
    except ValueError:
        return {}, out + err


def plan_json(*args):
    rc, out, err = run("plan", *args, "--json")
    return json.loads(out) if rc == 0 else {}, err


jamba = make_model("jamba-tiny", "jamba-tiny", 5)
zamba = make_model("zamba2-tiny", "zamba2-tiny", 5)
falcon = make_model("falcon-h1-tiny", "falcon-h1-tiny", 5)
mamba2 = make_model("mamba2-tiny", "mamba2-tiny", 5)
jamba_bf16 = make_dtype_model("jamba-bf16", "jamba-tiny", "bf16")
zamba_f16 = make_dtype_model("zamba2-f16", "zamba2-tiny", "f16")

# --dtype auto (the default): the checkpoint's own dtype where the CPU path computes it at full
# speed; f16 loads as bf16.
for d, stored, held in [(jamba, "f32", "f32"), (jamba_bf16, "bf16", "bf16"), (zamba_f16, "f16", "bf16")]:
    j, err = inspect_json("-m", d)
    check(f"--dtype auto holds the {stored} checkpoint as {held}",
          j.get("dtype") == held and j.get("checkpoint_dtype") == stored, j or err)
j, err = inspect_json("-m", jamba_bf16, "--dtype", "f32")
check("an explicit --dtype still wins over the checkpoint's", j.get("dtype") == "f32", j or err)
expect_error("bad --dtype names auto among the choices", ["inspect", "-m", jamba, "--dtype", "q4"], 1,
             "--dtype q4: unsupported (use auto, f32, bf16, q8_0 or q4_0)")

# plan with default flags sizes what a run with default flags allocates: the weights of a --no-mmap
# load, the state and KV dtypes the runtime defaults to.
for d in [jamba, zamba, falcon, mamba2, jamba_bf16, zamba_f16]:
    name = os.path.basename(d)
    p, perr = plan_json("-m", d)
    j, jerr = inspect_json("-m", d, "--no-mmap")
    check(f"plan's default weight bytes equal a default --no-mmap load ({name})",
          p and j and p.get("dtype") == j.get("dtype") and p.get("weight_bytes") == j.get("weight_bytes"),
          f"{p or perr} {j or jerr}")
    check(f"plan's default state and KV dtypes and sizes are the runtime's ({name})",
          p and j and all(p.get(k) == j.get(k) for k in ["state_dtype", "kv_dtype", "kv_bytes_per_token",
                                                        "conv_state_bytes_per_sequence",
                                                        "ssm_state_bytes_per_sequence"]),
          f"{p or perr} {j or jerr}")
p, err = plan_json("--config", os.path.join(zamba_f16, "config.json"))
check("plan --config reads torch_dtype for --dtype auto (float16 -> bf16)",
      p.get("dtype") == "bf16" and "torch_dtype float16" in p.get("dtype_source", ""), p or err)
p2, err = plan_json("-m", zamba_f16)
check("plan --config and plan -m agree on an f16 checkpoint", p and p.get("weight_bytes") == p2.get("weight_bytes"),
      f"{p} {p2 or err}")
cfg = os.path.join(scratch, "no-dtype.json")
with open(os.path.join(jamba_bf16, "config.json")) as f:
    c = json.load(f)
c.pop("torch_dtype", None)
c.pop("dtype", None)
with open(cfg, "w") as f:
    json.dump(c, f)
p, err = plan_json("--config", cfg)
check("plan --config without torch_dtype plans f32 and says why",
      p.get("dtype") == "f32" and "no torch_dtype" in p.get("dtype_source", ""), p or err)
rc, out, err = run("plan", "-m", jamba_bf16)
check("plan's text names the resolved dtype and where it came from",
      rc == 0 and "at --dtype bf16 (auto, from the safetensors headers: BF16)" in out, out + err)
p, _ = plan_json("-m", jamba, "-c", "100")
p2, _ = plan_json("-m", jamba, "--context", "100")
check("plan -c is --context, as -c is --ctx-size for a run", p and p.get("context") == 100 and p == p2, f"{p} {p2}")

# -t: the default is shown; above the CPUs there are it warns once and runs.
rc, out, err = run("generate", "--help")
check("-t shows its default", rc == 0 and re.search(r"-t,--threads INT=0 +threads; 0 = all \d+ CPUs", out), out)
cores = len(os.sched_getaffinity(0))
rc, out, err = run("score", "-m", jamba, "--ids", "1,2,3", "--logits-out", os.path.join(scratch, "l.npy"), "-t",
                   str(cores + 1))
warnings = [l for l in err.splitlines() if l.startswith("warning:")]
check("-t above the CPUs warns once and runs", rc == 0 and len(warnings) == 1 and warnings[0].startswith(
    f"warning: --threads {cores + 1} is more than the {cores} CPUs this process may use"), err)
rc, out, err = run("score", "-m", jamba, "--ids", "1,2,3", "--logits-out", os.path.join(scratch, "l.npy"), "-t", "1")
check("-t within the CPUs: no warning", rc == 0 and "warning" not in err, err)

# -m: a directory or a file inside one; a wrong path is named before anything else.
rc, want, err = run("inspect", "-m", jamba)
for f in ["model.safetensors", "config.json"]:
    rc, out, err = run("inspect", "-m", os.path.join(jamba, f))
    check(f"-m DIR/{f} loads DIR", rc == 0 and out.split("\n", 1)[1] == want.split("\n", 1)[1], out + err)
nope = os.path.join(scratch, "nope")
for args in [["inspect", "-m", nope], ["generate", "-m", nope, "-p", "x"], ["plan", "-m", nope],
             ["inspect", "-m", os.path.join(nope, "config.json")]]:
    rc, out, err = run(*args)
    check(f"{args[0]} -m {os.path.basename(args[2])}: exit 1, the missing path on the first line of stderr",
          rc == 1 and err.splitlines()[:1] == [f"error: -m {args[2]}: no such file or directory"], err)

# One summary line on stderr once the model is loaded; --quiet leaves stderr empty on success but
# still prints errors; --verbose adds a line per tensor and progress, with no \r off a terminal.
rc, out, err = run("inspect", "-m", jamba_bf16)
lines = err.splitlines()
check("load summary: one line with family, parameters, dtypes, CPU path, threads, time",
      rc == 0 and len(lines) == 1 and re.fullmatch(
          r"loaded jamba: 6\.73 M parameters, weights bf16 \(checkpoint bf16, --dtype auto\), state f32, KV bf16, "
          r"(cpu path \w+|ref kernels), 1 thread, \d+\.\d\d s", lines[0]), err)
rc, out, err = run("inspect", "-m", mamba2, "--dtype", "f32", "--state-dtype", "bf16")
check("load summary: explicit dtypes, and no KV for a model without attention",
      rc == 0 and "weights f32 (checkpoint f32), state bf16, KV none," in err, err)
rc, out, err = run("inspect", "-m", jamba, "--quiet")
check("--quiet: nothing on stderr on success", rc == 0 and err == "" and "layer pattern:" in out, err)
expect_error("--quiet still prints errors", ["inspect", "-m", jamba, "--quiet", "--dtype", "q4"], 1,
             "--dtype q4: unsupported")
rc, out, err = run("score", "-m", jamba, "--ids", "1,2", "--logits-out", os.path.join(scratch, "l.npy"), "--quiet")
check("--quiet drops the cache line", rc == 0 and "loaded " not in err and "cache:" not in err, err)
rc, out, err = run("inspect", "-m", jamba_bf16, "--verbose")
check("--verbose: a line per tensor, progress to 100%, the summary; no \\r off a terminal",
      rc == 0 and "\r" not in err and "  model.embed_tokens.weight: bf16 (50288, 64) -> bf16 mapped" in err and
      re.search(r"^loading weights: 100% \(", err, re.M) and re.search(r"^loaded jamba: ", err, re.M), err[-600:])
rc, out, err = run("inspect", "-m", jamba, "--verbose", "--quiet")
check("--verbose and --quiet exclude each other (usage error)", rc == 2, err)

# inspect --json, and the layer pattern shows every block kind.
j, err = inspect_json("-m", zamba)
keys = ["model", "family", "architecture", "layers", "layer_pattern", "layer_kinds", "hidden_size", "vocab_size",
        "tied_embedding", "parameters", "dtype", "checkpoint_dtype", "weight_bytes", "mapped_bytes", "state_dtype",
        "conv_state_bytes_per_sequence", "ssm_state_bytes_per_sequence", "state_bytes_per_sequence", "kv_dtype",
        "kv_bytes_per_token", "kernels", "cpu_path"]
check("inspect --json parses and has every key", j and all(k in j for k in keys), j or err)
check("inspect --json: Zamba2's hybrid layers show their shared attention",
      j.get("layer_kinds", []).count("shared_attention+mamba2") == 3 and j["layer_kinds"].count("mamba2") == 4 and
      j.get("kv_bytes_per_token", 0) > 0, j)
rc, out, err = run("inspect", "-m", zamba)
check("inspect: Zamba2's layer pattern names the shared attention",
      rc == 0 and "layer pattern:  mamba2 x1, shared_attention+mamba2 x1, mamba2 x1," in out, out + err)
rc, out, err = run("inspect", "-m", falcon)
check("inspect: Falcon-H1's layer pattern names both parallel mixers and the MLP",
      rc == 0 and "layer pattern:  mamba2||attention+mlp x3" in out, out + err)
rc, out, err = run("plan", "-m", zamba)
check("plan: Zamba2's per-kind lines name the shared attention",
      rc == 0 and "shared_attention+mamba2 x3" in out and "shared_attention+mamba2" in out.split("family:")[1], out + err)

finish()
