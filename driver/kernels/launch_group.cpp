// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/launch_group.h"

#include <algorithm>

namespace tpu::driver {

Event wait_all(Device& dev, const std::vector<LaunchHandle>& handles) {
    Event res;
    for (size_t h = 0; h < handles.size(); ++h) {
        Event ev = dev.wait(handles[h]);
        if (h == 0) {
            res = ev;
            continue;
        }
        res.start_cycle = std::min(res.start_cycle, ev.start_cycle);
        res.end_cycle = std::max(res.end_cycle, ev.end_cycle);
        res.host_seconds = std::max(res.host_seconds, ev.host_seconds);
        for (size_t k = 0; k < ev.cores.size(); ++k) {
            const auto at = std::lower_bound(res.cores.begin(), res.cores.end(), ev.cores[k]);
            res.core_cycles.insert(res.core_cycles.begin() + (at - res.cores.begin()),
                                   ev.core_cycles[k]);
            res.cores.insert(at, ev.cores[k]);
        }
    }
    return res;
}

uint64_t kernel_hbm_bytes(const Device& dev) {
    uint64_t b = 0;
    for (const KernelStats& k : dev.kernel_stats()) b += k.hbm_read_bytes + k.hbm_write_bytes;
    return b;
}

}  // namespace tpu::driver
