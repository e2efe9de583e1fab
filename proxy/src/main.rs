//! The `proxy` binary: see `proxy --help`.

fn main() -> std::process::ExitCode {
    proxy::main()
}
