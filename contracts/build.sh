#!/usr/bin/env bash
# Compile the ledger contracts with solcjs (npm `solc`, through solc-wrapper.js because forge
# cannot download compilers here), run the forge tests offline (unit, fuzz >= 256 runs,
# invariants), then refresh the ABI + bytecode Python loads (sapo_async/ledger/artifacts/).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x ../node_modules/.bin/forge ]; then
  (cd .. && npm ci --no-audit --no-fund --loglevel=error)
fi
FORGE=(../node_modules/.bin/forge)
SOLC=(--offline --use ./solc-wrapper.js)
"${FORGE[@]}" build "${SOLC[@]}" --sizes
"${FORGE[@]}" test "${SOLC[@]}" "$@"
node export-artifacts.js
