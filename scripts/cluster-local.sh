#!/usr/bin/env bash
# A multi-node Slurm cluster on this machine, for tests: N network namespaces (zflow-n0,
# zflow-n1, ...), each a Slurm node with its own address on a bridge (10.77.0.10, .11, ...), its
# own host name (a UTS namespace) and its own slurmd; slurmctld and munged run beside them in
# this machine's namespace, on the bridge's 10.77.0.1. These are the test suite's own hosts:
# their traffic stays on the bridge and loopback. Needs root (ip netns) and Slurm's packages
# (scripts/slurm-local.sh installs them).
#
# The namespaces, the bridge and the ports are the machine's, so there is one such cluster per
# machine: its state lives in ./target/cluster-local of the folder that started it, which
# /run/zflow-cluster-local.owner names, and start and stop hold /run/zflow-cluster-local.lock.
#
# Usage:
#   cluster-local.sh start N     start N nodes, first removing what an earlier start from this
#                                folder left; refused while a cluster started from another folder
#                                runs. Prints `export SLURM_CONF=...`
#   cluster-local.sh stop        stop every daemon and process on the nodes, remove the namespaces
#                                and the bridge; refused for a cluster started from another folder
#   cluster-local.sh kill-node I SIGNAL
#                                send SIGNAL to every process on node I (KILL takes the node
#                                down, its slurmd included; STOP freezes its ranks)
#   cluster-local.sh revive-node I
#                                start node I's slurmd again after a kill-node I KILL
#   cluster-local.sh pids I      the processes running on node I
# A recipe with `executor: {kind: slurm}` runs on the cluster with that SLURM_CONF. On the nodes,
# `GLOO_SOCKET_IFNAME=zeth0` names the interface ranks talk over.
set -euo pipefail
D="$(pwd)/target/cluster-local"
BRIDGE=zflowbr0
NET=10.77.0
CONF="$D/slurm.conf"
OWNER=/run/zflow-cluster-local.owner
LOCK=/run/zflow-cluster-local.lock

ns() { echo "zflow-n$1"; }

start_slurmd() {
  local i=$1
  mkdir -p "$D/spool/n$i"
  # Its own network and host name (ranks on it report `n<i>`, as on a real cluster). nsenter,
  # not `ip netns exec`, which would mount a sysfs without the cgroup hierarchy slurmd reads.
  nsenter --net="/run/netns/$(ns "$i")" unshare --uts bash -c \
    "hostname n$i && exec slurmd -f '$CONF' -N n$i" 9>&-
}

# Refuses (exit 1) when a cluster started from another folder is running: its namespaces are
# the ones this folder would remove.
check_owner() {
  local owner
  owner=$(cat "$OWNER" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$owner" != "$D" ] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    echo "cluster-local: the cluster running on this machine was started from ${owner%/target/cluster-local}; run \`scripts/cluster-local.sh stop\` there" >&2
    exit 1
  fi
}

# Waits up to 10 s for `what` (a command) to fail.
wait_gone() {
  for _ in $(seq 1 100); do
    "$@" >/dev/null 2>&1 || return 0
    sleep 0.1
  done
  echo "cluster-local: still there after 10 s: $*" >&2
  return 1
}

# Removes every node namespace (whatever count this folder recorded), its processes and its
# link, the bridge and the daemons. Each removal is waited for: a namespace outlives its last
# process's death by a moment, and its link with it, which made a quick restart fail with
# "File exists".
stop_all() {
  local names name pids
  names=$(ip netns list | awk '{print $1}' | grep -E '^zflow-n[0-9]+$' || true)
  for name in $names; do
    pids=$(ip netns pids "$name" || true)
    if [ -n "$pids" ]; then
      kill -9 $pids 2>/dev/null || true
      for pid in $pids; do wait_gone kill -0 "$pid" || true; done
    fi
  done
  for name in $names; do
    ip netns del "$name" 2>/dev/null || true
    wait_gone test -e "/run/netns/$name"
  done
  for link in $(ip -o link show | awk -F': ' '{print $2}' | grep -oE '^zv[0-9]+' || true); do
    ip link del "$link" 2>/dev/null || true
    wait_gone ip link show "$link"
  done
  for f in "$D/slurmctld.pid" "$D/munge/munged.pid"; do
    if [ -f "$f" ]; then
      pid=$(cat "$f")
      kill "$pid" 2>/dev/null || true
      wait_gone kill -0 "$pid" || true
    fi
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  wait_gone ip link show "$BRIDGE"
  rm -f "$D/nodes" "$OWNER"
}

# The daemons started below do not inherit the lock's descriptor (`9>&-`): they would hold
# the lock for as long as they run.
if [ "${1:-}" = start ] || [ "${1:-}" = stop ]; then
  exec 9>"$LOCK"
  flock 9
  check_owner
fi

case "${1:-}" in
start)
  n="${2:?usage: cluster-local.sh start N}"
  command -v slurmctld >/dev/null || {
    echo "cluster-local: Slurm is not installed (scripts/slurm-local.sh start installs it)" >&2
    exit 1
  }
  stop_all
  rm -rf "$D"; mkdir -p "$D/munge" "$D/spool" "$D/log"
  chmod 755 "$D" "$D/munge"
  echo "$n" > "$D/nodes"
  echo "$D" > "$OWNER"
  mungekey --create --keyfile="$D/munge/munge.key"
  munged --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
         --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" \
         --seed-file="$D/munge/munged.seed" 9>&-
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 0 $((n - 1))); do
    ip netns add "$(ns "$i")"
    ip link add "zv$i" type veth peer name zeth0 netns "$(ns "$i")"
    ip link set "zv$i" master "$BRIDGE" up
    ip -n "$(ns "$i")" addr add "$NET.$((10 + i))/24" dev zeth0
    ip -n "$(ns "$i")" link set zeth0 up
    ip -n "$(ns "$i")" link set lo up
  done
  # ZFLOW_CLUSTER_CPUS: CPUs each node declares (default this machine's), more to oversubscribe
  # it, as a rehearsal of many ranks per node does (scripts/rehearsal.sh).
  cpus=${ZFLOW_CLUSTER_CPUS:-$(nproc)}
  cat > "$CONF" <<CONF
ClusterName=zflowcluster
SlurmctldHost=$(hostname -s)($NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
SlurmctldPort=16827
SlurmdPort=16828
StateSaveLocation=$D/spool/ctld
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
# The nodes are what this file declares (ZFLOW_CLUSTER_CPUS), not what slurmd detects.
SlurmdParameters=config_overrides
KillWait=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=n[0-$((n - 1))] NodeAddr=$NET.[10-$((9 + n))] CPUs=$cpus RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[0-$((n - 1))] Default=YES MaxTime=INFINITE State=UP
CONF
  mkdir -p "$D/spool/ctld"
  slurmctld -f "$CONF" 9>&-
  for i in $(seq 0 $((n - 1))); do start_slurmd "$i"; done
  export SLURM_CONF="$CONF"
  for _ in $(seq 1 60); do
    [ "$(sinfo -h -N -o %t 2>/dev/null | grep -c idle)" -eq "$n" ] && break
    sleep 0.5
  done
  sinfo -N >&2
  echo "export SLURM_CONF=$CONF"
  ;;
stop)
  stop_all
  ;;
kill-node)
  i="${2:?usage: cluster-local.sh kill-node I SIGNAL}"
  ip netns pids "$(ns "$i")" | xargs -r kill "-${3:?signal}"
  ;;
revive-node)
  start_slurmd "${2:?usage: cluster-local.sh revive-node I}"
  ;;
pids)
  ip netns pids "$(ns "${2:?usage: cluster-local.sh pids I}")"
  ;;
*)
  echo "usage: cluster-local.sh start N | stop | kill-node I SIGNAL | revive-node I | pids I" >&2
  exit 2
  ;;
esac
