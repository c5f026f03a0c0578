#!/bin/sh
# Writes the seed corpus of every fuzz target into fuzz/corpus/TARGET, made
# of real traffic and the real encoders (examples/seeds.rs). Run from
# anywhere.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
cargo run --quiet --example seeds -- "$here/corpus"
