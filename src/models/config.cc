#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "models/arch/families.h"
#include "models/arch/json_keys.h"

namespace hybridlm {

const char* mixer_kind_name(MixerKind k) {
  switch (k) {
    case MixerKind::None: return "none";
    case MixerKind::Mamba1: return "mamba1";
    case MixerKind::Mamba2: return "mamba2";
    case MixerKind::Attention: return "attention";
    case MixerKind::ShortConv: return "short_conv";
    case MixerKind::Mamba2Attention: return "mamba2||attention";
    case MixerKind::Mamba2Discrete: return "mamba2_discrete";
    case MixerKind::GatedDeltaNet: return "gdn";
  }
  return "?";
}

float AttentionSpec::softmax_scale() const {
  return scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::string block_label(const BlockSpec& b) {
  // Zamba2 hybrid layers run their shared transformer block before the mixer.
  std::string s = b.shared_block >= 0 ? "shared_attention" : "";
  if (b.mixer != MixerKind::None) s += std::string(s.empty() ? "" : "+") + mixer_kind_name(b.mixer);
  if (b.ffn.kind != FfnKind::None) s += std::string(s.empty() ? "" : "+") + (b.ffn.kind == FfnKind::Moe ? "moe" : "mlp");
  return s;
}

std::string HybridConfig::layer_pattern() const {
  std::vector<std::string> labels;
  for (const BlockSpec& b : blocks) labels.push_back(block_label(b));
  const size_t n = labels.size();
  // Run-length form: "mamba2 x24", or "mamba1 x2, attention+mlp x1".
  auto runs = [&](size_t end) {
    std::ostringstream os;
    for (size_t i = 0; i < end;) {
      size_t j = i;
      while (j < end && labels[j] == labels[i]) ++j;
      if (i) os << ", ";
      os << labels[i] << " x" << (j - i);
      i = j;
    }
    return os.str();
  };
  // A repeating unit of several blocks (Jamba, Zamba2): "(mamba1+mlp, ..., attention+mlp) x4".
  if (std::all_of(labels.begin(), labels.end(), [&](const std::string& l) { return l == labels[0]; })) return runs(n);
  for (size_t p = 2; p <= n / 2; ++p) {
    if (n % p != 0) continue;
    bool periodic = true;
    for (size_t i = p; i < n && periodic; ++i) periodic = labels[i] == labels[i - p];
    if (!periodic) continue;
    std::string unit;
    for (size_t i = 0; i < p; ++i) unit += (i ? ", " : "") + labels[i];
    return "(" + unit + ") x" + std::to_string(n / p);
  }
  return runs(n);
}

// ---- JsonKeys -----------------------------------------------------------------------------------
void JsonKeys::fail(const char* key, const std::string& why) const {
  std::string v = j_.contains(key) ? json_brief(j_[key]) : "(missing)";
  throw Error(where_ + ": " + key + " = " + v + ": " + why);
}

int64_t JsonKeys::integer(const char* key) const {
  if (!has(key)) throw Error(where_ + ": missing required key '" + key + "'");
  return integer(key, 0);
}

int64_t JsonKeys::integer(const char* key, int64_t def) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {  // 64.0 is accepted as 64; the range check comes before the cast
    const double d = v.get<double>();
    if (d >= -9.0e15 && d <= 9.0e15 && d == std::floor(d)) return static_cast<int64_t>(d);
  }
  fail(key, "expected an integer");
}

double JsonKeys::number(const char* key, double def) const {
  if (!has(key)) return def;
  if (!j_[key].is_number()) fail(key, "expected a number");
  return j_[key].get<double>();
}

bool JsonKeys::boolean(const char* key, bool def) const {
  if (!has(key)) return def;
  if (!j_[key].is_boolean()) fail(key, "expected true or false");
  return j_[key].get<bool>();
}

std::optional<int32_t> JsonKeys::token_id(const char* key, std::optional<int32_t> def) const {
  if (!j_.contains(key)) return def;
  if (j_[key].is_null()) return std::nullopt;
  const int64_t v = integer(key, 0);
  if (v < 0 || v > INT32_MAX) fail(key, "not a valid token id");
  return static_cast<int32_t>(v);
}

float JsonKeys::positive_number(const char* key, double def) const {
  const double v = number(key, def);
  if (!(v > 0 && v < 1e30)) fail(key, "must be a finite number > 0");
  return static_cast<float>(v);
}

std::string JsonKeys::string(const char* key, const std::string& def) const {
  if (!has(key)) return def;
  if (!j_[key].is_string()) fail(key, "expected a string");
  return j_[key].get<std::string>();
}

int JsonKeys::positive(const char* key, int64_t def, int64_t max) const {
  int64_t v = integer(key, def);
  if (v <= 0) fail(key, "must be a positive integer");
  if (v > max) fail(key, "must be at most " + std::to_string(max));
  return static_cast<int>(v);
}

// ---- dispatch -----------------------------------------------------------------------------------
HybridConfig parse_config(const nlohmann::json& j, const std::string& where, NormGrouping mamba2_norm) {
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  JsonKeys keys(j, where);
  std::string arch;
  if (keys.has("architectures")) {
    const auto& a = keys.raw("architectures");
    if (!a.is_array() || (!a.empty() && !a[0].is_string())) keys.fail("architectures", "expected a list of strings");
    if (!a.empty()) arch = a[0].get<std::string>();
  }
  const std::string model_type = keys.string("model_type", "");
  for (const Family& f : families()) {
    bool match = !model_type.empty() ? model_type == f.model_type : false;
    for (const char* a : f.architectures) match = match || arch == a;
    if (match) {
      HybridConfig c = f.parse(keys, mamba2_norm);
      c.family = f.model_type;
      c.architecture = arch;
      // The dtype transformers saved the weights in: `dtype` (transformers >= 4.56) or
      // `torch_dtype`; only `plan --config` reads it (a checkpoint's own headers say more).
      for (const char* key : {"dtype", "torch_dtype"})
        if (keys.has(key) && keys.raw(key).is_string()) {
          c.torch_dtype = keys.raw(key).get<std::string>();
          break;
        }
      return c;
    }
  }
  std::string known;
  for (const Family& f : families()) known += std::string(known.empty() ? "" : ", ") + f.model_type;
  throw Error(where + ": unsupported model (model_type '" + model_type + "', architectures '" + arch +
              "'); supported: " + known);
}

constexpr size_t kMaxConfigBytes = 16u << 20;

// Python's json module writes float('inf') as a bare Infinity (e.g. Mamba2's time_step_limit),
// which strict JSON parsers reject. Turn bare Infinity / -Infinity / NaN outside strings into strings
// that the adapters understand.
static std::string quote_nonfinite(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) out += text[++i];
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const size_t n = std::char_traits<char>::length(word);
      if (text.compare(i, n, word) == 0) {
        out += std::string("\"") + word + "\"";
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += ch;
  }
  return out;
}

HybridConfig parse_config_text(const std::string& text, const std::string& where, NormGrouping mamba2_norm) {
  check(text.size() <= kMaxConfigBytes, where, ": ", text.size(), " bytes, over the 16 MiB limit for a config.json");
  return parse_config(parse_json(quote_nonfinite(text), where), where, mamba2_norm);
}

HybridConfig load_config(const std::filesystem::path& dir, NormGrouping mamba2_norm) {
  const auto path = dir / "config.json";
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open (is " + dir.string() + " a model directory?)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config_text(text.str(), path.string(), mamba2_norm);
}

}  // namespace hybridlm
