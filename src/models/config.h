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

namespace hybridlm {

enum class MixerKind { Mamba1, Mamba2 };
const char* mixer_kind_name(MixerKind k);  // "mamba1", "mamba2"

// How Mamba-2's gated RMSNorm groups channels. Grouped (per d_inner / n_groups channels) is the
// original mamba_ssm semantics the checkpoints were trained with, and llama.cpp's; Hugging Face's
// torch path normalises over the full d_inner. Identical when n_groups == 1. See docs/numerics.md.
enum class NormGrouping { Grouped, Full };

struct Mamba1Spec {
  int d_inner = 0, d_state = 0, d_conv = 0, dt_rank = 0;
  bool proj_bias = false, conv_bias = true;
  // FalconMamba: weightless RMS norms on dt, B and C after x_proj.
  bool dt_bc_rms = false;
  float dt_bc_rms_eps = 1e-6f;
};

struct Mamba2Spec {
  int d_inner = 0, d_state = 0, d_conv = 0, n_heads = 0, head_dim = 0, n_groups = 1;
  int chunk_size = 256;
  bool proj_bias = false, conv_bias = true;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();  // time_step_limit clamp
  float norm_eps = 1e-5f;
  NormGrouping norm_grouping = NormGrouping::Grouped;
  int conv_dim() const { return d_inner + 2 * n_groups * d_state; }
  int in_proj_dim() const { return 2 * d_inner + 2 * n_groups * d_state + n_heads; }
};

struct BlockSpec {
  MixerKind mixer = MixerKind::Mamba1;
  Mamba1Spec m1;
  Mamba2Spec m2;
};

struct HybridConfig {
  std::string family;        // "mamba", "falcon_mamba", "mamba2"
  std::string architecture;  // e.g. "MambaForCausalLM"
  int d_model = 0;
  int vocab_size = 0;
  float norm_eps = 1e-5f;
  bool tie_embeddings = true;
  std::optional<int32_t> bos_token_id, eos_token_id, pad_token_id;
  std::vector<BlockSpec> blocks;

  int n_layers() const { return static_cast<int>(blocks.size()); }
  // e.g. "m1 x24" or "m2 m2 m2"
  std::string layer_pattern() const;
};

// Reads <dir>/config.json and dispatches on `architectures` / `model_type` to a family adapter.
// Errors name the file and the key.
HybridConfig load_config(const std::filesystem::path& dir, NormGrouping mamba2_norm = NormGrouping::Grouped);
// The text of a config.json (bare Infinity / NaN accepted, as Python writes them).
HybridConfig parse_config_text(const std::string& text, const std::string& where,
                               NormGrouping mamba2_norm = NormGrouping::Grouped);
HybridConfig parse_config(const nlohmann::json& j, const std::string& where,
                          NormGrouping mamba2_norm = NormGrouping::Grouped);

}  // namespace hybridlm
