#pragma once
/// \file
/// The row of zero's config key tables (`zero/config/schema.hpp`), and what every row gets from it:
/// the typed read of its value (type and bounds checked, `"auto"` resolved, aliases folded), the
/// write of its member for `config::to_json`, and notes for settings without effect. A row is built
/// from the member that holds its value, `key<&fp16_config::hysteresis>("hysteresis").at_least(1)`,
/// so the member's type picks the read (bool, integer, number, string, enumeration, pair) and the
/// write; the builder calls after it fill in the other columns.

#include "zero/config/detail/reader.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace zero {
struct config_inputs;
} // namespace zero

namespace zero::detail {

inline constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
inline constexpr double f64_max = std::numeric_limits<double>::max();

/// What a row's value is, from the type of its member; `none` for a row without one.
enum class value_kind : std::uint8_t { none, boolean, integer, number, string, choice, pair };

template <class T> struct unwrap_optional { using type = T; };
template <class T> struct unwrap_optional<std::optional<T>> { using type = T; };
template <class T> inline constexpr bool is_optional_v = !std::is_same_v<typename unwrap_optional<T>::type, T>;

template <class M> struct member_traits;
template <class S, class T> struct member_traits<T S::*> {
  using owner = S;                                 ///< the settings struct
  using value = typename unwrap_optional<T>::type; ///< what the key's JSON value becomes
};
template <auto Member> using owner_t = typename member_traits<decltype(Member)>::owner;
template <auto Member> using value_t = typename member_traits<decltype(Member)>::value;

template <class T> constexpr value_kind kind_of_value() {
  if constexpr (std::is_same_v<T, bool>) {
    return value_kind::boolean;
  } else if constexpr (std::is_enum_v<T>) {
    return value_kind::choice;
  } else if constexpr (std::is_integral_v<T>) {
    return value_kind::integer;
  } else if constexpr (std::is_floating_point_v<T>) {
    return value_kind::number;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value_kind::string;
  } else {
    static_assert(std::is_same_v<T, std::array<double, 2>>, "a config key holds a bool, an integer, a number, a "
                                                            "string, an enumeration or a pair of numbers");
    return value_kind::pair;
  }
}

template <class S> struct key_row;

/// One key being read: the object it is in, its table and row, the settings it fills, and the
/// outside values that resolve `"auto"`.
template <class S> struct key_read {
  object_reader& r;                  ///< the JSON object the key is in
  std::span<const key_row<S>> table; ///< that object's table (alias rows are found there)
  const key_row<S>& row;             ///< the key's row
  S& out;                            ///< the settings the object fills
  const config_inputs& in;           ///< outside values
};

/// One key of a JSON object in the config. Build rows with `key`, `alias`, `checked` and `hand`,
/// then the column setters below; see docs/config.md, "The key tables".
template <class S> struct key_row {
  using read_fn = void (*)(const key_row&, const parse_context&, std::string_view path, const json&, S&);
  using write_fn = json (*)(const S&);
  using hand_fn = void (*)(const key_read<S>&);
  using input_fn = std::optional<json> (*)(const config_inputs&);
  using auto_fn = std::optional<json> (*)(const parse_context&, std::string_view path, const config_inputs&);

  std::string_view name;              ///< the key, as DeepSpeed spells it
  value_kind kind = value_kind::none; ///< from the member's type
  read_fn read = nullptr;             ///< JSON value -> member (type and bounds checked); nullptr: none
  write_fn write = nullptr;           ///< member -> JSON for `to_json`; nullptr: not written
  std::int64_t int_min = std::numeric_limits<std::int64_t>::min(); ///< integers: the least accepted
  std::int64_t int_max = i64_max;                                  ///< integers: the greatest accepted
  double min = -f64_max;                                           ///< numbers: the least accepted
  double max = f64_max;                                            ///< numbers: the greatest accepted
  bool max_excluded = false;                                       ///< numbers: `max` itself is refused
  bool null_is_absent = false;                                     ///< null reads as "not given" (DeepSpeed's None)
  bool case_insensitive = false;  ///< enumerations: names compared ignoring case (DeepSpeed lower-cases)
  std::string_view alias_of;      ///< alias rows: the key this name is read as
  bool is_deprecated = false;     ///< a name DeepSpeed keeps only for old configs
  bool read_by_hand = false;      ///< read by `hand_read`, or by the block's own code when that is null
  hand_fn hand_read = nullptr;    ///< called in table order in place of the typed read
  input_fn input = nullptr;       ///< the outside value for this key (`config_inputs`), if any
  std::string_view input_name;    ///< how messages name that input
  std::string_view auto_needs;    ///< what an unresolved `"auto"` needs, for its message
  auto_fn resolve_auto = nullptr; ///< what `"auto"` means here, when no input resolves it
  unsigned stage_mask = 0b1111;   ///< zero_optimization: bit s set when the key acts at stage s
  std::string_view note_value;    ///< JSON text of a value without effect; empty: any value
  std::string_view note_text;     ///< the note for `note_value`; empty: no note
  bool nvme_only = false;         ///< offload blocks: acts only with device nvme

  /// Integer or number keys: accepts values from `lo` to `hi`.
  template <class T> constexpr key_row range(T lo, T hi) const {
    key_row k = *this;
    if (kind == value_kind::integer) {
      if constexpr (std::is_integral_v<T>) {
        k.int_min = lo;
        k.int_max = hi;
        return k;
      } else {
        throw "an integer key takes integer bounds";
      }
    }
    if (kind != value_kind::number && kind != value_kind::pair) {
      throw "bounds are for integer and number keys";
    }
    k.min = static_cast<double>(lo);
    k.max = static_cast<double>(hi);
    return k;
  }
  /// Integer or number keys: accepts `lo` and above.
  template <class T> constexpr key_row at_least(T lo) const {
    if constexpr (std::is_integral_v<T>) {
      if (kind == value_kind::integer) {
        return range<std::int64_t>(lo, i64_max);
      }
    }
    return range<double>(static_cast<double>(lo), f64_max);
  }
  /// Number keys: refuses the upper bound itself.
  constexpr key_row max_exclusive() const { return with(&key_row::max_excluded, true); }
  /// null reads as "not given", DeepSpeed's None.
  constexpr key_row or_null() const { return with(&key_row::null_is_absent, true); }
  /// Enumerations: names compared ignoring case.
  constexpr key_row any_case() const { return with(&key_row::case_insensitive, true); }
  /// A name DeepSpeed keeps only for old configs.
  constexpr key_row deprecated() const { return with(&key_row::is_deprecated, true); }
  /// Read by hand: by `f`, called in table order, or (null) by the block's own code.
  constexpr key_row by_hand(hand_fn f = nullptr) const {
    key_row k = with(&key_row::read_by_hand, true);
    k.hand_read = f;
    return k;
  }
  /// Written to `to_json` by `f` instead of the member's own value (a key with a value besides its type's).
  constexpr key_row written_by(write_fn f) const { return with(&key_row::write, f); }
  /// `"auto"` (when no input resolves it) means what `f` returns; nullopt leaves the default.
  constexpr key_row on_auto(auto_fn f) const { return with(&key_row::resolve_auto, f); }
  /// zero_optimization keys: acts only at the stages whose bits are set; noted at the others.
  constexpr key_row at_stages(unsigned mask) const { return with(&key_row::stage_mask, mask); }
  /// The value `value` (JSON text; empty for any) has no effect: noted as `text`.
  constexpr key_row noted_if(std::string_view value, std::string_view text) const {
    key_row k = with(&key_row::note_value, value);
    k.note_text = text;
    return k;
  }
  /// Offload keys that act only with device nvme; noted with another device.
  constexpr key_row nvme() const { return with(&key_row::nvme_only, true); }
  /// The outside value `Input` resolves `"auto"` and an absent key, and must agree with a value given.
  /// \param name  how messages name it, e.g. "config_inputs::lr (--lr)".
  /// \param needs what an unresolved `"auto"` needs, e.g. "the learning rate (config_inputs::lr, --lr)".
  template <auto Input> constexpr key_row from_input(std::string_view name, std::string_view needs) const;

private:
  template <class T> constexpr key_row with(T key_row::*column, T value) const {
    key_row k = *this;
    k.*column = value;
    return k;
  }
};

/// The choices an enumeration key is read with; none for other keys.
inline constexpr std::nullptr_t no_choices = nullptr;

/// The value of a key of type `T`, typed and bounded by its row. A pair is Adam's betas, the only
/// pair-valued key, and its message says so.
template <class T, const auto& Choices, class S>
T read_as(const key_row<S>& row, const parse_context& ctx, std::string_view path, const json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return as_bool(ctx, path, v);
  } else if constexpr (std::is_enum_v<T>) {
    static_assert(!std::is_same_v<std::remove_cvref_t<decltype(Choices)>, std::nullptr_t>,
                  "an enumeration key names its choices: key<&S::member, choices>(name)");
    return as_choice<T>(ctx, path, v, std::span<const choice<T>>(Choices), row.case_insensitive);
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(as_int(ctx, path, v, row.int_min, row.int_max));
  } else if constexpr (std::is_floating_point_v<T>) {
    return as_number(ctx, path, v, row.min, row.max, false, row.max_excluded);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return as_string(ctx, path, v);
  } else {
    if (!v.is_array() || v.size() != 2) {
      ctx.fail(path, cat("found ", show(v), "; expected [beta1, beta2], two numbers",
                         number_range(row.min, row.max, false, row.max_excluded)));
    }
    const std::string p(path);
    return T{as_number(ctx, p + "[0]", v[0], row.min, row.max, false, row.max_excluded),
             as_number(ctx, p + "[1]", v[1], row.min, row.max, false, row.max_excluded)};
  }
}

template <auto Member, const auto& Choices>
void read_member(const key_row<owner_t<Member>>& row, const parse_context& ctx, std::string_view path, const json& v,
                 owner_t<Member>& out) {
  out.*Member = read_as<value_t<Member>, Choices>(row, ctx, path, v);
}

/// Keys whose value is checked but kept nowhere.
template <class S, class T>
void check_only(const key_row<S>& row, const parse_context& ctx, std::string_view path, const json& v, S&) {
  static_cast<void>(read_as<T, no_choices>(row, ctx, path, v));
}

template <class T> json to_json_value(const T& v) {
  if constexpr (is_optional_v<T>) {
    return v ? to_json_value(*v) : json(nullptr);
  } else if constexpr (std::is_enum_v<T>) {
    return json(name_of(v));
  } else if constexpr (std::is_same_v<T, std::array<double, 2>>) {
    return json::array({v[0], v[1]});
  } else {
    return json(v);
  }
}

template <auto Member> json write_member(const owner_t<Member>& s) { return to_json_value(s.*Member); }

/// A value of `config_inputs` as JSON, for comparing with and standing in for a config value.
template <class T> std::optional<json> to_input(const std::optional<T>& v) {
  if (!v) {
    return std::nullopt;
  }
  return to_json_value(*v);
}

template <auto Input> std::optional<json> input_value(const config_inputs& in) { return to_input(in.*Input); }

template <class S>
template <auto Input>
constexpr key_row<S> key_row<S>::from_input(std::string_view name, std::string_view needs) const {
  key_row k = with(&key_row::input, &input_value<Input>);
  k.input_name = name;
  k.auto_needs = needs;
  return k;
}

/// The row of a key held in `Member` and read by its type; an enumeration names its `Choices`.
template <auto Member, const auto& Choices = no_choices> constexpr key_row<owner_t<Member>> key(std::string_view name) {
  key_row<owner_t<Member>> k;
  k.name = name;
  k.kind = kind_of_value<value_t<Member>>();
  k.read = &read_member<Member, Choices>;
  k.write = &write_member<Member>;
  return k;
}

/// The row of another name of the key `of`: read with it, both given must agree, and a note says
/// which was read.
template <class S> constexpr key_row<S> alias(std::string_view name, std::string_view of) {
  key_row<S> k;
  k.name = name;
  k.alias_of = of;
  return k;
}

/// The row of a key whose value of type `T` is checked but kept nowhere (it has no effect in zero).
template <class S, class T> constexpr key_row<S> checked(std::string_view name) {
  key_row<S> k;
  k.name = name;
  k.kind = kind_of_value<T>();
  k.read = &check_only<S, T>;
  return k;
}

/// The row of a key without a member of its own: a block, or a key the block's code reads by hand.
template <class S> constexpr key_row<S> hand(std::string_view name) {
  key_row<S> k;
  k.name = name;
  return k.by_hand();
}

/// The names of a table's rows, for `config_blocks` and the unknown-key check.
template <class S, std::size_t N> constexpr std::array<std::string_view, N> names_of(const key_row<S> (&table)[N]) {
  std::array<std::string_view, N> out{};
  for (std::size_t i = 0; i < N; ++i) {
    out[i] = table[i].name;
  }
  return out;
}
template <const auto& Table> inline constexpr auto key_names = names_of(Table);

/// True when a table is well formed: names unique, every alias names a key of the table that is
/// not an alias, a key read by type has at most one alias and none when it has an input. Checked
/// by `static_assert` where the tables are defined.
template <class S, std::size_t N> constexpr bool well_formed(const key_row<S> (&table)[N]) {
  for (std::size_t i = 0; i < N; ++i) {
    std::size_t aliases = 0;
    bool target = table[i].alias_of.empty();
    for (std::size_t j = 0; j < N; ++j) {
      if (j != i && table[j].name == table[i].name) {
        return false;
      }
      aliases += table[j].alias_of == table[i].name ? 1 : 0;
      target = target || (table[j].name == table[i].alias_of && table[j].alias_of.empty());
    }
    const bool typed = table[i].alias_of.empty() && !table[i].read_by_hand;
    if (!target || (typed && (aliases > 1 || (aliases == 1 && table[i].input != nullptr)))) {
      return false;
    }
  }
  return true;
}

/// The row of `name` in `table`.
/// \throws std::logic_error when there is none (a bug in zero).
template <class S> const key_row<S>& row_of(std::span<const key_row<S>> table, std::string_view name) {
  for (const key_row<S>& row : table) {
    if (row.name == name) {
      return row;
    }
  }
  throw std::logic_error(cat("zero::config: no key table row for ", name));
}

/// A value read from the config, or taken from an input when the config has none or "auto".
struct taken {
  std::optional<json> value; ///< empty: absent, or "auto" left unresolved
  std::string path;          ///< where to point errors: the key, plus "(from <input>)" for inputs
  bool was_auto = false;     ///< the config wrote "auto"
};

/// Reads `key`, merged with an outside value as Hugging Face's Trainer does: a concrete config
/// value must agree with the input when both are given; "auto" or an absent key takes the input.
/// \param input      the outside value, if any.
/// \param input_name how messages name it, e.g. "config_inputs::lr (--lr)".
/// \param auto_needs when not empty, an unresolved "auto" is refused with "resolving it needs <this>".
inline taken take(object_reader& r, std::string_view key, const std::optional<json>& input, std::string_view input_name,
                  std::string_view auto_needs) {
  taken t;
  t.path = r.path_of(key);
  const json* v = r.get(key);
  if (v != nullptr && !is_auto(*v)) {
    if (input && !same_value(*v, *input)) {
      r.ctx().fail(t.path, cat("found ", show(*v), ", but ", input_name, " is ", show(*input),
                               "; make them agree, or write \"auto\" to take ", show(*input)));
    }
    t.value = *v;
    return t;
  }
  t.was_auto = v != nullptr;
  if (input) {
    t.value = *input;
    t.path += cat(" (from ", input_name, ")");
    return t;
  }
  if (t.was_auto && !auto_needs.empty()) {
    r.ctx().fail(t.path, cat("found \"auto\"; resolving it needs ", auto_needs));
  }
  return t;
}

/// Reads a key under its name or an alias DeepSpeed also accepts; both given must agree, and reading
/// the alias is noted.
/// \param deprecated true when the alias is deprecated in DeepSpeed (the note says so).
/// \param used_path  set to the path of the name that was read.
inline const json* aliased(object_reader& r, std::string_view name, std::string_view alias, bool deprecated,
                           std::string* used_path = nullptr) {
  const json* a = r.get(name);
  const json* b = r.get(alias);
  if (a != nullptr && b != nullptr && !same_value(*a, *b)) {
    r.ctx().fail(r.path_of(alias),
                 cat("found ", show(*b), ", but ", r.path_of(name), " is ", show(*a), "; they are the same setting",
                     (deprecated ? " (the first is the deprecated name)" : ""), ", give one"));
  }
  if (b != nullptr) {
    r.ctx().note(r.path_of(alias), cat(deprecated ? "deprecated; " : "", "read as ", r.path_of(name)));
  }
  if (used_path != nullptr) {
    *used_path = a != nullptr ? r.path_of(name) : r.path_of(alias);
  }
  return a != nullptr ? a : b;
}

/// Reads a row's key into its member: under its name or its alias, null as not given when the row
/// says so, merged with its input (`take`) or with `"auto"` resolved by the row, then typed and
/// bounded by the row.
/// \returns true when a value was read (the member was set).
/// \throws config_error naming the path read, what was found and what the row accepts.
template <class S> bool read_typed(const key_read<S>& k) {
  const key_row<S>& row = k.row;
  object_reader& r = k.r;
  const key_row<S>* alias_row = nullptr;
  for (const key_row<S>& other : k.table) {
    alias_row = other.alias_of == row.name ? &other : alias_row;
  }
  std::string path = r.path_of(row.name);
  const json* v =
      alias_row != nullptr ? aliased(r, row.name, alias_row->name, alias_row->is_deprecated, &path) : r.get(row.name);
  std::optional<json> held; // a value from the inputs, or what "auto" resolved to
  if (v != nullptr && v->is_null() && row.null_is_absent) {
    // null is DeepSpeed's "not set": the input, if any, applies as to an absent key.
    v = nullptr;
    if (row.input != nullptr && (held = row.input(k.in))) {
      path += cat(" (from ", row.input_name, ")");
      v = &*held;
    }
  } else if (row.input != nullptr) {
    taken t = take(r, row.name, row.input(k.in), row.input_name, row.auto_needs);
    held = std::move(t.value);
    v = held ? &*held : nullptr;
    path = std::move(t.path);
  } else if (v != nullptr && row.resolve_auto != nullptr && is_auto(*v)) {
    held = row.resolve_auto(r.ctx(), path, k.in);
    v = held ? &*held : nullptr;
  }
  if (v == nullptr) {
    return false;
  }
  row.read(row, r.ctx(), path, *v, k.out);
  return true;
}

/// `read_typed` for the row of `name`, for a block's code that reads a key at its own point.
template <class S, std::size_t N>
bool read_named(object_reader& r, const key_row<S> (&table)[N], std::string_view name, S& out,
                const config_inputs& in) {
  return read_typed(key_read<S>{r, table, row_of<S>(table, name), out, in});
}

/// Reads every key of `table` in table order: by its row's type, or by its row's hand-written
/// function. Alias rows are read with their key; rows read by hand without a function are left to
/// the block's own code.
template <class S, std::size_t N>
void read_keys(object_reader& r, const key_row<S> (&table)[N], S& out, const config_inputs& in) {
  for (const key_row<S>& row : table) {
    const key_read<S> k{r, table, row, out, in};
    if (row.hand_read != nullptr) {
      row.hand_read(k);
    } else if (!row.read_by_hand && row.alias_of.empty() && row.read != nullptr) {
      static_cast<void>(read_typed(k));
    }
  }
}

/// Notes every key present that has no effect at `stage`, with the stages it acts at (an alias row
/// acts where its key does).
template <class S, std::size_t N> void note_stages(object_reader& r, const key_row<S> (&table)[N], int stage) {
  for (const key_row<S>& row : table) {
    const unsigned mask = row.alias_of.empty() ? row.stage_mask : row_of<S>(table, row.alias_of).stage_mask;
    if (r.has(row.name) && (mask & (1u << stage)) == 0) {
      std::string at;
      for (int s = 0; s < 4; ++s) {
        if ((mask & (1u << s)) != 0) {
          at += cat(at.empty() ? "" : ", ", std::to_string(s));
        }
      }
      r.ctx().note(r.path_of(row.name), cat("no effect at stage ", std::to_string(stage), " (used at stage ", at, ")"));
    }
  }
}

/// Notes every key present, at a stage where it acts, whose value has no effect in zero (its row's
/// `noted_if`).
template <class S, std::size_t N> void note_values(object_reader& r, const key_row<S> (&table)[N], int stage) {
  for (const key_row<S>& row : table) {
    const json* v = r.has(row.name) ? r.get(row.name) : nullptr;
    if (v != nullptr && !row.note_text.empty() && (row.stage_mask & (1u << stage)) != 0 &&
        (row.note_value.empty() || *v == json::parse(row.note_value))) {
      r.ctx().note(r.path_of(row.name), std::string(row.note_text));
    }
  }
}

/// The keys of `table` that have a member, written as `to_json` writes them.
template <class S, std::size_t N> json write_keys(const key_row<S> (&table)[N], const S& s) {
  json j = json::object();
  for (const key_row<S>& row : table) {
    if (row.write != nullptr) {
      j[std::string(row.name)] = row.write(s);
    }
  }
  return j;
}

} // namespace zero::detail
