// SentencePiece models (tokenizer.model) through Debian's libsentencepiece (libsentencepiece-dev).
//
// A tokenizer.model is a protobuf message (sentencepiece_model.proto) holding the pieces, their
// scores and the normalizer rules; encoding one exactly means running SentencePiece's own
// normalizer and segmentation. We do not re-implement the format: the library that defines it
// loads, encodes and decodes. The build finds it with pkg-config (CMakeLists.txt); without it
// (the aarch64 cross build: Debian's libsentencepiece-dev is not multiarch) load() says so.
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "io/tokenizer_internal.h"

#ifdef HYBRIDLM_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace hybridlm::tokenizer_detail {
namespace {

// Real models are under 5 MB (Llama, Mistral: 0.5 MB; Gemma: 4 MB); the file is read whole.
constexpr std::streamoff kMaxModelBytes = 64ll << 20;

#ifdef HYBRIDLM_HAVE_SENTENCEPIECE

class LibSentencePiece final : public SentencePieceModel {
 public:
  LibSentencePiece(const std::string& proto, const std::string& where) : where_(where) {
    const auto status = sp_.LoadFromSerializedProto(proto);
    if (!status.ok()) throw Error(where + ": not a SentencePiece model (" + status.ToString() + ")");
    if (sp_.GetPieceSize() <= 0 || sp_.GetPieceSize() > kMaxTokenId + 1) {
      throw Error(where + ": SentencePiece model has " + std::to_string(sp_.GetPieceSize()) +
                  " pieces (expected 1 to " + std::to_string(kMaxTokenId + 1) + ")");
    }
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw Error(where_ + ": SentencePiece cannot encode the text: " + status.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  std::string decode(std::span<const int32_t> ids) const override {
    const std::vector<int> v(ids.begin(), ids.end());
    std::string text;
    const auto status = sp_.Decode(v, &text);
    if (!status.ok()) throw Error(where_ + ": SentencePiece cannot decode the ids: " + status.ToString());
    return text;
  }

  int32_t size() const override { return sp_.GetPieceSize(); }
  std::string piece(int32_t id) const override { return sp_.IdToPiece(id); }
  std::optional<int32_t> piece_to_id(std::string_view piece) const override {
    const int id = sp_.PieceToId(piece);  // the unknown piece's id for anything it does not know
    if (id < 0 || id >= size() || sp_.IdToPiece(id) != piece) return std::nullopt;
    return id;
  }
  bool is_control(int32_t id) const override { return sp_.IsControl(id); }
  bool is_byte(int32_t id) const override { return sp_.IsByte(id); }
  std::optional<int32_t> bos_id() const override { return valid(sp_.bos_id()); }
  std::optional<int32_t> eos_id() const override { return valid(sp_.eos_id()); }

 private:
  std::optional<int32_t> valid(int id) const {  // the library says -1 for "none"
    if (id < 0 || id >= size()) return std::nullopt;
    return id;
  }
  sentencepiece::SentencePieceProcessor sp_;
  std::string where_;
};

#endif  // HYBRIDLM_HAVE_SENTENCEPIECE

}  // namespace

bool SentencePieceModel::available() {
#ifdef HYBRIDLM_HAVE_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

std::unique_ptr<SentencePieceModel> SentencePieceModel::load(const std::filesystem::path& file) {
  const std::string where = file.string();
  if (!available()) throw Error(where + ": this build has no SentencePiece support (libsentencepiece-dev)");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(where + ": cannot open file");
  in.seekg(0, std::ios::end);
  const std::streamoff bytes = in.tellg();
  if (bytes < 0) throw Error(where + ": cannot read its size (not a regular file?)");
  if (bytes > kMaxModelBytes) throw Error(where + ": over the 64 MiB limit for a SentencePiece model");
  in.seekg(0);
  std::stringstream ss;
  ss << in.rdbuf();
#ifdef HYBRIDLM_HAVE_SENTENCEPIECE
  return std::make_unique<LibSentencePiece>(ss.str(), where);
#else
  return nullptr;
#endif
}

}  // namespace hybridlm::tokenizer_detail
