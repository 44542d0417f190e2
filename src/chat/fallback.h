// The prompt format of a model that has no chat template (docs/chat-templates.md, "Fallback").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace hybridlm::chat {

// One "Role: content" line per message, roles capitalised ("developer" reads as "System"),
// content parts joined with "\n" and trimmed of surrounding whitespace, null content empty; each
// tool call of an assistant message adds a line "Tool call: {"name": ..., "arguments": ...}".
// With add_generation_prompt the text ends with "Assistant:" (no space: the model's first token
// usually starts with one).
// Throws Error naming the message when messages is not a list of objects with a string role.
std::string render_fallback(const nlohmann::json& messages, bool add_generation_prompt = true);

}  // namespace hybridlm::chat
