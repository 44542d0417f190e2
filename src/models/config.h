// The uniform model description every family adapter produces (ARCHITECTURE.md section 3):
// global dims plus one BlockSpec per layer. Kernels and the cache only ever see this.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/kernels.h"

namespace hybridlm {

// A block's sequence mixer. None: a block that is only a feed-forward (Nemotron-H's MLP layers).
// Mamba2Attention: Falcon-H1's parallel layer, mamba2(x) + attention(x) on the same input.
// Mamba2Discrete: the discrete Mamba-2 of MOHAWK / Llamba (Mamba2DiscreteSpec).
// GatedDeltaNet: Qwen3-Next's linear attention with the gated delta rule (GdnSpec).
enum class MixerKind { None, Mamba1, Mamba2, Attention, ShortConv, Mamba2Attention, Mamba2Discrete, GatedDeltaNet };
// "none", "mamba1", "mamba2", "attention", "short_conv", "mamba2||attention", "mamba2_discrete",
// "gdn"
const char* mixer_kind_name(MixerKind k);

// How Mamba-2's gated RMSNorm groups channels. Grouped (per d_inner / n_groups channels) is the
// original mamba_ssm semantics the checkpoints were trained with, and llama.cpp's; Hugging Face's
// torch path normalises over the full d_inner. Identical when n_groups == 1. See docs/numerics.md.
enum class NormGrouping { Grouped, Full };

struct Mamba1Spec {
  int d_inner = 0, d_state = 0, d_conv = 0, dt_rank = 0;
  bool proj_bias = false, conv_bias = true;
  // FalconMamba: weightless RMS norms on dt, B and C after x_proj; Jamba: the same norms with
  // weights (dt_layernorm, b_layernorm, c_layernorm).
  bool dt_bc_rms = false;
  bool dt_bc_rms_weights = false;
  float dt_bc_rms_eps = 1e-6f;
  // Zamba's multi-head Mamba-1: the d_inner channels split into n_heads heads of d_inner / n_heads,
  // each an independent Mamba-1 with its own x_proj and dt_proj (so its own dt, B and C), stored as
  // per-head tensors x_proj_weight (nh, R + 2N, P), dt_proj_weight (nh, P, R), dt_proj_bias (nh, P);
  // and in_proj rows alternating x, z (row 2c is x_c, row 2c + 1 is z_c). Both off: mamba_ssm's layout.
  int n_heads = 1;
  bool head_tensors = false;
  bool in_proj_interleaved = false;
};

struct Mamba2Spec {
  int d_inner = 0, d_state = 0, d_conv = 0, n_heads = 0, head_dim = 0, n_groups = 1;
  int chunk_size = 256;
  bool proj_bias = false, conv_bias = true;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();  // time_step_limit clamp
  float norm_eps = 1e-5f;
  NormGrouping norm_grouping = NormGrouping::Grouped;
  // The output gate: y * silu(z) normalised after the gate (default), before it
  // (w * norm(y) * silu(z): Falcon-H1 with mamba_norm_before_gate), or not at all (no norm weight).
  bool gate_norm = true, norm_before_gate = false;
  std::optional<bool> out_proj_bias;  // unset: = proj_bias (Falcon-H1 sets it apart: projectors_bias)
  bool has_out_bias() const { return out_proj_bias.value_or(proj_bias); }
  // Falcon-H1's µP: u x in_scale before in_proj; in_proj's output segments [z, x, B, C, dt] x mup;
  // the output x out_scale.
  float in_scale = 1.0f, out_scale = 1.0f;
  float mup[5] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  int conv_dim() const { return d_inner + 2 * n_groups * d_state; }
  int in_proj_dim() const { return 2 * d_inner + 2 * n_groups * d_state + n_heads; }
};

// The discrete Mamba-2 mixer (MOHAWK, Bick et al. 2024; Llamba): in_proj -> [x, B, C, z, A~]
// (sizes I, G*N, G*N, I, nh); causal conv over xBC with no activation after it (or silu); per token
// and value head the decay a_t = exp(-softplus(A~_t)) and no dt on the input:
//   S_t = a_t S_{t-1} + x_t B_t^T,  y_t = S_t C_t + D_h x_t,  out = out_proj(y * silu(z + z_bias)).
// nh = n_v_heads value heads of head_dim = I / nh; G = n_qk_heads groups of B and C.
struct Mamba2DiscreteSpec {
  int d_inner = 0, d_state = 0, d_conv = 4, n_heads = 0, head_dim = 0, n_groups = 0;
  int chunk_size = 128;
  // bias: in_proj and out_proj biases; without them the gate has a learned z_bias (I).
  bool proj_bias = false, conv_bias = true;
  bool conv_silu = false;  // ssm_cfg.activation "silu" / "swish"; Llamba: "identity"
  int conv_dim() const { return d_inner + 2 * n_groups * d_state; }
  int in_proj_dim() const { return 2 * d_inner + 2 * n_groups * d_state + n_heads; }
};

// Gated DeltaNet (Yang et al. 2024, as in Qwen3-Next): projections of u to q, k (nk heads of dk),
// v, z (nv heads of dv), b and a (nv); a causal conv (no bias) with SiLU over [q, k, v]; per value
// head the gated delta rule over l2-normalised q and k with beta = sigmoid(b) and log-decay
// g = -exp(A_log) softplus(a + dt_bias) (kernels.h: gated_delta_scan); then per value head
// w * rmsnorm(y) * silu(z) (norm before gate) and out_proj. Value head h reads key head h / (nv / nk).
// Weights (Qwen3-Next): in_proj_qkvz (2 nk dk + 2 nv dv, H), whose rows come per key head j as
// [q_j (dk) | k_j (dk) | v of value heads j r .. j r + r - 1 (r dv) | z of the same (r dv)] with
// r = nv / nk; in_proj_ba (2 nv, H), per key head [b (r) | a (r)]; conv1d.weight (conv_dim, 1, K);
// dt_bias, A_log (nv); norm.weight (dv); out_proj.weight (H, nv dv). Qwen3.5 (interleaved = false)
// stores the projections apart and in order instead: in_proj_qkv (2 nk dk + nv dv, H) = [q | k | v],
// in_proj_z (nv dv, H), in_proj_b (nv, H), in_proj_a (nv, H).
struct GdnSpec {
  int n_k_heads = 0, n_v_heads = 0, k_dim = 0, v_dim = 0, d_conv = 4;
  int chunk_size = 64;
  float norm_eps = 1e-6f;
  bool interleaved = true;  // in_proj_qkvz + in_proj_ba (Qwen3-Next), else four projections (Qwen3.5)
  int key_dim() const { return n_k_heads * k_dim; }
  int value_dim() const { return n_v_heads * v_dim; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  GdnDims dims() const { return {n_k_heads, n_v_heads, k_dim, v_dim}; }
};

// LFM2's gated short conv: a depthwise causal conv of d_conv taps over B * x, gated by C.
struct ShortConvSpec {
  int d_conv = 3;
  bool bias = false;  // in_proj, conv and out_proj biases
};

// Causal self-attention with grouped KV heads.
struct AttentionSpec {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int rope_dim = 0;  // rotated dims at the start of each head; 0 = no positional encoding
  float rope_theta = 10000.0f;
  float scale = 0.0f;  // softmax scale; 0 = 1 / sqrt(head_dim)
  bool qkv_bias = false, o_bias = false;
  bool qk_norm = false;  // RMSNorm over head_dim on q and k (weights q_norm, k_norm)
  float qk_norm_eps = 1e-6f;
  float qk_norm_offset = 0.0f;  // the q/k norms multiply by offset + w (Qwen3-Next's zero-centred: 1)
  // Gated attention (Qwen3-Next): q_proj is (2 x heads x hd, H), each head's rows [hd query | hd
  // gate]; each head's output is multiplied by sigmoid(gate) before o_proj.
  bool output_gate = false;
  std::string o_name = "o_proj", q_norm_name = "q_norm", k_norm_name = "k_norm";
  // Falcon-H1's µP: attention(x x in_scale) with k x k_scale (before RoPE), output x out_scale.
  float in_scale = 1.0f, k_scale = 1.0f, out_scale = 1.0f;
  float softmax_scale() const;
};

// One MLP: gated down(act(gate x) * up x) (SwiGLU, GeGLU) or ungated down(act(up x)).
struct MlpSpec {
  int d_ff = 0;  // hidden width F
  Activation act = Activation::Silu;
  bool gated = true;
  // One (2F, H) matrix named `up` holding the gate rows, then the up rows (Granite input_linear,
  // Zamba2 gate_up_proj).
  bool fused = false;
  bool bias = false;
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
  // Falcon-H1's µP: act(gate(x) x gate_scale), output x down_scale.
  float gate_scale = 1.0f, down_scale = 1.0f;
};

// How a mixture of experts picks a token's experts and weighs them.
enum class Routing {
  SoftmaxTopK,    // p = softmax(logits); the top_k of p (Jamba; renormalize optional)
  TopKSoftmax,    // the top_k logits, softmax over those k (Granite)
  SigmoidGrouped  // s = sigmoid(logits); choose by s + correction bias within the best groups;
                  // weights s (renormalised if asked) x routed_scale (Nemotron-H, DeepSeek-V3;
                  // LFM2-MoE: one group, the bias its expert_bias)
};

// The feed-forward of a block: an MLP, or a mixture of MLP experts (+ an always-on shared MLP).
enum class FfnKind { None, Mlp, Moe };
struct FfnSpec {
  FfnKind kind = FfnKind::None;
  MlpSpec mlp;  // the MLP, or every expert
  // MoE: router "<ffn><router>" (E, H); experts "<ffn><experts><e>.<names>" or, when stacked, one
  // (E, rows, cols) tensor per projection "<ffn><names>".
  int n_experts = 0, top_k = 0;
  Routing routing = Routing::SoftmaxTopK;
  bool renormalize = false;  // weights of the top_k renormalised to sum to 1
  // SigmoidGrouped: renormalised weights are s / (sum of the chosen s + renorm_eps) (DeepSeek-V3 and
  // Nemotron-H 1e-20; LFM2-MoE 1e-6).
  float renorm_eps = 1e-20f;
  float routed_scale = 1.0f;
  int n_group = 1, topk_group = 1;  // SigmoidGrouped: experts in n_group groups, keep topk_group
  std::string router = "router.weight", experts = "experts.";
  std::string correction_bias;  // SigmoidGrouped: "<ffn><correction_bias>" (E), or empty
  bool stacked_experts = false;
  std::string stacked_suffix = ".weight";  // after a stacked tensor's name; Qwen3.5-MoE: none
  // Added to the MoE output on the same input (Granite shared_mlp, Nemotron-H shared_experts);
  // shared.d_ff == 0: none. shared_prefix is a full tensor-name prefix.
  MlpSpec shared;
  std::string shared_prefix;
  // The full name of a (1, H) weight w gating the shared MLP per token: shared(x) x sigmoid(x . w)
  // (Qwen3-Next's shared_expert_gate); empty: ungated.
  std::string shared_gate;
};

// Where a block's tensors live in the checkpoint (full prefixes, ending in '.').
struct BlockNames {
  std::string mixer_norm;  // RMSNorm weight before the mixer (full tensor name)
  std::string mixer;       // prefix of the mixer's tensors
  std::string ffn_norm;    // RMSNorm weight before the feed-forward (full tensor name)
  std::string ffn;         // prefix of the feed-forward's tensors
  // Mamba2Attention: prefix of the attention's tensors (mixer = Mamba-2's). Zamba2 hybrid layers:
  // the layer prefix (its `linear.weight` and the shared block's search order start there).
  std::string mixer2;
};

// Zamba's and Zamba2's shared transformer blocks: attention over concat(h, embeddings) (2H wide)
// and an MLP, with per-invocation LoRA adapters (Zamba2), and no residual inside. n_blocks distinct
// blocks; the j-th hybrid layer uses block j % n_blocks with adapter j.
struct SharedTransformerSpec {
  int n_blocks = 0;
  // The block's tensors: "<hybrid layer prefix><name>..." under one of the layers using it
  // (Zamba2 "shared_transformer.", Zamba "shared_transf.").
  std::string name = "shared_transformer.";
  AttentionSpec attn;  // inputs 2H, o_proj (H, heads x head_dim)
  MlpSpec mlp;         // gated, on H: fused gate_up_proj (Zamba2) or gate_proj / up_proj (Zamba)
  int adapter_rank = 0;
  bool attn_adapters = false, mlp_adapters = false;
  float norm_eps = 1e-5f;
};

// One layer: h += mixer(norm(h)); then, with a feed-forward, h += ffn(norm(h)).
// With shared_block >= 0 (Zamba / Zamba2 hybrid layers), first t = linear(shared_block(h, emb)) and the
// mixer reads norm(h + t): h += mixer(norm(h + t)).
struct BlockSpec {
  MixerKind mixer = MixerKind::Mamba1;
  Mamba1Spec m1;
  Mamba2Spec m2;
  Mamba2DiscreteSpec m2d;
  GdnSpec gdn;
  AttentionSpec attn;
  ShortConvSpec conv;
  FfnSpec ffn;
  BlockNames names;
  int shared_block = -1, adapter = -1;
};

struct HybridConfig {
  std::string family;        // "mamba", "falcon_mamba", "mamba2"
  std::string architecture;  // e.g. "MambaForCausalLM"
  int d_model = 0;
  int vocab_size = 0;
  float norm_eps = 1e-5f;
  // The block and final RMSNorms multiply by norm_offset + w: 0 (plain), 1 (zero-centred weights,
  // Qwen3-Next / Qwen3.5's (1 + w)).
  float norm_offset = 0.0f;
  // The eps of the blocks' norms when it differs from the final norm's (Llamba: 1e-5 in every
  // block whatever norm_epsilon says); unset: norm_eps.
  std::optional<float> block_norm_eps;
  float block_eps() const { return block_norm_eps.value_or(norm_eps); }
  bool tie_embeddings = true;
  // µP-style scalars (Granite, Falcon-H1): h0 = embedding(ids) x embedding_multiplier; every
  // residual add is h += residual_multiplier x sublayer(h); logits x logits_multiplier.
  float embedding_multiplier = 1.0f, residual_multiplier = 1.0f, logits_multiplier = 1.0f;
  std::optional<int32_t> bos_token_id, eos_token_id, pad_token_id;
  std::vector<BlockSpec> blocks;
  SharedTransformerSpec shared;  // Zamba, Zamba2
  // Global tensor names (the family's layout).
  std::string embedding_name, final_norm_name, lm_head_name = "lm_head.weight";
  std::string embedding_alias;  // read when the checkpoint has no embedding_name (may be empty)
  // config.json's `dtype` / `torch_dtype` ("bfloat16", "float32", ...); empty when absent.
  std::string torch_dtype;

  int n_layers() const { return static_cast<int>(blocks.size()); }
  // e.g. "mamba1 x24" or "mamba2 x2, attention x1"; a feed-forward shows as "+mlp" / "+moe",
  // Zamba2's shared transformer block as "shared_attention+" (block_label of each layer).
  std::string layer_pattern() const;
};

// One layer's kinds in run order: "mamba2", "attention+mlp", "mamba2||attention+mlp" (parallel
// mixers), "shared_attention+mamba2" (a Zamba2 hybrid layer).
std::string block_label(const BlockSpec& b);

// Reads <dir>/config.json and dispatches on `architectures` / `model_type` to a family adapter.
// Errors name the file and the key.
HybridConfig load_config(const std::filesystem::path& dir, NormGrouping mamba2_norm = NormGrouping::Grouped);
// The text of a config.json (bare Infinity / NaN accepted, as Python writes them).
HybridConfig parse_config_text(const std::string& text, const std::string& where,
                               NormGrouping mamba2_norm = NormGrouping::Grouped);
HybridConfig parse_config(const nlohmann::json& j, const std::string& where,
                          NormGrouping mamba2_norm = NormGrouping::Grouped);

}  // namespace hybridlm
