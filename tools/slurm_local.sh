#!/usr/bin/env bash
# tools/slurm_local.sh: a real two-node Slurm cluster on this one machine, for trying the
# jobs/*.slurm scripts and for tests/slurm/multinode.sh (docs/checkpoint.md "Slurm").
#
#   tools/slurm_local.sh start    # install if missing, start munged, slurmctld, slurmd n1 + n2
#   tools/slurm_local.sh status   # the daemons' pids and sinfo
#   tools/slurm_local.sh stop     # stop exactly the daemons `start` started (pid files)
#   tools/slurm_local.sh env      # print the environment lines to use the cluster
#
# start prints `export SLURM_CONF=...` (and the Open MPI loopback settings); eval its last
# lines or source the printed env file:  . "$FSDP_SLURM_DIR/env.sh"
#
# Slurm 22.05 from Debian (slurmd slurmctld slurm-client munge libpmix-dev; installed with
# apt-get --no-install-recommends, with a temporary policy-rc.d so that the packages' own
# services do not start). Everything else lives in the state directory $FSDP_SLURM_DIR
# (default /tmp/fsdp-slurm): munge key and socket, slurm.conf, logs, spool and per-node TmpFS.
# Each slurmd runs in its own UTS + mount namespace with hostname n1 / n2 and an /etc/hosts
# mapping n1, n2 to 127.0.1.1, 127.0.1.2: Open MPI names its shared-memory segments by
# hostname, so two "nodes" with one hostname would collide. Both nodes share the machine's
# cores, memory and filesystem: timings mean nothing. Requeued jobs wait cred_expire = 10 s.
# Needs root (namespaces, mounts, apt-get).
set -euo pipefail

DIR=${FSDP_SLURM_DIR:-/tmp/fsdp-slurm}
CONF=$DIR/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
NODES=(n1 n2)
declare -A ADDR=([n1]=127.0.1.1 [n2]=127.0.1.2)
declare -A PORT=([n1]=17001 [n2]=17002)
CTLD_PORT=${FSDP_SLURM_CTLD_PORT:-17000}

die() { echo "slurm_local.sh: $*" >&2; exit 1; }

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  [ -e /usr/include/pmix.h ] || ls /usr/lib/*/libpmix.so* >/dev/null 2>&1 || missing+=(libpmix-dev)
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages ${missing[*]} and not root"
  echo "slurm_local.sh: installing ${missing[*]}"
  local had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  if [ $had_policy -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" ||
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; } ||
    rc=$?
  [ $had_policy -eq 0 ] && rm -f /usr/sbin/policy-rc.d
  [ $rc -eq 0 ] || die "apt-get install ${missing[*]} failed"
}

alive() {  # alive PIDFILE: the pid in PIDFILE is a running process
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

write_config() {
  mkdir -p "$DIR/munge" "$DIR/ctld" "$DIR/log"
  chmod 700 "$DIR/munge"
  local n
  for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"; done
  local host; host=$(hostname)
  {
    echo "127.0.0.1 localhost $host"
    for n in "${NODES[@]}"; do echo "${ADDR[$n]} $n"; done
  } >"$DIR/hosts"
  echo "hosts: files" >"$DIR/nsswitch.conf"
  # Every task (batch script and srun tasks) gets these: Open MPI on loopback, as root.
  cat >"$DIR/task_prolog.sh" <<'EOF'
#!/bin/sh
echo "export OMPI_MCA_btl_tcp_if_include=lo"
echo "export OMPI_MCA_oob_tcp_if_include=lo"
echo "export OMPI_ALLOW_RUN_AS_ROOT=1"
echo "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
EOF
  chmod +x "$DIR/task_prolog.sh"
  cat >"$CONF" <<EOF
# Written by tools/slurm_local.sh: two nodes n1, n2 on this machine.
ClusterName=fsdplocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmdLogFile=$DIR/log/slurmd.%n.log
TmpFS=$DIR/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$DIR/task_prolog.sh
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=30
EOF
  for n in "${NODES[@]}"; do
    echo "NodeName=$n NodeAddr=${ADDR[$n]} NodeHostname=$n Port=${PORT[$n]} CPUs=2 State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=local Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
  cat >"$DIR/env.sh" <<EOF
export SLURM_CONF=$CONF
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
}

start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (namespaces, mounts)"
  install_packages
  if alive "$DIR/slurmctld.pid"; then
    echo "slurm_local.sh: already running (state in $DIR)"
    cat "$DIR/env.sh"
    return 0
  fi
  write_config
  export SLURM_CONF=$CONF
  if ! alive "$DIR/munged.pid"; then
    [ -s "$DIR/munge/munge.key" ] || mungekey -c -k "$DIR/munge/munge.key" >/dev/null 2>&1 ||
      dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
    munged --force --key-file "$DIR/munge/munge.key" --socket "$MUNGE_SOCKET" \
      --pid-file "$DIR/munged.pid" --log-file "$DIR/log/munged.log" \
      --seed-file "$DIR/munge/munge.seed" || die "munged did not start ($DIR/log/munged.log)"
  fi
  # -c: a clean controller state each start (a killed slurmctld leaves state behind).
  slurmctld -c -f "$CONF" || die "slurmctld did not start ($DIR/log/slurmctld.log)"
  local n
  for n in "${NODES[@]}"; do
    unshare --uts --mount --propagation slave -- sh -c "hostname $n && \
      mount --bind '$DIR/hosts' /etc/hosts && \
      mount --bind '$DIR/nsswitch.conf' /etc/nsswitch.conf && \
      exec slurmd -N $n -f '$CONF'" || die "slurmd $n did not start ($DIR/log/slurmd.$n.log)"
  done
  # Bounded wait until both nodes are idle.
  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -N -o "%N %t" 2>/dev/null | sort | tr '\n' ' ')
    [ "$state" = "n1 idle n2 idle " ] && break
    sleep 0.25
  done
  [ "$state" = "n1 idle n2 idle " ] ||
    die "nodes not idle after 30 s: '$state' (logs in $DIR/log)"
  echo "slurm_local.sh: two nodes up (state in $DIR); to use them:"
  cat "$DIR/env.sh"
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: SIGTERM, wait up to 15 s, then SIGKILL
  local name=$1 pf=$2 pid
  alive "$pf" || { rm -f "$pf"; return 0; }
  pid=$(cat "$pf")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "slurm_local.sh: $name (pid $pid) ignored SIGTERM; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pf"
}

stop() {
  local n
  for n in "${NODES[@]}"; do stop_pidfile "slurmd $n" "$DIR/slurmd.$n.pid"; done
  stop_pidfile slurmctld "$DIR/slurmctld.pid"
  stop_pidfile munged "$DIR/munged.pid"
  echo "slurm_local.sh: stopped (state left in $DIR)"
}

status() {
  local rc=0 n
  for f in munged slurmctld slurmd.n1 slurmd.n2; do
    if alive "$DIR/$f.pid"; then echo "$f: running (pid $(cat "$DIR/$f.pid"))"; else echo "$f: not running"; rc=1; fi
  done
  if [ $rc -eq 0 ]; then SLURM_CONF=$CONF sinfo -N; echo "SLURM_CONF=$CONF"; fi
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) [ -f "$DIR/env.sh" ] || die "not started (no $DIR/env.sh)"; cat "$DIR/env.sh" ;;
  *) echo "usage: $0 start|stop|status|env   (state dir \$FSDP_SLURM_DIR = $DIR)" >&2; exit 2 ;;
esac
