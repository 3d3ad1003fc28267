#!/usr/bin/env bash
# Starts a one-node Slurm 22.05 cluster (munged, slurmctld, slurmd, slurmrestd
# with JWT auth) for the trainer-bridge's slurm engine and its tests.
#
# Idempotent: installs the Debian packages only when missing, keeps running
# daemons, restarts dead ones (stale pid files are fine), and always writes a
# fresh token. Needs root (Debian 12, no systemd needed).
#
#   EDGELOOP_SLURM_DIR            state dir (default /tmp/edgeloop-slurm)
#   EDGELOOP_SLURMRESTD_PORT      slurmrestd port (default 16820)
#   EDGELOOP_SLURM_TOKEN_LIFESPAN token lifespan in seconds (default 7 days)
#
# The last line printed is the path of a sourceable env file with
# EDGELOOP_SLURMRESTD_URL, EDGELOOP_SLURM_USER, EDGELOOP_SLURM_JWT,
# EDGELOOP_SLURM_PARTITION (and SLURM_CONF for the CLI tools).
set -euo pipefail

STATE=${EDGELOOP_SLURM_DIR:-/tmp/edgeloop-slurm}
REST_PORT=${EDGELOOP_SLURMRESTD_PORT:-16820}
CTLD_PORT=${EDGELOOP_SLURMCTLD_PORT:-16817}
SLURMD_PORT=${EDGELOOP_SLURMD_PORT:-16818}
LIFESPAN=${EDGELOOP_SLURM_TOKEN_LIFESPAN:-604800}
PARTITION=edgeloop
CONF=$STATE/slurm.conf
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SLURM_CONF=$CONF

log() { echo "slurm-up: $*" >&2; }

# --- packages ---------------------------------------------------------------
need=()
for bin in slurmctld slurmd scontrol slurmrestd munged curl; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$bin")
done
if [ ! -e /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so ] && ! ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1; then
  need+=(auth_jwt)
fi
if [ ${#need[@]} -gt 0 ]; then
  log "installing Slurm packages (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin munge curl >/dev/null
fi

# alive PIDFILE NAME: the pid in PIDFILE is running and is NAME (pid files
# outlive the processes when a machine session ends, and pids get reused).
alive() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] &&
    ! grep -qE '^State:\s+[ZX]' "/proc/$pid/status" 2>/dev/null
}

# --- config -----------------------------------------------------------------
mkdir -p "$STATE/state" "$STATE/spool" "$STATE/log"
chmod 755 "$STATE"
H=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
[ "$MEM_MB" -gt 4000 ] && MEM_MB=4000

if [ ! -s "$STATE/jwt.key" ]; then
  (umask 077 && head -c 32 /dev/urandom >"$STATE/jwt.key")
fi
chmod 600 "$STATE/jwt.key"

new_conf=$(cat <<EOF
# Written by scripts/slurm-up.sh; rewritten on every run.
ClusterName=edgeloop
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$STATE/jwt.key
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=3600
KillWait=5
SchedulerType=sched/backfill
GresTypes=gpu
NodeName=$H NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:fake:2 State=UNKNOWN
PartitionName=$PARTITION Nodes=$H Default=YES MaxTime=INFINITE State=UP
EOF
)
new_gres=$(cat <<EOF
NodeName=$H Name=gpu Type=fake File=/dev/null
NodeName=$H Name=gpu Type=fake File=/dev/zero
EOF
)

# Slurm's own OCI support (`srun --container=<bundle>`), running runc as
# root; the jobs' containers get the host network (see the bridge's
# slurm_containers.rs). Without this file `--container` is ignored.
new_oci=$(cat <<EOF
RunTimeQuery="runc --root=/run/edgeloop-slurm-runc state %n.%u.%j.%s.%t"
RunTimeKill="runc --root=/run/edgeloop-slurm-runc kill -a %n.%u.%j.%s.%t"
RunTimeDelete="runc --root=/run/edgeloop-slurm-runc delete --force %n.%u.%j.%s.%t"
RunTimeRun="runc --root=/run/edgeloop-slurm-runc run %n.%u.%j.%s.%t -b %b"
EOF
)

running_any() {
  alive "$STATE/slurmctld.pid" slurmctld || alive "$STATE/slurmd.pid" slurmd ||
    alive "$STATE/slurmrestd.pid" slurmrestd
}
if [ -f "$CONF" ] && { [ "$(cat "$CONF")" != "$new_conf" ] || [ "$(cat "$STATE/gres.conf" 2>/dev/null)" != "$new_gres" ] ||
  [ "$(cat "$STATE/oci.conf" 2>/dev/null)" != "$new_oci" ]; }; then
  if running_any; then
    log "config changed; restarting the daemons"
    "$HERE/slurm-down.sh" >&2
  fi
fi
printf '%s\n' "$new_conf" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
printf '%s\n' "$new_gres" >"$STATE/gres.conf.tmp" && mv "$STATE/gres.conf.tmp" "$STATE/gres.conf"
printf '%s\n' "$new_oci" >"$STATE/oci.conf.tmp" && mv "$STATE/oci.conf.tmp" "$STATE/oci.conf"
chmod 644 "$CONF" "$STATE/gres.conf" "$STATE/oci.conf"

# --- munge ------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
  log "creating /etc/munge/munge.key"
  mkdir -p /etc/munge
  (umask 077 && head -c 1024 /dev/urandom >/etc/munge/munge.key)
  chown munge:munge /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! alive /run/munge/munged.pid munged; then
  log "starting munged"
  rm -f /run/munge/munged.pid
  # --force: a socket left behind by a dead munged is not an error.
  su -s /bin/sh munge -c '/usr/sbin/munged --force'
fi

# --- slurmctld, slurmd ------------------------------------------------------
start() { # NAME PIDFILE CMD...: start a foreground daemon in its own session
  local name=$1 pidfile=$2
  shift 2
  log "starting $name"
  rm -f "$pidfile"
  setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
  echo $! >"$pidfile"
}
alive "$STATE/slurmctld.pid" slurmctld || start slurmctld "$STATE/slurmctld.pid" slurmctld -D -f "$CONF"
alive "$STATE/slurmd.pid" slurmd || start slurmd "$STATE/slurmd.pid" slurmd -D -f "$CONF"

deadline=$((SECONDS + 60))
while :; do
  st=$(sinfo -h -n "$H" -o '%T' 2>/dev/null || true)
  case $st in
    idle | mixed | allocated | completing) break ;;
    drained | draining | down | "down*" | "drained*" | fail | failing)
      scontrol update nodename="$H" state=resume >/dev/null 2>&1 || true ;;
  esac
  for d in slurmctld slurmd; do
    alive "$STATE/$d.pid" "$d" || {
      log "$d exited; see $STATE/log/$d.log and $STATE/log/$d.out"
      tail -n 20 "$STATE/log/$d.log" "$STATE/log/$d.out" >&2 || true
      exit 1
    }
  done
  if [ $SECONDS -ge $deadline ]; then
    log "node $H not ready (state '${st}'); see $STATE/log"
    tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
    exit 1
  fi
  sleep 0.3
done

# --- slurmrestd ---------------------------------------------------------------
if ! alive "$STATE/slurmrestd.pid" slurmrestd; then
  SLURM_JWT=daemon start slurmrestd "$STATE/slurmrestd.pid" \
    slurmrestd -f "$CONF" -a rest_auth/jwt -s openapi/v0.0.38 -u nobody -g nogroup "127.0.0.1:$REST_PORT"
fi

TOKEN=$(scontrol token username=root lifespan="$LIFESPAN" | sed -n 's/^SLURM_JWT=//p')
[ -n "$TOKEN" ] || { log "scontrol token gave no token"; exit 1; }

deadline=$((SECONDS + 30))
until [ "$(curl -s -o /dev/null -w '%{http_code}' -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $TOKEN" \
  "http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping" || true)" = 200 ]; do
  if [ $SECONDS -ge $deadline ]; then
    log "slurmrestd does not answer on 127.0.0.1:$REST_PORT; see $STATE/log/slurmrestd.out"
    tail -n 20 "$STATE/log/slurmrestd.out" >&2 || true
    exit 1
  fi
  alive "$STATE/slurmrestd.pid" slurmrestd || {
    log "slurmrestd exited; see $STATE/log/slurmrestd.out"
    tail -n 20 "$STATE/log/slurmrestd.out" >&2 || true
    exit 1
  }
  sleep 0.2
done

(
  umask 077
  cat >"$STATE/env.tmp" <<EOF
EDGELOOP_SLURMRESTD_URL=http://127.0.0.1:$REST_PORT
EDGELOOP_SLURM_USER=root
EDGELOOP_SLURM_JWT=$TOKEN
EDGELOOP_SLURM_PARTITION=$PARTITION
SLURM_CONF=$CONF
EOF
)
mv "$STATE/env.tmp" "$STATE/env"
log "ready: node $H idle, slurmrestd on 127.0.0.1:$REST_PORT"
echo "$STATE/env"
