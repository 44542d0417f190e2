// Tokenizer: loading tokenizer.json (+ tokenizer_config.json), added tokens, encode, decode.
// The BPE model, pre-tokenizers, regex and NFC live in tokenizer_*.cc / unicode_nfc.cc.
//
// Behavioural reference: the `@huggingface/tokenizers` npm package (tests/tokenizer/compare.mjs
// checks every id against it). Where it and the Rust `tokenizers` crate disagree on something the
// supported files can hit, the comment at that spot says which one we follow.
#include "io/tokenizer.h"

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "io/tokenizer_internal.h"

namespace hybridlm {

using nlohmann::json;
using namespace tokenizer_detail;

namespace {

json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), file.string());
}

// Added-token strings, matched before pre-tokenization: at each position the longest token that
// starts there, scanning left to right (leftmost, then longest).
class TokenTrie {
 public:
  void insert(std::string_view s) {
    int32_t node = 0;
    for (char c : s) {
      int32_t next = child(node, static_cast<uint8_t>(c));
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(static_cast<uint8_t>(c), next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[node].terminal = true;
  }

  // Splits text into the gaps and the matched tokens, in order; gaps may be empty strings only
  // when nothing matched and text is empty.
  std::vector<std::string> split(std::string_view text) const {
    std::vector<std::string> out;
    size_t start = 0, i = 0;
    while (i < text.size()) {
      size_t match = 0;
      int32_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        node = child(node, static_cast<uint8_t>(text[j]));
        if (node < 0) break;
        if (nodes_[node].terminal) match = j + 1 - i;
      }
      if (match == 0) {
        ++i;
        continue;
      }
      if (i > start) out.emplace_back(text.substr(start, i - start));
      out.emplace_back(text.substr(i, match));
      i += match;
      start = i;
    }
    if (start < text.size()) out.emplace_back(text.substr(start));
    return out;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    bool terminal = false;
  };
  int32_t child(int32_t node, uint8_t c) const {
    for (const auto& [byte, next] : nodes_[node].children) {
      if (byte == c) return next;
    }
    return -1;
  }
  std::vector<Node> nodes_ = std::vector<Node>(1);
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

// One item of a TemplateProcessing "single" template: the input sequence, or special token ids.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

bool json_flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].get<bool>();
}

}  // namespace

struct Tokenizer::Impl {
  std::string file;  // tokenizer.json (or tokenizer.model), for messages
  // A tokenizer.model loaded through libsentencepiece; when set, it does all the work and the
  // tokenizer.json members below stay empty.
  std::unique_ptr<SentencePieceModel> spm;
  Normalizer normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  BpeModel model;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_text;  // content and normalized content -> id
  std::unordered_map<std::string, int32_t> added_by_content;
  std::unordered_map<std::string, size_t> added_index;  // same keys as added_by_text -> index in added
  TokenTrie unnormalized_trie, normalized_trie;
  // Post-processing. templates: one TemplateProcessing per entry (a Sequence may chain several).
  std::vector<std::vector<TemplateItem>> templates;
  bool prepend_bos = false, append_eos = false;  // tokenizer_config.json add_bos/eos_token
  std::optional<int32_t> bos, eos;
  // Per id: decoded bytes (token_bytes), and whether the id exists / is special.
  std::vector<std::string> bytes_of;
  std::vector<uint8_t> exists, special;
  // The decoder: ByteLevel when unset (decode concatenates bytes_of), else a SentencePiece-style
  // chain working on each id's string (token_string).
  std::optional<DecoderChain> chain;
  std::vector<std::string> token_string;

  void load_added_tokens(const json& j);
  void load_post_processor(const json& j);
  void load_decoder(const json& j);
  void load_config(const std::filesystem::path& config_file);
  std::optional<int32_t> lookup(std::string_view token) const;
  void strip_around_added(std::vector<std::string>& sections) const;
  void encode_section(const std::string& text, bool first_section, std::vector<int32_t>& ids,
                      BpeModel::Cache& cache) const;
  std::string decode_ids(std::span<const int32_t> ids, bool skip_special_tokens) const;
};

// Token string -> id the way the reference maps model output: added tokens (by content or
// normalized content) first, then the vocabulary.
std::optional<int32_t> Tokenizer::Impl::lookup(std::string_view token) const {
  if (spm) return spm->piece_to_id(token);
  return model.token_to_id(token);
}

void Tokenizer::Impl::load_added_tokens(const json& j) {
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
  if (!j["added_tokens"].is_array()) throw Error(file + ": \"added_tokens\" must be an array");
  for (const json& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id") ||
        !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > kMaxTokenId) {
      throw Error(file + ": every added token needs a string \"content\" and an \"id\" in [0, " +
                  std::to_string(kMaxTokenId) + "]");
    }
    AddedToken a;
    a.content = t["content"].get<std::string>();
    if (a.content.empty()) throw Error(file + ": added token " + json_brief(t["id"]) + " has empty content");
    a.id = t["id"].get<int32_t>();
    a.special = json_flag(t, "special", false);
    a.lstrip = json_flag(t, "lstrip", false);
    a.rstrip = json_flag(t, "rstrip", false);
    // "single_word" is ignored, as in the reference (it does not implement it either).
    a.normalized = json_flag(t, "normalized", !a.special);
    added.push_back(a);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    added_by_text[a.content] = a.id;
    added_by_content[a.content] = a.id;
    added_index[a.content] = i;
    // A "normalized" token is matched in normalized text, so it is looked for by its normalized
    // content; without a normalizer it is matched like the others.
    if (a.normalized && normalizer.active()) {
      const std::string n = normalizer.apply(a.content);
      added_by_text[n] = a.id;
      added_index[n] = i;
      normalized_trie.insert(n);
    } else {
      unnormalized_trie.insert(a.content);
    }
  }
}

void Tokenizer::Impl::load_post_processor(const json& j) {
  if (!j.contains("post_processor") || j["post_processor"].is_null()) return;
  std::vector<const json*> stack = {&j["post_processor"]};
  std::vector<const json*> flat;
  while (!stack.empty()) {  // flatten nested Sequences, keeping order
    const json* p = stack.back();
    stack.pop_back();
    if (!p->is_object() || !p->contains("type")) throw Error(file + ": post_processor needs a \"type\"");
    if ((*p)["type"] == "Sequence") {
      const json& list = p->value("processors", json::array());
      for (auto it = list.rbegin(); it != list.rend(); ++it) stack.push_back(&*it);
    } else {
      flat.push_back(p);
    }
  }
  for (const json* p : flat) {
    const std::string type = (*p)["type"].get<std::string>();
    if (type == "ByteLevel") continue;  // only adjusts offsets, which we do not report
    if (type != "TemplateProcessing") {
      throw Error(file + ": unsupported post_processor type \"" + type +
                  "\" (supported: TemplateProcessing, ByteLevel, Sequence)");
    }
    const json specials = p->value("special_tokens", json::object());
    std::vector<TemplateItem> items;
    for (const json& item : p->value("single", json::array())) {
      TemplateItem t;
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", "A") != "A") throw Error(file + ": single template uses sequence B");
        t.is_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", "");
        if (specials.contains(name) && specials[name].contains("ids")) {
          // Each id is checked before conversion: nlohmann's get<int32_t> on a float or an
          // out-of-range number is an unchecked (undefined) cast (found by fuzz_tokenizer_load).
          const json& ids = specials[name]["ids"];
          if (!ids.is_array()) throw Error(file + ": special token \"" + name + "\" ids is not an array");
          for (const json& v : ids) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId)
              throw Error(file + ": special token \"" + name + "\" has an id that is not an integer in [0, " +
                          std::to_string(kMaxTokenId) + "]: " + v.dump().substr(0, 40));
            t.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
          }
        } else if (const auto id = lookup(name)) {
          t.ids = {*id};
        } else {
          throw Error(file + ": TemplateProcessing names unknown special token \"" + name + "\"");
        }
      } else {
        throw Error(file + ": TemplateProcessing item is neither Sequence nor SpecialToken");
      }
      items.push_back(std::move(t));
    }
    templates.push_back(std::move(items));
  }
}

void Tokenizer::Impl::load_decoder(const json& j) {
  const json& d = j.contains("decoder") ? j["decoder"] : json();
  const std::string type = d.is_object() && d.contains("type") && d["type"].is_string() ? d["type"].get<std::string>()
                           : d.is_null()                                                 ? "null"
                                                                                         : "";
  if (type == "null") throw Error(file + ": no decoder (supported: ByteLevel, or a SentencePiece-style chain)");
  if (type != "ByteLevel") chain.emplace(d, file);
  // Each id's text: an added token's content at its id, else the vocabulary entry.
  const auto& vocab = model.id_to_token();
  int32_t size = static_cast<int32_t>(vocab.size());
  for (const AddedToken& a : added) size = std::max(size, a.id + 1);
  bytes_of.assign(size, std::string());
  exists.assign(size, 0);
  special.assign(size, 0);
  if (chain) {
    // A SentencePiece-style chain decodes the strings; each id's bytes are its text mid-sentence.
    token_string.assign(size, std::string());
    for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
      if (vocab[id].empty()) continue;
      exists[id] = 1;
      token_string[id] = vocab[id];
    }
    for (const AddedToken& a : added) {
      exists[a.id] = 1;
      token_string[a.id] = a.content;
      special[a.id] = a.special;
    }
    try {
      for (int32_t id = 0; id < size; ++id) {
        if (exists[id]) bytes_of[id] = chain->token_text(token_string[id]);
      }
    } catch (const Error& e) {
      throw Error(file + ": " + e.what());
    }
    return;
  }
  // The ByteLevel decoder passes added-token contents through and maps every other character back
  // to its byte. A character outside the byte alphabet keeps its own UTF-8 bytes (Rust crate
  // behaviour; the JS reference would turn it into a 0 byte).
  for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
    if (vocab[id].empty()) continue;
    exists[id] = 1;
    if (added_by_content.count(vocab[id])) {
      bytes_of[id] = vocab[id];
      continue;
    }
    for (char32_t cp : utf8_to_u32(vocab[id])) {
      if (const auto b = unicode_to_byte(cp)) {
        bytes_of[id] += static_cast<char>(*b);
      } else {
        utf8_append(bytes_of[id], cp);
      }
    }
  }
  for (const AddedToken& a : added) {
    exists[a.id] = 1;
    bytes_of[a.id] = a.content;
    special[a.id] = a.special;
  }
}

void Tokenizer::Impl::load_config(const std::filesystem::path& config_file) {
  if (!std::filesystem::exists(config_file)) return;
  const json c = read_json(config_file);
  const std::string where = config_file.string();
  if (!c.is_object()) throw Error(where + ": expected a JSON object");
  const auto token_id = [&](const char* key) -> std::optional<int32_t> {
    if (!c.contains(key) || c[key].is_null()) return std::nullopt;
    const json& v = c[key];
    const std::string name = v.is_object()   ? v.value("content", "")
                             : v.is_string() ? v.get<std::string>()
                                             : "";
    const auto id = lookup(name);
    if (!id) throw Error(where + ": " + key + " \"" + name + "\" is not a token of the tokenizer");
    return id;
  };
  bos = token_id("bos_token");
  eos = token_id("eos_token");
  for (const char* key : {"remove_space", "do_lowercase_and_remove_accent"}) {
    if (json_flag(c, key, false)) throw Error(where + ": unsupported option \"" + key + "\": true");
  }
  // add_bos_token / add_eos_token (transformers' Llama-style flags; the JS reference ignores
  // them): honoured only when explicitly true and the post-processor does not already add it.
  const auto template_has = [&](int32_t id) {
    for (const auto& t : templates) {
      for (const TemplateItem& item : t) {
        if (std::find(item.ids.begin(), item.ids.end(), id) != item.ids.end()) return true;
      }
    }
    return false;
  };
  prepend_bos = json_flag(c, "add_bos_token", false) && bos && !template_has(*bos);
  append_eos = json_flag(c, "add_eos_token", false) && eos && !template_has(*eos);
}

// An added token with lstrip (rstrip) eats the whitespace before (after) it.
void Tokenizer::Impl::strip_around_added(std::vector<std::string>& sections) const {
  for (size_t i = 0; i < sections.size(); ++i) {
    const auto it = added_index.find(sections[i]);
    if (it == added_index.end()) continue;
    const AddedToken& a = added[it->second];
    if (a.lstrip && i > 0) sections[i - 1] = std::string(js_trim_end(sections[i - 1]));
    if (a.rstrip && i + 1 < sections.size()) sections[i + 1] = std::string(js_trim_start(sections[i + 1]));
  }
}

// Encodes text that contains no unnormalized added token.
void Tokenizer::Impl::encode_section(const std::string& text, bool first_section, std::vector<int32_t>& ids,
                                     BpeModel::Cache& cache) const {
  std::vector<std::string> subsections = normalized_trie.split(normalizer.apply(text));
  strip_around_added(subsections);
  for (std::string& sub : subsections) {
    if (sub.empty()) continue;
    if (const auto it = added_by_text.find(sub); it != added_by_text.end()) {
      ids.push_back(it->second);
      continue;
    }
    std::vector<std::string> pieces = {std::move(sub)};
    if (pre_tokenizer) pre_tokenizer->apply(pieces, first_section);
    const size_t start = ids.size();
    for (const std::string& piece : pieces) model.encode_word(piece, ids, cache);
    if (model.fuse_unk() && model.unk_id()) {  // runs of unknown tokens become one
      const int32_t unk = *model.unk_id();
      size_t w = start;
      for (size_t r = start; r < ids.size(); ++r) {
        if (ids[r] == unk && w > start && ids[w - 1] == unk) continue;
        ids[w++] = ids[r];
      }
      ids.resize(w);
    }
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path file = std::filesystem::is_directory(path, ec) ? path / "tokenizer.json" : path;
  // A directory with tokenizer.model and no tokenizer.json (original Llama / Mistral releases):
  // the SentencePiece model, through libsentencepiece.
  if (std::filesystem::is_directory(path, ec) && !std::filesystem::exists(file, ec) &&
      std::filesystem::is_regular_file(path / "tokenizer.model", ec)) {
    file = path / "tokenizer.model";
  }
  auto impl = std::make_unique<Impl>();
  impl->file = file.string();
  const std::string& where = impl->file;
  if (!std::filesystem::is_regular_file(file, ec)) throw Error(where + ": no such file");
  if (file.extension() == ".model") {
    impl->spm = SentencePieceModel::load(file);
    impl->bos = impl->spm->bos_id();
    impl->eos = impl->spm->eos_id();
    // Llama and Mistral put BOS in front of every encoded text; SentencePiece itself adds nothing.
    impl->prepend_bos = impl->bos.has_value();
    const int32_t size = impl->spm->size();
    impl->bytes_of.resize(size);
    impl->exists.assign(size, 1);
    impl->special.assign(size, 0);
    for (int32_t id = 0; id < size; ++id) {
      // Mid-sentence text of each piece: "▁" is a space, a byte piece its byte; control pieces
      // (<s>, </s>) decode to nothing, so they show as their spelling.
      const std::string piece = impl->spm->piece(id);
      impl->special[id] = impl->spm->is_control(id);
      if (impl->spm->is_byte(id)) {
        if (const auto b = byte_token_value(piece)) impl->bytes_of[id] = std::string(1, static_cast<char>(*b));
      } else if (impl->special[id]) {
        impl->bytes_of[id] = piece;
      } else {
        std::string text;
        for (size_t at = 0; at < piece.size();) {
          if (piece.compare(at, 3, "\xE2\x96\x81") == 0) {
            text += ' ';
            at += 3;
          } else {
            text += piece[at++];
          }
        }
        impl->bytes_of[id] = std::move(text);
      }
    }
    return Tokenizer(std::move(impl));
  }
  try {
    const json j = read_json(file);
    if (!j.is_object()) throw Error(where + ": expected a JSON object");
    if (!j.contains("model") || !j["model"].is_object()) throw Error(where + ": missing \"model\"");
    const json& m = j["model"];
    // Files from older versions of the Rust crate omit the model type of a BPE model.
    const std::string type = m.contains("type")     ? m["type"].get<std::string>()
                             : m.contains("merges") ? "BPE"
                                                    : "";
    if (type != "BPE") {
      throw Error(where + ": unsupported model type \"" + type + "\" (only BPE is supported)");
    }

    impl->normalizer = Normalizer(j.contains("normalizer") ? j["normalizer"] : json(), where);
    impl->pre_tokenizer =
        make_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), where);
    impl->model = BpeModel::from_json(m, where);
    impl->load_added_tokens(j);
    impl->model.set_added_tokens(impl->added_by_text, impl->added_by_content);
    impl->load_post_processor(j);
    impl->load_decoder(j);
    impl->load_config(file.parent_path() / "tokenizer_config.json");
  } catch (const json::exception& e) {
    throw Error(where + ": unexpected JSON structure: " + e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  if (im.spm) {
    ids = im.spm->encode(utf8_sanitize(text));
    if (add_special_tokens && im.prepend_bos) ids.insert(ids.begin(), *im.bos);
    return ids;
  }
  BpeModel::Cache cache;
  // 1. Malformed UTF-8 is not an error: each invalid sequence becomes U+FFFD, as a JavaScript
  //    TextDecoder would make of the same bytes.
  // 2. Cut out the added tokens that are matched in the raw text.
  std::vector<std::string> sections = im.unnormalized_trie.split(utf8_sanitize(text));
  im.strip_around_added(sections);
  for (size_t i = 0; i < sections.size(); ++i) {
    const std::string& section = sections[i];
    if (section.empty()) continue;
    if (const auto it = im.added_by_text.find(section); it != im.added_by_text.end()) {
      ids.push_back(it->second);
      continue;
    }
    im.encode_section(section, /*first_section=*/i == 0, ids, cache);
  }
  // 3. Post-processing: the templates add special tokens around the sequence.
  if (add_special_tokens) {
    for (const auto& tmpl : im.templates) {
      std::vector<int32_t> out;
      for (const TemplateItem& item : tmpl) {
        if (item.is_sequence) {
          out.insert(out.end(), ids.begin(), ids.end());
        } else {
          out.insert(out.end(), item.ids.begin(), item.ids.end());
        }
      }
      ids = std::move(out);
    }
    if (im.prepend_bos) ids.insert(ids.begin(), *im.bos);
    if (im.append_eos) ids.push_back(*im.eos);
  }
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& im = *impl_;
  if (id < 0 || id >= vocab_size() || !im.exists[id]) {
    throw Error(im.file + ": token id " + std::to_string(id) + " is outside the vocabulary (size " +
                std::to_string(vocab_size()) + ")");
  }
  return im.bytes_of[id];
}

std::string Tokenizer::Impl::decode_ids(std::span<const int32_t> ids, bool skip_special_tokens) const {
  if (spm) {
    // SentencePiece drops control pieces itself.
    return spm->decode(ids);
  }
  if (chain) {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (!skip_special_tokens || !special[id]) tokens.push_back(token_string[id]);
    }
    return chain->decode(std::move(tokens));
  }
  std::string bytes;
  for (int32_t id : ids) {
    if (!skip_special_tokens || !special[id]) bytes += bytes_of[id];
  }
  return utf8_sanitize(bytes);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  for (int32_t id : ids) token_bytes(id);  // validates id
  if (impl_->spm && skip_special_tokens) {
    std::vector<int32_t> kept;
    for (int32_t id : ids) {
      if (!impl_->special[id]) kept.push_back(id);
    }
    return impl_->decode_ids(kept, false);
  }
  return impl_->decode_ids(ids, skip_special_tokens);
}

std::string Tokenizer::decode_prefix(std::span<const int32_t> ids, bool* held) const {
  const Impl& im = *impl_;
  *held = false;
  if (!im.spm && !im.chain) {  // ByteLevel: bytes; an unfinished character at the end waits
    std::string bytes;
    for (int32_t id : ids) bytes += im.bytes_of[id];
    size_t i = 0;
    while (i < bytes.size()) {
      const Utf8Char c = utf8_read(bytes, i);
      if (c.status == Utf8Char::kIncomplete) {
        bytes.resize(i);
        *held = true;
        break;
      }
      i += c.len;
    }
    return utf8_sanitize(bytes);
  }
  // Byte tokens at the end whose bytes stop inside a character wait for the rest of it.
  size_t run = 0;
  std::string bytes;
  while (run < ids.size()) {
    const int32_t id = ids[ids.size() - 1 - run];
    const bool byte = im.spm ? im.spm->is_byte(id) : im.chain->byte_fallback() && byte_token_value(im.token_string[id]);
    if (!byte) break;
    bytes.insert(bytes.begin(), im.bytes_of[id].begin(), im.bytes_of[id].end());
    ++run;
  }
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Char c = utf8_read(bytes, i);
    if (c.status == Utf8Char::kIncomplete) {
      *held = true;
      return im.decode_ids(ids.first(ids.size() - run), false);
    }
    i += c.len;
  }
  return im.decode_ids(ids, false);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->bytes_of.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id] != 0;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->lookup(token); }

}  // namespace hybridlm
