#include "server/chat_format.h"

#include <cctype>

#include "base/error.h"

namespace hybridlm {

using nlohmann::json;

namespace {

// A message's content as text: a string, or its text parts joined by newlines (null: empty).
std::string content_text(const json& msg) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  std::string out;
  for (const json& part : *it) {
    if (!out.empty()) out += '\n';
    out += part.value("text", "");
  }
  return out;
}

}  // namespace

std::string render_plain_chat(const json& messages) {
  std::string out;
  for (const json& m : messages) {
    std::string role = m.value("role", "user");
    if (role == "developer") role = "system";
    if (!role.empty()) role[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(role[0])));
    std::string text = content_text(m);
    const size_t b = text.find_first_not_of(" \t\n\r"), e = text.find_last_not_of(" \t\n\r");
    text = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
    out += role + ": " + text + "\n";
  }
  return out + "Assistant:";
}

struct ChatFormat::Impl {
  std::string template_source;
};

ChatFormat::ChatFormat() : impl_(std::make_unique<Impl>()) {}
ChatFormat::ChatFormat(ChatFormat&&) noexcept = default;
ChatFormat::~ChatFormat() = default;

ChatFormat ChatFormat::load(const std::filesystem::path&, const Tokenizer&) {
  ChatFormat f;
  return f;
}

std::string ChatFormat::render(const json& messages, const json&) const { return render_plain_chat(messages); }

std::string ChatFormat::description() const {
  return has_template_ ? "the model's chat template" : "no chat template: the plain fallback (docs/serving.md)";
}

}  // namespace hybridlm
