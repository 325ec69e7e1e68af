//! The `sandbox-exec` helper as a small binary for the integration tests (the `conch`
//! binary of the root package is not built for this package's tests).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(conch_provider_sandbox::sandbox_exec_main(&args));
}
