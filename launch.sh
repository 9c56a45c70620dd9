#!/usr/bin/env bash
# Wan video studio launcher for Linux and macOS.
#
#   ./launch.sh [app args...]         set up .venv when needed, then run app.py
#   ./launch.sh test [pytest args...] same, plus the test packages and a browser for the
#                                     page tests (found, or installed once), then run pytest
#
# The first run creates .venv next to this script, installs torch (the build
# that fits this machine) and requirements.txt. Later runs find a matching
# stamp file in .venv and skip pip entirely, so they start in seconds.
#
# Environment:
#   PYTHON=/path/to/python   Python (>= 3.10) used to create .venv
#   WAN_TORCH_SPEC="..."     pip arguments for torch, instead of the automatic
#                            choice, e.g. "torch==2.13.0" or
#                            "torch --index-url https://download.pytorch.org/whl/cu128"
#                            (used when .venv has no torch yet; an installed
#                            torch is kept: delete .venv to start over)
#   WAN_SKIP_INSTALL=1       never run pip; use .venv as it is
#   WAN_INSTALLER=pip        install with pip alone (by default uv, taken into .venv,
#                            installs the packages with pip's settings; pip if it fails)
#   WAN_TEST_BROWSER=PATH    the Chromium-family browser the page tests drive
#                            (default: one on this machine, else Debian's chromium
#                            through apt-get, else Playwright's own download)
#   WAN_TEST_PROMETHEUS=PATH the Prometheus server the monitoring tests start
#                            (default: one on this machine, else the prometheus
#                            package through apt-get, else Prometheus' own release)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# a blank WAN_TORCH_SPEC means "not set"
WAN_TORCH_SPEC="${WAN_TORCH_SPEC:-}"
if [[ -z "${WAN_TORCH_SPEC//[[:space:]]/}" ]]; then
    WAN_TORCH_SPEC=""
fi

MODE="run"
if [[ "${1:-}" == "test" ]]; then
    MODE="test"
    shift
fi

VENV=.venv
VPY="$VENV/bin/python"
STAMP="$VENV/.wan-install-stamp"        # requirements.txt hash + torch choice
TEST_STAMP="$VENV/.wan-test-stamp"      # the above + requirements-test.txt hash
TORCH_DEFAULT="torch==2.13.0"

# ---------------------------------------------------------------- Python ----
py_ok() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1
}

find_python() {
    local c
    for c in python3.11 python3.12 python3.10 python3; do
        # pyenv shims exist even for versions that are not active: run each one
        if command -v "$c" >/dev/null 2>&1 && py_ok "$c"; then
            printf '%s\n' "$c"
            return 0
        fi
    done
    return 1
}

if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' >/dev/null 2>&1; then
    : # existing venv works
else
    if [[ -n "${PYTHON:-}" ]]; then
        py_ok "$PYTHON" || die "PYTHON=$PYTHON is not a working Python 3.10 or newer"
        BASE_PY="$PYTHON"
    else
        BASE_PY="$(find_python)" || die "no Python 3.10 or newer found. Install Python 3.10-3.12 (or set PYTHON=/path/to/python) and run this again."
    fi
    venv_args=("$VENV")
    if [[ -e "$VENV" ]]; then
        say "existing $VENV does not work (its Python is gone?): re-creating it"
        venv_args=(--clear "$VENV")
    fi
    say "creating virtual environment $VENV with $BASE_PY ($("$BASE_PY" -c 'import sys; print(sys.version.split()[0])'))"
    "$BASE_PY" -m venv "${venv_args[@]}" \
        || die "could not create $VENV. On Debian/Ubuntu: sudo apt install python3-venv"
    rm -f "$STAMP" "$TEST_STAMP"
fi

# ------------------------------------------------------------ install -------
# uv installs what pip would, several times faster (it fetches and unpacks in parallel: 21 s against 52 s for the
# test packages on a 2-core machine). It is taken into .venv with pip, given pip's own settings (indexes, find-links,
# constraints: engine/pip_settings.py) and, should it fail or be missing, pip does the install. WAN_INSTALLER=pip: pip only.
UV=""
find_uv() {
    [[ "${WAN_INSTALLER:-}" == "pip" ]] && return 0
    if ! "$VPY" -m uv --version >/dev/null 2>&1; then
        "$VPY" -m pip install --disable-pip-version-check -q uv >/dev/null 2>&1 || return 0
    fi
    "$VPY" -m uv --version >/dev/null 2>&1 && UV="uv"
    return 0
}

pip_install() {
    local settings=() line cert="${SSL_CERT_FILE:-${PIP_CERT:-}}"
    if [[ -n "$UV" ]]; then
        while IFS= read -r line; do    # (macOS's bash 3.2 has no mapfile)
            settings+=("$line")
        done < <("$VPY" -m engine.pip_settings)
        if env ${cert:+"SSL_CERT_FILE=$cert"} "$VPY" -m uv pip install --python "$VPY" \
                --index-strategy unsafe-best-match --compile-bytecode ${settings[@]+"${settings[@]}"} "$@"; then
            return 0
        fi
        say "uv could not install that: pip installs it, and what follows (WAN_INSTALLER=pip skips uv)"
        UV=""
    fi
    "$VPY" -m pip install --disable-pip-version-check "$@"
}

hash_files() {
    "$VPY" -c 'import hashlib, sys
h = hashlib.sha256()
for name in sys.argv[1:]:
    with open(name, "rb") as f:
        h.update(name.encode() + b"\0" + f.read())
print(h.hexdigest())' "$@"
}

# Picks TORCH_SPEC (pip arguments) and TORCH_WHY (text) for this machine.
detect_torch() {
    local gpu
    if [[ "$(uname -s)" == "Darwin" ]]; then
        TORCH_SPEC="$TORCH_DEFAULT"
        TORCH_WHY="macOS: the standard build (Apple-silicon GPUs through MPS)"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
        TORCH_SPEC="$TORCH_DEFAULT"
        TORCH_WHY="NVIDIA GPU found${gpu:+ ($gpu)}: the standard Linux build carries CUDA"
    elif command -v rocminfo >/dev/null 2>&1 || [[ -d /opt/rocm ]]; then
        TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/rocm6.4"
        TORCH_WHY="AMD ROCm found (rocminfo or /opt/rocm): the ROCm 6.4 build"
    else
        TORCH_SPEC="$TORCH_DEFAULT"
        TORCH_WHY="no NVIDIA or AMD GPU found: running on the CPU"
        if [[ "$(uname -s)" == "Linux" ]]; then
            TORCH_WHY="$TORCH_WHY (tip: WAN_TORCH_SPEC=\"torch --index-url https://download.pytorch.org/whl/cpu\" gets a smaller CPU-only build)"
        fi
    fi
}

# A torch that already imports in .venv is always kept; to switch builds,
# delete .venv (WAN_TORCH_SPEC only applies to a venv without torch).
install_torch() {
    local tv spec
    if tv="$("$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -n 1)" && [[ -n "$tv" ]]; then
        say "torch $tv is already installed in $VENV: keeping it"
        if [[ -n "$WAN_TORCH_SPEC" ]]; then
            say "  WAN_TORCH_SPEC is not used while torch is installed: delete $VENV to start over with it"
        fi
        return 0
    fi
    if [[ -n "$WAN_TORCH_SPEC" ]]; then
        TORCH_SPEC="$WAN_TORCH_SPEC"
        TORCH_WHY="set by WAN_TORCH_SPEC"
    else
        detect_torch
    fi
    say "torch build: ${UV:+uv }pip install $TORCH_SPEC"
    say "  why: $TORCH_WHY"
    read -r -a spec <<<"$TORCH_SPEC"
    [[ ${#spec[@]} -gt 0 ]] || die "WAN_TORCH_SPEC is blank"
    pip_install "${spec[@]}" || die "installing torch failed (pip install $TORCH_SPEC)"
}

report_torch() {
    "$VPY" -c 'import torch
if torch.cuda.is_available():
    dev = "GPU: " + torch.cuda.get_device_name(0)
elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
    dev = "Apple MPS"
else:
    dev = "no GPU visible: CPU only"
print("[setup] torch", torch.__version__, "-", dev)' || die "torch is installed but does not import"
}

if [[ "${WAN_SKIP_INSTALL:-}" == "1" ]]; then
    say "WAN_SKIP_INSTALL=1: skipping all pip work"
else
    [[ -f requirements.txt ]] || die "requirements.txt is missing"
    torch_key="torch=${WAN_TORCH_SPEC:-auto}"
    want_rt="requirements=$(hash_files requirements.txt requirements-nodeps.txt) $torch_key"
    if [[ "$MODE" == "test" ]]; then
        [[ -f requirements-test.txt ]] || die "requirements-test.txt is missing"
        want_test="requirements=$(hash_files requirements.txt requirements-nodeps.txt requirements-test.txt) $torch_key"
    fi
    have_rt="$(cat "$STAMP" 2>/dev/null || true)"
    have_test="$(cat "$TEST_STAMP" 2>/dev/null || true)"

    if [[ "$have_rt" != "$want_rt" || ( "$MODE" == "test" && "$have_test" != "$want_test" ) ]]; then
        if [[ -z "$have_rt" ]]; then
            say "first setup: installing packages into $VENV (this takes a few minutes)"
        else
            say "requirements, test packages or torch choice changed: updating $VENV"
        fi
        find_uv
        install_torch
        if [[ "$MODE" == "test" ]]; then
            say "${UV:+uv }pip install -r requirements.txt -r requirements-test.txt"
            pip_install -r requirements.txt -r requirements-test.txt || die "pip install failed"
        else
            say "${UV:+uv }pip install -r requirements.txt"
            pip_install -r requirements.txt || die "pip install failed"
        fi
        say "${UV:+uv }pip install --no-deps -r requirements-nodeps.txt"
        pip_install --no-deps -r requirements-nodeps.txt || die "pip install failed"
        report_torch
        printf '%s\n' "$want_rt" >"$STAMP"
        if [[ "$MODE" == "test" ]]; then
            printf '%s\n' "$want_test" >"$TEST_STAMP"
        fi
        say "packages installed"
    fi
fi

# ---------------------------------------------------------------- run -------
if [[ "$MODE" == "test" ]]; then
    [[ -d tests ]] || die "no tests folder"
    # The page tests drive a real browser: the one on this machine, else one installed now (it says which).
    WAN_TEST_BROWSER="$("$VPY" -m tests.browser_setup)" \
        || die "no browser for the page tests (see the message above)"
    export WAN_TEST_BROWSER
    # The monitoring tests scrape the app with a real Prometheus: found, or installed now (it says which).
    WAN_TEST_PROMETHEUS="$("$VPY" -m tests.prometheus_setup)" \
        || die "no Prometheus for the monitoring tests (see the message above)"
    export WAN_TEST_PROMETHEUS
    set +e
    # pytest.ini names tests/ as the default; paths given here run alone.
    "$VPY" -m tests.run "$@"
    rc=$?
    set -e
    if [[ $rc -eq 5 ]]; then
        printf '[test] pytest collected no tests (exit code 5): that counts as a failure\n' >&2
    fi
    exit "$rc"
fi

[[ -f app.py ]] || die "app.py is missing"
exec "$VPY" app.py "$@"
