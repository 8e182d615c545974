#!/usr/bin/env bash
# Single-node Slurm for tests: munged + slurmctld + slurmd, no systemd, no cgroups.
# Usage: slurm-local.sh start|stop   (state lives in ./target/slurm-local)
# `start` does nothing when this folder's Slurm already answers, so the test command can run it
# every time.
# tests/slurm.rs finds the config at target/slurm-local/slurm.conf.
set -euo pipefail
D="$(pwd)/target/slurm-local"
case "${1:-start}" in
start)
  if [ -f "$D/slurm.conf" ] && SLURM_CONF="$D/slurm.conf" squeue -h >/dev/null 2>&1; then
    echo "slurm-local: already running (SLURM_CONF=$D/slurm.conf)"; exit 0
  fi
  if ! command -v slurmctld >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
  fi
  rm -rf "$D"; mkdir -p "$D/munge" "$D/spool/ctld" "$D/spool/d" "$D/log"
  chmod 755 "$D" "$D/munge"            # munged: socket dir needs a+x
  mungekey --create --keyfile="$D/munge/munge.key"
  munged --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
         --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" \
         --seed-file="$D/munge/munged.seed"
  cat > "$D/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$D/spool/ctld
SlurmdSpoolDir=$D/spool/d
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  slurmctld -f "$D/slurm.conf"
  slurmd -f "$D/slurm.conf" -N localhost
  export SLURM_CONF="$D/slurm.conf"
  for i in $(seq 1 30); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.5; done
  sinfo
  echo "export SLURM_CONF=$D/slurm.conf"
  ;;
stop)
  for f in "$D/slurmd.pid" "$D/slurmctld.pid" "$D/munge/munged.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; sleep 1
  done
  ;;
esac
