// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>

/// Configuration reflection: every config struct declares each field once, in one list that
/// holds its type, name, default, unit, documentation and constraints (TPU_REFLECT below). JSON
/// loading, `--set key.path=value`, validation, the effective-config dump and the docs all walk
/// that list through `visit(Visitor&)`.
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
    /// One leaf field; `unit` is empty for counts, flags and names.
    virtual void field(std::string_view key, FieldRef ref, std::string_view unit,
                       std::string_view doc, const Check& check) = 0;
    /// Start of a nested section.
    virtual void enter(std::string_view key, std::string_view doc) = 0;
    /// End of the innermost section.
    virtual void leave() = 0;

    /// Convenience: `v("clock_mhz", clock_mhz, "MHz", "core clock", {.min = 1})`.
    template <class T>
    void operator()(std::string_view key, T& value, std::string_view unit, std::string_view doc,
                    Check check = {}) {
        field(key, FieldRef{&value}, unit, doc, check);
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

/// Declares a config struct's members and its visit() from one list, so a field's name, default,
/// unit, doc and check are written once, side by side. The list is a macro taking two macros:
///
///     #define TPU_HBM_FIELDS(F, S)  (one entry per line, each line ending in a backslash)
///         F(uint32_t, tck_ps, 1136, "ps", "HBM clock period", .min = 100)
///         S(HbmTiming, timing, "HBM2 timing parameters")
///     struct HbmConfig { TPU_REFLECT(TPU_HBM_FIELDS) };
///
/// F(type, name, default, unit, doc, check...) is a leaf: the trailing arguments initialise a
/// tpu::sim::Check (designated initialisers, may be empty). S(type, name, doc) is a nested
/// config struct with its own TPU_REFLECT. Members keep list order, so designated initialisers
/// and the JSON dump follow it.
#define TPU_REFLECT(LIST)                                          \
    LIST(TPU_REFLECT_DECLARE_FIELD_, TPU_REFLECT_DECLARE_SECTION_) \
    void visit(::tpu::sim::Visitor& v) {                           \
        LIST(TPU_REFLECT_VISIT_FIELD_, TPU_REFLECT_VISIT_SECTION_) \
    }

#define TPU_REFLECT_DECLARE_FIELD_(type, name, def, unit, doc, ...) type name = def;
#define TPU_REFLECT_DECLARE_SECTION_(type, name, doc) type name{};
#define TPU_REFLECT_VISIT_FIELD_(type, name, def, unit, doc, ...) \
    v(#name, name, unit, doc, ::tpu::sim::Check{__VA_ARGS__});
#define TPU_REFLECT_VISIT_SECTION_(type, name, doc) v.section(#name, name, doc);
