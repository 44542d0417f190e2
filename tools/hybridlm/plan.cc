#include "tools/hybridlm/plan.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "models/config.h"
#include "models/plan.h"
#include "runtime/engine.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {

double parse_memory_size(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit = s.substr(pos);
  static const std::map<std::string, double> units = {
      {"", 1},          {"B", 1},         {"K", 1024.0},     {"KiB", 1024.0},  {"KB", 1e3},
      {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},     {"G", 1073741824.0}, {"GiB", 1073741824.0},
      {"GB", 1e9},      {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
  const auto it = units.find(unit);
  if (pos == 0 || it == units.end() || !(v > 0) || !std::isfinite(v))
    throw Error("--memory " + s + ": expected a size such as 16GiB, 512MiB or 24GB");
  return v * it->second;
}

int run_plan(const PlanOptions& o) {
  check(o.model_dir.empty() != o.config_file.empty(), "give exactly one of -m/--model or --config");
  check(o.context >= 0, "--context must be >= 0");
  if (!o.model_dir.empty()) check_model_path(o.model_dir);
  const DType sdtype = parse_cache_dtype("--state-dtype", o.state_dtype);
  const DType kvdtype = parse_cache_dtype("--kv-dtype", o.kv_dtype);
  const double memory = parse_memory_size(o.memory);
  HybridConfig c;
  if (!o.config_file.empty()) {
    std::ifstream in(o.config_file);
    check(static_cast<bool>(in), o.config_file, ": cannot open");
    std::stringstream text;
    text << in.rdbuf();
    c = parse_config_text(text.str(), o.config_file);
  } else {
    c = load_config(o.model_dir);
  }
  // --dtype as the loader resolves it: auto from the checkpoint's headers (-m) or torch_dtype.
  std::string dtype_source = "--dtype";
  const WeightDType wdtype = resolve_weight_dtype(o.dtype, [&] {
    StoredDType s = o.config_file.empty() ? stored_dtype(o.model_dir) : stored_dtype(c);
    dtype_source = s.source;
    return s;
  });
  const std::string dtype_label = std::string(weight_dtype_name(wdtype)) +
                                  (o.dtype == "auto" ? " (auto, from " + dtype_source + ")" : "");

  // Per-sequence state and KV per token, by layer kind (mixer name: mamba1, mamba2, attention).
  const std::vector<LayerCacheSpec> specs = cache_specs(c);
  struct Kind {
    int layers = 0;
    double conv = 0, ssm = 0, kv = 0;
  };
  std::map<std::string, Kind> by_kind;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == LayerCacheKind::None) continue;
    Kind& e = by_kind[std::string(c.blocks[i].shared_block >= 0 ? "shared_attention+" : "") +
                      mixer_kind_name(c.blocks[i].mixer)];
    const CacheFootprint f = cache_footprint(std::span(specs).subspan(i, 1), sdtype, kvdtype);
    e.layers += 1;
    e.conv += static_cast<double>(f.conv_per_sequence);
    e.ssm += static_cast<double>(f.ssm_per_sequence);
    e.kv += static_cast<double>(f.kv_per_token);
  }
  const CacheFootprint all = cache_footprint(specs, sdtype, kvdtype);
  const double conv = static_cast<double>(all.conv_per_sequence), ssm = static_cast<double>(all.ssm_per_sequence);
  const double params = static_cast<double>(param_count(c));
  const double weights = static_cast<double>(weight_bytes(c, wdtype));
  const double kv_per_token = static_cast<double>(all.kv_per_token);
  const double per_seq = conv + ssm + kv_per_token * static_cast<double>(o.context);
  const double left = memory - weights;
  const long long max_seqs = left <= 0 || per_seq <= 0 ? 0 : static_cast<long long>(std::floor(left / per_seq));

  if (o.json) {
    std::printf("{\"family\": \"%s\", \"layers\": %d, \"parameters\": %.0f, \"dtype\": \"%s\", "
                "\"dtype_source\": \"%s\", \"weight_bytes\": %.0f, \"state_dtype\": \"%s\", \"conv_state_bytes_per_sequence\": %.0f, "
                "\"ssm_state_bytes_per_sequence\": %.0f, \"kv_dtype\": \"%s\", \"kv_bytes_per_token\": %.0f, \"context\": %lld, "
                "\"bytes_per_sequence\": %.0f, \"memory_bytes\": %.0f, \"max_sequences\": %lld}\n",
                c.family.c_str(), c.n_layers(), params, weight_dtype_name(wdtype), dtype_source.c_str(), weights, o.state_dtype.c_str(), conv, ssm, o.kv_dtype.c_str(), kv_per_token,
                o.context, per_seq, memory, max_seqs);
    return 0;
  }
  std::printf("family:             %s, %d layers (%s)\n", c.family.c_str(), c.n_layers(), c.layer_pattern().c_str());
  std::printf("weights:            %.0f parameters, %.0f bytes (%s) at --dtype %s\n", params, weights,
              format_bytes(weights).c_str(), dtype_label.c_str());
  std::printf("state per sequence: %.0f bytes (%s) at --state-dtype %s\n", conv + ssm, format_bytes(conv + ssm).c_str(),
              o.state_dtype.c_str());
  for (const auto& [kind, e] : by_kind)
    if (e.conv + e.ssm > 0)
      std::printf("  %-9s x%-4d     ssm %.0f bytes (%s) + conv %.0f bytes (%s)\n", kind.c_str(), e.layers, e.ssm,
                  format_bytes(e.ssm).c_str(), e.conv, format_bytes(e.conv).c_str());
  std::printf("kv per token:       %.0f bytes (%s) at --kv-dtype %s%s\n", kv_per_token, format_bytes(kv_per_token).c_str(),
              o.kv_dtype.c_str(), kv_per_token == 0 ? " (no attention layers)" : "");
  for (const auto& [kind, e] : by_kind)
    if (e.kv > 0) std::printf("  %-9s x%-4d     kv %.0f bytes per token\n", kind.c_str(), e.layers, e.kv);
  std::printf("per sequence at context %lld: %.0f bytes (%s)\n", o.context, per_seq, format_bytes(per_seq).c_str());
  if (left <= 0)
    std::printf("memory %s: the weights alone (%s) do not fit: 0 sequences\n", format_bytes(memory).c_str(),
                format_bytes(weights).c_str());
  else
    std::printf("memory %s: %s left after the weights -> at most %lld concurrent sequences\n", format_bytes(memory).c_str(),
                format_bytes(left).c_str(), max_seqs);
  return 0;
}

}  // namespace hybridlm

namespace hybridlm {

Subcommand add_plan(CLI::App& parent) {
  auto popt = std::make_shared<PlanOptions>();
  // Plans default to what a run would use: the model-loading flags' defaults.
  const ModelFlags run;
  popt->dtype = run.dtype;
  popt->state_dtype = run.state_dtype;
  popt->kv_dtype = run.kv_dtype;
  popt->context = run.ctx_size;
  CLI::App* plan =
      parent.add_subcommand("plan", "memory plan from a config: weights, state per sequence, KV per token, max sequences");
  CLI::Option_group* source = plan->add_option_group("model", "what to plan for: one of");
  source->add_option("-m,--model", popt->model_dir,
                     "model directory, or a file in it (reads config.json, and for --dtype auto the safetensors headers)")
      ->transform(model_dir_of, "", "");
  source->add_option("--config", popt->config_file, "a config.json file (--dtype auto reads its torch_dtype)");
  source->require_option(1);
  plan->add_option("--dtype", popt->dtype,
                   "weights in memory: auto (the checkpoint's: bf16 and f16 as bf16, f32 as f32), f32, bf16, q8_0, "
                   "q4_0")
      ->capture_default_str();
  plan->add_option("--state-dtype", popt->state_dtype, "recurrent state: f32, bf16, f16")->capture_default_str();
  plan->add_option("--kv-dtype", popt->kv_dtype, "attention KV cache: f32, bf16, f16")->capture_default_str();
  plan->add_option("--memory", popt->memory, "memory to plan for, e.g. 16GiB, 24GB")->capture_default_str();
  plan->add_option("-c,--ctx-size,--context", popt->context, "tokens per sequence (KV grows with it; SSM state does not)")
      ->capture_default_str();
  plan->add_flag("--json", popt->json, "print one JSON object");
  return {plan, [popt] { return run_plan(*popt); }};
}

}  // namespace hybridlm
