// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

#include "driver/device.h"

/// Device-resident fp32 matrices for data-parallel work: one buffer per core of a core set, the
/// same shape on every core, so one launch runs a kernel on all of them at once.
namespace tpu::driver {

/// An fp32 rows x cols row-major matrix held once per core of `cores` (per-core contents).
struct Tensor {
    std::vector<uint32_t> cores;  ///< the core set, in launch order
    std::vector<Buffer> bufs;     ///< bufs[i] lives on cores[i], rows x cols x 4 bytes
    uint32_t rows = 0;            ///< rows
    uint32_t cols = 0;            ///< columns (the row stride)

    /// rows x cols.
    uint64_t elements() const { return uint64_t(rows) * cols; }
    /// elements x 4.
    uint64_t bytes() const { return elements() * 4; }
};

/// Allocates rows x cols fp32 on every core of `cores` (contents undefined until written).
Tensor alloc_tensor(Device& dev, const std::vector<uint32_t>& cores, uint32_t rows, uint32_t cols);
/// Frees every replica and empties `t`.
void free_tensor(Device& dev, Tensor& t);
/// Writes `values` (elements() floats) into replica `index` (a timed host transfer).
void write_tensor(Device& dev, const Tensor& t, size_t index, const std::vector<float>& values);
/// Writes the same values into every replica.
void write_tensor_all(Device& dev, const Tensor& t, const std::vector<float>& values);
/// Reads replica `index` back (a host sync).
std::vector<float> read_tensor(Device& dev, const Tensor& t, size_t index);
/// Values [offset, offset + rows x cols) of every replica of `t` as a rows x cols tensor: the
/// same memory, no copy (a parameter in a flat buffer, a block of rows, a reshape).
Tensor view(const Tensor& t, uint64_t offset, uint32_t rows, uint32_t cols);
/// Throws DeviceError(Usage) naming `what` unless `a` and `b` use the same core set and shape.
void check_same(const Tensor& a, const Tensor& b, const char* what);

}  // namespace tpu::driver
