//! nginx (Debian's package) in its own prefix directory in front of test
//! hosts, running the repository's `deploy/nginx/tokenwire.conf`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// An nginx master process (daemonized) in its own prefix directory,
/// stopped on drop.
pub struct Nginx {
    binary: PathBuf,
    /// Where it listens (`127.0.0.1:PORT`).
    pub addr: String,
    dir: PathBuf,
}

impl Nginx {
    fn control(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("-p")
            .arg(&self.dir)
            .arg("-c")
            .arg(self.dir.join("nginx.conf"))
            .arg("-e")
            .arg(self.dir.join("early.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.control().args(["-s", "stop"]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `deploy/nginx/tokenwire.conf` with each upstream block's example hosts
/// replaced by `hosts` and its port by `port`.
fn site_config(hosts: &[String], port: u16) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nginx/tokenwire.conf");
    let text = std::fs::read_to_string(&path).expect("deploy/nginx/tokenwire.conf");
    let mut out = String::new();
    let mut servers_written = false;
    let mut blocks = 0;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("upstream ") {
            servers_written = false;
            blocks += 1;
            out.push_str(line);
            out.push('\n');
        } else if trimmed.starts_with("server 127.0.0.1:") {
            // The example's upstream lines: ours instead, with its options.
            if !servers_written {
                let options = trimmed.split_once(' ').map_or("", |(_, rest)| rest);
                let options = options.split_once(' ').map_or(";", |(_, rest)| rest);
                for h in hosts {
                    out.push_str(&format!("    server {h} {options}\n"));
                }
                servers_written = true;
            }
        } else if trimmed == "listen 8080;" {
            out.push_str(&format!("    listen 127.0.0.1:{port};\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        servers_written && blocks == 2,
        "two upstream blocks list example hosts"
    );
    assert!(out.contains(&format!("listen 127.0.0.1:{port};")));
    out
}

/// Starts nginx in front of `hosts`. It returns once nginx listens: nginx
/// opens its listening sockets before it daemonizes, so the launching
/// process exiting with success is the event to wait for.
pub fn start_nginx(binary: &Path, hosts: &[String]) -> Nginx {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("addr").port()
    };
    let dir = std::env::temp_dir().join(format!("tokenwire-nginx-{}-{port}", std::process::id()));
    std::fs::create_dir_all(dir.join("tmp")).expect("prefix directory");
    std::fs::write(dir.join("tokenwire.conf"), site_config(hosts, port)).expect("site config");
    let d = dir.display();
    let main = format!(
        "worker_processes 1;\ndaemon on;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  \
         proxy_temp_path {d}/tmp/proxy;\n  fastcgi_temp_path {d}/tmp/fastcgi;\n  \
         uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n  \
         include {d}/tokenwire.conf;\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), main).expect("nginx.conf");
    // Workers run as an unprivileged user when the test runs as root.
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("a+rwX")
        .arg(&dir)
        .status();
    let nginx = Nginx {
        binary: binary.to_owned(),
        addr: format!("127.0.0.1:{port}"),
        dir,
    };
    let status = nginx.control().status().expect("start nginx");
    if !status.success() {
        let early = std::fs::read_to_string(nginx.dir.join("early.log")).unwrap_or_default();
        let log = std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default();
        panic!("nginx did not start ({status}):\n{early}\n{log}");
    }
    nginx
}
