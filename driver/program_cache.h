// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <unordered_map>

#include "isa/isa.h"

namespace tpu::driver {

/// A program-cache key: the complete input of a kernel generator. A key is a plain struct of
/// every input the code depends on (shapes, tiling, precision, ...) with
/// - `auto operator<=>(const Key&) const = default;` (the cache compares with it, so a field can
///   never be left out of the comparison),
/// - `std::string name() const`, the kernel's name for per-kernel statistics ("add"),
/// - `friend size_t hash_value(const Key&)` (hash_fields(...) of its fields; a field left out
///   of the hash costs only collisions),
/// - a generator `isa::Program generate(const Key&)` in the key's namespace: the program is a
///   function of the key and nothing else.
template <class K>
concept ProgramKey = std::totally_ordered<K> && std::copy_constructible<K> && requires(const K& k) {
    { k.name() } -> std::convertible_to<std::string>;
    { hash_value(k) } -> std::convertible_to<size_t>;
    { generate(k) } -> std::same_as<isa::Program>;
};

/// Combines the hashes of `fields` (integers, enums, bools, floats, strings).
template <class... T>
size_t hash_fields(const T&... fields) {
    size_t h = 0xcbf29ce484222325ull;
    ((h = (h ^ std::hash<T>{}(fields)) * 0x100000001b3ull), ...);
    return h;
}

/// Compiled kernels keyed by their typed keys. A changing shape shows up as new misses
/// (recompilation), as it does on a real TPU. Hits, misses and compile time are counted over
/// every key type.
class ProgramCache {
public:
    /// The cached program of `key`, or generate(key) (timed and counted as a miss). A program
    /// without a name is named key.name(), so per-kernel statistics group every shape of a
    /// kernel together.
    template <ProgramKey K>
    const isa::Program& get(const K& key) {
        auto& programs = table<K>().programs;
        if (const auto it = programs.find(key); it != programs.end()) {
            ++m_hits;
            return it->second;
        }
        return programs.emplace(key, compile(key.name(), [&] { return generate(key); }))
            .first->second;
    }

    uint64_t hits() const { return m_hits; }
    uint64_t misses() const { return m_misses; }
    /// Host seconds spent compiling (misses only).
    double compile_seconds() const { return m_compile_seconds; }

private:
    struct TableBase {
        virtual ~TableBase() = default;
    };
    template <class K>
    struct Table : TableBase {
        struct Hash {
            size_t operator()(const K& k) const { return hash_value(k); }
        };
        std::unordered_map<K, isa::Program, Hash> programs;  // nodes are stable: get() returns
                                                             // references into it
    };
    template <class K>
    Table<K>& table() {
        auto& t = m_tables[std::type_index(typeid(K))];
        if (!t) t = std::make_unique<Table<K>>();
        return static_cast<Table<K>&>(*t);
    }
    /// Runs `generate`, times it, counts a miss and names the program `name` if it has none.
    isa::Program compile(const std::string& name, const std::function<isa::Program()>& generate);

    std::unordered_map<std::type_index, std::unique_ptr<TableBase>> m_tables;
    uint64_t m_hits = 0, m_misses = 0;
    double m_compile_seconds = 0;
};

}  // namespace tpu::driver
