// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "driver/kernels/gemm.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// Multi-head scaled dot-product attention, forward and backward, on device-resident Tensors:
/// one fused launch per pass over all heads (driver/README.md "Attention"): the contractions on
/// the MXU (bf16 operands, fp32 accumulation), the scale, causal mask and softmax on the VPU
/// with S and P kept in VMEM.
namespace tpu::driver {

/// Shape of one core's share: `batch` sequences of `seq` tokens, `heads` heads of `dhead`.
struct AttentionShape {
    uint32_t batch = 1;   ///< sequences per core (the data-parallel dimension)
    uint32_t heads = 1;   ///< attention heads
    uint32_t seq = 1;     ///< tokens per sequence
    uint32_t dhead = 1;   ///< features per head
    bool causal = false;  ///< mask keys after the query (decoder self-attention)

    /// batch x heads (independent attention problems).
    uint32_t groups() const { return batch * heads; }
    /// fp32(1 / sqrt(dhead)), computed in double.
    float scale() const;
};

/// Program-cache key of the fused attention kernels: `blocks` blocks of `heads_per_block` heads
/// of seq x dhead each, scores in key tiles of `key_cols` columns (the MXU's).
struct AttentionKey {
    bool backward = false;         ///< attention_grad's kernel, else attention's
    uint32_t seq = 0;              ///< S: tokens per sequence
    uint32_t dhead = 0;            ///< D: features per head (at most the MXU rows)
    uint32_t heads_per_block = 0;  ///< G: heads whose areas share VMEM at once
    uint32_t blocks = 0;           ///< groups / G: iterations of the kernel's loop
    uint32_t key_cols = 0;         ///< C: keys per score tile (MXU columns)
    bool causal = false;           ///< forward only: adds the causal bias operand
    bool scaled = false;           ///< the scores are multiplied by the scale operand
    /// The layout of Q, K, V, O (and dO, dQ, dK, dV). 0: head-major [batch, heads, seq, dhead],
    /// each head a contiguous seq x dhead block (attention() below). Else token-major with this
    /// many heads per sequence: a tensor is batch * seq token rows, head h of sequence b the
    /// seq x dhead block at row b * seq, column h * dhead. Q, K and V then read straight out of
    /// a fused QKV projection [batch * seq, 3 * hidden] (operands at column offsets 0, hidden and
    /// 2 * hidden) and O lands as [batch * seq, hidden]: a head split or merge is a change of
    /// dims, never a copy. P is head-major [batch * heads * seq, seq] either way.
    uint32_t heads = 0;
    uint32_t qkv_row = 0;  ///< token-major: fp32 values per token row of Q, K, V, dQ, dK, dV
    uint32_t out_row = 0;  ///< token-major: fp32 values per token row of O and dO
    auto operator<=>(const AttentionKey&) const = default;
    std::string name() const { return backward ? "attention_bwd" : "attention_fwd"; }
    friend size_t hash_value(const AttentionKey& k) {
        return hash_fields(k.backward, k.seq, k.dhead, k.heads_per_block, k.blocks, k.key_cols,
                           k.causal, k.scaled, k.heads, k.qkv_row, k.out_row);
    }
};
/// The fused kernel's key for `s` on `cfg` (forward or `backward`) with its areas in
/// `vmem_bytes` of free VMEM (0: the core's), or nothing when it does not apply (dhead above the
/// MXU rows, fewer than two MXUs, non-square MXU, one head's areas beyond the VMEM: attention
/// then composes per-head matmuls and a softmax). The key is head-major; set its layout fields
/// for token-major operands.
std::optional<AttentionKey> plan_attention(const hw::BoardConfig& cfg, const AttentionShape& s,
                                           bool backward, uint64_t vmem_bytes = 0);
/// The operands of `k` in launch-argument order: forward q, k, v, o, p, scale (fp32 scalar),
/// bias (the causal S x S bias; unused unless causal); backward q, k, v, p, dout, dq, dk, dv,
/// scale. Tensors in the [batch, heads, seq, dhead] layout of attention() below.
std::vector<streaming::Param> attention_params(const AttentionKey& k);
/// Emits the fused kernel `k` into `b` (no halt), operands in attention_params order (tensors
/// in HBM, each an address in a register plus an immediate offset); it takes its registers,
/// flags and VMEM from b's pools and has waited for all its work when it returns. A token-major
/// key moves each head with one strided DMA (a head-major one each block with one).
void emit(isa::Builder& b, const AttentionKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of `k`.
isa::Program generate(const AttentionKey& k);

/// O = softmax(Q K^T * scale [+ causal mask]) V per (sequence, head). Layout [batch, heads,
/// seq, dhead]: Q, K, V and O are Tensors of batch * heads * seq rows x dhead columns, head
/// (b, h) the contiguous seq x dhead block at row (b * heads + h) * seq. P (batch * heads *
/// seq rows x seq columns, the softmax per head) is written for the backward pass. One launch
/// when dhead <= the MXU rows and a head fits in VMEM, else per-head matmuls; the Event spans
/// them.
Event attention(Device& dev, ProgramCache& cache, const AttentionShape& s, const Tensor& q,
                const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& p);
/// Backward of attention given P and dO: per head dV = P^T dO, dP = dO V^T, dS =
/// scaled_softmax_grad(P, dP, scale), dQ = dS K, dK = dS^T Q (every product bf16 x bf16 ->
/// fp32 on the MXU). Same layouts as attention.
Event attention_grad(Device& dev, ProgramCache& cache, const AttentionShape& s, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& dout,
                     const Tensor& dq, const Tensor& dk, const Tensor& dv);

/// Outputs of attention_reference.
struct AttentionResult {
    std::vector<float> o;  ///< groups x seq x dhead
    std::vector<float> p;  ///< groups x seq x seq
};
/// Host reference of one replica: per head S = matmul_reference(Q, K^T, bf16), P =
/// softmax_reference(S, scale, causal), O = matmul_reference(P, V, bf16).
AttentionResult attention_reference(const AttentionShape& s, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    uint32_t mxu_rows);
/// Outputs of attention_grad_reference.
struct AttentionGradResult {
    std::vector<float> dq, dk, dv;  ///< groups x seq x dhead each
};
/// Host reference of attention_grad (the same products and softmax_grad_reference).
AttentionGradResult attention_grad_reference(const AttentionShape& s, const std::vector<float>& q,
                                             const std::vector<float>& k,
                                             const std::vector<float>& v,
                                             const std::vector<float>& p,
                                             const std::vector<float>& dout, uint32_t mxu_rows);

}  // namespace tpu::driver
