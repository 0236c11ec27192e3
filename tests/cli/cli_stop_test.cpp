// SPDX-License-Identifier: Apache-2.0
// Stopping a kernel that never halts: the host-time limit (sim.max_host_seconds) and Ctrl-C.
// No speed is asserted; the bounds only keep a broken build from hanging the test.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "tests/cli/cli_runner.h"

namespace tpu::test {
namespace {

/// A VPU instruction in a loop: every iteration costs simulated time, none halts.
std::string spinning_kernel() {
    const std::string path = tmp("spin.s");
    std::ofstream(path) << "loop: v.add [0], [0], [0], 1024\n  jmp loop\n";
    return path;
}

/// True once process `pid` has a SIGINT handler installed (SigCgt bit 1 in /proc).
bool catches_sigint(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) & 2);
    return false;
}

TEST(CliStop, TheHostTimeLimitStopsASpinningKernelWithAStateDump) {
    const std::string k = spinning_kernel();
    const CliResult r = tpusim("run " + k + " --set sim.max_host_seconds=0.2");
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.err.rfind("tpusim: " + k +
                              ": the launch ran past sim.max_host_seconds = 0.2 host seconds "
                              "without halting\n  core 0: running at cycle ",
                          0),
              0u)
        << r.err;
    EXPECT_NE(r.err.find(", pc "), std::string::npos) << r.err;
}

TEST(CliStop, CtrlCStopsASpinningKernelWithExitCode130) {
    const std::string k = spinning_kernel(), err = tmp("sigint.err");
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        const int null = ::open("/dev/null", O_WRONLY);
        dup2(null, 1);
        const std::string exe = tpusim_exe();
        execl(exe.c_str(), exe.c_str(), "run", k.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    using Clock = std::chrono::steady_clock;
    const auto give_up = Clock::now() + std::chrono::seconds(60);
    while (!catches_sigint(pid) && Clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // Let the kernel spin a while, so the signal lands inside the simulation.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_EQ(kill(pid, SIGINT), 0);
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAIL() << "tpusim did not stop after SIGINT";
    }
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 130);
    const std::string text = slurp(err);
    EXPECT_EQ(text.rfind("tpusim: " + k + ": interrupted (Ctrl-C)", 0), 0u) << text;
    EXPECT_NE(text.find("\n  core 0: running at cycle "), std::string::npos) << text;
}

}  // namespace
}  // namespace tpu::test
