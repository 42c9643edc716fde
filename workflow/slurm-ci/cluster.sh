#!/usr/bin/env bash
# A one-node SLURM cluster on this machine: for the test suite (tests/test_slurm.py, marker `slurm`) and for trying
# the project's SLURM profile before using a real cluster.
#
#   workflow/slurm-ci/cluster.sh start DIR    install slurm-wlm + munge from Debian if missing (root only), write
#                                             DIR/slurm.conf, start munged, slurmctld and slurmd with their pid
#                                             files in DIR, wait until the node is idle; print the SLURM_CONF line
#   workflow/slurm-ci/cluster.sh stop DIR     stop exactly the daemons whose pids are recorded in DIR
#   workflow/slurm-ci/cluster.sh env DIR      print the two exports a client needs (SLURM_CONF, PATH)
#
# The PATH export puts DIR/bin first: its `srun` sets SLURM_CONF and calls the real one, because the executor's
# jobstep plugin (snakemake-executor-plugin-slurm-jobstep 0.6.1) drops every SLURM_* variable but the job's identity
# from the environment of the srun it starts inside a job, and a cluster whose slurm.conf is not at the system path
# is then unreachable from there ("DNS SRV lookup failed"). A real cluster keeps its slurm.conf at the system path.
#
# start is idempotent (a cluster already running from DIR is left as it is) and refuses to start when port 6817
# (slurmctld) or 6818 (slurmd) is taken by anything else: a real cluster's daemons are never touched. stop kills by
# the pids it recorded, never by name. Why each slurm.conf setting: see the comments in write_conf.
set -euo pipefail

CTLD_PORT=6817
SLURMD_PORT=6818
DAEMONS=(slurmd slurmctld munged)  # stop order: the node, the controller, then authentication

die() { echo "cluster.sh: $*" >&2; exit 2; }

usage() { sed -n '2,16p' "$0" >&2; exit 2; }

alive() {  # alive PIDFILE: the pid in the file names a running process
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

port_taken() {
  ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

install_packages() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
  [[ $(id -u) -eq 0 ]] || die "slurm-wlm and munge are not installed, and installing them needs root"
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed, and apt-get is unavailable"
  echo "cluster.sh: installing slurm-wlm and munge from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; }
}

write_conf() {
  local dir=$1 node
  # The node exactly as slurmd sees it (CPUs, sockets, memory), renamed: the host name need not be localhost.
  node=$(slurmd -C | head -1 | sed -E 's/^NodeName=[^ ]+/NodeName=localhost NodeAddr=127.0.0.1/')
  mkdir -p "$dir/state" "$dir/spool" "$dir/bin"
  printf '#!/bin/sh\nSLURM_CONF=%s/slurm.conf exec %s "$@"\n' "$dir" "$(command -v srun)" >"$dir/bin/srun"
  chmod +x "$dir/bin/srun"
  cat >"$dir/slurm.conf" <<EOF
# Written by workflow/slurm-ci/cluster.sh: a one-node test cluster, every file under $dir.
ClusterName=gfci
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# no cgroups in a container: track processes through /proc, bind no tasks
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# cores and memory are consumable, so two jobs share the node as their requests allow
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# no slurmdbd: nothing to account to (the profile's status command is squeue, which works without it)
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# a finished job stays visible to squeue for 5 minutes, well above the executor's status-check interval
MinJobAge=300
# a job without --mem must not take the whole node and block the rest
DefMemPerCPU=1000
# a request larger than the node fails at sbatch instead of pending forever
EnforcePartLimits=ALL
PropagatePrioProcess=1
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
SlurmctldTimeout=30
SlurmdTimeout=30
$node State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

wait_idle() {
  local deadline=$((SECONDS + 60)) state
  while ((SECONDS < deadline)); do
    state=$(SLURM_CONF="$1/slurm.conf" sinfo -h -N -o %t 2>/dev/null | head -1 || true)
    case "$state" in idle|mix|alloc) return 0 ;; esac
    sleep 0.5
  done
  die "the node did not become idle within 60 s (state '${state:-none}'); logs: $1/slurmctld.log, $1/slurmd.log"
}

start() {
  local dir=$1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid" && alive "$dir/munged.pid"; then
    echo "cluster.sh: already running from $dir" >&2
    exports "$dir"
    return 0
  fi
  port_taken "$CTLD_PORT" && die "port $CTLD_PORT is taken (another slurmctld?): not starting a second cluster"
  port_taken "$SLURMD_PORT" && die "port $SLURMD_PORT is taken (another slurmd?): not starting a second cluster"
  install_packages
  write_conf "$dir"
  local key=/etc/munge/munge.key
  [[ -r $key ]] || die "no readable munge key at $key (the munge package creates it)"
  munged --force --key-file="$key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
  SLURM_CONF="$dir/slurm.conf" slurmctld -f "$dir/slurm.conf"
  SLURM_CONF="$dir/slurm.conf" slurmd -f "$dir/slurm.conf" -N localhost
  local deadline=$((SECONDS + 20))
  until alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid"; do
    ((SECONDS < deadline)) || { stop "$dir"; die "the daemons did not start; logs in $dir"; }
    sleep 0.2
  done
  wait_idle "$dir"
  exports "$dir"
}

exports() {
  echo "export SLURM_CONF=$1/slurm.conf PATH=$1/bin:\$PATH"
}

stop() {
  local dir=$1 name pid deadline
  for name in "${DAEMONS[@]}"; do
    alive "$dir/$name.pid" || continue
    pid=$(cat "$dir/$name.pid")
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  done
  return 0
}

[[ $# -eq 2 ]] || usage
case "$1" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  env) exports "$(cd "$2" && pwd)" ;;
  *) usage ;;
esac
