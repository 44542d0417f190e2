// `hybridlm prepare-data`: text files to flat token files for training (docs/training-data.md).
//
// Each input file is one document. A document is encoded as `tokenize` encodes it (post-processor
// included), then followed by the tokenizer's end-of-document token (tokenizer_config.json's
// eos_token, else an added "<|endoftext|>") unless it already ends with it. Validation holds out
// whole documents: in a --seed shuffle of the documents, the first ones until they hold
// --val-fraction of the tokens (at least one; at least one stays for training). With a single
// document, its last --val-fraction of tokens are the validation set instead.
//
// OUT/train.bin and OUT/val.bin are the tokens back to back, little-endian uint16 when every id
// fits (vocabulary <= 65536), else uint32; OUT/index.json says which, and where each document is.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "base/error.h"
#include "base/sha256.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

struct PrepareDataFlags {
  std::string tokenizer, out_dir;
  std::vector<std::string> inputs;
  double val_fraction = 0.1;
  uint64_t seed = 1;
};

// A run of one document's tokens in one of the output files.
struct Span {
  size_t doc;           // index into the inputs
  size_t offset, size;  // in tokens, within the output file
  size_t first = 0;     // the span's first token within its document (> 0 only for a held-out tail)
};

// Tokens back to back, little-endian, `width` (2 or 4) bytes each.
void write_tokens(const std::filesystem::path& path, const std::vector<int32_t>& ids, int width) {
  std::string bytes(ids.size() * static_cast<size_t>(width), '\0');
  for (size_t i = 0; i < ids.size(); ++i)
    for (int b = 0; b < width; ++b)
      bytes[i * width + b] = static_cast<char>(static_cast<uint32_t>(ids[i]) >> (8 * b));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  check(static_cast<bool>(out), path.string(), ": cannot write");
}

int cmd_prepare_data(const PrepareDataFlags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  check(f.val_fraction >= 0 && f.val_fraction < 1, "--val-fraction ", f.val_fraction, ": must be in [0, 1)");
  std::error_code ec;
  std::filesystem::path tok_file(f.tokenizer);
  if (std::filesystem::is_directory(tok_file, ec)) tok_file /= "tokenizer.json";
  check(std::filesystem::is_regular_file(tok_file, ec), "--tokenizer ", f.tokenizer,
        ": no tokenizer.json there (a directory holding one, or the file)");
  const Tokenizer tok = Tokenizer::load(f.tokenizer);
  std::ifstream tin(tok_file, std::ios::binary);
  const std::string tok_bytes((std::istreambuf_iterator<char>(tin)), std::istreambuf_iterator<char>());

  std::optional<int32_t> eos = tok.eos_id();
  if (!eos) {
    const auto id = tok.token_to_id("<|endoftext|>");
    if (id && tok.is_special(*id)) eos = id;
  }

  // Every input is read and encoded before anything is written.
  std::vector<std::vector<int32_t>> docs;
  size_t total = 0;
  for (const std::string& file : f.inputs) {
    std::vector<int32_t> ids = tok.encode(read_text_file(file, 1ull << 30, "one document"));
    if (eos && !ids.empty() && ids.back() != *eos) ids.push_back(*eos);
    total += ids.size();
    docs.push_back(std::move(ids));
  }
  check(total > 0, "no tokens: the input files are empty");

  // Which documents are validation (whole documents), or how many tail tokens of the only one.
  std::vector<bool> is_val(docs.size(), false);
  size_t tail = 0;
  if (f.val_fraction > 0 && docs.size() == 1) {
    tail = static_cast<size_t>(std::ceil(f.val_fraction * static_cast<double>(total)));
    check(tail < total, "--val-fraction ", f.val_fraction, ": leaves no training tokens of ", total);
  } else if (f.val_fraction > 0) {
    std::vector<size_t> order(docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::mt19937_64 rng(f.seed);  // Fisher-Yates with a fixed generator: the same split everywhere
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
    size_t val_tokens = 0, val_docs = 0;
    const double want = f.val_fraction * static_cast<double>(total);
    for (size_t i : order) {
      if (val_docs > 0 && static_cast<double>(val_tokens) >= want) break;
      if (val_docs + 1 == docs.size()) break;
      is_val[i] = true;
      val_tokens += docs[i].size();
      ++val_docs;
    }
  }

  std::vector<int32_t> train, val;
  std::vector<Span> train_spans, val_spans;
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::vector<int32_t>& ids = docs[d];
    const size_t head = ids.size() - (docs.size() == 1 ? tail : 0);
    std::vector<int32_t>& dst = is_val[d] ? val : train;
    std::vector<Span>& spans = is_val[d] ? val_spans : train_spans;
    spans.push_back({d, dst.size(), head});
    dst.insert(dst.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(head));
    if (head < ids.size()) {
      val_spans.push_back({d, val.size(), ids.size() - head, head});
      val.insert(val.end(), ids.begin() + static_cast<std::ptrdiff_t>(head), ids.end());
    }
  }

  const int vocab = tok.vocab_size();
  const int width = vocab <= 65536 ? 2 : 4;
  const std::filesystem::path out(f.out_dir);
  std::filesystem::create_directories(out, ec);
  check(!ec && std::filesystem::is_directory(out), "-o ", f.out_dir, ": cannot create the output directory",
        ec ? " (" + ec.message() + ")" : std::string());
  write_tokens(out / "train.bin", train, width);
  write_tokens(out / "val.bin", val, width);

  using ojson = nlohmann::ordered_json;
  const auto split = [&](const char* file, const std::vector<int32_t>& ids, const std::vector<Span>& spans) {
    ojson documents = ojson::array();
    for (const Span& s : spans)
      documents.push_back(
          {{"source", f.inputs[s.doc]}, {"offset", s.offset}, {"tokens", s.size}, {"document_offset", s.first}});
    return ojson{{"file", file}, {"tokens", ids.size()}, {"documents", documents}};
  };
  const ojson index = {
      {"format", "hybridlm-tokens"},
      {"version", 1},
      {"dtype", width == 2 ? "uint16" : "uint32"},
      {"byte_order", "little"},
      {"vocab_size", vocab},
      {"eos_id", eos ? ojson(*eos) : ojson(nullptr)},
      {"tokenizer",
       {{"path", std::filesystem::absolute(tok_file).lexically_normal().string()}, {"sha256", sha256_hex(tok_bytes)}}},
      {"val_fraction", f.val_fraction},
      {"seed", f.seed},
      {"train", split("train.bin", train, train_spans)},
      {"val", split("val.bin", val, val_spans)}};
  {
    std::ofstream idx(out / "index.json", std::ios::binary);
    idx << index.dump(2) << "\n";
    idx.close();
    check(static_cast<bool>(idx), (out / "index.json").string(), ": cannot write");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "%zu documents, %zu tokens (%s, vocabulary %d): train %zu tokens, val %zu tokens (%zu documents); "
               "wrote %s (%.2f s)\n",
               docs.size(), total, width == 2 ? "uint16" : "uint32", vocab, train.size(), val.size(),
               val_spans.size(), out.string().c_str(), secs);
  return 0;
}

}  // namespace

Subcommand add_prepare_data(CLI::App& parent) {
  auto f = std::make_shared<PrepareDataFlags>();
  CLI::App* c = parent.add_subcommand(
      "prepare-data", "tokenize text files (one document each) into OUT/train.bin, OUT/val.bin and OUT/index.json");
  c->add_option("--tokenizer", f->tokenizer, "tokenizer.json, or a directory (a model's) holding it")->required();
  c->add_option("-i,--input", f->inputs, "text files, one document each (UTF-8)")->required();
  c->add_option("-o,--output", f->out_dir, "directory to write train.bin, val.bin and index.json to")->required();
  c->add_option("--val-fraction", f->val_fraction,
                "share of tokens held out for validation: whole documents, or the tail of a single one")
      ->capture_default_str();
  c->add_option("--seed", f->seed, "seed of the shuffle that picks validation documents")->capture_default_str();
  return {c, [f] { return cmd_prepare_data(*f); }};
}

}  // namespace hybridlm
