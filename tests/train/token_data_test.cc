// Token files of prepare-data: loading and every refusal; the training sampler as a pure function
// of (seed, step, micro, rank, row) inside the file's bounds; the validation walk.
#include "train/token_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "base/error.h"
#include "token_dir.h"

namespace hybridlm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TokenData : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::scratch_dir("token_data"); }
  void TearDown() override { fs::remove_all(dir_); }

  // The message of the Error f throws ("" and a failure if none).
  template <class F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << "not one line: " << m;
      return m;
    }
    ADD_FAILURE() << "no error";
    return "";
  }

  fs::path dir_;
};

std::vector<uint32_t> iota_ids(size_t n, uint32_t first, uint32_t modulo) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (first + static_cast<uint32_t>(i)) % modulo;
  return v;
}

TEST_F(TokenData, ReadsUint16AndUint32Files) {
  testing::write_token_dir(dir_ / "a", {0, 1, 65535, 7}, {3, 2}, 2, 65536);
  const TokenFile a = TokenFile::open(dir_ / "a/train.bin", 65536);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a[2], 65535);
  int32_t out[3];
  a.copy(1, 3, out);
  EXPECT_THAT(out, ::testing::ElementsAre(1, 65535, 7));
  EXPECT_EQ(TokenFile::open(dir_ / "a/val.bin", 65536).size(), 2u);

  testing::write_token_dir(dir_ / "b", {70000, 1, 99999}, {5}, 4, 100000);
  const TokenFile b = TokenFile::open(dir_ / "b/train.bin", 100000);
  b.copy(0, 3, out);
  EXPECT_THAT(out, ::testing::ElementsAre(70000, 1, 99999));

  const TokenIndex ix = read_token_index(dir_ / "b");
  EXPECT_EQ(ix.width, 4);
  EXPECT_EQ(ix.vocab_size, 100000);
  EXPECT_EQ(ix.eos_id, 0);
  EXPECT_EQ(ix.train.tokens, 3u);
  EXPECT_EQ(ix.val.file, "val.bin");
}

TEST_F(TokenData, Errors) {
  testing::write_token_dir(dir_, {1, 2, 3, 4, 5}, {}, 2, 16);
  const std::string d = dir_.string();
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "nope.bin", 16); }), d + "/nope.bin: no such token file");
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "val.bin", 16); }), d + "/val.bin: empty file (no tokens)");
  // The model's vocabulary is smaller than an id in the file: named by its offset.
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 4); }),
            d + "/train.bin: token 4 at offset 3 (in tokens) is outside the vocabulary of 4");
  testing::write_file(dir_ / "train.bin", std::string(7, '\0'));
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }),
            d + "/train.bin: 7 bytes is not a whole number of 2-byte token ids");
  testing::write_file(dir_ / "train.bin", std::string(8, '\0'));
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }),
            d + "/train.bin: 4 tokens, but index.json says 5");
  testing::write_file(dir_ / "other.bin", std::string(8, '\0'));
  EXPECT_THAT(error_of([&] { TokenFile::open(dir_ / "other.bin", 16); }),
              HasSubstr("other.bin: not a split of " + d + "/index.json (it lists train.bin and val.bin)"));
  fs::create_directories(dir_ / "dir.bin");
  EXPECT_THAT(error_of([&] { TokenFile::open(dir_ / "dir.bin", 16); }), HasSubstr("dir.bin: not a split"));

  testing::write_file(dir_ / "index.json", R"({"format": "hybridlm-tokens", "version": 1, "dtype": "int8"})");
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }),
            d + "/index.json: dtype \"int8\": expected uint16 or uint32");
  testing::write_file(dir_ / "index.json", R"({"format": 5})");
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }),
            d + "/index.json: not an index of hybridlm token files (\"format\": \"hybridlm-tokens\")");
  testing::write_file(dir_ / "index.json", R"({"format": "hybridlm-tokens"})");
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }),
            d + "/index.json: missing \"version\" (the format version)");
  testing::write_file(dir_ / "index.json", "{");
  EXPECT_THAT(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }), HasSubstr("index.json: malformed JSON"));
  fs::remove(dir_ / "index.json");
  EXPECT_EQ(error_of([&] { TokenFile::open(dir_ / "train.bin", 16); }),
            d + "/index.json: missing (token files come with the index.json of `hybridlm prepare-data`)");
}

TEST_F(TokenData, TooShortForOneWindow) {
  testing::write_token_dir(dir_, iota_ids(8, 0, 16), iota_ids(4, 0, 16), 2, 16);
  const TokenFile train = TokenFile::open(dir_ / "train.bin", 16);
  const TokenFile val = TokenFile::open(dir_ / "val.bin", 16);
  EXPECT_NO_THROW(BatchSampler(train, 7, 1));
  EXPECT_EQ(error_of([&] { BatchSampler(train, 8, 1); }),
            (dir_ / "train.bin").string() + ": 8 tokens, fewer than seq_len + 1 = 9 (one window)");
  EXPECT_EQ(error_of([&] { EvalWindows(val, 4, 2, 0); }),
            (dir_ / "val.bin").string() + ": 4 tokens, fewer than seq_len + 1 = 5 (one window)");
}

TEST_F(TokenData, BatchesAreAPureFunctionOfSeedStepMicroRankRow) {
  const int L = 16, B = 4;
  testing::write_token_dir(dir_, iota_ids(5000, 0, 1000), {1}, 2, 1000);
  const TokenFile data = TokenFile::open(dir_ / "train.bin", 1000);
  const BatchSampler run(data, L, 7);
  std::vector<int32_t> a(B * (L + 1)), b(B * (L + 1));

  // An uninterrupted run, and one resumed at step 5 with a fresh sampler: the same batches.
  std::map<std::pair<uint64_t, int>, std::vector<int32_t>> first;
  for (uint64_t step = 0; step < 10; ++step)
    for (int micro = 0; micro < 2; ++micro) {
      run.batch(step, micro, 0, B, a.data());
      first[{step, micro}] = a;
    }
  const BatchSampler resumed(data, L, 7);
  for (uint64_t step = 5; step < 10; ++step)
    for (int micro = 0; micro < 2; ++micro) {
      resumed.batch(step, micro, 0, B, b.data());
      EXPECT_EQ(b, (first[{step, micro}])) << "step " << step << " micro " << micro;
    }

  // Each field of the tuple changes the windows; so does the seed.
  std::set<size_t> starts;
  for (uint64_t step = 0; step < 3; ++step)
    for (int micro = 0; micro < 3; ++micro)
      for (int rank = 0; rank < 3; ++rank)
        for (int row = 0; row < 3; ++row) starts.insert(run.window_start(step, micro, rank, row));
  EXPECT_GE(starts.size(), 75u);  // 81 draws from 4984 starts: a handful of collisions at most
  const BatchSampler other_seed(data, L, 8);
  int same = 0;
  for (int row = 0; row < 50; ++row) same += run.window_start(3, 0, 0, row) == other_seed.window_start(3, 0, 0, row);
  EXPECT_LE(same, 2);

  // Row r holds the window at window_start(.., r): inputs and the targets shifted by one.
  run.batch(4, 1, 2, B, a.data());
  for (int r = 0; r < B; ++r) {
    const size_t s = run.window_start(4, 1, 2, r);
    for (int t = 0; t <= L; ++t) ASSERT_EQ(a[r * (L + 1) + t], data[s + t]);
  }
}

TEST_F(TokenData, WindowsStayInBoundsAndReachEveryStart) {
  // 20 tokens, seq_len 16: starts 0..3 only.
  testing::write_token_dir(dir_, iota_ids(20, 0, 20), {1}, 4, 20);
  const TokenFile data = TokenFile::open(dir_ / "train.bin", 20);
  const BatchSampler s(data, 16, 123);
  std::map<size_t, int> count;
  for (uint64_t step = 0; step < 4000; ++step) ++count[s.window_start(step, 0, 0, 0)];
  ASSERT_EQ(count.size(), 4u);
  EXPECT_EQ(count.begin()->first, 0u);
  EXPECT_EQ(count.rbegin()->first, 3u);
  for (const auto& [start, n] : count) EXPECT_NEAR(n, 1000, 150) << "start " << start;

  // The smallest file: exactly one window.
  testing::write_token_dir(dir_ / "one", iota_ids(17, 0, 20), {1}, 2, 20);
  const TokenFile one = TokenFile::open(dir_ / "one/train.bin", 20);
  const BatchSampler s1(one, 16, 5);
  std::vector<int32_t> ids(3 * 17);
  s1.batch(99, 3, 1, 3, ids.data());
  for (int r = 0; r < 3; ++r)
    for (int t = 0; t < 17; ++t) ASSERT_EQ(ids[r * 17 + t], t);
}

TEST_F(TokenData, EvalWindowsWalkTheFileInFixedWindows) {
  // 23 tokens, seq_len 5: windows at 0, 5, 10, 15 (each 6 tokens); token 21 is the last target.
  testing::write_token_dir(dir_, {1}, iota_ids(23, 0, 100), 2, 100);
  const TokenFile val = TokenFile::open(dir_ / "val.bin", 100);
  EvalWindows all(val, 5, 3, 0);
  EXPECT_EQ(all.windows(), 4);
  EXPECT_EQ(all.batches(), 2);
  std::vector<int32_t> ids(3 * 6, -1);
  ASSERT_EQ(all.next(ids.data()), 3);
  for (int r = 0; r < 3; ++r)
    for (int t = 0; t < 6; ++t) EXPECT_EQ(ids[r * 6 + t], 5 * r + t);
  ASSERT_EQ(all.next(ids.data()), 1);  // the short last batch
  for (int t = 0; t < 6; ++t) EXPECT_EQ(ids[t], 15 + t);
  EXPECT_EQ(all.next(ids.data()), 0);
  all.reset();
  ASSERT_EQ(all.next(ids.data()), 3);
  EXPECT_EQ(ids[0], 0);

  // At most one batch of 2: windows spread over the file (0 and 2 of 4), the same every time.
  EvalWindows some(val, 5, 2, 1);
  EXPECT_EQ(some.windows(), 2);
  ASSERT_EQ(some.next(ids.data()), 2);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[6], 10);
  EXPECT_EQ(some.next(ids.data()), 0);
}

}  // namespace
}  // namespace hybridlm
