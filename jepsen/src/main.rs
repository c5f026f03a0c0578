//! `ringraft-jepsen`: the harness's command line (being written).

fn main() {
    eprintln!("ringraft-jepsen: not built yet");
    std::process::exit(2);
}
