// Resume compatibility of configs (see fsdp/checkpoint/resume.hpp). Both sides are parsed
// with toml++ and compared by value, printed in TOML syntax.
#include "fsdp/checkpoint/resume.hpp"

#include <toml++/toml.h>
#include <xxhash.h>

#include <charconv>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "fsdp/config/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::ckpt {

namespace {

// "section.key" -> the value in TOML syntax, in key order (toml++ tables are sorted).
std::vector<std::pair<std::string, std::string>> flatten(const std::string& text, const std::string& origin) {
  toml::table doc;
  try {
    doc = toml::parse(text, std::string_view(origin));
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << " is not valid TOML: " << e.description() << " (line " << e.source().begin.line << ")";
    throw InputError(os.str());
  }
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](auto&& self, const std::string& prefix, const toml::node& n) -> void {
    if (const toml::table* t = n.as_table()) {
      for (const auto& [k, v] : *t) self(self, prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str()), v);
      return;
    }
    if (const auto* d = n.as_floating_point()) {  // shortest round-trip form, as to_toml writes
      char buf[64];
      const auto r = std::to_chars(buf, buf + sizeof buf, d->get());
      out.emplace_back(prefix, std::string(buf, r.ptr));
      return;
    }
    std::ostringstream os;
    n.visit([&](const auto& v) { os << v; });
    out.emplace_back(prefix, os.str());
  };
  add(add, "", doc);
  return out;
}

}  // namespace

std::string config_fingerprint(const std::string& resolved_toml, const std::string& origin) {
  nlohmann::json j = nlohmann::json::object();  // std::map underneath: keys sorted
  for (const auto& [k, v] : flatten(resolved_toml, origin))
    if (!resume_may_change(k)) j[k] = v;
  const std::string canon = j.dump();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(canon.data(), canon.size())));
  return buf;
}

void check_resume_config(const std::string& checkpoint_toml, const std::string& run_toml,
                         const std::string& file) {
  const auto stored = flatten(checkpoint_toml, file + ": attribute train_config");
  const auto run = flatten(run_toml, "the run's resolved config");
  std::map<std::string, std::string> has(stored.begin(), stored.end());
  auto check = [&](const std::string& key, const std::string& value) {
    if (resume_may_change(key)) return;
    const auto it = has.find(key);
    if (it == has.end() || it->second == value) return;
    throw InputError("--resume: " + key + " differs (checkpoint has " + it->second + ", config has " + value +
                     ") in " + file + "; only the keys listed in docs/checkpoint.md \"Resume checks\" may change");
  };
  for (const auto& [k, v] : run)  // model.type first: it explains every other model key
    if (k == "model.type") check(k, v);
  for (const auto& [k, v] : run) check(k, v);
}

std::optional<ConfigDifference> first_config_difference(const std::string& a_toml,
                                                        const std::string& b_toml,
                                                        const std::string& a_origin,
                                                        const std::string& b_origin) {
  const auto a = flatten(a_toml, a_origin), b = flatten(b_toml, b_origin);
  const std::map<std::string, std::string> in_a(a.begin(), a.end()), in_b(b.begin(), b.end());
  auto value = [](const std::map<std::string, std::string>& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? std::string("(absent)") : it->second;
  };
  // Keys in sorted order over both sides.
  std::set<std::string> keys;
  for (const auto& kv : a) keys.insert(kv.first);
  for (const auto& kv : b) keys.insert(kv.first);
  for (const std::string& k : keys) {
    const std::string va = value(in_a, k), vb = value(in_b, k);
    if (va != vb) return ConfigDifference{k, va, vb};
  }
  return std::nullopt;
}

}  // namespace fsdp::ckpt
