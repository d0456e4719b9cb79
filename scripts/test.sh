#!/usr/bin/env bash
# Install (scripts/install.sh) and run the whole test suite on CPU. GPU tests skip without CUDA.
# Headless Chromium (Debian's `chromium`) renders the HTML report in tests/report/test_report_html.py;
# it is installed here when apt-get can, otherwise that one test skips and says why.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "scripts/test.sh: chromium could not be installed; the browser test will skip"
fi
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$@"
