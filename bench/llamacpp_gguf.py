"""A random-weight Mamba / Mamba-2 checkpoint (config.json + model.safetensors, f32) as a GGUF f32
file for llama.cpp's llama-bench, for the side-by-side benchmark in docs/benchmarks.md.

Needs numpy and llama.cpp's `gguf-py` package from a llama.cpp checkout kept OUTSIDE this
repository (passed as GGUF_PY). The tensor names and transforms are those of llama.cpp's own
converter for Mamba / Mamba-2 (which needs torch): A = -exp(A_log), conv weights squeezed to
(channels, K), Mamba-2's A and D as (heads, 1) and its norm as (groups, d_inner / groups). The
GPT-NeoX vocabulary is padded to the embedding rows. Q8_0 files come from llama-quantize.

Usage: python3 bench/llamacpp_gguf.py GGUF_PY MODEL_DIR TOKENIZER_JSON OUT.gguf
"""
import json, struct, sys
from pathlib import Path
import numpy as np

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402

model_dir, tok_path, out = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
cfg = json.loads((model_dir / "config.json").read_text())

def tensors():
    f = open(model_dir / "model.safetensors", "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    base = 8 + n
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", k
        b, e = v["data_offsets"]
        f.seek(base + b)
        yield k, np.frombuffer(f.read(e - b), dtype=np.float32).reshape(v["shape"]).copy()

mamba2 = cfg["model_type"] == "mamba2"
arch = "mamba2" if mamba2 else "mamba"
w = gguf.GGUFWriter(out, arch)
d_model, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
d_inner = cfg.get("intermediate_size") or cfg["expand"] * d_model
w.add_context_length(2**20)
w.add_embedding_length(d_model)
w.add_feed_forward_length(0)
w.add_head_count(0)
w.add_block_count(n_layer)
w.add_ssm_conv_kernel(cfg["conv_kernel"])
w.add_ssm_inner_size(d_inner)
w.add_ssm_state_size(cfg["state_size"])
if mamba2:
    w.add_ssm_time_step_rank(d_inner // cfg["head_dim"])
    w.add_ssm_group_count(cfg["n_groups"])
else:
    w.add_ssm_time_step_rank(cfg["time_step_rank"])
    w.add_ssm_dt_b_c_rms(False)
w.add_layer_norm_rms_eps(cfg["layer_norm_epsilon"])
w.add_file_type(gguf.LlamaFileType.ALL_F32)

# GPT-NeoX BPE vocabulary, padded to the embedding rows.
tok = json.loads(tok_path.read_text())
vocab = tok["model"]["vocab"]
added = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
n_vocab = cfg["vocab_size"]
inv = {i: s for s, i in vocab.items()}
inv.update(added)
tokens, types = [], []
for i in range(n_vocab):
    if i in inv:
        tokens.append(inv[i])
        types.append(gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL)
    else:
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("default")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
w.add_bos_token_id(0)
w.add_eos_token_id(0)

for name, t in tensors():
    if name == "backbone.embeddings.weight":
        w.add_tensor("token_embd.weight", t); continue
    if name == "backbone.norm_f.weight":
        w.add_tensor("output_norm.weight", t); continue
    if name == "lm_head.weight":
        w.add_tensor("output.weight", t); continue
    parts = name.split(".")
    assert parts[0] == "backbone" and parts[1] == "layers", name
    i, rest = int(parts[2]), ".".join(parts[3:])
    p = f"blk.{i}."
    m = {
        "norm.weight": "attn_norm.weight",
        "mixer.in_proj.weight": "ssm_in.weight",
        "mixer.conv1d.weight": "ssm_conv1d.weight",
        "mixer.conv1d.bias": "ssm_conv1d.bias",
        "mixer.x_proj.weight": "ssm_x.weight",
        "mixer.dt_proj.weight": "ssm_dt.weight",
        "mixer.dt_proj.bias": "ssm_dt.bias",
        "mixer.dt_bias": "ssm_dt.bias",
        "mixer.A_log": "ssm_a",
        "mixer.D": "ssm_d",
        "mixer.norm.weight": "ssm_norm.weight",
        "mixer.out_proj.weight": "ssm_out.weight",
    }[rest]
    if rest == "mixer.conv1d.weight":
        t = t.reshape(t.shape[0], t.shape[2])
    if rest == "mixer.A_log":
        t = -np.exp(t)
    if mamba2 and rest in ("mixer.A_log", "mixer.D"):
        t = t.reshape(t.shape[0], 1)
    if mamba2 and rest == "mixer.norm.weight":
        t = t.reshape(cfg["n_groups"], d_inner // cfg["n_groups"])
    w.add_tensor(p + m, t)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out)
