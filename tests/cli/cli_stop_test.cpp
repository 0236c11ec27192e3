// SPDX-License-Identifier: Apache-2.0
// Stopping a kernel that never halts: the host-time limit (sim.max_host_seconds) and Ctrl-C.
// No speed is asserted; the bounds only keep a broken build from hanging the test.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

/// What a tpusim process interrupted by SIGINT left: its exit status and its stderr.
struct Interrupted {
    int status = 0;
    std::string err;
};

/// Runs `tpusim args...`, sends it `signals` (back to back) once it has been running `after`
/// past installing its handler, and waits for it to end (a SIGKILL and a failure if it has not
/// after 60 s, which only keeps a broken build from hanging the test).
Interrupted interrupt(const std::vector<std::string>& args, std::chrono::milliseconds after,
                      const std::vector<int>& signals = {SIGINT}) {
    const std::string err = tmp("sigint.err");
    const pid_t pid = fork();
    if (pid < 0) {
        ADD_FAILURE() << "fork failed";
        return {};
    }
    if (pid == 0) {
        const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        const int null = ::open("/dev/null", O_WRONLY);
        dup2(null, 1);
        const std::string exe = tpusim_exe();
        std::vector<char*> argv{const_cast<char*>(exe.c_str())};
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(exe.c_str(), argv.data());
        _exit(127);
    }
    using Clock = std::chrono::steady_clock;
    const auto give_up = Clock::now() + std::chrono::seconds(60);
    while (!catches_sigint(pid) && Clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(after);
    for (const int sig : signals) EXPECT_EQ(kill(pid, sig), 0);
    Interrupted r;
    pid_t done = 0;
    while ((done = waitpid(pid, &r.status, WNOHANG)) == 0 && Clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &r.status, 0);
        ADD_FAILURE() << "tpusim did not stop after SIGINT";
    }
    r.err = slurp(err);
    return r;
}

TEST(CliStop, CtrlCStopsASpinningKernelWithExitCode130) {
    const std::string k = spinning_kernel();
    // Let the kernel spin a while, so the signal lands inside the simulation.
    const Interrupted r = interrupt({"run", k}, std::chrono::milliseconds(500));
    ASSERT_TRUE(WIFEXITED(r.status));
    EXPECT_EQ(WEXITSTATUS(r.status), 130);
    EXPECT_EQ(r.err.rfind("tpusim: " + k + ": interrupted (Ctrl-C)", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("\n  core 0: running at cycle "), std::string::npos) << r.err;
}

TEST(CliStop, CtrlCStopsGemmTrainAndBenchWithExitCode130) {
    // Each runs for seconds to minutes (the GEMM about 5 s here); the signal goes to tpusim alone
    // (not its process group, as a terminal's Ctrl-C would).
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"gemm", "--m", "4096", "--k", "4096", "--n", "4096",
                                   "--precision", "fp32-6pass"},
          std::vector<std::string>{"train", "--data", "synthetic", "--no-progress"},
          std::vector<std::string>{"bench"}}) {
        const Interrupted r = interrupt(args, std::chrono::milliseconds(1000));
        ASSERT_TRUE(WIFEXITED(r.status)) << args[0];
        EXPECT_EQ(WEXITSTATUS(r.status), 130) << args[0] << ": " << r.err;
        EXPECT_NE(r.err.find("interrupted (Ctrl-C)"), std::string::npos) << args[0] << r.err;
    }
}

/// The hidden temporary files (".NAME.tmpPID-N") an OutputFile leaves in `dir`, if any.
std::vector<std::string> temporaries(const std::string& dir) {
    std::vector<std::string> out;
    for (const std::string& name : listing(dir))
        if (name.find(".tmp") != std::string::npos) out.push_back(name);
    return out;
}

TEST(CliStop, SigtermAndASecondCtrlCLeaveNoTemporaryFile) {
    // Issue #30, class 7: a traced run killed by SIGTERM, or by a second Ctrl-C that ends the
    // process at once, left its hidden temporary trace file behind (30 MB after 5 s). The
    // handlers remove it; the process still ends as the signal says.
    const std::string k = spinning_kernel();
    const std::string dir = fresh_dir(tmp("sigterm"));
    const Interrupted term = interrupt({"run", k, "--trace", dir + "/t.json"},
                                       std::chrono::milliseconds(500), {SIGTERM});
    EXPECT_TRUE(WIFSIGNALED(term.status) && WTERMSIG(term.status) == SIGTERM) << term.status;
    EXPECT_EQ(temporaries(dir), std::vector<std::string>{});
    EXPECT_FALSE(std::filesystem::exists(dir + "/t.json"));  // never committed
    const Interrupted twice = interrupt({"run", k, "--trace", dir + "/t.json"},
                                        std::chrono::milliseconds(500), {SIGINT, SIGINT});
    ASSERT_TRUE(WIFEXITED(twice.status));
    EXPECT_EQ(WEXITSTATUS(twice.status), 130);
    EXPECT_EQ(temporaries(dir), std::vector<std::string>{});
}

}  // namespace
}  // namespace tpu::test
