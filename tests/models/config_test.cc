// config.json adapters: Hugging Face defaults, dispatch, and one clear error per bad config.
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "cache/hybrid_cache.h"
#include "models/config.h"
#include "models/plan.h"

namespace hybridlm {
namespace {

using nlohmann::json;

std::string error_of(const json& j) {
  try {
    parse_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, MambaDefaultsFollowTransformers) {
  HybridConfig c = parse_config(json{{"architectures", {"MambaForCausalLM"}}, {"hidden_size", 768},
                                     {"num_hidden_layers", 24}, {"vocab_size", 50280}},
                                "config.json");
  EXPECT_EQ(c.family, "mamba");
  ASSERT_EQ(c.n_layers(), 24);
  const Mamba1Spec& m = c.blocks[0].m1;
  EXPECT_EQ(m.d_inner, 1536);
  EXPECT_EQ(m.d_state, 16);
  EXPECT_EQ(m.d_conv, 4);
  EXPECT_EQ(m.dt_rank, 48);  // ceil(768 / 16)
  EXPECT_FALSE(m.proj_bias);
  EXPECT_TRUE(m.conv_bias);
  EXPECT_FALSE(m.dt_bc_rms);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.layer_pattern(), "mamba1 x24");
}

TEST(Config, FalconMambaHasDtBcNorms) {
  HybridConfig c = parse_config(json{{"model_type", "falcon_mamba"}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                                     {"time_step_rank", "auto"}, {"mixer_rms_eps", 1e-5}},
                                "config.json");
  EXPECT_EQ(c.family, "falcon_mamba");
  EXPECT_TRUE(c.blocks[0].m1.dt_bc_rms);
  EXPECT_FLOAT_EQ(c.blocks[0].m1.dt_bc_rms_eps, 1e-5f);
  EXPECT_EQ(c.blocks[0].m1.dt_rank, 4);
}

TEST(Config, Mamba2CodestralShape) {
  HybridConfig c = parse_config(json{{"architectures", {"Mamba2ForCausalLM"}}, {"hidden_size", 4096},
                                     {"num_hidden_layers", 64}, {"num_heads", 128}, {"head_dim", 64},
                                     {"state_size", 128}, {"n_groups", 8}, {"vocab_size", 32768},
                                     {"time_step_limit", {0.0, "Infinity"}}},
                                "config.json");
  const Mamba2Spec& m = c.blocks[0].m2;
  EXPECT_EQ(m.d_inner, 8192);
  EXPECT_EQ(m.conv_dim(), 8192 + 2 * 8 * 128);
  EXPECT_EQ(m.in_proj_dim(), 2 * 8192 + 2 * 8 * 128 + 128);
  EXPECT_EQ(m.norm_grouping, NormGrouping::Grouped);
  EXPECT_TRUE(std::isinf(m.dt_max));
  EXPECT_FALSE(c.tie_embeddings);  // Mamba2Config default
}

TEST(Config, NullEosMeansNoEos) {
  HybridConfig c = parse_config(json{{"model_type", "mamba"}, {"eos_token_id", nullptr}}, "config.json");
  EXPECT_FALSE(c.eos_token_id.has_value());
  EXPECT_EQ(c.bos_token_id, 0);  // absent: the HF default
}

TEST(Config, BadConfigsNameTheProblem) {
  const json base = {{"model_type", "mamba2"}, {"hidden_size", 64}, {"num_heads", 8}, {"head_dim", 16},
                     {"n_groups", 1}, {"num_hidden_layers", 2}};
  EXPECT_EQ(error_of(base), "(no error)");
  json j = base;
  j["head_dim"] = 10;
  {
    const std::string e = error_of(j);
    EXPECT_NE(e.find("num_heads x head_dim = 80 must equal expand x hidden_size = 128"), std::string::npos) << e;
  }
  j = base;
  j["n_groups"] = 3;
  EXPECT_NE(error_of(j).find("n_groups = 3: must divide num_heads"), std::string::npos) << error_of(j);
  j = base;
  j["num_hidden_layers"] = -1;
  EXPECT_NE(error_of(j).find("num_hidden_layers = -1: must be a positive integer"), std::string::npos);
  j = base;
  j["hidden_size"] = "big";
  EXPECT_NE(error_of(j).find("hidden_size = \"big\": expected an integer"), std::string::npos);
  j = base;
  j["conv_kernel"] = 4.18446744073709551615e20;  // found by fuzz_config: the float->int cast was UB
  EXPECT_NE(error_of(j).find("conv_kernel = 4.1844674407370955e+20: expected an integer"), std::string::npos)
      << error_of(j);
  j = base;
  j["state_size"] = 64.0;  // an integral float is accepted
  EXPECT_EQ(error_of(j), "(no error)");
  j = base;
  j["head_dim"] = 1 << 23;
  EXPECT_NE(error_of(j).find("head_dim = 8388608: must be at most 4194304"), std::string::npos) << error_of(j);
  j = base;
  j["layer_norm_epsilon"] = -1;  // review: a negative eps gave all-NaN logits and exit 0
  EXPECT_NE(error_of(j).find("layer_norm_epsilon = -1: must be a finite number > 0"), std::string::npos);
  j = base;
  j["eos_token_id"] = 4294967296;
  EXPECT_NE(error_of(j).find("eos_token_id = 4294967296: not a valid token id"), std::string::npos);
  j = base;
  j["time_step_limit"] = {0.1, 0.01};
  EXPECT_NE(error_of(j).find("time_step_limit"), std::string::npos);
  j = base;
  j.erase("model_type");
  EXPECT_NE(error_of(j).find("unsupported model (model_type ''"), std::string::npos) << error_of(j);
  j = base;
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("model_type 'llama'"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("expected a JSON object"), std::string::npos);
}

TEST(Config, JambaPatternFromPeriodsAndLayerTypeSpellings) {
  const json base = {{"model_type", "jamba"}, {"hidden_size", 64}, {"num_hidden_layers", 8}, {"vocab_size", 100},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
                     {"num_experts", 4}, {"num_experts_per_tok", 2}, {"attn_layer_period", 4},
                     {"attn_layer_offset", 2}};
  HybridConfig c = parse_config(base, "config.json");
  EXPECT_EQ(c.layer_pattern(), "(mamba1+mlp, mamba1+moe, attention+mlp, mamba1+moe) x2");
  EXPECT_EQ(c.blocks[2].attn.rope_dim, 0) << "Jamba has no positional encoding";
  EXPECT_TRUE(c.blocks[0].m1.dt_bc_rms_weights);
  EXPECT_FLOAT_EQ(c.blocks[0].m1.dt_bc_rms_eps, 1e-6f);
  EXPECT_EQ(c.blocks[1].ffn.top_k, 2);
  EXPECT_FALSE(c.blocks[1].ffn.renormalize);
  EXPECT_EQ(c.blocks[2].names.mixer, "model.layers.2.self_attn.");
  EXPECT_EQ(c.blocks[3].names.mixer, "model.layers.3.mamba.");
  // Both spellings of an explicit layer list.
  json j = base;
  j["num_hidden_layers"] = 3;
  j["layers_block_type"] = {"mamba", "attention", "linear_attention"};
  EXPECT_EQ(parse_config(j, "config.json").blocks[1].mixer, MixerKind::Attention);
  j["layers_block_type"] = {"full_attention", "mamba", "mamba"};
  EXPECT_EQ(parse_config(j, "config.json").blocks[0].mixer, MixerKind::Attention);
  j["layers_block_type"] = {"mamba", "conv", "mamba"};
  EXPECT_NE(error_of(j).find("layers_block_type = an array of 3: entry 1 is \"conv\": unknown layer type"), std::string::npos)
      << error_of(j);
  j["layers_block_type"] = {"mamba", "mamba"};
  EXPECT_NE(error_of(j).find("has 2 entries for 3 layers"), std::string::npos) << error_of(j);
  j = base;
  j["attn_layer_offset"] = 4;
  EXPECT_NE(error_of(j).find("attn_layer_offset = 4: must be in [0, attn_layer_period)"), std::string::npos);
  j = base;
  j["num_experts_per_tok"] = 5;
  EXPECT_NE(error_of(j).find("num_experts_per_tok = 5: must be at most num_experts"), std::string::npos);
  j = base;
  j.erase("num_key_value_heads");  // JambaConfig's default is 8, not the head count
  j["num_attention_heads"] = 16;
  EXPECT_EQ(parse_config(j, "config.json").blocks[2].attn.n_kv_heads, 8);
  j = base;
  j["num_experts"] = 1;  // one expert: every feed-forward is the dense MLP
  EXPECT_EQ(parse_config(j, "config.json").blocks[1].ffn.kind, FfnKind::Mlp);
}

TEST(Config, BambaAttentionIndicesAndHalfRope) {
  const json base = {{"model_type", "bamba"}, {"hidden_size", 64}, {"num_hidden_layers", 4}, {"vocab_size", 100},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
                     {"attn_layer_indices", {1, 3}}, {"mamba_n_heads", 8}, {"mamba_d_head", "auto"},
                     {"mamba_d_state", 16}, {"rope_parameters", {{"rope_theta", 500.0}, {"rope_type", "default"}}}};
  HybridConfig c = parse_config(base, "config.json");
  EXPECT_EQ(c.layer_pattern(), "(mamba2+mlp, attention+mlp) x2");
  EXPECT_EQ(c.blocks[0].m2.head_dim, 16);
  EXPECT_EQ(c.blocks[1].attn.rope_dim, 8);
  EXPECT_FLOAT_EQ(c.blocks[1].attn.rope_theta, 500.0f);
  json j = base;
  j["attn_layer_indices"] = {1, 4};
  EXPECT_NE(error_of(j).find("attn_layer_indices = an array of 2: entries must be layer indices in [0, num_hidden_layers = 4)"),
            std::string::npos)
      << error_of(j);
  j = base;
  j["mamba_n_heads"] = 5;
  EXPECT_NE(error_of(j).find("mamba_n_heads = 5: must divide"), std::string::npos) << error_of(j);
  j = base;
  j["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_NE(error_of(j).find("rope_type = \"yarn\": only default RoPE is supported"), std::string::npos)
      << error_of(j);
}

TEST(Config, Lfm2WidthsNamesAndLayerTypes) {
  const json base = {{"model_type", "lfm2"}, {"hidden_size", 2048}, {"num_hidden_layers", 4}, {"vocab_size", 100},
                     {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"intermediate_size", 12288},
                     {"block_ffn_dim_multiplier", 1.0}, {"block_multiple_of", 256}, {"full_attn_idxs", {1}}};
  HybridConfig c = parse_config(base, "config.json");
  // Lfm2MLP: int(2 x 12288 / 3) = 8192, x 1.0, rounded up to 256 -> 8192 (LFM2-1.2B's real width).
  EXPECT_EQ(c.blocks[0].ffn.mlp.d_ff, 8192);
  EXPECT_EQ(c.blocks[0].mixer, MixerKind::ShortConv);
  EXPECT_EQ(c.blocks[1].mixer, MixerKind::Attention);
  EXPECT_EQ(c.blocks[1].attn.o_name, "out_proj");
  EXPECT_TRUE(c.blocks[1].attn.qk_norm);
  EXPECT_EQ(c.blocks[1].attn.rope_dim, 64);
  EXPECT_FLOAT_EQ(c.blocks[1].attn.rope_theta, 1e6f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.final_norm_name, "model.embedding_norm.weight");
  json j = base;
  j["block_ffn_dim_multiplier"] = 1.3;  // int(1.3 x 8192) = 10649 -> 10752
  EXPECT_EQ(parse_config(j, "config.json").blocks[0].ffn.mlp.d_ff, 10752);
  j.erase("block_ffn_dim_multiplier");  // absent: the default 1.0, rounded up
  j["intermediate_size"] = 1000;
  EXPECT_EQ(parse_config(j, "config.json").blocks[0].ffn.mlp.d_ff, 768);
  j["block_ffn_dim_multiplier"] = nullptr;  // explicit null: no multiplier, no rounding
  EXPECT_EQ(parse_config(j, "config.json").blocks[0].ffn.mlp.d_ff, 666);
  j = base;
  j.erase("full_attn_idxs");
  j["layer_types"] = {"conv", "conv", "full_attention", "mamba"};
  EXPECT_NE(error_of(j).find("layer_types = an array of 4: entry 3: unknown layer type (use conv or full_attention)"),
            std::string::npos)
      << error_of(j);
}

TEST(Config, Lfm2MoeDenseLayersAndSigmoidRouting) {
  // LFM2-8B-A1B's shape (research: Lfm2MoeConfig defaults), cut to 4 layers.
  const json base = {{"model_type", "lfm2_moe"}, {"architectures", {"Lfm2MoeForCausalLM"}}, {"num_hidden_layers", 4},
                     {"layer_types", {"conv", "conv", "full_attention", "conv"}}};
  HybridConfig c = parse_config(base, "config.json");
  EXPECT_EQ(c.family, "lfm2_moe");
  EXPECT_EQ(c.d_model, 2048);
  EXPECT_EQ(c.vocab_size, 65536);
  EXPECT_EQ(c.layer_pattern(), "short_conv+mlp x2, attention+moe x1, short_conv+moe x1");
  // Dense layers: intermediate_size as is (no LFM2 width adjustment).
  EXPECT_EQ(c.blocks[1].ffn.kind, FfnKind::Mlp);
  EXPECT_EQ(c.blocks[1].ffn.mlp.d_ff, 7168);
  EXPECT_EQ(c.blocks[1].ffn.mlp.gate, "w1");
  const FfnSpec& m = c.blocks[2].ffn;
  EXPECT_EQ(m.kind, FfnKind::Moe);
  EXPECT_EQ(m.mlp.d_ff, 1792);
  EXPECT_EQ(m.mlp.up, "w3");
  EXPECT_EQ(m.n_experts, 32);
  EXPECT_EQ(m.top_k, 4);
  EXPECT_EQ(m.routing, Routing::SigmoidGrouped);
  EXPECT_EQ(m.n_group, 1);
  EXPECT_TRUE(m.renormalize);
  EXPECT_FLOAT_EQ(m.renorm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(m.routed_scale, 1.0f);
  EXPECT_EQ(m.router, "gate.weight");
  EXPECT_EQ(m.correction_bias, "expert_bias");
  EXPECT_EQ(c.blocks[2].names.ffn, "model.layers.2.feed_forward.");
  EXPECT_EQ(c.blocks[2].attn.o_name, "out_proj");
  EXPECT_FLOAT_EQ(c.blocks[2].attn.rope_theta, 1e6f);
  EXPECT_TRUE(c.tie_embeddings);
  json j = base;
  j["use_expert_bias"] = false;
  j["num_dense_layers"] = 0;
  j["norm_topk_prob"] = false;
  c = parse_config(j, "config.json");
  EXPECT_EQ(c.blocks[0].ffn.kind, FfnKind::Moe);
  EXPECT_TRUE(c.blocks[0].ffn.correction_bias.empty());
  EXPECT_FALSE(c.blocks[0].ffn.renormalize);
  j = base;
  j.erase("layer_types");
  EXPECT_NE(error_of(j).find("layer_types = (missing): required"), std::string::npos) << error_of(j);
  j = base;
  j["num_experts_per_tok"] = 40;
  EXPECT_NE(error_of(j).find("num_experts_per_tok = 40: must be at most num_experts"), std::string::npos);
  j = base;
  j["num_dense_layers"] = -1;
  EXPECT_NE(error_of(j).find("num_dense_layers = -1: must be >= 0"), std::string::npos) << error_of(j);
  j = base;
  j["routed_scaling_factor"] = 0;
  EXPECT_NE(error_of(j).find("routed_scaling_factor = 0: must be a positive number"), std::string::npos);
  j = base;
  j["moe_intermediate_size"] = 0;
  EXPECT_NE(error_of(j).find("moe_intermediate_size = 0"), std::string::npos);
}

TEST(Config, ZambaDefaultsHeadsAndSharedBlock) {
  // ZambaConfig defaults (Zamba-7B-v1): 76 layers, hybrid at 2 and 3 + i where i % 6 == 4.
  const json base = {{"model_type", "zamba"}, {"architectures", {"ZambaForCausalLM"}}};
  HybridConfig c = parse_config(base, "config.json");
  EXPECT_EQ(c.family, "zamba");
  ASSERT_EQ(c.n_layers(), 76);
  EXPECT_EQ(c.d_model, 3712);
  EXPECT_EQ(c.blocks[1].shared_block, -1);
  EXPECT_EQ(c.blocks[2].shared_block, 0);
  EXPECT_EQ(c.blocks[7].shared_block, 0);  // i = 4
  EXPECT_EQ(c.blocks[13].shared_block, 0);  // i = 10
  EXPECT_EQ(c.blocks[8].shared_block, -1);
  EXPECT_EQ(c.blocks[13].adapter, 2);
  const Mamba1Spec& m = c.blocks[0].m1;
  EXPECT_EQ(m.d_inner, 7424);
  EXPECT_EQ(m.n_heads, 2);
  EXPECT_TRUE(m.head_tensors);
  EXPECT_TRUE(m.in_proj_interleaved);
  EXPECT_EQ(m.d_state, 16);
  EXPECT_EQ(m.dt_rank, 232);  // ceil(3712 / 16)
  EXPECT_TRUE(m.conv_bias);
  EXPECT_FALSE(m.proj_bias);
  EXPECT_EQ(c.blocks[2].names.mixer, "model.layers.2.mamba_decoder.mamba.");
  EXPECT_EQ(c.blocks[2].names.mixer2, "model.layers.2.");
  EXPECT_EQ(c.blocks[0].names.mixer_norm, "model.layers.0.input_layernorm.weight");
  const SharedTransformerSpec& st = c.shared;
  EXPECT_EQ(st.n_blocks, 1);
  EXPECT_EQ(st.name, "shared_transf.");
  EXPECT_EQ(st.attn.n_heads, 16);
  EXPECT_EQ(st.attn.n_kv_heads, 16);  // null: the head count
  EXPECT_EQ(st.attn.head_dim, 464);   // 2H / heads
  EXPECT_EQ(st.attn.rope_dim, 0);
  EXPECT_FLOAT_EQ(st.attn.softmax_scale(), 1.0f / std::sqrt(232.0f));
  EXPECT_FALSE(st.mlp.fused);
  EXPECT_EQ(st.mlp.d_ff, 14848);
  EXPECT_EQ(st.mlp.act, Activation::Gelu);
  EXPECT_EQ(st.adapter_rank, 0);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.final_norm_name, "model.final_layernorm.weight");
  json j = base;
  j["layers_block_type"] = {"mamba", "hybrid", "mamba"};
  j["num_hidden_layers"] = 3;
  j["mamba_dt_rank"] = 7;
  j["attention_head_dim"] = 64;
  c = parse_config(j, "config.json");
  EXPECT_EQ(c.blocks[1].shared_block, 0);
  EXPECT_EQ(c.blocks[0].m1.dt_rank, 7);
  EXPECT_EQ(c.shared.attn.head_dim, 64);
  j = base;
  j["n_mamba_heads"] = 3;
  EXPECT_NE(error_of(j).find("n_mamba_heads = 3: must divide mamba_expand x hidden_size = 7424"), std::string::npos)
      << error_of(j);
  j = base;
  j["hidden_mamba_act"] = "gelu";
  EXPECT_NE(error_of(j).find("hidden_mamba_act = \"gelu\": only silu is supported"), std::string::npos) << error_of(j);
  j = base;
  j["attention_hidden_size"] = 100;
  EXPECT_NE(error_of(j).find("attention_hidden_size = 100: must be 2 x hidden_size = 7424"), std::string::npos);
  j = base;
  j["num_hidden_layers"] = 2;
  EXPECT_NE(error_of(j).find("num_hidden_layers = 2: must be at least 3"), std::string::npos) << error_of(j);
  j = base;
  j["layers_block_type"] = {"mamba", "attention"};
  EXPECT_NE(error_of(j).find("entry 1: unknown layer type (use mamba or hybrid)"), std::string::npos) << error_of(j);
  j = base;
  j["mamba_dt_rank"] = "big";
  EXPECT_NE(error_of(j).find("mamba_dt_rank = \"big\": expected an integer or \"auto\""), std::string::npos);
  j = base;
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("num_key_value_heads = 3: must divide num_attention_heads"), std::string::npos);
}

TEST(Config, NemotronHPatternAndMoe) {
  const json base = {{"model_type", "nemotron_h"}, {"hidden_size", 64}, {"vocab_size", 100},
                     {"hybrid_override_pattern", "M*-E"}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                     {"head_dim", 16}, {"intermediate_size", 96}, {"mamba_num_heads", 8}, {"mamba_head_dim", 16},
                     {"ssm_state_size", 16}, {"n_groups", 2}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
                     {"moe_intermediate_size", 32}, {"moe_shared_expert_intermediate_size", 24}};
  HybridConfig c = parse_config(base, "config.json");
  EXPECT_EQ(c.layer_pattern(), "mamba2 x1, attention x1, mlp x1, moe x1");
  EXPECT_EQ(c.blocks[0].m2.d_inner, 128);
  EXPECT_EQ(c.blocks[0].m2.norm_grouping, NormGrouping::Grouped);
  EXPECT_FLOAT_EQ(c.blocks[0].m2.dt_min, 0.001f);
  EXPECT_EQ(c.blocks[1].attn.rope_dim, 0);
  EXPECT_EQ(c.blocks[2].ffn.mlp.act, Activation::Relu2);
  EXPECT_FALSE(c.blocks[2].ffn.mlp.gated);
  EXPECT_EQ(c.blocks[2].names.ffn_norm, "backbone.layers.2.norm.weight");
  EXPECT_EQ(c.blocks[3].ffn.routing, Routing::SigmoidGrouped);
  EXPECT_EQ(c.blocks[3].ffn.shared.d_ff, 24);
  EXPECT_EQ(c.blocks[3].ffn.shared_prefix, "backbone.layers.3.mixer.shared_experts.");
  json j = base;
  j["hybrid_override_pattern"] = "M*X";
  EXPECT_NE(error_of(j).find("character 2 is 'X': use M (mamba), * (attention), - (mlp) or E (moe)"),
            std::string::npos)
      << error_of(j);
  j = base;
  j["n_group"] = 3;
  EXPECT_NE(error_of(j).find("n_group = 3: must divide n_routed_experts"), std::string::npos) << error_of(j);
  j = base;
  j["moe_latent_size"] = 16;
  EXPECT_NE(error_of(j).find("moe_latent_size = 16: latent MoE projections are not supported"), std::string::npos);
}

TEST(Config, HybridlmBlockPattern) {
  const json base = {{"model_type", "hybridlm"},
                     {"hidden_size", 64},
                     {"vocab_size", 100},
                     {"block_pattern", {"m2", "t", "m", "m2"}},
                     {"ssm", {{"d_state", 8}, {"head_dim", 16}, {"n_groups", 2}}},
                     {"attention", {{"num_heads", 4}, {"num_kv_heads", 2}, {"partial_rotary_factor", 0.5}}},
                     {"mlp", {{"intermediate_size", 96}, {"activation", "gelu"}}}};
  const HybridConfig c = parse_config(base, "config.json");
  ASSERT_EQ(c.n_layers(), 4);
  EXPECT_EQ(c.layer_pattern(), "mamba2+mlp x1, attention+mlp x1, mamba1+mlp x1, mamba2+mlp x1");
  EXPECT_EQ(c.blocks[0].m2.n_heads, 8);  // expand 2 x 64 / head_dim 16
  EXPECT_EQ(c.blocks[0].m2.n_groups, 2);
  EXPECT_EQ(c.blocks[1].attn.head_dim, 16);
  EXPECT_EQ(c.blocks[1].attn.rope_dim, 8);
  EXPECT_FLOAT_EQ(c.blocks[1].attn.softmax_scale(), 0.25f);
  EXPECT_EQ(c.blocks[2].m1.dt_rank, 4);
  EXPECT_EQ(c.blocks[3].ffn.mlp.act, Activation::Gelu);
  EXPECT_EQ(c.blocks[1].names.mixer, "model.layers.1.mixer.");
  EXPECT_EQ(c.blocks[1].names.ffn_norm, "model.layers.1.ffn_norm.weight");

  json j = base;
  j["block_pattern"] = {"m2", "x", "t"};
  EXPECT_NE(error_of(j).find("block_pattern[1] = \"x\": unknown block kind (use m = Mamba-1, m2 = Mamba-2, "
                            "m2d = discrete Mamba-2, gdn = gated DeltaNet, t = attention)"),
            std::string::npos)
      << error_of(j);
  j = base;
  j["num_hidden_layers"] = 5;
  EXPECT_NE(error_of(j).find("num_hidden_layers = 5: block_pattern has 4 blocks"), std::string::npos) << error_of(j);
  j["num_hidden_layers"] = 3;
  EXPECT_NE(error_of(j).find("num_hidden_layers = 3: block_pattern has 4 blocks"), std::string::npos) << error_of(j);
  j = base;
  j["block_pattern"] = json::array();
  EXPECT_NE(error_of(j).find("block_pattern = an array of 0: expected a non-empty list"), std::string::npos) << error_of(j);
  j = base;
  j.erase("block_pattern");
  EXPECT_NE(error_of(j).find("missing required key 'block_pattern'"), std::string::npos) << error_of(j);
  j = base;
  j["attention"]["num_kv_heads"] = 3;
  EXPECT_NE(error_of(j).find("attention: num_kv_heads = 3: must divide num_heads = 4"), std::string::npos)
      << error_of(j);
  j = base;
  j["attention"]["partial_rotary_factor"] = 0.1875;
  EXPECT_NE(error_of(j).find("partial_rotary_factor = 0.1875: gives 3 rotary dims"), std::string::npos) << error_of(j);
  j["attention"]["partial_rotary_factor"] = 0.3;  // int(0.3 x 16) = 4, as transformers rounds
  EXPECT_EQ(parse_config(j, "config.json").blocks[1].attn.rope_dim, 4);
  j = base;
  j["ssm"]["head_dim"] = 24;
  EXPECT_NE(error_of(j).find("ssm: head_dim = 24: must divide expand x hidden_size = 128"), std::string::npos)
      << error_of(j);
  j = base;
  j["mlp"]["activation"] = "tanh";
  EXPECT_NE(error_of(j).find("mlp: activation = \"tanh\": unknown activation"), std::string::npos) << error_of(j);
}

TEST(Config, HybridlmDiscreteMamba2Blocks) {
  json j = {{"model_type", "hybridlm"}, {"hidden_size", 64}, {"vocab_size", 100}, {"block_pattern", {"m2d", "t"}},
            {"ssm", {{"d_state", 8}, {"head_dim", 16}, {"n_groups", 2}, {"chunk_size", 32}}}};
  const HybridConfig c = parse_config(j, "config.json");
  EXPECT_EQ(c.layer_pattern(), "mamba2_discrete x1, attention x1");
  const Mamba2DiscreteSpec& m = c.blocks[0].m2d;
  EXPECT_EQ(m.n_heads, 8);  // expand 2 x 64 / head_dim 16
  EXPECT_EQ(m.n_groups, 2);
  EXPECT_EQ(m.chunk_size, 32);
  EXPECT_FALSE(m.conv_silu);
  EXPECT_EQ(m.in_proj_dim(), 2 * 128 + 2 * 2 * 8 + 8);
  j["ssm"]["n_groups"] = 3;
  EXPECT_NE(error_of(j).find("ssm: n_groups = 3: must divide the discrete Mamba-2 head count 8"), std::string::npos)
      << error_of(j);
}

TEST(Config, HybridlmGatedDeltaNetBlocks) {
  json j = {{"model_type", "hybridlm"},
            {"hidden_size", 64},
            {"vocab_size", 100},
            {"block_pattern", {"gdn", "t"}},
            {"gdn", {{"num_key_heads", 2}, {"num_value_heads", 6}, {"key_head_dim", 16}, {"value_head_dim", 8}}}};
  const HybridConfig c = parse_config(j, "config.json");
  EXPECT_EQ(c.layer_pattern(), "gdn x1, attention x1");
  const GdnSpec& g = c.blocks[0].gdn;
  EXPECT_EQ(g.conv_dim(), 2 * 2 * 16 + 6 * 8);
  EXPECT_EQ(g.d_conv, 4);
  EXPECT_EQ(g.chunk_size, 64);
  j["gdn"]["num_value_heads"] = 5;
  EXPECT_NE(error_of(j).find("gdn: num_value_heads = 5: must be a multiple of num_key_heads = 2"), std::string::npos)
      << error_of(j);
}

// Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (research/hf-hybrid.md C.10).
json qwen3_next_80b() {
  return {{"architectures", {"Qwen3NextForCausalLM"}},
          {"model_type", "qwen3_next"},
          {"hidden_size", 2048},
          {"num_hidden_layers", 48},
          {"vocab_size", 151936},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 2},
          {"head_dim", 256},
          {"intermediate_size", 5120},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000000},
          {"partial_rotary_factor", 0.25},
          {"full_attention_interval", 4},
          {"linear_conv_kernel_dim", 4},
          {"linear_key_head_dim", 128},
          {"linear_value_head_dim", 128},
          {"linear_num_key_heads", 16},
          {"linear_num_value_heads", 32},
          {"decoder_sparse_step", 1},
          {"num_experts", 512},
          {"num_experts_per_tok", 10},
          {"moe_intermediate_size", 512},
          {"shared_expert_intermediate_size", 512},
          {"norm_topk_prob", true},
          {"mlp_only_layers", json::array()},
          {"tie_word_embeddings", false}};
}

TEST(Config, Qwen3NextPatternNamesAndQuirks) {
  const HybridConfig c = parse_config(qwen3_next_80b(), "config.json");
  EXPECT_EQ(c.family, "qwen3_next");
  EXPECT_EQ(c.layer_pattern(), "(gdn+moe, gdn+moe, gdn+moe, attention+moe) x12");
  EXPECT_FLOAT_EQ(c.norm_offset, 1.0f);
  const BlockSpec& lin = c.blocks[0];
  const BlockSpec& att = c.blocks[3];
  EXPECT_EQ(lin.mixer, MixerKind::GatedDeltaNet);
  EXPECT_EQ(att.mixer, MixerKind::Attention);
  EXPECT_EQ(lin.gdn.n_k_heads, 16);
  EXPECT_EQ(lin.gdn.n_v_heads, 32);
  EXPECT_EQ(lin.gdn.conv_dim(), 2 * 16 * 128 + 32 * 128);
  EXPECT_TRUE(att.attn.output_gate);
  EXPECT_TRUE(att.attn.qk_norm);
  EXPECT_FLOAT_EQ(att.attn.qk_norm_offset, 1.0f);
  EXPECT_EQ(att.attn.rope_dim, 64);  // 0.25 x 256
  EXPECT_FLOAT_EQ(att.attn.rope_theta, 1e7f);
  EXPECT_EQ(lin.ffn.kind, FfnKind::Moe);
  EXPECT_EQ(lin.ffn.n_experts, 512);
  EXPECT_EQ(lin.ffn.top_k, 10);
  EXPECT_TRUE(lin.ffn.renormalize);
  EXPECT_EQ(lin.ffn.router, "gate.weight");
  EXPECT_EQ(lin.ffn.shared_prefix, "model.layers.0.mlp.shared_expert.");
  EXPECT_EQ(lin.ffn.shared_gate, "model.layers.0.mlp.shared_expert_gate.weight");
  EXPECT_EQ(lin.names.mixer, "model.layers.0.linear_attn.");
  EXPECT_EQ(att.names.mixer, "model.layers.3.self_attn.");
  EXPECT_EQ(lin.names.ffn_norm, "model.layers.0.post_attention_layernorm.weight");

  json j = qwen3_next_80b();  // layer_types, mlp_only_layers, dense layers
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention"};
  j["mlp_only_layers"] = {1};
  j["decoder_sparse_step"] = 1;
  const HybridConfig d = parse_config(j, "config.json");
  EXPECT_EQ(d.blocks[0].mixer, MixerKind::Attention);
  EXPECT_EQ(d.blocks[1].ffn.kind, FfnKind::Mlp);
  EXPECT_EQ(d.blocks[1].ffn.mlp.d_ff, 5120);
  EXPECT_EQ(d.blocks[2].ffn.kind, FfnKind::Moe);
  j["num_experts"] = 0;
  EXPECT_EQ(parse_config(j, "config.json").blocks[2].ffn.kind, FfnKind::Mlp);

  j = qwen3_next_80b();
  j["linear_num_value_heads"] = 24;
  EXPECT_NE(error_of(j).find("linear_num_value_heads = 24: must be a multiple of linear_num_key_heads = 16"),
            std::string::npos)
      << error_of(j);
  j = qwen3_next_80b();
  j["mlp_only_layers"] = {48};
  EXPECT_NE(error_of(j).find("mlp_only_layers"), std::string::npos) << error_of(j);
  j = qwen3_next_80b();
  j["num_experts_per_tok"] = 600;
  EXPECT_NE(error_of(j).find("num_experts_per_tok"), std::string::npos) << error_of(j);
}

// The `plan` figure of Qwen3-Next-80B-A3B from its published config, by hand: 36 gated DeltaNet
// layers keep a conv state of 3 rows x (2 x 16 x 128 + 32 x 128) channels and a delta state of
// 32 x 128 x 128, in f32: 36 x (98,304 + 2,097,152) = 79,036,416 bytes (75.4 MiB) per sequence;
// 12 attention layers keep K and V of 2 heads x 256 per token: 12 x 2 x 512 x 2 bytes = 24 KiB
// per token at bf16.
TEST(Config, Qwen3NextPlanFigure) {
  const HybridConfig c = parse_config(qwen3_next_80b(), "config.json");
  const std::vector<LayerCacheSpec> specs = cache_specs(c);
  const CacheFootprint f32 = cache_footprint(specs, DType::F32, DType::BF16);
  EXPECT_EQ(f32.conv_per_sequence, 36u * 3 * 8192 * 4);
  EXPECT_EQ(f32.ssm_per_sequence, 36u * 32 * 128 * 128 * 4);
  EXPECT_EQ(f32.state_per_sequence(), 79036416u);
  EXPECT_EQ(f32.kv_per_token, 24576u);
}

// A Qwen3_5MoeForConditionalGeneration config as the multimodal checkpoints write it: the text
// model's keys in text_config (transformers' Qwen3_5MoeTextConfig defaults, its docstring's
// Qwen3.5-35B-A3B shape), tie_word_embeddings at the top.
json qwen3_5_moe_35b() {
  return {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"model_type", "qwen3_5_moe"},
          {"tie_word_embeddings", false},
          {"vision_config", {{"depth", 27}, {"hidden_size", 1152}}},
          {"text_config",
           {{"model_type", "qwen3_5_moe_text"},
            {"hidden_size", 2048},
            {"num_hidden_layers", 40},
            {"vocab_size", 248320},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 2},
            {"head_dim", 256},
            {"rms_norm_eps", 1e-6},
            {"full_attention_interval", 4},
            {"rope_parameters",
             {{"rope_type", "default"},
              {"rope_theta", 10000000},
              {"partial_rotary_factor", 0.25},
              {"mrope_section", {11, 11, 10}},
              {"mrope_interleaved", true}}},
            {"linear_conv_kernel_dim", 4},
            {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128},
            {"linear_num_key_heads", 16},
            {"linear_num_value_heads", 32},
            {"num_experts", 256},
            {"num_experts_per_tok", 8},
            {"moe_intermediate_size", 512},
            {"shared_expert_intermediate_size", 512},
            {"eos_token_id", 248044}}}};
}

TEST(Config, Qwen3_5MoeNestedKeysNamesAndQuirks) {
  const HybridConfig c = parse_config(qwen3_5_moe_35b(), "config.json");
  EXPECT_EQ(c.family, "qwen3_5_moe");
  EXPECT_EQ(c.layer_pattern(), "(gdn+moe, gdn+moe, gdn+moe, attention+moe) x10");
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_FLOAT_EQ(c.norm_offset, 1.0f);
  EXPECT_EQ(c.eos_token_id, 248044);
  EXPECT_FALSE(c.bos_token_id.has_value());  // transformers: None
  EXPECT_EQ(c.embedding_name, "model.language_model.embed_tokens.weight");
  EXPECT_EQ(c.final_norm_name, "model.language_model.norm.weight");
  const BlockSpec& lin = c.blocks[0];
  const BlockSpec& att = c.blocks[3];
  EXPECT_EQ(lin.mixer, MixerKind::GatedDeltaNet);
  EXPECT_FALSE(lin.gdn.interleaved);
  EXPECT_EQ(lin.names.mixer, "model.language_model.layers.0.linear_attn.");
  EXPECT_EQ(att.names.mixer, "model.language_model.layers.3.self_attn.");
  EXPECT_TRUE(att.attn.output_gate);
  EXPECT_EQ(att.attn.rope_dim, 64);  // 0.25 x 256 from rope_parameters
  EXPECT_FLOAT_EQ(att.attn.rope_theta, 1e7f);
  EXPECT_EQ(lin.ffn.kind, FfnKind::Moe);
  EXPECT_EQ(lin.ffn.n_experts, 256);
  EXPECT_EQ(lin.ffn.top_k, 8);
  EXPECT_TRUE(lin.ffn.renormalize);  // always: Qwen3.5-MoE has no norm_topk_prob
  EXPECT_TRUE(lin.ffn.stacked_experts);
  EXPECT_EQ(lin.ffn.mlp.up, "experts.gate_up_proj");
  EXPECT_EQ(lin.ffn.stacked_suffix, "");
  EXPECT_EQ(lin.ffn.shared_gate, "model.language_model.layers.0.mlp.shared_expert_gate.weight");

  json j = qwen3_5_moe_35b();  // the tie at the top wins; the text-only form reads flat keys
  j["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_config(j, "config.json").tie_embeddings);
  json flat = qwen3_5_moe_35b()["text_config"];
  flat["architectures"] = {"Qwen3_5MoeForCausalLM"};
  const HybridConfig t = parse_config(flat, "config.json");
  EXPECT_EQ(t.embedding_name, "model.embed_tokens.weight");
  EXPECT_EQ(t.blocks[0].names.mixer, "model.layers.0.linear_attn.");
  EXPECT_EQ(t.n_layers(), 40);

  j = qwen3_5_moe_35b();
  j["text_config"]["num_experts"] = 0;
  EXPECT_NE(error_of(j).find("text_config: num_experts = 0: must be in [1, 4096]"), std::string::npos) << error_of(j);
  j = qwen3_5_moe_35b();
  j["text_config"]["linear_num_value_heads"] = 24;
  EXPECT_NE(error_of(j).find("text_config: linear_num_value_heads = 24"), std::string::npos) << error_of(j);
  j = qwen3_5_moe_35b();
  j["text_config"] = 3;
  EXPECT_NE(error_of(j).find("text_config"), std::string::npos) << error_of(j);
}

// Dense Qwen3.5 (transformers' Qwen3_5TextConfig defaults: its docstring's Qwen3.5-9B shape),
// read from an otherwise empty text_config; and its plan figure by hand: 24 gated DeltaNet layers
// of conv 3 x (2 x 16 x 128 + 32 x 128) and delta state 32 x 128 x 128 in f32 = 24 x (98,304 +
// 2,097,152) = 52,690,944 bytes per sequence; 8 attention layers of K and V of 4 heads x 256 per
// token at bf16 = 8 x 2 x 1024 x 2 = 32 KiB per token.
TEST(Config, Qwen3_5DenseDefaultsAndPlanFigure) {
  const json j = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                  {"model_type", "qwen3_5"},
                  {"text_config", json::object()}};
  const HybridConfig c = parse_config(j, "config.json");
  EXPECT_EQ(c.family, "qwen3_5");
  EXPECT_EQ(c.layer_pattern(), "(gdn+mlp, gdn+mlp, gdn+mlp, attention+mlp) x8");
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.blocks[0].ffn.mlp.d_ff, 12288);
  EXPECT_EQ(c.blocks[3].attn.n_kv_heads, 4);
  EXPECT_EQ(c.blocks[3].attn.head_dim, 256);
  EXPECT_FALSE(c.tie_embeddings);
  const CacheFootprint f = cache_footprint(cache_specs(c), DType::F32, DType::BF16);
  EXPECT_EQ(f.state_per_sequence(), 52690944u);
  EXPECT_EQ(f.kv_per_token, 32768u);
}

// cartesia-ai/Llamba-3B's config.json (research/ssm-math-serving-training.md A.4).
TEST(Config, LlambaKeysWeightNamesAndErrors) {
  const json base = {{"model_type", "llamba"},
                     {"d_model", 3072},
                     {"n_layer", 28},
                     {"vocab_size", 128256},
                     {"tie_embeddings", true},
                     {"pad_vocab_size_multiple", 8},
                     {"lm_head_bias", false},
                     {"norm_epsilon", 1e-5},
                     {"mlp_cfg", {{"intermediate_size", 8192}, {"bias", false}, {"act_fn", "silu"}}},
                     {"ssm_cfg",
                      {{"d_state", 64}, {"n_v_heads", 32}, {"n_qk_heads", 32}, {"expand", 1}, {"chunk_size", 128},
                       {"activation", "identity"}, {"bias", false}}}};
  const HybridConfig c = parse_config(base, "config.json");
  EXPECT_EQ(c.family, "llamba");
  EXPECT_EQ(c.n_layers(), 28);
  EXPECT_EQ(c.layer_pattern(), "mamba2_discrete+mlp x28");
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.block_eps(), 1e-5f);
  const Mamba2DiscreteSpec& m = c.blocks[0].m2d;
  EXPECT_EQ(m.d_inner, 3072);
  EXPECT_EQ(m.head_dim, 96);
  EXPECT_EQ(m.n_heads, 32);
  EXPECT_EQ(m.n_groups, 32);
  EXPECT_EQ(m.d_conv, 4);
  EXPECT_TRUE(m.conv_bias);
  EXPECT_FALSE(m.proj_bias);
  EXPECT_EQ(c.blocks[0].ffn.mlp.d_ff, 8192);
  EXPECT_EQ(c.embedding_name, "backbone.embedding.weight");
  EXPECT_EQ(c.final_norm_name, "backbone.final_layernorm.weight");
  EXPECT_EQ(c.blocks[27].names.mixer_norm, "backbone.layers.27.input_layernorm.weight");
  EXPECT_EQ(c.blocks[27].names.ffn_norm, "backbone.layers.27.post_attention_layernorm.weight");
  EXPECT_EQ(c.blocks[27].names.ffn, "backbone.layers.27.mlp.");

  json j = base;
  j.erase("model_type");  // Fast-LLM's export names the architecture
  j["architectures"] = {"LlambaForCausalLM"};
  EXPECT_EQ(parse_config(j, "config.json").family, "llamba");
  j = base;
  j["vocab_size"] = 1001;  // padded up to a multiple of pad_vocab_size_multiple
  EXPECT_EQ(parse_config(j, "config.json").vocab_size, 1008);
  j = base;
  j["norm_epsilon"] = 1e-6;  // the final norm only: the blocks keep cartesia's fixed 1e-5
  EXPECT_FLOAT_EQ(parse_config(j, "config.json").norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(parse_config(j, "config.json").block_eps(), 1e-5f);
  j = base;
  j["ssm_cfg"]["n_v_heads"] = 40;
  EXPECT_NE(error_of(j).find("ssm_cfg: n_v_heads = 40: must divide expand x d_model = 3072"), std::string::npos)
      << error_of(j);
  j = base;
  j["ssm_cfg"]["n_qk_heads"] = 5;
  EXPECT_NE(error_of(j).find("ssm_cfg: n_qk_heads = 5: must divide n_v_heads = 32"), std::string::npos) << error_of(j);
  j = base;
  j["ssm_cfg"]["activation"] = "relu";
  EXPECT_NE(error_of(j).find("ssm_cfg: activation = \"relu\": use identity, silu or swish"), std::string::npos)
      << error_of(j);
  j = base;
  j["lm_head_bias"] = true;
  EXPECT_NE(error_of(j).find("lm_head_bias = true: an LM head with a bias is not supported"), std::string::npos)
      << error_of(j);
  j = base;
  j.erase("d_model");
  EXPECT_NE(error_of(j).find("missing required key 'd_model'"), std::string::npos) << error_of(j);
}

}  // namespace
}  // namespace hybridlm
