#!/bin/sh
# Writes the seed corpus of every fuzz target into wal/fuzz/corpus/TARGET,
# made by the wal's own encoder (examples/seeds.rs). Run from anywhere.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
cargo run --quiet --example seeds -- "$here/corpus"
cargo run --quiet --example segment_seeds -- "$here/corpus/segments"
