#include "server/chat_format.h"

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "chat/fallback.h"
#include "chat/jinja.h"

namespace hybridlm {

using json = nlohmann::ordered_json;

struct ChatFormat::Impl {
  chat::Template tmpl;
  std::string source;  // the file it came from
  json bos = nullptr, eos = nullptr;
};

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  check(static_cast<bool>(in), p.string(), ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// bos_token / eos_token as tokenizer_config.json writes them: a string or {"content": ...}.
json special_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return nullptr;
  if (it->is_string()) return *it;
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  return nullptr;
}

}  // namespace

ChatFormat::ChatFormat() = default;
ChatFormat::ChatFormat(ChatFormat&&) noexcept = default;
ChatFormat::~ChatFormat() = default;

ChatFormat ChatFormat::load(const std::filesystem::path& dir) {
  ChatFormat f;
  const std::filesystem::path jinja_file = dir / "chat_template.jinja", config_file = dir / "tokenizer_config.json";
  json cfg = json::object();
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_file, ec)) {
    try {
      cfg = json::parse(read_file(config_file));
    } catch (const json::exception& e) {
      throw_error(config_file.string(), ": not valid JSON: ", e.what());
    }
    check(cfg.is_object(), config_file.string(), ": not a JSON object");
  }
  std::string source, where;
  if (std::filesystem::is_regular_file(jinja_file, ec)) {  // newer transformers save it apart
    source = read_file(jinja_file);
    where = jinja_file.string();
  } else if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    where = config_file.string() + ": chat_template";
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {  // named templates: [{"name": "default", "template": ...}, ...]
      for (const json& t : *it)
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
          source = t["template"].get<std::string>();
      check(!source.empty(), where, ": a list of named templates without a \"default\" one");
    } else {
      throw_error(where, ": must be a string or a list of named templates");
    }
  }
  if (source.empty()) return f;
  try {
    f.template_ = std::make_unique<Impl>(
        Impl{chat::Template::parse(source), where, special_token(cfg, "bos_token"), special_token(cfg, "eos_token")});
  } catch (const Error& e) {
    throw_error(where, ": ", e.what());
  }
  return f;
}

namespace {

// What templates expect of OpenAI's messages (as vLLM passes them): content parts joined into one
// string, and a tool call's arguments, a JSON string on the wire, as the object it encodes.
json normalize(const json& messages) {
  json out = messages;
  for (json& m : out) {
    if (auto c = m.find("content"); c != m.end() && c->is_array()) {
      std::string text;
      for (const json& part : *c)
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          if (!text.empty()) text += '\n';
          text += part["text"].get<std::string>();
        }
      *c = text;
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array())
      for (json& call : *calls) {
        json* fn =
            call.is_object() && call.contains("function") && call["function"].is_object() ? &call["function"] : nullptr;
        if (!fn || !fn->contains("arguments") || !(*fn)["arguments"].is_string()) continue;
        json args = json::parse((*fn)["arguments"].get<std::string>(), nullptr, false);
        if (args.is_object()) (*fn)["arguments"] = std::move(args);
      }
  }
  return out;
}

}  // namespace

std::string ChatFormat::render(const json& messages, const json& tools) const {
  if (!template_) return chat::render_fallback(nlohmann::json(messages));
  json ctx = {{"messages", normalize(messages)},
              {"add_generation_prompt", true},
              {"bos_token", template_->bos},
              {"eos_token", template_->eos}};
  if (!tools.is_null()) ctx["tools"] = tools;
  return template_->tmpl.render(ctx);
}

std::string ChatFormat::description() const {
  return template_ ? "the model's chat template (" + template_->source + ")"
                   : "no chat template: the plain fallback (docs/chat-templates.md)";
}

}  // namespace hybridlm
