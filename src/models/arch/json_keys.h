// Typed reads of config.json keys with Hugging Face defaults; every error names the file and key.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace hybridlm {

class JsonKeys {
 public:
  JsonKeys(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool is_null(const char* key) const { return j_.contains(key) && j_[key].is_null(); }  // present as null
  int64_t integer(const char* key) const;  // required
  int64_t integer(const char* key, int64_t def) const;
  double number(const char* key, double def) const;
  bool boolean(const char* key, bool def) const;
  std::string string(const char* key, const std::string& def) const;
  const nlohmann::json& raw(const char* key) const { return j_[key]; }
  // Throws "<where>: <key> = <value>: <why>".
  [[noreturn]] void fail(const char* key, const std::string& why) const;
  // Positive integer in [1, max] (required or defaulted). The caps keep every derived size
  // (products of dims) far from integer overflow; real models are orders of magnitude below.
  int positive(const char* key, int64_t def, int64_t max = kMaxDim) const;
  static constexpr int64_t kMaxDim = 1 << 22;
  // A token id: null or absent -> nullopt (transformers: no such token); else in [0, 2^31).
  std::optional<int32_t> token_id(const char* key, std::optional<int32_t> def) const;
  // A finite number > 0 (epsilons).
  float positive_number(const char* key, double def) const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

}  // namespace hybridlm
