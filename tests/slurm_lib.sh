# A one-node Slurm cluster from Debian's packages (slurm-wlm, munge), private
# to one test: munged with its own key and socket, slurmctld and slurmd with a
# slurm.conf naming this host, configuration, state, log and pid files under
# one folder (sockets under a short one in /tmp: a Unix socket's path has at
# most 108 bytes), ports picked free per run, all stopped by slurm_stop
# (install it in an EXIT trap). Clients (srun, sbatch, scancel, scontrol) find it through the
# exported SLURM_CONF.
#
#   source tests/slurm_lib.sh
#   reason=$(slurm_skip_reason) && { echo "SKIPPED: $reason"; exit 0; }
#   trap slurm_stop EXIT
#   slurm_start "$TEST_TMPDIR/slurm"
#   srun -N1 -n2 ...
#
# Needs root (slurmd starts job steps as the submitting user, munged and the
# daemons write where root can). Only this machine's loopback is used.

SLURM_DAEMONS=(munged slurmctld slurmd srun sbatch scancel scontrol sinfo squeue)
SLURM_DIR=""
SLURM_SOCKDIR=""
SLURM_PIDS=()

# Prints why the cluster cannot run here and returns 0, or returns 1.
slurm_skip_reason() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "needs root to run munged, slurmctld and slurmd (run as $(id -un))"; return 0
  fi
  local missing=() b
  for b in "${SLURM_DAEMONS[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$b" > /dev/null 2>&1 || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Slurm/munge binaries missing (${missing[*]}): run tools/setup.sh (slurm-wlm munge)"
    return 0
  fi
  return 1
}

_slurm_free_port() {  # a TCP port nobody listens on, from a range away from ephemeral ports
  local p i
  for i in $(seq 1 50); do
    p=$((12000 + RANDOM % 8000))
    if ! ss -Htln "sport = :$p" 2>/dev/null | grep -q .; then echo "$p"; return 0; fi
  done
  return 1
}

_slurm_wait() {  # _slurm_wait SECONDS WHAT CMD...: retries CMD until it succeeds
  local t="$1" what="$2" i; shift 2
  for i in $(seq 1 $((t * 5))); do
    "$@" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "slurm_lib: $what did not come up within ${t} s" >&2
  slurm_logs >&2
  return 1
}

# Prints the tail of every daemon log (for a failure report).
slurm_logs() {
  local f
  for f in "$SLURM_DIR"/log/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f (last 30 lines)"; tail -30 "$f"
  done
}

# slurm_start DIR: the cluster, with its files under DIR (created).
slurm_start() {
  SLURM_DIR="$1"
  export PATH="$PATH:/usr/sbin:/sbin"
  mkdir -p "$SLURM_DIR"/{munge,state,log,run}
  # A Unix socket path must fit in 108 bytes, a test's temporary folder may
  # not: munged's socket and slurmd's spool (slurmstepd's sockets) live in a
  # short private folder of their own, removed by slurm_stop.
  SLURM_SOCKDIR=$(mktemp -d /tmp/loom-slurm.XXXXXX)
  chmod 700 "$SLURM_DIR/munge"; chmod 755 "$SLURM_SOCKDIR"
  mkdir -p "$SLURM_SOCKDIR/spool"
  ln -sfn "$SLURM_SOCKDIR/spool" "$SLURM_DIR/spool"   # to find it from the test's folder
  local sock="$SLURM_SOCKDIR/munge.socket"

  dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$SLURM_DIR/munge/munge.key"
  # --force: the test's folders are not root-owned-and-private all the way up,
  # which munged would otherwise refuse.
  munged --force --key-file="$SLURM_DIR/munge/munge.key" --socket="$sock" \
    --pid-file="$SLURM_DIR/run/munged.pid" --log-file="$SLURM_DIR/log/munged.log" \
    --seed-file="$SLURM_DIR/munge/munged.seed" > "$SLURM_DIR/log/munged.out" 2>&1 || {
    echo "slurm_lib: munged failed to start:" >&2; cat "$SLURM_DIR/log/munged.out" >&2
    tail -20 "$SLURM_DIR/log/munged.log" >&2 2>/dev/null; return 1; }
  _slurm_wait 10 munged test -S "$sock" || return 1
  SLURM_PIDS+=("$(cat "$SLURM_DIR/run/munged.pid")")

  local host ctld_port slurmd_port cpus
  host=$(hostname -s)
  cpus=$(nproc --all)
  ctld_port=$(_slurm_free_port) && slurmd_port=$(_slurm_free_port) || {
    echo "slurm_lib: no free TCP port" >&2; return 1; }
  : > "$SLURM_DIR/plugstack.conf"
  cat > "$SLURM_DIR/slurm.conf" <<EOF
# One-node cluster of a Loom test (tests/slurm_lib.sh); everything under $SLURM_DIR.
ClusterName=loomtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_SOCKDIR/spool
SlurmctldPidFile=$SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/run/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$SLURM_DIR/plugstack.conf
# No cgroups: plain process tracking, no task binding, no accounting daemon.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
# Short timeouts: a test waits for them.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
# Job ids (and so docs/slurm/train.sbatch's ports) differ from run to run.
FirstJobId=$((1000 + RANDOM % 30000))
MailProg=/bin/true
KillWait=5
UnkillableStepTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=loom Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  # -D: stay in the foreground (we own the pid); -i: ignore stale state.
  slurmctld -D -i -f "$SLURM_CONF" > "$SLURM_DIR/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=("$!")
  _slurm_wait 30 slurmctld scontrol ping || return 1
  slurmd -D -f "$SLURM_CONF" -N "$host" > "$SLURM_DIR/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=("$!")
  _slurm_wait 60 "slurmd (node $host idle)" \
    sh -c "sinfo -h -N -n '$host' -o %t | grep -qx idle" || return 1
  echo "slurm_lib: cluster up in $SLURM_DIR (node $host, $cpus CPUs, slurmctld :$ctld_port, slurmd :$slurmd_port)"
}

# Cancels every job, stops slurmd, slurmctld and munged (in that order), and
# removes munged's socket folder. Safe to call twice and before slurm_start.
slurm_stop() {
  local rc=$? pid i
  set +e  # an EXIT trap: clean up whatever is there, whatever fails
  if [ -n "$SLURM_DIR" ] && [ -f "${SLURM_CONF:-}" ]; then
    timeout 10 scancel --full --quiet --user="$(id -un)" > /dev/null 2>&1 || true
    # Give job steps a moment to end under slurmd before it goes.
    for i in $(seq 1 25); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # Daemons in reverse start order: slurmd, slurmctld, munged.
  for ((i = ${#SLURM_PIDS[@]} - 1; i >= 0; i--)); do
    pid="${SLURM_PIDS[$i]}"
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  SLURM_PIDS=()
  # Job processes left behind (only if a step outlived slurmd): exactly those
  # whose environment names this cluster's slurm.conf and a job id.
  if [ -n "$SLURM_DIR" ]; then
    local f envs
    for f in /proc/[0-9]*/environ; do
      pid="${f#/proc/}"; pid="${pid%/environ}"
      [ "$pid" = "$$" ] && continue
      envs=$( { tr '\0' '\n' < "$f"; } 2>/dev/null) || continue
      if grep -qxF "SLURM_CONF=$SLURM_DIR/slurm.conf" <<< "$envs" &&
         grep -q "^SLURM_JOB_ID=" <<< "$envs"; then
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done
  fi
  [ -n "$SLURM_SOCKDIR" ] && rm -rf "$SLURM_SOCKDIR"
  SLURM_SOCKDIR=""
  return "$rc"
}
