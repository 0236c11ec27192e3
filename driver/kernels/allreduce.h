// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"
#include "isa/builder.h"

/// Ring all-reduce (sum) of fp32 vectors in VMEM over ICI: reduce-scatter then all-gather, half
/// of the data clockwise and half counter-clockwise so both directions of every link work.
namespace tpu::driver {

/// Where the all-reduce keeps its data on every core (same addresses on each core); the
/// program-cache key of the VMEM-resident kernel.
struct AllReducePlan {
    uint32_t cores = 0;         ///< ring size N (the launch's core set, in order)
    uint32_t elements = 0;      ///< fp32 values per core; padded to a multiple of 2N inside
    uint32_t x_addr = 0;        ///< VMEM input (kept: the sum lands in y_addr)
    uint32_t y_addr = 0;        ///< VMEM result
    uint32_t scratch_addr = 0;  ///< VMEM scratch for reduce-scatter: 2 (N-1) chunks
    auto operator<=>(const AllReducePlan&) const = default;
    std::string name() const { return "allreduce"; }
    friend size_t hash_value(const AllReducePlan& p) {
        return hash_fields(p.cores, p.elements, p.x_addr, p.y_addr, p.scratch_addr);
    }
};

/// Bytes of each direction's chunk: ceil(elements / 2N) values.
uint32_t allreduce_chunk_bytes(const AllReducePlan& p);
/// VMEM bytes the plan needs at each address (x, y: 2N chunks; scratch: 2(N-1) chunks).
uint64_t allreduce_vmem_bytes(const AllReducePlan& p);
/// A plan packing x, y and scratch from VMEM address 0 for `elements` values on `cores`.
AllReducePlan plan_allreduce(uint32_t cores, uint32_t elements, uint64_t vmem_bytes);
/// The kernel. Launch arguments: s1 `position` in the ring, s2 `next` core (clockwise), s3
/// `prev` core. Flags: f1/f2 reduce-scatter arrivals, f3/f4 adds, f5/f6 all-gather arrivals,
/// f7 local copies (per direction).
isa::Program generate(const AllReducePlan& p);
/// generate(p).
isa::Program allreduce_program(const AllReducePlan& p);

/// Runs an all-reduce of `data[i]` (one vector per core of `cores`) on the device: writes the
/// vectors to VMEM, launches, and returns every core's result and the launch event.
struct AllReduceResult {
    std::vector<std::vector<float>> out;  ///< per core, `elements` values
    Event event;
};
AllReduceResult allreduce(Device& dev, const std::vector<uint32_t>& cores,
                          const std::vector<std::vector<float>>& data);

// ---- All-reduce of tensors in HBM -----------------------------------------------------------

/// How the HBM all-reduce paces its ring steps.
enum class AllReduceSchedule : uint8_t {
    Auto,         ///< StepBarrier when its buffers fit in VMEM, else Pipelined
    StepBarrier,  ///< step s starts once the whole chunk of step s-1 has arrived (textbook ring)
    Pipelined,    ///< piece q of step s starts once piece q of step s-1 has arrived
};

/// Which part of the ring all-reduce a kernel runs: the torus all-reduce runs a reduce-scatter
/// and an all-gather along each dimension but the last, and the whole all-reduce along that.
enum class AllReducePhase : uint8_t {
    Full,           ///< reduce-scatter then all-gather (the ring all-reduce)
    ReduceScatter,  ///< steps 0..N-1: each core ends with its two chunks summed, in HBM
    AllGather,      ///< steps N-1..2N-2: from those chunks, every core ends with all of them
};

/// Partition and schedule of the HBM all-reduce: the program-cache key of its kernel (every
/// input the code depends on). Its VMEM rings come from the builder's pool in the order
/// receive (clockwise, counter-clockwise), own (clockwise, counter-clockwise): from address 0
/// in a stand-alone program.
struct AllReduceHbmPlan {
    uint32_t cores = 0;       ///< ring size N
    uint32_t elements = 0;    ///< fp32 values per core
    uint32_t piece = 0;       ///< values per piece (one ICI transfer, one DMA), a multiple of 64
    uint32_t pieces = 0;      ///< pieces per chunk Q
    uint32_t chunk = 0;       ///< values per chunk E = pieces x piece
    uint32_t groups = 0;      ///< groups G of 2N chunks, reduced one after the other
    uint32_t recv_slots = 0;  ///< receive slots K per direction (reused once all 2(N-1)Q don't fit)
    uint32_t own_slots = 0;   ///< slots O per direction for the core's own data loaded from HBM
    uint32_t free_lag = 0;    ///< a receive slot is handed back this many pieces after its use
    bool barrier = true;      ///< StepBarrier (else Pipelined)
    /// Instructions that fit in instruction memory (0: no limit); a larger unrolled kernel
    /// loops over its steps instead.
    uint32_t imem_instrs = 0;
    AllReducePhase phase = AllReducePhase::Full;  ///< which part of the all-reduce
    /// Direction 1 works on a range of its own (AllReduceOperands::x_ccw, n_ccw) instead of
    /// the second half of x (the torus phases, which work on the chunks a phase left).
    bool ranges = false;
    auto operator<=>(const AllReduceHbmPlan&) const = default;
    std::string name() const { return "allreduce_hbm"; }
    friend size_t hash_value(const AllReduceHbmPlan& p) {
        return hash_fields(p.cores, p.elements, p.piece, p.pieces, p.chunk, p.groups, p.recv_slots,
                           p.own_slots, p.free_lag, p.barrier, p.imem_instrs, p.phase, p.ranges);
    }
    /// VMEM bytes of the receive and own-data rings.
    uint64_t vmem_bytes() const;
};

/// Plans an all-reduce of `elements` values per core over `cores` cores in `vmem_bytes` of
/// VMEM (0: the core's whole VMEM, as a stand-alone program has it).
AllReduceHbmPlan plan_allreduce_hbm(uint32_t cores, uint32_t elements, const hw::BoardConfig& cfg,
                                    AllReduceSchedule schedule = AllReduceSchedule::Auto,
                                    uint64_t vmem_bytes = 0);

/// Where emit_allreduce's operands are: this core's replica and its place in the ring.
struct AllReduceOperands {
    streaming::Operand x;         ///< HBM: this core's replica (summed in place)
    streaming::Operand scale;     ///< scalar: fp32 bits of the scale
    streaming::Operand position;  ///< scalar: this core's position in the ring (0..N-1)
    streaming::Operand next;      ///< scalar: the core at position + 1 (mod N)
    streaming::Operand prev;      ///< scalar: the core at position - 1 (mod N)
    /// With AllReduceHbmPlan::ranges: HBM address of direction 1's range (direction 0's is
    /// x) and the values in each range (scalars; the partition's half may run past them).
    streaming::Operand x_ccw, n_cw, n_ccw;
    /// Optional: emitted once the kernel holds its flags, before it sends anything (a
    /// handshake between kernels that reuse flags and VMEM on neighbouring cores).
    std::function<void()> ready;

    /// A core's ring operands: its replica at the HBM address `x`, the rest scalars.
    static AllReduceOperands ring(const isa::Arg& x, const isa::Arg& scale,
                                  const isa::Arg& position, const isa::Arg& next,
                                  const isa::Arg& prev) {
        AllReduceOperands ops;
        ops.x = streaming::Operand::hbm(x);
        ops.scale = streaming::Operand::scalar(scale);
        ops.position = streaming::Operand::scalar(position);
        ops.next = streaming::Operand::scalar(next);
        ops.prev = streaming::Operand::scalar(prev);
        return ops;
    }
};

/// The handshake before a ring kernel sends (AllReduceOperands::ready): signals both
/// neighbours on `flag` and waits until they have signalled it 2 x `count` times in all (a flag
/// never reset, so `count` is the handshakes on it so far, this one included).
void emit_ring_ready(isa::Builder& b, const isa::Arg& next, const isa::Arg& prev,
                     const isa::Flag& flag, uint32_t count);

/// Emits the HBM all-reduce for `p` into `b`: every core of the launch that runs it, in the
/// ring order the operands give, ends with (sum over replicas) x scale in its replica, the
/// values allreduce_reference() gives. Resources from b's pools in its own scope (plan `p` in
/// b.vmem_free()); on return every instruction it issued has completed. Every core of the
/// ring must run the same program: the kernel signals its flags on its neighbours. It uses up to
/// 20 scalar registers besides its operands. Unrolled while the stand-alone program fits in
/// p.imem_instrs, else its steps of one shape share a loop.
void emit_allreduce(isa::Builder& b, const AllReduceHbmPlan& p, const AllReduceOperands& ops);
/// The stand-alone kernel: launch arguments `position`, `next`, `prev`, `x` (the replica's HBM
/// address on this core), `scale` (fp32 bits), then emit_allreduce, then halt.
isa::Program generate(const AllReduceHbmPlan& p);
/// generate(p).
isa::Program allreduce_hbm_program(const AllReduceHbmPlan& p);

// ---- Torus all-reduce ------------------------------------------------------------------------

/// The torus all-reduce (hw/README.md, "All-reduce bounds"): along each torus dimension but the
/// last a reduce-scatter (ring, both directions), the whole all-reduce along the last on the
/// share each core then holds, and the all-gathers back in reverse order; one program, one
/// phase after the other, each phase's neighbours shaking hands before it sends. The key.
struct TorusAllReduceKey {
    uint32_t elements = 0;  ///< fp32 values per core
    /// Per dimension of more than one core (x, y, z order): its reduce-scatter plan (phase
    /// ReduceScatter; the all-gather runs the same plan as AllGather), the last one Full.
    std::vector<AllReduceHbmPlan> phases;
    auto operator<=>(const TorusAllReduceKey&) const = default;
    std::string name() const { return "allreduce_torus"; }
    friend size_t hash_value(const TorusAllReduceKey& k) {
        size_t h = hash_fields(k.elements);
        for (const auto& p : k.phases) h = hash_fields(h, hash_value(p));
        return h;
    }
};

/// The torus plan of an all-reduce of `elements` values over `cores` (their order is the
/// launch's), or nullopt when the ring is used instead: the board is a ring or a torus with
/// one dimension of more than one core, `cores` is not the whole board in core order, a phase
/// does not fit in VMEM without reusing its receive slots (or in one group), or (unless
/// `force`) the ring's bound (hw::allreduce_ring_bound) is not above the torus's
/// (hw::allreduce_torus_bound): v4-8's 4 x 2 torus keeps the ring.
std::optional<TorusAllReduceKey> plan_allreduce_torus(const hw::BoardConfig& cfg,
                                                      const std::vector<uint32_t>& cores,
                                                      uint32_t elements, bool force = false);
/// The kernel. Launch arguments: `x` (HBM address), `scale` (fp32 bits), then per dimension
/// of the key (x, y, z) `position.D`, `next.D`, `prev.D` (the core's coordinate along it and
/// its neighbours there).
isa::Program generate(const TorusAllReduceKey& k);
/// Emitted before a torus phase sends (TorusAllReduceKey's phases in order: the
/// reduce-scatters, the last dimension's all-reduce, the all-gathers; 2D - 1 of them), once the
/// kernel holds its flags: the phase's neighbours `next` and `prev` shake hands there.
using TorusReady = std::function<void(size_t phase, const isa::Reg& next, const isa::Reg& prev)>;
/// Emits the torus all-reduce of `k` into `b` (the kernel generate(k) runs between its prologue
/// and its halt): this core's replica at HBM address `x` ends as (sum over the board's
/// replicas) x `scale` (fp32 bits), allreduce_torus_reference's values. `dims` holds 3 words per
/// phase dimension (position, next, prev; emit_torus_coordinates). Resources from b's pools in
/// its own scope (the phases' VMEM from b.vmem_free(), sized for the whole VMEM); every core of
/// the board must run it. Unrolled while generate(k) is.
void emit_allreduce_torus(isa::Builder& b, const TorusAllReduceKey& k, const isa::Reg& x,
                          const isa::Reg& scale, const isa::Smem& dims, const TorusReady& ready);
/// Fills `dims` (3 words per phase dimension of `k`) from `core`, this core's number on a
/// board whose cores are numbered x fastest, then y, then z: its position along each dimension
/// and its next and previous neighbours there (what allreduce_torus() passes as arguments).
void emit_torus_coordinates(isa::Builder& b, const TorusAllReduceKey& k, const isa::Reg& core,
                            const isa::Smem& dims);
/// The exact result of the torus all-reduce of `replicas` (core order) on a torus of `dims`
/// (cores along x, y, z, with 1 for a dimension the torus lacks): the order of additions is
/// the ring's (allreduce_reference) along x within each x-ring, then along y on the sums each
/// core holds, and so on; scaled once, after the last dimension.
std::vector<float> allreduce_torus_reference(const std::vector<std::vector<float>>& replicas,
                                             float scale, const TorusAllReduceKey& k,
                                             std::array<uint32_t, 3> dims);
/// The exact result allreduce(dev, ...) gives on board `cfg` over `cores`: the torus reference
/// when plan_allreduce_torus chooses the torus, else allreduce_reference.
std::vector<float> allreduce_reference(const hw::BoardConfig& cfg,
                                       const std::vector<uint32_t>& cores,
                                       const std::vector<std::vector<float>>& replicas,
                                       float scale);

/// The torus all-reduce of `k` on `t` (which must cover the whole board in core order), in
/// place, like allreduce(); allreduce() calls it when the planner chooses the torus.
Event allreduce_torus(Device& dev, ProgramCache& cache, const Tensor& t, float scale,
                      const TorusAllReduceKey& k);

/// In place: every replica of `t` becomes the sum over replicas times `scale` (scale = 1/N
/// gives the mean used for data-parallel gradients). One launch over t.cores: the torus
/// all-reduce where plan_allreduce_torus gives a plan (schedule Auto), else the ring in
/// t.cores order. Every replica ends bit-identical to allreduce_reference().
Event allreduce(Device& dev, ProgramCache& cache, const Tensor& t, float scale = 1.0f,
                AllReduceSchedule schedule = AllReduceSchedule::Auto);

/// The exact result of allreduce() on replicas x_0..x_{N-1} (ring positions). With E and G
/// from allreduce_partition(), value i lies in group i / (2NE) and, inside it, in chunk
/// j = (i mod 2NE) / E, direction d = j / N, c = j mod N; its sum starts at x_c
/// and adds, one fp32 addition at a time, x_{c+1}, x_{c+2}, ... (d = 0) or x_{c-1}, x_{c-2},
/// ... (d = 1), indices mod N; the sum is then multiplied by `scale` unless scale == 1.
std::vector<float> allreduce_reference(const std::vector<std::vector<float>>& replicas,
                                       float scale);
/// The partition of the HBM all-reduce (piece, pieces, chunk, groups; no VMEM layout): it
/// depends on the ring size and the value count only, so results never depend on the board.
AllReduceHbmPlan allreduce_partition(uint32_t cores, uint32_t elements);

}  // namespace tpu::driver
