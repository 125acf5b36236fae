// Distributed processes through PyTorch's own engine (c10d): launch, rendezvous,
// process groups, collectives, and a DDP-style gradient reducer.
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
//  - Reducer: gradients bucketed in reverse parameter order (first bucket 1 MB, then
//    25 MB caps), each bucket flattened and all-reduced (sum), launched from gradient
//    hooks during backward (overlap) or after it, as torch.nn.parallel.DistributedDataParallel
//    does (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training").
//
// The module is split by job: launch.hpp (launch), group.hpp (the job's connection:
// store and heartbeat, in a Job; groups, collectives, point to point), parallel/ddp.hpp (the reducer), parallel/zero.hpp (ZeRO stages 0-3,
// FSDP2-style dim-0 shards). This header includes all four.

#pragma once

#include "core/dist/group.hpp"
#include "core/dist/launch.hpp"
#include "core/parallel/ddp.hpp"
#include "core/parallel/zero.hpp"
