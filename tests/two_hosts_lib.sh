# Two "hosts" on one machine for a test: two network namespaces joined by a
# veth pair (a private /24 of 10.231.0.0/16, one address each, loopback up),
# and every process run there in a UTS namespace of its own, so each host has
# its own host name. They still share memory: hold transports to the wire
# (UCX_TLS=tcp,self, OMPI_MCA_btl=tcp,self), or a shared-memory transport
# connects them behind the network's back.
#
#   source tests/two_hosts_lib.sh
#   reason=$(th_skip_reason) && { echo "SKIPPED: $reason"; exit 0; }
#   trap th_cleanup EXIT
#   th_setup                       # TH_NS_A/B, TH_ADDR_A/B, TH_HOST_A/B
#   th_start A out.log cmd args... # in the background; TH_PID_A
#   th_cut; th_restore             # the link between them
#
# Names are unique per run (loom-<pid>-a/-b), so runs never meet; th_cleanup
# kills every process inside the two namespaces and deletes them, also after a
# failure. Only addresses inside these namespaces are ever used.

TH_NS_A=""; TH_NS_B=""
TH_ADDR_A=""; TH_ADDR_B=""
TH_HOST_A=""; TH_HOST_B=""
TH_PID_A=""; TH_PID_B=""; TH_RC=""
TH_DEV=veth0

# Prints why two hosts cannot be made here and returns 0, or returns 1.
th_skip_reason() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "needs root for network namespaces (ip netns) and host names (unshare --uts)"; return 0
  fi
  local b
  for b in ip unshare hostname; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$b" > /dev/null 2>&1 ||
      { echo "'$b' missing: run tools/setup.sh (iproute2, util-linux)"; return 0; }
  done
  local probe="loom-$$-probe" out
  if ! out=$(PATH="$PATH:/usr/sbin:/sbin" ip netns add "$probe" 2>&1); then
    echo "cannot create a network namespace (ip netns add: $out)"; return 0
  fi
  if ! out=$(PATH="$PATH:/usr/sbin:/sbin" ip netns exec "$probe" unshare --uts hostname loom-probe 2>&1); then
    PATH="$PATH:/usr/sbin:/sbin" ip netns del "$probe" 2>/dev/null
    echo "cannot give a namespace its own host name (unshare --uts: $out)"; return 0
  fi
  PATH="$PATH:/usr/sbin:/sbin" ip netns del "$probe"
  return 1
}

# Creates the namespaces, the veth pair and the addresses.
th_setup() {
  export PATH="$PATH:/usr/sbin:/sbin"
  TH_NS_A="loom-$$-a"; TH_NS_B="loom-$$-b"
  TH_HOST_A="loom-host-a-$$"; TH_HOST_B="loom-host-b-$$"
  local net="10.231.$(($$ % 250 + 1))"
  TH_ADDR_A="$net.1"; TH_ADDR_B="$net.2"
  ip netns add "$TH_NS_A"
  ip netns add "$TH_NS_B"
  # Both ends are made inside their namespaces: no name in the machine's own.
  ip link add "$TH_DEV" netns "$TH_NS_A" type veth peer name "$TH_DEV" netns "$TH_NS_B"
  ip -n "$TH_NS_A" addr add "$TH_ADDR_A/24" dev "$TH_DEV"
  ip -n "$TH_NS_B" addr add "$TH_ADDR_B/24" dev "$TH_DEV"
  local ns
  for ns in "$TH_NS_A" "$TH_NS_B"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$TH_DEV" up
  done
  th_wait_up || return 1
  echo "two_hosts_lib: host $TH_HOST_A = $TH_ADDR_A (netns $TH_NS_A), host $TH_HOST_B = $TH_ADDR_B (netns $TH_NS_B), veth $TH_DEV"
}

# Waits (10 s at most) until both ends are up (operstate: a program that
# lists interfaces before then, as UCX does at start, does not see the link)
# and each host reaches the other.
th_wait_up() {
  local i
  for i in $(seq 1 100); do
    [ "$(ip netns exec "$TH_NS_A" cat /sys/class/net/$TH_DEV/operstate)" = up ] &&
      [ "$(ip netns exec "$TH_NS_B" cat /sys/class/net/$TH_DEV/operstate)" = up ] &&
      th_reaches A "$TH_ADDR_B" && th_reaches B "$TH_ADDR_A" && return 0
    sleep 0.1
  done
  echo "two_hosts_lib: the link between $TH_ADDR_A and $TH_ADDR_B did not come up" >&2
  return 1
}

# th_reaches A|B ADDR: true if a TCP connection from that host to ADDR gets an
# answer (accepted or refused: no ping on a minimal machine) within 1 s.
th_reaches() {
  local ns; case "$1" in A) ns=$TH_NS_A ;; B) ns=$TH_NS_B ;; esac
  local out
  out=$(ip netns exec "$ns" timeout 1 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
  case "$out" in *refused*) return 0 ;; esac
  return 1
}

# th_exec A|B CMD...: runs CMD on that host in the foreground (own host name).
th_exec() {
  local ns host
  case "$1" in A) ns=$TH_NS_A; host=$TH_HOST_A ;; B) ns=$TH_NS_B; host=$TH_HOST_B ;;
    *) echo "th_exec: host A or B, not '$1'" >&2; return 2 ;; esac
  shift
  # ip netns exec, unshare and sh all exec, none forks: CMD gets their pid.
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

# th_start A|B LOG CMD...: runs CMD on that host in the background, output to
# LOG; CMD's own pid (not a subshell's) in TH_PID_A / TH_PID_B.
th_start() {
  local which="$1" log="$2"; shift 2
  ( exec > "$log" 2>&1; case "$which" in A) ns=$TH_NS_A; host=$TH_HOST_A ;;
      B) ns=$TH_NS_B; host=$TH_HOST_B ;; esac
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@" ) &
  case "$which" in A) TH_PID_A=$! ;; B) TH_PID_B=$! ;; esac
}

# th_wait PID SECONDS: sets TH_RC to the exit status of PID (a th_start of
# this shell), or to 124 if it still runs after SECONDS (then it is left
# running). Not in a $(...): a subshell cannot wait for this shell's children.
th_wait() {
  local pid="$1" t="$2" i
  TH_RC=124
  for i in $(seq 1 $((t * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then
      TH_RC=0; wait "$pid" || TH_RC=$?
      return 0
    fi
    sleep 0.1
  done
}

# The link: th_cut takes both ends down (packets stop in both directions, no
# reset reaches either side); th_restore brings them back.
th_cut() {
  ip -n "$TH_NS_A" link set "$TH_DEV" down
  ip -n "$TH_NS_B" link set "$TH_DEV" down
}
th_restore() {
  ip -n "$TH_NS_A" link set "$TH_DEV" up
  ip -n "$TH_NS_B" link set "$TH_DEV" up
  th_wait_up
}

# th_tx_bytes A|B: bytes sent so far over that host's end of the link.
th_tx_bytes() {
  local ns; case "$1" in A) ns=$TH_NS_A ;; B) ns=$TH_NS_B ;; esac
  ip netns exec "$ns" cat "/sys/class/net/$TH_DEV/statistics/tx_bytes"
}

# th_pids A|B: every process living in that host's network namespace.
th_pids() {
  local ns; case "$1" in A) ns=$TH_NS_A ;; B) ns=$TH_NS_B ;; esac
  [ -n "$ns" ] && ip netns pids "$ns" 2>/dev/null
}

# Kills every process in both namespaces (only those: `ip netns pids`) and
# deletes the namespaces (the veth pair goes with them). Safe to call twice.
th_cleanup() {
  local rc=$? ns pids i
  set +e  # an EXIT trap: clean up whatever is there, whatever fails
  for ns in "$TH_NS_A" "$TH_NS_B"; do
    [ -n "$ns" ] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null
  done
  for i in $(seq 1 30); do
    pids=""
    for ns in "$TH_NS_A" "$TH_NS_B"; do
      [ -n "$ns" ] && pids="$pids $(ip netns pids "$ns" 2>/dev/null || true)"
    done
    [ -z "${pids// /}" ] && break
    [ "$i" = 30 ] && kill -KILL $pids 2>/dev/null
    sleep 0.1
  done
  # Reap them quietly (no "Killed" line per job from bash).
  local p
  for p in $TH_PID_A $TH_PID_B; do wait "$p" 2>/dev/null || true; done
  for ns in "$TH_NS_A" "$TH_NS_B"; do
    [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null
  done
  TH_NS_A=""; TH_NS_B=""
  return "$rc"
}
