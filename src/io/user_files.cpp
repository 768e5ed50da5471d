#include "hyperparallel/io/user_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::io {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a folder";
  return "not a regular file";
}

}  // namespace

OpenedFile open_user_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw UserError("cannot read " + what + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw UserError(what + " " + path + " is " + kind_of(st.st_mode) + "; it must be a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw UserError("cannot read " + what + " " + path + ": " + std::strerror(errno));
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // swapped in between
    ::close(fd);
    throw UserError(what + " " + path + " is not a regular file");
  }
  return {fd, static_cast<uint64_t>(st.st_size)};
}

std::string read_user_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const OpenedFile file = open_user_file(path, what);
  const int fd = file.fd;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const uint64_t size = file.size;
  if (size > max_bytes) {
    throw UserError(what + " " + path + " is " + std::to_string(size) + " bytes; at most " + std::to_string(max_bytes) +
                    " are read for it");
  }
  std::string text(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    const ssize_t got = ::read(fd, text.data() + done, size - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw UserError("cannot read " + what + " " + path + ": " + std::strerror(errno));
    if (got == 0) break;  // shrank while reading
    done += static_cast<uint64_t>(got);
  }
  text.resize(done);
  return text;
}

bool json_nesting_within(const char* text, uint64_t length, int limit) {
  int depth = 0;
  bool in_string = false;
  for (uint64_t i = 0; i < length; ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

nlohmann::json parse_user_json(const std::string& text, const std::string& where, int max_depth) {
  if (!json_nesting_within(text.data(), text.size(), max_depth)) {
    throw UserError(where + " nests JSON deeper than " + std::to_string(max_depth) + " levels");
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(where + " is not valid JSON (" + e.what() + ")");
  }
}

nlohmann::json read_user_json(const std::string& path, uint64_t max_bytes, const std::string& what) {
  return parse_user_json(read_user_file(path, max_bytes, what), path, kMaxUserJsonDepth);
}

}  // namespace hyperparallel::io
