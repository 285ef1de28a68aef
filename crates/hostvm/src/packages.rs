//! What the host VM boots, as `scripts/fetch-hostvm.sh` (`make deps`) left it
//! in the cache: a Debian 13 backports cloud kernel and its modules, and the
//! QEMU that runs the host VM. Nothing here fetches: a missing piece is an
//! error naming the package and the command that fetches it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// How to fill the cache.
pub const FETCH_HINT: &str = "run `make deps` (scripts/fetch-hostvm.sh)";

/// The cache `scripts/fetch-hostvm.sh` fills: `$PVSCHED_HOSTVM_CACHE`, else
/// `<target>/pvsched-hostvm/pkgs`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PVSCHED_HOSTVM_CACHE") {
        return PathBuf::from(dir);
    }
    crate::work_dir().join("pkgs")
}

/// The kernel of the host VM: `linux-binary-<release>` and `linux-modules-<release>`.
#[derive(Clone, Debug)]
pub struct HostKernel {
    /// e.g. `7.3.4+deb13-cloud-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `usr/lib/modules/<release>/kernel` of the modules package.
    pub modules: PathBuf,
}

impl HostKernel {
    /// A module of the package (`arch/x86/kvm/kvm.ko.xz`), by its path under `kernel/`.
    pub fn module(&self, rel: &str) -> Result<PathBuf> {
        let path = self.modules.join(rel);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Missing {
                what: format!("{} (linux-modules-{})", path.display(), self.release),
                hint: FETCH_HINT.into(),
            })
        }
    }
}

/// The QEMU that runs the host VM, extracted from Debian 12 backports.
#[derive(Clone, Debug)]
pub struct HostQemu {
    /// The Debian version string, e.g. `1:10.0.2+ds-2+deb13u1~bpo12+1`.
    pub version: String,
    pub binary: PathBuf,
    /// Its firmware and option ROMs (`usr/share/qemu`).
    pub data: PathBuf,
    /// Its own module directory (`usr/lib/x86_64-linux-gnu/qemu`).
    pub modules: PathBuf,
}

/// Everything fetched.
#[derive(Clone, Debug)]
pub struct Packages {
    pub kernel: HostKernel,
    pub qemu: HostQemu,
}

fn read_stamp(path: &Path) -> Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::Missing {
            what: format!("{} ({e})", path.display()),
            hint: FETCH_HINT.into(),
        })
}

fn require(path: PathBuf, package: &str) -> Result<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: format!("{} (package {package})", path.display()),
            hint: FETCH_HINT.into(),
        })
    }
}

impl Packages {
    /// The packages in [`cache_dir`].
    pub fn locate() -> Result<Self> {
        Self::locate_in(&cache_dir())
    }

    pub fn locate_in(cache: &Path) -> Result<Self> {
        let release = read_stamp(&cache.join("kernel.stamp"))?;
        let kroot = cache.join(format!("kernel-{release}/root/usr/lib/modules/{release}"));
        let kernel = HostKernel {
            vmlinuz: require(kroot.join("vmlinuz"), &format!("linux-binary-{release}"))?,
            modules: require(kroot.join("kernel"), &format!("linux-modules-{release}"))?,
            release,
        };
        let qroot = cache.join("qemu/root");
        let version = read_stamp(&cache.join("qemu/version"))?;
        let qemu = HostQemu {
            binary: require(
                qroot.join("usr/bin/qemu-system-x86_64"),
                &format!("qemu-system-x86 {version}"),
            )?,
            data: require(
                qroot.join("usr/share/qemu"),
                &format!("qemu-system-data {version}"),
            )?,
            modules: require(
                qroot.join("usr/lib/x86_64-linux-gnu/qemu"),
                &format!("qemu-system-x86 {version}"),
            )?,
            version,
        };
        Ok(Self { kernel, qemu })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_cache_names_what_to_run() {
        let dir = std::env::temp_dir().join(format!("pvs-hostvm-empty-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();

        let err = Packages::locate_in(&dir).unwrap_err().to_string();

        assert!(
            err.contains("kernel.stamp") && err.contains("make deps"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stamp_without_its_package_names_the_package() {
        let dir = std::env::temp_dir().join(format!("pvs-hostvm-half-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("kernel.stamp"), "7.3.4+deb13-cloud-amd64\n").unwrap();

        let err = Packages::locate_in(&dir).unwrap_err().to_string();

        assert!(
            err.contains("linux-binary-7.3.4+deb13-cloud-amd64"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
