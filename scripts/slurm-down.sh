#!/usr/bin/env bash
# Stops what scripts/slurm-up.sh started: slurmrestd, slurmctld, slurmd, munged.
# Safe to run when nothing runs. Keeps the state dir (config, saved cluster
# state, logs); pass --wipe to remove it too.
set -euo pipefail

STATE=${EDGELOOP_SLURM_DIR:-/tmp/edgeloop-slurm}
CONF=$STATE/slurm.conf
export SLURM_CONF=$CONF

log() { echo "slurm-down: $*" >&2; }

# pid_of PIDFILE NAME: prints the pid when it is alive and really NAME.
pid_of() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] &&
    ! grep -qE '^State:\s+[ZX]' "/proc/$pid/status" 2>/dev/null && echo "$pid"
}

# gone PID: the process has exited (a zombie that nobody reaped counts).
gone() {
  [ ! -d "/proc/$1" ] || grep -qE '^State:\s+[ZX]' "/proc/$1/status" 2>/dev/null
}

# stop PIDFILE NAME: TERM, wait up to 10 s, then KILL.
stop() {
  local pid i
  if pid=$(pid_of "$1" "$2"); then
    log "stopping $2 ($pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      gone "$pid" && break
      sleep 0.2
    done
    if ! gone "$pid"; then
      log "$2 ($pid) ignored TERM; killing"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$1"
}

stop "$STATE/slurmrestd.pid" slurmrestd
# Ask the controller to stop itself and the slurmd daemons; then make sure.
if pid_of "$STATE/slurmctld.pid" slurmctld >/dev/null && command -v scontrol >/dev/null 2>&1; then
  scontrol shutdown >/dev/null 2>&1 || true
fi
stop "$STATE/slurmctld.pid" slurmctld
stop "$STATE/slurmd.pid" slurmd
stop /run/munge/munged.pid munged

if [ "${1:-}" = "--wipe" ]; then
  log "removing $STATE"
  rm -rf "$STATE"
fi
log "stopped"
