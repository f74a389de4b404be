//! Unit tests of the slot table and of `Tenancy`, over an in-process lock
//! model (not under loom: `loom_tests/tests/slots.rs` models the races).

use super::*;
use std::cell::Cell;
use std::sync::Mutex;

/// In-process lock model: `owner[i]` is the party holding slot i.
struct Locks<'a> {
    me: u32,
    owner: &'a Mutex<Vec<u32>>,
}

impl SlotLocks for Locks<'_> {
    fn try_lock(&self, i: u32) -> Result<bool, LivenessError> {
        let mut o = self.owner.lock().unwrap();
        let cell = &mut o[i as usize];
        if *cell == 0 || *cell == self.me {
            *cell = self.me;
            Ok(true)
        } else {
            Ok(false)
        }
    }
    fn unlock(&self, i: u32) -> Result<(), LivenessError> {
        let mut o = self.owner.lock().unwrap();
        if o[i as usize] == self.me {
            o[i as usize] = 0;
        }
        Ok(())
    }
    fn is_held(&self, i: u32) -> Result<bool, LivenessError> {
        let o = self.owner.lock().unwrap();
        Ok(o[i as usize] != 0 && o[i as usize] != self.me)
    }
}

#[test]
fn claim_full_release_reclaim() {
    let slots: Vec<ClientSlot> = (0..2).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 2]);
    let a = SlotTable::new(
        &slots,
        Locks {
            me: 1,
            owner: &owner,
        },
    );
    let b = SlotTable::new(
        &slots,
        Locks {
            me: 2,
            owner: &owner,
        },
    );
    let c = SlotTable::new(
        &slots,
        Locks {
            me: 3,
            owner: &owner,
        },
    );
    let d = SlotTable::new(
        &slots,
        Locks {
            me: 99,
            owner: &owner,
        },
    );
    let ca = a.claim(10).unwrap();
    let cb = b.claim(20).unwrap();
    assert_ne!(ca.index, cb.index);
    assert_eq!(c.claim(30), Err(ClaimError::Full));
    assert!(d.status(ca.index).unwrap().alive);
    assert_eq!(
        d.reclaim(d.status(ca.index).unwrap()),
        Err(SlotError::Alive)
    );
    // b dies: the kernel drops its lock.
    owner.lock().unwrap()[cb.index as usize] = 0;
    // c still cannot take the dead slot: the daemon must reclaim first.
    assert_eq!(c.claim(30), Err(ClaimError::Full));
    let dead: Vec<_> = d.occupied().filter(SlotStatus::is_dead).collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].pid, 20);
    d.reclaim(dead[0]).unwrap();
    assert_eq!(d.reclaim(dead[0]), Err(SlotError::Stale));
    let cc = c.claim(30).unwrap();
    assert_eq!(cc.index, cb.index);
    assert_eq!(cc.generation, cb.generation + 2);
    assert!(!c.is_current(cb));
    a.release(ca).unwrap();
    assert_eq!(a.release(ca), Err(SlotError::Stale));
    assert_eq!(d.occupied().count(), 1);
}

#[test]
fn garbage_state_is_reclaimable() {
    let slots: Vec<ClientSlot> = (0..1).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 1]);
    let d = SlotTable::new(
        &slots,
        Locks {
            me: 99,
            owner: &owner,
        },
    );
    d.poke(0, 7, 0xdead);
    let s = d.status(0).unwrap();
    assert!(s.is_dead());
    d.reclaim(s).unwrap();
    assert_eq!(d.raw_word(0), Some((8, FREE)));
    assert_eq!(d.status(5), Err(SlotError::BadIndex(5)));
}

/// `is_claim` names exactly one claim: its slot, its generation, and
/// only once the daemon activated it.
#[test]
fn is_claim_names_only_the_activated_claim() {
    let slots: Vec<ClientSlot> = (0..2).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 2]);
    let client = SlotTable::new(
        &slots,
        Locks {
            me: 1,
            owner: &owner,
        },
    );
    let daemon = SlotTable::new(
        &slots,
        Locks {
            me: 99,
            owner: &owner,
        },
    );
    let claim = client.claim(10).unwrap();
    let status = || daemon.status(claim.index).unwrap();
    assert_eq!(daemon.word(claim.index), Ok((claim.generation, CLAIMED)));
    assert!(!status().is_claim(claim), "claimed, not yet active");
    daemon.activate(claim.index, claim.generation).unwrap();
    assert_eq!(daemon.word(claim.index), Ok((claim.generation, ACTIVE)));
    assert!(status().is_claim(claim));
    assert_eq!(
        daemon.activate(claim.index, claim.generation),
        Err(SlotError::Stale),
        "active already"
    );
    let other_generation = Claim {
        generation: claim.generation + 2,
        ..claim
    };
    assert!(!status().is_claim(other_generation));
    let other_slot = Claim {
        index: 1 - claim.index,
        ..claim
    };
    assert!(!status().is_claim(other_slot));
    client.release(claim).unwrap();
    assert!(!status().is_claim(claim), "released");
}

/// A table over borrowed locks (`&L`, as the daemon and the client
/// hold theirs) takes, probes and drops them through the reference.
#[test]
fn a_table_over_borrowed_locks_uses_them() {
    let slots: Vec<ClientSlot> = (0..1).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 1]);
    let (mine, theirs) = (
        Locks {
            me: 1,
            owner: &owner,
        },
        Locks {
            me: 2,
            owner: &owner,
        },
    );
    let (client, daemon) = (
        SlotTable::new(&slots, &mine),
        SlotTable::new(&slots, &theirs),
    );
    let claim = client.claim(10).unwrap();
    assert_eq!(owner.lock().unwrap()[0], 1, "the claim took the lock");
    assert_eq!(daemon.is_held(0), Ok(true));
    assert_eq!(client.is_held(0), Ok(false), "held by us, not by another");
    client.release(claim).unwrap();
    assert_eq!(owner.lock().unwrap()[0], 0, "the release dropped it");
    assert_eq!(daemon.is_held(0), Ok(false));
}

/// `released(index, g)`: the holder of claim `g` (or of a later claim
/// of the slot) released it; generations compare wrapping, half the
/// range ahead.
#[test]
fn released_tells_claims_released_from_claims_still_held() {
    let slots: Vec<ClientSlot> = (0..1).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 1]);
    let client = SlotTable::new(
        &slots,
        Locks {
            me: 1,
            owner: &owner,
        },
    );
    let claim = client.claim(10).unwrap();
    let g = claim.generation;
    assert!(!client.released(0, g), "held");
    client.release(claim).unwrap();
    assert!(client.released(0, g));
    assert!(client.released(0, g.wrapping_sub(2)), "an earlier claim");
    assert!(!client.released(0, g.wrapping_add(2)), "a later claim");
    // Exactly half the range apart: ahead, not behind.
    assert!(client.released(0, g.wrapping_sub((1 << 31) - 1)));
    assert!(!client.released(0, g.wrapping_sub(1 << 31)));
    assert!(!client.released(7, g), "no such slot");
}

/// The daemon's side of the hand-over, one step at a time (the loom
/// model `slots` runs it against concurrent clients): adopt a claim,
/// serve it, hand the slot to the next claimant once the first one
/// released it, never to a forged claim, and forget a holder only once
/// its lock is free.
#[test]
fn tenancy_adopts_serves_and_hands_over() {
    let slots: Vec<ClientSlot> = (0..1).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 1]);
    let locks = |me| Locks { me, owner: &owner };
    let (one, two, us) = (locks(1), locks(2), locks(99));
    let (first, second) = (SlotTable::new(&slots, &one), SlotTable::new(&slots, &two));
    let daemon = SlotTable::new(&slots, &us);
    let (forgot, resets) = (Cell::new(0), Cell::new(0));
    let settle = |t: &mut Tenancy, probe: bool| {
        let word = daemon.word(0).unwrap();
        let forget = &mut || forgot.set(forgot.get() + 1);
        let reset = &mut || resets.set(resets.get() + 1);
        t.settle(&daemon, 0, word, probe, forget, reset)
    };
    let mut t = Tenancy::new();

    // Nothing claimed, the lock free: nothing served, nothing done.
    assert!(!settle(&mut t, true));
    assert_eq!((t.owner(), forgot.get(), resets.get()), (None, 0, 0));

    // A claim: the daemon resets the rings and adopts it.
    let a = first.claim(10).unwrap();
    assert!(!first.is_current(a));
    assert!(settle(&mut t, true));
    assert_eq!(
        (t.owner(), forgot.get(), resets.get()),
        (Some(a.generation), 0, 1)
    );
    assert!(first.is_current(a));
    let served = daemon.word(0).unwrap();
    assert!(t.serves(served));
    assert!(!t.serves((a.generation, CLAIMED)));
    assert!(!t.serves((a.generation + 2, ACTIVE)));
    assert!(t.admits(served, a.generation));
    assert!(
        !t.admits(served, a.generation + 2),
        "another claim's record"
    );
    assert!(!t.admits((a.generation, CLAIMED), a.generation));
    assert!(settle(&mut t, true), "served: nothing to do");
    assert_eq!(resets.get(), 1);

    // Released, then claimed again: the first holder is gone.
    first.release(a).unwrap();
    let b = second.claim(20).unwrap();
    assert!(settle(&mut t, false));
    assert_eq!(
        (t.owner(), forgot.get(), resets.get()),
        (Some(b.generation), 1, 2)
    );

    // A forged claim over the served slot (its holder released
    // nothing): not adopted; the holder's lock is held, so nothing is
    // forgotten, probe or not.
    daemon.poke(0, b.generation + 1, CLAIMED);
    assert!(!settle(&mut t, false));
    assert!(!settle(&mut t, true));
    assert_eq!(
        (t.owner(), forgot.get(), resets.get()),
        (Some(b.generation), 1, 2)
    );

    // The holder dies (the kernel drops its lock): forgotten at the
    // first probe, not before.
    owner.lock().unwrap()[0] = 0;
    assert!(!settle(&mut t, false));
    assert_eq!((t.owner(), forgot.get()), (Some(b.generation), 1));
    assert!(!settle(&mut t, true));
    assert_eq!((t.owner(), forgot.get(), resets.get()), (None, 2, 2));

    // `vacate` forgets what a dead owner held, once.
    let mut held = Tenancy::new();
    daemon.poke(0, 7, CLAIMED);
    assert!(settle(&mut held, true));
    held.vacate(&mut || forgot.set(forgot.get() + 1));
    held.vacate(&mut || forgot.set(forgot.get() + 1));
    assert_eq!((held.owner(), forgot.get()), (None, 3));
}

#[test]
fn len_counts_the_slots() {
    let slots: Vec<ClientSlot> = (0..3).map(|_| ClientSlot::new()).collect();
    let owner = Mutex::new(vec![0; 3]);
    let locks = Locks {
        me: 1,
        owner: &owner,
    };
    let table = SlotTable::new(&slots, &locks);
    assert_eq!((table.len(), table.is_empty()), (3, false));
    let none = SlotTable::new(&slots[..0], &locks);
    assert_eq!((none.len(), none.is_empty()), (0, true));
}

/// Every error says what failed, with its figures.
#[test]
fn errors_name_what_failed() {
    let table = TableOutOfBounds {
        offset: 4096,
        count: 16,
    };
    let lock = LivenessError(std::io::ErrorKind::PermissionDenied);
    let cases: [(String, &[&str]); 10] = [
        (lock.to_string(), &["liveness lock", "ermission denied"]),
        (table.to_string(), &["16 slots", "offset 4096", "outside"]),
        (ClaimError::Full.to_string(), &["no free client slot"]),
        (ClaimError::AlreadyClaimed.to_string(), &["already holds"]),
        (
            ClaimError::Table(table).to_string(),
            &["16 slots", "offset 4096"],
        ),
        (
            ClaimError::Liveness(lock).to_string(),
            &["claiming", "liveness lock"],
        ),
        (
            SlotError::BadIndex(7).to_string(),
            &["index 7 out of range"],
        ),
        (SlotError::Stale.to_string(), &["stale"]),
        (
            SlotError::Table(table).to_string(),
            &["16 slots", "offset 4096"],
        ),
        (
            SlotError::Liveness(lock).to_string(),
            &["client slot", "liveness lock"],
        ),
    ];
    for (text, parts) in cases {
        for part in parts {
            assert!(text.contains(part), "{text:?} lacks {part:?}");
        }
    }
    assert!(SlotError::Alive.to_string().contains("alive"));
}
