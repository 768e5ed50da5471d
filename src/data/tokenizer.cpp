// tokenizer.json loading and the encode/decode pipeline. See data/tokenizer.h.
#include "hyperparallel/data/tokenizer.h"

#include <oniguruma.h>
#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bpe_model.h"
#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"
#include "utf8.h"

namespace hyperparallel::data {
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// The largest token id a tokenizer.json may use: tables are sized by the largest id, and the
// largest real vocabularies are ~256 k.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// A token id from tokenizer.json: an integer in [0, kMaxTokenId] (nlohmann converts a float
// such as 2.3e45 to int64 with undefined behaviour, so it is refused by name first).
int64_t token_id(const Json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)) ||
      v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId) {
    throw UserError(path + ": " + what + " is " + excerpt(v.dump(), 40, false) + ", not a token id (an integer in [0, " +
                    std::to_string(kMaxTokenId) + "])");
  }
  return v.get<int64_t>();
}

// One regex compiled with Oniguruma's default (Ruby) syntax on UTF-8, as the reference does.
// Searching does not change a compiled regex, so one is shared by threads; each search has
// its own match region.
class OnigRegex {
 public:
  OnigRegex(const std::string& pattern, const std::string& where) {
    OnigErrorInfo info;
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    const int rc = onig_new(&regex_, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    if (rc != ONIG_NORMAL) {
      OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(message, rc, &info);
      throw UserError(where + ": regex does not compile: " + reinterpret_cast<char*>(message));
    }
  }
  ~OnigRegex() { onig_free(regex_); }
  OnigRegex(const OnigRegex&) = delete;
  OnigRegex& operator=(const OnigRegex&) = delete;

  // Appends the pieces of `text` with every match isolated (matches and the gaps between).
  void split_isolated(const std::string& text, std::vector<std::string>& out) const {
    const std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(onig_region_new(), [](OnigRegion* r) { onig_region_free(r, 1); });
    const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
    const auto* end = begin + text.size();
    size_t pos = 0, last = 0;
    while (pos <= text.size()) {
      const int at = onig_search(regex_, begin, end, begin + pos, end, region.get(), ONIG_OPTION_NONE);
      if (at < 0) break;
      const size_t match_end = static_cast<size_t>(region->end[0]);
      if (match_end == static_cast<size_t>(at)) {  // empty match: step over one character
        pos = at + (static_cast<size_t>(at) < text.size() ? utf8_char_length(text, at) : 1);
        continue;
      }
      if (static_cast<size_t>(at) > last) out.push_back(text.substr(last, at - last));
      out.push_back(text.substr(at, match_end - at));
      last = pos = match_end;
    }
    if (last < text.size()) out.push_back(text.substr(last));
  }

 private:
  regex_t* regex_ = nullptr;
};

struct Normalizer {
  enum class Kind { kNfc, kPrepend, kReplace } kind;
  std::string a, b;  // prepend: a; replace: a -> b
};

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip };
  explicit DecoderStep(Kind k, std::string a_ = "", std::string b_ = "", int start_ = 0, int stop_ = 0)
      : kind(k), a(std::move(a_)), b(std::move(b_)), start(start_), stop(stop_) {}
  Kind kind;
  std::string a, b;
  int start, stop;
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) out.append(s, pos, hit - pos) += to;
  return out.append(s, pos, std::string::npos);
}

// The steps of component `key` (normalizer, pre_tokenizer, ...): the elements of a
// {"type": "Sequence", list_key: [...]}, the component itself, or none when absent or null.
std::vector<Json> component_steps(const Json& j, const char* key, const char* list_key) {
  if (!j.contains(key) || j[key].is_null()) return {};
  const Json& c = j[key];
  if (c.value("type", "") != "Sequence") return {c};
  return c.at(list_key).get<std::vector<Json>>();
}

std::string string_pattern(const Json& pattern, const std::string& where) {
  if (pattern.contains("String") && pattern["String"].is_string()) return pattern["String"].get<std::string>();
  throw UserError(where + ": only String patterns are supported here");
}

// tokenizer_config.json's bos/eos/pad entries: a string, {"content": string} or null.
SpecialTokens read_special_tokens(const fs::path& config_path) {
  SpecialTokens tokens;
  if (!fs::exists(config_path)) return tokens;
  const Json config = io::read_user_json(config_path.string(), io::kMaxSmallJsonBytes, "tokenizer_config.json");
  const auto entry = [&](const char* key) -> std::string {
    if (!config.is_object() || !config.contains(key) || config[key].is_null()) return "";
    const Json& v = config[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    throw UserError(config_path.string() + ": \"" + key + "\" must be a string or {\"content\": string}");
  };
  tokens.bos = entry("bos_token");
  tokens.eos = entry("eos_token");
  tokens.pad = entry("pad_token");
  if (config.is_object() && config.contains("add_bos_token") && !config["add_bos_token"].is_null()) {
    if (!config["add_bos_token"].is_boolean()) throw UserError(config_path.string() + ": \"add_bos_token\" must be true or false");
    tokens.add_bos_token = config["add_bos_token"].get<bool>();
  } else if (config.is_object() && config.contains("tokenizer_class") && config["tokenizer_class"].is_string()) {
    static const std::set<std::string> kBosByDefault = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                                        "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"};
    tokens.add_bos_token = kBosByDefault.count(config["tokenizer_class"].get<std::string>()) > 0;
  }
  return tokens;
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  std::vector<Normalizer> normalizers;
  std::unique_ptr<OnigRegex> split;  // pre-tokenizer Split(regex, Isolated), if any
  bool byte_level = false;           // pre-tokenizer ByteLevel
  std::vector<DecoderStep> decoder;
  std::vector<int64_t> template_prefix, template_suffix;  // TemplateProcessing "single" around $A
  ByteLevelAlphabet alphabet;
  SpecialTokens special_tokens;
  // Added tokens by content; by first byte, longest first, for matching.
  std::map<std::string, int64_t> added;
  std::map<int64_t, std::pair<std::string, bool>> added_by_id;  // id -> (content, special)
  std::vector<std::vector<std::pair<std::string, int64_t>>> added_by_first_byte = std::vector<std::vector<std::pair<std::string, int64_t>>>(256);

  std::string normalize(std::string s) const {
    for (const auto& n : normalizers) {
      if (n.kind == Normalizer::Kind::kNfc) {
        // ASCII text is its own NFC (nothing to compose without a combining mark): most of a
        // chat dataset, and a fifth of tokenizing time when it went through utf8proc.
        if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) continue;
        // With an explicit length (not NUL-terminated) so U+0000 passes through.
        utf8proc_uint8_t* out = nullptr;
        const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                                static_cast<utf8proc_ssize_t>(s.size()), &out,
                                                static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (n >= 0) s.assign(reinterpret_cast<char*>(out), static_cast<size_t>(n));
        free(out);
      } else if (n.kind == Normalizer::Kind::kPrepend) {
        if (!s.empty()) s = n.a + s;
      } else {
        s = replace_all(std::move(s), n.a, n.b);
      }
    }
    return s;
  }

  void encode_segment(const std::string& text, std::vector<int64_t>& out) {
    const std::string normalized = normalize(text);
    std::vector<std::string> pieces;
    if (split) {
      split->split_isolated(normalized, pieces);
    } else {
      pieces.push_back(normalized);
    }
    for (const auto& piece : pieces) model->encode(byte_level ? alphabet.encode(piece) : piece, out);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_file(const std::string& path_or_dir) {
  if (!fs::exists(path_or_dir)) throw UserError("tokenizer " + path_or_dir + " does not exist (a tokenizer.json file or a folder with one)");
  const std::string path = fs::is_directory(path_or_dir) ? (fs::path(path_or_dir) / "tokenizer.json").string() : path_or_dir;
  const Json j = io::read_user_json(path, io::kMaxTokenizerBytes, "tokenizer file");
  auto impl = std::make_unique<Impl>();
  try {
    const Json& m = j.at("model");
    if (m.value("type", "") != "BPE") throw UserError(path + ": model type '" + m.value("type", "?") + "' is not supported (BPE is)");
    std::unordered_map<std::string, int64_t> vocab;
    for (auto it = m.at("vocab").begin(); it != m.at("vocab").end(); ++it) vocab.emplace(it.key(), token_id(it.value(), path, "vocab entry '" + it.key() + "'"));
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(m.at("merges").size());
    for (const auto& merge : m.at("merges")) {
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) throw UserError(path + ": merge '" + s + "' is not two tokens");
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else {
        merges.emplace_back(merge.at(0).get<std::string>(), merge.at(1).get<std::string>());
      }
    }
    BpeModel::Options options;
    options.ignore_merges = m.value("ignore_merges", false);
    options.byte_fallback = m.value("byte_fallback", false);
    options.fuse_unk = m.value("fuse_unk", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) options.unk_token = m["unk_token"].get<std::string>();
    if (!m.value("continuing_subword_prefix", Json("")).is_null() && !m.value("continuing_subword_prefix", std::string()).empty()) {
      throw UserError(path + ": continuing_subword_prefix is not supported");
    }
    impl->model = std::make_unique<BpeModel>(std::move(vocab), merges, options, path);

    // Normalizer.
    const std::vector<Json> normalizers = component_steps(j, "normalizer", "normalizers");
    for (const auto& n : normalizers) {
      const std::string type = n.value("type", "");
      if (type == "NFC") {
        impl->normalizers.push_back({Normalizer::Kind::kNfc, "", ""});
      } else if (type == "Prepend") {
        impl->normalizers.push_back({Normalizer::Kind::kPrepend, n.at("prepend").get<std::string>(), ""});
      } else if (type == "Replace") {
        impl->normalizers.push_back({Normalizer::Kind::kReplace, string_pattern(n.at("pattern"), path), n.at("content").get<std::string>()});
      } else {
        throw UserError(path + ": normalizer '" + type + "' is not supported (NFC, Prepend, Replace, Sequence are)");
      }
    }

    // Pre-tokenizer.
    const std::vector<Json> pre = component_steps(j, "pre_tokenizer", "pretokenizers");
    for (const auto& p : pre) {
      const std::string type = p.value("type", "");
      if (type == "Split" && p.at("pattern").contains("Regex") && p.value("behavior", "") == "Isolated" && !p.value("invert", false) &&
          !impl->split) {
        impl->split = std::make_unique<OnigRegex>(p.at("pattern").at("Regex").get<std::string>(), path);
      } else if (type == "ByteLevel" && !p.value("add_prefix_space", false) && !p.value("use_regex", true)) {
        impl->byte_level = true;
      } else {
        throw UserError(path + ": pre-tokenizer " + p.dump().substr(0, 120) +
                        " is not supported (Split with a Regex and Isolated; ByteLevel without regex or prefix space)");
      }
    }

    // Decoder.
    const std::vector<Json> decoders = component_steps(j, "decoder", "decoders");
    for (const auto& d : decoders) {
      const std::string type = d.value("type", "");
      if (type == "ByteLevel") {
        impl->decoder.emplace_back(DecoderStep::Kind::kByteLevel);
      } else if (type == "Replace") {
        impl->decoder.emplace_back(DecoderStep::Kind::kReplace, string_pattern(d.at("pattern"), path), d.at("content").get<std::string>());
      } else if (type == "ByteFallback") {
        impl->decoder.emplace_back(DecoderStep::Kind::kByteFallback);
      } else if (type == "Fuse") {
        impl->decoder.emplace_back(DecoderStep::Kind::kFuse);
      } else if (type == "Strip") {
        impl->decoder.emplace_back(DecoderStep::Kind::kStrip, d.at("content").get<std::string>(), "", d.value("start", 0), d.value("stop", 0));
      } else {
        throw UserError(path + ": decoder '" + type + "' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip are)");
      }
    }

    // Post-processor: the single-sequence template of TemplateProcessing (ByteLevel adds nothing).
    const std::vector<Json> post = component_steps(j, "post_processor", "processors");
    for (const auto& p : post) {
      const std::string type = p.value("type", "");
      if (type == "ByteLevel") continue;
      if (type != "TemplateProcessing") {
        throw UserError(path + ": post-processor '" + type + "' is not supported (TemplateProcessing, ByteLevel are)");
      }
      bool seen_sequence = false;
      for (const auto& piece : p.at("single")) {
        if (piece.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
        const auto ids = p.at("special_tokens").at(name).at("ids").get<std::vector<int64_t>>();
        auto& target = seen_sequence ? impl->template_suffix : impl->template_prefix;
        target.insert(target.end(), ids.begin(), ids.end());
      }
    }

    // Added tokens.
    for (const auto& a : j.value("added_tokens", Json::array())) {
      const std::string content = a.at("content").get<std::string>();
      const int64_t id = token_id(a.at("id"), path, "added token id");
      if (content.empty()) continue;
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false) || a.value("normalized", false)) {
        throw UserError(path + ": added token '" + content + "' uses lstrip/rstrip/single_word/normalized, not supported yet");
      }
      impl->added[content] = id;
      impl->added_by_id[id] = {content, a.value("special", false)};
      impl->added_by_first_byte[static_cast<unsigned char>(content[0])].emplace_back(content, id);
    }
    for (auto& list : impl->added_by_first_byte) {
      std::sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + ": malformed tokenizer.json (" + e.what() + ")");
  }
  impl->special_tokens = read_special_tokens(fs::path(path).parent_path() / "tokenizer_config.json");
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> out;
  if (add_special_tokens) out = impl_->template_prefix;
  size_t start = 0;  // of the text not yet encoded
  for (size_t i = 0; i < text.size();) {
    const auto& candidates = impl_->added_by_first_byte[static_cast<unsigned char>(text[i])];
    const std::pair<std::string, int64_t>* hit = nullptr;
    for (const auto& c : candidates) {
      if (text.compare(i, c.first.size(), c.first) == 0) {
        hit = &c;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) impl_->encode_segment(text.substr(start, i - start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  if (start < text.size()) impl_->encode_segment(text.substr(start), out);
  if (add_special_tokens) out.insert(out.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    auto added = impl_->added_by_id.find(id);
    if (added != impl_->added_by_id.end()) {
      if (!(skip_special_tokens && added->second.second)) tokens.push_back(added->second.first);
    } else {
      tokens.push_back(impl_->model->id_to_token(id));
    }
  }
  for (const auto& step : impl_->decoder) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string joined;
        for (const auto& t : tokens) joined += t;
        tokens = {utf8_lossy(impl_->alphabet.decode(joined))};
        break;
      }
      case DecoderStep::Kind::kReplace:
        for (auto& t : tokens) t = replace_all(t, step.a, step.b);
        break;
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        size_t byte_tokens = 0;
        auto flush = [&] {
          if (byte_tokens == 0) return;
          if (utf8_lossy(bytes) == bytes) {
            out.push_back(bytes);
          } else {
            for (size_t k = 0; k < byte_tokens; ++k) out.push_back("\xEF\xBF\xBD");
          }
          bytes.clear();
          byte_tokens = 0;
        };
        for (const auto& t : tokens) {
          unsigned value = 0;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::sscanf(t.c_str() + 3, "%2X", &value) == 1) {
            bytes += static_cast<char>(value);
            ++byte_tokens;
          } else {
            flush();
            out.push_back(t);
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kFuse: {
        std::string joined;
        for (const auto& t : tokens) joined += t;
        tokens = {joined};
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (auto& t : tokens) {
          for (int k = 0; k < step.start && t.compare(0, step.a.size(), step.a) == 0; ++k) t.erase(0, step.a.size());
          for (int k = 0; k < step.stop && t.size() >= step.a.size() &&
                          t.compare(t.size() - step.a.size(), step.a.size(), step.a) == 0;
               ++k) {
            t.erase(t.size() - step.a.size());
          }
        }
        break;
    }
  }
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) out += (i && impl_->decoder.empty() ? " " : "") + tokens[i];  // no decoder: as HF, joined by spaces
  return out;
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  auto it = impl_->added.find(token);
  if (it != impl_->added.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int64_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() ? it->second.first : impl_->model->id_to_token(id);
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = impl_->model->size();
  for (const auto& [id, token] : impl_->added_by_id) n = std::max(n, id + 1);
  return n;
}

const SpecialTokens& Tokenizer::special_tokens() const { return impl_->special_tokens; }

bool Tokenizer::is_special(int64_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && it->second.second;
}

std::vector<int64_t> Tokenizer::end_of_turn_ids() const {
  std::vector<int64_t> ids;
  for (const std::string& marker : {special_tokens().eos, std::string("<|im_end|>"), std::string("<|eot_id|>"), std::string("</s>"),
                                    std::string("<|endoftext|>")}) {
    if (marker.empty()) continue;
    if (auto id = token_to_id(marker); id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  return ids;
}

std::vector<std::string> copy_tokenizer_files(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_regular_file(from) ? fs::path(from).parent_path() : fs::path(from);
  std::vector<std::string> copied;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                           "tokenizer.model"}) {
    if (!fs::is_regular_file(dir / name)) continue;
    std::error_code ec;
    fs::copy_file(dir / name, fs::path(to) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) throw UserError("cannot copy " + (dir / name).string() + " to " + to + ": " + ec.message());
    copied.push_back(name);
  }
  return copied;
}

}  // namespace hyperparallel::data
