//! `#[repr(C)]` mirrors of the structs and `#define`s in `abi/pvsched_abi.h`.
//!
//! Plain data: these are the copies a reader takes, and the byte images test
//! vectors hold. Live access to a mapped region goes through [`crate::Region`].

/// `"PVSCHED\0"` read as a little-endian 64-bit word.
pub const MAGIC: u64 = 0x0044_4548_4353_5650;
pub const ABI_MAJOR: u16 = 1;
pub const ABI_MINOR: u16 = 3;

pub const CACHELINE: usize = 64;
pub const HEADER_SIZE: usize = 128;
pub const SLOT_SIZE: usize = 256;
/// Upper bound a reader accepts, whatever the header says.
pub const MAX_SLOTS: u32 = 4096;
/// Bounded retries of a seqcount read before giving up.
pub const READ_RETRIES: u32 = 16;

pub const F_HOST_HALF: u64 = 1 << 0;
pub const F_PENDING_HINT: u64 = 1 << 1;
pub const F_BOOST_REQUEST: u64 = 1 << 2;
/// Since minor 1: the host half carries idle hints (`wake_p50_ns`, `wake_p99_ns`).
pub const F_IDLE_HINTS: u64 = 1 << 3;
/// Since minor 2: the host listens on an ivshmem-doorbell vector; `Header::doorbell` is
/// the Doorbell register value that rings it. The guest rings when it clears the reason
/// for a boost in force.
pub const F_DOORBELL: u64 = 1 << 4;
/// Since minor 3: the guest publishes lock waits (`GuestHalf::lock_holder`,
/// `lock_flags`, the lock counters).
pub const F_LOCK_WAIT: u64 = 1 << 5;
pub const F_ALL: u64 =
    F_HOST_HALF | F_PENDING_HINT | F_BOOST_REQUEST | F_IDLE_HINTS | F_DOORBELL | F_LOCK_WAIT;

/// ivshmem's Doorbell register (BAR0 offset); its value is `peer ID << 16 | vector`.
pub const IVSHMEM_DOORBELL_REG: u32 = 12;

/// The Doorbell register value that rings vector `vector` of peer `peer`.
pub const fn doorbell_value(peer: u16, vector: u16) -> u32 {
    (peer as u32) << 16 | vector as u32
}

pub const GF_ACTIVE: u32 = 1 << 0;
pub const GF_IDLE: u32 = 1 << 1;
pub const GF_BOOST_REQ: u32 = 1 << 2;
pub const GF_ALL: u32 = GF_ACTIVE | GF_IDLE | GF_BOOST_REQ;

pub const CS_NMI: u32 = 1 << 0;
pub const CS_HARDIRQ: u32 = 1 << 1;
pub const CS_SOFTIRQ: u32 = 1 << 2;
pub const CS_PREEMPT_OFF: u32 = 1 << 3;
pub const CS_LOCK: u32 = 1 << 4;
pub const CS_ALL: u32 = CS_NMI | CS_HARDIRQ | CS_SOFTIRQ | CS_PREEMPT_OFF | CS_LOCK;

/// `GuestHalf::lock_holder`: no lock wait published.
pub const LOCK_NONE: u32 = 0;
/// `GuestHalf::lock_holder`: the holder is unknown, on another vCPU (1..=MAX_SLOTS:
/// the holder's slot index + 1).
pub const LOCK_ANY: u32 = 0xffff_ffff;

pub const LOCK_F_SPIN: u32 = 1 << 0;
pub const LOCK_F_READ: u32 = 1 << 1;
pub const LOCK_F_WRITE: u32 = 1 << 2;
pub const LOCK_F_MUTEX: u32 = 1 << 3;
pub const LOCK_F_SLEEP: u32 = 1 << 4;
pub const LOCK_F_ALL: u32 = LOCK_F_SPIN | LOCK_F_READ | LOCK_F_WRITE | LOCK_F_MUTEX | LOCK_F_SLEEP;

pub const POLICY_NORMAL: u32 = 0;
pub const POLICY_FIFO: u32 = 1;
pub const POLICY_RR: u32 = 2;
pub const POLICY_BATCH: u32 = 3;
pub const POLICY_IDLE: u32 = 5;
pub const POLICY_DEADLINE: u32 = 6;

pub const PENDING_VALID: u64 = 1 << 63;
pub const PENDING_PRIO_MASK: u64 = 0xff;
pub const PENDING_POLICY_SHIFT: u32 = 8;
pub const PENDING_POLICY_MASK: u64 = 0xff << PENDING_POLICY_SHIFT;
pub const PENDING_RESERVED: u64 = !(PENDING_VALID | PENDING_PRIO_MASK | PENDING_POLICY_MASK);

pub const HS_UNKNOWN: u32 = 0;
pub const HS_RUNNING: u32 = 1;
pub const HS_PREEMPTED: u32 = 2;
pub const HS_HALTED: u32 = 3;

pub const HF_BOOSTED: u32 = 1 << 0;
pub const HF_THROTTLED: u32 = 1 << 1;
pub const HF_OVERLOADED: u32 = 1 << 2;
pub const HF_IN_DEBT: u32 = 1 << 3;

pub const HOST_POLICY_OTHER: u32 = 0;
pub const HOST_POLICY_FIFO: u32 = 1;
pub const HOST_POLICY_RR: u32 = 2;
pub const HOST_POLICY_BATCH: u32 = 3;
pub const HOST_POLICY_IDLE: u32 = 5;

/// Bytes a region needs for `slots` slots (before rounding to a BAR size).
pub const fn region_bytes(slots: u32) -> u64 {
    HEADER_SIZE as u64 + slots as u64 * SLOT_SIZE as u64
}

/// `struct pvsched_header`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub magic: u64,
    pub abi_major: u16,
    pub abi_minor: u16,
    pub header_size: u16,
    pub slot_size: u16,
    pub slot_count: u32,
    /// With `F_DOORBELL`: the value that rings the host ([`doorbell_value`]); else 0.
    pub doorbell: u32,
    pub host_features: u64,
    pub generation: u64,
    pub host_reserved: [u64; 3],
    pub guest_features: u64,
    pub guest_generation: u64,
    pub guest_abi_minor: u32,
    pub guest_nr_cpus: u32,
    pub guest_reserved: [u64; 5],
}

/// `struct pvsched_guest_half`: what the guest says about one vCPU. Untrusted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestHalf {
    pub seq: u32,
    pub flags: u32,
    pub cs_flags: u32,
    pub policy: u32,
    pub rt_priority: u32,
    pub nice: i32,
    pub update_ns: u64,
    pub hardirq_count: u64,
    pub softirq_count: u64,
    pub nmi_count: u64,
    pub switch_count: u64,
    pub guest_pending: u64,
    pub boost_req_count: u64,
    /// With `F_LOCK_WAIT`: `LOCK_NONE`, the holder's slot index + 1, or `LOCK_ANY`.
    pub lock_holder: u32,
    /// With `F_LOCK_WAIT`: `LOCK_F_*`.
    pub lock_flags: u32,
    /// With `F_LOCK_WAIT`: lock contentions seen by this vCPU.
    pub lock_contended_count: u64,
    /// With `F_LOCK_WAIT`: contentions whose holder's vCPU was preempted on the host.
    pub lock_preempted_count: u64,
    pub guest_reserved: [u64; 3],
}

/// `struct pvsched_host_half`: what the host tells the guest about one vCPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostHalf {
    pub seq: u32,
    pub status: u32,
    pub flags: u32,
    pub policy: u32,
    pub rt_priority: u32,
    pub nice: i32,
    pub update_ns: u64,
    pub boost_count: u64,
    pub throttle_count: u64,
    pub preempt_count: u64,
    pub boosted_ns: u64,
    /// With `F_IDLE_HINTS`: wake -> running latency of the vCPU thread, median and
    /// 99th percentile over the host's recent window, ns; 0 = not measured.
    pub wake_p50_ns: u32,
    pub wake_p99_ns: u32,
    /// With `F_IDLE_HINTS`: share of a core (permille) the vCPU may spend polling
    /// in its idle driver; 0 = none given.
    pub poll_budget_permille: u32,
    pub host_reserved1: u32,
    pub host_reserved: [u64; 6],
}

/// `struct pvsched_slot`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub guest: GuestHalf,
    pub host: HostHalf,
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(core::mem::size_of::<GuestHalf>() == 2 * CACHELINE);
const _: () = assert!(core::mem::size_of::<HostHalf>() == 2 * CACHELINE);
const _: () = assert!(core::mem::size_of::<Slot>() == SLOT_SIZE);
