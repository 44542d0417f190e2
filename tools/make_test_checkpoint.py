#!/usr/bin/python3
"""Write a random-weight checkpoint in the Hugging Face layout for Mamba-1 / FalconMamba / Mamba-2.

The directory gets `config.json` (Hugging Face key names) and `model.safetensors`, or with
`--shards N` (N > 1) `model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`.
The safetensors files come from the small writer below (no safetensors package needed).

Weights are random but chosen so the model is well conditioned (logits O(1), no blow-up over
layers), which is what numerical tests need; they are NOT Hugging Face's training init:
  embeddings / lm_head   normal, std 1 / std 1/sqrt(H); tied embeddings std H^-1/4
  linear weights         normal, std 1/sqrt(fan_in)
  conv1d weight / bias   normal, std 1/sqrt(K) / 0.1
  A_log                  log(uniform(1, 16))            (A = -exp(A_log) in [-16, -1])
  D                      1 + 0.1 * normal
  dt_proj.bias, dt_bias  inv_softplus(dt), dt = exp(uniform(log 1e-3, log 0.1))
  norm weights           1 + 0.1 * normal
  optional biases        0.1 * normal
Every tensor has its own generator seeded from (--seed, name), so sharding, the embedding
alias and the on-disk dtype do not change any value (bf16/f16 only round it); tying only
rescales the embeddings.

Memory stays bounded for full-size shapes: tensors are generated in float32 and written in
row blocks of at most BLOCK_ELEMS elements.

Config keys and weight names follow research/hf-hybrid.md C.1 (mamba) and C.2 (mamba2).

Examples:
  make_test_checkpoint.py --preset mamba-tiny --out /tmp/m1
  make_test_checkpoint.py --preset codestral --layers 2 --dtype bf16 --shards 3 --out /tmp/cs
  make_test_checkpoint.py --preset mamba2-tiny --set n_groups=2 --set state_size=12 --out /tmp/m2
  make_test_checkpoint.py --config real/config.json --layers 2 --out /tmp/real2
"""

import argparse
import copy
import json
import math
import os
import queue
import shutil
import struct
import sys
import threading
import zlib

import numpy as np

# Largest number of elements generated (and held) at once, per tensor.
BLOCK_ELEMS = 1 << 23

# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def mamba_config(hidden, layers, vocab, state, rank, expand=2, conv=4, use_bias=False,
                 use_conv_bias=True, tie=True, model_type="mamba", bos=0, eos=0, pad=0):
    """A Mamba-1 (or FalconMamba) config with every key Hugging Face's MambaConfig writes."""
    arch = {"mamba": "MambaForCausalLM", "falcon_mamba": "FalconMambaForCausalLM"}[model_type]
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "state_size": state,
        "expand": expand,
        "intermediate_size": int(expand * hidden),
        "conv_kernel": conv,
        "time_step_rank": rank,
        "use_bias": use_bias,
        "use_conv_bias": use_conv_bias,
        "hidden_act": "silu",
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": True,
        "tie_word_embeddings": tie,
        "initializer_range": 0.1,
        "time_step_scale": 1.0,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_init_scheme": "random",
        "time_step_floor": 0.0001,
        "rescale_prenorm_residual": False,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
    }
    if model_type == "falcon_mamba":
        cfg["mixer_rms_eps"] = 1e-6
        cfg["use_mambapy"] = False
    return cfg


def mamba2_config(hidden, layers, vocab, heads, head_dim, state, groups, chunk=256, conv=4,
                  use_bias=False, use_conv_bias=True, tie=False, bos=0, eos=0, pad=0):
    """A Mamba-2 config in Mamba2Config form (d_inner = heads * head_dim = expand * hidden)."""
    inner = heads * head_dim
    expand = inner // hidden if inner % hidden == 0 else inner / hidden
    return {
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "state_size": state,
        "expand": expand,
        "num_heads": heads,
        "head_dim": head_dim,
        "n_groups": groups,
        "conv_kernel": conv,
        "chunk_size": chunk,
        "use_bias": use_bias,
        "use_conv_bias": use_conv_bias,
        "hidden_act": "silu",
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": True,
        "rms_norm": True,
        "tie_word_embeddings": tie,
        "time_step_rank": "auto",
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 0.0001,
        # Hugging Face's save_pretrained writes (0.0, inf) as [0.0, Infinity] (Python json
        # extension, not strict JSON); real hub configs carry it, so readers must cope.
        "time_step_limit": [0.0, float("inf")],
        "initializer_range": 0.1,
        "rescale_prenorm_residual": False,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
    }


def hybridlm_config(hidden, vocab, pattern, d_state=16, head_dim=16, n_groups=1, chunk=16, heads=4,
                    kv_heads=2, rope=1.0, d_ff=128, act="silu", tie=False, bos=0, eos=0, pad=0):
    """Our own format: model_type hybridlm with a block pattern (docs/model-format.md)."""
    return {
        "architectures": ["HybridLMForCausalLM"],
        "model_type": "hybridlm",
        "hidden_size": hidden,
        "num_hidden_layers": len(pattern),
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": tie,
        "block_pattern": list(pattern),
        "ssm": {"d_state": d_state, "d_conv": 4, "expand": 2, "dt_rank": "auto", "head_dim": head_dim,
                "n_groups": n_groups, "chunk_size": chunk, "conv_bias": True, "proj_bias": False},
        "attention": {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": hidden // heads,
                      "rope_theta": 10000.0, "partial_rotary_factor": rope, "qk_norm": False},
        "mlp": {"intermediate_size": d_ff, "activation": act, "gated": True},
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
    }


def qwen3_next_config(hidden, layers, vocab, heads, kv_heads, hd, nk, nv, dk, dv, d_ff, experts, top_k, moe_ff,
                      shared_ff, interval=4, rope=0.25, theta=10000.0, tie=False):
    """A Qwen3NextConfig with every key transformers writes that the engine reads (hf-hybrid.md C.10)."""
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hd,
        "intermediate_size": d_ff, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": tie,
        "rope_theta": theta, "partial_rotary_factor": rope, "attention_bias": False,
        "full_attention_interval": interval,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_num_key_heads": nk, "linear_num_value_heads": nv,
        "decoder_sparse_step": 1, "num_experts": experts, "num_experts_per_tok": top_k,
        "moe_intermediate_size": moe_ff, "shared_expert_intermediate_size": shared_ff,
        "norm_topk_prob": True, "mlp_only_layers": [],
        "max_position_embeddings": 262144, "bos_token_id": 151643, "eos_token_id": 151645,
        "torch_dtype": "float32",
    }


def qwen3_5_config(hidden, layers, vocab, heads, kv_heads, hd, nk, nv, dk, dv, d_ff=None, experts=None, top_k=None,
                   moe_ff=None, shared_ff=None, interval=4, rope=0.25, theta=10000000.0, tie=False):
    """A Qwen3_5Config (d_ff given: dense) or Qwen3_5MoeConfig (experts given) as the multimodal
    checkpoints write it: the text model's keys nested in text_config, tie_word_embeddings at the
    top (configuration_qwen3_5.py; the vision_config is not read by the engine)."""
    moe = experts is not None
    text = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hd,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False,
        "full_attention_interval": interval,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": rope,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_num_key_heads": nk, "linear_num_value_heads": nv,
        "max_position_embeddings": 262144, "eos_token_id": 248044,
    }
    if moe:
        text.update({"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": moe_ff,
                     "shared_expert_intermediate_size": shared_ff})
    else:
        text["intermediate_size"] = d_ff
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5", "tie_word_embeddings": tie,
        "text_config": text, "vision_config": {"depth": 1, "hidden_size": 16, "out_hidden_size": hidden},
        "torch_dtype": "float32",
    }


def qwen3_5_text_only(cfg):
    """The text-only ForCausalLM form of a qwen3_5_config: its text_config, flat."""
    text = dict(cfg["text_config"], tie_word_embeddings=cfg["tie_word_embeddings"], torch_dtype="float32")
    moe = text["model_type"] == "qwen3_5_moe_text"
    text["architectures"] = ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"]
    return text


def jamba_config(hidden, layers, vocab, heads, kv_heads, d_ff, experts, top_k, d_state=16, attn_period=8,
                 attn_offset=4, expert_period=2, expert_offset=1, tie=False):
    """A JambaConfig with every key transformers writes that the engine reads."""
    return {
        "architectures": ["JambaForCausalLM"], "model_type": "jamba",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": d_ff,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": tie,
        "num_experts": experts, "num_experts_per_tok": top_k,
        "expert_layer_period": expert_period, "expert_layer_offset": expert_offset,
        "attn_layer_period": attn_period, "attn_layer_offset": attn_offset,
        "mamba_d_state": d_state, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto",
        "mamba_conv_bias": True, "mamba_proj_bias": False, "use_mamba_kernels": False,
        "max_position_embeddings": 262144, "sliding_window": None, "router_aux_loss_coef": 0.001,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    }


def bamba_config(hidden, layers, vocab, heads, kv_heads, d_ff, attn_idx, n_heads, d_state, groups=1,
                 chunk=256, tie=False):
    """A BambaConfig (mamba_d_head "auto" = expand * hidden / mamba_n_heads)."""
    return {
        "architectures": ["BambaForCausalLM"], "model_type": "bamba",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": d_ff,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
        "attn_layer_indices": list(attn_idx), "attention_bias": False, "mlp_bias": False,
        "mamba_n_heads": n_heads, "mamba_d_head": "auto", "mamba_n_groups": groups, "mamba_d_state": d_state,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": chunk, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "time_step_min": 0.001, "time_step_max": 0.1,
        "time_step_limit": [0.0, float("inf")], "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "max_position_embeddings": 262144, "z_loss_coefficient": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    }


def lfm2_config(hidden, layers, vocab, heads, kv_heads, d_ff, attn_idx, tie=True):
    """An Lfm2Config (layer types from full_attn_idxs)."""
    return {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": d_ff,
        "norm_eps": 1e-5, "tie_word_embeddings": tie, "full_attn_idxs": list(attn_idx),
        "rope_theta": 1000000.0, "conv_bias": False, "conv_L_cache": 3, "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
        "max_position_embeddings": 128000, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def lfm2_moe_config(hidden, vocab, types, heads, kv_heads, d_ff, moe_ff, experts, top_k, dense=2, tie=True,
                    eos=7):
    """An Lfm2MoeConfig; types is a string of c (conv) / a (full_attention)."""
    return {
        "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe",
        "hidden_size": hidden, "num_hidden_layers": len(types), "vocab_size": vocab,
        "layer_types": ["full_attention" if ch == "a" else "conv" for ch in types],
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": d_ff,
        "moe_intermediate_size": moe_ff, "num_experts": experts, "num_experts_per_tok": top_k,
        "num_dense_layers": dense, "use_expert_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "norm_eps": 1e-5, "tie_word_embeddings": tie, "rope_theta": 1000000.0, "conv_bias": False,
        "conv_L_cache": 3, "max_position_embeddings": 128000, "bos_token_id": 1, "eos_token_id": eos,
        "pad_token_id": 0, "torch_dtype": "float32",
    }


def nemotron_h_config(hidden, vocab, pattern, heads, kv_heads, head_dim, d_ff, mamba_heads, mamba_head_dim,
                      d_state, groups, experts=4, top_k=2, moe_ff=48, shared_ff=40, n_group=1, topk_group=1):
    """A NemotronHConfig in the hub form (hybrid_override_pattern)."""
    return {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "hidden_size": hidden, "vocab_size": vocab, "hybrid_override_pattern": pattern,
        "num_hidden_layers": len(pattern), "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": d_ff, "mlp_hidden_act": "relu2", "mlp_bias": False,
        "mamba_num_heads": mamba_heads, "mamba_head_dim": mamba_head_dim, "ssm_state_size": d_state,
        "n_groups": groups, "conv_kernel": 4, "chunk_size": 16, "use_bias": False, "use_conv_bias": True,
        "mamba_hidden_act": "silu", "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 1e-4,
        "time_step_limit": [0.0, float("inf")], "layer_norm_epsilon": 1e-5, "residual_in_fp32": False,
        "n_routed_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": moe_ff,
        "moe_shared_expert_intermediate_size": shared_ff, "n_shared_experts": 1, "n_group": n_group,
        "topk_group": topk_group, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def granite_config(hidden, layers, vocab, heads, kv_heads, attn_layers, experts, top_k, d_ff, shared_ff,
                   mamba_heads, d_state, rope=False):
    """A GraniteMoeHybridConfig (µP multipliers set to non-trivial values)."""
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "layer_types": ["attention" if i in attn_layers else "mamba" for i in range(layers)],
        "num_local_experts": experts, "num_experts_per_tok": top_k, "intermediate_size": d_ff,
        "shared_intermediate_size": shared_ff, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
        "logits_scaling": 8.0, "position_embedding_type": "rope" if rope else None, "rope_theta": 10000.0,
        "mamba_n_heads": mamba_heads, "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": d_state,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "attention_bias": False, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    }


def falcon_h1_config(hidden, layers, vocab, heads, kv_heads, d_ff, d_ssm, mamba_heads, d_state, groups=1,
                     rms_norm=False, norm_before_gate=True):
    """A FalconH1Config with non-trivial µP multipliers."""
    return {
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "intermediate_size": d_ff, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "mamba_d_ssm": d_ssm, "mamba_n_heads": mamba_heads, "mamba_d_head": "auto", "mamba_n_groups": groups,
        "mamba_d_state": d_state, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
        "mamba_conv_bias": True, "mamba_proj_bias": False, "projectors_bias": False,
        "mamba_rms_norm": rms_norm, "mamba_norm_before_gate": norm_before_gate,
        "time_step_min": 0.001, "time_step_max": 0.1, "time_step_limit": [0.0, float("inf")],
        "rope_theta": 100000.0, "attention_bias": False, "mlp_bias": False,
        "embedding_multiplier": 5.656854, "lm_head_multiplier": 2.5, "mlp_multipliers": [0.8838, 0.5859],
        "key_multiplier": 0.390625, "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375,
        "ssm_multipliers": [0.3536, 0.25, 0.3536, 0.5, 0.3536], "ssm_in_multiplier": 1.25,
        "ssm_out_multiplier": 0.2357, "bos_token_id": 1, "eos_token_id": 11, "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def zamba2_config(hidden, vocab, pattern, heads, kv_heads, d_ff, mamba_heads, d_state, groups=1, n_blocks=1,
                  adapters=True, rank=8, rope=False):
    """A Zamba2Config; pattern is a string of m (mamba) / h (hybrid)."""
    types = ["hybrid" if ch == "h" else "mamba" for ch in pattern]
    return {
        "architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2",
        "hidden_size": hidden, "num_hidden_layers": len(types), "vocab_size": vocab, "layers_block_type": types,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": d_ff,
        "hidden_act": "gelu", "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "mamba_d_state": d_state, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": groups,
        "n_mamba_heads": mamba_heads, "chunk_size": 256, "use_conv_bias": True, "add_bias_linear": False,
        "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 1e-4, "time_step_limit": None,
        "num_mem_blocks": n_blocks, "use_shared_attention_adapter": adapters, "use_shared_mlp_adapter": adapters,
        "adapter_rank": rank, "use_mem_rope": rope, "rope_theta": 10000.0, "use_long_context": False,
        "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def zamba_config(hidden, vocab, layers, heads, kv_heads, d_ff, mamba_heads, d_state, period=6, offset=4,
                 tie=True):
    """A ZambaConfig (layers_block_type from attn_layer_period / attn_layer_offset, as transformers
    derives it; the adapter derives it too when the key is absent)."""
    return {
        "architectures": ["ZambaForCausalLM"], "model_type": "zamba",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": d_ff,
        "hidden_act": "gelu", "hidden_mamba_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
        "n_mamba_heads": mamba_heads, "mamba_d_state": d_state, "mamba_d_conv": 4, "mamba_expand": 2,
        "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
        "attn_layer_period": period, "attn_layer_offset": offset, "time_step_min": 0.001, "time_step_max": 0.1,
        "time_step_floor": 1e-4, "max_position_embeddings": 4096, "use_mamba_kernels": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    }


def llamba_config(d_model, layers, vocab, d_state, n_v_heads, n_qk_heads, d_ff, expand=1, chunk=128, tie=False,
                  pad_multiple=8, norm_eps=1e-5):
    """cartesia-pytorch LlambaConfig (discrete Mamba-2 blocks; research/ssm-math-serving-training.md A.4)."""
    return {
        "model_type": "llamba",
        "vocab_size": vocab,
        "d_model": d_model,
        "n_layer": layers,
        "tie_embeddings": tie,
        "pad_vocab_size_multiple": pad_multiple,
        "lm_head_bias": False,
        "resid_dropout": 0.0,
        "norm_epsilon": norm_eps,
        "mlp_cfg": {"intermediate_size": d_ff, "bias": False, "act_fn": "silu"},
        "ssm_cfg": {"d_state": d_state, "n_v_heads": n_v_heads, "n_qk_heads": n_qk_heads, "expand": expand,
                    "chunk_size": chunk, "activation": "identity", "bias": False},
        "torch_dtype": "float32",
    }

# Full-size shapes are the public Hugging Face configs (token ids marked "unverified" where
# only the shapes were checked); tiny ones are for tests.
PRESETS = {
    # state-spaces/mamba-130m-hf
    "mamba-130m": lambda: mamba_config(768, 24, 50280, 16, 48),
    # state-spaces/mamba-1.4b-hf
    "mamba-1.4b": lambda: mamba_config(2048, 48, 50280, 16, 128),
    # state-spaces/mamba2-130m re-expressed as a Mamba2Config (GPT-NeoX vocab padded to 16)
    "mamba2-130m": lambda: mamba2_config(768, 24, 50288, 24, 64, 128, 1, tie=True),
    # state-spaces/mamba2-1.3b, same form
    "mamba2-1.3b": lambda: mamba2_config(2048, 48, 50288, 64, 64, 128, 1, tie=True),
    # A hybrid at mamba2-130m's shape for benchmarks: every 4th layer GQA attention + SwiGLU MLP.
    "hybrid-130m": lambda: hybridlm_config(768, 50288, ["m2", "m2", "m2", "t"] * 6, d_state=128, head_dim=64,
                                           chunk=64, heads=12, kv_heads=4, d_ff=2048, tie=True),
    # mistralai/Mamba-Codestral-7B-v0.1 (bos/eos follow the Mistral tokenizer; unverified)
    "codestral": lambda: mamba2_config(4096, 64, 32768, 128, 64, 128, 8, tie=False,
                                       bos=1, eos=2, pad=0),
    # FalconMamba mixer (dt/B/C RMS-normalised) at test size; tiiuae/falcon-mamba-7b is untied
    "falcon-mamba-tiny": lambda: mamba_config(64, 2, 512, 16, 4, tie=False,
                                              model_type="falcon_mamba"),
    "mamba-tiny": lambda: mamba_config(64, 2, 512, 16, 4),
    "mamba2-tiny": lambda: mamba2_config(64, 2, 512, 8, 16, 16, 1, chunk=16, tie=True),
    # Our block-pattern format: every mixer kind, GQA attention with RoPE, a SwiGLU MLP.
    "hybridlm-tiny": lambda: hybridlm_config(64, 512, ["m2", "t", "m", "m2", "t"]),
    # Jamba pattern at test size: attention at layer 2 of every 4, MoE (top-2 of 4) on odd layers.
    "jamba-tiny": lambda: jamba_config(64, 4, 512, 4, 2, 96, 4, 2, attn_period=4, attn_offset=2),
    # ai21labs/AI21-Jamba-Mini-1.5 shape (52B total): for `plan`, not for tests.
    "jamba-mini": lambda: jamba_config(4096, 32, 65536, 32, 8, 14336, 16, 2),
    # Bamba at test size: attention at layers 1 and 3 with half-rotary RoPE.
    "bamba-tiny": lambda: bamba_config(64, 4, 512, 4, 2, 96, [1, 3], 8, 16, chunk=16),
    # LFM2 at test size: short-conv layers with attention at 2 and 4 (MLP 2/3 x 200 -> 144).
    "lfm2-tiny": lambda: lfm2_config(64, 5, 512, 4, 2, 200, [2, 4]),
    # LFM2-MoE at test size: one dense layer, then sigmoid-routed experts (top-2 of 4, expert bias).
    "lfm2-moe-tiny": lambda: lfm2_moe_config(64, 512, "ccaca", 4, 2, 96, 32, 4, 2, dense=1),
    # LiquidAI/LFM2-8B-A1B (8.3B total, 1.5B active): for `plan`, not for tests.
    "lfm2-moe-8b": lambda: lfm2_moe_config(2048, 65536, "ccacccacccacccacccaccacc", 32, 8, 7168, 1792, 32, 4),
    # Nemotron-H at test size: every layer kind, grouped Mamba-2 norm, 4 experts in 2 groups.
    # Granite 4.0-H at test size: µP multipliers, MoE top-2 of 4 + shared MLP, NoPE attention.
    # Falcon-H1 at test size: parallel Mamba-2 || attention in every layer, µP multipliers.
    "falcon-h1-tiny": lambda: falcon_h1_config(64, 3, 512, 4, 2, 96, 96, 6, 16),
    # Zamba2 at test size: two shared blocks alternating over three hybrid layers, LoRA adapters.
    "zamba2-tiny": lambda: zamba2_config(32, 512, "mhmhmhm", 4, 4, 80, 4, 16, n_blocks=2),
    # Zamba (v1) at test size: layers m m h m h m (two hybrid layers sharing the block), 2 Mamba heads.
    "zamba-tiny": lambda: zamba_config(32, 512, 6, 4, 4, 80, 2, 8, period=3, offset=1),
    # Zyphra/Zamba-7B-v1 (ZambaConfig defaults): for `plan`, not for tests.
    "zamba-7b": lambda: zamba_config(3712, 32000, 76, 16, 16, 14848, 2, 16),
    "granite-h-tiny": lambda: granite_config(64, 4, 512, 4, 2, [2], 4, 2, 32, 48, 8, 16),
    # ibm-granite/granite-4.0-h-350m-like dense hybrid (~340M, tied 100352 vocab) for benchmarks only, not
    # tests: 32 layers of which 4 GQA attention (12 heads of 64, 4 KV heads, NoPE), Mamba-2 with 48 heads of 32,
    # state 128, one group, a 2048 shared SwiGLU MLP in every layer, no experts. Shapes and multipliers are
    # those of the published GGUF metadata; the attention layer positions are unverified (evenly spaced here).
    "granite-4.0-h-350m": lambda: dict(granite_config(768, 32, 100352, 12, 4, [5, 13, 21, 29], 0, 0, 2048, 2048,
                                                      48, 128), embedding_multiplier=12.0, residual_multiplier=0.246,
                                       attention_multiplier=0.015625, logits_scaling=3.0, rms_norm_eps=1e-5,
                                       bos_token_id=100257, eos_token_id=100257, pad_token_id=100256),
    # Llamba at test size: 4 value heads over 2 B/C groups, a vocabulary padded 500 -> 504, a
    # final-norm eps apart from the blocks' fixed 1e-5.
    "llamba-tiny": lambda: llamba_config(64, 3, 500, 16, 4, 2, 128, chunk=16, norm_eps=1e-4),
    # cartesia-ai/Llamba-8B (LlambaConfig defaults): for `plan`, not for tests.
    "llamba-8b": lambda: llamba_config(4096, 32, 128256, 64, 32, 32, 14336),
    "nemotron-h-tiny": lambda: nemotron_h_config(64, 512, "M*-ME-M", 4, 2, 16, 96, 8, 16, 16, 2,
                                                 n_group=2, topk_group=1),
    # Qwen3-Next at test size: gated DeltaNet (nv = 2 nk, d_k != d_v) with gated attention at
    # layers 1 and 3, MoE top-2 of 4 + gated shared expert, layer 2 a dense MLP (mlp_only_layers).
    "qwen3-next-tiny": lambda: dict(qwen3_next_config(64, 4, 512, 4, 2, 16, 2, 4, 16, 8, 96, 4, 2, 32, 48,
                                                      interval=2), mlp_only_layers=[2]),
    # Qwen3.5 at test size: the four-projection DeltaNet (nv = 2 nk, d_k != d_v) with gated
    # attention at layers 1 and 3; dense SwiGLU (qwen3_5) or MoE top-2 of 4 with stacked experts and
    # a gated shared expert (qwen3_5_moe). Nested text_config, model.language_model.* names.
    "qwen3.5-tiny": lambda: qwen3_5_config(64, 4, 512, 4, 2, 16, 2, 4, 16, 8, d_ff=96, interval=2),
    "qwen3.5-moe-tiny": lambda: qwen3_5_config(64, 4, 512, 4, 2, 16, 2, 4, 16, 8, experts=4, top_k=2, moe_ff=32,
                                               shared_ff=48, interval=2),
    # The text-only Qwen3_5MoeForCausalLM form: flat keys, model.* names.
    "qwen3.5-moe-text-tiny": lambda: qwen3_5_text_only(PRESETS["qwen3.5-moe-tiny"]()),
    # transformers' Qwen3_5TextConfig defaults (its docstring: like Qwen3.5-9B), RoPE base 1e7: for
    # `plan`, not for tests.
    "qwen3.5-9b": lambda: qwen3_5_config(4096, 32, 248320, 16, 4, 256, 16, 32, 128, 128, d_ff=12288),
    # Qwen3_5MoeTextConfig defaults (its docstring: like Qwen3.5-35B-A3B): for `plan`, not for tests.
    "qwen3.5-35b-a3b": lambda: qwen3_5_config(2048, 40, 248320, 16, 2, 256, 16, 32, 128, 128, experts=256, top_k=8,
                                              moe_ff=512, shared_ff=512),
    # A Qwen3-Next-shaped gated-DeltaNet hybrid of ~750M (~520M active) for benchmarks only, not tests: 24
    # layers, full attention every 4th (8 gated heads of 128, 2 KV heads, RoPE on 1/4), DeltaNet 8 key / 16
    # value heads of 64 (llama.cpp's qwen3next wants d_k = d_v), MoE top-4 of 16 + a gated shared expert.
    "qwen3-next-750m": lambda: qwen3_next_config(1024, 24, 151936, 8, 2, 128, 8, 16, 64, 64, 2816, 16, 4, 256, 512),
    # Qwen/Qwen3-Next-80B-A3B-Instruct (its published config.json): for `plan`, not for tests.
    "qwen3-next-80b-a3b": lambda: qwen3_next_config(2048, 48, 151936, 16, 2, 256, 16, 32, 128, 128, 5120, 512, 10,
                                                    512, 512, theta=10000000.0),
}

# --------------------------------------------------------------------------------------------
# Tensor list (names, shapes, init) derived from the config, HF defaults where a key is absent
# --------------------------------------------------------------------------------------------

FAMILY = {"mamba": "mamba1", "falcon_mamba": "mamba1", "mamba2": "mamba2"}


def normal(std, mean=0.0):
    def init(rng, n):
        x = rng.standard_normal(n, dtype=np.float32)
        if std != 1.0:
            x *= np.float32(std)
        if mean != 0.0:
            x += np.float32(mean)
        return x
    return init


def a_log_init(rng, n):
    # A = -exp(A_log) uniform-ish in [-16, -1]: decay rates spread over time scales.
    return np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)


def dt_bias_init(rng, n):
    # softplus(bias) = dt, dt log-uniform in [1e-3, 0.1]; inv_softplus(y) = y + log(-expm1(-y)).
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(0.1), n))
    return (dt + np.log(-np.expm1(-dt))).astype(np.float32)


NORM_INIT = normal(0.1, 1.0)
BIAS_INIT = normal(0.1)


def mamba1_mixer_specs(m, H, I, N, R, K, use_bias, use_conv_bias, dt_bc_norms=False):
    """Tensors of a Mamba-1 mixer under prefix m (HF MambaMixer names)."""
    specs = [(m + "in_proj.weight", (2 * I, H), normal(H ** -0.5))]
    if use_bias:
        specs.append((m + "in_proj.bias", (2 * I,), BIAS_INIT))
    specs.append((m + "conv1d.weight", (I, 1, K), normal(K ** -0.5)))
    if use_conv_bias:
        specs.append((m + "conv1d.bias", (I,), BIAS_INIT))
    specs.append((m + "x_proj.weight", (R + 2 * N, I), normal(I ** -0.5)))
    specs.append((m + "dt_proj.weight", (I, R), normal(0.5 * R ** -0.5)))
    specs.append((m + "dt_proj.bias", (I,), dt_bias_init))
    specs.append((m + "A_log", (I, N), a_log_init))
    specs.append((m + "D", (I,), NORM_INIT))
    specs.append((m + "out_proj.weight", (H, I), normal(I ** -0.5)))
    if use_bias:
        specs.append((m + "out_proj.bias", (H,), BIAS_INIT))
    if dt_bc_norms:  # Jamba
        specs.append((m + "dt_layernorm.weight", (R,), NORM_INIT))
        specs.append((m + "b_layernorm.weight", (N,), NORM_INIT))
        specs.append((m + "c_layernorm.weight", (N,), NORM_INIT))
    return specs


def mamba2_mixer_specs(m, H, I, nh, G, N, K, use_bias, use_conv_bias, out_bias=None, norm=True):
    """Tensors of a Mamba-2 mixer under prefix m (HF Mamba2Mixer names)."""
    if nh % G != 0:
        sys.exit("make_test_checkpoint: num_heads (%d) must be a multiple of n_groups (%d)" % (nh, G))
    out_bias = use_bias if out_bias is None else out_bias
    conv_dim = I + 2 * G * N
    # in_proj rows: [z (I), xBC (I + 2GN), dt (nh)]
    specs = [(m + "in_proj.weight", (I + conv_dim + nh, H), normal(H ** -0.5))]
    if use_bias:
        specs.append((m + "in_proj.bias", (I + conv_dim + nh,), BIAS_INIT))
    specs.append((m + "conv1d.weight", (conv_dim, 1, K), normal(K ** -0.5)))
    if use_conv_bias:
        specs.append((m + "conv1d.bias", (conv_dim,), BIAS_INIT))
    specs.append((m + "dt_bias", (nh,), dt_bias_init))
    specs.append((m + "A_log", (nh,), a_log_init))
    specs.append((m + "D", (nh,), NORM_INIT))
    if norm:
        specs.append((m + "norm.weight", (I,), NORM_INIT))
    specs.append((m + "out_proj.weight", (H, I), normal(I ** -0.5)))
    if out_bias:
        specs.append((m + "out_proj.bias", (H,), BIAS_INIT))
    return specs


def discrete_in_proj_init(H, nv):
    """in_proj of the discrete Mamba-2: std H^-1/2, but the A~ rows (the last nv) x4, so that the
    decays exp(-softplus(A~)) span ~0.02 to ~1 - 1e-4: short and long memories."""
    def init(rng, n):
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(H ** -0.5)
        if n < nv * H:
            sys.exit("make_test_checkpoint: discrete Mamba-2 in_proj too large for one block")
        x[n - nv * H:] *= np.float32(4.0)
        return x
    return init


def discrete_mamba2_specs(m, H, I, nv, G, N, K, bias, conv_bias):
    """Tensors of a discrete Mamba-2 mixer under prefix m (cartesia / phi-mamba names)."""
    if I % nv != 0 or nv % G != 0:
        sys.exit("make_test_checkpoint: need n_v_heads | d_inner and n_qk_heads | n_v_heads")
    conv_dim = I + 2 * G * N
    W = 2 * I + 2 * G * N + nv   # [x, B, C, z, A~]
    specs = [(m + "in_proj.weight", (W, H), discrete_in_proj_init(H, nv))]
    if bias:
        specs.append((m + "in_proj.bias", (W,), BIAS_INIT))
    else:
        specs.append((m + "z_bias", (I,), BIAS_INIT))
    specs.append((m + "conv1d.weight", (conv_dim, 1, K), normal(K ** -0.5)))
    if conv_bias:
        specs.append((m + "conv1d.bias", (conv_dim,), BIAS_INIT))
    specs.append((m + "D", (nv,), NORM_INIT))
    specs.append((m + "out_proj.weight", (H, I), normal(I ** -0.5)))
    if bias:
        specs.append((m + "out_proj.bias", (H,), BIAS_INIT))
    return specs


def attention_specs(a, H, heads, kv_heads, hd, bias=False, qk_norm=False, o_name="o_proj"):
    """q/k/v/o projections (HF names) under prefix a."""
    specs = [(a + "q_proj.weight", (heads * hd, H), normal(H ** -0.5)),
             (a + "k_proj.weight", (kv_heads * hd, H), normal(H ** -0.5)),
             (a + "v_proj.weight", (kv_heads * hd, H), normal(H ** -0.5)),
             (a + o_name + ".weight", (H, heads * hd), normal((heads * hd) ** -0.5))]
    if bias:
        specs += [(a + "q_proj.bias", (heads * hd,), BIAS_INIT), (a + "k_proj.bias", (kv_heads * hd,), BIAS_INIT),
                  (a + "v_proj.bias", (kv_heads * hd,), BIAS_INIT)]
    if qk_norm:
        specs += [(a + "q_norm.weight", (hd,), NORM_INIT), (a + "k_norm.weight", (hd,), NORM_INIT)]
    return specs


def mlp_specs(f, H, F, gated=True, names=("gate_proj", "up_proj", "down_proj")):
    gate, up, down = names
    specs = [(f + gate + ".weight", (F, H), normal(H ** -0.5))] if gated else []
    specs += [(f + up + ".weight", (F, H), normal(H ** -0.5)),
              (f + down + ".weight", (H, F), normal(F ** -0.5))]
    return specs


def head_specs(cfg, tie, emb_name, seed_emb_name, final_norm):
    """Embedding (first) and final norm + lm_head (second) of any family."""
    H = int(cfg["hidden_size"])
    V = int(cfg["vocab_size"])
    # Untied: embeddings std 1, lm_head std 1/sqrt(H) -> logits O(1).  Tied: the embeddings are
    # also the head, and std 1 would give logits of std sqrt(H) (~28 at H=768, a one-hot
    # softmax), so they get std H^-1/4 -> logits of std H^(1/4) (2.8 at H=64, 5.3 at H=768).
    first = [(emb_name, (V, H), normal(H ** -0.25 if tie else 1.0), seed_emb_name)]
    last = [(final_norm, (H,), NORM_INIT)]
    if not tie:
        last.append(("lm_head.weight", (V, H), normal(H ** -0.5)))
    return first, last


def mamba_family_specs(cfg, family, embedding_name):
    H = int(cfg["hidden_size"])
    L = int(cfg["num_hidden_layers"])
    K = int(cfg.get("conv_kernel", 4))
    use_conv_bias = bool(cfg.get("use_conv_bias", True))
    tie_default = family == "mamba1"  # MambaConfig: PretrainedConfig default; Mamba2Config: False
    tie = bool(cfg.get("tie_word_embeddings", tie_default))
    specs, tail = head_specs(cfg, tie, "backbone.%s.weight" % embedding_name, "backbone.embeddings.weight",
                             "backbone.norm_f.weight")
    if family == "mamba1":
        use_bias = bool(cfg.get("use_bias", True))
        N = int(cfg.get("state_size", 16))
        I = int(cfg.get("intermediate_size") or int(cfg.get("expand", 2) * H))
        R = cfg.get("time_step_rank", "auto")
        R = math.ceil(H / 16) if R == "auto" else int(R)
        for i in range(L):
            p = "backbone.layers.%d." % i
            specs.append((p + "norm.weight", (H,), NORM_INIT))
            specs += mamba1_mixer_specs(p + "mixer.", H, I, N, R, K, use_bias, use_conv_bias)
    else:
        use_bias = bool(cfg.get("use_bias", False))
        N = int(cfg.get("state_size", 128))
        nh = int(cfg.get("num_heads", 128))
        P = int(cfg.get("head_dim", 64))
        G = int(cfg.get("n_groups", 8))
        I = nh * P
        expand_inner = int(cfg.get("expand", 2) * H)
        if expand_inner != I:
            sys.exit("make_test_checkpoint: mamba2 needs expand*hidden_size (%d) == num_heads*head_dim"
                     " (%d)" % (expand_inner, I))
        for i in range(L):
            p = "backbone.layers.%d." % i
            specs.append((p + "norm.weight", (H,), NORM_INIT))
            specs += mamba2_mixer_specs(p + "mixer.", H, I, nh, G, N, K, use_bias, use_conv_bias)
    return specs + tail


def gdn_specs(m, H, nk, nv, dk, dv, K):
    """Tensors of a gated DeltaNet mixer under prefix m (Qwen3-Next linear_attn names; the qkvz and
    ba rows interleaved per key head as the checkpoints store them)."""
    if nv % nk != 0:
        sys.exit("make_test_checkpoint: num_value_heads (%d) must be a multiple of num_key_heads (%d)" % (nv, nk))
    Kd, Vd = nk * dk, nv * dv
    return [(m + "in_proj_qkvz.weight", (2 * Kd + 2 * Vd, H), normal(H ** -0.5)),
            (m + "in_proj_ba.weight", (2 * nv, H), normal(H ** -0.5)),
            (m + "conv1d.weight", (2 * Kd + Vd, 1, K), normal(K ** -0.5)),
            (m + "dt_bias", (nv,), dt_bias_init),
            (m + "A_log", (nv,), a_log_init),
            (m + "norm.weight", (dv,), NORM_INIT),
            (m + "out_proj.weight", (H, Vd), normal(Vd ** -0.5))]


def hybridlm_specs(cfg):
    """Our block-pattern format (docs/model-format.md)."""
    H = int(cfg["hidden_size"])
    ssm, att, mlp = cfg.get("ssm", {}), cfg.get("attention", {}), cfg.get("mlp", {})
    tie = bool(cfg.get("tie_word_embeddings", True))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.norm.weight")
    I = int(ssm.get("expand", 2) * H)
    N, K = int(ssm.get("d_state", 16)), int(ssm.get("d_conv", 4))
    R = ssm.get("dt_rank", "auto")
    R = math.ceil(H / 16) if R == "auto" else int(R)
    P, G = int(ssm.get("head_dim", 64)), int(ssm.get("n_groups", 1))
    conv_bias, proj_bias = bool(ssm.get("conv_bias", True)), bool(ssm.get("proj_bias", False))
    heads = int(att.get("num_heads", 8))
    kv_heads = int(att.get("num_kv_heads", heads))
    hd = int(att.get("head_dim", H // heads))
    F = int(mlp.get("intermediate_size", 0))
    for i, kind in enumerate(cfg["block_pattern"]):
        p = "model.layers.%d." % i
        specs.append((p + "mixer_norm.weight", (H,), NORM_INIT))
        if kind == "m":
            specs += mamba1_mixer_specs(p + "mixer.", H, I, N, R, K, proj_bias, conv_bias)
        elif kind == "m2":
            specs += mamba2_mixer_specs(p + "mixer.", H, I, I // P, G, N, K, proj_bias, conv_bias)
        elif kind == "m2d":
            specs += discrete_mamba2_specs(p + "mixer.", H, I, I // P, G, N, K, proj_bias, conv_bias)
        elif kind == "gdn":
            gd = cfg.get("gdn", {})
            nk = int(gd.get("num_key_heads", 4))
            dk = int(gd.get("key_head_dim", 16))
            specs += gdn_specs(p + "mixer.", H, nk, int(gd.get("num_value_heads", nk)), dk,
                               int(gd.get("value_head_dim", dk)), int(gd.get("conv_kernel_dim", 4)))
        elif kind == "t":
            specs += attention_specs(p + "mixer.", H, heads, kv_heads, hd, bool(att.get("bias", False)),
                                     bool(att.get("qk_norm", False)))
        else:
            sys.exit("make_test_checkpoint: unknown block kind %r" % kind)
        if F > 0:
            specs.append((p + "ffn_norm.weight", (H,), NORM_INIT))
            specs += mlp_specs(p + "ffn.", H, F, bool(mlp.get("gated", True)))
    return specs + tail


def tensor_specs(cfg, embedding_name):
    """[(name, shape, init, seed_name)]; seed_name is the canonical name that seeds the rng."""
    mt = cfg.get("model_type")
    if mt in FAMILY:
        specs = mamba_family_specs(cfg, FAMILY[mt], embedding_name)
    elif mt in HYBRID_SPECS:
        specs = HYBRID_SPECS[mt](cfg)
    else:
        sys.exit("make_test_checkpoint: unsupported model_type %r (%s)"
                 % (mt, ", ".join(sorted(list(FAMILY) + list(HYBRID_SPECS)))))
    return [s if len(s) == 4 else s + (s[0],) for s in specs]


def jamba_attention_layers(cfg):
    L = int(cfg["num_hidden_layers"])
    if "layers_block_type" in cfg:
        return [t in ("attention", "full_attention") for t in cfg["layers_block_type"]]
    period, offset = int(cfg.get("attn_layer_period", 8)), int(cfg.get("attn_layer_offset", 4))
    return [i % period == offset for i in range(L)]


def jamba_specs(cfg):
    """JambaForCausalLM (research/hf-hybrid.md C.3)."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", False))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.final_layernorm.weight")
    I = int(cfg.get("mamba_expand", 2) * H)
    N, K = int(cfg.get("mamba_d_state", 16)), int(cfg.get("mamba_d_conv", 4))
    R = cfg.get("mamba_dt_rank", "auto")
    R = math.ceil(H / 16) if R == "auto" else int(R)
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    F = int(cfg.get("intermediate_size", 14336))
    E = int(cfg.get("num_experts", 16))
    eperiod, eoffset = int(cfg.get("expert_layer_period", 2)), int(cfg.get("expert_layer_offset", 1))
    for i, is_attn in enumerate(jamba_attention_layers(cfg)):
        p = "model.layers.%d." % i
        specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
        if is_attn:
            specs += attention_specs(p + "self_attn.", H, heads, kv_heads, H // heads)
        else:
            specs += mamba1_mixer_specs(p + "mamba.", H, I, N, R, K, bool(cfg.get("mamba_proj_bias", False)),
                                        bool(cfg.get("mamba_conv_bias", True)), dt_bc_norms=True)
        specs.append((p + "pre_ff_layernorm.weight", (H,), NORM_INIT))
        if E > 1 and i % eperiod == eoffset:
            specs.append((p + "feed_forward.router.weight", (E, H), normal(0.25)))
            for e in range(E):
                specs += mlp_specs(p + "feed_forward.experts.%d." % e, H, F)
        else:
            specs += mlp_specs(p + "feed_forward.", H, F)
    return specs + tail


ZERO_NORM_INIT = normal(0.1)  # zero-centred norms (applied as 1 + w)


def mtp_specs(H):
    """A few of the multi-token-prediction head's tensors that Qwen3-Next / Qwen3.5 checkpoints carry
    and that nobody reads (transformers ignores ^mtp.*): the loader must accept them."""
    return [("mtp.fc.weight", (H, 2 * H), normal((2 * H) ** -0.5)), ("mtp.norm.weight", (H,), ZERO_NORM_INIT),
            ("mtp.pre_fc_norm_embedding.weight", (H,), ZERO_NORM_INIT),
            ("mtp.pre_fc_norm_hidden.weight", (H,), ZERO_NORM_INIT),
            ("mtp.layers.0.input_layernorm.weight", (H,), ZERO_NORM_INIT)]


def gdn_apart_specs(m, H, nk, nv, dk, dv, K):
    """Qwen3.5's gated DeltaNet: the projections apart and in order (in_proj_qkv = [q | k | v])."""
    if nv % nk != 0:
        sys.exit("make_test_checkpoint: num_value_heads (%d) must be a multiple of num_key_heads (%d)" % (nv, nk))
    Kd, Vd = nk * dk, nv * dv
    return [(m + "in_proj_qkv.weight", (2 * Kd + Vd, H), normal(H ** -0.5)),
            (m + "in_proj_z.weight", (Vd, H), normal(H ** -0.5)),
            (m + "in_proj_b.weight", (nv, H), normal(H ** -0.5)),
            (m + "in_proj_a.weight", (nv, H), normal(H ** -0.5)),
            (m + "conv1d.weight", (2 * Kd + Vd, 1, K), normal(K ** -0.5)),
            (m + "dt_bias", (nv,), dt_bias_init),
            (m + "A_log", (nv,), a_log_init),
            (m + "norm.weight", (dv,), NORM_INIT),
            (m + "out_proj.weight", (H, Vd), normal(Vd ** -0.5))]


def qwen3_hybrid_specs(cfg, prefix, variant):
    """The text model of Qwen3-Next (variant "next") and Qwen3.5 ("3.5" dense, "3.5-moe"), under
    prefix ("model." or "model.language_model.")."""
    H, L = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    tie = bool(cfg.get("tie_word_embeddings", False))
    specs, tail = head_specs(cfg, tie, prefix + "embed_tokens.weight", prefix + "embed_tokens.weight",
                             prefix + "norm.weight")
    tail[0] = (prefix + "norm.weight", (H,), ZERO_NORM_INIT)
    heads, kv_heads = int(cfg.get("num_attention_heads", 16)), int(cfg.get("num_key_value_heads", 2))
    hd = int(cfg.get("head_dim", 256))
    nk, nv = int(cfg.get("linear_num_key_heads", 16)), int(cfg.get("linear_num_value_heads", 32))
    dk, dv = int(cfg.get("linear_key_head_dim", 128)), int(cfg.get("linear_value_head_dim", 128))
    K = int(cfg.get("linear_conv_kernel_dim", 4))
    if variant == "next":
        E, step = int(cfg.get("num_experts", 512)), int(cfg.get("decoder_sparse_step", 1))
        only = set(cfg.get("mlp_only_layers") or [])
    else:
        E, step, only = (int(cfg.get("num_experts", 256)) if variant == "3.5-moe" else 0), 1, set()
    interval = int(cfg.get("full_attention_interval", 4))
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                       for i in range(L)]
    for i in range(L):
        p = prefix + "layers.%d." % i
        specs.append((p + "input_layernorm.weight", (H,), ZERO_NORM_INIT))
        if types[i] == "full_attention":
            a = p + "self_attn."
            specs += [(a + "q_proj.weight", (2 * heads * hd, H), normal(H ** -0.5)),
                      (a + "k_proj.weight", (kv_heads * hd, H), normal(H ** -0.5)),
                      (a + "v_proj.weight", (kv_heads * hd, H), normal(H ** -0.5)),
                      (a + "o_proj.weight", (H, heads * hd), normal((heads * hd) ** -0.5)),
                      (a + "q_norm.weight", (hd,), ZERO_NORM_INIT), (a + "k_norm.weight", (hd,), ZERO_NORM_INIT)]
        elif variant == "next":
            specs += gdn_specs(p + "linear_attn.", H, nk, nv, dk, dv, K)
        else:
            specs += gdn_apart_specs(p + "linear_attn.", H, nk, nv, dk, dv, K)
        specs.append((p + "post_attention_layernorm.weight", (H,), ZERO_NORM_INIT))
        f = p + "mlp."
        if E > 0 and (i + 1) % step == 0 and i not in only:
            specs.append((f + "gate.weight", (E, H), normal(0.25)))
            F = int(cfg.get("moe_intermediate_size", 512))
            if variant == "next":
                for e in range(E):
                    specs += mlp_specs(f + "experts.%d." % e, H, F)
            else:  # stacked: per expert [gate | up] rows, then down
                specs += [(f + "experts.gate_up_proj", (E, 2 * F, H), normal(H ** -0.5)),
                          (f + "experts.down_proj", (E, H, F), normal(F ** -0.5))]
            specs += mlp_specs(f + "shared_expert.", H, int(cfg.get("shared_expert_intermediate_size", 512)))
            specs.append((f + "shared_expert_gate.weight", (1, H), normal(H ** -0.5)))
        else:
            specs += mlp_specs(f, H, int(cfg.get("intermediate_size", 5632)))
    return specs + tail + mtp_specs(H)


def qwen3_next_specs(cfg):
    """Qwen3NextForCausalLM (research/hf-hybrid.md C.10), with a few unread mtp.* tensors."""
    return qwen3_hybrid_specs(cfg, "model.", "next")


def qwen3_5_specs(cfg):
    """Qwen3_5(Moe)ForConditionalGeneration's text model (model.language_model.*; a stand-in
    model.visual.* tensor and mtp.* tensors that are not read) or the text-only ForCausalLM form."""
    nested = "text_config" in cfg
    text = dict(cfg["text_config"]) if nested else dict(cfg)
    if nested:
        text["tie_word_embeddings"] = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    variant = "3.5-moe" if cfg.get("model_type", "").startswith("qwen3_5_moe") else "3.5"
    specs = qwen3_hybrid_specs(text, "model.language_model." if nested else "model.", variant)
    if nested:
        specs.append(("model.visual.patch_embed.proj.weight", (16, 3, 2, 2, 2), normal(0.1)))
    return specs


def bamba_attention_layers(cfg):
    L = int(cfg["num_hidden_layers"])
    if "layers_block_type" in cfg:
        return [t in ("attention", "full_attention") for t in cfg["layers_block_type"]]
    idx = set(cfg.get("attn_layer_indices") or [])
    return [i in idx for i in range(L)]


def bamba_specs(cfg):
    """BambaForCausalLM (research/hf-hybrid.md C.4)."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", False))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.final_layernorm.weight")
    I = int(cfg.get("mamba_expand", 2) * H)
    nh = int(cfg.get("mamba_n_heads", 128))
    G, N, K = int(cfg.get("mamba_n_groups", 1)), int(cfg.get("mamba_d_state", 256)), int(cfg.get("mamba_d_conv", 4))
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or H // heads)
    F = int(cfg.get("intermediate_size", 14336))
    for i, is_attn in enumerate(bamba_attention_layers(cfg)):
        p = "model.layers.%d." % i
        specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
        if is_attn:
            specs += attention_specs(p + "self_attn.", H, heads, kv_heads, hd)
        else:
            specs += mamba2_mixer_specs(p + "mamba.", H, I, nh, G, N, K, bool(cfg.get("mamba_proj_bias", False)),
                                        bool(cfg.get("mamba_conv_bias", True)))
        specs.append((p + "pre_ff_layernorm.weight", (H,), NORM_INIT))
        specs += mlp_specs(p + "feed_forward.", H, F)
    return specs + tail


def lfm2_ff_dim(cfg):
    """Lfm2MLP's width: 2/3 of intermediate_size, times the multiplier, rounded up."""
    F = int(cfg.get("intermediate_size", cfg.get("block_ff_dim", 12288)))
    if cfg.get("block_auto_adjust_ff_dim", True):
        F = int(2 * F / 3)
        if cfg.get("block_ffn_dim_multiplier", 1.0) is not None:
            m = int(cfg.get("block_multiple_of", 256))
            F = int(cfg.get("block_ffn_dim_multiplier", 1.0) * F)
            F = m * ((F + m - 1) // m)
    return F


def lfm2_attention_layers(cfg):
    L = int(cfg["num_hidden_layers"])
    if "layer_types" in cfg:
        return [t == "full_attention" for t in cfg["layer_types"]]
    if "full_attn_idxs" in cfg:
        return [i in set(cfg["full_attn_idxs"]) for i in range(L)]
    return [True] * L


def lfm2_specs(cfg):
    """Lfm2ForCausalLM (research/hf-hybrid.md C.9) and Lfm2MoeForCausalLM (its first num_dense_layers
    layers with an MLP of intermediate_size, the others sigmoid-routed experts)."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", True))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.embedding_norm.weight")
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or H // heads)
    L_cache, bias = int(cfg.get("conv_L_cache", 3)), bool(cfg.get("conv_bias", False))
    moe = cfg.get("model_type") == "lfm2_moe"
    F = int(cfg.get("intermediate_size", 7168)) if moe else lfm2_ff_dim(cfg)
    E, Fe = int(cfg.get("num_experts", 32)), int(cfg.get("moe_intermediate_size", 1792))
    for i, is_attn in enumerate(lfm2_attention_layers(cfg)):
        p = "model.layers.%d." % i
        specs.append((p + "operator_norm.weight", (H,), NORM_INIT))
        if is_attn:
            specs += attention_specs(p + "self_attn.", H, heads, kv_heads, hd, o_name="out_proj")
            specs += [(p + "self_attn.q_layernorm.weight", (hd,), NORM_INIT),
                      (p + "self_attn.k_layernorm.weight", (hd,), NORM_INIT)]
        else:
            c = p + "conv."
            specs += [(c + "in_proj.weight", (3 * H, H), normal(H ** -0.5)),
                      (c + "conv.weight", (H, 1, L_cache), normal(L_cache ** -0.5)),
                      (c + "out_proj.weight", (H, H), normal(H ** -0.5))]
            if bias:
                specs += [(c + "in_proj.bias", (3 * H,), BIAS_INIT), (c + "conv.bias", (H,), BIAS_INIT),
                          (c + "out_proj.bias", (H,), BIAS_INIT)]
        specs.append((p + "ffn_norm.weight", (H,), NORM_INIT))
        f = p + "feed_forward."
        if moe and i >= int(cfg.get("num_dense_layers", 2)):
            specs.append((f + "gate.weight", (E, H), normal(0.5)))
            if cfg.get("use_expert_bias", True):
                specs.append((f + "expert_bias", (E,), normal(0.1)))
            for e in range(E):
                specs += mlp_specs(f + "experts.%d." % e, H, Fe, names=("w1", "w3", "w2"))
        else:
            specs += mlp_specs(f, H, F, names=("w1", "w3", "w2"))
    return specs + tail


def nemotron_h_kinds(cfg):
    if cfg.get("hybrid_override_pattern"):
        return list(cfg["hybrid_override_pattern"])
    names = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
    return [names[t] for t in cfg.get("layers_block_type") or cfg["layer_types"]]


def nemotron_h_specs(cfg):
    """NemotronHForCausalLM (research/hf-hybrid.md C.6), hub layout (backbone.)."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", False))
    specs, tail = head_specs(cfg, tie, "backbone.embeddings.weight", "backbone.embeddings.weight",
                             "backbone.norm_f.weight")
    nh, P = int(cfg.get("mamba_num_heads", 128)), int(cfg.get("mamba_head_dim", 64))
    G, N = int(cfg.get("n_groups", 8)), int(cfg.get("ssm_state_size", 128))
    K = int(cfg.get("conv_kernel", 4))
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or cfg.get("attention_head_dim") or H // heads)
    E = int(cfg.get("n_routed_experts", 8))
    for i, kind in enumerate(nemotron_h_kinds(cfg)):
        p = "backbone.layers.%d." % i
        m = p + "mixer."
        specs.append((p + "norm.weight", (H,), NORM_INIT))
        if kind == "M":
            specs += mamba2_mixer_specs(m, H, nh * P, nh, G, N, K, bool(cfg.get("use_bias", False)),
                                        bool(cfg.get("use_conv_bias", True)))
        elif kind == "*":
            specs += attention_specs(m, H, heads, kv_heads, hd)
        elif kind == "-":
            specs += mlp_specs(m, H, int(cfg.get("intermediate_size", 21504)), gated=False)
        elif kind == "E":
            specs.append((m + "gate.weight", (E, H), normal(0.5)))
            specs.append((m + "gate.e_score_correction_bias", (E,), normal(0.1)))
            for e in range(E):
                specs += mlp_specs(m + "experts.%d." % e, H, int(cfg.get("moe_intermediate_size", 7688)), gated=False)
            specs += mlp_specs(m + "shared_experts.", H, int(cfg.get("moe_shared_expert_intermediate_size", 7688)),
                               gated=False)
    return specs + tail


def granite_attention_layers(cfg):
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if types:
        return [t in ("attention", "full_attention") for t in types]
    return [False] * int(cfg["num_hidden_layers"])


def granitemoehybrid_specs(cfg):
    """GraniteMoeHybridForCausalLM (research/hf-hybrid.md C.5)."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", False))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight", "model.norm.weight")
    I = int(cfg.get("mamba_expand", 2) * H)
    nh = int(cfg.get("mamba_n_heads", 128))
    G, N, K = int(cfg.get("mamba_n_groups", 1)), int(cfg.get("mamba_d_state", 256)), int(cfg.get("mamba_d_conv", 4))
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    E, F, S = int(cfg.get("num_local_experts", 8)), int(cfg.get("intermediate_size", 11008)), \
        int(cfg.get("shared_intermediate_size", 1024))
    for i, is_attn in enumerate(granite_attention_layers(cfg)):
        p = "model.layers.%d." % i
        specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
        if is_attn:
            specs += attention_specs(p + "self_attn.", H, heads, kv_heads, H // heads)
        else:
            specs += mamba2_mixer_specs(p + "mamba.", H, I, nh, G, N, K, bool(cfg.get("mamba_proj_bias", False)),
                                        bool(cfg.get("mamba_conv_bias", True)))
        specs.append((p + "post_attention_layernorm.weight", (H,), NORM_INIT))
        specs += [(p + "shared_mlp.input_linear.weight", (2 * S, H), normal(H ** -0.5)),
                  (p + "shared_mlp.output_linear.weight", (H, S), normal(S ** -0.5))]
        if E > 0:
            m = p + "block_sparse_moe."
            specs += [(m + "router.layer.weight", (E, H), normal(0.25)),
                      (m + "input_linear.weight", (E, 2 * F, H), normal(H ** -0.5)),
                      (m + "output_linear.weight", (E, H, F), normal(F ** -0.5))]
    return specs + tail


def falcon_h1_specs(cfg):
    """FalconH1ForCausalLM (research/hf-hybrid.md C.7): every layer Mamba-2 || attention, then MLP."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", False))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.final_layernorm.weight")
    I = int(cfg.get("mamba_d_ssm") or cfg.get("mamba_expand", 2) * H)
    nh = int(cfg.get("mamba_n_heads", 128))
    G, N, K = int(cfg.get("mamba_n_groups", 1)), int(cfg.get("mamba_d_state", 256)), int(cfg.get("mamba_d_conv", 4))
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or H // heads)
    for i in range(int(cfg["num_hidden_layers"])):
        p = "model.layers.%d." % i
        specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
        specs += mamba2_mixer_specs(p + "mamba.", H, I, nh, G, N, K, bool(cfg.get("mamba_proj_bias", False)),
                                    bool(cfg.get("mamba_conv_bias", True)), out_bias=bool(cfg.get("projectors_bias", False)),
                                    norm=bool(cfg.get("mamba_rms_norm", False)))
        specs += attention_specs(p + "self_attn.", H, heads, kv_heads, hd)
        specs.append((p + "pre_ff_layernorm.weight", (H,), NORM_INIT))
        specs += mlp_specs(p + "feed_forward.", H, int(cfg.get("intermediate_size", 14336)))
    return specs + tail


def zamba2_specs(cfg):
    """Zamba2ForCausalLM (research/hf-hybrid.md C.8): shared blocks stored under the first hybrid layer
    that uses each."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", True))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.final_layernorm.weight")
    I = int(cfg.get("mamba_expand", 2) * H)
    nh, G = int(cfg.get("n_mamba_heads", 8)), int(cfg.get("mamba_ngroups", 1))
    N, K = int(cfg.get("mamba_d_state", 64)), int(cfg.get("mamba_d_conv", 4))
    heads = int(cfg.get("num_attention_heads", 32))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    hd = 2 * H // heads
    F, R = int(cfg.get("intermediate_size", 4 * H)), int(cfg.get("adapter_rank", 128))
    n_blocks = int(cfg.get("num_mem_blocks", 1))
    attn_ad, mlp_ad = bool(cfg.get("use_shared_attention_adapter", False)), bool(cfg.get("use_shared_mlp_adapter", False))
    bias = bool(cfg.get("add_bias_linear", False))
    hybrid_ids = [i for i, t in enumerate(cfg["layers_block_type"]) if t == "hybrid"]
    home = {}  # block -> the layer that stores it
    for j, L in enumerate(hybrid_ids):
        home.setdefault(j % n_blocks, L)
    for i, t in enumerate(cfg["layers_block_type"]):
        p = "model.layers.%d." % i
        if t == "hybrid":
            specs.append((p + "mamba_decoder.input_layernorm.weight", (H,), NORM_INIT))
            specs += mamba2_mixer_specs(p + "mamba_decoder.mamba.", H, I, nh, G, N, K, bias, True)
            specs.append((p + "linear.weight", (H, H), normal(H ** -0.5)))
        else:
            specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
            specs += mamba2_mixer_specs(p + "mamba.", H, I, nh, G, N, K, bias, True)
    for b, L in sorted(home.items()):
        s = "model.layers.%d.shared_transformer." % L
        specs += [(s + "input_layernorm.weight", (2 * H,), NORM_INIT), (s + "pre_ff_layernorm.weight", (H,), NORM_INIT),
                  (s + "self_attn.q_proj.weight", (heads * hd, 2 * H), normal((2 * H) ** -0.5)),
                  (s + "self_attn.k_proj.weight", (kv_heads * hd, 2 * H), normal((2 * H) ** -0.5)),
                  (s + "self_attn.v_proj.weight", (kv_heads * hd, 2 * H), normal((2 * H) ** -0.5)),
                  (s + "self_attn.o_proj.weight", (H, heads * hd), normal((heads * hd) ** -0.5)),
                  (s + "feed_forward.gate_up_proj.weight", (2 * F, H), normal(H ** -0.5)),
                  (s + "feed_forward.down_proj.weight", (H, F), normal(F ** -0.5))]
        for a in range(len(hybrid_ids)):
            if a % n_blocks != b:
                continue
            if attn_ad:
                for x, out in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                    q = s + "self_attn.linear_%s_adapter_list.%d." % (x, a)
                    specs += [(q + "0.weight", (R, 2 * H), normal((2 * H) ** -0.5)), (q + "1.weight", (out, R), normal(0.5 * R ** -0.5))]
            if mlp_ad:
                q = s + "feed_forward.gate_up_proj_adapter_list.%d." % a
                specs += [(q + "0.weight", (R, H), normal(H ** -0.5)), (q + "1.weight", (2 * F, R), normal(0.5 * R ** -0.5))]
    return specs + tail


def zamba_block_types(cfg):
    if cfg.get("layers_block_type"):
        return list(cfg["layers_block_type"])
    period, offset = int(cfg.get("attn_layer_period", 6)), int(cfg.get("attn_layer_offset", 4))
    return ["mamba", "mamba", "hybrid"] + ["hybrid" if i % period == offset else "mamba"
                                          for i in range(int(cfg.get("num_hidden_layers", 76)) - 3)]


def zamba_mamba_specs(m, H, I, nh, N, R, K, use_bias, use_conv_bias):
    """ZambaMambaMixer: in_proj rows alternate x and z; per-head x_proj / dt_proj as 3-D tensors."""
    P = I // nh
    specs = [(m + "in_proj.weight", (2 * I, H), normal(H ** -0.5))]
    if use_bias:
        specs.append((m + "in_proj.bias", (2 * I,), BIAS_INIT))
    specs.append((m + "conv1d.weight", (I, 1, K), normal(K ** -0.5)))
    if use_conv_bias:
        specs.append((m + "conv1d.bias", (I,), BIAS_INIT))
    specs += [(m + "x_proj_weight", (nh, R + 2 * N, P), normal(P ** -0.5)),
              (m + "dt_proj_weight", (nh, P, R), normal(0.5 * R ** -0.5)),
              (m + "dt_proj_bias", (nh, P), dt_bias_init),
              (m + "A_log", (nh, P, N), a_log_init),
              (m + "D", (nh, P), NORM_INIT),
              (m + "out_proj.weight", (H, I), normal(I ** -0.5))]
    if use_bias:
        specs.append((m + "out_proj.bias", (H,), BIAS_INIT))
    return specs


def zamba_specs(cfg):
    """ZambaForCausalLM (modeling_zamba.py): the one shared block stored once, under the first hybrid
    layer (tied copies are dropped on save)."""
    H = int(cfg["hidden_size"])
    tie = bool(cfg.get("tie_word_embeddings", True))
    specs, tail = head_specs(cfg, tie, "model.embed_tokens.weight", "model.embed_tokens.weight",
                             "model.final_layernorm.weight")
    I, nh = int(cfg.get("mamba_expand", 2) * H), int(cfg.get("n_mamba_heads", 2))
    N, K = int(cfg.get("mamba_d_state", 16)), int(cfg.get("mamba_d_conv", 4))
    R = cfg.get("mamba_dt_rank", "auto")
    R = math.ceil(H / 16) if R == "auto" else int(R)
    heads = int(cfg.get("num_attention_heads", 16))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("attention_head_dim") or 2 * H // heads)
    F = int(cfg.get("intermediate_size", 14848))
    bias, conv_bias = bool(cfg.get("mamba_proj_bias", False)), bool(cfg.get("mamba_conv_bias", True))
    types = zamba_block_types(cfg)
    for i, t in enumerate(types):
        p = "model.layers.%d." % i
        if t == "hybrid":
            if i == types.index("hybrid"):
                s = p + "shared_transf."
                specs += [(s + "input_layernorm.weight", (2 * H,), NORM_INIT),
                          (s + "pre_ff_layernorm.weight", (H,), NORM_INIT),
                          (s + "self_attn.q_proj.weight", (heads * hd, 2 * H), normal((2 * H) ** -0.5)),
                          (s + "self_attn.k_proj.weight", (kv_heads * hd, 2 * H), normal((2 * H) ** -0.5)),
                          (s + "self_attn.v_proj.weight", (kv_heads * hd, 2 * H), normal((2 * H) ** -0.5)),
                          (s + "self_attn.o_proj.weight", (H, heads * hd), normal((heads * hd) ** -0.5))]
                specs += mlp_specs(s + "feed_forward.", H, F)
            specs.append((p + "mamba_decoder.input_layernorm.weight", (H,), NORM_INIT))
            specs += zamba_mamba_specs(p + "mamba_decoder.mamba.", H, I, nh, N, R, K, bias, conv_bias)
            specs.append((p + "linear.weight", (H, H), normal(H ** -0.5)))
        else:
            specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
            specs += zamba_mamba_specs(p + "mamba.", H, I, nh, N, R, K, bias, conv_bias)
    return specs + tail


def llamba_specs(cfg):
    """cartesia-pytorch LlambaLMHeadModel: backbone.embedding, backbone.layers.N.{input_layernorm,
    mixer.*, post_attention_layernorm, mlp.*}, backbone.final_layernorm, lm_head (untied)."""
    H = int(cfg["d_model"])
    mult = int(cfg.get("pad_vocab_size_multiple", 8))
    V = (int(cfg["vocab_size"]) + mult - 1) // mult * mult
    tie = bool(cfg.get("tie_embeddings", False))
    ssm, mc = cfg.get("ssm_cfg", {}), cfg.get("mlp_cfg", {})
    I = int(ssm.get("expand", 1) * H)
    N, K = int(ssm.get("d_state", 64)), int(ssm.get("d_conv", 4))
    nv, G = int(ssm.get("n_v_heads", 32)), int(ssm.get("n_qk_heads", 32))
    F = int(mc.get("intermediate_size", 14336))
    specs = [("backbone.embedding.weight", (V, H), normal(H ** -0.25 if tie else 1.0))]
    for i in range(int(cfg.get("n_layer", 32))):
        p = "backbone.layers.%d." % i
        specs.append((p + "input_layernorm.weight", (H,), NORM_INIT))
        specs += discrete_mamba2_specs(p + "mixer.", H, I, nv, G, N, K, bool(ssm.get("bias", False)),
                                       bool(ssm.get("conv_bias", True)))
        specs.append((p + "post_attention_layernorm.weight", (H,), NORM_INIT))
        specs += mlp_specs(p + "mlp.", H, F, bool(mc.get("gated", True)))
    specs.append(("backbone.final_layernorm.weight", (H,), NORM_INIT))
    if not tie:
        specs.append(("lm_head.weight", (V, H), normal(H ** -0.5)))
    return specs


HYBRID_SPECS = {"qwen3_next": qwen3_next_specs, "qwen3_5": qwen3_5_specs, "qwen3_5_moe": qwen3_5_specs,
                "qwen3_5_text": qwen3_5_specs, "qwen3_5_moe_text": qwen3_5_specs, "llamba": llamba_specs, "zamba2": zamba2_specs, "falcon_h1": falcon_h1_specs, "granitemoehybrid": granitemoehybrid_specs, "hybridlm": hybridlm_specs, "jamba": jamba_specs, "bamba": bamba_specs, "lfm2": lfm2_specs,
                "lfm2_moe": lfm2_specs,
                "zamba": zamba_specs,
                "nemotron_h": nemotron_h_specs}


# --------------------------------------------------------------------------------------------
# safetensors writer
# --------------------------------------------------------------------------------------------

DTYPES = {"f32": ("F32", 4, "float32"), "bf16": ("BF16", 2, "bfloat16"),
          "f16": ("F16", 2, "float16")}


def to_disk(x, dtype):
    """float32 block -> contiguous little-endian array of the on-disk dtype."""
    if dtype == "f32":
        return np.ascontiguousarray(x, dtype="<f4")
    if dtype == "f16":
        return x.astype("<f2")
    # bf16: keep the top 16 bits of f32 after rounding to nearest, ties to even.
    u = x.view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return r.astype("<u2")


def write_safetensors(path, specs, dtype, seed):
    """Stream the tensors in `specs` to one .safetensors file; returns bytes of tensor data."""
    st_dtype, itemsize, _ = DTYPES[dtype]
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _, _ in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        # A writer thread overlaps disk writes (which release the GIL) with generation.
        blocks = queue.Queue(maxsize=2)
        failure = []

        def drain():
            while True:
                block = blocks.get()
                if block is None:
                    return
                if not failure:
                    try:
                        f.write(memoryview(block).cast("B"))
                    except OSError as e:
                        failure.append(e)

        writer = threading.Thread(target=drain)
        writer.start()
        try:
            for name, shape, init, seed_name in specs:
                n = int(np.prod(shape, dtype=np.int64))
                rng = np.random.default_rng([seed, zlib.crc32(seed_name.encode("utf-8"))])
                done = 0
                while done < n and not failure:
                    m = min(BLOCK_ELEMS, n - done)
                    blocks.put(to_disk(init(rng, m), dtype))
                    done += m
        finally:
            blocks.put(None)
            writer.join()
        if failure:
            raise failure[0]
    return offset


def split_shards(specs, itemsize, n):
    """Contiguous, non-empty groups of tensors with roughly equal bytes."""
    if n > len(specs):
        sys.exit("make_test_checkpoint: --shards %d exceeds the number of tensors (%d)"
                 % (n, len(specs)))
    sizes = [int(np.prod(s[1], dtype=np.int64)) * itemsize for s in specs]
    groups, start, remaining = [], 0, sum(sizes)
    for k in range(n, 0, -1):
        if k == 1:
            groups.append(specs[start:])
            break
        target = remaining / k
        end, acc = start, 0
        # Leave at least one tensor for each of the k-1 later shards.
        while end < len(specs) - (k - 1) and (end == start or acc + sizes[end] / 2 <= target):
            acc += sizes[end]
            end += 1
        groups.append(specs[start:end])
        remaining -= acc
        start = end
    return groups


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def tokenizer_max_id(path):
    """Largest token id in a tokenizer.json (model vocab and added tokens), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
    except (OSError, ValueError):
        return None
    ids = [t["id"] for t in tok.get("added_tokens", [])]
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids.extend(vocab.values())
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        ids.append(len(vocab) - 1)
    return max(ids) if ids else None


def parse_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_config(args):
    if args.preset is None and args.config is None:
        sys.exit("make_test_checkpoint: give --preset and/or --config")
    cfg = copy.deepcopy(PRESETS[args.preset]()) if args.preset else {}
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            cfg.update(json.load(f))
    # Qwen3.5's multimodal configs nest the text model's keys: --set, --layers and --vocab go there
    # (a top-level key such as tie_word_embeddings or text_config itself stays at the top).
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit("make_test_checkpoint: --set wants KEY=VALUE, got %r" % item)
        (cfg if key in cfg or key == "text_config" else text)[key] = parse_value(value)
    llamba = cfg.get("model_type") == "llamba"  # LlambaConfig names these keys its own way
    if args.layers is not None:
        text["n_layer" if llamba else "num_hidden_layers"] = args.layers
    if args.vocab is not None:
        text["vocab_size"] = args.vocab
    if args.tie is not None:
        cfg["tie_embeddings" if llamba else "tie_word_embeddings"] = args.tie
    # Keep derived sizes consistent when --set changed what they derive from.
    set_keys = {item.partition("=")[0] for item in args.set}
    if cfg.get("model_type") in ("mamba", "falcon_mamba"):
        if set_keys & {"hidden_size", "expand"} and "intermediate_size" not in set_keys:
            cfg["intermediate_size"] = int(cfg.get("expand", 2) * cfg["hidden_size"])
    elif cfg.get("model_type") == "mamba2":
        if set_keys & {"hidden_size", "num_heads", "head_dim"} and "expand" not in set_keys:
            inner, hidden = cfg["num_heads"] * cfg["head_dim"], cfg["hidden_size"]
            cfg["expand"] = inner // hidden if inner % hidden == 0 else inner / hidden
    elif cfg.get("model_type") == "hybridlm" and "block_pattern" in set_keys and args.layers is None:
        cfg["num_hidden_layers"] = len(cfg["block_pattern"])
    cfg["torch_dtype"] = DTYPES[args.dtype][2]
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Write a random-weight Hugging Face-layout Mamba/Mamba-2 checkpoint.")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="base config")
    ap.add_argument("--config", help="config.json to use as is (applied over --preset if both)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key; VALUE is parsed as JSON (repeatable), "
                         "e.g. --set n_groups=2 --set use_bias=true")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    ap.add_argument("--vocab", type=int, help="override vocab_size")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="on-disk dtype")
    ap.add_argument("--seed", type=int, default=0)
    tie = ap.add_mutually_exclusive_group()
    tie.add_argument("--tie", dest="tie", action="store_true", default=None,
                     help="tie_word_embeddings true (no lm_head.weight written)")
    tie.add_argument("--untie", dest="tie", action="store_false",
                     help="tie_word_embeddings false (lm_head.weight written)")
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    ap.add_argument("--embedding-name", choices=["embeddings", "embedding"], default="embeddings",
                    help="backbone.<name>.weight (hub files sometimes say 'embedding')")
    ap.add_argument("--tokenizer", help="tokenizer.json (or tokenizer.model) to copy into --out, "
                    "with tokenizer_config.json if it sits next to it; vocab_size is raised to "
                    "cover its ids (multiple of 16) unless --vocab is given")
    args = ap.parse_args(argv)
    if args.shards < 1:
        sys.exit("make_test_checkpoint: --shards must be >= 1")

    cfg = build_config(args)
    if args.tokenizer and args.tokenizer.endswith(".json"):
        max_id = tokenizer_max_id(args.tokenizer)
        text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg  # Qwen3.5 nests it
        if max_id is not None and max_id >= int(text["vocab_size"]):
            if args.vocab is not None:
                sys.exit("make_test_checkpoint: tokenizer ids reach %d but --vocab is %d"
                         % (max_id, args.vocab))
            new_vocab = (max_id + 1 + 15) // 16 * 16
            print("make_test_checkpoint: vocab_size %d -> %d to cover the tokenizer"
                  % (text["vocab_size"], new_vocab), file=sys.stderr)
            text["vocab_size"] = new_vocab

    specs = tensor_specs(cfg, args.embedding_name)
    os.makedirs(args.out, exist_ok=True)
    for old in os.listdir(args.out):  # never leave a stale shard set behind
        if old.startswith("model") and (old.endswith(".safetensors") or old.endswith(".index.json")):
            os.remove(os.path.join(args.out, old))
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    if args.shards == 1:
        write_safetensors(os.path.join(args.out, "model.safetensors"), specs, args.dtype, args.seed)
    else:
        itemsize = DTYPES[args.dtype][1]
        weight_map, total = {}, 0
        groups = split_shards(specs, itemsize, args.shards)
        for i, group in enumerate(groups):
            fname = "model-%05d-of-%05d.safetensors" % (i + 1, args.shards)
            total += write_safetensors(os.path.join(args.out, fname), group, args.dtype, args.seed)
            for s in group:
                weight_map[s[0]] = fname
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w",
                  encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")

    if args.tokenizer:
        src_dir = os.path.dirname(os.path.abspath(args.tokenizer))
        dest = "tokenizer.model" if args.tokenizer.endswith(".model") else "tokenizer.json"
        shutil.copyfile(args.tokenizer, os.path.join(args.out, dest))
        tcfg = os.path.join(src_dir, "tokenizer_config.json")
        if os.path.exists(tcfg):
            shutil.copyfile(tcfg, os.path.join(args.out, "tokenizer_config.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
