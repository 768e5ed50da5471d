// The compact row store and its file. See token_rows.h.
#include "hyperparallel/data/token_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

constexpr char kMagic[8] = {'H', 'P', 'R', 'O', 'W', 'S', '\0', '\1'};
constexpr uint64_t kHeaderBytes = 64;
constexpr uint8_t kLabelled = 1, kRestart = 2;
constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;

struct Header {
  char magic[8];
  uint64_t rows, tokens, meta_bytes, reserved[4];
};
static_assert(sizeof(Header) == kHeaderBytes, "the file header is 64 bytes");

// Bytes of the sections after the header, and the offset of each.
struct Layout {
  uint64_t offsets_at, ids_at, marks_at, meta_at, end;
};

Layout layout_of(uint64_t rows, uint64_t tokens, uint64_t meta_bytes) {
  Layout l{};
  l.offsets_at = kHeaderBytes;
  l.ids_at = l.offsets_at + (rows + 1) * 8;
  l.marks_at = l.ids_at + tokens * 4;
  l.meta_at = l.marks_at + tokens;
  l.end = l.meta_at + meta_bytes;
  return l;
}

}  // namespace

// The rows of one dataset: owned vectors, or views into a mapped file.
struct TokenRows::Store {
  const uint64_t* offsets = nullptr;
  const int32_t* ids = nullptr;
  const uint8_t* marks = nullptr;
  int64_t rows = 0, tokens = 0, max_id = -1;
  std::string meta;
  // owned
  std::vector<uint64_t> own_offsets{0};
  std::vector<int32_t> own_ids;
  std::vector<uint8_t> own_marks;
  // mapped
  void* map = nullptr;
  size_t map_bytes = 0;

  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store() {
    if (map) ::munmap(map, map_bytes);
  }
  void point_at_owned() {
    offsets = own_offsets.data();
    ids = own_ids.data();
    marks = own_marks.data();
    rows = static_cast<int64_t>(own_offsets.size()) - 1;
    tokens = static_cast<int64_t>(own_ids.size());
  }
};

TokenRows::TokenRows() {
  auto store = std::make_shared<Store>();
  store->point_at_owned();
  store_ = store;
}

TokenRows::TokenRows(std::shared_ptr<const Store> store) : store_(std::move(store)) {}

TokenRows TokenRows::from_rows(const std::vector<TrainingRow>& rows, std::string meta) {
  auto store = std::make_shared<Store>();
  size_t total = 0;
  for (const TrainingRow& row : rows) total += row.input_ids.size();
  store->own_ids.reserve(total);
  store->own_marks.reserve(total);
  store->own_offsets.reserve(rows.size() + 1);
  for (size_t r = 0; r < rows.size(); ++r) {
    const TrainingRow& row = rows[r];
    const size_t n = row.input_ids.size();
    if (row.labels.size() != n || row.position_ids.size() != n) {
      throw std::logic_error("TokenRows: row " + std::to_string(r) + " has ids, labels and positions of different lengths");
    }
    for (size_t t = 0; t < n; ++t) {
      const int64_t id = row.input_ids[t], label = row.labels[t], position = row.position_ids[t];
      if (id < 0 || id > kMaxId) throw std::logic_error("TokenRows: row " + std::to_string(r) + " has id " + std::to_string(id));
      if (label != kIgnoreLabel && label != id) {
        throw std::logic_error("TokenRows: row " + std::to_string(r) + " labels token " + std::to_string(t) + " with another id");
      }
      const bool restart = position == 0;
      if (!restart && (t == 0 || position != row.position_ids[t - 1] + 1)) {
        throw std::logic_error("TokenRows: row " + std::to_string(r) + " has positions that neither count up nor restart at 0");
      }
      store->own_ids.push_back(static_cast<int32_t>(id));
      store->own_marks.push_back(static_cast<uint8_t>((label != kIgnoreLabel ? kLabelled : 0) | (restart ? kRestart : 0)));
      store->max_id = std::max(store->max_id, id);
    }
    store->own_offsets.push_back(store->own_ids.size());
  }
  store->meta = std::move(meta);
  store->point_at_owned();
  return TokenRows(std::move(store));
}

TokenRows TokenRows::open(const std::string& path) {
  const auto bad = [&path](const std::string& why) {
    return UserError(path + ": not a usable tokenized-rows file (" + why +
                     "); delete it so it is made again");
  };
  const io::OpenedFile file = io::open_user_file(path, "tokenized rows");
  const int fd = file.fd;
  const uint64_t size = file.size;
  if (size < kHeaderBytes) {
    ::close(fd);
    throw bad("shorter than its header");
  }
  auto store = std::make_shared<Store>();
  store->map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (store->map == MAP_FAILED) {
    store->map = nullptr;
    throw UserError(path + ": cannot be mapped (" + std::strerror(errno) + ")");
  }
  store->map_bytes = size;
  const char* base = static_cast<const char*>(store->map);
  Header h;
  std::memcpy(&h, base, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) throw bad("it does not start with HPROWS");
  const uint64_t limit = size;  // every count must fit in the file, which also bounds the arithmetic below
  if (h.rows >= limit / 8 || h.tokens > limit || h.meta_bytes > limit) throw bad("its counts exceed its size");
  const Layout l = layout_of(h.rows, h.tokens, h.meta_bytes);
  if (l.end != size) throw bad("it holds " + std::to_string(size) + " bytes, its header says " + std::to_string(l.end));
  store->offsets = reinterpret_cast<const uint64_t*>(base + l.offsets_at);
  store->ids = reinterpret_cast<const int32_t*>(base + l.ids_at);
  store->marks = reinterpret_cast<const uint8_t*>(base + l.marks_at);
  store->rows = static_cast<int64_t>(h.rows);
  store->tokens = static_cast<int64_t>(h.tokens);
  if (store->offsets[0] != 0 || store->offsets[h.rows] != h.tokens) throw bad("its row offsets do not cover its tokens");
  for (uint64_t r = 0; r < h.rows; ++r) {
    if (store->offsets[r + 1] < store->offsets[r]) throw bad("its row offsets go backwards at row " + std::to_string(r));
  }
  for (uint64_t t = 0; t < h.tokens; ++t) {
    if (store->ids[t] < 0) throw bad("token " + std::to_string(t) + " has the negative id " + std::to_string(store->ids[t]));
    store->max_id = std::max<int64_t>(store->max_id, store->ids[t]);
  }
  store->meta.assign(base + l.meta_at, h.meta_bytes);
  return TokenRows(std::move(store));
}

void TokenRows::save(const std::string& path) const {
  const int64_t n = size();
  std::vector<uint64_t> offsets{0};
  offsets.reserve(static_cast<size_t>(n) + 1);
  for (int64_t i = 0; i < n; ++i) offsets.push_back(offsets.back() + static_cast<uint64_t>(length(i)));
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.rows = static_cast<uint64_t>(n);
  h.tokens = offsets.back();
  h.meta_bytes = store_->meta.size();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(offsets.data()), static_cast<std::streamsize>(offsets.size() * 8));
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t at = store_->offsets[stored(i)];
      out.write(reinterpret_cast<const char*>(store_->ids + at), length(i) * 4);
    }
    for (int64_t i = 0; i < n; ++i) {
      out.write(reinterpret_cast<const char*>(store_->marks + store_->offsets[stored(i)]), length(i));
    }
    out.write(store_->meta.data(), static_cast<std::streamsize>(store_->meta.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw UserError(tmp + ": cannot be written (a missing folder or a full disk?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw UserError(path + ": cannot be written (" + why + ")");
  }
}

int64_t TokenRows::size() const { return selected_ ? static_cast<int64_t>(order_.size()) : store_->rows; }

int64_t TokenRows::stored(int64_t i) const { return selected_ ? order_[static_cast<size_t>(i)] : i; }

int64_t TokenRows::length(int64_t i) const {
  const int64_t r = stored(i);
  return static_cast<int64_t>(store_->offsets[r + 1] - store_->offsets[r]);
}

int64_t TokenRows::label_tokens(int64_t i) const {
  const int64_t r = stored(i);
  int64_t count = 0;
  for (uint64_t t = store_->offsets[r] + 1; t < store_->offsets[r + 1]; ++t) count += store_->marks[t] & kLabelled;
  return count;
}

TrainingRow TokenRows::row(int64_t i) const {
  const int64_t r = stored(i);
  const uint64_t begin = store_->offsets[r], end = store_->offsets[r + 1];
  TrainingRow out;
  const size_t n = static_cast<size_t>(end - begin);
  out.input_ids.resize(n);
  out.labels.resize(n);
  out.position_ids.resize(n);
  int64_t position = 0;
  for (size_t t = 0; t < n; ++t) {
    const int64_t id = store_->ids[begin + t];
    const uint8_t mark = store_->marks[begin + t];
    position = (mark & kRestart) || t == 0 ? 0 : position + 1;
    out.input_ids[t] = id;
    out.labels[t] = (mark & kLabelled) ? id : kIgnoreLabel;
    out.position_ids[t] = position;
  }
  return out;
}

int64_t TokenRows::total_tokens() const {
  if (!selected_) return store_->tokens;
  int64_t total = 0;
  for (int64_t i = 0; i < size(); ++i) total += length(i);
  return total;
}

int64_t TokenRows::max_id() const { return store_->max_id; }

const std::string& TokenRows::meta() const { return store_->meta; }

bool TokenRows::mapped() const { return store_->map != nullptr; }

TokenRows TokenRows::select(std::vector<int64_t> indices) const {
  for (int64_t& i : indices) {
    if (i < 0 || i >= size()) throw std::out_of_range("TokenRows::select: row " + std::to_string(i) + " of " + std::to_string(size()));
    i = stored(i);
  }
  TokenRows view(store_);
  view.order_ = std::move(indices);
  view.selected_ = true;
  return view;
}

TokenBatch collate_rows(const TokenRows& rows, const std::vector<int64_t>& indices, int64_t pad_id) {
  std::vector<TrainingRow> held;
  held.reserve(indices.size());
  for (int64_t i : indices) held.push_back(rows.row(i));
  std::vector<const TrainingRow*> pointers;
  for (const TrainingRow& row : held) pointers.push_back(&row);
  return collate_rows(pointers, pad_id);
}

}  // namespace hyperparallel::data
