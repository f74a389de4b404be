//! A client's store figures are its own (issue 37 item 9): the hit and miss
//! counters of a client slot restart from zero when another client claims
//! the slot, while the store's totals keep every client's gets.

mod common;

use common::Daemon;
use radixd::store::StoreItem;
use radixd::Client;

/// Removes a daemon's store file when the test ends.
struct StoreFileGuard(std::path::PathBuf);

impl Drop for StoreFileGuard {
    fn drop(&mut self) {
        drop(std::fs::remove_file(&self.0));
    }
}

#[test]
fn a_client_reusing_a_slot_starts_its_store_figures_from_zero() {
    let d = Daemon::start(&["--capacity", "64", "--store", "1MiB"]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let mut a = Client::connect(&d.name).expect("connect");
    let slot = a.slot();
    let ns = a.store_namespace("m", 4096).expect("namespace");
    let v = vec![7u8; 4096];
    let item = StoreItem {
        key: b"k",
        parent: None,
        value: &v,
    };
    assert_eq!(a.store_put(ns, &[item]).expect("put"), vec![true]);
    let mut out = vec![0u8; 4096];
    for _ in 0..3 {
        assert!(a.store_get(ns, b"k", &mut out).expect("get"));
    }
    assert!(!a.store_get(ns, b"absent", &mut out).expect("get"));
    let st = a.store_stats().expect("stats");
    assert_eq!((st.client_hits, st.client_misses), (3, 1));
    assert_eq!((st.hits, st.misses), (3, 1));
    drop(a);

    // The next client gets the freed slot, and figures of its own.
    let b = Client::connect(&d.name).expect("connect");
    assert_eq!(b.slot(), slot, "the slot is reused");
    let st = b.store_stats().expect("stats");
    assert_eq!(
        (st.client_hits, st.client_misses),
        (0, 0),
        "a new claim inherits nothing"
    );
    assert_eq!(
        (st.hits, st.misses),
        (3, 1),
        "the totals keep the first client's"
    );
    assert!(b.store_get(ns, b"k", &mut out).expect("get"));
    let st = b.store_stats().expect("stats");
    assert_eq!((st.client_hits, st.client_misses), (1, 0));
    assert_eq!((st.hits, st.misses), (4, 1));
}
