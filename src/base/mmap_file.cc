#include "base/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace hybridlm {

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path, bool use_mmap) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path.string() + ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ == 0) {
    ::close(fd);
    return f;
  }
  if (use_mmap) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      ::close(fd);
      f->data_ = static_cast<const uint8_t*>(p);
      f->mapped_ = true;
      return f;
    }
    // A file system that cannot map files: read it whole, as without use_mmap.
  }
  f->owned_.reset(new uint8_t[f->size_]);
  size_t done = 0;
  while (done < f->size_) {
    ssize_t n = ::read(fd, f->owned_.get() + done, f->size_ - done);
    if (n <= 0) {
      ::close(fd);
      throw Error(path.string() + ": read failed");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  f->data_ = f->owned_.get();
  return f;
}

void MappedFile::release(const uint8_t* p, size_t n) const {
  if (!mapped_ || p < data_ || n == 0 || p + n > data_ + size_) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  // A read-only private mapping never written: its pages come back unchanged from the file.
  if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (mapped_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace hybridlm
