#!/bin/sh
# The steps of deploy/Dockerfile, in one script that also runs on a machine without a container engine
# (tests/deploy/test_image.py runs it here). POSIX sh: the slim base image has no bash guarantees.
#
#   install.sh wheel SRC OUT        build the amux-hub wheel (catalogs and migrations inside) from a source
#                                   tree into OUT; SRC is copied first, so nothing is written into it
#   install.sh venv VENV WHEEL      create a virtualenv at VENV and install the wheel (a file, or the folder
#                                   holding it) with its dependencies
#   install.sh user HOME            create the unprivileged user (AMUX_USER, uid AMUX_UID) if missing and
#                                   its state directory HOME (mode 0700): the only place amux writes
#   install.sh healthcheck [URL]    exit 0 if GET URL (default http://127.0.0.1:<AMUX_LISTEN port>/healthz)
#                                   answers 200 (the image's HEALTHCHECK; no curl in a slim image)
#
# Environment: PYTHON (default python3), AMUX_USER (default amux), AMUX_UID (default 10001);
# pip honours its usual PIP_* variables (PIP_INDEX_URL, PIP_CACHE_DIR, ...).
set -eu

PYTHON=${PYTHON:-python3}
AMUX_USER=${AMUX_USER:-amux}
AMUX_UID=${AMUX_UID:-10001}

die() { echo "install.sh: $*" >&2; exit 2; }

cmd_wheel() {
    [ $# -eq 2 ] || die "usage: install.sh wheel SRC OUT"
    src=$1 out=$2
    [ -f "$src/pyproject.toml" ] || die "$src has no pyproject.toml; pass the repository root"
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    # Only what the wheel is built from: an in-tree build would leave build/ and *.egg-info behind.
    cp "$src/pyproject.toml" "$src/README.md" "$stage/"
    for pkg in hub bot migrations; do
        cp -R "$src/$pkg" "$stage/$pkg"
    done
    find "$stage" -name __pycache__ -type d -prune -exec rm -rf {} +
    mkdir -p "$out"
    "$PYTHON" -m pip wheel --no-deps --disable-pip-version-check -q -w "$out" "$stage"
    wheel=$(ls "$out"/amux_hub-*.whl | head -n 1)
    # A wheel without its migrations or compiled catalogs would start and then fail on first use.
    "$PYTHON" - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["migrations/env.py", "migrations/versions/0001_foundation.py",
        "bot/locales/zh_Hans/LC_MESSAGES/messages.mo", "hub/cli/amux.py"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"install.sh: the wheel lacks {missing}; check [tool.setuptools.package-data] in pyproject.toml")
PY
    echo "$wheel"
}

cmd_venv() {
    [ $# -eq 2 ] || die "usage: install.sh venv VENV WHEEL"
    venv=$1 wheel=$2
    if [ -d "$wheel" ]; then
        wheel=$(ls "$wheel"/amux_hub-*.whl 2>/dev/null | head -n 1)
    fi
    [ -n "$wheel" ] && [ -f "$wheel" ] || die "no wheel at $wheel; run: install.sh wheel SRC OUT"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "$wheel"
    # pip and setuptools are not needed at run time; a smaller venv is a smaller attack surface.
    "$venv/bin/python" -m pip uninstall --disable-pip-version-check -q -y pip setuptools >/dev/null 2>&1 || true
    "$venv/bin/amux" --help >/dev/null
    echo "$venv/bin/amux"
}

cmd_user() {
    [ $# -eq 1 ] || die "usage: install.sh user HOME"
    home=$1
    if ! id -u "$AMUX_USER" >/dev/null 2>&1; then
        nologin=/usr/sbin/nologin
        [ -x "$nologin" ] || nologin=/bin/false
        if getent passwd "$AMUX_UID" >/dev/null 2>&1; then
            useradd --system --user-group --no-create-home --home-dir "$home" --shell "$nologin" "$AMUX_USER"
        else
            useradd --system --user-group --no-create-home --home-dir "$home" --shell "$nologin" \
                --uid "$AMUX_UID" "$AMUX_USER"
        fi
    fi
    mkdir -p "$home"
    chown "$AMUX_USER:$(id -gn "$AMUX_USER")" "$home"
    chmod 0700 "$home"
    echo "$AMUX_USER $(id -u "$AMUX_USER") $home"
}

cmd_healthcheck() {
    url=${1:-}
    if [ -z "$url" ]; then
        listen=${AMUX_LISTEN:-127.0.0.1:8787}
        url="http://127.0.0.1:${listen##*:}/healthz"
    fi
    exec "$PYTHON" -c 'import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=4).status == 200 else 1)' "$url"
}

[ $# -ge 1 ] || die "usage: install.sh wheel|venv|user|healthcheck ..."
sub=$1
shift
case "$sub" in
    wheel) cmd_wheel "$@" ;;
    venv) cmd_venv "$@" ;;
    user) cmd_user "$@" ;;
    healthcheck) cmd_healthcheck "$@" ;;
    *) die "unknown step $sub; use wheel, venv, user or healthcheck" ;;
esac
