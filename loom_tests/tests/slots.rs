//! Client slots: a client that dies after any step of claim (or release)
//! while the daemon scans concurrently always ends in a consistent slot that
//! the daemon reclaims; a live client is never reclaimed; two clients never
//! share a slot.
#![cfg(loom)]

use radixd_ipc::slots::{ClaimStep, ACTIVE, FREE};
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};
use radixd_ipc::{Claim, ClientSlot, LivenessError, SlotLocks, SlotTable};

/// Kernel-lock model: `held[i]` is the id of the party holding slot i's lock
/// (0: none). SeqCst: kernel lock operations are serialising.
struct Kernel {
    held: Vec<AtomicU32>,
}

impl Kernel {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            held: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// What the kernel does when process `me` dies: drop its locks.
    fn die(&self, me: u32) {
        for h in &self.held {
            let _ = h.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

struct Party {
    me: u32,
    kernel: Arc<Kernel>,
}

impl SlotLocks for Party {
    fn try_lock(&self, i: u32) -> Result<bool, LivenessError> {
        let h = &self.kernel.held[i as usize];
        Ok(
            match h.compare_exchange(0, self.me, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => true,
                Err(owner) => owner == self.me,
            },
        )
    }
    fn unlock(&self, i: u32) -> Result<(), LivenessError> {
        let h = &self.kernel.held[i as usize];
        let _ = h.compare_exchange(self.me, 0, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }
    fn is_held(&self, i: u32) -> Result<bool, LivenessError> {
        let v = self.kernel.held[i as usize].load(Ordering::SeqCst);
        Ok(v != 0 && v != self.me)
    }
}

const DAEMON: u32 = 100;

fn daemon_scan(slots: &[ClientSlot], kernel: &Arc<Kernel>) {
    let table = SlotTable::new(
        slots,
        Party {
            me: DAEMON,
            kernel: kernel.clone(),
        },
    );
    if let Ok(st) = table.status(0) {
        if st.is_dead() {
            let _ = table.reclaim(st);
        }
    }
}

/// Client 1 runs claim up to `stop` (then, if `release`, a full claim and a
/// release) and dies; the daemon scans concurrently and once more after.
fn dying_client(stop: ClaimStep, release: bool) {
    loom::model(move || {
        let slots = Arc::new(vec![ClientSlot::new()]);
        let kernel = Kernel::new(1);
        let (s, k) = (slots.clone(), kernel.clone());
        let client = loom::thread::spawn(move || {
            let table = SlotTable::new(
                &s[..],
                Party {
                    me: 1,
                    kernel: k.clone(),
                },
            );
            let claimed = table.claim_until(0, 1, stop, &mut |_| {}).unwrap();
            if release {
                if let Some(c) = claimed {
                    let _ = table.release(c);
                }
            }
            k.die(1);
        });
        daemon_scan(&slots, &kernel);
        client.join().unwrap();
        daemon_scan(&slots, &kernel);

        let daemon = SlotTable::new(
            &slots[..],
            Party {
                me: DAEMON,
                kernel: kernel.clone(),
            },
        );
        let (generation, state) = daemon.raw_word(0).unwrap();
        assert_eq!(state, FREE, "dead client's slot not reclaimed");
        assert_eq!(kernel.held[0].load(Ordering::SeqCst), 0);
        // Claim bumped the generation once; each return to FREE once more.
        assert!(
            generation == 0 || generation == 2,
            "generation {generation}"
        );
        // The slot is reusable, with a fresh generation.
        let next = SlotTable::new(
            &slots[..],
            Party {
                me: 2,
                kernel: kernel.clone(),
            },
        );
        let c = next.claim(2, |_| {}).unwrap();
        assert_eq!(c.generation, generation + 1);
    });
}

#[test]
fn dies_before_start() {
    dying_client(ClaimStep::Start, false);
}

#[test]
fn dies_after_lock() {
    dying_client(ClaimStep::Locked, false);
}

#[test]
fn dies_after_cas() {
    dying_client(ClaimStep::Claiming, false);
}

#[test]
fn dies_after_pid() {
    dying_client(ClaimStep::Pid, false);
}

#[test]
fn dies_after_publish() {
    dying_client(ClaimStep::Done, false);
}

#[test]
fn dies_after_release() {
    dying_client(ClaimStep::Done, true);
}

#[test]
fn live_client_is_never_reclaimed() {
    loom::model(|| {
        let slots = Arc::new(vec![ClientSlot::new()]);
        let kernel = Kernel::new(1);
        let (s, k) = (slots.clone(), kernel.clone());
        let client = loom::thread::spawn(move || {
            let table = SlotTable::new(&s[..], Party { me: 1, kernel: k });
            table.claim(1, |_| {}).unwrap()
        });
        daemon_scan(&slots, &kernel);
        let claim: Claim = client.join().unwrap();
        daemon_scan(&slots, &kernel);
        let daemon = SlotTable::new(&slots[..], Party { me: DAEMON, kernel });
        assert!(daemon.is_current(claim));
        assert_eq!(daemon.raw_word(0), Some((claim.generation, ACTIVE)));
    });
}

#[test]
fn two_clients_one_slot() {
    loom::model(|| {
        let slots = Arc::new(vec![ClientSlot::new()]);
        let kernel = Kernel::new(1);
        let spawn = |me: u32| {
            let (s, k) = (slots.clone(), kernel.clone());
            loom::thread::spawn(move || {
                let table = SlotTable::new(&s[..], Party { me, kernel: k });
                table.claim(me, |_| {}).ok()
            })
        };
        let (a, b) = (spawn(1), spawn(2));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(
            a.is_some() != b.is_some(),
            "exactly one client gets the slot"
        );
    });
}
