// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>

/// Configuration reflection: every config struct lists its fields once, in `visit(Visitor&)`,
/// with default (the member initialiser), documentation and constraints. JSON loading,
/// `--set key.path=value`, validation, the effective-config dump and the docs all walk that list.
namespace tpu::sim {

/// Constraints a field must meet. Checked by sim::validate(); the error names the key path.
struct Check {
    double min = -std::numeric_limits<double>::infinity();  ///< smallest allowed value
    double max = std::numeric_limits<double>::infinity();   ///< largest allowed value
    bool pow2 = false;                                      ///< must be a power of two
    std::string_view choices = {};  ///< strings only: allowed values, comma-separated
};

/// Pointer to one config field of a supported type.
using FieldRef = std::variant<bool*, uint32_t*, uint64_t*, int64_t*, double*, std::string*>;

/// Walks the fields of a config struct.
class Visitor {
public:
    virtual ~Visitor() = default;
    /// One leaf field.
    virtual void field(std::string_view key, FieldRef ref, std::string_view doc,
                       const Check& check) = 0;
    /// Start of a nested section.
    virtual void enter(std::string_view key, std::string_view doc) = 0;
    /// End of the innermost section.
    virtual void leave() = 0;

    /// Convenience: `v("clock_mhz", clock_mhz, "core clock", {.min = 1})`.
    template <class T>
    void operator()(std::string_view key, T& value, std::string_view doc, Check check = {}) {
        field(key, FieldRef{&value}, doc, check);
    }
    /// Convenience: a nested struct with its own visit().
    template <class S>
    void section(std::string_view key, S& sub, std::string_view doc) {
        enter(key, doc);
        sub.visit(*this);
        leave();
    }
};

}  // namespace tpu::sim
