// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/tensor.h"

#include <fmt/format.h>

namespace tpu::driver {

Tensor alloc_tensor(Device& dev, const std::vector<uint32_t>& cores, uint32_t rows, uint32_t cols) {
    if (cores.empty()) throw DeviceError(ErrorKind::Usage, "a tensor needs at least one core");
    if (rows == 0 || cols == 0)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("a tensor of {} x {} is empty", rows, cols));
    // rows x cols x 4 in 64 bits can still wrap (2^31 x 2^31 x 4 is 0): compare counts.
    if (uint64_t(rows) * cols > kHbmWindowBytes / 4)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("a tensor of {} x {} fp32 values is larger than the 4 GiB "
                                      "a kernel addresses",
                                      rows, cols));
    Tensor t;
    t.cores = cores;
    t.rows = rows;
    t.cols = cols;
    try {
        for (uint32_t core : cores) t.bufs.push_back(dev.alloc(t.bytes(), core));
    } catch (...) {
        free_tensor(dev, t);
        throw;
    }
    return t;
}

void free_tensor(Device& dev, Tensor& t) {
    for (const Buffer& b : t.bufs) dev.free(b);
    t = Tensor{};
}

namespace {
void check_index(const Tensor& t, size_t index) {
    if (index >= t.bufs.size())
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("replica {} of a tensor on {} cores", index, t.bufs.size()));
}
void check_values(const Tensor& t, size_t n) {
    if (n != t.elements())
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{} values for a {} x {} tensor", n, t.rows, t.cols));
}
}  // namespace

void write_tensor(Device& dev, const Tensor& t, size_t index, const std::vector<float>& values) {
    check_index(t, index);
    check_values(t, values.size());
    dev.write(t.bufs[index], values.data(), t.bytes());
}

void write_tensor_all(Device& dev, const Tensor& t, const std::vector<float>& values) {
    for (size_t i = 0; i < t.bufs.size(); ++i) write_tensor(dev, t, i, values);
}

std::vector<float> read_tensor(Device& dev, const Tensor& t, size_t index) {
    check_index(t, index);
    std::vector<float> out(t.elements());
    dev.read(t.bufs[index], out.data(), t.bytes());
    return out;
}

Tensor view(const Tensor& t, uint64_t offset, uint32_t rows, uint32_t cols) {
    if (offset > t.elements() || uint64_t(rows) * cols > t.elements() - offset)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("view of {} x {} values from {} of a {} x {} tensor", rows,
                                      cols, offset, t.rows, t.cols));
    Tensor v;
    v.cores = t.cores;
    v.rows = rows;
    v.cols = cols;
    for (const Buffer& b : t.bufs)
        v.bufs.push_back({b.core, b.addr + offset * 4, uint64_t(rows) * cols * 4});
    return v;
}

void check_same(const Tensor& a, const Tensor& b, const char* what) {
    if (a.cores != b.cores || a.rows != b.rows || a.cols != b.cols)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("{}: tensors differ in shape or cores ({} x {} on {} "
                        "cores vs {} x {} on {} cores)",
                        what, a.rows, a.cols, a.cores.size(), b.rows, b.cols, b.cores.size()));
}

}  // namespace tpu::driver
