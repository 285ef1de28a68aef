//! Boots the default test guest, loads pvsched and runs each argument as a
//! guest command, printing its output; then prints the region's slots.
//!
//! `cargo run -p pvsched-vmtest --example vmrun -- [--smp N] [--kvm] [--append KERNEL_ARGS] [--file HOST:GUEST]... [--bin HOST_BINARY]...
//! [--no-insmod] CMD...`

use std::time::Duration;

use std::path::PathBuf;

use pvsched_vmtest::{Accel, GuestImage, ImageConfig, Vm, VmConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut smp = 2;
    let mut accel = Accel::Tcg;
    let mut insmod = true;
    let mut append = String::new();
    let mut image_cfg = ImageConfig::default();
    let mut cmds = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--smp" => smp = args.next().ok_or("--smp N")?.parse()?,
            "--no-insmod" => insmod = false,
            "--kvm" => accel = Accel::Kvm,
            "--append" => append = args.next().ok_or("--append ARGS")?,
            "--file" => {
                let spec = args.next().ok_or("--file HOST:GUEST")?;
                let (host, guest) = spec.split_once(':').ok_or("--file HOST:GUEST")?;
                image_cfg
                    .files
                    .push((PathBuf::from(host), guest.to_string()));
            }
            "--bin" => image_cfg
                .binaries
                .push(PathBuf::from(args.next().ok_or("--bin PATH")?)),
            _ => cmds.push(a),
        }
    }
    let t = std::time::Instant::now();
    let image = GuestImage::build(&image_cfg)?;
    eprintln!("image: {} ({:?})", image.dir.display(), t.elapsed());
    let vm = Vm::boot(VmConfig::new(image).smp(smp).accel(accel).append(&append))?;
    eprintln!(
        "booted {} pid {} ({:?})",
        vm.name(),
        vm.qemu_pid(),
        t.elapsed()
    );
    if insmod {
        let (rc, out) = vm.insmod("")?;
        eprintln!("insmod: {rc} {out}");
    }
    for c in &cmds {
        let (rc, out) = vm.exec(c, Duration::from_secs(3000))?;
        println!("$ {c}\n{out}[exit {rc}]");
    }
    if let Some(region) = vm.region() {
        println!("{:?}", region.header());
        for slot in 0..smp {
            println!("slot {slot}: {:?}", region.read_guest(slot));
        }
    }
    Ok(())
}
