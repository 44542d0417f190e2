// `hybridlm inspect`: family, layer pattern, sizes and per-sequence state of a model.
#include <cstdio>
#include <memory>

#include "base/error.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

int cmd_inspect(const ModelFlags& mf) {
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
  std::printf("model:          %s\n", mf.dir.c_str());
  std::printf("family:         %s (%s)\n", c.family.c_str(), c.architecture.empty() ? "-" : c.architecture.c_str());
  std::printf("layers:         %d\n", c.n_layers());
  std::printf("layer pattern:  %s\n", c.layer_pattern().c_str());
  std::printf("hidden size:    %d\n", c.d_model);
  std::printf("vocab size:     %d\n", c.vocab_size);
  std::printf("tied embedding: %s\n", c.tie_embeddings ? "yes" : "no");
  std::printf("parameters:     %zu (%.1f M)\n", m.param_count(), m.param_count() / 1e6);
  std::printf("weight bytes:   %zu (%s, %s in memory; %s used in place from the mapped files)\n", m.weight_bytes(),
              format_bytes(m.weight_bytes()).c_str(), mf.dtype.c_str(), format_bytes(m.mapped_bytes()).c_str());
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
  auto f = std::make_shared<ModelFlags>();
  CLI::App* insp = parent.add_subcommand("inspect", "print family, layer pattern, sizes and per-sequence state");
  f->add(insp, false);
  return {insp, [f] { return cmd_inspect(*f); }};
}

}  // namespace hybridlm
