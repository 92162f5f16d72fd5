//! The local `mdl serve` that owns a repository, found safely. A command run in a served folder
//! forwards to the server its `.mdl/serve.json` names, with the token it holds, so that file
//! is followed only when it cannot have been planted by someone else (a shared run folder, an
//! unpacked archive): a regular file of this user's that no one else may read or write, naming
//! a live `mdl serve` process of this user that listens on the very address it names. Anything
//! else is ignored — the command works on the repository directly — and `-v` says why.

use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use mdl_protocol::body::Advertisement;
use mdl_store::MDL_DIR;

/// The file in `.mdl/` where `mdl serve` advertises that it owns the repository (its address
/// and a token for forwarding commands), removed when it stops.
pub const ADVERTISEMENT: &str = "serve.json";

/// The advertisement of the live `mdl serve` that owns the repository whose work directory is
/// `root`, if one does and it is to be trusted (see the module's documentation). A stale one
/// (its process is gone) is `None`, as is one distrusted, whose reason is logged.
pub fn advertised(root: &Path) -> Option<Advertisement> {
    let path = root.join(MDL_DIR).join(ADVERTISEMENT);
    match trusted(&path) {
        Ok(ad) => ad,
        Err(why) => {
            tracing::info!(
                "not following {}: {why}; working on the repository directly",
                path.display()
            );
            None
        }
    }
}

/// Whether the repository at `root` holds an advertisement whose server is gone (or one that
/// cannot be read): for a writer to remove. One of a live server is kept, trusted or not.
// Reads the file; the store removes it.
#[allow(clippy::disallowed_methods)]
pub(crate) fn stale(root: &Path) -> bool {
    let path = root.join(MDL_DIR).join(ADVERTISEMENT);
    match std::fs::read(&path) {
        Err(_) => false,
        Ok(text) => {
            serde_json::from_slice::<Advertisement>(&text).map_or(true, |ad| !process_alive(ad.pid))
        }
    }
}

/// Whether process `pid` is running (an advertisement's server, say).
pub fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The advertisement at `path` if it is to be followed: `Ok(None)` when there is none or its
/// server is gone, `Err` saying why one is not trusted.
// The file is read, never written; it is small (refused past 64 KiB).
#[allow(clippy::disallowed_methods)]
fn trusted(path: &Path) -> Result<Option<Advertisement>, String> {
    let meta = match path.symlink_metadata() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
        Ok(m) => m,
    };
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    let me = my_uid()?;
    if meta.uid() != me {
        return Err(format!("owned by user {}, not by you ({me})", meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {mode:o}: others may read or write it (mdl serve writes it 600)"
        ));
    }
    if meta.len() > 64 << 10 {
        return Err("too large".into());
    }
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let ad: Advertisement = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if !process_alive(ad.pid) {
        return Ok(None);
    }
    let proc = Path::new("/proc").join(ad.pid.to_string());
    let owner = std::fs::metadata(&proc).map_err(|e| e.to_string())?.uid();
    if owner != me {
        return Err(format!("its process {} is user {owner}'s", ad.pid));
    }
    let cmdline = std::fs::read(proc.join("cmdline")).map_err(|e| e.to_string())?;
    if !cmdline.split(|&b| b == 0).any(|arg| arg == b"serve") {
        return Err(format!("its process {} is not mdl serve", ad.pid));
    }
    let (ip, port) = address(&ad.url).ok_or_else(|| {
        format!(
            "its URL {:?} is not http://ADDRESS:PORT/NAME with an address of this machine",
            ad.url
        )
    })?;
    if !listens(ad.pid, ip, port) {
        return Err(format!(
            "its process {} does not listen on {}",
            ad.pid, ad.url
        ));
    }
    Ok(Some(ad))
}

/// This process's user: the owner of its own `/proc` entry.
fn my_uid() -> Result<u32, String> {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| format!("cannot tell who you are: {e}"))
}

/// The address and port of a URL `http://ADDRESS:PORT/NAME` whose address is written as an IP
/// address (a name could resolve to another machine).
fn address(url: &str) -> Option<(IpAddr, u16)> {
    let rest = url.strip_prefix("http://")?;
    let (host, _) = rest.split_once('/')?;
    let (ip, port) = host.rsplit_once(':')?;
    let ip = ip
        .strip_prefix('[')
        .and_then(|i| i.strip_suffix(']'))
        .unwrap_or(ip);
    Some((ip.parse().ok()?, port.parse().ok()?))
}

/// Whether process `pid` holds a socket listening on `port` that a connection to `ip` reaches:
/// bound to `ip` itself, or to every address when `ip` is a loopback one.
// Reads the kernel's socket tables and the process's descriptors; writes nothing.
#[allow(clippy::disallowed_methods)]
fn listens(pid: u32, ip: IpAddr, port: u16) -> bool {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl, local address, remote address, state, …, inode (the tenth column).
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            if *state != "0A" {
                continue;
            }
            let Some((bound, at)) = socket_address(local) else {
                continue;
            };
            let reaches = bound == ip || (bound.is_unspecified() && ip.is_loopback());
            if at == port && reaches {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// A socket table's local address (`0100007F:1F90`: the address as the kernel's native words
/// in hex, then the port).
fn socket_address(text: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for word in addr.as_bytes().chunks(8) {
        let word = u32::from_str_radix(std::str::from_utf8(word).ok()?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_urls_and_socket_tables() {
        assert_eq!(
            address("http://127.0.0.1:8080/run"),
            Some(("127.0.0.1".parse().unwrap(), 8080))
        );
        assert_eq!(
            address("http://[::1]:80/run"),
            Some(("::1".parse().unwrap(), 80))
        );
        assert_eq!(address("http://localhost:80/run"), None);
        assert_eq!(address("http://evil.example:80/run"), None);
        if cfg!(target_endian = "little") {
            assert_eq!(
                socket_address("0100007F:1F90"),
                Some(("127.0.0.1".parse().unwrap(), 8080))
            );
            assert_eq!(
                socket_address("00000000000000000000000001000000:0050"),
                Some(("::1".parse().unwrap(), 80))
            );
        }
    }

    #[test]
    fn this_process_listening_is_seen() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        assert!(listens(me, "127.0.0.1".parse().unwrap(), port));
        assert!(!listens(me, "127.0.0.2".parse().unwrap(), port));
        drop(listener);
        assert!(!listens(me, "127.0.0.1".parse().unwrap(), port));
    }
}
