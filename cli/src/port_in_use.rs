//! A port that cannot be bound, said as what to do: which flag chooses another and, where this
//! machine's `/proc` tells, which process holds it (on one machine, often an earlier cluster
//! still running).

use std::net::SocketAddr;

/// `error` of binding `address` (chosen by `flag`) to do `what` ("listen on", "serve metrics
/// on"), with the port, the flag and the process holding it named when it is in use.
pub fn bind_error(
    what: &str,
    address: SocketAddr,
    flag: &str,
    error: std::io::Error,
) -> anyhow::Error {
    if error.kind() != std::io::ErrorKind::AddrInUse {
        return anyhow::anyhow!("cannot {what} {address} ({flag}): {error}");
    }
    let port = address.port();
    let holder = match listener_of(port) {
        Some(process) => format!(" by {process}"),
        None => String::new(),
    };
    anyhow::anyhow!(
        "cannot {what} {address}: port {port} is already in use{holder}; stop that process or \
         choose another address with {flag} (`ss -ltnp 'sport = :{port}'` shows who listens)"
    )
}

/// The process listening on TCP `port`, as `name (pid N)`, when `/proc` shows it.
fn listener_of(port: u16) -> Option<String> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let sockets: Vec<String> = inodes
        .iter()
        .map(|inode| format!("socket:[{inode}]"))
        .collect();
    for process in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| {
                sockets
                    .iter()
                    .any(|socket| target.as_os_str() == socket.as_str())
            })
        });
        if holds {
            let name = std::fs::read_to_string(process.path().join("comm")).unwrap_or_default();
            return Some(format!("`{}` (pid {pid})", name.trim()));
        }
    }
    None
}

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` table.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit_once(':')?.1;
            let listening = *fields.get(3)? == LISTEN;
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| fields.get(9).map(|inode| (*inode).to_owned()))
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_is_named_with_its_flag_and_this_process_as_its_holder() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = held.local_addr().unwrap();
        let error = std::net::TcpListener::bind(address).unwrap_err();
        let text = bind_error("listen on", address, "--listen", error).to_string();
        let port = address.port();
        assert!(
            text.contains(&format!("port {port} is already in use")),
            "{text}"
        );
        assert!(text.contains("--listen"), "{text}");
        assert!(
            text.contains(&format!("(pid {})", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn only_listening_sockets_of_the_port_are_read_from_the_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:C383 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n   \
             1: 0100007F:C383 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n   \
             2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1\n";
        assert_eq!(listening_inodes(table, 0xC383), vec!["111".to_owned()]);
        assert_eq!(listening_inodes(table, 8080), vec!["333".to_owned()]);
    }
}
