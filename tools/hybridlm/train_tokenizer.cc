// `hybridlm train-tokenizer`: trains a byte-level BPE tokenizer on text files (src/io/bpe_train.h)
// and writes DIR/tokenizer.json and DIR/tokenizer_config.json, which `tokenize -m DIR`, every
// other subcommand and Hugging Face's tokenizers load.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "base/error.h"
#include "io/bpe_train.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

struct TrainTokenizerFlags {
  std::vector<std::string> inputs;
  std::string out_dir;
  int vocab_size = 0;
  int64_t min_frequency = 2;
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  check(static_cast<bool>(out), path.string(), ": cannot write");
  out << text;
  out.close();
  check(static_cast<bool>(out), path.string(), ": cannot write");
}

int cmd_train_tokenizer(TrainTokenizerFlags f) {
  const auto t0 = std::chrono::steady_clock::now();
  std::erase_if(f.special_tokens, [](const std::string& s) { return s.empty(); });  // "" = none
  const int need = 256 + static_cast<int>(f.special_tokens.size());
  check(f.vocab_size >= need, "--vocab-size ", f.vocab_size, ": must be >= ", need, " (256 byte symbols + ",
        f.special_tokens.size(), " special tokens)");
  check(f.min_frequency >= 1, "--min-frequency ", f.min_frequency, ": must be >= 1");
  // Every input is read (and refused) before anything is written.
  BpeWordCounter counter(f.special_tokens);
  uint64_t bytes = 0;
  for (const std::string& file : f.inputs) {
    const std::string text = read_text_file(file, 1ull << 30, "one training file");
    bytes += text.size();
    counter.add_text(text);
  }
  check(counter.total_words() > 0, "no text to train on: the input files are empty");
  const auto t1 = std::chrono::steady_clock::now();

  const BpeModelData model = train_bpe(counter.counts(), {f.vocab_size, f.min_frequency, f.special_tokens});
  const auto t2 = std::chrono::steady_clock::now();

  const std::filesystem::path dir(f.out_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  check(!ec && std::filesystem::is_directory(dir), "-o ", f.out_dir, ": cannot create the output directory",
        ec ? " (" + ec.message() + ")" : std::string());
  write_file(dir / "tokenizer.json", bpe_tokenizer_json(model));
  write_file(dir / "tokenizer_config.json", bpe_tokenizer_config_json(model));

  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::fprintf(stderr, "read %zu files, %llu bytes: %lld words, %zu distinct (%.2f s)\n", f.inputs.size(),
               static_cast<unsigned long long>(bytes), static_cast<long long>(counter.total_words()),
               counter.counts().size(), secs(t0, t1));
  std::fprintf(stderr, "trained %zu merges: vocabulary %zu of %d (%d special)%s (%.2f s)\n", model.merges.size(),
               model.vocab.size(), f.vocab_size, model.num_special,
               static_cast<int>(model.vocab.size()) < f.vocab_size ? ", stopped early: no pair left at --min-frequency"
                                                                     : "",
               secs(t1, t2));
  std::fprintf(stderr, "wrote %s\n", (dir / "tokenizer.json").string().c_str());
  return 0;
}

}  // namespace

Subcommand add_train_tokenizer(CLI::App& parent) {
  auto f = std::make_shared<TrainTokenizerFlags>();
  CLI::App* c = parent.add_subcommand(
      "train-tokenizer", "train a byte-level BPE tokenizer (GPT-2 style) on text files; writes DIR/tokenizer.json");
  c->add_option("-i,--input", f->inputs, "text files to train on (UTF-8)")->required();
  c->add_option("--vocab-size", f->vocab_size, "vocabulary size, special tokens included (>= 256 + specials)")
      ->required();
  c->add_option("-o,--output", f->out_dir, "directory to write tokenizer.json and tokenizer_config.json to")
      ->required();
  c->add_option("--min-frequency", f->min_frequency, "merge only pairs seen at least this often")
      ->capture_default_str();
  c->add_option("--special-tokens", f->special_tokens,
                "special tokens, ids 0.. (the first is eos_token); \"\" for none")
      ->capture_default_str();
  return {c, [f] { return cmd_train_tokenizer(*f); }};
}

}  // namespace hybridlm
