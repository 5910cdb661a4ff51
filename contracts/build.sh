#!/usr/bin/env bash
# Placeholder until the ledger lands: there are no contracts yet.
echo "contracts: none yet"
