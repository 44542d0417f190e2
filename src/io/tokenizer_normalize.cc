// Normalizers: NFC, Prepend, Replace, Sequence. Component reference:
// https://huggingface.co/docs/tokenizers/components#normalizers
//
// SentencePiece vocabularies converted to tokenizer.json (Llama-2, Mistral) spell a space as "▁"
// and mark the start of every word with it; their normalizer is Sequence[Prepend "▁",
// Replace " " -> "▁"], so "Hello world" becomes "▁Hello▁world" before the BPE model sees it.
#include "base/error.h"
#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {

using nlohmann::json;

struct Normalizer::Step {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string text;              // kPrepend: what is prepended; kReplace: the replacement
  std::string literal;           // kReplace with a String pattern
  std::optional<Regex> pattern;  // kReplace with a Regex pattern
};

Normalizer::Normalizer() = default;
Normalizer::Normalizer(Normalizer&&) noexcept = default;
Normalizer& Normalizer::operator=(Normalizer&&) noexcept = default;
Normalizer::~Normalizer() = default;

Normalizer::Normalizer(const json& config, const std::string& where) {
  std::vector<const json*> stack = {&config};
  while (!stack.empty()) {  // flatten nested Sequences, keeping order
    const json* n = stack.back();
    stack.pop_back();
    if (n->is_null()) continue;
    const std::string type = n->is_object() ? n->value("type", "") : "";
    const std::string what = where + ": " + type + " normalizer";
    if (type == "Sequence") {
      if (!n->contains("normalizers") || !(*n)["normalizers"].is_array())
        throw Error(what + ": \"normalizers\" must be an array");
      const json& list = (*n)["normalizers"];  // a reference: the stack keeps pointers into it
      for (auto it = list.rbegin(); it != list.rend(); ++it) stack.push_back(&*it);
    } else if (type == "NFC") {
      steps_.push_back({Step::kNfc, "", "", std::nullopt});
    } else if (type == "Prepend") {
      if (!n->contains("prepend") || !(*n)["prepend"].is_string()) throw Error(what + " needs a \"prepend\" string");
      steps_.push_back({Step::kPrepend, (*n)["prepend"].get<std::string>(), "", std::nullopt});
    } else if (type == "Replace") {
      if (!n->contains("content") || !(*n)["content"].is_string()) throw Error(what + " needs a \"content\" string");
      const std::string content = (*n)["content"].get<std::string>();
      // The reference runs String.replaceAll, which would read "$&", "$1", ... in the content as
      // references to the match; the Rust crate inserts the content literally. No real file has
      // a '$' there, so rather than pick one we refuse it.
      if (content.find('$') != std::string::npos) throw Error(what + ": a '$' in \"content\" is not supported");
      Step step{Step::kReplace, content, "", std::nullopt};
      const json& pat = n->value("pattern", json());
      if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
        step.literal = pat["String"].get<std::string>();
        if (step.literal.empty()) throw Error(what + ": empty \"String\" pattern");
      } else if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
        step.pattern.emplace(oniguruma_to_pcre2(pat["Regex"].get<std::string>(), what), what);
      } else {
        throw Error(what + ": \"pattern\" must hold a \"String\" or \"Regex\" string");
      }
      steps_.push_back(std::move(step));
    } else {
      throw Error(where + ": unsupported normalizer type \"" + type +
                  "\" (supported: NFC, Prepend, Replace, Sequence)");
    }
  }
}

bool Normalizer::active() const { return !steps_.empty(); }

std::string Normalizer::apply(const std::string& text) const {
  // A chain of Replace steps from an untrusted file could double the text at every step; real
  // normalizers grow it a few times at most (" " -> "\u2581" is 1 byte -> 3).
  const size_t limit = 16 * text.size() + 4096;
  std::string s = text;
  for (const Step& step : steps_) {
    check(s.size() <= limit, "tokenizer normalizer: the text grows from ", text.size(), " to over ", limit,
          " bytes (a chain of Replace steps that expands without bound?)");
    switch (step.kind) {
      case Step::kNfc:
        s = nfc(s);
        break;
      case Step::kPrepend:
        // The reference prepends to every text it normalizes; it never normalizes an empty one.
        s = step.text + s;
        break;
      case Step::kReplace: {
        std::string out;
        size_t prev = 0;
        if (step.pattern) {
          for (const auto& [b, e] : step.pattern->find_all(s)) {
            out.append(s, prev, b - prev);
            out += step.text;
            prev = e;
          }
        } else {
          for (size_t at = s.find(step.literal); at != std::string::npos; at = s.find(step.literal, prev)) {
            out.append(s, prev, at - prev);
            out += step.text;
            prev = at + step.literal.size();
          }
        }
        out.append(s, prev, std::string::npos);
        s = std::move(out);
        break;
      }
    }
  }
  check(s.size() <= limit, "tokenizer normalizer: the text grows from ", text.size(), " to over ", limit,
        " bytes (a chain of Replace steps that expands without bound?)");
  return s;
}

}  // namespace hybridlm::tokenizer_detail
