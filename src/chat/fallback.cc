#include "chat/fallback.h"

#include "base/error.h"

namespace hybridlm::chat {

namespace {

std::string content_text(const nlohmann::json& msg, size_t i) {
  const auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  check(it->is_array(), "messages[", i, "].content must be a string, a list of parts or null");
  std::string out;
  for (const nlohmann::json& part : *it) {
    check(part.is_object(), "messages[", i, "].content parts must be objects");
    const auto text = part.find("text");
    if (text == part.end() || !text->is_string()) continue;  // non-text parts (images) carry no text
    if (!out.empty()) out += '\n';
    out += text->get<std::string>();
  }
  return out;
}

}  // namespace

std::string render_fallback(const nlohmann::json& messages, bool add_generation_prompt) {
  check(messages.is_array(), "messages must be a list");
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    check(m.is_object(), "messages[", i, "] must be an object");
    const auto role_it = m.find("role");
    check(role_it != m.end() && role_it->is_string(), "messages[", i, "].role must be a string");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (!role.empty() && role[0] >= 'a' && role[0] <= 'z') role[0] = static_cast<char>(role[0] - 'a' + 'A');
    // Trimmed: an answer generated after "Assistant:" starts with a space, and re-renders as the
    // tokens it was generated as (the next turn then extends the sequence that produced it).
    std::string text = content_text(m, i);
    const size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
    text = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
    out += role + ": " + text + "\n";
    const auto calls = m.find("tool_calls");
    if (calls != m.end() && calls->is_array()) {
      for (const nlohmann::json& c : *calls) {
        const nlohmann::json& fn = c.is_object() && c.contains("function") ? c["function"] : c;
        nlohmann::ordered_json call = nlohmann::ordered_json::object();
        if (fn.is_object()) {
          call["name"] = fn.value("name", nlohmann::json());
          call["arguments"] = fn.value("arguments", nlohmann::json());
        }
        out += "Tool call: " + call.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      }
    }
  }
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

}  // namespace hybridlm::chat
