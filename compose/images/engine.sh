#!/usr/bin/env bash
# Make sure a Docker engine answers, for `make test-deploy`. Best effort, like `make tools`:
#
#   1. as root with apt-get: install docker.io, docker-compose and debootstrap if missing;
#   2. no engine answering but a dockerd binary: start one in the background
#      (`dockerd $RUNWATCH_DOCKERD_ARGS`, default --storage-driver=vfs, which works on any
#      file system and under cgroup v1; log in ${TMPDIR:-/tmp}/runwatch-dockerd.log) and wait
#      up to 60 s for it.
#
# Exit 0: an engine answers (left running). Exit 75 with one line on stderr: none can
# (no root, no package, dockerd would not start): the caller skips the Docker tests.
set -uo pipefail

say() { printf 'test-deploy: %s\n' "$*" >&2; }
answers() { docker info >/dev/null 2>&1; }

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; } || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
        >"${TMPDIR:-/tmp}/runwatch-apt.log" 2>&1 || say "apt-get failed (see ${TMPDIR:-/tmp}/runwatch-apt.log)"
fi

if ! answers; then
    if ! command -v dockerd >/dev/null; then
        say "skipped: no Docker engine answers and no dockerd to start (installing docker.io needs root and apt-get)"
        exit 75
    fi
    if [ "$(id -u)" != 0 ]; then
        say "skipped: no Docker engine answers and starting dockerd needs root"
        exit 75
    fi
    log=${TMPDIR:-/tmp}/runwatch-dockerd.log
    say "starting dockerd ${RUNWATCH_DOCKERD_ARGS:---storage-driver=vfs} (log: $log)"
    # shellcheck disable=SC2086  # the arguments are words
    setsid nohup dockerd ${RUNWATCH_DOCKERD_ARGS:---storage-driver=vfs} >"$log" 2>&1 </dev/null &
    for _ in $(seq 60); do
        answers && break
        sleep 1 # polling a daemon's socket
    done
    if ! answers; then
        say "skipped: dockerd did not start: $(grep -E 'level=(error|fatal)' "$log" | tail -n 1 | cut -c1-200)"
        exit 75
    fi
fi
if ! { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; }; then
    say "skipped: a Docker engine answers but neither docker compose nor docker-compose is installed"
    exit 75
fi
if ! command -v debootstrap >/dev/null && ! docker image inspect runwatch/debian:bookworm >/dev/null 2>&1; then
    say "skipped: no debootstrap to build the base image (apt-get install debootstrap)"
    exit 75
fi
exit 0
