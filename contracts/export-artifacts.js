#!/usr/bin/env node
// Writes the ABI and bytecode Python uses (sapo_async/ledger/artifacts/<Name>.json) from forge's
// build output, stamped with `sourceHash`: sha256 over foundry.toml and every contracts/src/*.sol
// (each as "<relative path>\0<content>\0", sorted by path). tests/unit/test_ledger_artifacts.py
// recomputes the hash and fails when the artifacts are stale.
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const path = require("path");

const here = __dirname;
const outDir = path.join(here, "..", "sapo_async", "ledger", "artifacts");
const contracts = ["SapoLedger", "NaiveLedger"];

function sourceHash() {
  const files = ["foundry.toml"].concat(
    fs.readdirSync(path.join(here, "src")).filter((f) => f.endsWith(".sol")).map((f) => "src/" + f)
  );
  files.sort();
  const h = crypto.createHash("sha256");
  for (const f of files) {
    h.update(f + "\0");
    h.update(fs.readFileSync(path.join(here, f)));
    h.update("\0");
  }
  return h.digest("hex");
}

const hash = sourceHash();
const ozVersion = require(path.join(here, "..", "node_modules", "@openzeppelin", "contracts", "package.json")).version;
fs.mkdirSync(outDir, { recursive: true });
for (const name of contracts) {
  const built = JSON.parse(fs.readFileSync(path.join(here, "out", name + ".sol", name + ".json"), "utf8"));
  const artifact = {
    contractName: name,
    sourceHash: hash,
    compiler: built.metadata ? built.metadata.compiler.version : "unknown",
    openzeppelin: ozVersion,
    abi: built.abi,
    bytecode: built.bytecode.object,
  };
  fs.writeFileSync(path.join(outDir, name + ".json"), JSON.stringify(artifact, null, 1) + "\n");
  console.log("artifact: " + name + " (" + (built.bytecode.object.length / 2 - 1) + " bytes)");
}
