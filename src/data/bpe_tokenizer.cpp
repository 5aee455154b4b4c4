// Hugging Face byte-level BPE tokenizers (fsdp/data/bpe_tokenizer.hpp).
#include "fsdp/data/bpe_tokenizer.hpp"

#include <oniguruma.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <system_error>
#include <unordered_map>

#include "fsdp/core/error.hpp"

namespace fs = std::filesystem;

namespace fsdp::data {

namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenization pattern (openai/gpt-2 src/encoder.py; tokenizers' ByteLevel with
// use_regex).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Pieces longer than this (in bytes) are not cached: long runs are rare and would fill it.
constexpr std::size_t kCacheMaxPieceBytes = 64;
constexpr std::size_t kCacheMaxEntries = std::size_t{1} << 18;

// GPT-2's bytes_to_unicode: bytes that are printable characters of Latin-1 (33-126, 161-172,
// 174-255) stand for themselves; the other 68 take the code points 256, 257, ... in byte order.
std::array<char32_t, 256> byte_code_points() {
  std::array<char32_t, 256> cp{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    cp[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return cp;
}

// The length of the valid UTF-8 character at s[i] (RFC 3629: no overlong forms, no
// surrogates, at most U+10FFFF) and its code point; 0 if it is not valid.
std::size_t utf8_char(std::string_view s, std::size_t i, char32_t* cp) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  std::size_t n;
  char32_t v, min;
  if ((c & 0xE0) == 0xC0) {
    n = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Offset of the first byte of `s` that does not start a valid UTF-8 character, or npos.
std::size_t first_invalid_utf8(std::string_view s) {
  char32_t cp;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

// `text` (valid UTF-8) in the Unicode normalization form `options` selects (utf8proc_map:
// UAX #15, the forms tokenizers' NFC / NFD / NFKC / NFKD normalizers apply).
std::string normalize_utf8(std::string_view text, int options, const std::string& where) {
  utf8proc_uint8_t* raw = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &raw,
                                          static_cast<utf8proc_option_t>(options));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(raw, &std::free);
  if (n < 0)
    throw InputError(where + ": Unicode normalization failed (" + utf8proc_errmsg(n) + ")");
  return std::string(reinterpret_cast<const char*>(raw), static_cast<std::size_t>(n));
}

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// One compiled Oniguruma regex (UTF-8, the library's default syntax: what tokenizers'
// SysRegex compiles with) and its match region: their one owner.
class OnigRegex {
 public:
  // Throws InputError "<where>: <Oniguruma's message>".
  OnigRegex(const std::string& pattern, const std::string& where) {
    initialize_oniguruma();
    OnigErrorInfo info{};
    regex_t* reg = nullptr;
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    const int rc = onig_new(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                            ONIG_SYNTAX_DEFAULT, &info);
    if (rc != ONIG_NORMAL) {
      OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(msg, rc, &info);
      throw InputError(where + ": regex rejected by Oniguruma (" +
                       printable(reinterpret_cast<const char*>(msg), 200) + ")");
    }
    reg_.reset(reg);
    region_.reset(onig_region_new());
    if (!region_) throw Error("onig_region_new: out of memory");
  }

  // Tokenizers' SplitDelimiterBehavior::Isolated: the matches of the regex in `text` and the
  // text between them, in order, each non-empty. Empty matches are skipped.
  void split_isolated(std::string_view text, std::vector<std::string_view>& out) const {
    const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
    const OnigUChar* end = str + text.size();
    std::size_t done = 0, from = 0;
    while (from < text.size()) {
      const int pos =
          onig_search(reg_.get(), str, end, str + from, end, region_.get(), ONIG_OPTION_NONE);
      if (pos == ONIG_MISMATCH) break;
      if (pos < 0) throw Error("onig_search failed (code " + std::to_string(pos) + ")");
      const auto beg = static_cast<std::size_t>(region_->beg[0]);
      const auto stop = static_cast<std::size_t>(region_->end[0]);
      if (stop == beg) {  // an empty match: look again one character further
        char32_t cp;
        from = beg + std::max<std::size_t>(1, utf8_char(text, beg, &cp));
        continue;
      }
      if (beg > done) out.push_back(text.substr(done, beg - done));
      out.push_back(text.substr(beg, stop - beg));
      done = from = stop;
    }
    if (done < text.size()) out.push_back(text.substr(done));
  }

 private:
  struct FreeRegex {
    void operator()(regex_t* r) const { onig_free(r); }
  };
  struct FreeRegion {
    void operator()(OnigRegion* r) const { onig_region_free(r, 1); }
  };
  std::unique_ptr<regex_t, FreeRegex> reg_;
  std::unique_ptr<OnigRegion, FreeRegion> region_;
};

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "(no type)";
  return j["type"].get<std::string>();
}

// An optional string-or-AddedToken field of tokenizer_config.json: "x", {"content": "x"}, or
// null / absent (empty).
std::string added_token_content(const json& config, const char* key) {
  if (!config.contains(key)) return {};
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

// What a tokenizer.json says: read once, then shared, unchanged, by every handle on it
// (clone_for_thread).
struct BpeModel {
  // The normalizer: utf8proc_map options of a Unicode normalization form, 0 for none.
  int normalization = 0;
  // The pre-tokenizer: Split regexes (Isolated) in order, then ByteLevel.
  std::vector<std::string> split_patterns;
  bool byte_level_regex = true;  // ByteLevel use_regex: GPT-2's pattern
  bool add_prefix_space = false;
  bool ignore_merges = false;

  std::array<int32_t, 256> byte_id{};                  // the token of each single byte
  std::unordered_map<std::string, int32_t> raw_vocab;  // raw bytes -> id (byte-level tokens)
  std::unordered_map<std::string, int32_t> spelled;    // the JSON's own spelling -> id
  std::unordered_map<std::string, int32_t> added;      // added_tokens content -> id
  struct Merge {
    int32_t rank, new_id;
  };
  std::unordered_map<uint64_t, Merge> merges;
};

// One handle's own state: its compiled regexes (Oniguruma's match state is per regex) and
// its cache of encoded pieces.
struct BpeTokenizer::Impl {
  using Merge = BpeModel::Merge;
  std::shared_ptr<const BpeModel> model;
  std::vector<std::unique_ptr<OnigRegex>> splits;
  std::unique_ptr<OnigRegex> byte_level_regex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // Compiles the model's regexes; `where` names the file in errors.
  Impl(std::shared_ptr<const BpeModel> m, const std::string& where) : model(std::move(m)) {
    for (std::size_t i = 0; i < model->split_patterns.size(); ++i) {
      splits.push_back(std::make_unique<OnigRegex>(
          model->split_patterns[i], where + ": pre_tokenizer " + std::to_string(i) + " (Split)"));
    }
    if (model->byte_level_regex) {
      byte_level_regex =
          std::make_unique<OnigRegex>(std::string(kGpt2Pattern), where + ": ByteLevel");
    }
  }

  const Merge* find_merge(int32_t a, int32_t b) const {
    const auto it = model->merges.find(pair_key(a, b));
    return it == model->merges.end() ? nullptr : &it->second;
  }

  // Tokenizers' Word::merge_all (no dropout): a min-heap of (rank, position) over adjacent
  // pairs; a popped pair whose symbols changed since it was pushed is skipped.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    const std::string key(piece);  // the lookups' key, made once
    if (model->ignore_merges) {
      const auto it = model->raw_vocab.find(key);
      if (it != model->raw_vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
    if (cacheable) {
      const auto it = cache.find(key);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    struct Symbol {
      int32_t id, prev, next, len;
    };
    const auto n = static_cast<int32_t>(piece.size());
    std::vector<Symbol> sym(static_cast<std::size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      sym[i] = {model->byte_id[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1,
                1};
    }
    struct Candidate {
      int32_t rank, pos, new_id;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    for (int32_t i = 0; i + 1 < n; ++i) {
      if (const Merge* m = find_merge(sym[i].id, sym[i + 1].id)) heap.push({m->rank, i, m->new_id});
    }
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      Symbol& left = sym[c.pos];
      if (left.len == 0 || left.next < 0) continue;
      const int32_t right_pos = left.next;
      Symbol& right = sym[right_pos];
      const Merge* now = find_merge(left.id, right.id);
      if (!now || now->new_id != c.new_id) continue;
      left.id = c.new_id;
      left.len += right.len;
      left.next = right.next;
      right.len = 0;
      if (left.next >= 0) sym[left.next].prev = c.pos;
      if (left.prev >= 0) {
        if (const Merge* m = find_merge(sym[left.prev].id, left.id))
          heap.push({m->rank, left.prev, m->new_id});
      }
      if (left.next >= 0) {
        if (const Merge* m = find_merge(left.id, sym[left.next].id))
          heap.push({m->rank, c.pos, m->new_id});
      }
    }
    const std::size_t first = out.size();
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
    if (cacheable) {
      if (cache.size() >= kCacheMaxEntries) cache.clear();
      cache.emplace(key, std::vector<int32_t>(out.begin() + first, out.end()));
    }
  }

  void byte_level(std::string_view piece, std::vector<int32_t>& out) const {
    std::string prefixed;
    if (model->add_prefix_space && (piece.empty() || piece.front() != ' ')) {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (!byte_level_regex) {
      bpe(piece, out);
      return;
    }
    std::vector<std::string_view> words;
    byte_level_regex->split_isolated(piece, words);
    for (const auto w : words) bpe(w, out);
  }
};

// A field of the wrong JSON type (nlohmann's type_error, say a number where a string belongs)
// becomes one InputError naming the file, like every other fault of the file.
BpeTokenizer::BpeTokenizer(const std::string& json_path, const BpeSpecialTokens& specials) try
    : path_(json_path) {
  const std::string name = printable(json_path);
  const std::string bytes = read_whole_file(json_path, "tokenizer.json");
  json doc;
  try {
    doc = json::parse(bytes);
  } catch (const json::parse_error& e) {
    throw InputError(name + ": not a tokenizer.json (JSON parse error at byte " +
                     std::to_string(e.byte) +
                     "; expected the tokenizer.json of a Hugging Face model)");
  }
  auto refuse = [&](const std::string& what) {
    throw InputError(
        name + ": " + what +
        " (fsdp_prepare reads byte-level BPE tokenizer.json files: GPT-2, Llama 3 and their "
        "kind; for a SentencePiece model give its tokenizer.model)");
  };
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) {
    refuse("no \"model\" object: not a tokenizer.json");
  }
  auto shared = std::make_shared<BpeModel>();
  BpeModel& m = *shared;

  // ---- normalizer: none, or one Unicode normalization form (alone or in a Sequence)
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
    std::vector<json> forms;
    const json& nz = doc["normalizer"];
    if (type_of(nz) == "Sequence" && nz.contains("normalizers") && nz["normalizers"].is_array()) {
      for (const auto& n : nz["normalizers"]) forms.push_back(n);
    } else {
      forms.push_back(nz);
    }
    if (forms.size() > 1)
      refuse("a Sequence of " + std::to_string(forms.size()) + " normalizers is not supported");
    if (!forms.empty()) {
      const std::string type = type_of(forms[0]);
      const std::array<std::pair<const char*, int>, 4> known = {
          {{"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
           {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
           {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
           {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}}};
      const auto it =
          std::find_if(known.begin(), known.end(), [&](const auto& k) { return type == k.first; });
      if (it == known.end())
        refuse("normalizer " + type + " is not supported (only NFC, NFD, NFKC, NFKD)");
      m.normalization = it->second;
    }
  }

  // ---- pre_tokenizer: Split* then ByteLevel
  std::vector<json> steps;
  if (doc.contains("pre_tokenizer") && !doc["pre_tokenizer"].is_null()) {
    const json& pt = doc["pre_tokenizer"];
    if (type_of(pt) == "Sequence" && pt.contains("pretokenizers") &&
        pt["pretokenizers"].is_array()) {
      for (const auto& s : pt["pretokenizers"]) steps.push_back(s);
    } else {
      steps.push_back(pt);
    }
  }
  if (steps.empty() || type_of(steps.back()) != "ByteLevel") {
    refuse("pre_tokenizer " + (steps.empty() ? std::string("none") : type_of(steps.back())) +
           " last, not ByteLevel: not a byte-level BPE");
  }
  for (std::size_t i = 0; i + 1 < steps.size(); ++i) {
    const json& s = steps[i];
    if (type_of(s) != "Split")
      refuse("pre_tokenizer " + type_of(s) + " is not supported (only Split and ByteLevel)");
    if (!s.contains("pattern") || !s["pattern"].is_object() || !s["pattern"].contains("Regex") ||
        !s["pattern"]["Regex"].is_string()) {
      refuse("pre_tokenizer Split without a {\"Regex\": ...} pattern is not supported");
    }
    if (s.value("behavior", std::string()) != "Isolated") {
      refuse("pre_tokenizer Split behavior " + s.value("behavior", std::string("(none)")) +
             " is not supported (only Isolated)");
    }
    if (s.value("invert", false)) refuse("pre_tokenizer Split with invert is not supported");
    m.split_patterns.push_back(s["pattern"]["Regex"].get<std::string>());  // compiled by Impl
  }
  const json& bl = steps.back();
  m.add_prefix_space = bl.value("add_prefix_space", false);
  m.byte_level_regex = bl.value("use_regex", true);

  // ---- model: BPE
  const json& model = doc["model"];
  if (model.contains("type") && type_of(model) != "BPE")
    refuse("model " + type_of(model) + " is not BPE");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0) {
    refuse("BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      refuse(std::string("BPE ") + key + " is not supported");
    }
  }
  if (model.value("byte_fallback", false))
    refuse("BPE byte_fallback is not supported (not byte-level)");
  m.ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object())
    refuse("model has no \"vocab\" object");
  if (!model.contains("merges") || !model["merges"].is_array())
    refuse("model has no \"merges\" list");

  const auto code_points = byte_code_points();
  std::unordered_map<char32_t, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[code_points[b]] = static_cast<unsigned char>(b);
  // A vocabulary string in raw bytes; false if a character is not one of the 256.
  auto to_raw = [&](const std::string& s, std::string& raw) {
    raw.clear();
    char32_t cp;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t n = utf8_char(s, i, &cp);
      if (n == 0) return false;
      const auto it = byte_of.find(cp);
      if (it == byte_of.end()) return false;
      raw += static_cast<char>(it->second);
      i += n;
    }
    return true;
  };
  int64_t max_id = -1;
  auto check_id = [&](const json& v, const std::string& what) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      refuse(what + ": id " + printable(v.dump(), 40) + " (expected an integer in 0 .. 2^31-1)");
    }
    max_id = std::max<int64_t>(max_id, v.get<int64_t>());
    return static_cast<int32_t>(v.get<int64_t>());
  };
  std::string raw;
  for (const auto& [key, value] : model["vocab"].items()) {
    const int32_t id = check_id(value, "vocab entry " + printable(key, 40));
    m.spelled.emplace(key, id);
    if (to_raw(key, raw)) m.raw_vocab.emplace(raw, id);
  }
  m.byte_id.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const auto it = m.raw_vocab.find(std::string(1, static_cast<char>(b)));
    if (it == m.raw_vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      refuse(std::string("byte ") + hex + " has no token in the vocabulary: not a byte-level BPE");
    }
    m.byte_id[b] = it->second;
  }
  const json& merges = model["merges"];
  m.merges.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos)
        refuse("merge " + std::to_string(r) + " " + printable(s, 40) + " is not \"a b\"");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      refuse("merge " + std::to_string(r) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = m.spelled.find(a), ib = m.spelled.find(b), iab = m.spelled.find(a + b);
    if (ia == m.spelled.end() || ib == m.spelled.end() || iab == m.spelled.end()) {
      const std::string& missing = ia == m.spelled.end() ? a : ib == m.spelled.end() ? b : a + b;
      refuse("merge " + std::to_string(r) + " (" + printable(a, 40) + " " + printable(b, 40) +
             "): " + printable(missing, 40) + " is not in the vocabulary");
    }
    // The first merge of a pair wins, as tokenizers' BPE builder keeps one rank per pair.
    m.merges.emplace(pair_key(ia->second, ib->second),
                     BpeModel::Merge{static_cast<int32_t>(r), iab->second});
  }

  // ---- added tokens
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    for (const auto& t : doc["added_tokens"]) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
          !t.contains("id")) {
        refuse("added_tokens entry without content and id");
      }
      m.added[t["content"].get<std::string>()] = check_id(t["id"], "added token");
    }
  }
  vocab_size_ = max_id + 1;

  impl_ = std::make_unique<Impl>(std::move(shared), name);  // compiles the regexes

  // ---- BOS / EOS: the flags, else tokenizer_config.json (a key set to null is none), else the
  // post_processor's template.
  std::string bos = specials.bos_token, eos = specials.eos_token;
  bool bos_known = !bos.empty(), eos_known = !eos.empty();
  const fs::path config_path = fs::path(json_path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if ((!bos_known || !eos_known) && fs::is_regular_file(config_path, ec)) {
    json config;
    try {
      config = json::parse(read_whole_file(config_path.string(), "tokenizer_config.json"));
    } catch (const json::parse_error& e) {
      throw InputError(printable(config_path.string()) + ": not JSON (parse error at byte " +
                       std::to_string(e.byte) + "; it names the BOS and EOS tokens of " + name +
                       ")");
    }
    if (config.is_object()) {
      if (!bos_known && config.contains("bos_token"))
        bos = added_token_content(config, "bos_token"), bos_known = true;
      if (!eos_known && config.contains("eos_token"))
        eos = added_token_content(config, "eos_token"), eos_known = true;
    }
  }
  if ((!bos_known || !eos_known) && doc.contains("post_processor")) {
    std::vector<const json*> todo{&doc["post_processor"]};
    while (!todo.empty()) {
      const json& pp = *todo.back();
      todo.pop_back();
      const std::string type = type_of(pp);
      if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
        for (const auto& p : pp["processors"]) todo.push_back(&p);
      } else if (type == "TemplateProcessing" && pp.contains("single") && pp["single"].is_array()) {
        bool seen_a = false;  // a special token before $A is BOS, one after it EOS
        for (const auto& item : pp["single"]) {
          if (item.contains("Sequence")) seen_a = true;
          if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) continue;
          std::string& slot = seen_a ? eos : bos;
          if (slot.empty() && !(seen_a ? eos_known : bos_known))
            slot = item["SpecialToken"]["id"].get<std::string>();
        }
      } else if (type == "RobertaProcessing" || type == "BertProcessing") {  // cls A sep
        if (!bos_known && pp.contains("cls") && pp["cls"].is_array())
          bos = pp["cls"][0].get<std::string>();
        if (!eos_known && pp.contains("sep") && pp["sep"].is_array())
          eos = pp["sep"][0].get<std::string>();
      }
    }
  }
  // A token named by a flag, or by the files (`from`), must exist.
  auto resolve = [&](const std::string& content, const std::string& flag, bool given) {
    if (content.empty()) return int32_t{-1};
    const int32_t id = token_id(content);
    if (id < 0) {
      throw InputError((given ? flag : name + ": its " + flag.substr(2, 3) + " token") + " " +
                       printable(content, 60) + " is not in the vocabulary or added_tokens of " +
                       name);
    }
    return id;
  };
  bos_id_ = resolve(bos, "--bos-token", !specials.bos_token.empty());
  eos_id_ = resolve(eos, "--eos-token", !specials.eos_token.empty());

  model_bytes_ = static_cast<int64_t>(bytes.size());
  sha256_ = sha256_hex(bytes);
} catch (const nlohmann::json::exception& e) {
  throw InputError(printable(json_path) + ": not a valid tokenizer.json (" +
                   printable(e.what(), 200) + ")");
}

BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<TextTokenizer> BpeTokenizer::clone_for_thread() const {
  std::unique_ptr<BpeTokenizer> copy(new BpeTokenizer());
  copy->impl_ = std::make_unique<Impl>(impl_->model, printable(path_));
  copy->path_ = path_;
  copy->sha256_ = sha256_;
  copy->model_bytes_ = model_bytes_;
  copy->vocab_size_ = vocab_size_;
  copy->bos_id_ = bos_id_;
  copy->eos_id_ = eos_id_;
  return copy;
}

int64_t BpeTokenizer::num_merges() const {
  return static_cast<int64_t>(impl_->model->merges.size());
}

int32_t BpeTokenizer::token_id(std::string_view content) const {
  const std::string key(content);
  const BpeModel& m = *impl_->model;
  if (const auto it = m.added.find(key); it != m.added.end()) return it->second;
  if (const auto it = m.spelled.find(key); it != m.spelled.end()) return it->second;
  if (const auto it = m.raw_vocab.find(key); it != m.raw_vocab.end()) return it->second;
  return -1;
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out,
                          const std::string& where) const {
  const std::size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    throw InputError(where + ": not valid UTF-8 at byte " + std::to_string(bad) +
                     " (a tokenizer.json encodes UTF-8 text; convert the file, e.g. with iconv)");
  }
  std::string normalized;
  if (impl_->model->normalization != 0) {
    normalized = normalize_utf8(text, impl_->model->normalization, where);
    text = normalized;
  }
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& split : impl_->splits) {
    next.clear();
    for (const auto p : pieces) split->split_isolated(p, next);
    pieces.swap(next);
  }
  for (const auto p : pieces) impl_->byte_level(p, out);
}

bool is_tokenizer_json(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::is_regular_file(fs::path(path) / "tokenizer.json", ec);
  if (!fs::is_regular_file(path, ec)) return false;
  // Named .json: read as JSON, so a damaged one gets the JSON parser's line, not protobuf's.
  std::string ext = fs::path(path).extension().string();
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (ext == ".json") return true;
  std::ifstream in(path, std::ios::binary);
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  // A UTF-8 byte order mark may come first (some editors save one; JSON parsers skip it).
  const std::size_t start = head.rfind("\xef\xbb\xbf", 0) == 0 ? 3 : 0;
  const std::size_t first = head.find_first_not_of(" \t\n\r", start);
  return first != std::string::npos && head[first] == '{';
}

std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& path,
                                                   const BpeSpecialTokens& specials,
                                                   std::string* note) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    const std::string json_file = (dir / "tokenizer.json").string();
    const std::string spm_file = (dir / "tokenizer.model").string();
    const bool json = fs::is_regular_file(json_file, ec), spm = fs::is_regular_file(spm_file, ec);
    if (json && spm && specials.bos_token.empty() && specials.eos_token.empty()) {
      try {
        return std::make_unique<BpeTokenizer>(json_file, specials);
      } catch (const Error& json_error) {
        std::unique_ptr<TextTokenizer> tok;
        try {
          tok = std::make_unique<SentencePieceTokenizer>(spm_file);
        } catch (const Error&) {
          throw json_error;  // neither loads: tokenizer.json's error, the file taken first
        }
        if (note) {
          *note = std::string(json_error.what()) + "; encoding with " + printable(spm_file) +
                  " beside it";
        }
        return tok;
      }
    }
    if (json) {
      file = json_file;
    } else if (spm) {
      file = spm_file;
    } else {
      throw InputError(printable(path) +
                       ": a folder with neither tokenizer.json nor tokenizer.model (expected a "
                       "tokenizer file, or a "
                       "Hugging Face model folder holding one)");
    }
  }
  if (is_tokenizer_json(file)) return std::make_unique<BpeTokenizer>(file, specials);
  for (const auto* s : {&specials.bos_token, &specials.eos_token}) {
    if (!s->empty()) {
      throw InputError(std::string(s == &specials.bos_token ? "--bos-token" : "--eos-token") +
                       ": only with a tokenizer.json (the SentencePiece model " + printable(file) +
                       " names its own BOS and EOS)");
    }
  }
  return std::make_unique<SentencePieceTokenizer>(file);
}

}  // namespace fsdp::data
