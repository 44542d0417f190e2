// Chat messages to prompt text: the model's own chat template (chat_template.jinja, or
// tokenizer_config.json's chat_template, rendered by src/chat's Jinja engine) or, for a model
// without one, the plain fallback format (docs/chat-templates.md).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/tokenizer.h"

namespace hybridlm {

class ChatFormat {
 public:
  // Reads DIR/chat_template.jinja or DIR/tokenizer_config.json when there is one; an Error names
  // the file and line of a template that does not parse.
  static ChatFormat load(const std::filesystem::path& dir);
  // The prompt for `messages` (checked by parse_request; keys in request order), ending where the
  // assistant's answer begins. tools: null when the request has none. Throws Error for what the
  // template refuses (its raise_exception message, or a render error).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools) const;
  // The rendered text carries the special tokens itself (a template): encode it without adding BOS.
  bool adds_bos() const { return template_ != nullptr; }
  // "the model's chat template (FILE)" or the fallback's name.
  std::string description() const;

  ChatFormat(ChatFormat&&) noexcept;
  ~ChatFormat();

 private:
  ChatFormat();
  struct Impl;
  std::unique_ptr<Impl> template_;  // null: the fallback
};

}  // namespace hybridlm
