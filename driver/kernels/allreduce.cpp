// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/allreduce.h"

#include <fmt/format.h>

#include "hw/board.h"
#include "isa/assembler.h"

namespace tpu::driver {

uint32_t allreduce_chunk_bytes(const AllReducePlan& p) {
    const uint32_t per = (p.elements + 2 * p.cores - 1) / (2 * p.cores);
    return per * 4;
}

uint64_t allreduce_vmem_bytes(const AllReducePlan& p) {
    return uint64_t(allreduce_chunk_bytes(p)) * (2 * p.cores);
}

AllReducePlan plan_allreduce(uint32_t cores, uint32_t elements, uint64_t vmem_bytes) {
    if (cores < 2) throw DeviceError(ErrorKind::Usage, "all-reduce needs at least 2 cores");
    if (elements == 0) throw DeviceError(ErrorKind::Usage, "all-reduce of 0 values");
    AllReducePlan p{cores, elements, 0, 0, 0};
    const uint64_t full = allreduce_vmem_bytes(p);
    const uint64_t scratch = uint64_t(allreduce_chunk_bytes(p)) * 2 * (cores - 1);
    if (2 * full + scratch > vmem_bytes)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("all-reduce of {} values needs {} bytes of VMEM per core; "
                                      "the core has {}",
                                      elements, 2 * full + scratch, vmem_bytes));
    p.y_addr = static_cast<uint32_t>(full);
    p.scratch_addr = static_cast<uint32_t>(2 * full);
    return p;
}

isa::Program allreduce_program(const AllReducePlan& p) {
    const uint32_t N = p.cores, C = allreduce_chunk_bytes(p), E = C / 4;
    const uint64_t half = uint64_t(N) * C;  // direction 1 works on the second half
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    L("# ring all-reduce: N={} chunk={} B; s1 position, s2 next core, s3 previous core", N, C);
    // Byte offset of chunk (s1 + delta) mod N into `reg`.
    auto chunk = [&](int delta, const char* reg) {
        L("        add {}, s1, {}", reg, (delta % int(N) + int(N)) % int(N));
        L("        remu {}, {}, {}", reg, reg, N);
        L("        mul {}, {}, {}", reg, reg, C);
    };
    // Direction 0 sends to s2 (clockwise) and receives from s3; direction 1 the reverse. In
    // reduce-scatter step k direction 0 sends chunk p-k and adds the received chunk p-1-k into
    // its own; direction 1 mirrors it (p+k, p+1+k). Both directions interleave step by step.
    for (uint32_t k = 0; k + 1 < N; ++k) {
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const uint64_t base = p.x_addr + d * half;
            const uint64_t slot = p.scratch_addr + (uint64_t(d) * (N - 1) + k) * C;
            if (k > 0) L("        wait f{}, {}", 3 + d, k);
            chunk(sign * int(k), "s10");
            L("        ici.v {}, [{}], [s10+{}], {}, f{}", d == 0 ? "s2" : "s3", slot, base, C,
              1 + d);
        }
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const uint64_t base = p.x_addr + d * half;
            const uint64_t slot = p.scratch_addr + (uint64_t(d) * (N - 1) + k) * C;
            L("        wait f{}, {}", 1 + d, k + 1);
            chunk(sign * (int(k) + 1), "s11");
            L("        v.add [s11+{}], [s11+{}], [{}], {}, f{}", base, base, slot, E, 3 + d);
        }
    }
    // Own reduced chunk (p+1 clockwise, p-1 counter-clockwise) into y.
    for (int d = 0; d < 2; ++d) {
        const int sign = d == 0 ? -1 : 1;
        L("        wait f{}, {}", 3 + d, N - 1);
        chunk(-sign, "s12");
        L("        dma.vv [s12+{}], [s12+{}], 1, {}, {}, {}, f7", p.y_addr + d * half,
          p.x_addr + d * half, C, C, C);
    }
    // All-gather: step k sends chunk p+1-k (clockwise) to the neighbour's y; from step 1 on
    // the chunk is the one received in the step before.
    for (uint32_t k = 0; k + 1 < N; ++k)
        for (int d = 0; d < 2; ++d) {
            const int sign = d == 0 ? -1 : 1;
            const char* src = k == 0 ? "x" : "y";
            if (k > 0) L("        wait f{}, {}", 5 + d, k);
            chunk(sign * (int(k) - 1), "s13");
            L("        ici.v {}, [s13+{}], [s13+{}], {}, f{}   # from {}", d == 0 ? "s2" : "s3",
              p.y_addr + d * half, (k == 0 ? p.x_addr : p.y_addr) + d * half, C, 5 + d, src);
        }
    L("        wait f5, {}", N - 1);
    L("        wait f6, {}", N - 1);
    L("        wait f7, 2");
    L("        halt");
    return isa::assemble(s, "allreduce.s");
}

AllReduceResult allreduce(Device& dev, const std::vector<uint32_t>& cores,
                          const std::vector<std::vector<float>>& data) {
    if (data.size() != cores.size())
        throw DeviceError(ErrorKind::Usage, fmt::format("all-reduce: {} vectors for {} cores",
                                                        data.size(), cores.size()));
    const uint32_t n = static_cast<uint32_t>(data.at(0).size());
    for (const auto& v : data)
        if (v.size() != n)
            throw DeviceError(ErrorKind::Usage, "all-reduce: vectors differ in length");
    const AllReducePlan p =
        plan_allreduce(static_cast<uint32_t>(cores.size()), n, dev.config().core.vmem_bytes);
    const uint64_t padded = allreduce_vmem_bytes(p);
    // Inputs go straight to VMEM (as a previous kernel would have left them), zero-padded.
    for (size_t i = 0; i < cores.size(); ++i) {
        std::vector<float> x(padded / 4, 0.0f);
        std::copy(data[i].begin(), data[i].end(), x.begin());
        dev.board().vmem(cores[i]).write(
            p.x_addr, {reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
    }
    const uint32_t N = p.cores;
    AllReduceResult r;
    r.event = dev.launch(cores, allreduce_program(p), [&](size_t i) {
        return std::vector<uint32_t>{static_cast<uint32_t>(i), cores[(i + 1) % N],
                                     cores[(i + N - 1) % N]};
    });
    for (uint32_t c : cores) {
        std::vector<float> y(n);
        dev.board().vmem(c).read(p.y_addr, {reinterpret_cast<uint8_t*>(y.data()), y.size() * 4});
        r.out.push_back(std::move(y));
    }
    return r;
}

}  // namespace tpu::driver
