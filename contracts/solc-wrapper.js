#!/usr/bin/env node
// Makes solcjs (npm `solc`) look like a native `solc` to forge, which cannot download
// compilers here: forge asks `--version`, then sends `--standard-json` input on stdin with
// flags such as `--allow-paths` and `--base-path`, which solcjs does not need (forge already
// inlines every source) and are therefore accepted and ignored.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require(path.join(__dirname, "..", "node_modules", "solc"));

const args = process.argv.slice(2);
if (args.includes("--version") || args.includes("-v")) {
  // forge parses the "Version: x.y.z+commit..." line.
  process.stdout.write(
    "solc, the solidity compiler commandline interface\nVersion: " + solc.version() + "\n"
  );
  process.exit(0);
}
if (!args.includes("--standard-json")) {
  process.stderr.write("solc-wrapper: only --version and --standard-json are supported\n");
  process.exit(2);
}
let basePath = process.cwd();
const baseIdx = args.indexOf("--base-path");
if (baseIdx >= 0 && args[baseIdx + 1]) basePath = args[baseIdx + 1];

// Fallback for sources forge did not inline: read them relative to the base path.
function findImports(importPath) {
  for (const candidate of [importPath, path.join(basePath, importPath)]) {
    try {
      return { contents: fs.readFileSync(candidate, "utf8") };
    } catch (_) {
      /* try the next candidate */
    }
  }
  return { error: "File not found: " + importPath };
}

const input = fs.readFileSync(0, "utf8");
process.stdout.write(solc.compile(input, { import: findImports }));
