//! A TCP server process started for a benchmark.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A TCP server started for a benchmark; killed on drop.
pub struct ServerProcess {
    child: Child,
    pub socket: PathBuf,
    dir: PathBuf,
}

impl ServerProcess {
    pub fn start(extra: &[&str]) -> Result<ServerProcess, Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("tcps-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("tcps.sock");
        let child = Command::new(std::env::current_exe()?)
            .arg("server")
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err("TCP server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(ServerProcess { child, socket, dir })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // SAFETY: sending SIGTERM to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
