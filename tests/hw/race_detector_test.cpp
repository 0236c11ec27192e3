// SPDX-License-Identifier: Apache-2.0
// The race detector's rule and its advice, without a kernel: who must wait on what, for every
// pairing of the owner's own accesses and ICI writes from other cores.
#include <gtest/gtest.h>

#include <limits>

#include "hw/core/race_detector.h"

namespace tpu::hw {
namespace {

/// A record of one VMEM range [0x100, 0x200) on `core` at `pc`, issued at `issue`.
AccessRecord rec(uint32_t core, uint32_t pc, std::string unit, uint64_t issue, bool write,
                 uint8_t flag = isa::kNoFlag) {
    AccessRecord r;
    r.core = core;
    r.pc = pc;
    r.unit = std::move(unit);
    r.issue = issue;
    r.done = issue + 10;
    r.flag = flag;
    r.ranges = {{false, 0x100, 0x200, write}};
    return r;
}

/// The advice part of a report (after "are not ordered; ").
std::string advice_of(const std::optional<std::string>& report) {
    if (!report) return "<no race>";
    const std::string key = "are not ordered; ";
    return report->substr(report->find(key) + key.size());
}

TEST(RaceDetector, AnIciWriteIsARaceOnTheReceivingCore) {
    // Core 0 writes core 1's VMEM over ICI (raising f3 on core 1 on arrival); core 1 then reads
    // the same bytes without waiting: core 1 must wait on f3.
    RaceDetector d(1);
    EXPECT_FALSE(d.add(rec(0, 2, "ici", 100, true, 3)));
    const auto r = d.add(rec(1, 7, "vpu", 300, false));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->substr(0, 42), "data race on core 1 VMEM [0x100, 0x200): c");
    EXPECT_EQ(advice_of(r),
              "core 1 must wait on f3 (raised on arrival of core 0 pc 2's transfer) before its "
              "pc 7");
    // Waiting on f3 once the transfer is done orders it.
    RaceDetector ok(1);
    EXPECT_FALSE(ok.add(rec(0, 2, "ici", 100, true, 3)));
    ok.acknowledge(3, 110);
    EXPECT_FALSE(ok.add(rec(1, 7, "vpu", 300, false)));
}

TEST(RaceDetector, AdviceFollowsIssueOrderNotArrivalOrder) {
    // Cores run ahead of each other between syncs: core 1's read (issued at 300) reaches the
    // detector before core 0's write (issued at 100). The advice is the same as above.
    RaceDetector d(1);
    EXPECT_FALSE(d.add(rec(1, 7, "vpu", 300, false)));
    EXPECT_EQ(advice_of(d.add(rec(0, 2, "ici", 100, true, 3))),
              "core 1 must wait on f3 (raised on arrival of core 0 pc 2's transfer) before its "
              "pc 7");
}

TEST(RaceDetector, AWriteAfterTheOwnersReadNeedsASignalBack) {
    // Core 1 reads first; core 0's later write must wait until core 1 has seen its read done.
    RaceDetector d(1);
    EXPECT_FALSE(d.add(rec(1, 4, "vpu", 100, false, 5)));
    EXPECT_EQ(advice_of(d.add(rec(0, 2, "ici", 300, true, 3))),
              "core 1 must wait on f5 (raised by pc 4) or fence, then signal core 0 (sigr), "
              "which must wait for that signal before pc 2");
    RaceDetector n(1);
    EXPECT_FALSE(n.add(rec(1, 4, "vpu", 100, false)));
    EXPECT_EQ(advice_of(n.add(rec(0, 2, "ici", 300, true, 3))),
              "core 1 must give pc 4 a completion flag and wait on it, or fence, then signal "
              "core 0 (sigr), which must wait for that signal before pc 2");
}

TEST(RaceDetector, TwoSendersToOneCore) {
    RaceDetector d(1);
    EXPECT_FALSE(d.add(rec(0, 2, "ici", 100, true, 3)));
    EXPECT_EQ(advice_of(d.add(rec(2, 6, "ici", 300, true, 4))),
              "core 1 must wait on f3 (raised on arrival of core 0 pc 2's transfer), then signal "
              "core 2 (sigr), which must wait for that signal before pc 6");
}

TEST(RaceDetector, LocalRacesKeepTheirShortAdvice) {
    RaceDetector d(0);
    EXPECT_FALSE(d.add(rec(0, 0, "dma", 0, true, 0)));
    EXPECT_EQ(advice_of(d.add(rec(0, 1, "vpu", 1, false))),
              "wait on f0 (raised by pc 0) or fence before pc 1");
    // A fence orders the owner's own records, not another core's ICI writes.
    RaceDetector own(1), remote(1);
    EXPECT_FALSE(own.add(rec(1, 1, "dma", 0, true)));
    own.fence(200);
    EXPECT_FALSE(own.add(rec(1, 3, "vpu", 300, false)));
    EXPECT_FALSE(remote.add(rec(0, 2, "ici", 0, true, 3)));
    remote.fence(200);
    EXPECT_TRUE(remote.add(rec(1, 3, "vpu", 300, false)));
}

TEST(RaceDetector, AnIciTransferStillInFlightHasNoDoneCycleInTheReport) {
    // The board learns when an ICI write lands only once it resolves it; until then the record
    // holds the sentinel, which a report printed as "done at 18446744073709551615" (issue #30).
    RaceDetector d(1);
    AccessRecord in_flight = rec(0, 2, "ici", 100, true, 3);
    in_flight.done = std::numeric_limits<uint64_t>::max();
    EXPECT_FALSE(d.add(in_flight));
    const auto r = d.add(rec(1, 7, "vpu", 300, false));
    ASSERT_TRUE(r);
    EXPECT_NE(r->find("issued at cycle 100, still in flight)"), std::string::npos) << *r;
    EXPECT_EQ(r->find("18446744073709551615"), std::string::npos) << *r;
    EXPECT_NE(r->find("issued at cycle 300, done at 310)"), std::string::npos) << *r;
}

}  // namespace
}  // namespace tpu::hw
