#!/usr/bin/env bash
# The project's test command (README: "Run the tests"). Unit, property and
# integration tests of every crate in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
