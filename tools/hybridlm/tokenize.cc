// `hybridlm tokenize`: text to token ids (a JSON array, which --decode and `score --ids` read
// back), the ids with their pieces (--show-pieces), or ids back to text (--decode).
#include <cstdio>
#include <iostream>
#include <memory>

#include "base/error.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

struct TokenizeFlags {
  std::string dir, prompt, decode;
  bool no_special = false, show_pieces = false;
  const CLI::Option* decode_flag = nullptr;  // given (even empty): decode ids, not encode a prompt
};

// A token's bytes, printable: control characters and bytes that are not UTF-8 on their own (a
// piece of a character split over tokens) as \n, \t, \xHH; backslash and quote escaped.
std::string printable_piece(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[8];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\\' || c == '\'') out += std::string("\\") + static_cast<char>(c);
    else if (c < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {  // a whole multi-byte character passes as is, a lone or cut one as \xHH
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
      bool whole = len > 0 && i + len <= s.size();
      for (size_t k = 1; whole && k < len; ++k) whole = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (whole) {
        out += s.substr(i, len);
        i += len - 1;
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
  }
  return out;
}

int cmd_tokenize(const TokenizeFlags& f) {
  Tokenizer tok = load_tokenizer(f.dir);
  if (f.decode_flag->count() > 0) {
    const std::vector<int32_t> ids = parse_ids(f.decode, "--decode");
    for (int32_t id : ids)
      check(id < tok.vocab_size(), "--decode: token id ", id, " is outside the tokenizer's vocabulary (size ",
            tok.vocab_size(), ")");
    std::cout << tok.decode(ids) << std::endl;
    return 0;
  }
  // An empty prompt is [] (or the BOS the tokenizer adds).
  const std::vector<int32_t> ids = tok.encode(f.prompt, !f.no_special);
  if (f.show_pieces) {
    for (int32_t id : ids) std::cout << id << " -> '" << printable_piece(tok.token_bytes(id)) << "'\n";
    return 0;
  }
  std::cout << "[";
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? ", " : "") << ids[i];
  std::cout << "]" << std::endl;
  return 0;
}

}  // namespace

Subcommand add_tokenize(CLI::App& parent) {
  auto f = std::make_shared<TokenizeFlags>();
  CLI::App* tk = parent.add_subcommand(
      "tokenize", "text to token ids (a JSON array, as --decode and score --ids read them), or ids back to text");
  tk->add_option("-m,--model", f->dir,
                 "model directory (or any directory with tokenizer.json or tokenizer.model), or a file in it")
      ->required()
      ->transform(model_dir_of, "", "");
  CLI::Option_group* what = tk->add_option_group("input", "what to convert: one of");
  what->add_option("-p,--prompt", f->prompt, "text to encode (may be empty)");
  f->decode_flag = what->add_option("--decode", f->decode, "ids to decode: 1,2,3 or [1, 2, 3]");
  what->require_option(1);
  tk->add_flag("--show-pieces", f->show_pieces, "print one `id -> 'piece'` line per token instead of the array");
  tk->add_flag("--no-special", f->no_special, "do not add BOS/EOS from the post-processor");
  return {tk, [f] { return cmd_tokenize(*f); }};
}

}  // namespace hybridlm
