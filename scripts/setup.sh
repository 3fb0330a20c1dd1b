#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine: GL libraries for headless MuJoCo, then .venv with
# pytest-gap and its pinned LIBERO. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# chromium + chromium-driver: the browser tests of `gap viz` (tests/test_viz_browser.py), which
# skip, saying so, where they are missing. Debian's build: selenium must not fetch one of its own.
if ! dpkg -s libosmesa6 libegl1 libegl-mesa0 chromium chromium-driver >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libosmesa6 libegl1 libegl-mesa0 >/dev/null
  $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "setup: chromium not installed; the gap viz browser tests will be skipped" >&2
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev,torch]"
# Interop tests talk to PyPI openpi-client. It pins numpy<2 without needing it: install it alone.
.venv/bin/python -m pip install -q --no-deps "openpi-client==0.1.2"
