//! The host's disks, for I/O limits: a cgroup's I/O throttle is written per block device,
//! as `major:minor`, and the kernel takes it on whole disks only.
//!
//! Every disk of the host is limited alike, not only the one holding the image: a
//! sandbox reads the image, and whatever `--mount` or a function's `mounts` bind in, from
//! wherever those live. Loop, RAM and zram devices are left out (their I/O is memory, or
//! reaches a disk of its own that is limited already).

use std::sync::OnceLock;

/// `major:minor` of each whole disk in `/sys/block`, read once.
pub fn disks() -> &'static [String] {
    static DISKS: OnceLock<Vec<String>> = OnceLock::new();
    DISKS.get_or_init(|| {
        let Ok(dir) = std::fs::read_dir("/sys/block") else {
            return Vec::new();
        };
        let mut out: Vec<String> = dir
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if is_virtual(&name) {
                    return None;
                }
                let dev = std::fs::read_to_string(e.path().join("dev")).ok()?;
                let dev = dev.trim();
                valid_dev(dev).then(|| dev.to_string())
            })
            .collect();
        out.sort();
        out
    })
}

fn is_virtual(name: &str) -> bool {
    ["loop", "ram", "zram"].iter().any(|p| name.starts_with(p))
}

/// `major:minor`, two decimal numbers.
fn valid_dev(s: &str) -> bool {
    let Some((a, b)) = s.split_once(':') else {
        return false;
    };
    [a, b]
        .iter()
        .all(|n| !n.is_empty() && n.len() <= 10 && n.bytes().all(|c| c.is_ascii_digit()))
}

/// The weight (v1 BFQ and v2 `io.weight`, 1 to 1000, default 100) that follows the CPU
/// bandwidth, as the CPU weight does.
pub fn weight(cpu_millis: u32) -> u64 {
    (u64::from(cpu_millis) * 100 / 1000).clamp(1, 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_names() {
        assert!(valid_dev("254:0"));
        assert!(!valid_dev("254"));
        assert!(!valid_dev("254:x"));
        assert!(!valid_dev(":0"));
        assert!(is_virtual("loop3") && is_virtual("zram0") && is_virtual("ram1"));
        assert!(!is_virtual("vda") && !is_virtual("nvme0n1") && !is_virtual("dm-0"));
        assert_eq!(weight(1000), 100);
        assert_eq!(weight(10), 1);
        assert_eq!(weight(50_000), 1000);
        // Whatever this host has, each entry is a device number.
        assert!(disks().iter().all(|d| valid_dev(d)));
    }
}
