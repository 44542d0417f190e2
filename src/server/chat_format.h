// Chat messages to prompt text: the model's own chat template (tokenizer_config.json's
// chat_template, rendered by src/chat's Jinja engine) or, for a model without one, a documented
// plain format (docs/serving.md).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "io/tokenizer.h"

namespace hybridlm {

class ChatFormat {
 public:
  // Reads DIR/tokenizer_config.json when there is one; an Error names a template that does not parse.
  static ChatFormat load(const std::filesystem::path& dir, const Tokenizer& tok);
  // The prompt for `messages` (checked by parse_request) ending where the assistant's answer begins.
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools) const;
  // The rendered text carries the special tokens itself (a template): encode it without adding BOS.
  bool adds_bos() const { return has_template_; }
  // "the model's chat template" or "no chat template: the plain fallback".
  std::string description() const;

  ChatFormat(ChatFormat&&) noexcept;
  ~ChatFormat();

 private:
  ChatFormat();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool has_template_ = false;
};

// The plain format of a model without a template: "System: ...\n", "User: ...\n", "Assistant: ...\n"
// one message a line (content parts joined with "\n", surrounding whitespace trimmed), then
// "Assistant:".
std::string render_plain_chat(const nlohmann::json& messages);

}  // namespace hybridlm
