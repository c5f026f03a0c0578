//! End-to-end tests: real `ringraft serve` processes on loopback (tcp
//! fabric), driven through the `ringraft` command-line client, with kill -9,
//! SIGSTOP/SIGCONT, restarts and hostile input.
//!
//! One test binary (`cargo test -p ringraft-cli --test e2e`), one module per
//! subject; the shared harness is `harness.rs`.

mod bad_input;
mod faults;
mod harness;
mod log;
mod slowloris;
mod tls;
mod tools;
