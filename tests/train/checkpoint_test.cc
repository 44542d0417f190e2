// Checkpoint directories appear whole or not at all: written, replaced, refused (unwritable
// directory, a full disk simulated with RLIMIT_FSIZE) with nothing left behind; trainer state
// round-trips and the latest checkpoint is found by its step.
#include "train/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>

#include "base/error.h"
#include "token_dir.h"

// While set, renameat2 answers EINVAL, as on a filesystem without RENAME_EXCHANGE: this binary's
// definition takes the place of the C library's for write_checkpoint (an executable's symbols
// come first), so the rename-aside fallback runs.
static bool g_no_rename_exchange = false;
static int g_exchanges_refused = 0;
extern "C" int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                         unsigned int flags) noexcept {
  if (g_no_rename_exchange) {
    ++g_exchanges_refused;
    errno = EINVAL;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags));
}

namespace hybridlm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::scratch_dir("checkpoint"); }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_);
  }

  // Every entry of dir, by name.
  static std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

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

std::span<const uint8_t> bytes_of(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

TEST_F(CheckpointTest, WritesEveryFileAndReadsBack) {
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, m = {0.5f, -0.5f};
  const std::vector<TensorToWrite> model = {{"model.embed_tokens.weight", DType::F32, {3, 2}, bytes_of(w)}};
  const std::vector<TensorToWrite> opt = {{"m.0", DType::F32, {2}, bytes_of(m)}};
  TrainerState st;
  st.step = 120;
  st.tokens = 120 * 4096;
  st.seed = 7;
  st.elapsed_s = 12.5;
  st.loss = 3.25;
  write_checkpoint(dir_ / "run", "step-120",
                   {CheckpointFile::text("config.json", "{\"model_type\": \"hybridlm\"}\n"),
                    CheckpointFile::safetensors("model.safetensors", model, {{"format", "pt"}}),
                    CheckpointFile::text("trainer_state.json", trainer_state_json(st)),
                    CheckpointFile::safetensors("optimizer.safetensors", opt)});
  const fs::path ck = dir_ / "run/step-120";
  EXPECT_EQ(listing(dir_ / "run"), std::vector<std::string>{"step-120"});  // no temporaries left
  EXPECT_EQ(listing(ck), (std::vector<std::string>{"config.json", "model.safetensors", "optimizer.safetensors",
                                                   "trainer_state.json"}));
  EXPECT_EQ(testing::read_file(ck / "config.json"), "{\"model_type\": \"hybridlm\"}\n");

  const SafetensorsFile f = SafetensorsFile::open(ck / "model.safetensors");
  const TensorInfo& t = f.tensors().at("model.embed_tokens.weight");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 2}));
  std::vector<float> got(6);
  t.to_f32(got.data());
  EXPECT_EQ(got, w);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(SafetensorsFile::open(ck / "optimizer.safetensors").tensors().at("m.0").nbytes, 8u);

  const TrainerState back = read_trainer_state(ck);
  EXPECT_EQ(back.step, 120);
  EXPECT_EQ(back.tokens, 120 * 4096);
  EXPECT_EQ(back.seed, 7u);
  EXPECT_DOUBLE_EQ(back.elapsed_s, 12.5);
  EXPECT_EQ(back.loss, 3.25);
  EXPECT_EQ(back.val_loss, std::nullopt);
}

TEST_F(CheckpointTest, ReplacesAnExistingCheckpointWhole) {
  write_checkpoint(dir_, "latest", {CheckpointFile::text("a.txt", "old a"), CheckpointFile::text("b.txt", "old b")});
  write_checkpoint(dir_, "latest", {CheckpointFile::text("a.txt", "new a")});
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"latest"});
  EXPECT_EQ(listing(dir_ / "latest"), std::vector<std::string>{"a.txt"});  // b.txt went with the old one
  EXPECT_EQ(testing::read_file(dir_ / "latest/a.txt"), "new a");

  // Leftovers of a killed writer of this name are cleared; other names are not touched.
  fs::create_directories(dir_ / ".tmp-latest-999999/x");
  fs::create_directories(dir_ / ".old-latest-999999");
  fs::create_directories(dir_ / ".tmp-other-999999");
  write_checkpoint(dir_, "latest", {CheckpointFile::text("a.txt", "newer a")});
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{".tmp-other-999999", "latest"}));
  EXPECT_EQ(testing::read_file(dir_ / "latest/a.txt"), "newer a");
}

// Where the filesystem cannot swap two directories, the old checkpoint is renamed aside, the new
// one renamed into place, and the old one removed: the same result, nothing left over.
TEST_F(CheckpointTest, ReplacesWithoutRenameExchange) {
  write_checkpoint(dir_, "latest", {CheckpointFile::text("a.txt", "old a"), CheckpointFile::text("b.txt", "old b")});
  g_no_rename_exchange = true;
  write_checkpoint(dir_, "latest", {CheckpointFile::text("a.txt", "new a")});
  write_checkpoint(dir_, "latest", {CheckpointFile::text("c.txt", "newer c")});
  g_no_rename_exchange = false;
  EXPECT_EQ(g_exchanges_refused, 2);  // both replacements took the fallback
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"latest"});
  EXPECT_EQ(listing(dir_ / "latest"), std::vector<std::string>{"c.txt"});
  EXPECT_EQ(testing::read_file(dir_ / "latest/c.txt"), "newer c");
}

// keep_checkpoints: of the steps below the one just saved, the newest keep - 1 stay; higher steps
// (an earlier, longer run in the same directory) and other names are not touched.
TEST_F(CheckpointTest, PruneKeepsTheOneJustSavedAndHigherSteps) {
  for (const char* d : {"step-90", "step-100", "step-110", "step-200", "init", "step-x"})
    fs::create_directories(dir_ / d);
  EXPECT_EQ(prune_checkpoints(dir_, 2, 110), std::vector<std::string>{"step-90"});
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"init", "step-100", "step-110", "step-200", "step-x"}));
  EXPECT_EQ(prune_checkpoints(dir_, 1, 110), std::vector<std::string>{"step-100"});
  EXPECT_EQ(prune_checkpoints(dir_, 0, 200), std::vector<std::string>{});
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"init", "step-110", "step-200", "step-x"}));
}

TEST_F(CheckpointTest, UnwritableDirectoryLeavesNothing) {
  // A regular file where the output directory should be: mkdir fails even for root.
  testing::write_file(dir_ / "file", "x");
  EXPECT_THAT(error_of([&] { write_checkpoint(dir_ / "file/out", "c", {CheckpointFile::text("a", "b")}); }),
              HasSubstr((dir_ / "file/out").string() + ": cannot create the output directory: "));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"file"});
}

TEST_F(CheckpointTest, ReadOnlyDirectoryLeavesNothing) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a 0500 directory";
  write_checkpoint(dir_ / "out", "c", {CheckpointFile::text("a", "old")});
  fs::permissions(dir_ / "out", fs::perms::owner_read | fs::perms::owner_exec);
  const std::string tmp = (dir_ / "out" / (".tmp-c-" + std::to_string(::getpid()))).string();
  EXPECT_EQ(error_of([&] { write_checkpoint(dir_ / "out", "c", {CheckpointFile::text("a", "new")}); }),
            tmp + ": cannot create: Permission denied");
  fs::permissions(dir_ / "out", fs::perms::owner_all);
  EXPECT_EQ(listing(dir_ / "out"), std::vector<std::string>{"c"});
  EXPECT_EQ(testing::read_file(dir_ / "out/c/a"), "old");
}

// A full disk, as far as this process can tell: RLIMIT_FSIZE makes a write past the limit fail
// with EFBIG once SIGXFSZ is ignored. In a child process, so the limit binds nothing else.
TEST_F(CheckpointTest, FullDiskLeavesTheOldCheckpointAndNoTemporary) {
  write_checkpoint(dir_, "c", {CheckpointFile::text("small", "old")});
  const std::vector<float> big(4096, 1.0f);  // 16 KiB, over the 8 KiB limit
  const std::vector<TensorToWrite> ts = {{"w", DType::F32, {4096}, bytes_of(big)}};
  const std::string expect = (dir_ / (".tmp-c-")).string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 8192;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(2);
    try {
      write_checkpoint(dir_, "c", {CheckpointFile::text("small", "new"), CheckpointFile::safetensors("w.st", ts)});
    } catch (const Error& e) {
      const std::string m = e.what();
      // "<dir>/.tmp-c-<pid>/w.st: write failed: File too large"
      const bool named = m.starts_with(expect) && m.ends_with("/w.st: write failed: File too large");
      ::_exit(named ? 0 : 3);
    }
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: setrlimit failed, 3: wrong message, 4: no error";
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"c"});
  EXPECT_EQ(listing(dir_ / "c"), std::vector<std::string>{"small"});
  EXPECT_EQ(testing::read_file(dir_ / "c/small"), "old");
}

TEST_F(CheckpointTest, RefusesNamesOutsideTheDirectory) {
  EXPECT_THAT(error_of([&] { write_checkpoint(dir_, "../x", {}); }), HasSubstr("checkpoint name '../x'"));
  EXPECT_THAT(error_of([&] { write_checkpoint(dir_, ".hidden", {}); }), HasSubstr("checkpoint name '.hidden'"));
  EXPECT_THAT(error_of([&] { write_checkpoint(dir_, "", {}); }), HasSubstr("checkpoint name ''"));
  EXPECT_THAT(error_of([&] { write_checkpoint(dir_, "c", {CheckpointFile::text("a/b", "")}); }),
              HasSubstr("checkpoint file name 'a/b'"));
  EXPECT_EQ(error_of([&] {
              write_checkpoint(dir_, "c", {CheckpointFile::text("a", ""), CheckpointFile::text("a", "")});
            }),
            "checkpoint file 'a' given twice");
  // A tensor whose bytes do not match its shape is refused before anything is written.
  const std::vector<float> v(3);
  EXPECT_THAT(error_of([&] { CheckpointFile::safetensors("m.safetensors", {{"w", DType::F32, {4}, bytes_of(v)}}); }),
              HasSubstr("m.safetensors: tensor 'w': shape [4] x F32 is 16 bytes but 12 were given"));
  EXPECT_TRUE(listing(dir_).empty());
}

TEST_F(CheckpointTest, TrainerStateErrorsAndLatest) {
  EXPECT_EQ(error_of([] { parse_trainer_state("{\"format\": \"x\"}", "s.json"); }),
            "s.json: not a trainer state (\"format\": \"hybridlm-trainer-state\")");
  EXPECT_EQ(error_of([] { parse_trainer_state("{\"format\": 5}", "s.json"); }),
            "s.json: not a trainer state (\"format\": \"hybridlm-trainer-state\")");
  EXPECT_EQ(error_of([] { parse_trainer_state(R"({"format": "hybridlm-trainer-state"})", "s.json"); }),
            "s.json: version missing (this build reads version 1)");
  EXPECT_EQ(error_of([] {
              parse_trainer_state(R"({"format": "hybridlm-trainer-state", "version": 1, "step": -3})", "s.json");
            }),
            "s.json: step -3: expected an integer >= 0");
  EXPECT_EQ(error_of([] { parse_trainer_state(R"({"format": "hybridlm-trainer-state", "version": 2})", "s.json"); }),
            "s.json: version 2 (this build reads version 1)");
  // NaN has no JSON form: written as null.
  TrainerState nan_loss;
  nan_loss.loss = std::nan("");
  EXPECT_EQ(parse_trainer_state(trainer_state_json(nan_loss), "s").loss, std::nullopt);

  EXPECT_EQ(latest_checkpoint(dir_), std::nullopt);
  for (int64_t step : {100, 300, 200}) {
    TrainerState s;
    s.step = step;
    write_checkpoint(dir_, "step-" + std::to_string(step), {CheckpointFile::text(kTrainerStateFile, trainer_state_json(s))});
  }
  fs::create_directories(dir_ / "not-a-checkpoint");
  EXPECT_EQ(latest_checkpoint(dir_), dir_ / "step-300");
  testing::write_file(dir_ / "step-200" / kTrainerStateFile, "{");
  EXPECT_THAT(error_of([&] { latest_checkpoint(dir_); }), HasSubstr("step-200/trainer_state.json: malformed JSON"));
}

}  // namespace
}  // namespace hybridlm
