// .npy writer: byte-level checks of the format, then an independent read with numpy itself.
#include "io/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/error.h"

namespace hybridlm {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::path(::testing::TempDir()) /
         ("hybridlm_npy_" + std::to_string(::getpid()) + "_" + name);
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(Npy, FormatBytes) {
  const fs::path p = temp_path("a.npy");
  const std::vector<float> v = {0.5f, -1.0f, 2.0f, 3.25f, -4.0f, 1e-6f};
  write_npy_f32(p, v.data(), {2, 3});
  const std::string b = read_all(p);
  ASSERT_GE(b.size(), 10u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = static_cast<uint8_t>(b[8]) | (static_cast<uint8_t>(b[9]) << 8);
  const size_t data_start = 10 + hlen;
  EXPECT_EQ(data_start % 64, 0u);
  ASSERT_EQ(b.size(), data_start + v.size() * 4);
  const std::string header = b.substr(10, hlen);
  EXPECT_THAT(header, HasSubstr("'descr': '<f4'"));
  EXPECT_THAT(header, HasSubstr("'fortran_order': False"));
  EXPECT_THAT(header, HasSubstr("'shape': (2, 3)"));
  EXPECT_EQ(header.back(), '\n');
  std::vector<float> got(v.size());
  std::memcpy(got.data(), b.data() + data_start, v.size() * 4);
  EXPECT_EQ(got, v);

  // Independent check: numpy reads the same shape, dtype and values.
  const std::string cmd =
      "/usr/bin/python3 -c \"import numpy,sys; a=numpy.load(sys.argv[1]); "
      "assert a.dtype==numpy.dtype('<f4'), a.dtype; assert a.shape==(2,3), a.shape; "
      "assert not numpy.isfortran(a); "
      "assert (a==numpy.array([[0.5,-1,2],[3.25,-4,1e-6]],dtype='<f4')).all(), a\" '" +
      p.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove(p);
}

TEST(Npy, OneDimAndScalarShapes) {
  const float v[3] = {1, 2, 3};
  const fs::path p1 = temp_path("one.npy"), p0 = temp_path("scalar.npy");
  write_npy_f32(p1, v, {3});
  EXPECT_THAT(read_all(p1), HasSubstr("'shape': (3,)"));
  write_npy_f32(p0, v, {});
  EXPECT_THAT(read_all(p0), HasSubstr("'shape': ()"));
  const std::string cmd =
      "/usr/bin/python3 -c \"import numpy,sys; a=numpy.load(sys.argv[1]); b=numpy.load(sys.argv[2]); "
      "assert a.shape==(3,) and list(a)==[1,2,3]; assert b.shape==() and b==1\" '" + p1.string() +
      "' '" + p0.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove(p1);
  fs::remove(p0);
}

TEST(Npy, UnwritablePathThrows) {
  const float v = 1;
  const fs::path p = temp_path("no_such_dir") / "x.npy";
  try {
    write_npy_f32(p, &v, {1});
    ADD_FAILURE() << "expected hybridlm::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(p.string()));
    EXPECT_THAT(e.what(), HasSubstr("cannot create"));
  }
}

}  // namespace
}  // namespace hybridlm
