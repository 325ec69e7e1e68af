//! The `conch` binary: the command line of [`conch::cli`] with the built-in plugins.

fn main() -> std::process::ExitCode {
    conch::cli::main()
}
