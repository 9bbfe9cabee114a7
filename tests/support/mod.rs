//! Shared support for the integration tests that talk to real servers.
pub mod cluster;
pub mod etcd;
pub mod resp;
pub mod rounds;
pub mod sentinel;

/// Whether `binary` runs (`binary --version`). Without it a test skips and says so, except
/// under `CI=true`, where a missing server is a failure; `install` names what installs it.
pub fn have_server(binary: &str, install: &str) -> bool {
    let found = std::process::Command::new(binary)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{binary} is missing ({install} installs it)");
        }
        eprintln!("SKIP: {binary} not installed ({install} installs it)");
    }
    found
}
