// core/dist, launch: where this process sits in a job (mpt --nproc, torchrun, SLURM), and
// mpt's own launcher (spawn_local), which runs N workers of the same binary on this machine and
// names the rank that failed. See dist.hpp for the whole module.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mpt::dist {

// ----------------------------------------------------------------------------
// Launch
// ----------------------------------------------------------------------------

/// Where this process sits in a job, as read from its environment.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  ///< processes of this job on this node (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE)
  int node_rank = 0;         ///< this node's index (torchrun's GROUP_RANK, SLURM_NODEID; 0 under mpt --nproc)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string launcher = "none";  ///< "none", "mpt" (--nproc), "torchrun", "slurm"
  bool agent_store = false;       ///< torchrun's agent hosts the TCPStore (TORCHELASTIC_USE_AGENT_STORE=True)
  std::string store_prefix;       ///< key prefix inside the agent's store ("/worker/attempt_K")
  std::string world_size_var;     ///< the variable the world size came from (MPT_WORLD_SIZE, WORLD_SIZE, SLURM_NTASKS)
};

/// Reads the launcher environment: MPT_RANK/MPT_WORLD_SIZE (mpt --nproc), then torchrun's
/// RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK, then SLURM_PROCID/SLURM_NTASKS/
/// SLURM_LOCALID/SLURM_NTASKS_PER_NODE/SLURM_NODEID (the node fields default to one node). nullopt when
/// none is set (a plain single process). MASTER_ADDR/MASTER_PORT are required for
/// world_size > 1. Throws RuntimeFailure for malformed or inconsistent values.
std::optional<LaunchInfo> launch_from_environment();

/// The local IPv4 address through which this host reaches `host` (a name or address): the
/// source address the kernel's routing table picks for it (a UDP socket connect()ed to
/// host:port, read back with getsockname; no packet is sent). "" when `host` does not resolve
/// or no route leads there. What a multi-node Gloo group binds to: a hostname that resolves
/// to 127.0.0.1 (a common /etc/hosts) would make Gloo advertise loopback to the other nodes.
std::string route_source_address(const std::string& host, int port);

/// Exit code of a worker stopped on purpose by the /fault config keys (tests of failure
/// handling): distinct from 3, which a rank uses when it stops because a peer failed.
inline constexpr int kExitInjectedFault = 86;

/// Spawns `nproc` workers running `argv` again (the executable is /proc/self/exe) with
/// MPT_RANK=i, MPT_WORLD_SIZE=nproc, MPT_LOCAL_RANK=i, MASTER_ADDR=127.0.0.1,
/// MASTER_PORT=<port> and MPT_AGENT_STORE=1: this process hosts the job's TCPStore (as
/// torchrun's agent does), so the store outlives any worker. Waits for all. When a worker
/// fails (non-zero exit or a signal), the others get `grace_s` seconds to end on their own
/// (they notice through their collective timeouts) and are then killed. Returns 0 when all
/// succeed; else logs "rank R of N failed: ..." naming the failed rank and returns its exit
/// code if it is 1, 2 or 3, else 3. Blame: ranks that fail within 0.2 s of each other are
/// weighed together; a rank that failed on its own (a signal, or an exit code other than 3)
/// is named first; else a rank that the failed ranks reported as not answering (see Group)
/// and that is still running: it is hung, and is killed as soon as the other ranks have
/// exited (at most min(grace_s, 10 s) later); else the first failure. Workers get SIGKILL
/// if this process dies.
int spawn_local(int nproc, const std::vector<std::string>& argv, double grace_s);

/// For a signal handler of the process in spawn_local (the launcher, interrupted by SIGINT,
/// SIGTERM or SIGHUP): sends `sig` to every worker still running and waits up to 2 s for them
/// to end, so that each ends by its own handler (rank 0 removes the temporary files of a result
/// it was writing) before the launcher's death SIGKILLs the rest (a stopped worker). No-op
/// outside spawn_local. Async-signal-safe: kill(2), waitpid(2), nanosleep(2) on fixed slots.
void end_workers_on_signal(int sig) noexcept;

}  // namespace mpt::dist
