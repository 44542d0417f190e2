#!/usr/bin/env bash
# Makes the small random-weight checkpoints the C++ model tests run on.
set -euo pipefail
tool=$1
out=$2
py=${HYBRIDLM_PYTHON:-/usr/bin/python3}
rm -rf "$out"
mkdir -p "$out"
"$py" "$tool" --preset mamba-tiny --out "$out/mamba1" --seed 1 --set time_step_rank=6 --set state_size=12 >/dev/null
"$py" "$tool" --preset falcon-mamba-tiny --out "$out/falcon_mamba" --seed 2 >/dev/null
# Mamba-1 wide enough that a copied dt_proj (256 rows of 16) is stored in lane panels.
"$py" "$tool" --preset mamba-tiny --out "$out/mamba1_wide" --seed 19 --set hidden_size=128 \
  --set time_step_rank=16 --set num_hidden_layers=1 >/dev/null
"$py" "$tool" --preset mamba2-tiny --out "$out/mamba2_g2" --seed 3 --set n_groups=2 --set chunk_size=8 --untie >/dev/null
"$py" "$tool" --preset mamba2-tiny --out "$out/mamba2_bf16" --seed 4 --dtype bf16 >/dev/null
"$py" "$tool" --preset hybridlm-tiny --out "$out/hybridlm" --seed 5 >/dev/null
# MQA, half-rotary RoPE with q/k norms, an ungated relu^2 MLP, grouped Mamba-2, tied head.
"$py" "$tool" --preset hybridlm-tiny --out "$out/hybridlm_var" --seed 6 --tie \
  --set 'block_pattern=["t", "m2", "m2", "t", "m"]' \
  --set 'attention={"num_heads": 4, "num_kv_heads": 1, "head_dim": 16, "partial_rotary_factor": 0.5, "qk_norm": true, "rope_theta": 500.0}' \
  --set 'mlp={"intermediate_size": 96, "activation": "relu2", "gated": false}' \
  --set 'ssm={"d_state": 8, "head_dim": 8, "n_groups": 2, "chunk_size": 8, "dt_rank": 5}' >/dev/null
# Attention and MLP only, no recurrent layer: decode must equal prefill bitwise (docs/numerics.md).
"$py" "$tool" --preset hybridlm-tiny --out "$out/hybridlm_attn" --seed 14 --set 'block_pattern=["t", "t", "t"]' >/dev/null
"$py" "$tool" --preset jamba-tiny --out "$out/jamba" --seed 7 >/dev/null
"$py" "$tool" --preset bamba-tiny --out "$out/bamba" --seed 8 --set mamba_n_groups=2 --set mamba_chunk_size=8 >/dev/null
"$py" "$tool" --preset lfm2-tiny --out "$out/lfm2" --seed 9 >/dev/null
"$py" "$tool" --preset nemotron-h-tiny --out "$out/nemotron_h" --seed 10 >/dev/null
"$py" "$tool" --preset granite-h-tiny --out "$out/granite" --seed 11 --set position_embedding_type='"rope"' >/dev/null
"$py" "$tool" --preset falcon-h1-tiny --out "$out/falcon_h1" --seed 12 --set mamba_rms_norm=true >/dev/null
"$py" "$tool" --preset zamba2-tiny --out "$out/zamba2" --seed 13 --set use_mem_rope=true >/dev/null
# Discrete Mamba-2: Llamba (grouped B/C, padded vocabulary) and m2d blocks around attention.
"$py" "$tool" --preset llamba-tiny --out "$out/llamba" --seed 15 >/dev/null
"$py" "$tool" --preset hybridlm-tiny --out "$out/hybridlm_m2d" --seed 16 --set 'block_pattern=["m2d", "t", "m2d"]' \
  --set 'ssm={"d_state": 16, "head_dim": 16, "n_groups": 2, "chunk_size": 8}' >/dev/null
# LFM2-MoE: a dense first layer, then sigmoid-routed experts with the expert bias.
"$py" "$tool" --preset lfm2-moe-tiny --out "$out/lfm2_moe" --seed 17 >/dev/null
# Zamba (v1): multi-head Mamba-1 and the shared attention block (two hybrid layers, own KV each).
"$py" "$tool" --preset zamba-tiny --out "$out/zamba" --seed 18 >/dev/null
# Gated DeltaNet (Qwen3-Next's mixer) around attention: grouped value heads, d_k != d_v, chunk 8
# (the CPU prefill runs chunks of min(chunk_size, 64): several chunks even on short prompts).
"$py" "$tool" --preset hybridlm-tiny --out "$out/hybridlm_gdn" --seed 17 --set 'block_pattern=["gdn", "t", "gdn"]' \
  --set 'gdn={"num_key_heads": 2, "num_value_heads": 4, "key_head_dim": 16, "value_head_dim": 8, "chunk_size": 8}' >/dev/null
"$py" "$tool" --preset qwen3-next-tiny --out "$out/qwen3_next" --seed 18 >/dev/null
# Qwen3.5 (four DeltaNet projections, nested text_config, model.language_model.* names, unread
# mtp.* and model.visual.* tensors): dense, and MoE with stacked experts.
"$py" "$tool" --preset qwen3.5-tiny --out "$out/qwen3_5" --seed 19 >/dev/null
"$py" "$tool" --preset qwen3.5-moe-tiny --out "$out/qwen3_5_moe" --seed 20 >/dev/null
echo "fixtures written to $out"
