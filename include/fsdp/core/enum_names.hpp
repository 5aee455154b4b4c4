// fsdp/core/enum_names.hpp: one {value, name} table per enum, and what reads it.
//
// An enum's spellings are written once, right after the enum, as a specialization of
// EnumNames holding a constexpr table:
//
//   enum class Color { red, green };
//   template <>
//   struct EnumNames<Color> {
//     static constexpr EnumName<Color> table[] = {{Color::red, "red"}, {Color::green, "green"}};
//   };
//
// and everything that names or reads a value goes through that table: to_string (generic
// below; an enum may keep its own to_string overload, implemented with enum_name), parsing
// (enum_from_name: exact, case-sensitive), the lists of accepted values in error messages,
// `fsdp_train --list-keys` and docs/config.md's checks (enum_name_list). The table's order is
// the order those lists print. A switch over an enum stays where each case does real work;
// one that only maps a value to its name is this table.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fsdp {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// Specialized per enum with `static constexpr EnumName<E> table[] = {...}`.
template <class E>
struct EnumNames;

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires { EnumNames<E>::table; };

// The name of `v`, or `unknown` for a value the table does not list (a cast integer).
template <NamedEnum E>
constexpr const char* enum_name(E v, const char* unknown = "?") {
  for (const EnumName<E>& e : EnumNames<E>::table) {
    if (e.value == v) return e.name;
  }
  return unknown;
}

// The value spelled `name` (exact and case-sensitive), or nullopt.
template <NamedEnum E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  for (const EnumName<E>& e : EnumNames<E>::table) {
    if (name == e.name) return e.value;
  }
  return std::nullopt;
}

// Every value, in table order.
template <NamedEnum E>
std::vector<E> enum_values() {
  std::vector<E> out;
  for (const EnumName<E>& e : EnumNames<E>::table) out.push_back(e.value);
  return out;
}

// Every name, in table order.
template <NamedEnum E>
std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  for (const EnumName<E>& e : EnumNames<E>::table) out.emplace_back(e.name);
  return out;
}

// "a, b, c": the names in table order, for "expected one of ..." messages.
template <NamedEnum E>
std::string enum_name_list(const char* sep = ", ") {
  std::string out;
  for (const EnumName<E>& e : EnumNames<E>::table) out += (out.empty() ? "" : sep) + std::string(e.name);
  return out;
}

// The name of any enum with a table and no to_string of its own (a non-template overload,
// as DType's, is preferred by overload resolution).
template <NamedEnum E>
constexpr const char* to_string(E v) {
  return enum_name(v);
}

}  // namespace fsdp
