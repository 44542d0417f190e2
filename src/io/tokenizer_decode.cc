// Decoders of SentencePiece-style tokenizer.json files: Replace, ByteFallback, Fuse, Strip,
// Metaspace, Sequence. Component reference:
// https://huggingface.co/docs/tokenizers/components#decoders
//
// Llama-2's chain is Sequence[Replace "▁" -> " ", ByteFallback, Fuse, Strip " " (start 1)]:
// "▁Hello" "▁world" "<0x21>" -> " Hello" " world" "!" -> " Hello world!" -> "Hello world!".
//
// Where the reference (@huggingface/tokenizers 0.2.0, which tests/tokenizer/compare.mjs checks
// us against) and the Rust crate differ, we follow the reference and say so at the spot.
#include "base/error.h"
#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {

using nlohmann::json;

struct DecoderChain::Step {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string from, to;  // kReplace: literal pattern and its replacement; kMetaspace: from = "▁"
  char32_t strip = 0;    // kStrip: the character taken off
  int64_t start = 0, stop = 0;  // kStrip: at most this many from the start / the end
};

std::optional<uint8_t> byte_token_value(std::string_view token) {
  // The Rust crate's rule (exactly two hex digits); the reference's parseInt would also take
  // "<0x1G>" as byte 1, which no real vocabulary spells.
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

namespace {

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t prev = 0;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, prev)) {
    out.append(s, prev, at - prev);
    out += to;
    prev = at + from.size();
  }
  out.append(s, prev, std::string::npos);
  return out;
}

}  // namespace

DecoderChain::DecoderChain() = default;
DecoderChain::DecoderChain(DecoderChain&&) noexcept = default;
DecoderChain& DecoderChain::operator=(DecoderChain&&) noexcept = default;
DecoderChain::~DecoderChain() = default;

DecoderChain::DecoderChain(const json& config, const std::string& where) {
  std::vector<const json*> stack = {&config};
  while (!stack.empty()) {  // flatten nested Sequences, keeping order
    const json* d = stack.back();
    stack.pop_back();
    const std::string type =
        d->is_object() && d->contains("type") && (*d)["type"].is_string() ? (*d)["type"].get<std::string>() : "";
    const std::string what = where + ": " + type + " decoder";
    if (type == "Sequence") {
      if (!d->contains("decoders") || !(*d)["decoders"].is_array())
        throw Error(what + ": \"decoders\" must be an array");
      const json& list = (*d)["decoders"];  // a reference: the stack keeps pointers into it
      for (auto it = list.rbegin(); it != list.rend(); ++it) stack.push_back(&*it);
    } else if (type == "Replace") {
      const json& pat = d->value("pattern", json());
      if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string() ||
          pat["String"].get<std::string>().empty()) {
        throw Error(what + ": only a non-empty \"String\" pattern is supported");
      }
      if (!d->contains("content") || !(*d)["content"].is_string()) throw Error(what + " needs a \"content\" string");
      const std::string content = (*d)["content"].get<std::string>();
      // See the Replace normalizer (tokenizer_normalize.cc): '$' means different things in the
      // reference and the Rust crate.
      if (content.find('$') != std::string::npos) throw Error(what + ": a '$' in \"content\" is not supported");
      steps_.push_back({Step::kReplace, pat["String"].get<std::string>(), content});
    } else if (type == "ByteFallback") {
      steps_.push_back({Step::kByteFallback, "", ""});
      byte_fallback_ = true;
    } else if (type == "Fuse") {
      steps_.push_back({Step::kFuse, "", ""});
    } else if (type == "Strip") {
      Step step{Step::kStrip, "", ""};
      const std::string content = d->value("content", json(" ")).is_string() ? d->value("content", " ") : "";
      const std::u32string cps = utf8_to_u32(utf8_sanitize(content));
      if (cps.size() != 1) throw Error(what + ": \"content\" must be one character");
      step.strip = cps[0];
      for (auto [key, count] : {std::pair{"start", &step.start}, std::pair{"stop", &step.stop}}) {
        const json& v = d->value(key, json(0));
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1'000'000)
          throw Error(what + ": \"" + key + "\" must be an integer in [0, 1000000]");
        *count = v.get<int64_t>();
      }
      steps_.push_back(step);
    } else if (type == "Metaspace") {
      Step step{Step::kMetaspace, "\xE2\x96\x81", " "};
      if (d->contains("replacement") && !(*d)["replacement"].is_null()) {
        const json& r = (*d)["replacement"];
        if (!r.is_string() || utf8_to_u32(r.get<std::string>()).size() != 1)
          throw Error(what + ": \"replacement\" must be one character");
        step.from = r.get<std::string>();
      }
      steps_.push_back(step);
    } else {
      throw Error(where + ": unsupported decoder type \"" + type +
                  "\" (supported: ByteLevel alone, or Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
    }
  }
}

std::vector<std::string> DecoderChain::run(std::vector<std::string> tokens, bool whole_text) const {
  bool fused = false;
  // As the normalizer's: a chain of Replace steps from an untrusted file must not grow the text
  // without bound (it runs at load, over every vocabulary entry).
  const auto total = [&] {
    size_t n = 0;
    for (const std::string& t : tokens) n += t.size();
    return n;
  };
  const size_t limit = 16 * total() + 4096;
  for (const Step& step : steps_) {
    check(total() <= limit, "tokenizer decoder: the text grows to over ", limit,
          " bytes (a chain of Replace steps that expands without bound?)");
    switch (step.kind) {
      case Step::kReplace:
        for (std::string& t : tokens) t = replace_all(t, step.from, step.to);
        break;
      case Step::kByteFallback: {
        // Runs of byte tokens become the text their bytes spell. The reference decodes a run
        // with TextDecoder (one U+FFFD per maximal invalid subpart, as utf8_sanitize does); the
        // Rust crate turns a run that is not valid UTF-8 into one U+FFFD per byte.
        std::vector<std::string> out;
        std::string run;
        bool in_run = false;
        for (std::string& t : tokens) {
          if (const auto b = byte_token_value(t)) {
            run += static_cast<char>(*b);
            in_run = true;
            continue;
          }
          if (in_run) out.push_back(utf8_sanitize(run));
          run.clear();
          in_run = false;
          out.push_back(std::move(t));
        }
        if (in_run) out.push_back(utf8_sanitize(run));
        tokens = std::move(out);
        break;
      }
      case Step::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {std::move(all)};
        fused = true;
        break;
      }
      case Step::kStrip:
        // After Fuse the one string is the whole text, whose ends a single token's text is not.
        if (fused && !whole_text) break;
        for (std::string& t : tokens) {
          const std::u32string cps = utf8_to_u32(t);
          size_t begin = 0, end = cps.size();
          while (begin < end && begin < static_cast<size_t>(step.start) && cps[begin] == step.strip) ++begin;
          for (int64_t k = 0; k < step.stop && end > begin && cps[end - 1] == step.strip; ++k) --end;
          std::string out;
          for (size_t i = begin; i < end; ++i) utf8_append(out, cps[i]);
          t = std::move(out);
        }
        break;
      case Step::kMetaspace:
        // The reference drops one leading space of the first token whatever the prepend_scheme;
        // the Rust crate drops every "▁" of the first token unless prepend_scheme is "never".
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = replace_all(tokens[i], step.from, step.to);
          if (i == 0 && whole_text && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
        }
        break;
    }
  }
  check(total() <= limit, "tokenizer decoder: the text grows to over ", limit,
        " bytes (a chain of Replace steps that expands without bound?)");
  return tokens;
}

std::string DecoderChain::decode(std::vector<std::string> tokens) const {
  std::string text;
  for (const std::string& t : run(std::move(tokens), /*whole_text=*/true)) text += t;
  return text;
}

std::string DecoderChain::token_text(const std::string& token) const {
  if (byte_fallback_) {
    if (const auto b = byte_token_value(token)) return std::string(1, static_cast<char>(*b));
  }
  std::string text;
  for (const std::string& t : run({token}, /*whole_text=*/false)) text += t;
  return text;
}

}  // namespace hybridlm::tokenizer_detail
