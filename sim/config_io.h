// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sim/reflect.h"

/// Loading, overriding, validating and printing any reflected config (see sim/reflect.h).
namespace tpu::sim {

/// A bad config file, key or value. The message names the file and the key path.
class ConfigError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Applies a visitor to the root config struct.
using VisitRoot = std::function<void(Visitor&)>;

/// Overlays JSON text onto the config; `source` names the file in errors. Unknown keys, wrong
/// types and out-of-range values throw ConfigError("FILE: key a.b.c: ...").
void apply_json(const VisitRoot& root, std::string_view text, std::string_view source);
/// The largest config file read: a board config is a few KB, so anything near this is not one.
inline constexpr uint64_t kMaxConfigBytes = uint64_t(16) << 20;

/// Reads a JSON file (at most kMaxConfigBytes) and overlays it; a missing, unreadable or
/// oversized file is a ConfigError.
void apply_json_file(const VisitRoot& root, const std::string& path);
/// Applies one `a.b.c=value` override (from --set).
void apply_override(const VisitRoot& root, std::string_view assignment);
/// Checks every field against its Check; throws ConfigError naming the first bad key.
void validate_fields(const VisitRoot& root);
/// The effective config as pretty JSON (2-space indent, keys in declaration order).
std::string dump_json(const VisitRoot& root);
/// A Markdown table: key, type, default (current value), description.
std::string doc_table(const VisitRoot& root);

/// Helpers for config types with a visit(Visitor&) member.
template <class C>
VisitRoot root_of(C& cfg) {
    return [&cfg](Visitor& v) { cfg.visit(v); };
}

}  // namespace tpu::sim
