// Distributed processes through PyTorch's own engine (c10d): launch, rendezvous,
// process groups and their collectives.
//
//  - Launch: `mpt <experiment> --nproc N` makes the harness spawn N workers of mpt
//    itself (/proc/self/exe, same argv) with MPT_RANK / MPT_WORLD_SIZE / MASTER_ADDR /
//    MASTER_PORT set (127.0.0.1, a free port). The same binary also runs under an
//    existing launcher: torchrun --no-python (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
//    MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) or SLURM (SLURM_PROCID, SLURM_NTASKS,
//    SLURM_LOCALID; MASTER_ADDR/MASTER_PORT from the job script).
//  - Rendezvous: a c10d::TCPStore hosted by rank 0 (or by the torchrun agent).
//  - Collectives: c10d::ProcessGroupGloo on CPU (a Gloo TCP device on the master's
//    interface), every call bounded by a timeout, so no rank waits forever.
//  - Point to point: send/recv between two ranks (pipeline stages), same timeout.
//
// The module is split by job: launch.hpp (launch), group.hpp (the job's connection: store and
// heartbeat, in a Job; groups, collectives, point to point). This header includes both: the
// rest of dist/ (world.hpp: the harness's World; bench.hpp: collective benchmarks) and the
// parallelisms built on it (core/parallel/: the DDP reducer, ZeRO/FSDP, tensor parallelism)
// are included by name where needed, as dist/ never includes parallel/ (docs/architecture.md).
// The .cpp files' internals: job_state.hpp and group_impl.hpp (private to dist/).

#pragma once

#include "core/dist/group.hpp"
#include "core/dist/launch.hpp"
