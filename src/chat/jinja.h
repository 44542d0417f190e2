// A Jinja template engine for Hugging Face chat templates (tokenizer_config.json's
// `chat_template`). It implements the subset of Jinja that real chat templates use
// (docs/chat-templates.md lists it), with the semantics transformers renders them with:
// Jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols),
// `tojson` as json.dumps(ensure_ascii=False), and the globals raise_exception and strftime_now.
//
// Templates arrive with downloaded models, so they are untrusted: parsing and rendering are
// bounded (Limits), there is no file, environment or network access (`include`, `import` and
// `extends` are refused), and every problem is a hybridlm::Error with a one-line message
// "chat template line N: ...".
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hybridlm::chat {

struct Limits {
  // Template source size. Real chat templates are 0.3 to 20 KB.
  size_t max_template_bytes = 1 << 20;
  // Nesting of blocks and expressions when parsing (each `(`, `[`, `{`, unary operator and
  // block statement is one level). Real templates nest less than 15 deep.
  int max_parse_depth = 100;
  // Nesting when rendering: expressions, statements and macro calls together.
  int max_render_depth = 500;
  // Iterations of all `for` loops of one render, plus the items range() makes, together.
  int64_t max_loop_iterations = 1'000'000;
  // Size of the rendered text, and of any one string or list built while rendering.
  size_t max_output_bytes = 16 << 20;
};

struct RenderOptions {
  // The time strftime_now() formats (local time); unset: the current time.
  std::optional<std::time_t> now;
};

struct Program;  // the parsed template (jinja_ast.h)

class Template {
 public:
  // Parses `source`; throws Error("chat template line N: ...") on a syntax error, an unknown
  // filter, test or tag, or a limit exceeded.
  static Template parse(std::string_view source, const Limits& limits = {});

  // Renders with the variables of `context` (a JSON object: messages, tools,
  // add_generation_prompt, bos_token, eos_token, enable_thinking, ...). JSON null is Python's
  // None; a key that is absent is undefined. Throws Error("chat template line N: ...") on a
  // render error, including raise_exception("msg") (the message is msg).
  // Dicts keep the key order of the context, as transformers does (tool schemas print with
  // tojson): parse requests into an ordered_json. A plain nlohmann::json has its keys sorted.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;
  std::string render(const nlohmann::json& context, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace hybridlm::chat
