#include "train/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "models/config.h"
#include "train/token_data.h"

namespace hybridlm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMaxYamlBytes = 1u << 20;  // a run's settings; a model's config.json is a few KiB
// Aliases (*x) share one node; converting to JSON copies it at every use, so a few lines of nested
// aliases could expand to billions of values. A real train.yaml has under a hundred.
constexpr size_t kMaxNodes = 100000;

// "optimizer" + "lr" -> "optimizer.lr"; the top level has an empty path.
std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

// "<source>: <path>: <why>" on one line: a quoted key or value may hold "\n", and a key may be long.
[[noreturn]] void fail_at(std::string_view source, const std::string& path, const std::string& why) {
  std::string p = path.size() > 120 ? path.substr(0, 120) + "..." : path;
  std::string msg = std::string(source) + (p.empty() ? "" : ": " + p) + ": " + why;
  for (char& c : msg)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  throw Error(msg);
}

// ---- YAML to JSON -------------------------------------------------------------------------------
// yaml-cpp keeps every scalar as text with its tag: "?" for a plain scalar, "!" for a quoted or
// block one, the full tag for an explicit one (!!str). Plain scalars are typed as the YAML 1.2
// core schema types them (https://yaml.org/spec/1.2.2/#1032-tag-resolution).

bool all_of_chars(std::string_view s, const char* set) {
  return !s.empty() && s.find_first_not_of(set) == std::string_view::npos;
}

// [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+. Sets *out, or *overflow for a valid form out of int64.
bool yaml_int(std::string_view s, int64_t* out, bool* overflow) {
  int base = 10;
  bool neg = false;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
    base = s[1] == 'o' ? 8 : 16;
    s.remove_prefix(2);
    if (!all_of_chars(s, base == 8 ? "01234567" : "0123456789abcdefABCDEF")) return false;
  } else {
    if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
      neg = s[0] == '-';
      s.remove_prefix(1);
    }
    if (!all_of_chars(s, "0123456789")) return false;
  }
  uint64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v, base);
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + (neg ? 1 : 0);
  if (r.ec != std::errc() || v > limit) {
    *overflow = true;
    return true;
  }
  *out = neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

// [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )? | [-+]? .inf | .nan
bool yaml_float(std::string_view s, double* out) {
  std::string_view body = s;
  double sign = 1;
  if (!body.empty() && (body[0] == '-' || body[0] == '+')) {
    sign = body[0] == '-' ? -1 : 1;
    body.remove_prefix(1);
  }
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    *out = sign * std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  size_t i = 0, digits = 0;
  while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '-' || body[i] == '+')) ++i;
    const size_t exp_start = i;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i;
    if (i == exp_start) return false;
  }
  if (i != body.size()) return false;
  // from_chars reads the C locale's format whatever the process locale; "5." and ".5" included.
  double v = 0;
  const auto r = std::from_chars(body.data(), body.data() + body.size(), v);
  if (r.ec == std::errc::result_out_of_range) v = std::numeric_limits<double>::infinity();
  else if (r.ec != std::errc() || r.ptr != body.data() + body.size()) return false;
  *out = sign * v;
  return true;
}

class YamlToJson {
 public:
  explicit YamlToJson(std::string_view source) : source_(source) {}

  json convert(const YAML::Node& n, const std::string& path, int depth) {
    if (++nodes_ > kMaxNodes) fail(path, "more than " + std::to_string(kMaxNodes) + " values (aliases expanded)");
    if (depth > kMaxJsonDepth) fail(path, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    switch (n.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        return nullptr;
      case YAML::NodeType::Scalar:
        return scalar(n, path);
      case YAML::NodeType::Sequence: {
        json a = json::array();
        for (size_t i = 0; i < n.size(); ++i)
          a.push_back(convert(n[i], path + "[" + std::to_string(i) + "]", depth + 1));
        return a;
      }
      case YAML::NodeType::Map: {
        json o = json::object();
        for (auto it = n.begin(); it != n.end(); ++it) {
          if (!it->first.IsScalar()) fail(path, "a key that is not a plain name" + line_of(it->first));
          const std::string key = it->first.Scalar();
          const std::string at = join(path, key);
          check_utf8(key, path);
          if (o.contains(key)) fail(at, "duplicate key" + line_of(it->first));
          o[key] = convert(it->second, at, depth + 1);
        }
        return o;
      }
    }
    return nullptr;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& why) const { fail_at(source_, path, why); }
  static std::string line_of(const YAML::Node& n) {
    return n.Mark().is_null() ? "" : " (line " + std::to_string(n.Mark().line + 1) + ")";
  }
  // nlohmann refuses to write invalid UTF-8, and a config.json must be UTF-8.
  void check_utf8(const std::string& s, const std::string& path) const {
    try {
      (void)json(s).dump();
    } catch (const json::exception&) {
      fail(path, "invalid UTF-8");
    }
  }

  json scalar(const YAML::Node& n, const std::string& path) const {
    const std::string& s = n.Scalar();
    check_utf8(s, path);
    const std::string& tag = n.Tag();
    const std::string core = "tag:yaml.org,2002:";
    if (tag == "!" || tag == core + "str") return s;
    int64_t i = 0;
    double d = 0;
    bool overflow = false;
    const bool is_int = yaml_int(s, &i, &overflow);
    if (is_int && overflow) fail(path, "integer " + s.substr(0, 40) + " out of range");
    const bool is_bool = s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE";
    const bool is_null = s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
    if (tag == "?") {
      if (is_null) return nullptr;
      if (is_bool) return s[0] == 't' || s[0] == 'T';
      if (is_int) return i;
      if (yaml_float(s, &d)) return d;
      return s;
    }
    if (tag == core + "int" && is_int) return i;
    if (tag == core + "float" && (is_int || yaml_float(s, &d))) return is_int ? static_cast<double>(i) : d;
    if (tag == core + "bool" && is_bool) return s[0] == 't' || s[0] == 'T';
    if (tag == core + "null" && is_null) return nullptr;
    fail(path, "tag " + tag.substr(0, 60) + " does not apply to \"" + s.substr(0, 40) + "\"");
  }

  std::string_view source_;
  size_t nodes_ = 0;
};

// ---- keys ---------------------------------------------------------------------------------------

// Every section's keys, for the unknown-key check and its suggestions.
struct Section {
  const char* path;
  std::vector<const char*> keys;
};
const std::vector<Section>& sections() {
  static const std::vector<Section> s = {
      {"", {"model", "tokenizer", "data", "optimizer", "schedule", "batch", "steps", "eval_interval", "eval_batches",
            "checkpoint_interval", "keep_checkpoints", "log_interval", "seed", "threads", "out"}},
      {"data", {"train", "validation"}},
      {"optimizer", {"lr", "betas", "eps", "weight_decay", "grad_clip"}},
      {"schedule", {"kind", "warmup_steps", "min_lr", "decay_fraction"}},
      {"batch", {"sequences", "seq_len", "accumulation"}},
      {"model", {"init", "model_type", "architectures", "block_pattern", "num_hidden_layers", "hidden_size",
                 "vocab_size", "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                 "ssm", "attention", "mlp"}},
      {"model.ssm", {"d_state", "d_conv", "expand", "dt_rank", "head_dim", "n_groups", "chunk_size", "conv_bias",
                     "proj_bias"}},
      {"model.attention", {"num_heads", "num_kv_heads", "head_dim", "rope_theta", "partial_rotary_factor", "qk_norm",
                           "bias"}},
      {"model.mlp", {"intermediate_size", "activation", "gated"}},
  };
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'lr'?)" for a key of `section` within edit distance 2 of `key`, or one that
// `key` begins (warmup -> warmup_steps); " (did you mean optimizer.lr?)" for a key of another
// section; else "".
std::string suggestion(const std::string& key, const std::string& section) {
  std::string best;
  size_t best_d = 3;
  int prefixed = 0;
  std::string prefix_of;
  for (const Section& s : sections()) {
    if (s.path != section) continue;
    for (const char* k : s.keys) {
      const size_t d = edit_distance(key, k);
      if (d < best_d) best_d = d, best = k;
      if (std::string_view(k).starts_with(key)) ++prefixed, prefix_of = k;
    }
  }
  if (best.empty() && prefixed == 1 && key.size() >= 3) best = prefix_of;
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  for (const Section& s : sections())
    for (const char* k : s.keys)
      if (s.path != section && key == k) return " (did you mean " + join(s.path, k) + "?)";
  return "";
}

// The settings reader: typed getters on one mapping (`obj` at `path`), each naming the key path
// in its error.
class Reader {
 public:
  Reader(std::string_view source, fs::path base) : source_(source), base_(std::move(base)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& why) const { fail_at(source_, path, why); }

  // Throws for the first key of obj not in the section's list.
  void check_keys(const json& obj, const std::string& path) const {
    for (const Section& s : sections()) {
      if (s.path != path) continue;
      for (const auto& [key, value] : obj.items())
        if (std::find(s.keys.begin(), s.keys.end(), key) == s.keys.end())
          fail(join(path, key), "unknown key" + suggestion(key, path));
    }
  }

  // The mapping at obj[key] (an empty one when absent), its keys checked.
  const json& section(const json& obj, const std::string& path, const char* key) const {
    static const json empty = json::object();
    if (!obj.contains(key)) return empty;
    const json& v = obj[key];
    if (!v.is_object()) fail(join(path, key), "expected a mapping, got " + json_brief(v));
    check_keys(v, join(path, key));
    return v;
  }

  const json* find(const json& obj, const char* key) const { return obj.contains(key) ? &obj[key] : nullptr; }

  double number(const json& obj, const std::string& path, const char* key, double def) const {
    const json* v = find(obj, key);
    if (!v) return def;
    if (!v->is_number()) fail(join(path, key), "expected a number, got " + json_brief(*v));
    return v->get<double>();
  }

  // An integer in [lo, hi]; an integral float (1e5) counts.
  int64_t integer(const json& obj, const std::string& path, const char* key, std::optional<int64_t> def, int64_t lo,
                  int64_t hi, const char* what) const {
    const json* v = find(obj, key);
    if (!v) {
      if (!def) fail(join(path, key), std::string("missing (") + what + ")");
      return *def;
    }
    int64_t i = 0;
    const double d = v->is_number_float() ? v->get<double>() : 0.5;  // 0.5: no integer
    if (v->is_number_integer()) i = v->get<int64_t>();
    else if (std::trunc(d) == d && std::abs(d) < 0x1p53) i = static_cast<int64_t>(d);
    else fail(join(path, key), "expected an integer, got " + json_brief(*v));
    if (i < lo || i > hi) {
      const std::string range = hi == std::numeric_limits<int64_t>::max()
                                    ? ">= " + std::to_string(lo)
                                    : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
      fail(join(path, key), "must be " + range + " (" + what + "), got " + std::to_string(i));
    }
    return i;
  }

  std::string string(const json& obj, const std::string& path, const char* key, const std::string& def) const {
    const json* v = find(obj, key);
    if (!v) return def;
    if (!v->is_string()) fail(join(path, key), "expected a string, got " + json_brief(*v));
    return v->get<std::string>();
  }

  // A path, relative to the YAML file's folder unless absolute; empty when absent.
  fs::path path(const json& obj, const std::string& at, const char* key) const {
    const json* v = find(obj, key);
    if (!v) return {};
    if (!v->is_string() || v->get<std::string>().empty())
      fail(join(at, key), "expected a path, got " + json_brief(*v));
    const fs::path p(v->get<std::string>());
    return (p.is_absolute() || base_.empty() ? p : base_ / p).lexically_normal();
  }

  std::string_view source() const { return source_; }

 private:
  std::string_view source_;
  fs::path base_;
};

// ---- model ----------------------------------------------------------------------------------------

enum class Kind { Int, Number, Bool, String, Strings, IntOrAuto, TokenId, Mapping };
struct ModelKey {
  const char* name;
  Kind kind;
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "an integer";
    case Kind::Number: return "a number";
    case Kind::Bool: return "true or false";
    case Kind::String: return "a string";
    case Kind::Strings: return "a list of strings";
    case Kind::IntOrAuto: return "an integer or \"auto\"";
    case Kind::TokenId: return "a token id or null";
    case Kind::Mapping: return "a mapping";
  }
  return "";
}

bool has_kind(const json& v, Kind k) {
  switch (k) {
    case Kind::Int: return v.is_number_integer();
    case Kind::Number: return v.is_number();
    case Kind::Bool: return v.is_boolean();
    case Kind::String: return v.is_string();
    case Kind::Strings:
      return v.is_array() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); });
    case Kind::IntOrAuto: return v.is_number_integer() || v == "auto";
    case Kind::TokenId: return v.is_number_integer() || v.is_null();
    case Kind::Mapping: return v.is_object();
  }
  return false;
}

// The JSON types of config.json's keys (docs/model-format.md); the model's own parser
// (parse_config) checks their values and how they fit together.
void check_model_types(const Reader& r, const json& obj, const std::string& path) {
  static const std::vector<std::pair<std::string, std::vector<ModelKey>>> kinds = {
      {"model",
       {{"model_type", Kind::String}, {"architectures", Kind::Strings}, {"block_pattern", Kind::Strings},
        {"num_hidden_layers", Kind::Int}, {"hidden_size", Kind::Int}, {"vocab_size", Kind::Int},
        {"rms_norm_eps", Kind::Number}, {"tie_word_embeddings", Kind::Bool}, {"bos_token_id", Kind::TokenId},
        {"eos_token_id", Kind::TokenId}, {"pad_token_id", Kind::TokenId}, {"ssm", Kind::Mapping},
        {"attention", Kind::Mapping}, {"mlp", Kind::Mapping}}},
      {"model.ssm",
       {{"d_state", Kind::Int}, {"d_conv", Kind::Int}, {"expand", Kind::Int}, {"dt_rank", Kind::IntOrAuto},
        {"head_dim", Kind::Int}, {"n_groups", Kind::Int}, {"chunk_size", Kind::Int}, {"conv_bias", Kind::Bool},
        {"proj_bias", Kind::Bool}}},
      {"model.attention",
       {{"num_heads", Kind::Int}, {"num_kv_heads", Kind::Int}, {"head_dim", Kind::Int}, {"rope_theta", Kind::Number},
        {"partial_rotary_factor", Kind::Number}, {"qk_norm", Kind::Bool}, {"bias", Kind::Bool}}},
      {"model.mlp", {{"intermediate_size", Kind::Int}, {"activation", Kind::String}, {"gated", Kind::Bool}}},
  };
  r.check_keys(obj, path);
  for (const auto& [section, keys] : kinds) {
    if (section != path) continue;
    for (const ModelKey& k : keys) {
      if (!obj.contains(k.name)) continue;
      const json& v = obj[k.name];
      if (!has_kind(v, k.kind))
        r.fail(join(path, k.name), std::string("expected ") + kind_name(k.kind) + ", got " + json_brief(v));
      if (k.kind == Kind::Mapping) check_model_types(r, v, join(path, k.name));
    }
  }
}

void read_model(const Reader& r, const json& top, TrainConfig& c) {
  if (!top.contains("model"))
    r.fail("model", "missing (init: a checkpoint directory, or the model's config.json keys: block_pattern, ...)");
  const json& m = top["model"];
  if (!m.is_object()) r.fail("model", "expected a mapping, got " + json_brief(m));
  r.check_keys(m, "model");
  if (m.contains("init")) {
    c.init = r.path(m, "model", "init");
    for (const auto& [key, value] : m.items())
      if (key != "init")
        r.fail("model." + key, "not allowed with model.init (the checkpoint's config.json is the model)");
    return;
  }
  check_model_types(r, m, "model");
  if (!m.contains("block_pattern"))
    r.fail("model.block_pattern",
           "missing (one entry per layer: m = Mamba-1, m2 = Mamba-2, m2d = discrete Mamba-2, t = attention)");
  const json& pattern = m["block_pattern"];
  if (pattern.empty()) r.fail("model.block_pattern", "empty (one entry per layer: m, m2, m2d or t)");
  for (size_t i = 0; i < pattern.size(); ++i)
    if (pattern[i] != "m" && pattern[i] != "m2" && pattern[i] != "m2d" && pattern[i] != "t")
      r.fail("model.block_pattern[" + std::to_string(i) + "]",
             json_brief(pattern[i]) +
                 ": unknown block kind (use m = Mamba-1, m2 = Mamba-2, m2d = discrete Mamba-2, t = attention)");
  if (m.contains("model_type") && m["model_type"] != "hybridlm")
    r.fail("model.model_type", json_brief(m["model_type"]) + ": the trainer writes hybridlm models only");
  if (m.contains("architectures") && m["architectures"] != json::array({"HybridLMForCausalLM"}))
    r.fail("model.architectures", json_brief(m["architectures"]) + ": expected [HybridLMForCausalLM]");
  if (m.contains("mlp") && m["mlp"].contains("activation")) {
    const json& a = m["mlp"]["activation"];
    if (a != "silu" && a != "swish" && a != "gelu" && a != "relu2")
      r.fail("model.mlp.activation", json_brief(a) + ": unknown activation (use silu, gelu or relu2)");
  }
  c.model = m;
  c.model["model_type"] = "hybridlm";
  c.model["architectures"] = json::array({"HybridLMForCausalLM"});
  if (!c.model.contains("num_hidden_layers")) c.model["num_hidden_layers"] = pattern.size();
  // Everything else (sizes, divisibility, ...) exactly as a saved config.json will be checked.
  (void)parse_config(c.model, std::string(r.source()) + ": model");
}

// ---- the rest -------------------------------------------------------------------------------------

// 6 significant digits: 0.001, not the float's 0.0010000000474974513.
std::string short_number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

float positive_float(const Reader& r, const json& obj, const std::string& path, const char* key, double def,
                     bool zero_ok, const char* what) {
  const double v = r.number(obj, path, key, def);
  const float f = static_cast<float>(v);
  if (!std::isfinite(f) || f < 0 || (!zero_ok && f == 0))
    r.fail(join(path, key), std::string("must be a finite number ") + (zero_ok ? ">= 0" : "> 0") + " (" + what +
                                "), got " + json_brief(obj[key]));  // defaults are valid: the key is there
  return f;
}

void read_optimizer(const Reader& r, const json& top, TrainConfig& c) {
  const json& o = r.section(top, "", "optimizer");
  c.schedule.lr = positive_float(r, o, "optimizer", "lr", 3e-4, false, "the peak learning rate");
  if (const json* b = r.find(o, "betas")) {
    if (!b->is_array() || b->size() != 2) r.fail("optimizer.betas", "expected [beta1, beta2], got " + json_brief(*b));
    float beta[2];
    for (size_t i = 0; i < 2; ++i) {
      const std::string at = "optimizer.betas[" + std::to_string(i) + "]";
      if (!(*b)[i].is_number()) r.fail(at, "expected a number, got " + json_brief((*b)[i]));
      beta[i] = static_cast<float>((*b)[i].get<double>());
      if (!(beta[i] >= 0 && beta[i] < 1)) r.fail(at, "must be in [0, 1), got " + json_brief((*b)[i]));
    }
    c.adamw.beta1 = beta[0];
    c.adamw.beta2 = beta[1];
  }
  c.adamw.eps = positive_float(r, o, "optimizer", "eps", 1e-8, false, "AdamW's denominator epsilon");
  c.adamw.weight_decay = positive_float(r, o, "optimizer", "weight_decay", 0.1, true, "decoupled, per step x lr");
  c.grad_clip = positive_float(r, o, "optimizer", "grad_clip", 1.0, true, "max global gradient norm, 0 = off");
}

void read_schedule(const Reader& r, const json& top, TrainConfig& c) {
  const json& s = r.section(top, "", "schedule");
  Schedule& sc = c.schedule;
  sc.kind = r.string(s, "schedule", "kind", "cosine");
  if (sc.kind != "cosine" && sc.kind != "wsd")
    r.fail("schedule.kind", json_brief(json(sc.kind)) + ": unknown schedule (use cosine or wsd)");
  sc.total = c.steps;
  sc.warmup = r.integer(s, "schedule", "warmup_steps", std::min<int64_t>(100, c.steps / 10), 0, c.steps,
                        "linear warmup, at most steps");
  sc.min_lr = positive_float(r, s, "schedule", "min_lr", sc.lr / 10, true, "the final learning rate");
  if (sc.min_lr > sc.lr)
    r.fail("schedule.min_lr", "must be at most optimizer.lr = " + short_number(sc.lr) + ", got " +
                                  json_brief(s["min_lr"]));
  if (s.contains("decay_fraction") && sc.kind != "wsd") r.fail("schedule.decay_fraction", "only for kind: wsd");
  const double df = r.number(s, "schedule", "decay_fraction", 0.2);
  if (!(df >= 0 && df <= 1)) r.fail("schedule.decay_fraction", "must be in [0, 1], got " + json_brief(json(df)));
  sc.decay_fraction = static_cast<float>(df);
  try {
    validate(sc);  // the optimizer's own rules, should they ever be stricter than the ones above
  } catch (const Error& e) {
    r.fail("schedule", e.what());
  }
}

}  // namespace

TrainConfig parse_train_config(const std::string& yaml_text, const fs::path& base_dir, std::string_view source) {
  const std::string src(source);
  check(yaml_text.size() <= kMaxYamlBytes, src, ": ", yaml_text.size(), " bytes, over the 1 MiB limit for a config");
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    std::string msg = e.msg;
    for (char& ch : msg)
      if (ch == '\n' || ch == '\r') ch = ' ';
    if (e.mark.is_null()) throw_error(src, ": invalid YAML: ", msg);
    throw_error(src, ": line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": invalid YAML: ", msg);
  }
  check(docs.size() <= 1, src, ": ", docs.size(), " YAML documents (---); expected one");
  const Reader r(src, base_dir);
  const json top = docs.empty() ? json(nullptr) : YamlToJson(src).convert(docs[0], "", 0);
  if (top.is_null()) r.fail("", "empty (expected a mapping with model, data, steps, out, ...)");
  if (!top.is_object()) r.fail("", "expected a mapping of settings at the top, got " + json_brief(top));
  r.check_keys(top, "");

  TrainConfig c;
  c.source = src;
  read_model(r, top, c);
  c.tokenizer = r.path(top, "", "tokenizer");

  if (!top.contains("data")) r.fail("data", "missing (train: a token file of hybridlm prepare-data)");
  const json& data = r.section(top, "", "data");
  c.data.train = r.path(data, "data", "train");
  if (c.data.train.empty()) r.fail("data.train", "missing (a token file of hybridlm prepare-data: train.bin)");
  if (data.contains("validation") && data["validation"].is_null()) {
    c.data.validation.clear();  // validation: null -> no evaluation
  } else if (data.contains("validation")) {
    c.data.validation = r.path(data, "data", "validation");
  } else {
    c.data.validation = c.data.train.parent_path() / "val.bin";
    c.data.validation_default = true;
  }

  const int64_t kMaxSteps = int64_t{1} << 40;
  c.steps = r.integer(top, "", "steps", std::nullopt, 1, kMaxSteps, "the number of optimizer steps");
  read_optimizer(r, top, c);
  read_schedule(r, top, c);

  const json& b = r.section(top, "", "batch");
  c.batch.sequences = static_cast<int>(r.integer(b, "batch", "sequences", 8, 1, 1 << 16, "sequences per micro-batch"));
  c.batch.seq_len = static_cast<int>(r.integer(b, "batch", "seq_len", 256, 2, 1 << 20, "tokens per sequence"));
  c.batch.accumulation =
      static_cast<int>(r.integer(b, "batch", "accumulation", 1, 1, 1 << 16, "micro-batches per optimizer step"));

  const int64_t kMax = std::numeric_limits<int64_t>::max();
  c.eval_interval = r.integer(top, "", "eval_interval", 100, 0, kMax, "steps between evaluations, 0 = none");
  c.eval_batches = r.integer(top, "", "eval_batches", 20, 0, kMax, "micro-batches per evaluation, 0 = all");
  c.checkpoint_interval =
      r.integer(top, "", "checkpoint_interval", 1000, 0, kMax, "steps between checkpoints, 0 = only at the end");
  c.keep_checkpoints = r.integer(top, "", "keep_checkpoints", 0, 0, kMax,
                                 "step checkpoints kept, the newest; 0 = all");
  c.log_interval = r.integer(top, "", "log_interval", 10, 1, kMax, "steps between metrics lines");
  c.seed = static_cast<uint64_t>(r.integer(top, "", "seed", 1, 0, kMax, "data sampling and initialisation"));
  c.threads = static_cast<int>(r.integer(top, "", "threads", 0, 0, 4096, "0 = every hardware thread"));
  c.out = r.path(top, "", "out");
  if (c.out.empty()) r.fail("out", "missing (the run directory: checkpoints, metrics.jsonl, loss.svg)");
  return c;
}

TrainConfig load_train_config(const fs::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  check(fs::is_regular_file(path, ec), name, ": no such file");
  const uint64_t size = fs::file_size(path, ec);
  check(!ec && size <= kMaxYamlBytes, name, ": ", size, " bytes, over the 1 MiB limit for a config");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  check(static_cast<bool>(in), name, ": cannot read");
  return parse_train_config(text.str(), path.parent_path(), name);
}

fs::path tokenizer_file(const TrainConfig& c) {
  std::error_code ec;
  if (!c.tokenizer.empty()) {
    const fs::path f = fs::is_directory(c.tokenizer, ec) ? c.tokenizer / "tokenizer.json" : c.tokenizer;
    check(fs::is_regular_file(f, ec), c.source, ": tokenizer: no tokenizer.json at ", c.tokenizer.string());
    return f;
  }
  if (!c.init.empty()) {
    const fs::path f = c.init / "tokenizer.json";
    check(fs::is_regular_file(f, ec), c.source, ": tokenizer: not given, and model.init ", c.init.string(),
          " has no tokenizer.json");
    return f;
  }
  const TokenIndex ix = read_token_index(c.data.train.parent_path());
  check(!ix.tokenizer.empty() && fs::is_regular_file(ix.tokenizer, ec), c.source,
        ": tokenizer: not given, and the data's index.json names none that exists (",
        ix.tokenizer.empty() ? std::string("none") : ix.tokenizer.string(), ")");
  return ix.tokenizer;
}

std::optional<fs::path> validation_file(const TrainConfig& c) {
  if (c.data.validation.empty()) return std::nullopt;
  if (!c.data.validation_default) return c.data.validation;
  std::error_code ec;
  if (!fs::is_regular_file(c.data.validation, ec) || fs::file_size(c.data.validation, ec) == 0) return std::nullopt;
  return c.data.validation;
}

void fill_vocab_size(TrainConfig& c, int tokenizer_vocab) {
  if (!c.init.empty()) return;
  if (!c.model.contains("vocab_size")) {
    c.model["vocab_size"] = tokenizer_vocab;
    return;
  }
  const int64_t v = c.model["vocab_size"].get<int64_t>();
  check(v >= tokenizer_vocab, c.source, ": model.vocab_size: ", v, " is smaller than the tokenizer's vocabulary of ",
        tokenizer_vocab);
}

}  // namespace hybridlm
