// SPDX-License-Identifier: Apache-2.0
#include "hw/mem/hbm_target.h"

#include <span>

#include "hw/mem/hbm_timing.h"
#include "hw/mem/sparse_memory.h"

namespace tpu::hw {

HbmTarget::HbmTarget(sc_core::sc_module_name name, SparseMemory& mem, HbmTimingModel& timing,
                     uint64_t period_ps)
    : sc_core::sc_module(name),
      socket("socket"),
      m_mem(mem),
      m_timing(timing),
      m_period_ps(period_ps) {
    socket.register_b_transport(this, &HbmTarget::b_transport);
}

void HbmTarget::b_transport(tlm::tlm_generic_payload& p, sc_core::sc_time& delay) {
    const uint64_t addr = p.get_address(), len = p.get_data_length();
    if (p.get_byte_enable_ptr() != nullptr) {
        p.set_response_status(tlm::TLM_BYTE_ENABLE_ERROR_RESPONSE);
        return;
    }
    if (p.get_streaming_width() < len) {
        p.set_response_status(tlm::TLM_BURST_ERROR_RESPONSE);
        return;
    }
    if (len == 0 || !m_mem.in_range(addr, len)) {
        p.set_response_status(tlm::TLM_ADDRESS_ERROR_RESPONSE);
        return;
    }
    if (len > UINT32_MAX) {
        p.set_response_status(tlm::TLM_GENERIC_ERROR_RESPONSE);
        return;
    }
    const bool write = p.is_write();
    if (p.is_read()) m_mem.read(addr, std::span<uint8_t>(p.get_data_ptr(), len));
    if (write) m_mem.write(addr, std::span<const uint8_t>(p.get_data_ptr(), len));
    if (!p.is_read() && !write) {  // TLM_IGNORE_COMMAND: nothing moves, nothing is timed
        p.set_response_status(tlm::TLM_OK_RESPONSE);
        return;
    }
    // The request reaches the controller at the initiator's local time, rounded up to a core
    // cycle; the delay grows by the wait for that edge plus the access time.
    const uint64_t now_ps = (sc_core::sc_time_stamp() + delay).value() *
                            uint64_t(sc_core::sc_get_time_resolution().to_seconds() * 1e12 + 0.5);
    const uint64_t arrive = (now_ps + m_period_ps - 1) / m_period_ps;
    const uint64_t done = m_timing.access(arrive, addr, static_cast<uint32_t>(len), write);
    delay += sc_core::sc_time(double(done * m_period_ps - now_ps), sc_core::SC_PS);
    ++m_transactions;
    p.set_response_status(tlm::TLM_OK_RESPONSE);
}

}  // namespace tpu::hw
