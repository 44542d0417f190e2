"""A random-weight Mamba / Mamba-2 / Granite-4.0-H checkpoint (config.json + model.safetensors, f32) as
a GGUF f32 file for llama.cpp's llama-bench, for the side-by-side benchmark in docs/benchmarks.md.

Needs numpy and llama.cpp's `gguf-py` package from a llama.cpp checkout kept OUTSIDE this
repository (passed as GGUF_PY). The tensor names and transforms are those of llama.cpp's own
converter for Mamba / Mamba-2 (which needs torch): A = -exp(A_log), conv weights squeezed to
(channels, K), Mamba-2's A and D as (heads, 1) and its norm as (groups, d_inner / groups). The
GPT-NeoX vocabulary is padded to the embedding rows. Q8_0 files come from llama-quantize.

granitemoehybrid (dense, num_local_experts 0) becomes llama.cpp's `granitehybrid` arch, with the
names and transforms of its converter read as facts: Mamba-2 layers as above (ssm_*), attention
layers attn_{q,k,v,output} with q/k rows regrouped per head as llama.cpp's RoPE layout wants
(no effect without RoPE, done for fidelity), the fused shared_mlp.input_linear [gate; up] split
into ffn_gate / ffn_up, output_linear as ffn_down, post_attention_layernorm as ffn_norm; the
per-layer KV head count is 0 on recurrent layers (that is how llama.cpp tells them apart); the
µP multipliers go to {embedding,residual,attention,logit}_scale; NoPE is rope.scaling.finetuned
= false.

qwen3_next becomes llama.cpp's `qwen3next` arch (gated DeltaNet every layer but each
full_attention_interval-th, MoE with a gated shared expert in every layer; llama.cpp needs
d_k = d_v and experts): in_proj_qkvz, stored per key head as [q, k, v, z] rows, is regrouped into
attn_qkv = [all q; all k; all v] and attn_gate = all z (value heads keep their per-key-head grouping);
in_proj_ba goes as is to ssm_ba, A = -exp(A_log) to ssm_a, dt_bias to ssm_dt.bias; the
zero-centred RMSNorm weights (every *norm.weight except the DeltaNet's own gated norm) get + 1;
experts are stacked into ffn_{gate,up,down}_exps; the attention q_proj (per head [q, gate]) is
copied as is (llama.cpp splits it; NeoX RoPE needs no row regrouping).

Usage: python3 bench/llamacpp_gguf.py GGUF_PY MODEL_DIR TOKENIZER_JSON OUT.gguf
bench/llamacpp_check.py checks a converted file against its checkpoint (greedy tokens, log-probabilities).
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

family = cfg["model_type"]
ARCH = {"mamba": "mamba", "mamba2": "mamba2", "granitemoehybrid": "granitehybrid", "qwen3_next": "qwen3next"}
if family not in ARCH:
    sys.exit(f"llamacpp_gguf: model_type {family!r} is not converted here ({', '.join(ARCH)})")
mamba2 = family == "mamba2"
granite = family == "granitemoehybrid"
qwen3next = family == "qwen3_next"
arch = ARCH[family]
w = gguf.GGUFWriter(out, arch)
d_model, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
w.add_context_length(2**20)
w.add_embedding_length(d_model)
w.add_block_count(n_layer)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
if granite:
    if cfg.get("num_local_experts", 8):
        sys.exit("llamacpp_gguf: granitemoehybrid with experts is not converted here (num_local_experts must be 0)")
    if cfg.get("position_embedding_type") == "rope":
        sys.exit("llamacpp_gguf: granitemoehybrid with RoPE is not converted here (position_embedding_type)")
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n_layer
    attn_layers = [t in ("attention", "full_attention") for t in types]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    d_inner = int(cfg.get("mamba_expand", 2) * d_model)
    n_group, d_ssm_head = cfg.get("mamba_n_groups", 1), cfg.get("mamba_n_heads", 128)
    ff = cfg["shared_intermediate_size"]
    w.add_feed_forward_length(ff)
    w.add_expert_shared_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([n_kv if a else 0 for a in attn_layers])
    w.add_rope_dimension_count(d_model // n_head)
    w.add_rope_scaling_finetuned(False)  # llama.cpp's switch for RoPE: Granite-4.0-H is NoPE
    w.add_expert_count(0)
    w.add_expert_used_count(0)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_embedding_scale(cfg.get("embedding_multiplier", 1.0))
    w.add_residual_scale(cfg.get("residual_multiplier", 1.0))
    w.add_attention_scale(cfg.get("attention_multiplier", 1.0))
    w.add_logit_scale(cfg.get("logits_scaling", 1.0))
    w.add_ssm_conv_kernel(cfg.get("mamba_d_conv", 4))
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(cfg.get("mamba_d_state", 256))
    w.add_ssm_time_step_rank(d_ssm_head)  # llama.cpp's name for the Mamba-2 head count
    w.add_ssm_group_count(n_group)
elif qwen3next:
    n_head, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    n_exp = cfg.get("num_experts", 0)
    if dk != dv:
        sys.exit("llamacpp_gguf: llama.cpp's qwen3next needs linear_key_head_dim == linear_value_head_dim")
    if not n_exp or cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        sys.exit("llamacpp_gguf: llama.cpp's qwen3next needs experts in every layer (num_experts, mlp_only_layers, "
                 "decoder_sparse_step)")
    if cfg.get("layer_types"):
        sys.exit("llamacpp_gguf: qwen3_next with explicit layer_types is not converted here")
    rope = cfg.get("rope_parameters") or {}
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(dv * nv)
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
else:
    d_inner = cfg.get("intermediate_size") or cfg["expand"] * d_model
    n_group = cfg.get("n_groups", 1)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(cfg["conv_kernel"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(cfg["state_size"])
    if mamba2:
        w.add_ssm_time_step_rank(d_inner // cfg["head_dim"])
        w.add_ssm_group_count(n_group)
    else:
        w.add_ssm_time_step_rank(cfg["time_step_rank"])
        w.add_ssm_dt_b_c_rms(False)
    w.add_layer_norm_rms_eps(cfg["layer_norm_epsilon"])

# GPT-NeoX BPE vocabulary, padded to the embedding rows.
tok = json.loads(tok_path.read_text())
vocab = tok["model"]["vocab"]
added = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
n_vocab = cfg["vocab_size"]
inv = {i: s for s, i in vocab.items()}
inv.update(added)
special = {cfg.get("bos_token_id") or 0, cfg.get("eos_token_id") or 0}
tokens, types = [], []
for i in range(n_vocab):
    if i in special and i not in inv:
        tokens.append(f"[SPECIAL{i}]")
        types.append(gguf.TokenType.CONTROL)
    elif i in inv:
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
w.add_bos_token_id(cfg.get("bos_token_id") or 0)
w.add_eos_token_id(cfg.get("eos_token_id") or 0)
w.add_add_bos_token(False)


def rope_rows(t, heads):
    """Regroup each head's rows from halves [x0..x(d/2-1), y0..] to pairs, as llama.cpp's converter does for
    q/k of LLaMA-layout attention (its RoPE rotates adjacent pairs)."""
    d = t.shape[0] // heads
    return t.reshape(heads, 2, d // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


MAMBA_NAMES = {
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
}


def mamba_mixer(rest, t, two):
    """A Mamba / Mamba-2 mixer tensor (rest: its name from `mixer.` on) as llama.cpp wants it."""
    if rest == "mixer.conv1d.weight":
        t = t.reshape(t.shape[0], t.shape[2])
    if rest == "mixer.A_log":
        t = -np.exp(t)
    if two and rest in ("mixer.A_log", "mixer.D"):
        t = t.reshape(t.shape[0], 1)
    if two and rest == "mixer.norm.weight":
        t = t.reshape(n_group, d_inner // n_group)
    return MAMBA_NAMES[rest], t


def granite_tensor(i, rest, t):
    """One granitemoehybrid layer tensor: yields (gguf name without blk.N., array)."""
    if rest == "input_layernorm.weight":
        yield "attn_norm.weight", t
    elif rest == "post_attention_layernorm.weight":
        yield "ffn_norm.weight", t
    elif rest.startswith("mamba."):
        yield mamba_mixer("mixer." + rest[len("mamba."):], t, True)
    elif rest == "self_attn.q_proj.weight":
        yield "attn_q.weight", rope_rows(t, n_head)
    elif rest == "self_attn.k_proj.weight":
        yield "attn_k.weight", rope_rows(t, n_kv)
    elif rest == "self_attn.v_proj.weight":
        yield "attn_v.weight", t
    elif rest == "self_attn.o_proj.weight":
        yield "attn_output.weight", t
    elif rest == "shared_mlp.input_linear.weight":
        yield "ffn_gate.weight", t[:ff]
        yield "ffn_up.weight", t[ff:]
    elif rest == "shared_mlp.output_linear.weight":
        yield "ffn_down.weight", t
    else:
        sys.exit(f"llamacpp_gguf: unexpected tensor model.layers.{i}.{rest}")


def qwen3next_tensor(i, rest, t, experts):
    """One qwen3_next layer tensor: yields (gguf name without blk.N., array); experts collects the
    per-expert MLP tensors of the layer until all are in."""
    if rest.endswith("norm.weight") and rest != "linear_attn.norm.weight":
        t = t + 1.0  # Qwen3-Next's RMSNorm scales by (1 + weight)
    simple = {"input_layernorm.weight": "attn_norm.weight",
              "post_attention_layernorm.weight": "post_attention_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
              "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
              "linear_attn.in_proj_ba.weight": "ssm_ba.weight", "linear_attn.dt_bias": "ssm_dt.bias",
              "linear_attn.norm.weight": "ssm_norm.weight", "linear_attn.out_proj.weight": "ssm_out.weight",
              "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
              "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
              "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight"}
    if rest in simple:
        yield simple[rest], t
    elif rest == "linear_attn.A_log":
        yield "ssm_a", -np.exp(t)
    elif rest == "linear_attn.conv1d.weight":
        yield "ssm_conv1d.weight", t.reshape(t.shape[0], t.shape[2])
    elif rest == "linear_attn.in_proj_qkvz.weight":
        r = nv // nk
        g = t.reshape(nk, 2 * dk + 2 * r * dv, t.shape[1])  # per key head: [q (dk), k (dk), v (r dv), z (r dv)]
        q, k = g[:, :dk], g[:, dk:2 * dk]
        v, z = g[:, 2 * dk:2 * dk + r * dv], g[:, 2 * dk + r * dv:]
        flat = lambda x: x.reshape(-1, t.shape[1])
        yield "attn_qkv.weight", np.concatenate([flat(q), flat(k), flat(v)])
        yield "attn_gate.weight", flat(z)
    elif rest == "mlp.shared_expert_gate.weight":
        yield "ffn_gate_inp_shexp.weight", t.reshape(-1)
    elif rest.startswith("mlp.experts."):
        _, _, e, proj, _ = rest.split(".")
        experts[(int(e), proj)] = t
        if len(experts) == 3 * n_exp:
            for proj, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                yield gg + "_exps.weight", np.stack([experts[(e, proj)] for e in range(n_exp)])
            experts.clear()
    else:
        sys.exit(f"llamacpp_gguf: unexpected tensor model.layers.{i}.{rest}")


HEAD = {"backbone.embeddings.weight": "token_embd.weight", "backbone.norm_f.weight": "output_norm.weight",
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
experts = {}
for name, t in tensors():
    if name.startswith("mtp."):
        continue  # Qwen3-Next's multi-token prediction head: llama.cpp ignores it too
    if name in HEAD:
        w.add_tensor(HEAD[name], t + 1.0 if qwen3next and name == "model.norm.weight" else t)
        continue
    parts = name.split(".")
    assert parts[0] in ("backbone", "model") and parts[1] == "layers", name
    i, rest = int(parts[2]), ".".join(parts[3:])
    if granite:
        out_list = granite_tensor(i, rest, t)
    elif qwen3next:
        out_list = qwen3next_tensor(i, rest, t, experts)
    else:
        out_list = [mamba_mixer(rest, t, mamba2)]
    for m, x in out_list:
        w.add_tensor(f"blk.{i}.{m}", np.ascontiguousarray(x))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out)
