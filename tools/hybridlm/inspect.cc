// `hybridlm inspect`: family, layer pattern, sizes and per-sequence state of a model, as text or
// one JSON object (--json).
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

int cmd_inspect(const ModelFlags& mf, bool json) {
  EngineOptions o = mf.options();
  o.threads = 1;
  Engine engine(mf.dir, o);
  report_mlock(engine);
  const Model& m = engine.model();
  const HybridConfig& c = m.config();
  // At the dtypes the cache holds.
  const HybridCache& cache = engine.cache();
  const CacheFootprint fp = cache_footprint(cache.layers(), cache.state_dtype(), cache.kv_dtype());
  const size_t kv = fp.kv_per_token;
  const std::string stored = lower_dtype(m.stored_dtype());
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = mf.dir;
    j["family"] = c.family;
    j["architecture"] = c.architecture;
    j["layers"] = c.n_layers();
    j["layer_pattern"] = c.layer_pattern();
    nlohmann::ordered_json kinds = nlohmann::ordered_json::array();
    for (const BlockSpec& b : c.blocks) kinds.push_back(block_label(b));
    j["layer_kinds"] = kinds;
    j["hidden_size"] = c.d_model;
    j["vocab_size"] = c.vocab_size;
    j["tied_embedding"] = c.tie_embeddings;
    j["parameters"] = m.param_count();
    j["dtype"] = weight_dtype_name(m.weight_dtype());
    j["checkpoint_dtype"] = stored;
    j["weight_bytes"] = m.weight_bytes();
    j["mapped_bytes"] = m.mapped_bytes();
    j["state_dtype"] = cache_dtype_name(cache.state_dtype());
    j["conv_state_bytes_per_sequence"] = fp.conv_per_sequence;
    j["ssm_state_bytes_per_sequence"] = fp.ssm_per_sequence;
    j["state_bytes_per_sequence"] = fp.state_per_sequence();
    j["kv_dtype"] = cache_dtype_name(cache.kv_dtype());
    j["kv_bytes_per_token"] = kv;
    j["kernels"] = engine.kernels().name;
    j["cpu_path"] = cpu::active_path();
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("model:          %s\n", mf.dir.c_str());
  std::printf("family:         %s (%s)\n", c.family.c_str(), c.architecture.empty() ? "-" : c.architecture.c_str());
  std::printf("layers:         %d\n", c.n_layers());
  std::printf("layer pattern:  %s\n", c.layer_pattern().c_str());
  std::printf("hidden size:    %d\n", c.d_model);
  std::printf("vocab size:     %d\n", c.vocab_size);
  std::printf("tied embedding: %s\n", c.tie_embeddings ? "yes" : "no");
  std::printf("parameters:     %zu (%.1f M)\n", m.param_count(), m.param_count() / 1e6);
  std::printf("weight bytes:   %zu (%s, %s in memory, checkpoint %s; %s used in place from the mapped files)\n",
              m.weight_bytes(), format_bytes(m.weight_bytes()).c_str(), weight_dtype_name(m.weight_dtype()),
              stored.c_str(), format_bytes(m.mapped_bytes()).c_str());
  std::printf("state / seq:    %zu bytes (%s): conv %s + ssm %s, %s (--state-dtype)\n", fp.state_per_sequence(),
              format_bytes(static_cast<double>(fp.state_per_sequence())).c_str(),
              format_bytes(static_cast<double>(fp.conv_per_sequence)).c_str(),
              format_bytes(static_cast<double>(fp.ssm_per_sequence)).c_str(), cache_dtype_name(cache.state_dtype()));
  if (kv > 0)
    std::printf("kv / token:     %zu bytes (%s), %s (--kv-dtype)\n", kv, format_bytes(static_cast<double>(kv)).c_str(),
                cache_dtype_name(cache.kv_dtype()));
  else
    std::printf("kv / token:     0 bytes (no attention layers)\n");
  std::printf("kernels:        %s (cpu path %s)\n", engine.kernels().name, cpu::active_path());
  return 0;
}

}  // namespace

Subcommand add_inspect(CLI::App& parent) {
  struct Flags {
    ModelFlags model;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* insp = parent.add_subcommand("inspect", "print family, layer pattern, sizes and per-sequence state");
  f->model.add(insp, false);
  insp->add_flag("--json", f->json, "print one JSON object");
  return {insp, [f] { return cmd_inspect(f->model, f->json); }};
}

}  // namespace hybridlm
