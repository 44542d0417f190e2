// `hybridlm tokenize`: text to token ids (a JSON array), or ids back to text with --decode.
#include <iostream>
#include <memory>

#include "base/error.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

int cmd_tokenize(const std::string& dir, const std::string& prompt, const std::string& decode_ids, bool no_special) {
  check(prompt.empty() != decode_ids.empty(), "give exactly one of -p/--prompt or --decode");
  Tokenizer tok = load_tokenizer(dir);
  if (!decode_ids.empty()) {
    std::vector<int32_t> ids = parse_ids(decode_ids, "--decode");
    std::cout << tok.decode(ids) << std::endl;
    return 0;
  }
  std::vector<int32_t> ids = tok.encode(prompt, !no_special);
  std::cout << "[";
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? ", " : "") << ids[i];
  std::cout << "]" << std::endl;
  return 0;
}

}  // namespace

Subcommand add_tokenize(CLI::App& parent) {
  struct Flags {
    std::string dir, prompt, decode;
    bool no_special = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* tk = parent.add_subcommand("tokenize", "text to token ids (JSON array), or ids to text with --decode");
  tk->add_option("-m,--model", f->dir, "model directory (or any directory with tokenizer.json)")->required();
  tk->add_option("-p,--prompt", f->prompt, "text to encode");
  tk->add_option("--decode", f->decode, "comma-separated ids to decode");
  tk->add_flag("--no-special", f->no_special, "do not add BOS/EOS from the post-processor");
  return {tk, [f] { return cmd_tokenize(f->dir, f->prompt, f->decode, f->no_special); }};
}

}  // namespace hybridlm
