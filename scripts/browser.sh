#!/usr/bin/env bash
# The headless browser of the ui test (tests/ui.rs): Debian's Chromium and its ChromeDriver
# (packages chromium, chromium-driver), installed when missing. Prints the line the test
# command evaluates: `export ZFLOW_CHROMEDRIVER=...`.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if ! command -v chromedriver >/dev/null || ! command -v chromium >/dev/null; then
  echo "browser: installing Debian's chromium and chromium-driver (the ui test's browser)" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null
fi
echo "export ZFLOW_CHROMEDRIVER=$(command -v chromedriver)"
