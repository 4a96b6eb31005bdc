#!/usr/bin/env bash
# Build runwatch's images locally, from Debian's package mirror only (no image registry):
#
#   runwatch/debian:bookworm    debootstrap --variant=minbase, brought in with `docker import`
#   runwatch/kafka:local        Debian's JRE + the Maven-assembled Kafka jars of the embedded
#                               broker (~/.runwatch/kafka/<version>/libs) + compose/images/kafka
#   runwatch:local              Debian's python3 + runwatch (compose/Dockerfile)
#   runwatch/prometheus:local   Debian's prometheus package
#
#   compose/images/build.sh [base|kafka|runwatch|prometheus|all]...   (default: all)
#
# Idempotent and cached: every image carries a label with the sha256 of its inputs (the
# build context, the Dockerfile, the base image's id); an image whose label matches is not
# rebuilt, so a second run takes a few seconds. The debootstrap tarball and its .debs are kept
# in $RUNWATCH_IMAGE_CACHE (default ~/.cache/runwatch/images) and survive `docker rmi`.
#
# Needs: a Docker engine, root for debootstrap (first build of the base only), the Kafka jars
# (fetched with Maven through `$PYTHON -c 'from runwatch.broker import ensure_jars; ...'` when
# missing). Environment: PYTHON (default python3, with runwatch importable),
# RUNWATCH_DEBIAN_MIRROR (default http://deb.debian.org/debian), RUNWATCH_EXTRAS (sinks).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$repo/compose/images
cache=${RUNWATCH_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/images}
mirror=${RUNWATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
python=${PYTHON:-python3}
extras=${RUNWATCH_EXTRAS:-sinks}
export DOCKER_BUILDKIT=0 # the classic builder: BuildKit would fetch its frontend from a registry

BASE=runwatch/debian:$suite
KAFKA=runwatch/kafka:local
RUNWATCH=runwatch:local
PROMETHEUS=runwatch/prometheus:local
LABEL=dev.runwatch.inputs
# What of the repository goes into runwatch:local (under src/ in its context): pyproject's
# packages (tests/unit/compose checks the list), the examples, the files pip needs.
PROJECT_PATHS=(pyproject.toml README.md common schemas producers processors controller sinks runwatch examples)

say() { printf 'images: %s\n' "$*" >&2; }

inputs_of() { # the inputs label of an image; empty when the image does not exist
    docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true
}

image_id() { docker image inspect -f '{{ .Id }}' "$1"; }

# A deterministic tar of paths under a directory (same files -> same bytes -> same hash).
det_tar() { # det_tar DIR OUT PATH...
    local dir=$1 out=$2
    shift 2
    tar -C "$dir" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        --exclude=__pycache__ --exclude='*.pyc' --exclude='examples/*/runs' \
        --exclude='examples/*/checkpoints' -cf "$out" "$@"
}

build_base() {
    local key tarball rootfs
    key=$(printf 'debootstrap minbase %s %s v2\n' "$suite" "$mirror" | sha256sum | cut -c1-64)
    if [ "$(inputs_of "$BASE")" = "$key" ]; then
        say "$BASE is up to date"
        return
    fi
    tarball=$cache/debian-$suite-minbase-${key:0:12}.tar
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || {
            say "no debootstrap: apt-get install debootstrap"
            exit 1
        }
        mkdir -p "$cache/debs"
        rootfs=$(mktemp -d "${TMPDIR:-/tmp}/runwatch-rootfs.XXXXXX")
        say "debootstrap $suite from $mirror (once; cached in $cache)"
        debootstrap --variant=minbase --cache-dir="$cache/debs" "$suite" "$rootfs" "$mirror" \
            >"$cache/debootstrap.log" 2>&1 || {
            tail -n 5 "$cache/debootstrap.log" >&2
            rm -rf "$rootfs"
            exit 1
        }
        cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb ${mirror%/debian}/debian-security $suite-security main
EOF
        # No daemon starts inside a build (prometheus' postinst would try), no recommends.
        printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
        chmod 755 "$rootfs/usr/sbin/policy-rc.d"
        printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
            >"$rootfs/etc/apt/apt.conf.d/90runwatch"
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        chmod 755 "$rootfs" # the root of the image (mktemp made it 0700)
        tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
    fi
    say "docker import $tarball -> $BASE"
    docker import --change "LABEL $LABEL=$key" --change 'CMD ["/bin/bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$tarball" "$BASE" >/dev/null
}

# build_image TAG CONTEXT_TAR DOCKERFILE [BUILD-ARG...]: docker build unless the label matches.
build_image() {
    local tag=$1 context=$2 dockerfile=$3 key
    shift 3
    key=$( { image_id "$BASE"; sha256sum <"$context"; printf '%s\n' "$dockerfile" "$@"; } \
        | sha256sum | cut -c1-64)
    if [ "$(inputs_of "$tag")" = "$key" ]; then
        say "$tag is up to date"
        return
    fi
    say "docker build $tag"
    local args=()
    for a in "$@"; do args+=(--build-arg "$a"); done
    # --network host: apt and pip reach Debian's mirror and the package index from the host.
    docker build --network host --label "$LABEL=$key" -f "$dockerfile" -t "$tag" \
        --build-arg "BASE_IMAGE=$BASE" "${args[@]}" - <"$context" >"$cache/logs/${tag//[\/:]/_}.log" 2>&1 || {
        tail -n 20 "$cache/logs/${tag//[\/:]/_}.log" >&2
        say "building $tag failed (tail above; the whole log: $work/build-${tag//[\/:]/_}.log)"
        exit 1
    }
}

build_kafka() {
    local libs ctx
    libs=$("$python" -c 'from runwatch.broker import ensure_jars; print(ensure_jars())')
    ctx=$work/kafka
    mkdir -p "$ctx/opt/libs"
    cp -a "$here/kafka/Dockerfile" "$ctx/"
    cp -a "$here/kafka/opt/bin" "$here/kafka/opt/config" "$ctx/opt/"
    cp -a "$libs"/*.jar "$ctx/opt/libs/"
    det_tar "$ctx" "$work/kafka.tar" Dockerfile opt
    build_image "$KAFKA" "$work/kafka.tar" Dockerfile
}

# The dependencies' wheels, made with the host's pip (its index, proxy and certificates) at
# the versions the tests ran (constraints.txt): cached in $cache/wheels per requirements list
# and constraints, so only a changed list downloads again.
wheelhouse() { # wheelhouse OUT_DIR
    local out=$1 req key cons=$repo/constraints.txt
    req=$("$python" - "$repo/pyproject.toml" "$extras" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = [e for e in sys.argv[2].split(",") if e]
deps = project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]
print("\n".join(["setuptools>=68", "wheel", *deps]))
PY
)
    key=$({ printf '%s\n' "$req"; cat "$cons"; } | sha256sum | cut -c1-12)
    if [ ! -f "$cache/wheels/$key/requirements.txt" ]; then
        say "pip wheel the dependencies ($extras) into $cache/wheels/$key"
        rm -rf "$cache/wheels/$key.tmp"
        mkdir -p "$cache/wheels/$key.tmp"
        printf '%s\n' "$req" >"$cache/wheels/$key.tmp/requirements.in"
        "$python" -m pip wheel -q -w "$cache/wheels/$key.tmp" -r "$cache/wheels/$key.tmp/requirements.in" -c "$cons" \
            >"$cache/logs/wheels.log" 2>&1 || {
            tail -n 10 "$cache/logs/wheels.log" >&2
            exit 1
        }
        mv "$cache/wheels/$key.tmp/requirements.in" "$cache/wheels/$key.tmp/requirements.txt"
        rm -rf "$cache/wheels/$key"
        mv "$cache/wheels/$key.tmp" "$cache/wheels/$key"
    fi
    cp -a "$cache/wheels/$key" "$out"
}

build_runwatch() {
    local ctx=$work/runwatch
    mkdir -p "$ctx/compose" "$ctx/src"
    wheelhouse "$ctx/wheels"
    cp "$repo/compose/Dockerfile" "$ctx/compose/"
    (cd "$repo" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - "${PROJECT_PATHS[@]}") \
        | tar -C "$ctx/src" -xf -
    det_tar "$ctx" "$work/runwatch.tar" .
    build_image "$RUNWATCH" "$work/runwatch.tar" compose/Dockerfile "RUNWATCH_EXTRAS=$extras"
}

build_prometheus() {
    det_tar "$here/prometheus" "$work/prometheus.tar" Dockerfile
    build_image "$PROMETHEUS" "$work/prometheus.tar" Dockerfile
}

docker info >/dev/null 2>&1 || {
    say "no Docker engine answers (start dockerd, or run make test-deploy as root)"
    exit 1
}
mkdir -p "$cache/logs"
work=$(mktemp -d "${TMPDIR:-/tmp}/runwatch-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(all)
for t in "${targets[@]}"; do
    case $t in
        base) build_base ;;
        kafka) build_base && build_kafka ;;
        runwatch) build_base && build_runwatch ;;
        prometheus) build_base && build_prometheus ;;
        all) build_base && build_kafka && build_runwatch && build_prometheus ;;
        *)
            say "unknown image '$t' (base, kafka, runwatch, prometheus, all)"
            exit 2
            ;;
    esac
done
