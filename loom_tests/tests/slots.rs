//! Client slots and their hand-over, with the daemon's scan in a thread of
//! its own (so loom runs it at every point of a client's claim, not only
//! before or after it).
//!
//! * `dies_*`: a client that dies after any step of claim (or release)
//!   while the daemon scans concurrently always ends in a consistent slot
//!   that the daemon reclaims.
//! * `live_client_is_adopted_and_never_reclaimed`: a live claimant is
//!   adopted, never reclaimed; the daemon sees the pid the claim published,
//!   and the client sees the rings the daemon reset (cursors and a stamp
//!   dirtied by a previous holder read as zero once ACTIVE is seen).
//! * `two_clients_one_slot`: two claimants never share a slot.
//! * `handover_with_a_request_queued`: a client times out and releases its
//!   slot with a request queued while the daemon is mid-drain, and a new
//!   client claims the slot: no record of the old holder runs for the new
//!   one, and the new one is served.
//! * `a_release_reaches_the_daemon_with_the_next_claim` and
//!   `a_claim_orders_the_last_release_before_its_own`: what a release
//!   publishes (`released`, stored after the lock is dropped) reaches the
//!   daemon through the next claim, and a claimant's own release comes
//!   after the previous one's, so the daemon adopts a claim made over the
//!   claim it serves at first sight. The clients there run in threads of
//!   their own (processes: one acquires nothing from another but through
//!   the slot word).
//!
//! Mutations checked (each made temporarily in `ipc/src/slots/mod.rs`, run
//! at `LOOM_MAX_PREEMPTIONS=2`, then reverted):
//! * claim with "claim the slot" (CAS FREE -> CLAIMING) before "take the
//!   liveness lock": caught by `live_client_is_adopted_and_never_reclaimed`
//!   (the daemon's scan, in its own thread, sees CLAIMING with no lock
//!   held, reclaims it, and the live client's claim fails with `Full`).
//! * the CLAIMING -> CLAIMED CAS Relaxed instead of Release: caught by
//!   `live_client_is_adopted_and_never_reclaimed` (pid not visible at
//!   adoption).
//! * `SlotTable::activate` Relaxed instead of Release: caught by
//!   `live_client_is_adopted_and_never_reclaimed` and
//!   `handover_with_a_request_queued` (reset rings not visible once ACTIVE
//!   is seen: the new client would push after the old holder's counters).
//! * `Tenancy::settle` resetting the rings after `activate` instead of
//!   before: caught by both as well.
//! * `RingHeader::reset` (in `ipc/src/ring.rs`) leaving the entries'
//!   stamps: caught by both (a stale stamp would let the new holder's
//!   consumer take the old holder's message for its own first one).
//! * `release`'s CAS to FREE Relaxed instead of Release: caught by both
//!   `released` models (the daemon reads the generation from before the
//!   release and leaves the next claim unadopted).
//! * the claim's Acquire load and CAS both Relaxed: caught by
//!   `a_claim_orders_the_last_release_before_its_own` (B's store to
//!   `released` precedes A's in its modification order). Either one alone
//!   Relaxed passes, rightly: the CAS succeeds only on the very store the
//!   load read (every transition changes the word), so one Acquire of it
//!   is enough.
//!
//! Not caught, by design: dropping the daemon's re-read of the slot word
//! after a pop, or its check of a record's generation. Neither is needed
//! for the properties above (a record popped before the daemon noticed a
//! release runs for the client that posted it, and is released with its
//! holdings); they narrow that window and guard against a producer that
//! keeps writing after its release, which the SPSC contract rules out.
//!
//! The kernel lock is a loom `Mutex` (the kernel serialises lock calls, and
//! a probe reads the latest state): a plain load would let loom read a
//! stale "not held" no kernel would report. Every model asserts a floor on
//! the executions that met the race it is about (each says which),
//! counted outside `loom::model`.
#![cfg(loom)]

use loom_tests::explore;

use radixd_ipc::slots::{ClaimStep, ACTIVE, CLAIMED, FREE};
use radixd_ipc::sync::{yield_now, Arc, Mutex};
use radixd_ipc::{
    Claim, ClaimError, ClientSlot, HeapRing, LivenessError, SlotLocks, SlotTable, Tenancy,
};

/// Kernel-lock model: `held[i]` is the id of the party holding slot i's
/// lock (0: none), behind one mutex, as the kernel's lock table is.
struct Kernel {
    held: Mutex<Vec<u32>>,
}

impl Kernel {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::new(vec![0; n]),
        })
    }

    /// What the kernel does when process `me` dies: drop its locks.
    fn die(&self, me: u32) {
        for h in self.held.lock().unwrap().iter_mut() {
            if *h == me {
                *h = 0;
            }
        }
    }

    fn holder(&self, i: usize) -> u32 {
        self.held.lock().unwrap()[i]
    }
}

struct Party {
    me: u32,
    kernel: Arc<Kernel>,
}

impl SlotLocks for Party {
    fn try_lock(&self, i: u32) -> Result<bool, LivenessError> {
        let mut held = self.kernel.held.lock().unwrap();
        let h = &mut held[i as usize];
        Ok(if *h == 0 || *h == self.me {
            *h = self.me;
            true
        } else {
            false
        })
    }
    fn unlock(&self, i: u32) -> Result<(), LivenessError> {
        let mut held = self.kernel.held.lock().unwrap();
        if held[i as usize] == self.me {
            held[i as usize] = 0;
        }
        Ok(())
    }
    fn is_held(&self, i: u32) -> Result<bool, LivenessError> {
        let v = self.kernel.held.lock().unwrap()[i as usize];
        Ok(v != 0 && v != self.me)
    }
}

const DAEMON: u32 = 100;

/// The daemon's side of one slot, as `src/daemon/peer.rs` runs it: settle
/// the tenancy against the word (adopting a claim: forget, reset the
/// rings, activate), then the sweep's reclaim of a dead owner.
struct Daemon {
    table: SlotTable<'static, Party>,
    tenancy: Tenancy,
    forgotten: usize,
}

impl Daemon {
    fn new(slots: &'static [ClientSlot], kernel: &Arc<Kernel>) -> Self {
        Self {
            table: SlotTable::new(
                slots,
                Party {
                    me: DAEMON,
                    kernel: kernel.clone(),
                },
            ),
            tenancy: Tenancy::new(),
            forgotten: 0,
        }
    }

    /// One round, the sweep included; `reset` empties the slot's rings.
    /// Returns whether served.
    fn round(&mut self, reset: &mut dyn FnMut(&SlotTable<'static, Party>)) -> bool {
        let served = self.settle(reset);
        if let Ok(st) = self.table.status(0) {
            if st.is_dead() {
                let forgotten = &mut self.forgotten;
                self.tenancy.vacate(&mut || *forgotten += 1);
                let _ = self.table.reclaim(st);
            }
        }
        served
    }

    /// The per-loop part of a round: settle the tenancy against the word.
    fn settle(&mut self, reset: &mut dyn FnMut(&SlotTable<'static, Party>)) -> bool {
        let Ok(word) = self.table.word(0) else {
            return false;
        };
        let forgotten = &mut self.forgotten;
        let table = &self.table;
        self.tenancy
            .settle(table, 0, word, true, &mut || *forgotten += 1, &mut || {
                reset(table)
            })
    }
}

/// Leaks a one-slot table for the model's threads (a model's memory is
/// small; loom runs thousands of them).
fn one_slot() -> &'static [ClientSlot] {
    Box::leak(Box::new([ClientSlot::new()]))
}

/// Client 1 runs claim up to `stop` (then, if `release`, a release) and
/// dies; the daemon scans concurrently in its own thread, and once more
/// after both.
fn dying_client(name: &str, floor: usize, stop: ClaimStep, release: bool) {
    explore(name, floor, move || {
        let slots = one_slot();
        let kernel = Kernel::new(1);
        let k = kernel.clone();
        let client = loom::thread::spawn(move || {
            let table = SlotTable::new(
                slots,
                Party {
                    me: 1,
                    kernel: k.clone(),
                },
            );
            let claimed = table.claim_until(0, 1, stop).unwrap();
            if release {
                if let Some(c) = claimed {
                    let _ = table.release(c);
                }
            }
            k.die(1);
        });
        let k = kernel.clone();
        let daemon = loom::thread::spawn(move || {
            let mut d = Daemon::new(slots, &k);
            // On the path: this round met the claim under way (the word
            // moved, or the client holds the lock).
            let met = d.table.raw_word(0).is_some_and(|(_, st)| st != FREE) || k.holder(0) == 1;
            d.round(&mut |_| {});
            (d, met)
        });
        client.join().unwrap();
        let (mut d, met) = daemon.join().unwrap();
        d.round(&mut |_| {});
        d.round(&mut |_| {});

        let (generation, state) = d.table.raw_word(0).unwrap();
        assert_eq!(state, FREE, "dead client's slot not reclaimed");
        assert_eq!(kernel.holder(0), 0);
        // Claim bumped the generation once; each return to FREE once more.
        assert!(
            generation == 0 || generation == 2,
            "generation {generation}"
        );
        // The slot is reusable, with a fresh generation.
        let next = SlotTable::new(
            slots,
            Party {
                me: 2,
                kernel: kernel.clone(),
            },
        );
        let c = next.claim(2).unwrap();
        assert_eq!(c.generation, generation + 1);
        // A client that dies before it starts leaves nothing to meet.
        met || stop == ClaimStep::Start
    });
}

#[test]
fn dies_before_start() {
    dying_client("dies_before_start", 10, ClaimStep::Start, false);
}

#[test]
fn dies_after_lock() {
    dying_client("dies_after_lock", 2, ClaimStep::Locked, false);
}

#[test]
fn dies_after_cas() {
    dying_client("dies_after_cas", 25, ClaimStep::Claiming, false);
}

#[test]
fn dies_after_pid() {
    dying_client("dies_after_pid", 60, ClaimStep::Pid, false);
}

#[test]
fn dies_after_publish() {
    dying_client("dies_after_publish", 150, ClaimStep::Done, false);
}

#[test]
fn dies_after_release() {
    dying_client("dies_after_release", 300, ClaimStep::Done, true);
}

#[test]
fn live_client_is_adopted_and_never_reclaimed() {
    explore("live_client_is_adopted_and_never_reclaimed", 1000, || {
        let slots = one_slot();
        let kernel = Kernel::new(1);
        // A previous holder left its cursors and a stamp behind.
        let ring = Arc::new(HeapRing::<u32>::new(2).unwrap());
        ring.set_counters(5, 5);
        ring.set_stamp(1, 6);
        let (k, r) = (kernel.clone(), ring.clone());
        let client = loom::thread::spawn(move || {
            let table = SlotTable::new(slots, Party { me: 1, kernel: k });
            let claim = table.claim(7).unwrap();
            let mut waited = false;
            while !table.is_current(claim) {
                waited = true;
                yield_now();
            }
            // Published by `activate`, acquired by `is_current`.
            assert!(r.is_reset(), "reset rings not visible");
            (claim, waited)
        });
        let (k, r) = (kernel.clone(), ring.clone());
        let daemon = loom::thread::spawn(move || {
            let mut d = Daemon::new(slots, &k);
            let mut pid = None;
            while !d.round(&mut |table| {
                pid = table.status(0).ok().map(|s| s.pid);
                r.header().reset(r.entries());
            }) {
                yield_now();
            }
            assert_eq!(pid, Some(7), "claim's pid not visible at adoption");
            d
        });
        let (claim, waited): (Claim, bool) = client.join().unwrap();
        let mut d = daemon.join().unwrap();
        assert!(d.round(&mut |_| {}));
        assert!(d.table.is_current(claim));
        assert_eq!(d.table.raw_word(0), Some((claim.generation, ACTIVE)));
        assert_eq!(d.forgotten, 0);
        // On the path: the client claimed before the daemon adopted it.
        waited
    });
}

#[test]
fn two_clients_one_slot() {
    explore("two_clients_one_slot", 10, || {
        let slots = one_slot();
        let kernel = Kernel::new(1);
        let spawn = |me: u32| {
            let k = kernel.clone();
            loom::thread::spawn(move || {
                let table = SlotTable::new(slots, Party { me, kernel: k });
                table.claim(me).ok()
            })
        };
        let (a, b) = (spawn(1), spawn(2));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(
            a.is_some() != b.is_some(),
            "exactly one client gets the slot"
        );
        // Every execution races the two claims.
        true
    });
}

/// Request record of the model: `[generation of the claim, request id]`.
type Record = [u32; 2];

#[test]
fn handover_with_a_request_queued() {
    explore("handover_with_a_request_queued", 2000, || {
        let slots = one_slot();
        let kernel = Kernel::new(1);
        let ring = Arc::new(HeapRing::<Record>::new(2).unwrap());

        // Client A is adopted and has a request queued (setup, sequential).
        let a = SlotTable::new(
            slots,
            Party {
                me: 1,
                kernel: kernel.clone(),
            },
        );
        let claim_a = a.claim(1).unwrap();
        let mut d = Daemon::new(slots, &kernel);
        let r = ring.clone();
        assert!(d.round(&mut |_| r.header().reset(r.entries())));
        assert!(a.is_current(claim_a));
        // SAFETY: A is the ring's only producer until it releases.
        unsafe { ring.producer() }
            .push([claim_a.generation, 1])
            .unwrap();

        // A times out and releases, its request still queued; B (which can
        // only claim once A has let go of the lock) claims the slot, waits
        // for adoption and posts its own request.
        let (k, r) = (kernel.clone(), ring.clone());
        let clients = loom::thread::spawn(move || {
            let a = SlotTable::new(
                slots,
                Party {
                    me: 1,
                    kernel: k.clone(),
                },
            );
            a.release(claim_a).unwrap();
            let b = SlotTable::new(slots, Party { me: 2, kernel: k });
            let claim = b.claim(2).unwrap();
            while !b.is_current(claim) {
                yield_now();
            }
            assert!(r.is_reset(), "reset rings not visible");
            // SAFETY: B is the ring's only producer since its adoption (A
            // released before B claimed).
            unsafe { r.producer() }.push([claim.generation, 2]).unwrap();
            claim.generation
        });
        // The daemon drains as `src/daemon/` does (`adopt` in `peer.rs`,
        // then `drain` in `service.rs`): settle, pop, re-read the word,
        // admit or drop.
        let r = ring.clone();
        let daemon = loom::thread::spawn(move || {
            // SAFETY: the daemon is the ring's only consumer.
            let requests = unsafe { r.consumer() };
            let mut ran = Vec::new();
            let mut met_a = false;
            loop {
                let reset = &mut |_: &SlotTable<'static, Party>| requests.reset();
                if d.settle(reset) {
                    if let Some(record) = requests.pop() {
                        met_a |= record[1] == 1;
                        let word = d.table.word(0).unwrap();
                        if d.tenancy.admits(word, record[0]) {
                            assert_eq!(
                                Some(record[0]),
                                d.tenancy.owner(),
                                "a record ran for another holder"
                            );
                            ran.push(record);
                            if record[1] == 2 {
                                return (ran, met_a);
                            }
                        }
                        continue;
                    }
                }
                yield_now();
            }
        });
        let b_generation = clients.join().unwrap();
        let (ran, met_a) = daemon.join().unwrap();
        assert_eq!(ran.last(), Some(&[b_generation, 2]), "B not served");
        assert!(ran.len() <= 2);
        // On the path: the daemon popped A's queued request (it raced the
        // release instead of being reset away).
        met_a
    });
}

/// Generations of one slot's claims in the `released` models: A's (adopted
/// in the setup), B's and C's; each claim and each return to FREE bumps
/// the generation.
const GEN_A: u32 = 1;
const GEN_B: u32 = 3;
const GEN_C: u32 = 5;

/// Client A, holding the slot at `GEN_A` and adopted by `d` (the setup of
/// both `released` models).
fn adopted_a(slots: &'static [ClientSlot], kernel: &Arc<Kernel>) -> (Claim, Daemon) {
    let a = SlotTable::new(
        slots,
        Party {
            me: 1,
            kernel: kernel.clone(),
        },
    );
    let claim = a.claim(1).unwrap();
    assert_eq!(claim.generation, GEN_A);
    let mut d = Daemon::new(slots, kernel);
    assert!(d.round(&mut |_| {}));
    (claim, d)
}

/// Claims the slot as party `me`, waiting (as a client that retries)
/// while it is taken.
fn claim_when_free(slots: &'static [ClientSlot], kernel: &Arc<Kernel>, me: u32) -> Claim {
    let t = SlotTable::new(
        slots,
        Party {
            me,
            kernel: kernel.clone(),
        },
    );
    loop {
        match t.claim(me) {
            Ok(claim) => return claim,
            Err(ClaimError::Full) => yield_now(),
            Err(e) => panic!("claim: {e}"),
        }
    }
}

/// The daemon settles the word it just read; whenever that is a claim
/// over the claim it serves, asserts that it adopts it at first sight
/// (no client dies and no word is forged in these models, so such a
/// claim always follows the served claim's release, and `released` must
/// show that). Returns the word and whether it was such a claim.
fn settle_asserting_adoption(d: &mut Daemon) -> ((u32, u32), bool) {
    let word = d.table.word(0).unwrap();
    let before = d.tenancy.owner();
    let over = word.1 == CLAIMED && before.is_some_and(|g| g != word.0);
    let forgotten = &mut d.forgotten;
    d.tenancy
        .settle(&d.table, 0, word, true, &mut || *forgotten += 1, &mut || {});
    if over {
        assert_ne!(
            d.tenancy.owner(),
            before,
            "claim {word:?} left unadopted over {before:?}: the release not seen in `released`"
        );
    }
    (word, over)
}

/// What `release` publishes: it stores the generation it ends in
/// `released` (Relaxed) after dropping the lock and before its Release CAS
/// to FREE; the next claimant's CASes continue that release sequence up to
/// the daemon's Acquire load of the word, which then shows the release.
/// A releases in a thread of its own, B claims in another once A has let
/// go (it waits on the lock and the word, nothing else), and the daemon
/// looks once B's claim is made. With `release`'s CAS Relaxed the daemon
/// may read `released` from before A's release and leave B unadopted (and
/// B waiting) on a release that happened.
#[test]
fn a_release_reaches_the_daemon_with_the_next_claim() {
    explore(
        "a_release_reaches_the_daemon_with_the_next_claim",
        40,
        || {
            let slots = one_slot();
            let kernel = Kernel::new(1);
            let (claim_a, mut d) = adopted_a(slots, &kernel);
            let k = kernel.clone();
            let a = loom::thread::spawn(move || {
                let a = SlotTable::new(slots, Party { me: 1, kernel: k });
                a.release(claim_a).unwrap();
            });
            let k = kernel.clone();
            let b = loom::thread::spawn(move || claim_when_free(slots, &k, 2));
            assert_eq!(b.join().unwrap().generation, GEN_B);
            // B's claim is made (joined: its own steps are ordered before the
            // daemon's look), A's thread is not joined: only the slot word
            // carries A's release to the daemon.
            let (word, over) = settle_asserting_adoption(&mut d);
            assert_eq!(word, (GEN_B, CLAIMED));
            assert_eq!(
                d.table.raw_word(0),
                Some((GEN_B, ACTIVE)),
                "B's claim not adopted"
            );
            a.join().unwrap();
            // On the path: every execution (B's claim over A's, A released).
            over
        },
    );
}

/// What a claim's Acquire orders: the previous holder's store to
/// `released` before the claimant's own, later one. B claims in a thread
/// of its own once A (the main thread, after B's spawn) has released; the
/// daemon (the main thread too) adopts B if it sees B's claim, B releases
/// without waiting for its adoption (a connect that timed out), and C (the
/// main thread again) claims. Finding C's claim over B's, the daemon must
/// read B's generation in `released`. With the claim's Acquire load and
/// CAS Relaxed, B's store may precede A's in `released`'s modification
/// order (nothing orders them: B acquired nothing from A, and A's store
/// comes after its unlock), the daemon may read A's generation as the
/// latest, and C is left unadopted. (The daemon and clients A and C share
/// one thread: that only adds orderings, so a failure is never the
/// model's artifact.)
#[test]
fn a_claim_orders_the_last_release_before_its_own() {
    explore(
        "a_claim_orders_the_last_release_before_its_own",
        100,
        || {
            let slots = one_slot();
            let kernel = Kernel::new(1);
            let (claim_a, mut d) = adopted_a(slots, &kernel);
            let k = kernel.clone();
            let b = loom::thread::spawn(move || {
                let claim = claim_when_free(slots, &k, 2);
                let b = SlotTable::new(slots, Party { me: 2, kernel: k });
                b.release(claim).unwrap();
            });
            let a = SlotTable::new(
                slots,
                Party {
                    me: 1,
                    kernel: kernel.clone(),
                },
            );
            a.release(claim_a).unwrap();
            // The daemon looks until it has seen B's claim (adopting it if it
            // is still CLAIMED) or its end.
            loop {
                if d.table.word(0).unwrap().0 >= GEN_B {
                    settle_asserting_adoption(&mut d);
                    break;
                }
                yield_now();
            }
            let claim_c = claim_when_free(slots, &kernel, 3);
            assert_eq!(claim_c.generation, GEN_C);
            let b_served = d.tenancy.owner() == Some(GEN_B);
            let (word, _) = settle_asserting_adoption(&mut d);
            assert_eq!(word, (GEN_C, CLAIMED));
            assert_eq!(
                d.table.raw_word(0),
                Some((GEN_C, ACTIVE)),
                "C's claim not adopted"
            );
            b.join().unwrap();
            // On the path: the daemon adopted B before B's release, and so
            // found C's claim over B's.
            b_served
        },
    );
}
