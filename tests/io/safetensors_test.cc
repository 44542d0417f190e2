// safetensors reader/writer and sharded checkpoints. Bad files are written byte by byte here so
// each validation path is exercised on exactly the corruption it names.
#include "io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numerics.h"
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace hybridlm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

// A fresh directory per test: <TempDir>/hybridlm_safetensors_<pid>_<test name>.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("hybridlm_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << p;
}

// [u64 LE len(header)][header][data], the header given verbatim.
std::string raw_file(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// The message of the hybridlm::Error that f throws ("" and a test failure if it does not throw).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hybridlm::Error";
  return "";
}

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

TEST_F(SafetensorsTest, RoundTripAllDtypes) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-3f};
  std::vector<uint16_t> f16, bf16;
  for (float v : f32) {
    f16.push_back(f32_to_f16(v));
    bf16.push_back(f32_to_bf16(v));
  }
  const std::vector<double> f64 = {0.125, -7.5, 1e10};
  const std::vector<int8_t> i8 = {-128, 0, 127};
  const std::vector<uint8_t> u8 = {0, 1, 255, 7};
  const std::vector<int32_t> i32 = {-1, 2, 1 << 30};
  const std::vector<int64_t> i64 = {-(int64_t{1} << 40), 5};
  // U8 first (4 bytes) puts every later tensor's data at an odd offset relative to its dtype
  // alignment in some cases: reads must cope with unaligned data.
  const std::vector<uint8_t> odd = {9};
  std::vector<TensorToWrite> ts = {
      {"odd", DType::U8, {1}, as_bytes(odd)},
      {"a.f32", DType::F32, {2, 3}, as_bytes(f32)},
      {"b.f16", DType::F16, {6}, as_bytes(f16)},
      {"c.bf16", DType::BF16, {3, 2}, as_bytes(bf16)},
      {"d.f64", DType::F64, {3}, as_bytes(f64)},
      {"e.i8", DType::I8, {3}, as_bytes(i8)},
      {"f.u8", DType::U8, {2, 2}, as_bytes(u8)},
      {"g.i32", DType::I32, {3}, as_bytes(i32)},
      {"h.i64", DType::I64, {2}, as_bytes(i64)},
      {"scalar", DType::F32, {}, std::span<const uint8_t>(as_bytes(f32).data(), 4)},
      {"empty", DType::F32, {0, 4}, {}},
  };
  const fs::path p = dir_ / "rt.safetensors";
  write_safetensors(p, ts, {{"format", "pt"}, {"note", "hello"}});

  // The file is safetensors_header's bytes, then the tensors' bytes in order.
  {
    std::string want = safetensors_header(ts, {{"format", "pt"}, {"note", "hello"}}, p.string());
    for (const TensorToWrite& t : ts) want.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    std::ifstream whole(p, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(whole), std::istreambuf_iterator<char>()), want);
  }

  // The header length is a multiple of 8, as the reference writer pads it.
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);

  for (bool use_mmap : {true, false}) {
    SafetensorsFile f = SafetensorsFile::open(p, use_mmap);
    EXPECT_EQ(f.metadata().size(), 2u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "hello");
    ASSERT_EQ(f.tensors().size(), ts.size());
    for (const TensorToWrite& t : ts) {
      SCOPED_TRACE(t.name);
      const TensorInfo& info = f.tensors().at(t.name);
      EXPECT_EQ(info.name, t.name);
      EXPECT_EQ(info.dtype, t.dtype);
      EXPECT_EQ(info.shape, t.shape);
      EXPECT_EQ(info.file, p.string());
      ASSERT_EQ(info.nbytes, t.bytes.size());
      if (info.nbytes) {
        EXPECT_EQ(std::memcmp(info.data, t.bytes.data(), info.nbytes), 0);
      }
    }
    // to_f32 from each float dtype.
    std::vector<float> got(6);
    f.tensors().at("a.f32").to_f32(got.data());
    EXPECT_EQ(got, f32);
    f.tensors().at("b.f16").to_f32(got.data());
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], f32[i], tol::kF16Read * std::fabs(f32[i]) + 1e-7);
    f.tensors().at("c.bf16").to_f32(got.data());
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], f32[i], tol::kBf16Read * std::fabs(f32[i]) + 1e-7);
    f.tensors().at("d.f64").to_f32(got.data());
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], static_cast<float>(f64[i]));
    EXPECT_THAT(error_of([&] { f.tensors().at("g.i32").to_f32(got.data()); }),
                AllOf(HasSubstr("g.i32"), HasSubstr("I32")));
  }
}

// Releasing a copied tensor's pages (what loading without --mmap does) keeps its bytes: a mapped
// file reads them again from disk, a file read into memory is left alone (dropping its pages
// would zero them).
TEST_F(SafetensorsTest, ReleasedPagesReadBack) {
  std::vector<uint8_t> pad(3, 7);
  std::vector<float> big(5000);  // ~5 pages, starting off a page boundary
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f - 7.0f;
  const fs::path p = dir_ / "rel.safetensors";
  write_safetensors(p, {{"pad", DType::U8, {3}, as_bytes(pad)}, {"big", DType::F32, {5000}, as_bytes(big)}});
  for (bool use_mmap : {true, false}) {
    SCOPED_TRACE(use_mmap ? "mapped" : "read");
    SafetensorsFile f = SafetensorsFile::open(p, use_mmap);
    const TensorInfo& t = f.tensors().at("big");
    std::vector<float> got(big.size());
    t.to_f32(got.data());
    ASSERT_EQ(got, big);
    t.release(1000, 3000);  // the interior pages of a middle range
    t.release(0, big.size());
    t.release(4999, 5);     // out of range: ignored
    std::fill(got.begin(), got.end(), 0.0f);
    t.to_f32(got.data());
    EXPECT_EQ(got, big);
  }
}

TEST_F(SafetensorsTest, WriteRejectsWrongByteCount) {
  const std::vector<float> v = {1, 2, 3};
  EXPECT_THAT(error_of([&] {
                write_safetensors(dir_ / "x.safetensors", {{"w", DType::F32, {2, 2}, as_bytes(v)}});
              }),
              AllOf(HasSubstr("'w'"), HasSubstr("16 bytes"), HasSubstr("12")));
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
}

TEST_F(SafetensorsTest, SingleFileCheckpoint) {
  const std::vector<float> v = {1, 2};
  write_safetensors(dir_ / "model.safetensors", {{"w", DType::F32, {2}, as_bytes(v)}});
  Checkpoint ck = Checkpoint::open(dir_);
  EXPECT_EQ(ck.all().size(), 1u);
  ASSERT_NE(ck.find("w"), nullptr);
  EXPECT_EQ(ck.find("nope"), nullptr);
  // A copy stays valid after the original is gone.
  Checkpoint copy;
  {
    Checkpoint tmp = ck;
    copy = tmp;
  }
  std::vector<float> got(2);
  copy.get("w").to_f32(got.data());
  EXPECT_EQ(got, v);
}

// Two shards + an index written by hand.
void write_two_shards(const fs::path& dir, const std::string& index_json) {
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6};
  const std::vector<uint16_t> c = {f32_to_bf16(7.0f)};
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {{"layers.0.w", DType::F32, {2, 2}, as_bytes(a)},
                     {"layers.0.b", DType::F32, {2}, as_bytes(b)}});
  write_safetensors(dir / "model-00002-of-00002.safetensors",
                    {{"layers.1.w", DType::BF16, {1}, as_bytes(c)}});
  write_bytes(dir / "model.safetensors.index.json", index_json);
}

TEST_F(SafetensorsTest, ShardedCheckpoint) {
  write_two_shards(dir_, R"({"metadata": {"total_size": 26}, "weight_map": {
      "layers.0.w": "model-00001-of-00002.safetensors",
      "layers.0.b": "model-00001-of-00002.safetensors",
      "layers.1.w": "model-00002-of-00002.safetensors"}})");
  Checkpoint ck = Checkpoint::open(dir_);
  EXPECT_EQ(ck.all().size(), 3u);
  std::vector<float> got(4);
  ck.get("layers.0.w").to_f32(got.data());
  EXPECT_EQ(got, (std::vector<float>{1, 2, 3, 4}));
  ck.get("layers.1.w").to_f32(got.data());
  EXPECT_EQ(got[0], 7.0f);
  EXPECT_THAT(ck.get("layers.1.w").file, HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(SafetensorsTest, MissingTensorViaCheckpointGet) {
  const std::vector<float> v = {1};
  write_safetensors(dir_ / "model.safetensors", {{"w", DType::F32, {1}, as_bytes(v)}});
  Checkpoint ck = Checkpoint::open(dir_);
  EXPECT_EQ(error_of([&] { ck.get("lm_head.weight"); }),
            dir_.string() + ": missing tensor 'lm_head.weight'");
}

TEST_F(SafetensorsTest, EmptyDirectory) {
  EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
              AllOf(HasSubstr(dir_.string()), HasSubstr("no model.safetensors")));
}

TEST_F(SafetensorsTest, IndexNamesMissingShardFile) {
  write_two_shards(dir_, R"({"weight_map": {
      "layers.0.w": "model-00001-of-00002.safetensors",
      "layers.2.w": "model-00003-of-00003.safetensors"}})");
  EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
              AllOf(HasSubstr("model-00003-of-00003.safetensors"), HasSubstr("layers.2.w"),
                    HasSubstr("does not exist")));
}

TEST_F(SafetensorsTest, IndexShardMustBeAPlainFileName) {
  // The index must not be able to point outside the checkpoint directory.
  for (const char* shard : {"../model-00001-of-00002.safetensors", "/etc/passwd", "..", "sub/x.safetensors"}) {
    write_two_shards(dir_, std::string(R"({"weight_map": {"layers.0.w": ")") + shard + R"("}})");
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
                AllOf(HasSubstr(shard), HasSubstr("is not a plain file name")))
        << shard;
  }
}

TEST_F(SafetensorsTest, IndexNamesTensorAbsentFromShard) {
  write_two_shards(dir_, R"({"weight_map": {
      "layers.0.w": "model-00001-of-00002.safetensors",
      "layers.1.b": "model-00002-of-00002.safetensors"}})");
  EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
              AllOf(HasSubstr("'layers.1.b'"), HasSubstr("model-00002-of-00002.safetensors"),
                    HasSubstr("absent")));
}

TEST_F(SafetensorsTest, DuplicateTensorAcrossShards) {
  const std::vector<float> v = {1}, two = {1, 2};
  write_safetensors(dir_ / "s1.safetensors", {{"w", DType::F32, {1}, as_bytes(v)}});
  write_safetensors(dir_ / "s2.safetensors", {{"w", DType::F32, {1}, as_bytes(v)},
                                              {"v", DType::F32, {2}, as_bytes(two)}});
  write_bytes(dir_ / "model.safetensors.index.json",
              R"({"weight_map": {"w": "s1.safetensors", "v": "s2.safetensors"}})");
  EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
              AllOf(HasSubstr("'w'"), HasSubstr("s1.safetensors"), HasSubstr("s2.safetensors")));
}

// ---- malformed files -----------------------------------------------------------------------------

const char* kGoodHeader = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST_F(SafetensorsTest, ShorterThanEightBytes) {
  write_bytes(dir_ / "x.safetensors", std::string("\x05\x00\x00", 3));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("shorter than")));
}

TEST_F(SafetensorsTest, TruncatedInDataSection) {
  // The 8-byte tensor is cut after 5 bytes.
  write_bytes(dir_ / "x.safetensors", raw_file(kGoodHeader, std::string(5, '\1')));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("'w'"), HasSubstr("beyond"),
                    HasSubstr("truncated")));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  std::string bytes = raw_file(kGoodHeader, std::string(8, '\0'));
  const uint64_t n = 1000;  // the file is far shorter
  std::memcpy(bytes.data(), &n, 8);
  write_bytes(dir_ / "x.safetensors", bytes);
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("header length 1000"), HasSubstr("beyond the end")));
}

TEST_F(SafetensorsTest, HeaderLengthAbsurd) {
  std::string bytes = raw_file(kGoodHeader, "");
  const uint64_t n = ~uint64_t{0} - 4;  // 8 + n would wrap around
  std::memcpy(bytes.data(), &n, 8);
  write_bytes(dir_ / "x.safetensors", bytes);
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              HasSubstr("100 MiB"));
}

TEST_F(SafetensorsTest, MalformedJsonHeader) {
  write_bytes(dir_ / "x.safetensors",
              raw_file(R"({"w":{"dtype":"F32","shape":[2],)" "\n" R"("data_offsets":[0,8]})",
                       std::string(8, '\0')));
  const std::string msg = error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); });
  EXPECT_THAT(msg, AllOf(HasSubstr("x.safetensors"), HasSubstr("not valid JSON")));
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "messages are one line";
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  write_bytes(dir_ / "x.safetensors", raw_file("[1, 2]", ""));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              HasSubstr("not a JSON object"));
}

TEST_F(SafetensorsTest, EntryMissingFieldOrWrongType) {
  struct Case {
    const char* header;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"w":{"shape":[2],"data_offsets":[0,8]}})", "no 'dtype'"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", "no 'shape'"},
      {R"({"w":{"dtype":"F32","shape":[2]}})", "no 'data_offsets'"},
      {R"({"w":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", "'dtype' is not a string"},
      {R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", "'shape' is not an array"},
      {R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", "not an integer"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "two integers"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})", "non-negative integers"},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "negative dimension"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "begin 8 > end 0"},
      {R"({"w":[1,2]})", "not a JSON object"},
      {R"({"__metadata__":{"k":1}})", "'__metadata__' value for 'k' is not a string"},
      {R"({"__metadata__":[]})", "'__metadata__' is not a JSON object"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
           "w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "'w' twice"},
      {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
       "overflows"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(dir_ / "x.safetensors", raw_file(c.header, std::string(8, '\0')));
    EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
                AllOf(HasSubstr("x.safetensors"), HasSubstr(c.expect)));
  }
}

TEST_F(SafetensorsTest, UnknownDtype) {
  write_bytes(dir_ / "x.safetensors",
              raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})",
                       std::string(8, '\0')));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("'w'"), HasSubstr("unknown dtype 'F8_E4M3'")));
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  write_bytes(dir_ / "x.safetensors",
              raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                       std::string(16, '\0')));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("'w'"), HasSubstr("[16, 24]"), HasSubstr("beyond the 16-byte")));
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  write_bytes(dir_ / "x.safetensors",
              raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       std::string(12, '\0')));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("'a'"), HasSubstr("'b'"), HasSubstr("overlapping")));
}

TEST_F(SafetensorsTest, ShapeBytesMismatch) {
  write_bytes(dir_ / "x.safetensors",
              raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                       std::string(8, '\0')));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir_ / "x.safetensors"); }),
              AllOf(HasSubstr("'w'"), HasSubstr("12 bytes"), HasSubstr("span 8")));
}

TEST_F(SafetensorsTest, HandWrittenGoodFileWithPaddingAndUnalignedData) {
  // Header padded with trailing spaces (allowed), length 57: data starts at an odd address.
  std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  h += std::string(57 - h.size(), ' ');
  float v[2] = {3.5f, -1.0f};
  write_bytes(dir_ / "x.safetensors", raw_file(h, std::string(reinterpret_cast<char*>(v), 8)));
  SafetensorsFile f = SafetensorsFile::open(dir_ / "x.safetensors");
  float got[2];
  f.tensors().at("w").to_f32(got);
  EXPECT_EQ(got[0], 3.5f);
  EXPECT_EQ(got[1], -1.0f);
}

}  // namespace
}  // namespace hybridlm
