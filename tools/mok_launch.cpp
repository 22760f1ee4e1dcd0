// mok-launch: starts one process per GPU for the NCCL transport (ranks, one NCCL unique id) and
// returns the first failure's exit code; a small stand-in for mpirun on a single node.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mok/cli.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

// A signal to the launcher (Ctrl-C, a job scheduler's SIGTERM, a closed terminal) is passed on
// to every rank: left alone they would keep running, and keep their GPUs, after it is gone.
volatile sig_atomic_t g_signal = 0;
extern "C" void note_signal(int sig) { g_signal = sig; }

// Each rank runs in its own process group (its id is the rank's pid), so that a signal reaches
// the processes a rank started too.
void signal_ranks(const std::vector<pid_t>& pids, int sig) {
  for (pid_t p : pids) kill(-p, sig);
}

// Why an entry of CUDA_VISIBLE_DEVICES names no GPU, or empty: a GPU index (digits) or a UUID
// (GPU-..., MIG-...). CUDA reads an invalid entry, such as -1, as the end of the list.
std::string visible_entry_problem(const std::string& e) {
  if (e.empty()) return "an empty entry";
  if (e.find_first_not_of("0123456789") == std::string::npos) return {};
  if (e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0) return {};
  return "'" + e + "', which is not a GPU index or UUID";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "mok-launch: run PROGRAM as N processes, rank r on GPU r, joined by one NCCL unique id.\n"
      "Each process gets MOK_RANK, MOK_WORLD_SIZE, MOK_NCCL_ID and CUDA_VISIBLE_DEVICES (its one GPU: the\n"
      "r-th entry of the launcher's CUDA_VISIBLE_DEVICES when that is set, which must then name N GPUs);\n"
      "NVLink multicast stays off (NCCL_NVLS_ENABLE=0). The launcher waits for all, stops the rest when\n"
      "one fails, and exits with the first failure's code (0 when all succeed).\n\n"
      "  mok-launch -n 8 -- build/verify/mok-verify run fixtures/dsv3-micro-zipf.h5 --backend cuda --transport nccl\n\n"
      "Each rank runs in its own process group: a signal to a rank reaches the processes it started.\n"
      "SIGINT, SIGTERM and SIGHUP to the launcher are passed on to every rank; when a rank fails, the others\n"
      "get SIGTERM, and so do all at --timeout. Ranks still running --kill-after seconds after that get SIGKILL.\n"
      "Exit codes: 0 all ranks succeeded; the first failing rank's code (128 + signal when a signal\n"
      "ended it); 124 timeout; 127 the program could not be started; 2 bad usage; 3 NCCL not usable.",
      "mok-launch"};
  int n = 1;
  double timeout_s = 0;
  std::vector<std::string> command;
  app.add_option("-n,--np", n, "number of processes (ranks)")->required()->check(CLI::Range(1, 72));
  app.add_option("--timeout", timeout_s, "seconds before every process is stopped (0 = none)")
      ->check(mok::cli::finite_range(0.0, 1e7, "a number of seconds from 0 (none) to 1e7"));
  double kill_after_s = 10;
  app.add_option("--kill-after", kill_after_s,
                 "seconds the ranks get to end after a SIGTERM (a rank failed) or a passed-on signal before SIGKILL")
      ->check(mok::cli::finite_range(0.0, 1e6, "a number of seconds from 0 to 1e6"))
      ->capture_default_str();
  app.add_option("command", command, "program and its arguments (after --)")->required();
  // An unknown option before "--" would be reported with the command ("-- --bogus"): name it alone.
  // What is known, and which options take a value, is read from the app's own option list.
  const auto option_of = [&app](const std::string& a) -> const CLI::Option* {
    for (const CLI::Option* opt : app.get_options()) {
      for (const std::string& l : opt->get_lnames())
        if (a == "--" + l || a.rfind("--" + l + "=", 0) == 0) return opt;
      for (const std::string& sn : opt->get_snames())
        if (a.rfind("-" + sn, 0) == 0) return opt;  // -n8 as well as -n 8
    }
    return nullptr;
  };
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    const std::string a = argv[i];
    if (a.size() < 2 || a[0] != '-') continue;
    const CLI::Option* opt = option_of(a);
    if (opt == nullptr) {
      std::fprintf(stderr, "The following argument was not expected: %s\nRun with --help for more information.\n",
                   a.c_str());
      return 2;
    }
    const bool value_attached = a.find('=') != std::string::npos || (a[1] != '-' && a.size() > 2);
    if (opt->get_type_size() != 0 && !value_attached) ++i;  // its value is the next argument
  }
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  // GPU of rank r: the r-th entry of the launcher's CUDA_VISIBLE_DEVICES when it is set (a rank
  // never gets a GPU the caller hid), else r.
  std::vector<std::string> gpus;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible) {
    const std::string s = visible;
    std::string cur;
    for (char ch : s.empty() ? s : s + ",") {  // set but empty: no GPU
      if (ch != ',') {
        cur += ch;
        continue;
      }
      std::string why = visible_entry_problem(cur);
      if (why.empty() && std::find(gpus.begin(), gpus.end(), cur) != gpus.end()) why = "'" + cur + "' twice";
      if (!why.empty()) {
        std::fprintf(stderr,
                     "mok-launch: CUDA_VISIBLE_DEVICES='%s' has %s; list each GPU once, by index or UUID, separated "
                     "by commas (or unset it to use GPUs 0..%d)\n",
                     visible, why.c_str(), n - 1);
        return 2;
      }
      gpus.push_back(cur);
      cur.clear();
    }
    if (static_cast<int>(gpus.size()) < n) {
      std::fprintf(stderr,
                   "mok-launch: -n %d needs %d GPUs but CUDA_VISIBLE_DEVICES='%s' names %zu; lower -n, or list more "
                   "GPUs in CUDA_VISIBLE_DEVICES (or unset it to use GPUs 0..%d)\n",
                   n, n, visible, gpus.size(), n - 1);
      return 2;
    }
  }
  if (!visible) {
    // Rank r gets GPU r. The launcher does not know whether the program needs a GPU (it may run
    // any command), so too few GPUs is a note, not a refusal: it names why a rank then finds none.
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;  // no driver or no device: none
    if (count == 0) {
      std::fprintf(stderr,
                   "mok-launch: note: this machine has no usable CUDA device (no driver or no GPU): every rank will "
                   "find none, and a program that needs its GPU fails; run on a machine with %d GPU(s)\n",
                   n);
    } else if (count < n) {
      const std::string missing = count == n - 1 ? "rank " + std::to_string(count)
                                                 : "ranks " + std::to_string(count) + " to " + std::to_string(n - 1);
      std::fprintf(stderr,
                   "mok-launch: note: -n %d gives rank r GPU r (0..%d), but this machine has %d CUDA device(s): %s "
                   "will find none, and a program that needs its GPU fails there; lower -n to %d, or run on a "
                   "machine with %d GPUs\n",
                   n, n - 1, count, missing.c_str(), count, n);
    }
  }
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    std::fprintf(stderr, "mok-launch: ncclGetUniqueId failed (is NCCL usable here?)\n");
    return 3;
  }
  std::string hex;
  for (size_t i = 0; i < sizeof id.internal; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(id.internal[i]));
    hex += b;
  }
  std::vector<pid_t> pids;
  // Installed before the first fork, so no signal falls between a rank's start and the handler.
  // A signal the launcher was started with ignored (nohup, a script's background job) stays
  // ignored, here and in the ranks.
  const int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_actions[3];
  struct sigaction sa {};
  sa.sa_handler = note_signal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) {
    sigaction(kSignals[i], nullptr, &old_actions[i]);
    if (old_actions[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, nullptr);
  }
  // The three signals stay blocked while the ranks start: a child restores the launcher's
  // original handlers before it unblocks them, so a signal passed on to a rank that has not yet
  // exec'd is not caught by its copy of note_signal and lost.
  sigset_t blocked, unblocked;
  sigemptyset(&blocked);
  for (int sig : kSignals) sigaddset(&blocked, sig);
  sigprocmask(SIG_BLOCK, &blocked, &unblocked);
  const pid_t launcher = getpid();
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("mok-launch: fork");
      signal_ranks(pids, SIGTERM);
      sigprocmask(SIG_SETMASK, &unblocked, nullptr);
      return 2;
    }
    if (pid == 0) {
      setpgid(0, 0);
      // A rank dies with the launcher (killed with -9, or by the OOM killer): its own process group
      // no longer gets the terminal's signals, so nothing else would stop it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(128 + SIGKILL);  // the launcher died before prctl
      for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_actions[i], nullptr);  // as the launcher found them
      sigprocmask(SIG_SETMASK, &unblocked, nullptr);
      setenv("MOK_RANK", std::to_string(r).c_str(), 1);
      setenv("MOK_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MOK_NCCL_ID", hex.c_str(), 1);
      setenv("CUDA_VISIBLE_DEVICES", (visible ? gpus[r] : std::to_string(r)).c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 1);
      std::vector<char*> args;
      for (auto& c : command) args.push_back(c.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::perror(("mok-launch: cannot run " + command[0]).c_str());
      _exit(127);
    }
    setpgid(pid, pid);  // here too, so that the group exists before the launcher signals it
    pids.push_back(pid);
  }
  sigprocmask(SIG_SETMASK, &unblocked, nullptr);  // a signal that came meanwhile is handled now
  const std::vector<pid_t> rank_pids = pids;  // rank r's pid at r (pids loses the reaped ones)
  int first_failure = 0, remaining = n;
  const auto start = std::chrono::steady_clock::now();
  bool passed_on = false, stopping = false, killed = false;
  std::chrono::steady_clock::time_point stop_sent_at;  // the first signal to stop the ranks
  auto start_stopping = [&] {
    if (!stopping) stop_sent_at = std::chrono::steady_clock::now();
    stopping = true;
  };
  while (remaining > 0) {
    if (g_signal != 0 && !passed_on) {
      std::fprintf(stderr, "mok-launch: got signal %d; passing it to every rank and waiting for them\n",
                   static_cast<int>(g_signal));
      signal_ranks(pids, g_signal);
      if (first_failure == 0) first_failure = 128 + g_signal;
      passed_on = true;
      start_stopping();
    }
    // A rank that ignores the signal or the failure's SIGTERM for --kill-after seconds is killed.
    if (stopping && !killed &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_sent_at).count() > kill_after_s) {
      std::fprintf(stderr, "mok-launch: ranks still running %g s after they were told to stop; killing them\n",
                   kill_after_s);
      signal_ranks(pids, SIGKILL);
      killed = true;
    }
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      --remaining;
      const int rank = static_cast<int>(std::find(rank_pids.begin(), rank_pids.end(), done) - rank_pids.begin());
      // A reaped rank's pid may be reused by another process: never signal it again.
      pids.erase(std::remove(pids.begin(), pids.end(), done), pids.end());
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && first_failure == 0) {
        first_failure = code;
        std::fprintf(stderr, "mok-launch: rank %d exited with %d; stopping the others\n", rank, code);
        signal_ranks(pids, SIGTERM);
        start_stopping();
      }
      continue;
    }
    if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      // As for a failure: SIGTERM, so that the ranks can clean up (a temporary file, say), and
      // SIGKILL to those still running --kill-after seconds later.
      std::fprintf(stderr, "mok-launch: timeout after %g s; stopping every rank (SIGTERM, SIGKILL after %g s)\n",
                   timeout_s, kill_after_s);
      signal_ranks(pids, SIGTERM);
      if (first_failure == 0) first_failure = 124;
      start_stopping();
      timeout_s = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A stopped run leaves nothing behind: what a rank started outlives it in the rank's process
  // group (a background job that ignored SIGTERM, say), so every rank's group gets SIGKILL once,
  // right after the last rank was reaped (an empty group's id is not reused within milliseconds).
  if (stopping)
    for (pid_t p : rank_pids) kill(-p, SIGKILL);
  return first_failure;
}
