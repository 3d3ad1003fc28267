#!/usr/bin/env bash
# Starts a PostgreSQL 15 server on 127.0.0.1 for the control plane's
# PostgreSQL store backend and its tests (store/src/pg/,
# the store tests and the integration tests that run on both backends).
#
#   scripts/postgres-up.sh     # start (or find running) and print the env file
#   scripts/postgres-down.sh   # stop it
#
# Packages: Debian's `postgresql` (15 on Debian 12), installed with apt-get
#        only when /usr/lib/postgresql/15/bin/postgres is missing.
# State: ${EDGELOOP_PG_DIR:-/tmp/edgeloop-pg}: the cluster (`data/`), its
#        socket dir, the server log, the superuser's password (`password`,
#        made once) and `env`, which holds
#        EDGELOOP_TEST_POSTGRES_URL=postgres://edgeloop:PASSWORD@127.0.0.1:PORT/postgres
#        and EDGELOOP_TEST_POSTGRES_CA, the CA certificate of the server's TLS
#        certificate (`tls/`, made once with the openssl command-line tool,
#        which Debian's postgresql package depends on; the control plane
#        itself links no OpenSSL). The path of `env` is printed on the last line.
# TLS:   on, for clients that ask (`sslmode=require&sslrootcert=$EDGELOOP_TEST_POSTGRES_CA`);
#        the certificate names localhost and 127.0.0.1. A server found
#        running without TLS (started by an older version of this script)
#        is restarted with it.
# Port:  ${EDGELOOP_PG_PORT:-55432}, on 127.0.0.1 only, password auth
#        (scram-sha-256) for TCP; the superuser `edgeloop` may create the
#        per-test databases (`edgeloop_t_<random>`).
#
# We run as root, and PostgreSQL refuses to run as root: the cluster belongs
# to the `postgres` user that the Debian package creates (made here when
# missing), and every server command runs as that user.
#
# Idempotent: when the server already accepts connections on the port,
# nothing is started; a dead server's stale pid file is cleared by pg_ctl.
set -euo pipefail

state="${EDGELOOP_PG_DIR:-/tmp/edgeloop-pg}"
port="${EDGELOOP_PG_PORT:-55432}"
bin=/usr/lib/postgresql/15/bin
data="$state/data"
env_file="$state/env"
user=postgres

log() { echo "postgres-up: $*" >&2; }

# --- packages ----------------------------------------------------------------
if [ ! -x "$bin/postgres" ]; then
  log "installing Debian's postgresql (15)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
fi
if ! id "$user" >/dev/null 2>&1; then
  useradd --system --home-dir "$state" --shell /usr/sbin/nologin "$user"
fi

as_pg() { runuser -u "$user" -- "$@"; }

mkdir -p "$state"
chown "$user" "$state"
chmod 755 "$state"

# --- password (made once; the cluster was initialised with it) ---------------
if [ ! -s "$state/password" ]; then
  head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$state/password.tmp"
  mv "$state/password.tmp" "$state/password"
fi
# Readable by the server user (initdb) and root only.
chown "$user" "$state/password"
chmod 600 "$state/password"
password="$(cat "$state/password")"
url="postgres://edgeloop:$password@127.0.0.1:$port/postgres"

tls="$state/tls"
write_env() {
  printf 'EDGELOOP_TEST_POSTGRES_URL=%s\nEDGELOOP_TEST_POSTGRES_CA=%s\n' "$url" "$tls/ca.pem" >"$env_file.tmp"
  mv "$env_file.tmp" "$env_file"
}

# --- TLS certificate (made once: a CA, and a server certificate it signs) ----
if [ ! -s "$tls/server.crt" ]; then
  command -v openssl >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends openssl >/dev/null
  }
  log "making a test CA and server certificate in $tls"
  rm -rf "$tls.tmp" && mkdir -p "$tls.tmp"
  (
    cd "$tls.tmp"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=edgeloop test PostgreSQL CA" -keyout ca.key -out ca.pem \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.crt 2>/dev/null
    rm -f server.csr server.ext ca.srl ca.key
  )
  mv "$tls.tmp" "$tls"
fi
# The server refuses a key that others may read.
chown -R "$user" "$tls"
chmod 600 "$tls/server.key"
chmod 644 "$tls/ca.pem" "$tls/server.crt"

ready() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" >/dev/null 2>&1; }

# --- cluster -----------------------------------------------------------------
if [ ! -s "$data/PG_VERSION" ]; then
  log "initialising a cluster in $data"
  rm -rf "$data"
  as_pg mkdir -p "$data"
  as_pg "$bin/initdb" -D "$data" -U edgeloop --pwfile="$state/password" \
    --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$state/initdb.log" 2>&1 || {
      cat "$state/initdb.log" >&2
      exit 1
    }
fi

# --- server ------------------------------------------------------------------
ssl_on() {
  PGPASSWORD="$password" "$bin/psql" -h 127.0.0.1 -p "$port" -U edgeloop -d postgres -tAc 'SHOW ssl' 2>/dev/null | grep -qx on
}
if ready && ! ssl_on && [ -s "$data/postmaster.pid" ]; then
  log "running without TLS: restarting it with TLS"
  as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >&2 || true
fi
if ready; then
  log "already accepting connections on 127.0.0.1:$port"
  write_env
  echo "$env_file"
  exit 0
fi

if ss -ltnH "sport = :$port" 2>/dev/null | grep -q .; then
  log "port $port is taken by another process; set EDGELOOP_PG_PORT"
  exit 1
fi

rm -f "$env_file"
log "starting PostgreSQL 15 on 127.0.0.1:$port"
# The socket lives in the state dir: /var/run/postgresql may not exist, and
# another cluster on the machine may use it.
if ! as_pg "$bin/pg_ctl" -D "$data" -l "$state/server.log" -w -t 60 start \
  -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$state -c max_connections=300 -c fsync=on -c ssl=on -c ssl_cert_file=$tls/server.crt -c ssl_key_file=$tls/server.key" >&2; then
  tail -n 30 "$state/server.log" >&2 || true
  log "pg_ctl start failed (log: $state/server.log)"
  exit 1
fi
until ready; do sleep 0.2; done
log "up"

write_env
echo "$env_file"
